"""What training reports: episode statistics while acting, and per iteration a progress line,
TensorBoard scalars and an in-memory history, the same for every runner.

A runner hands :meth:`TrainingLog.record` one report per finished iteration::

    {"iteration", "episodes", "env_logs", "latency_mean_ms",
     "latency_max_ms", "nonfinite_max"                  # RolloutStats.end()
     "losses", "learning_rate", "action_std",           # the update
     "collect_s", "learn_s", "wall_s",                  # seconds of acting, learning, the iteration
     "perf": {...}, "policy": {...},                    # optional: runner-specific scalars (Perf/, Policy/)
     "progress": "..."}                                 # optional: the runner's part of the progress line
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

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
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class RolloutStats:
    """What the acting side learns while it collects: the episodes that finished (how many, the
    sums of their returns and lengths), the env's logged terms, the largest share of envs whose
    physics went non-finite in one step, and the loop latency (time from one action to the next).

    Everything accumulates on the device; :meth:`end` reads it back once per rollout, so acting
    never waits for the host.

    Args:
        num_envs: number of environments.
        device: where the running episode sums live.
    """

    def __init__(self, num_envs: int, device: str):
        self.device = device
        self.episode_return = torch.zeros(num_envs, device=device)
        self.episode_length = torch.zeros(num_envs, device=device)
        self.last_action_time: float | None = None
        self.begin()

    def begin(self) -> None:
        """Starts a new rollout's tallies (the running episodes carry on)."""
        self.finished = {"count": torch.zeros((), device=self.device),
                         "return_sum": torch.zeros((), device=self.device),
                         "length_sum": torch.zeros((), device=self.device)}
        self.env_logs: dict = {}
        self.env_episodes: dict = {}
        self.nonfinite_max = torch.zeros((), device=self.device)
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
        done = dones.float()
        self.finished["count"] += done.sum()
        self.finished["return_sum"] += (self.episode_return * done).sum()
        self.finished["length_sum"] += (self.episode_length * done).sum()
        self.episode_return.masked_fill_(dones, 0.0)
        self.episode_length.masked_fill_(dones, 0.0)
        for key, value in extras.get("log", {}).items():
            self.env_logs[key] = self.env_logs.get(key, 0.0) + value
        for key, value in extras.get("episodes", {}).items():
            self.env_episodes[key] = self.env_episodes.get(key, 0.0) + value
        if "Episode_Termination/nonfinite" in extras.get("log", {}):
            self.nonfinite_max = torch.maximum(self.nonfinite_max, extras["log"]["Episode_Termination/nonfinite"])

    def end(self) -> dict:
        """This rollout's tallies, as plain Python numbers (the one read-back per rollout)."""
        episodes = {k: float(v) for k, v in self.finished.items()}
        ended = {k: float(v) for k, v in self.env_episodes.items()}
        count = ended.pop("count", 0.0)
        env_logs = {k: float(v) / max(1, self.steps) for k, v in self.env_logs.items()}
        if count:  # per-term episode rewards: means over the episodes that ended in this rollout
            env_logs.update({k: v / count for k, v in ended.items()})
        return {
            "episodes": episodes,
            "env_logs": env_logs,
            "nonfinite_max": float(self.nonfinite_max),
            "latency_mean_ms": 1000 * self.latency_sum / max(1, self.steps),
            "latency_max_ms": 1000 * self.latency_max,
        }


class TrainingLog:
    """Books finished iterations: the mean return and length of the last ~100 episodes (those of
    the newest iterations that hold at least 100), a history of per-iteration numbers,
    TensorBoard scalars (with ``log_dir``) and the progress line.

    Args:
        samples_per_iteration: env steps per iteration (num_envs x steps per env x ranks).
        log_dir: TensorBoard folder; ``None`` writes nothing.
        log_interval: print the progress line every N iterations (and at the last).
        device: the learner's device (GPU memory is reported for CUDA).
        verbose: print the progress line (rank 0 of a multi-process run only).
    """

    def __init__(self, samples_per_iteration: int, log_dir: Path | None, log_interval: int = 1, device: str = "cpu",
                 verbose: bool = True, logger: str = "tensorboard", wandb_project: str = "legion-rl"):
        self.samples, self.log_dir = samples_per_iteration, log_dir
        self.logger, self.wandb_project = logger, wandb_project
        self.log_interval, self.device = log_interval, device
        self.verbose = verbose
        self.recent: deque = deque()  # per iteration: {"count", "return_sum", "length_sum"} of its episodes
        self.history: deque = deque(maxlen=10_000)
        # opened by start(), when training begins and a resume's purge step is known: TensorBoard's
        # SummaryWriter, or rsl-rl's W&B writer (a SummaryWriter that also logs to W&B)
        self.writer: Any = None
        self.start_iteration, self.max_iterations, self.start_time = 0, None, time.time()

    def start(self, iteration: int, max_iterations: int | None, purge_step: int | None = None) -> None:
        """A ``learn()`` call begins at ``iteration``: clocks and ETA restart. ``purge_step``: a
        resumed run drops TensorBoard events from that step on (those of the attempt that was cut)."""
        self.start_iteration, self.max_iterations, self.start_time = iteration, max_iterations, time.time()
        if self.log_dir is not None:
            if purge_step is not None:
                self.close()  # TensorBoard reads a purge at the start of an event file: open a new one
            if self.writer is None and self.logger == "wandb":
                from rsl_rl.utils.wandb_log_writer import WandbLogWriter

                os.environ.setdefault("WANDB_DIR", str(self.log_dir))  # its run folder: <run>/wandb/
                self.writer = WandbLogWriter(str(self.log_dir), self.wandb_project)
            elif self.writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10, purge_step=purge_step)

    def _recent(self, key: str) -> float:
        count = sum(r["count"] for r in self.recent)
        return sum(r[key] for r in self.recent) / count if count else 0.0

    @property
    def mean_return(self) -> float:
        return self._recent("return_sum")

    @property
    def mean_length(self) -> float:
        return self._recent("length_sum")

    @property
    def episodes(self) -> int:
        """How many episodes :attr:`mean_return` and :attr:`mean_length` average over."""
        return int(sum(r["count"] for r in self.recent))

    def record(self, report: dict) -> None:
        it = report["iteration"]
        if report["episodes"]["count"]:
            self.recent.append(report["episodes"])
            while len(self.recent) > 1 and sum(r["count"] for r in list(self.recent)[1:]) >= 100:
                self.recent.popleft()
        elapsed = time.time() - self.start_time
        perf = {
            "env_steps_per_s": self.samples / report["wall_s"],
            "learner_samples_per_s": self.samples / report["learn_s"] if report["learn_s"] else 0.0,
            "collection_time_s": report["collect_s"],
            "learning_time_s": report["learn_s"],
            "loop_latency_ms": report["latency_mean_ms"],
            "loop_latency_max_ms": report["latency_max_ms"],
            "memory_mb": process_memory_mb(),
            **report.get("perf", {}),
        }
        if torch.device(self.device).type == "cuda":
            perf["gpu_memory_mb"] = torch.cuda.memory_allocated(self.device) / 2**20
        policy = {"learning_rate": report["learning_rate"], "action_std": report["action_std"],
                  **report.get("policy", {})}
        self.history.append({"iteration": it, "time_s": elapsed, "mean_reward": self.mean_return,
                             "mean_episode_length": self.mean_length, **perf, **policy})
        if self.writer is not None:
            scalars = {"Train/mean_reward": self.mean_return, "Train/mean_episode_length": self.mean_length,
                       **{f"Perf/{k}": v for k, v in perf.items()}, **{f"Policy/{k}": v for k, v in policy.items()},
                       **{f"Loss/{k}": v for k, v in report["losses"].items()}, **report["env_logs"]}
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, it)
        if not self.verbose or it % self.log_interval and it != self.max_iterations:
            return
        done = it - self.start_iteration
        total = f"/{self.max_iterations}" if self.max_iterations else ""
        if self.max_iterations:
            eta = f"ETA {format_duration(elapsed / done * (self.max_iterations - it))}"
        else:
            eta = "until stopped"
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

    def add_video(self, path: Path, iteration: int, frames: list, fps: float) -> None:
        """The policy at ``iteration``: ``frames`` ((H, W, 3) uint8 images, ``fps`` apart) as an
        animated GIF in TensorBoard's images (``Video/episode``); the MP4 at ``path`` in W&B."""
        if self.writer is None or not frames:
            return
        import imageio.v3 as iio
        from tensorboard.compat.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]

        gif = iio.imwrite("<bytes>", frames, extension=".gif", duration=1000 / fps, loop=0)
        height, width = frames[0].shape[:2]
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag="Video/episode", image=image)]),
                                                   iteration)
        if hasattr(self.writer, "save_video"):  # rsl-rl's W&B writer
            self.writer.save_video(Path(path), iteration)

    def close(self) -> None:
        if self.writer is not None:
            if hasattr(self.writer, "stop"):  # rsl-rl's W&B writer: finish the W&B run
                self.writer.stop()
            self.writer.close()
            self.writer = None
