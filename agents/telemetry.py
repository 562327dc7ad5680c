"""What training reports: episode statistics while acting, and per iteration a progress line,
TensorBoard scalars and an in-memory history, the same for every runner.

A runner hands :meth:`TrainingLog.record` one report per finished iteration::

    {"iteration", "episode_returns", "episode_lengths", "env_logs", "latency_mean_ms",
     "latency_max_ms"                                   # RolloutStats.end()
     "losses", "learning_rate", "action_std",           # the update
     "collect_s", "learn_s", "wall_s",                  # seconds of acting, learning, the iteration
     "perf": {...}, "policy": {...},                    # optional: runner-specific scalars (Perf/, Policy/)
     "progress": "..."}                                 # optional: the runner's part of the progress line
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import torch


def process_memory_mb() -> float:
    """Resident memory of this process [MiB] (Linux); elsewhere its peak, from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def format_duration(seconds: float) -> str:
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


class TrainingLog:
    """Books finished iterations: the last 100 episodes' mean return and length, a history of
    per-iteration numbers, TensorBoard scalars (with ``log_dir``) and the progress line.

    Args:
        samples_per_iteration: env steps per iteration (num_envs x steps per env).
        log_dir: TensorBoard folder; ``None`` writes nothing.
        log_interval: print the progress line every N iterations (and at the last).
        device: the learner's device (GPU memory is reported for CUDA).
    """

    def __init__(self, samples_per_iteration: int, log_dir: Path | None, log_interval: int = 1, device: str = "cpu"):
        self.samples, self.log_dir, self.log_interval, self.device = samples_per_iteration, log_dir, log_interval, device
        self.episode_returns: deque = deque(maxlen=100)
        self.episode_lengths: deque = deque(maxlen=100)
        self.history: deque = deque(maxlen=10_000)
        self.writer = None
        self.start(0, None)

    def start(self, iteration: int, max_iterations: int | None, purge_step: int | None = None) -> None:
        """A ``learn()`` call begins at ``iteration``: clocks and ETA restart. ``purge_step``: a
        resumed run drops TensorBoard events from that step on (those of the attempt that was cut)."""
        self.start_iteration, self.max_iterations, self.start_time = iteration, max_iterations, time.time()
        if self.log_dir is not None and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10, purge_step=purge_step)

    @property
    def mean_return(self) -> float:
        return statistics.fmean(self.episode_returns) if self.episode_returns else 0.0

    @property
    def mean_length(self) -> float:
        return statistics.fmean(self.episode_lengths) if self.episode_lengths else 0.0

    def record(self, report: dict) -> None:
        it = report["iteration"]
        self.episode_returns.extend(report["episode_returns"])
        self.episode_lengths.extend(report["episode_lengths"])
        elapsed = time.time() - self.start_time
        perf = {
            "env_steps_per_s": self.samples / report["wall_s"],
            "learner_samples_per_s": self.samples / report["learn_s"],
            "collection_time_s": report["collect_s"],
            "learning_time_s": report["learn_s"],
            "loop_latency_ms": report["latency_mean_ms"],
            "loop_latency_max_ms": report["latency_max_ms"],
            "memory_mb": process_memory_mb(),
            **report.get("perf", {}),
        }
        if torch.device(self.device).type == "cuda":
            perf["gpu_memory_mb"] = torch.cuda.memory_allocated(self.device) / 2**20
        policy = {"learning_rate": report["learning_rate"], "action_std": report["action_std"], **report.get("policy", {})}
        self.history.append({"iteration": it, "time_s": elapsed, "mean_reward": self.mean_return,
                             "mean_episode_length": self.mean_length, **perf, **policy})
        if self.writer is not None:
            scalars = {"Train/mean_reward": self.mean_return, "Train/mean_episode_length": self.mean_length,
                       **{f"Perf/{k}": v for k, v in perf.items()}, **{f"Policy/{k}": v for k, v in policy.items()},
                       **{f"Loss/{k}": v for k, v in report["losses"].items()}, **report["env_logs"]}
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, it)
        if it % self.log_interval and it != self.max_iterations:
            return
        done = it - self.start_iteration
        total = f"/{self.max_iterations}" if self.max_iterations else ""
        eta = f"ETA {format_duration(elapsed / done * (self.max_iterations - it))}" if self.max_iterations else "until stopped"
        middle = report.get("progress") or f"value loss {report['losses']['value']:.3g}"
        logs = report["env_logs"]  # the env's share of world-steps whose solver hit a limit, if it counts them
        if "Solver/limit_fraction" in logs:
            middle += f" | solver limits {logs['Solver/limit_fraction']:.2%}/step"
            if logs.get("Solver/overflow_fraction"):  # contacts or constraints were dropped: rare, and worth a look
                middle += f", overflow {logs['Solver/overflow_fraction']:.2%}"
        print(f"[it {it}{total}] {perf['env_steps_per_s']:,.0f} steps/s | reward {self.mean_return:8.2f} | "
              f"ep len {self.mean_length:6.1f} | {middle} | lr {report['learning_rate']:.1e} | "
              f"mem {perf['memory_mb'] / 1024:.1f} GiB | {format_duration(elapsed)} elapsed, {eta}", flush=True)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
