"""The `legion` command line: Hydra overrides, clear errors, multirun, play."""

import os
import subprocess
import sys
from pathlib import Path


from conftest import ROOT, compose

LEGION = [sys.executable, "-m", "legion.cli"]


def legion(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*LEGION, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_overrides_apply():
    cfg = compose("task=quadruped_flat", "sim.num_envs=256", "agent.max_iterations=50", "agent.algorithm.learning_rate=3e-4")
    assert cfg.task.name == "quadruped_flat"
    assert (cfg.sim.num_envs, cfg.agent.max_iterations, cfg.agent.algorithm.learning_rate) == (256, 50, 3e-4)
    assert cfg.sim.dt == 0.005 and cfg.sim.decimation == 4  # the task's own physics settings


def test_bad_key_names_the_key(tmp_path):
    result = legion("train", "agent.lerning_rate=1", cwd=tmp_path)
    assert result.returncode != 0
    assert "agent.lerning_rate" in result.stderr + result.stdout
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_unknown_task_lists_the_valid_ones(tmp_path):
    result = legion("train", "task=quadruped_flatt", cwd=tmp_path)
    out = result.stderr + result.stdout
    assert result.returncode != 0
    assert "quadruped_flatt" in out and "cartpole" in out and "quadruped_flat\n" in out


def test_help_texts(tmp_path):
    top = legion("--help", cwd=tmp_path)
    assert top.returncode == 0 and "train" in top.stdout and "play" in top.stdout and "quadruped_flat" in top.stdout
    train = legion("train", "--help", cwd=tmp_path)
    assert train.returncode == 0 and "legion train" in train.stdout and "task: cartpole, quadruped_flat" in train.stdout
    play = legion("play", "--help", cwd=tmp_path)
    assert play.returncode == 0 and "run=<run folder>" in play.stdout


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

    played = legion("play", f"run={runs[0]}", "episodes=3", "sim.num_envs=4", cwd=tmp_path)
    assert played.returncode == 0, played.stderr[-3000:]
    episodes = [line for line in played.stdout.splitlines() if line.startswith("episode ")]
    assert len(episodes) == 3 and all("return" in e and "length" in e for e in episodes)

    bad = legion("play", f"run={tmp_path}", cwd=tmp_path)
    assert bad.returncode != 0 and "not a run folder" in bad.stderr
