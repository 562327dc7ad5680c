"""The robot's trajectory, as the control loop saw it: one ``.npz`` per episode, numpy only.

Give a :class:`TrajectoryLog` to :class:`~legion.sim2real.deploy.ControlLoop` (``logger=``); every
tick adds a row, :meth:`TrajectoryLog.end_episode` (or leaving the ``with`` block) writes the
episode as ``<folder>/episode_<k>.npz``, atomically. On the training machine,
``legion dataset convert <folder> format=hdf5 run=<run folder> out=<file.h5>`` turns a folder of
these into the simulator's trajectory format (:mod:`legion.sim2real.trajectories`), and
``legion replay <file.h5>`` drives the simulator with the logged targets.

Arrays of an episode of T ticks (NaN where a tick has no value, e.g. no state read once stopped):

- every key of the robot state dict (:mod:`legion.sim2real.deploy.policy`): ``joint_pos`` (T, J)
  [rad], ``joint_vel`` (T, J) [rad/s], ``base_quat`` (T, 4) (x, y, z, w), ``base_lin_vel`` /
  ``base_ang_vel`` (T, 3) base frame [m/s, rad/s], ``base_pos`` (T, 3) [m], ``timestamp`` (T,) [s];
  from a Unitree robot also ``joint_torque`` (T, J) [N m] (the motors' tau_est), ``base_accel``
  (T, 3) [m/s^2] (the IMU's accelerometer, base frame) and ``foot_force`` (Go2)
- ``targets`` (T, J) [rad]: the joint position targets written (NaN while stopped and damping)
- ``obs`` (T, obs_dim) and ``actions`` (T, num_actions): the policy's input and output (NaN on
  ticks where the policy did not run: watchdog holds, stops)
- ``command`` (T, 3): (v_x, v_y, yaw rate) [m/s, m/s, rad/s]
- ``mode`` (T,) int8: 0 policy, 1 hold (stale sensors), 2 stop; ``latency`` (T,) [s] read ->
  write; ``tick_time`` (T,) [s] the tick's start on ``time.monotonic``
- ``meta``: a JSON string: joint names, control dt, the policy file's sha256, its task, robot,
  config hash and observation layout, why the loop stopped (if it did), the wall-clock start time.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from legion.sim2real.deploy.policy import sha256_file

MODES = ("policy", "hold", "stop")  # the index is the logged mode


class TrajectoryLog:
    """Collects the ticks of one episode at a time and writes each episode to ``folder``.

    Args:
        folder: where ``episode_<k>.npz`` files go (created if missing).
        runner: the :class:`~legion.sim2real.deploy.PolicyRunner` the loop runs (its metadata and
            last observation/action are logged).
        overwrite: replace the log already in ``folder`` (its episode files go when this log writes its
            first episode, so that the folder never mixes two sessions); by default a ``folder`` that
            holds any ``episode_<k>.npz`` is refused here (ValueError), never silently replaced.

    Memory: one episode's rows; each episode is written and dropped at :meth:`end_episode`.
    """

    def __init__(self, folder: str | Path, runner, overwrite: bool = False):
        self.folder, self.runner, self.overwrite = Path(folder), runner, overwrite
        # Checked now, before a robot moves: at end_episode the session it would lose has been run.
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"{self.folder} is a file, not a folder: log into an empty or new folder.")
        if not overwrite and any(self.folder.glob("episode_*.npz")):
            raise ValueError(f"{self.folder} already holds a log (episode_*.npz): log into an empty or new folder.")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.episodes = 0
        self._rows: list[dict] = []
        self._stop_reason: str | None = None
        self._started = time.time()
        self._policy_sha256 = sha256_file(runner.policy.path)

    def tick(self, state: dict | None, targets: np.ndarray | None, mode: str, latency: float, command,
             stopped: str | None) -> None:
        """One control-loop tick (called by :class:`ControlLoop`): the state read (``None`` if none
        was), the targets written (``None`` if none were), the mode, latency [s], command and the
        loop's stop reason."""
        if not self._rows:
            self._started = time.time()
        ran = mode == "policy"
        self._rows.append({
            **_numeric(state),
            "targets": targets, "obs": self.runner.last_obs if ran else None,
            "actions": self.runner.last_action if ran else None,
            "command": np.zeros(3, np.float32) if command is None else np.asarray(command, np.float32),
            "mode": MODES.index(mode), "latency": latency, "tick_time": time.monotonic() - latency,
        })
        self._stop_reason = stopped

    def end_episode(self) -> Path | None:
        """Writes the ticks since the last call as the next ``episode_<k>.npz``; returns its path
        (``None`` if there were no ticks)."""
        if not self._rows:
            return None
        path = self.folder / f"episode_{self.episodes:06d}.npz"
        if path.exists() and not self.overwrite:  # written since the constructor checked: by another log?
            raise FileExistsError(f"{path} appeared while logging (another log writing into {self.folder}?): "
                                  "log into an empty or new folder.")
        if self.episodes == 0 and self.overwrite:  # the earlier session goes whole, not episode by episode
            for earlier in self.folder.glob("episode_*.npz"):
                earlier.unlink()
        keys = list(dict.fromkeys(k for row in self._rows for k in row))
        arrays = {key: _stack([row.get(key) for row in self._rows]) for key in keys}
        arrays["mode"] = arrays["mode"].astype(np.int8)
        meta = self.runner.metadata
        arrays["meta"] = np.array(json.dumps({
            "joint_names": meta.joint_names, "control_dt": meta.control_dt,
            "policy_sha256": self._policy_sha256, "task": meta.task, "robot": meta.robot,
            "config_sha256": meta.config_sha256, "legion_version": meta.legion_version,
            "observation": dataclasses.asdict(meta.observation),
            "stop_reason": self._stop_reason, "started": self._started}))
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            np.savez_compressed(f, allow_pickle=False, **arrays)  # numbers and one JSON string only
        tmp.replace(path)
        self.episodes += 1
        self._rows, self._stop_reason = [], None
        return path

    def __enter__(self) -> TrajectoryLog:
        return self

    def __exit__(self, *exc) -> None:
        self.end_episode()


def _numeric(state: dict | None) -> dict:
    """The state's numeric entries (a malformed one, which stopped the loop, is left out)."""
    out = {}
    for key, value in (state or {}).items():
        try:
            out[key] = np.asarray(value, np.float64 if key == "timestamp" else np.float32)
        except (TypeError, ValueError):
            pass
    return out


def _stack(values: list) -> np.ndarray:
    """Rows to one array; rows without a value (None) become NaN rows shaped like the others."""
    present = next((np.asarray(v) for v in values if v is not None), None)
    if present is None:
        return np.full(len(values), np.nan, np.float32)
    blank = np.full(present.shape, np.nan, present.dtype if present.dtype.kind == "f" else np.float32)
    return np.stack([blank if v is None else np.asarray(v, blank.dtype) for v in values])

