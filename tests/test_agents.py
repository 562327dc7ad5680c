"""PPO on rsl-rl's core: it learns cart-pole, and checkpoints restore everything exactly."""

import time

import pytest
import torch
from omegaconf import OmegaConf

from legion.agents.runner import CheckpointError, Runner, latest_checkpoint, load_checkpoint
from conftest import compose, make_env


def _runner(log_dir=None, *overrides):
    cfg = compose("task=cartpole", *overrides)
    torch.manual_seed(cfg.seed)
    env = make_env("task=cartpole", *overrides)
    return Runner(env, OmegaConf.to_container(cfg.agent, resolve=True), log_dir=log_dir, device="cpu")


def test_ppo_learns_cartpole_within_60_seconds():
    runner = _runner()
    runner.learn(2)
    start_length = runner.mean_episode_length
    deadline = time.time() + 60.0
    while time.time() < deadline and runner.mean_episode_length < 3 * start_length:
        runner.learn(runner.iteration + 1)
    print(f"episode length {start_length:.1f} -> {runner.mean_episode_length:.1f} "
          f"after {runner.iteration} iterations")
    assert runner.mean_episode_length >= 3 * start_length


def test_checkpoint_restores_policy_optimizer_normalizer_and_rng(tmp_path):
    runner = _runner(tmp_path, "agent.save_interval=2", "sim.num_envs=64", "agent.num_steps_per_env=8")
    runner.learn(3)
    assert [p.name for p in sorted(tmp_path.glob("model_*.pt"))] == ["model_2.pt", "model_3.pt"]
    assert latest_checkpoint(tmp_path).name == "model_3.pt"
    assert any(tmp_path.glob("events.out.tfevents*"))

    restored = _runner(None, "sim.num_envs=64", "agent.num_steps_per_env=8")
    restored.load(tmp_path / "model_3.pt")
    assert restored.iteration == 3
    assert restored.ppo.learning_rate == runner.ppo.learning_rate
    for a, b in zip(runner.ppo.actor.state_dict().values(), restored.ppo.actor.state_dict().values()):
        assert torch.equal(a, b)  # weights and the observation normalizer's running statistics
    normalizer = restored.ppo.actor.obs_normalizer
    assert normalizer.count > 0 and torch.equal(normalizer._mean, runner.ppo.actor.obs_normalizer._mean)
    assert restored.ppo.optimizer.state_dict()["state"][0]["step"] == runner.ppo.optimizer.state_dict()["state"][0]["step"]
    assert torch.equal(restored.env.generator.get_state(), runner.env.generator.get_state())


def test_corrupt_or_foreign_checkpoints_are_refused_clearly(tmp_path):
    truncated = tmp_path / "model_1.pt"
    truncated.write_bytes(b"PK\x03\x04 not a whole file")
    with pytest.raises(CheckpointError, match="unreadable.*earlier model_"):
        load_checkpoint(truncated)
    foreign = tmp_path / "model_2.pt"
    torch.save({"weights": 1}, foreign)
    with pytest.raises(CheckpointError, match="not a legion-rl checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="No checkpoint"):
        latest_checkpoint(tmp_path / "empty")
