"""``legion replay``: a trajectory file's episodes again in the simulator, side by side with the file.

Every selected episode gets its own world of one env built from the file's config; all replay at
once.

- ``mode=actions``, a simulator recording: each world is reset to the episode's initial state
  with the physical parameters it ran with (friction, masses, gains, gravity, actuator delay),
  then the recorded actions go through the task's action term and the physics. After each step
  the state is compared with the recorded one (``next_states``). What an interval event (a push)
  wrote into the state between two steps is written again at the same step. On the same device
  and versions the replay is bit-exact on CPU; elsewhere the divergence is measured and
  reported, never hidden.
- ``mode=actions``, a robot log: the simulator is driven with the joint targets the robot was
  sent, from its logged initial state, with the model's own physical parameters (every event
  term off), and compared with the robot's next logged state, joint by joint.
- ``mode=states``: each recorded state is set frame by frame (for viewing; the state read back
  equals the file's).

Physical parameters are recorded as each episode starts; an interval event that changes them
during an episode (rather than the state, as a push does) is not replayed, and the report says so
for the episodes it touched (attribute ``params_changed``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from legion.sim2real.trajectories.file import (
    Episode,
    TrajectoryFile,
    TrajectoryFileError,
    config_of,
    sha256_file,
)
from legion.sim2real.trajectories.record import Layout, param_views, state_views, versions

if TYPE_CHECKING:
    from legion.tasks.env import LegionEnv

MODES = ("actions", "states")


@dataclass
class ReplayResult:
    """What a replay did, per episode (E) and step (T, the longest episode's comparison steps).

    Attributes:
        recorded, replayed: ``"<entity>/<view>"`` -> (E, T, ...) the file's state at each
            comparison point and the simulator's there (past an episode's end: its last value).
            Actions: the state after step t's physics; robot logs: the state read at tick t + 1;
            states: the state of step t.
        error: ``"<entity>/<view>"`` -> (E, T) the largest |replayed - recorded| over the view's
            elements, NaN past an episode's end (or after a robot's loop stopped).
        initial: ``"<entity>/<view>"`` -> (E, ...) the state each episode started from.
        notes: what the reader should know (versions differ, a robot loop stopped, ...).
    """

    path: Path
    mode: str
    source: str
    names: list[str]
    episodes: list[Episode]
    recorded: dict[str, np.ndarray]
    replayed: dict[str, np.ndarray]
    error: dict[str, np.ndarray]
    initial: dict[str, np.ndarray]
    control_dt: float
    joint_names: list[str]
    attrs: dict  # the file's attributes
    notes: list[str] = field(default_factory=list)

    @property
    def bit_exact(self) -> bool:
        """Every compared value equal, bit for bit."""
        return all(np.all(np.nan_to_num(e, nan=0.0) == 0.0) for e in self.error.values())

    def first_divergence(self) -> int | None:
        """The first step at which any episode differs from the file (None: none does)."""
        steps = [np.flatnonzero(np.nan_to_num(e, nan=0.0).max(0) > 0) for e in self.error.values()]
        firsts = [int(s[0]) for s in steps if len(s)]
        return min(firsts) if firsts else None

    def joint_rmse(self) -> np.ndarray:
        """(E, J) root-mean-square joint position error over each episode's compared steps [rad or m]."""
        diff = self.replayed["robot/joint_pos"] - self.recorded["robot/joint_pos"]
        valid = ~np.isnan(self.error["robot/joint_pos"])[..., None]
        squares = np.where(valid, diff**2, 0.0).sum(1) / np.maximum(valid.sum(1), 1)
        return np.sqrt(squares)

    def summary(self) -> dict:
        """JSON-able numbers: per view the largest error, per episode its length and largest error."""
        return {
            "file": str(self.path), "mode": self.mode, "source": self.source, "bit_exact": self.bit_exact,
            "first_divergence_step": self.first_divergence(),
            "max_error": {view: float(np.nanmax(e)) if np.isfinite(e).any() else None
                          for view, e in self.error.items()},
            "episodes": [{"name": name, "steps": int(ep.length),
                          "max_error": {v: float(np.nanmax(e[i])) if np.isfinite(e[i]).any() else None
                                        for v, e in self.error.items()}}
                         for i, (name, ep) in enumerate(zip(self.names, self.episodes))],
            **({"joint_rmse": dict(zip(self.joint_names, self.joint_rmse().mean(0).tolist()))}
               if self.source == "robot" and self.mode == "actions" else {}),
            "notes": self.notes,
        }

    def report(self) -> str:
        """The lines ``legion replay`` prints."""
        what = {"actions": "actions" if self.source == "sim" else "logged joint targets", "states": "states"}[self.mode]
        lines = [f"[legion] replayed {len(self.names)} episode(s) of {self.path} ({self.source}) by {what}: "
                 f"{sum(ep.length for ep in self.episodes)} steps of {self.control_dt:g} s"]
        if self.source == "sim":
            first = self.first_divergence()
            lines.append("  bit-exact: every state equals the recording" if self.bit_exact else
                         f"  diverges from step {first} on (replay and recording differ; see the errors below)")
        for view, error in self.error.items():
            if np.isfinite(error).any():
                lines.append(f"  {view:28s} max |error| {np.nanmax(error):.3g}  at the last step {_last(error):.3g}")
        if self.source == "robot" and self.mode == "actions":
            rmse = self.joint_rmse().mean(0)
            lines.append("  joint position RMSE, simulated vs logged [rad]: "
                         + ", ".join(f"{n} {e:.3g}" for n, e in zip(self.joint_names, rmse)))
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _last(error: np.ndarray) -> float:
    """The mean over episodes of each one's error at its last compared step."""
    last = [row[np.isfinite(row)][-1] for row in error if np.isfinite(row).any()]
    return float(np.mean(last)) if last else float("nan")


def replay(path: str | Path, mode: str = "actions", episodes=None, device: str | None = None,
           on_step: Callable[[LegionEnv], None] | None = None) -> ReplayResult:
    """Replays the episodes of a trajectory file (``episodes``: indices, default all) on ``device``
    (default: the recording's) and returns the comparison. See the module docstring.
    ``on_step(env)`` is called with the initial state and after each step (a viewer draws it)."""
    from legion import api
    from legion.tasks.sim import resolve_asset

    if mode not in MODES:
        raise ValueError(f"mode={mode}: choose one of {list(MODES)}.")
    with TrajectoryFile(path) as f:
        names = f.episodes if episodes is None else [_episode_name(f, i) for i in episodes]
        loaded = [f.episode(name) for name in names]
        attrs, cfg = f.attrs, f.config
    if not loaded:
        raise TrajectoryFileError(f"{path} holds no episodes.")
    source = attrs["source"]
    robot_file = resolve_asset(cfg.task.scene.robot.file)
    if sha256_file(robot_file) != attrs["robot_sha256"]:
        raise TrajectoryFileError(
            f"{path} was recorded with another robot model: {robot_file} has sha256 "
            f"{sha256_file(robot_file)[:12]}..., the file was recorded with {attrs['robot_sha256'][:12]}... "
            f"({attrs['robot_file']}). The physics would differ: replay with the model it was recorded with, "
            "or record again.")
    notes = [f"recorded with {k} {v}, replaying with {versions().get(k)}: an exact replay needs the same versions"
             for k, v in attrs.get("versions", {}).items() if versions().get(k) != v]
    notes += [f"{name}: an interval event changed its physical parameters during the episode; mode=actions "
              "replays it with the parameters it started with" for name, ep in zip(names, loaded)
              if ep.attrs.get("params_changed") and mode == "actions"]
    cfg.sim.num_envs = len(loaded)
    if device:
        cfg.device = device
    if device and device != attrs["device"]:
        notes.append(f"recorded on {attrs['device']}, replaying on {device}")
    if source == "robot":  # the robot's physics is the model's own: no randomization, no latency model
        for term in cfg.task.events.values():
            term.enabled = False
    api.validate(cfg)
    api.seed_everything(cfg.seed)
    env = api.make_env(cfg)
    with torch.inference_mode():
        steps = _Replay(env, loaded, source).run(mode, notes, on_step or (lambda env: None))
    recorded, replayed, error, initial = steps
    return ReplayResult(Path(path), mode, source, list(names), loaded, recorded, replayed, error, initial,
                        attrs["control_dt"], list(env.robot.joint_names), attrs, notes)


def _episode_name(f: TrajectoryFile, index) -> str:
    name = index if isinstance(index, str) and index.startswith("demo_") else f"demo_{int(index)}"
    if name not in f.episodes:
        raise ValueError(f"{f.path} has no episode {index}; it has {len(f.episodes)} (demo_0 ... "
                         f"demo_{len(f.episodes) - 1}).")
    return name


class _Replay:
    """The episodes as padded (T, E, ...) device tensors, and the stepping."""

    def __init__(self, env, episodes: list[Episode], source: str):
        self.env, self.episodes, self.source = env, episodes, source
        self.device = env.device
        self.views = state_views(env)
        self.layout = Layout(self.views)
        self.lengths = torch.tensor([ep.length for ep in episodes], device=self.device)
        self.horizon = int(self.lengths.max())
        missing = [v for v in self.views if f"states/{v}" not in episodes[0].data]
        if missing:
            raise TrajectoryFileError(f"the file's states lack {missing}, which this task's scene has; it was "
                                      "recorded with another scene.")

    def padded(self, key: str) -> torch.Tensor:
        """(T, E, ...) of the episodes' ``key``, each padded with its last row."""
        rows = [ep.data[key] for ep in self.episodes]
        out = np.stack([np.concatenate([r, np.repeat(r[-1:], self.horizon - len(r), 0)]) for r in rows], axis=1)
        return torch.as_tensor(out, device=self.device)

    def packed(self, prefix: str) -> torch.Tensor:
        """(T, E, D) the episodes' state views under ``prefix`` (``states`` or ``next_states``), packed."""
        return torch.cat([self.padded(f"{prefix}/{v}").reshape(self.horizon, len(self.episodes), -1).float()
                          for v in self.views], dim=2)

    def write(self, packed: torch.Tensor) -> None:
        for name, s in self.layout.slices.items():
            self.views[name][:] = packed[:, s].reshape(self.views[name].shape)

    def run(self, mode: str, notes: list[str], on_step: Callable[[LegionEnv], None]):
        env, n = self.env, len(self.episodes)
        everyone = torch.arange(n, device=self.device)
        starts = self.packed("states")
        initial = starts[0].clone()
        if self.source == "sim":  # the parameters each episode ran with
            params = param_views(env)
            for name, view in params.items():
                view[:] = torch.as_tensor(np.stack([ep.data[f"params/{name}"] for ep in self.episodes]),
                                          device=self.device)
            env.sim.params_changed(*{name.rpartition("/")[2] for name in params
                                     if name not in ("action_delay", "command_latency")})
        self.write(initial)
        env.sim.reset(everyone)
        # The action term's own state starts where an episode starts it (a delta action's targets,
        # a task-space action's desired pose: from the joint positions just written).
        env.action.reset(torch.ones(n, dtype=torch.bool, device=self.device))
        on_step(env)
        steps = torch.arange(self.horizon, device=self.device)
        if mode == "states":
            expected, active = starts, steps[:, None] < self.lengths
        elif self.source == "sim":
            expected, active = self.packed("next_states"), steps[:, None] < self.lengths
        else:  # a robot log: targets of tick t, compared with the state read at tick t + 1
            expected = torch.cat([starts[1:], starts[-1:]])
            targets = self.padded("targets").float()
            stopped = ~torch.isfinite(targets).all(-1)  # the loop stopped and damped: nothing to replay
            active = (steps[:, None] < self.lengths - 1) & ~(torch.cumsum(stopped.long(), 0) > 0)
            for i, ep in enumerate(self.episodes):
                if ep.attrs.get("stop_reason"):
                    notes.append(f"episode {i}: the robot's loop stopped ({ep.attrs['stop_reason']}); compared up to "
                                 f"tick {int(active[:, i].sum())}")
            joint_ids = torch.tensor([env.robot.joint_names.index(name) for name in self._log_joints()],
                                     device=self.device)
        if mode == "actions" and self.source == "sim":
            actions = self.padded("actions").float()
        replayed = torch.empty_like(expected)
        for t in range(self.horizon):
            if mode == "states":
                self.write(starts[t])
                env.sim.reset(everyone)
            elif self.source == "sim":
                env.action.apply(actions[t])
                env.sim.step()
            else:
                env.robot.joint_pos_target[:, joint_ids] = torch.where(active[t, :, None], targets[t],
                                                                       env.robot.joint_pos_target[:, joint_ids])
                env.sim.step()
            on_step(env)
            now = self.layout.pack(self.views)
            replayed[t] = now
            if mode == "actions" and self.source == "sim" and t + 1 < self.horizon:
                # An interval event (a push) wrote the state after step t's physics: write it again.
                # Where the replay is exact this restores the recording bit for bit; where it has
                # diverged, the event's change is added to the replayed state instead.
                recorded_after, recorded_next = expected[t], starts[t + 1]
                written = (recorded_next != recorded_after) & active[t + 1, :, None]
                if written.any():
                    exact = torch.where(now == recorded_after, recorded_next, now + (recorded_next - recorded_after))
                    self.write(torch.where(written, exact, now))
        return self._compare(expected, replayed, active, initial)

    def _log_joints(self) -> list[str]:
        names = self.env.robot.joint_names
        logged = self.episodes[0].data["targets"].shape[-1]
        if logged != len(names):
            raise TrajectoryFileError(f"the log's targets drive {logged} joints, the simulated robot has {len(names)} "
                                      f"({names}).")
        return names

    def _compare(self, expected, replayed, active, initial):
        unpack = self.layout.unpack
        recorded = {k: np.moveaxis(v, 0, 1) for k, v in unpack(expected.cpu().numpy()).items()}
        simulated = {k: np.moveaxis(v, 0, 1) for k, v in unpack(replayed.cpu().numpy()).items()}
        mask = active.T.cpu().numpy()  # (E, T)
        error = {}
        for view in self.views:
            diff = np.abs(simulated[view] - recorded[view]).reshape(*mask.shape, -1).max(-1)
            error[view] = np.where(mask, diff, np.nan)
        return recorded, simulated, error, unpack(initial.cpu().numpy())


def write_outputs(result: ReplayResult, out: Path, video: bool, plots: bool, overwrite: bool = False,
                  size: tuple[int, int] = (480, 640)) -> list[Path]:
    """Writes ``replay.json`` (:meth:`ReplayResult.summary`) and, if asked, one MP4 per episode
    (the replayed motion, camera tracking the robot) and PNG plots into the folder ``out``."""
    from legion.sim2real.trajectories import media

    if out.exists() and any(out.iterdir()) and not overwrite:
        raise TrajectoryFileError(f"{out} exists and is not empty; choose another out= or pass overwrite=true.")
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "replay.json"]
    (out / "replay.json").write_text(json.dumps(result.summary(), indent=2) + "\n")
    if video:
        renderer = media.SceneRenderer(config_of(result.attrs), *size)
        try:
            for i, name in enumerate(result.names):
                written.append(media.write_video(renderer, media.frames(result, i), out / f"{name}.mp4",
                                                 1.0 / result.control_dt, result.joint_names))
        finally:
            renderer.close()
    if plots:
        for i, name in enumerate(result.names):
            written += media.plot_episode(result, i, out, name)
    return written
