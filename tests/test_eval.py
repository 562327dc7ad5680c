"""`legion eval`: the metrics of a trained run, measured on held commands."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, SMALL_TERRAIN, compose, legion_in_process


@pytest.fixture(scope="module")
def still_run(tmp_path_factory):
    """A quadruped_flat run folder whose policy always outputs zero (the robot holds its default
    pose and stands), trained "on a GPU": its config says device cuda:0 and sim.capture_step
    (checkpoints from a GPU load on the CPU: tests/test_agents.py; the captured step becomes eager)."""
    from legion import api, configs
    from legion.agents.runner import Runner

    run = tmp_path_factory.mktemp("still")
    cfg = compose("task=quadruped_flat", "sim.num_envs=4")
    configs.save_config(cfg, run / "config.yaml")
    on_gpu = run / "config.yaml"
    on_gpu.write_text(on_gpu.read_text().replace("device: cpu", "device: cuda:0").replace("capture_step: false",
                                                                                          "capture_step: true"))
    runner = Runner(api.make_env(cfg), cfg.agent, log_dir=None)
    last = [m for m in runner.ppo.get_policy().modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
    runner.iteration = 1
    runner.save(run / "model_1.pt")
    return run


def test_a_standing_policy_misses_a_forward_command_by_its_speed_and_never_falls(still_run):
    from legion.evaluation import Options, evaluate

    options = Options(commands={"forward": [1.0, 0.0, 0.0], "yaw": [0.0, 0.0, 0.8], "stand": [0.0, 0.0, 0.0],
                                "lateral": [0.0, 0.5, 0.0]},
                      envs_per_command=2, duration_s=2.0, settle_s=1.0, randomization="off")
    report = evaluate(still_run, options)
    forward, yaw, stand, lateral = report["rows"]
    assert report["device"] == "cpu" and report["iteration"] == 1
    assert forward["vel_error_xy"] == pytest.approx(1.0, abs=0.05)  # it stands: the error is the command
    assert yaw["yaw_rate_error"] == pytest.approx(0.8, abs=0.05) and yaw["vel_error_xy"] < 0.05
    assert stand["vel_error_xy"] < 0.05 and stand["yaw_rate_error"] < 0.05
    # standing still: no drift at a forward command, 0.5 m/s to the right of a leftward one
    assert abs(forward["lateral_drift"]) < 0.05 and lateral["lateral_drift"] == pytest.approx(-0.5, abs=0.05)
    for row in (forward, yaw, stand):
        assert row["fall_rate"] == 0.0 and row["survival_s"] == pytest.approx(2.0)
        assert row["terrain_level"] is None and row["power_w"] >= 0.0
    assert stand["cost_of_transport"] is None and forward["cost_of_transport"] > 0.0
    series = report["series"]
    assert len(series["time_s"]) == 100 and series["commands"]["forward"]["commanded"] == [1.0, 0.0, 0.0]
    assert abs(series["commands"]["forward"]["actual"][-1][0]) < 0.05


def test_fall_rate_counts_episodes_ended_by_a_termination_and_survival_stops_there(still_run):
    from legion.evaluation import Options, evaluate

    options = Options(commands={"stand": [0.0, 0.0, 0.0]}, envs_per_command=2, duration_s=1.0, settle_s=0.5,
                      randomization="off")
    # The base stands at ~0.3 m: a termination below 1 m ends every episode at the first step.
    report = evaluate(still_run, options,
                      overrides=["+task.terminations.low={func: base_height_below, params: {height: 1.0}}"])
    (stand,) = report["rows"]
    assert stand["fall_rate"] == 1.0 and stand["survival_s"] == 0.0
    # nobody stayed up to be measured: no tracking error (it read 0.0, a perfect score, before)
    assert stand["vel_error_xy"] is None and stand["yaw_rate_error"] is None and stand["power_w"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the run loads there")
def test_a_run_trained_on_a_gpu_exports_on_a_machine_without_cuda(still_run, tmp_path):
    """play, export and record load a run as eval does: its device=cuda:0 becomes the CPU here,
    unless the command line names a device, which is then checked."""
    from legion import api, configs
    from legion.sim2real.export import export_run

    out, report = export_run(still_run, out_dir=tmp_path / "exported", steps=5)
    assert json.loads((out / "policy.json").read_text())["files"]["policy.onnx"]["bytes"] > 0
    assert report["policy.onnx"]["max_abs_diff"] < report["policy.onnx"]["tolerance"]
    with pytest.raises(configs.ConfigError, match="device=cuda:0: CUDA is not available here: use device=cpu"):
        api.load_run(still_run, overrides=["device=cuda:0"])


def test_legion_eval_prints_a_table_and_writes_json_and_a_plot_beside_the_run(still_run, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    help_text = subprocess.run([sys.executable, "-m", "legion", "eval", "--help"], capture_output=True, text=True,
                               env=env, timeout=120)
    assert help_text.returncode == 0 and "vel_error_xy" in help_text.stdout and "randomization=off" in help_text.stdout
    bad = subprocess.run([sys.executable, "-m", "legion", "eval", f"run={still_run}", "randomization=maybe"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "randomization=maybe: choose trained or off" in bad.stderr
    (tmp_path / "a_file").write_text("")
    code, _, err = legion_in_process("eval", f"run={still_run}", f"out={tmp_path / 'a_file' / 'eval'}")
    assert code == 2 and "a_file/eval: cannot make that folder (Not a directory)" in err  # before evaluating
    result = subprocess.run([sys.executable, "-m", "legion", "eval", f"run={still_run}", "envs=1", "duration_s=1",
                             "settle_s=0.5", 'commands={"sprint": [3.0, 0.0, 0.0], "still": [0, 0, 0]}'],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sprint*" in result.stdout and "clamped to the task's command ranges" in result.stdout
    report = json.loads((still_run / "eval" / "model_1.json").read_text())
    assert [r["command"] for r in report["rows"]] == ["sprint", "still"]
    assert report["rows"][0]["v_x"] == 1.0 and report["rows"][0]["clamped"]  # the task's range is [-1, 1]
    assert (still_run / "eval" / "model_1.png").read_bytes()[:4] == b"\x89PNG"


def test_on_rough_terrain_eval_reports_the_levels_the_checkpoint_reached_and_holds_them(tmp_path):
    """Levels saved by a 4-env run are dealt out to the 6 evaluation envs and stay put (the
    curriculum is frozen while evaluating)."""
    from legion import api, configs
    from legion.agents.runner import Runner
    from legion.evaluation import Options, evaluate

    cfg = compose("task=quadruped_rough", "sim.num_envs=4", *SMALL_TERRAIN)
    configs.save_config(cfg, tmp_path / "config.yaml")
    env = api.make_env(cfg)
    env.terrain_levels.levels = torch.tensor([2, 2, 1, 1])
    runner = Runner(env, cfg.agent, log_dir=None)
    runner.save(tmp_path / "model_0.pt")
    options = Options(commands={"forward": [1.0, 0.0, 0.0], "stand": [0.0, 0.0, 0.0], "yaw": [0.0, 0.0, 1.0]},
                      envs_per_command=2, duration_s=0.5, settle_s=0.2)
    report = evaluate(tmp_path, options)
    levels = [row["terrain_level"] for row in report["rows"]]
    assert sum(levels) / 3 == pytest.approx(1.5) and all(1.0 <= level <= 2.0 for level in levels)


def test_training_stops_once_the_goal_holds_at_two_evaluations_in_a_row(tmp_path, monkeypatch):
    """agent.stop_when.goal: measured as legion eval measures it. A goal every policy meets (success
    rate >= 0) stops the run at its second evaluation with that checkpoint; one no policy meets
    (> 100%) lets it run to max_iterations; a task without a measured goal is refused."""
    from conftest import legion_in_process

    monkeypatch.chdir(tmp_path)
    small = ("task=arm_reach", "sim.num_envs=8", "agent.num_steps_per_env=4", "agent.max_iterations=4",
             "agent.stop_when.goal=true", "agent.stop_when.every_min=0", "agent.stop_when.envs_per_command=4",
             "agent.stop_when.episodes=4")
    code, out, err = legion_in_process("train", *small, "agent.stop_when.success_rate=0")
    assert code == 0, err[-2000:]
    assert "until it meets its goal at 2 evaluations in a row (every 0 min of training) or 4 iterations" in out
    assert "evaluation 1 at" in out and "goal met (1 of 2 in a row)" in out and "goal met (2 of 2 in a row)" in out
    run = next((tmp_path / "runs" / "arm_reach").iterdir())
    assert "goal met at" in out and f"the policy is {(run / 'model_2.pt').relative_to(tmp_path)}" in out
    assert sorted(p.name for p in run.glob("model_*.pt")) == ["model_1.pt", "model_2.pt"]  # each one evaluated

    code, out, err = legion_in_process("train", *small, "agent.stop_when.success_rate=1.01")
    assert code == 0, err[-2000:]
    assert out.count("goal not met") == 4 and "goal met at" not in out
    assert "agent.max_iterations=4 reached before the goal was met at 2 evaluations in a row" in out

    code, _, err = legion_in_process("train", "task=cartpole", "agent.stop_when.goal=true")
    assert code != 0 and "agent.stop_when.goal: task cartpole has no goal that legion eval measures" in err
