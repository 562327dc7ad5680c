"""The `legion` command line: one namespace, Hydra overrides, clear errors, multirun, play."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, compose, legion_in_process
from legion.agents.ppo import update_precision
from legion.configs import ConfigError, load_run_config, save_config

LEGION = [sys.executable, "-m", "legion"]


def legion(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*LEGION, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_only_legion_is_importable_after_an_editable_install(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e",
                          str(ROOT)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    env = {"PATH": os.environ["PATH"]}  # no PYTHONPATH: what the install provides, from another folder
    for name in ("tasks", "agents", "sim2real", "configs"):
        result = subprocess.run([python, "-c", f"import {name}"], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode != 0 and f"No module named '{name}'" in result.stderr
    found = subprocess.run([python, "-c", "import legion.tasks, legion.agents, legion.sim2real, legion.configs; "
                            "print(legion.tasks.__file__, legion.configs.__file__)"],  # (no dependencies installed)
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    # legion/tasks links to the checkout's tasks/: an edit there is what `legion` runs
    assert [Path(p).resolve() for p in found.stdout.split()] == [ROOT / "tasks" / "__init__.py",
                                                                 ROOT / "configs" / "__init__.py"]


def test_overrides_apply():
    cfg = compose("task=quadruped_flat", "sim.num_envs=256", "agent.max_iterations=50",
                  "agent.algorithm.learning_rate=3e-4")
    assert cfg.task.name == "quadruped_flat"
    assert (cfg.sim.num_envs, cfg.agent.max_iterations, cfg.agent.algorithm.learning_rate) == (256, 50, 3e-4)
    assert cfg.sim.dt == 0.005 and cfg.sim.decimation == 4  # the task's own physics settings
    assert cfg.agent.algorithm.gamma == 0.99 and cfg.sim.solver_options["iterations"] == 10  # schema / sim group


@pytest.mark.parametrize("override, message", [
    ("agent.lerning_rate=1", "agent.lerning_rate: no such key. Valid keys of agent: mode, "),
    ("task.scene.robot.fle=x.xml",
     "task.scene.robot.fle: no such key. Valid keys of task.scene.robot: file, floating_base, collapse_fixed_joints, "),
    ("+task.rewards.flyy={wieght: 1}", "task.rewards.flyy.wieght: no such key. Valid keys of task.rewards.flyy: func"),
    ("agent.max_iterations=abc", "agent.max_iterations='abc': expected a whole number, e.g. its default 1500."),
    ("agent.algorithm.learning_rate=fast", "agent.algorithm.learning_rate='fast': expected a number, e.g. its default"),
    ("agent.off_policy.target_entropy=[1]", "agent.off_policy.target_entropy=[1]: expected a number or null."),
    ("agent.actor.hidden_dims=big", "agent.actor.hidden_dims='big': expected a list, e.g. its default [512, "),
    ("agent.learner.learning_rate=fast", "agent.learner is one value (a string, e.g. its default 'ppo'), not a group "
                                         "of settings with keys under it."),
])
def test_a_misspelt_or_mistyped_key_on_the_command_line_is_named(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        compose("task=quadruped_flat", override)


def test_a_misspelt_key_in_a_task_file_is_named(tmp_path, monkeypatch):
    import shutil

    from legion import configs

    copy = tmp_path / "configs"
    shutil.copytree(configs.CONFIG_DIR, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    task = copy / "task" / "cartpole.yaml"
    task.write_text(task.read_text().replace("episode_length_s: 10.0", "episode_lenght_s: 10.0"))
    monkeypatch.setattr(configs, "CONFIG_DIR", copy)
    with pytest.raises(ConfigError,
                       match=r"task\.episode_lenght_s: no such key\. Valid keys of task: .*episode_length_s"):
        compose("task=cartpole")


def test_a_misspelt_key_in_a_run_config_is_named_and_can_be_removed(tmp_path):
    cfg = compose("task=cartpole")
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text.replace("  num_steps_per_env:",
                                                       "  num_step_per_env: 3\n  num_steps_per_env:"))
    with pytest.raises(ConfigError,
                       match=r"(?s)config\.yaml: agent\.num_step_per_env: no such key\..*~key removes one"):
        load_run_config(tmp_path)
    fixed = load_run_config(tmp_path, ["~agent.num_step_per_env", "sim.num_envs=8",
                                       "+task.rewards.extra={weight: 0.5}"])
    assert fixed.sim.num_envs == 8 and fixed.task.rewards["extra"].weight == 0.5
    with pytest.raises(ConfigError, match="a run keeps the task"):
        load_run_config(tmp_path, ["task=quadruped_flat"])


def test_a_run_config_cut_short_is_called_damaged_with_its_line(tmp_path):
    save_config(compose("task=cartpole"), tmp_path / "config.yaml")
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # written through a renamed temporary file
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text[:text.index("[") + 1])  # cut inside a list
    with pytest.raises(ConfigError, match=r"config\.yaml: not valid YAML \(.*, line \d+\): the file is damaged"):
        load_run_config(tmp_path)


def test_a_task_sizes_itself_for_the_device_unless_the_command_line_says_otherwise():
    cpu, cuda = compose("task=quadruped_flat"), compose("task=quadruped_flat", "device=cuda:0")
    assert (cpu.sim.num_envs, cpu.agent.max_iterations) == (1024, 500)
    assert (cuda.sim.num_envs, cuda.agent.max_iterations) == (4096, 1500)
    given = compose("task=quadruped_flat", "sim.num_envs=64", "agent.max_iterations=7")
    assert (given.sim.num_envs, given.agent.max_iterations) == (64, 7)
    with pytest.raises(ConfigError, match=r"sim.num_envs: .*device=mps: this value is given for cpu, cuda only"):
        compose("task=quadruped_flat", "device=mps")


def test_bad_arguments_fail_first_with_exit_code_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args, message in ((["agent.lerning_rate=1"], "agent.lerning_rate: no such key"),
                          (["agent.max_iterations=abc"], "agent.max_iterations='abc': expected a whole number"),
                          (["sim.num_envs=0", "agent.max_iterations=-1"],
                           "sim.num_envs=0: must be > 0\nagent.max_iterations=-1"),
                          (["device=cuda:0"], "device=cuda:0: CUDA is not available here: use device=cpu")):
        code, _, err = legion_in_process("train", *args)
        assert code == 2 and message in err and "Traceback" not in err, (args, err[-2000:])
    assert not (tmp_path / "runs").exists()  # nothing was started


@pytest.mark.parametrize("overrides, lines", [
    (["task.scene.robot.file=missing.xml"],
     ["task.scene.robot.file=missing.xml: Robot model 'missing.xml' not found (looked in the working directory"]),
    (["+task.scene.robot.actuators.knee={joints: '.*_calf_joint', stiffness: -5}"],
     ["task.scene.robot.actuators.knee.stiffness=-5: must be >= 0 [N m/rad or N/m] (0: none, e.g. a passive"]),
    (["+task.scene.robot.actuators.legs={joints: '.*', damping: -0.5, effort_limit: 0}"],
     ["task.scene.robot.actuators.legs.damping=-0.5: must be >= 0 [N m s/rad or N s/m]",
      "task.scene.robot.actuators.legs.effort_limit=0: must be > 0, the motors' peak torque"]),
    (["+task.scene.robot.actuators.legs={joints: '.*', model: dc_motor, saturation_effort: -1, velocity_limit: 0}"],
     ["task.scene.robot.actuators.legs.saturation_effort=-1: must be > 0, the motor's stall torque",
      "task.scene.robot.actuators.legs.velocity_limit=0: must be > 0, the speed at which the motor's torque"]),
])
def test_a_robot_that_cannot_work_is_refused_by_key_before_anything_is_built(overrides, lines, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = legion_in_process("train", "task=quadruped_flat", "sim.num_envs=4", *overrides)
    printed = err.removeprefix("legion train: ").strip().splitlines()
    assert code == 2 and len(printed) == len(lines), err[-2000:]  # one line per problem, no traceback
    assert all(line.startswith(expected) for line, expected in zip(printed, lines)), err
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_an_objects_mass_must_be_positive_and_a_passive_joints_zero_gains_stay_valid():
    from legion import api

    with pytest.raises(ConfigError, match=r"^task\.scene\.objects\.cube\.mass=0: must be > 0 \[kg\]$"):
        api.validate(compose("task=arm_lift", "task.scene.objects.cube.mass=0"))
    # No spring, no damper: a passive (or effort-controlled) joint, as panda.yaml's follower finger
    api.validate(compose("task=quadruped_flat",
                         "+task.scene.robot.actuators.passive={joints: '.*_calf_joint', stiffness: 0, damping: 0}"))


def test_a_task_that_needs_a_group_the_robot_lacks_names_it_and_the_robots_that_have_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = legion_in_process("train", "task=arm_reach", "robot=go2")
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert err.strip() == ("legion train: task=arm_reach needs the robot's joint group 'arm' "
                           "(task.scene.robot.joints.arm), which robot=go2 does not define; robots that do: arm, "
                           "panda. Choose one of them, or add joints: {arm: <joint name regex>} to the robot's YAML.")
    with pytest.raises(ConfigError, match=r"task=quadruped_flat needs the robot's body group 'feet' "
                                          r"\(task\.scene\.robot\.bodies\.feet\), which robot=panda does not define; "
                                          r"robots that do: biped, g1, go2, quadruped\."):
        compose("task=quadruped_flat", "robot=panda")


def test_a_run_whose_env_fails_to_build_leaves_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.xml").write_text("<mujoco><worldbody><body name='b'></worldbody></mujoco>")
    code, _, err = legion_in_process("train", "task.scene.robot.file=broken.xml", "sim.num_envs=4")
    assert code == 2 and "Could not load robot model" in err and "Traceback" not in err, err[-2000:]
    assert not list(tmp_path.glob("runs/*/*"))  # a run that never started leaves no folder behind


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    """A 3-iteration cartpole run with a checkpoint at each iteration."""
    from legion.commands.train import train

    run = tmp_path_factory.mktemp("cli") / "run"
    train(compose("task=cartpole", "sim.num_envs=16", "agent.num_steps_per_env=8", "agent.save_interval=1",
                  "agent.max_iterations=3"), run)
    return run


def test_resume_from_a_chosen_checkpoint(cartpole_run, tmp_path, monkeypatch):
    """checkpoint=<name> is found in the run folder, not the working directory; the checkpoints
    past it (model_2, model_3) move aside, kept, so that the newest is this branch's."""
    run = shutil.copytree(cartpole_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    old_second = (run / "model_2.pt").read_bytes()
    code, out, err = legion_in_process("train", f"resume={run}", "checkpoint=model_1.pt", "agent.max_iterations=2")
    assert code == 0, err[-3000:]
    assert f"resumed from {run / 'model_1.pt'} at iteration 1" in out
    assert "[it 2/2]" in out and "[it 1/" not in out
    assert "later checkpoints (model_2.pt, model_3.pt) moved to" in out
    assert sorted(p.name for p in (run / "superseded_from_it1").iterdir()) == ["model_2.pt", "model_3.pt"]
    assert (run / "superseded_from_it1" / "model_2.pt").read_bytes() == old_second
    assert sorted(p.name for p in run.glob("model_*.pt")) == ["model_1.pt", "model_2.pt"]  # model_2: this branch's


def test_a_checkpoint_that_does_not_fit_the_networks_stops_before_anything_is_written(cartpole_run, tmp_path,
                                                                                        monkeypatch):
    run = cartpole_run
    monkeypatch.chdir(tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code, _, err = legion_in_process("train", f"resume={run}", f"checkpoint={run / 'model_3.pt'}",
                                     "agent.actor.hidden_dims=[32,32]")
    assert code == 2 and err.count("\n") == 1, err[-3000:]  # one line, no traceback
    assert err.startswith(f"legion train: {run / 'model_3.pt'} does not fit this task/agent config: its mlp.0.weight "
                          "has shape [64, 4], this config's [32, 4] (and ") and "Resume without the overrides" in err
    # the run's config.yaml, checkpoints and TensorBoard events as they were: it resumes as before
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    # A resume with nothing to train (the run is past agent.max_iterations): said, and nothing written
    code, _, err = legion_in_process("train", f"resume={run}", "agent.max_iterations=2")
    assert code == 2 and "model_3.pt is at iteration 3, agent.max_iterations=2: nothing to train" in err, err[-3000:]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    # A new run from a checkpoint whose networks differ: the same, and no run folder left behind
    code, _, err = legion_in_process("train", "task=cartpole", f"agent.init_from={run / 'model_3.pt'}",
                                     "agent.actor.hidden_dims=[32,32]", "sim.num_envs=8", "agent.max_iterations=1",
                                     "agent.num_steps_per_env=8")
    assert code == 2 and err.count("\n") == 1 and "agent.init_from=" in err and "does not fit" in err, err[-3000:]
    assert not list(tmp_path.glob("runs/*/*"))


def test_a_misspelt_option_of_a_command_is_refused_as_one_with_the_options_it_has(cartpole_run):
    """`legion play run=R episods=2`: not a config key of the run (which would blame its config.yaml)."""
    code, _, err = legion_in_process("play", f"run={cartpole_run}", "episods=2")
    assert code == 2 and err.startswith("legion play: episods: no such option; options: run, checkpoint, episodes")
    assert "config overrides (task.*, sim.*, agent.*, device, run_name, seed)" in err
    code, _, err = legion_in_process("play", f"run={cartpole_run}", "seed=3", "episodes=1", "task.episode_length_s=1")
    assert code == 0, err[-2000:]  # a root config key and a dotted one stay overrides


def test_eval_of_a_task_it_has_no_metrics_for_is_refused_before_the_env_is_built(cartpole_run):
    code, out, err = legion_in_process("eval", f"run={cartpole_run}")
    assert code == 2 and "task cartpole: no evaluation metrics for command type None" in err
    assert "evaluating" not in out  # said before building (the line comes once the env is built)


def test_ctrl_c_stops_a_command_with_one_line_and_exit_code_130(cartpole_run, monkeypatch):
    import _thread

    from legion.commands import play

    shown = play.print_episode

    def ctrl_c_after_the_first(*args):  # as the terminal's Ctrl-C: the signal, handled in the main thread
        shown(*args)
        _thread.interrupt_main()

    monkeypatch.setattr(play, "print_episode", ctrl_c_after_the_first)
    code, out, err = legion_in_process("play", f"run={cartpole_run}", "episodes=50", "sim.num_envs=2")
    assert code == 130 and err.strip() == "legion play: stopped (Ctrl-C)", err[-3000:]
    assert "episode 1:" in out and "episode 3:" not in out


def test_unknown_task_lists_the_valid_ones():
    code, out, err = legion_in_process("train", "task=quadruped_flatt")
    out += err
    assert code == 2
    assert "quadruped_flatt" in out and "cartpole" in out and "quadruped_flat\n" in out


def test_every_command_has_help(tmp_path):
    top = legion("--help", cwd=tmp_path)
    assert top.returncode == 0 and "train" in top.stdout and "play" in top.stdout and "quadruped_flat" in top.stdout
    train = legion("train", "--help", cwd=tmp_path)
    assert train.returncode == 0 and "legion train" in train.stdout
    assert ("task: arm_lift, arm_lift_camera, arm_lift_ik, arm_reach, biped_flat, biped_flat_deployable, cartpole, "
            "cartpole_positions_only, quadruped_flat, quadruped_flat_deployable, quadruped_rough, "
            "quadruped_rough_depth") in train.stdout
    for command, usage in (("play", "run=<run folder>"), ("eval", "legion eval run=<run folder>"),
                           ("export", "legion export run=<run folder>"),
                           ("sim2sim", "legion sim2sim run=<run folder>"), ("randomization", "legion randomization"),
                           ("record", "legion record run=<run folder>"), ("replay", "legion replay <file.h5>"),
                           ("dataset", "legion dataset convert <input> format=lerobot|hdf5"),
                           ("bridge", "legion bridge run=<run or exported folder> robot=go2|g1"),
                           ("deploy", "legion deploy run=<run or exported folder> robot=go2|g1"),
                           ("train resume=x", "legion train resume=<run folder>")):
        result = legion(*command.split(), "--help", cwd=tmp_path)
        assert result.returncode == 0 and usage in result.stdout, command


def test_multirun_then_play(tmp_path):
    tiny = ["sim.num_envs=32", "agent.max_iterations=2", "agent.num_steps_per_env=8"]
    result = legion("train", "-m", "seed=0,1", *tiny, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(Path(tmp_path, "runs", "multirun").glob("*/cartpole_*"))
    assert [r.name for r in runs] == ["cartpole_0", "cartpole_1"]
    for run, seed in zip(runs, (0, 1)):
        assert (run / "model_2.pt").is_file()
        assert f"seed: {seed}" in (run / "config.yaml").read_text()
    assert "[it 2/2]" in result.stdout and "steps/s" in result.stdout and "ETA" in result.stdout
    agent = compose("task=cartpole").agent  # what it chose, in its first lines
    assert (f"32 envs on cpu, 2 iterations, sync PPO (learning rate adapted to KL {agent.algorithm.desired_kl:g}, "
            f"entropy {agent.algorithm.entropy_coef:g}, update in {update_precision(agent, 'cpu')})") in result.stdout

    code, out, err = legion_in_process("play", f"run={runs[0]}", "episodes=3", "sim.num_envs=4")
    assert code == 0, err[-3000:]
    episodes = [line for line in out.splitlines() if line.startswith("episode ")]
    assert len(episodes) == 3 and all("return" in e and "length" in e for e in episodes)

    code, _, err = legion_in_process("play", f"run={tmp_path}")
    assert code == 2 and "not a run folder" in err
    code, _, err = legion_in_process("play", f"run={runs[0]}", "sim.num_env=4")
    assert code == 2 and "sim.num_env" in err

    code, out, err = legion_in_process("randomization", "task=cartpole", "sim.num_envs=4")
    assert code == 0 and "joint_pos_offset" in out, err[-2000:]
