"""The training loop: collect a rollout, update PPO, log, checkpoint. Reads top to bottom.

Sees only rsl-rl's VecEnv contract, never the simulator. A run folder holds
``config.yaml`` (the resolved config), ``model_<it>.pt`` checkpoints and TensorBoard events.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from agents.ppo import build_ppo, load_policy_state, policy_state


class CheckpointError(RuntimeError):
    pass


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest ``model_<it>.pt`` in a run folder."""
    run_dir = Path(run_dir)
    checkpoints = sorted(run_dir.glob("model_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    if not checkpoints:
        raise CheckpointError(f"No checkpoint (model_<iteration>.pt) in {run_dir}. Train first: legion train ...")
    return checkpoints[-1]


def save_atomic(obj, path: Path) -> None:
    """torch.save to a temporary file in the same folder, then rename: never a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path, device: str = "cpu") -> dict:
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise CheckpointError(f"Checkpoint {path} is unreadable ({e.__class__.__name__}: {e}). "
                              "Use an earlier model_<it>.pt from the same run folder.") from e
    if not isinstance(checkpoint, dict) or "policy" not in checkpoint or "iteration" not in checkpoint:
        raise CheckpointError(f"{path} is not a legion-rl checkpoint (missing 'policy'/'iteration').")
    return checkpoint


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Runner:
    """Synchronous PPO training on a VecEnv.

    Args:
        env: the VecEnv (rsl-rl contract).
        agent_cfg: the ``agent`` config node as a dict.
        log_dir: run folder for checkpoints and TensorBoard; ``None`` writes nothing.
        device: where the policy and learner live (the env's device).
    """

    def __init__(self, env, agent_cfg: dict, log_dir: str | Path | None = None, device: str = "cpu"):
        self.env, self.cfg, self.device = env, agent_cfg, device
        self.log_dir = Path(log_dir) if log_dir else None
        self.ppo = build_ppo(env, agent_cfg, device)
        self.iteration = 0  # number of completed iterations
        self.writer = None
        # Running sums of the episodes in progress, and the last 100 finished ones.
        self.episode_return = torch.zeros(env.num_envs, device=device)
        self.episode_length = torch.zeros(env.num_envs, device=device)
        self.episode_returns: deque = deque(maxlen=100)
        self.episode_lengths: deque = deque(maxlen=100)

    # --- checkpoints ----------------------------------------------------------------------
    def save(self, path: Path) -> None:
        save_atomic(
            {
                "policy": policy_state(self.ppo),
                "iteration": self.iteration,
                "rng": {
                    "torch": torch.get_rng_state(),
                    "numpy": np.random.get_state(),
                    "python": random.getstate(),
                    "env": self.env.generator.get_state() if hasattr(self.env, "generator") else None,
                },
            },
            path,
        )

    def load(self, path: str | Path) -> None:
        """Restores networks, normalizers, optimizer, learning rate, iteration and RNG states."""
        checkpoint = load_checkpoint(path, self.device)
        try:
            load_policy_state(self.ppo, checkpoint["policy"])
        except RuntimeError as e:
            raise CheckpointError(f"{path} does not fit this task/agent config: {e}") from e
        self.iteration = checkpoint["iteration"]
        rng = checkpoint["rng"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("env") is not None and hasattr(self.env, "generator"):
            self.env.generator.set_state(rng["env"])

    # --- training -------------------------------------------------------------------------
    def learn(self, max_iterations: int | None = None) -> None:
        """Trains until ``max_iterations`` iterations are complete (``None``: until stopped)."""
        env, ppo, cfg = self.env, self.ppo, self.cfg
        if self.log_dir is not None and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10)
        steps_per_iteration = cfg["num_steps_per_env"] * env.num_envs
        episode_return, episode_length = self.episode_return, self.episode_length
        obs = env.get_observations().to(self.device)
        ppo.train_mode()
        start_iteration, start_time = self.iteration, time.time()
        try:
            while max_iterations is None or self.iteration < max_iterations:
                t0 = time.time()
                env_logs: dict[str, float] = {}
                with torch.inference_mode():
                    for _ in range(cfg["num_steps_per_env"]):
                        actions = ppo.act(obs)
                        obs, rewards, dones, extras = env.step(actions)
                        ppo.process_env_step(obs, rewards, dones, extras)
                        episode_return += rewards
                        episode_length += 1
                        done_ids = dones.nonzero().squeeze(-1)
                        if done_ids.numel():
                            self.episode_returns.extend(episode_return[done_ids].tolist())
                            self.episode_lengths.extend(episode_length[done_ids].tolist())
                            episode_return[done_ids] = 0.0
                            episode_length[done_ids] = 0.0
                        for key, value in extras.get("log", {}).items():
                            env_logs[key] = env_logs.get(key, 0.0) + float(value) / cfg["num_steps_per_env"]
                    ppo.compute_returns(obs)
                t1 = time.time()
                losses = ppo.update()
                t2 = time.time()
                self.iteration += 1
                self._log(losses, env_logs, steps_per_iteration, t1 - t0, t2 - t1, start_iteration, start_time,
                          max_iterations)
                if self.log_dir is not None and self.iteration % cfg["save_interval"] == 0:
                    self.save(self.log_dir / f"model_{self.iteration}.pt")
        finally:
            if self.log_dir is not None and self.iteration > start_iteration:
                self.save(self.log_dir / f"model_{self.iteration}.pt")
            if self.writer is not None:
                self.writer.flush()

    @property
    def mean_episode_length(self) -> float:
        return statistics.fmean(self.episode_lengths) if self.episode_lengths else 0.0

    @property
    def mean_episode_return(self) -> float:
        return statistics.fmean(self.episode_returns) if self.episode_returns else 0.0

    def _log(self, losses, env_logs, steps, collect_s, learn_s, start_iteration, start_time, max_iterations):
        it = self.iteration
        steps_per_s = steps / (collect_s + learn_s)
        if self.writer is not None:
            scalars = {
                "Train/mean_reward": self.mean_episode_return,
                "Train/mean_episode_length": self.mean_episode_length,
                "Perf/env_steps_per_s": steps_per_s,
                "Perf/collection_time_s": collect_s,
                "Perf/learning_time_s": learn_s,
                "Policy/learning_rate": self.ppo.learning_rate,
                "Policy/action_std": self.ppo.get_policy().output_std.mean().item(),
                **{f"Loss/{k}": v for k, v in losses.items()},
                **env_logs,
            }
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, it)
        if it % self.cfg.get("log_interval", 1) and it != max_iterations:
            return
        done = it - start_iteration
        elapsed = time.time() - start_time
        eta = f"ETA {_fmt_time(elapsed / done * (max_iterations - it))}" if max_iterations else "until stopped"
        total = f"/{max_iterations}" if max_iterations else ""
        print(
            f"[it {it}{total}] {steps_per_s:,.0f} steps/s | reward {self.mean_episode_return:8.2f} | "
            f"ep len {self.mean_episode_length:6.1f} | value loss {losses['value']:.3g} | "
            f"lr {self.ppo.learning_rate:.1e} | {_fmt_time(elapsed)} elapsed, {eta}",
            flush=True,
        )
