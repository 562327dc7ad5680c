"""The training loop: collect a rollout, update PPO, log, checkpoint. Reads top to bottom.

Sees only rsl-rl's VecEnv contract, never the simulator. A run folder holds
``config.yaml`` (the resolved config), ``model_<it>.pt`` checkpoints and TensorBoard events.
``agent.mode=sync`` is this module's :class:`Runner`; ``agent.mode=async`` is
:class:`legion.agents.async_runner.AsyncRunner`, which shares its checkpoints and telemetry.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from legion.agents.ppo import build_ppo, clone_tree, load_policy_state, policy_state


class CheckpointError(RuntimeError):
    pass


def make_runner(env, agent_cfg: dict, log_dir: str | Path | None = None, device: str = "cpu") -> "Runner":
    """The runner for ``agent.mode``: ``sync`` (collect, then update) or ``async`` (overlapped)."""
    mode = agent_cfg.get("mode", "sync")
    if mode == "sync":
        return Runner(env, agent_cfg, log_dir, device)
    if mode == "async":
        from legion.agents.async_runner import AsyncRunner

        return AsyncRunner(env, agent_cfg, log_dir, device)
    raise ValueError(f"agent.mode must be 'sync' or 'async', got '{mode}'")


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


def process_memory_mb() -> float:
    """Resident memory of this process [MiB] (Linux); elsewhere its peak, from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class RolloutStats:
    """What the acting side learns while it collects: returns and lengths of the episodes that
    finished, the env's logged terms, and the loop latency (time from one action to the next).

    Args:
        num_envs: number of environments.
        device: where the running episode sums live.
    """

    def __init__(self, num_envs: int, device: str):
        self.episode_return = torch.zeros(num_envs, device=device)
        self.episode_length = torch.zeros(num_envs, device=device)
        self.last_action_time: float | None = None
        self.begin()

    def begin(self) -> None:
        """Starts a new rollout's tallies (the running episodes carry on)."""
        self.returns: list[float] = []
        self.lengths: list[float] = []
        self.env_logs: dict = {}
        self.steps = 0
        self.latency_sum = self.latency_max = 0.0

    def action(self) -> None:
        """Call when an action is chosen: the interval since the previous one is the loop latency."""
        now = time.perf_counter()
        if self.last_action_time is not None:
            latency = now - self.last_action_time
            self.latency_sum += latency
            self.latency_max = max(self.latency_max, latency)
        self.last_action_time = now

    def step(self, rewards: torch.Tensor, dones: torch.Tensor, extras: dict) -> None:
        self.steps += 1
        self.episode_return += rewards
        self.episode_length += 1
        done_ids = dones.nonzero().squeeze(-1)
        if done_ids.numel():
            self.returns.extend(self.episode_return[done_ids].tolist())
            self.lengths.extend(self.episode_length[done_ids].tolist())
            self.episode_return[done_ids] = 0.0
            self.episode_length[done_ids] = 0.0
        for key, value in extras.get("log", {}).items():
            self.env_logs[key] = self.env_logs.get(key, 0.0) + value

    def end(self) -> dict:
        """This rollout's tallies, as plain Python numbers."""
        return {
            "episode_returns": self.returns,
            "episode_lengths": self.lengths,
            "env_logs": {k: float(v) / max(1, self.steps) for k, v in self.env_logs.items()},
            "latency_mean_ms": 1000 * self.latency_sum / max(1, self.steps),
            "latency_max_ms": 1000 * self.latency_max,
        }


class Runner:
    """Synchronous PPO training on a VecEnv: collect a rollout, then update on it.

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
        self.iteration = 0  # number of completed iterations (= policy version)
        self.writer = None
        self.episode_returns: deque = deque(maxlen=100)  # the last 100 finished episodes
        self.episode_lengths: deque = deque(maxlen=100)
        self.history: deque = deque(maxlen=10_000)  # per-iteration telemetry (see _record)
        self.stats = RolloutStats(env.num_envs, device)  # running episodes carry over between learn() calls
        self._last_save_time = time.monotonic()

    # --- checkpoints ----------------------------------------------------------------------
    def _env_state(self) -> dict:
        """The env's RNG and, if it has one, its ``state_dict`` (randomization ranges, curriculum)."""
        env = self.env
        return {
            "generator": env.generator.get_state() if hasattr(env, "generator") else None,
            "state": clone_tree(env.state_dict()) if hasattr(env, "state_dict") else None,
        }

    def _snapshot(self) -> dict:
        """What a checkpoint holds, taken from the live learner (between updates)."""
        return self._checkpoint(policy_state(self.ppo), self.iteration, torch.get_rng_state(), self._env_state())

    @staticmethod
    def _checkpoint(policy: dict, iteration: int, torch_rng: torch.Tensor, env_state: dict) -> dict:
        checkpoint = {
            "policy": policy,
            "iteration": iteration,
            "rng": {
                "torch": torch_rng,
                "numpy": np.random.get_state(),
                "python": random.getstate(),
                "env": env_state["generator"],
            },
        }
        if env_state["state"] is not None:
            checkpoint["env"] = env_state["state"]
        return checkpoint

    def save(self, path: str | Path | None = None) -> Path:
        """Writes a checkpoint, by default ``<log_dir>/model_<iteration>.pt``, and returns its path."""
        snapshot = self._snapshot()
        path = Path(path) if path else self.log_dir / f"model_{snapshot['iteration']}.pt"
        save_atomic(snapshot, path)
        self._last_save_time = time.monotonic()
        return path

    def load(self, path: str | Path) -> None:
        """Restores networks, normalizers, optimizer, learning rate, iteration, RNG and env states."""
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
        if "env" in checkpoint and hasattr(self.env, "load_state_dict"):
            self.env.load_state_dict(checkpoint["env"])

    def _save_due(self, iteration: int) -> bool:
        """Every ``save_interval`` iterations, and every ``save_every_minutes`` minutes."""
        minutes = self.cfg.get("save_every_minutes")
        return (iteration % self.cfg["save_interval"] == 0
                or bool(minutes) and time.monotonic() - self._last_save_time >= 60 * minutes)

    def _open_writer(self) -> None:
        if self.log_dir is not None and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10)

    # --- training -------------------------------------------------------------------------
    def learn(self, max_iterations: int | None = None) -> None:
        """Trains until ``max_iterations`` iterations are complete (``None``: until stopped)."""
        env, ppo, cfg = self.env, self.ppo, self.cfg
        self._open_writer()
        stats = self.stats
        stats.last_action_time = None
        obs = env.get_observations().to(self.device)
        ppo.train_mode()
        start_iteration, start_time = self.iteration, time.time()
        try:
            while max_iterations is None or self.iteration < max_iterations:
                t0 = time.perf_counter()
                stats.begin()
                with torch.inference_mode():
                    for _ in range(cfg["num_steps_per_env"]):
                        stats.action()
                        actions = ppo.act(obs)
                        obs, rewards, dones, extras = env.step(actions)
                        ppo.process_env_step(obs, rewards, dones, extras)
                        stats.step(rewards, dones, extras)
                    ppo.compute_returns(obs)
                t1 = time.perf_counter()
                # An interrupted update would leave half-updated networks: keep this iteration's
                # state (one copy) so a Ctrl-C checkpoint is exactly iteration k.
                before_update = clone_tree(policy_state(ppo))
                try:
                    losses = ppo.update()
                except BaseException:
                    load_policy_state(ppo, before_update)
                    raise
                t2 = time.perf_counter()
                self.iteration += 1
                self._record(
                    {**stats.end(), "iteration": self.iteration, "losses": losses, "collect_s": t1 - t0, "learn_s": t2 - t1, "wall_s": t2 - t0,
                     "learning_rate": ppo.learning_rate, "action_std": ppo.get_policy().output_std.mean().item()},
                    start_iteration, start_time, max_iterations,
                )
                if self.log_dir is not None and self._save_due(self.iteration):
                    self.save()
        finally:
            if self.log_dir is not None and self.iteration > start_iteration:
                self.save()
            if self.writer is not None:
                self.writer.flush()

    @property
    def mean_episode_length(self) -> float:
        return statistics.fmean(self.episode_lengths) if self.episode_lengths else 0.0

    @property
    def mean_episode_return(self) -> float:
        return statistics.fmean(self.episode_returns) if self.episode_returns else 0.0

    # --- telemetry ------------------------------------------------------------------------
    def _record(self, report: dict, start_iteration: int, start_time: float, max_iterations: int | None) -> None:
        """Books one finished iteration: episode statistics, history, TensorBoard, progress line.

        ``report`` holds the iteration's numbers: see ``learn`` here and in AsyncRunner.
        """
        it = report["iteration"]
        self.episode_returns.extend(report["episode_returns"])
        self.episode_lengths.extend(report["episode_lengths"])
        steps = self.cfg["num_steps_per_env"] * self.env.num_envs
        elapsed = time.time() - start_time
        perf = {
            "env_steps_per_s": steps / report["wall_s"],
            "learner_samples_per_s": steps / report["learn_s"],
            "collection_time_s": report["collect_s"],
            "learning_time_s": report["learn_s"],
            "loop_latency_ms": report["latency_mean_ms"],
            "loop_latency_max_ms": report["latency_max_ms"],
            "memory_mb": process_memory_mb(),
            **{k: report[k] for k in ("actor_wait_s", "learner_wait_s", "overlap_fraction") if k in report},
        }
        if torch.device(self.device).type == "cuda":
            perf["gpu_memory_mb"] = torch.cuda.memory_allocated(self.device) / 2**20
        self.history.append({
            "iteration": it, "time_s": elapsed, "mean_reward": self.mean_episode_return,
            "mean_episode_length": self.mean_episode_length, "learning_rate": report["learning_rate"],
            **perf, **{k: report[k] for k in ("lag_mean", "lag_max", "rollouts_ahead") if k in report},
        })
        if self.writer is not None:
            scalars = {
                "Train/mean_reward": self.mean_episode_return,
                "Train/mean_episode_length": self.mean_episode_length,
                **{f"Perf/{k}": v for k, v in perf.items()},
                "Policy/learning_rate": report["learning_rate"],
                "Policy/action_std": report["action_std"],
                **{f"Policy/{k}": report[k] for k in ("lag_mean", "lag_max") if k in report},
                **{f"Loss/{k}": v for k, v in report["losses"].items()},
                **report["env_logs"],
            }
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, it)
        if it % self.cfg.get("log_interval", 1) and it != max_iterations:
            return
        done = it - start_iteration
        eta = f"ETA {_fmt_time(elapsed / done * (max_iterations - it))}" if max_iterations else "until stopped"
        total = f"/{max_iterations}" if max_iterations else ""
        if "lag_mean" in report:  # async: what the overlap buys and costs
            middle = (f"learner {perf['learner_samples_per_s']:,.0f} samples/s | reward {self.mean_episode_return:8.2f} | "
                      f"ep len {self.mean_episode_length:6.1f} | lag {report['lag_mean']:.2f} (max {report['lag_max']}) | "
                      f"wait actor {report['actor_wait_s']:.2f}s learner {report['learner_wait_s']:.2f}s | "
                      f"overlap {report['overlap_fraction']:.0%} | latency {report['latency_mean_ms']:.1f} ms")
        else:
            middle = (f"reward {self.mean_episode_return:8.2f} | ep len {self.mean_episode_length:6.1f} | "
                      f"value loss {report['losses']['value']:.3g}")
        print(f"[it {it}{total}] {perf['env_steps_per_s']:,.0f} steps/s | {middle} | lr {report['learning_rate']:.1e} | "
              f"mem {perf['memory_mb'] / 1024:.1f} GiB | {_fmt_time(elapsed)} elapsed, {eta}", flush=True)
