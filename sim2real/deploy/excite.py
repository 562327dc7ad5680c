"""Identification routines (``legion deploy ... excite=chirp``): joint targets about the default
pose that excite the robot's dynamics, run through the control loop and its safety layer and
logged like a policy, for calibrating the simulator from the robot's logs. Imports numpy only.

``chirp``: every joint follows ``A sin(phase(t) + 2 pi j / J)``, the frequency sweeping
log-uniformly from ``f_min`` to ``f_max`` over the routine (joint ``j`` of ``J`` phase-shifted so
the joints do not all move at once). ``steps``: every joint jumps between ``-A``, ``0`` and ``+A``
every ``step_s``, in a seeded random order per joint. Both fade in and out over ``fade_s``, so the
routine starts and ends at the default pose. Run it with the robot hung (the base held: what
separates the motors' gains from the body's mass) or standing with a small amplitude; on an arm,
in free space.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROUTINES = ("chirp", "steps")


@dataclass
class Excitation:
    """An identification routine; :meth:`offsets` gives its joint targets' offsets at a time."""

    name: str = "chirp"
    amplitude: float = 0.1  # [rad] of every joint's offset from the default pose
    duration_s: float = 20.0
    f_min: float = 0.2  # [Hz] chirp: the sweep's start ...
    f_max: float = 5.0  # ... and end
    step_s: float = 0.5  # steps: how long each level is held [s]
    fade_s: float = 1.0  # in and out [s]
    seed: int = 0  # steps: the order of the levels

    def __post_init__(self):
        if self.name not in ROUTINES:
            raise ValueError(f"excite={self.name}: choose one of {', '.join(ROUTINES)}")
        if not (self.amplitude > 0 and self.duration_s > 2 * self.fade_s >= 0 and 0 < self.f_min < self.f_max
                and self.step_s > 0):
            raise ValueError(f"excite={self.name}: needs amplitude > 0 (got {self.amplitude}), duration_s > "
                             f"2 fade_s (got {self.duration_s}, {self.fade_s}), 0 < f_min < f_max (got "
                             f"{self.f_min}, {self.f_max}) and step_s > 0 (got {self.step_s})")

    def frequency(self, t: float) -> float:
        """The chirp's instantaneous frequency [Hz] at ``t``."""
        return self.f_min * (self.f_max / self.f_min) ** (t / self.duration_s)

    def offsets(self, t: float, num_joints: int) -> np.ndarray:
        """(num_joints,) target offsets [rad] from the default pose at time ``t`` [s] (zero outside
        the routine)."""
        if not 0.0 <= t <= self.duration_s:
            return np.zeros(num_joints)
        fade = min(1.0, t / self.fade_s, (self.duration_s - t) / self.fade_s) if self.fade_s > 0 else 1.0
        shift = 2 * np.pi * np.arange(num_joints) / num_joints
        if self.name == "chirp":
            ratio = self.f_max / self.f_min  # phase = integral of 2 pi f(t) dt
            phase = 2 * np.pi * self.f_min * self.duration_s / np.log(ratio) * (ratio ** (t / self.duration_s) - 1)
            return self.amplitude * fade * np.sin(phase + shift)
        steps = int(np.ceil(self.duration_s / self.step_s))
        levels = np.random.default_rng(self.seed).integers(-1, 2, size=(steps, num_joints))
        return self.amplitude * fade * levels[min(int(t / self.step_s), steps - 1)]


class ExcitationRunner:
    """A :class:`~legion.sim2real.deploy.PolicyRunner` stand-in for :class:`ControlLoop`: each
    tick's targets are the default pose plus the routine's offsets at the tick's time; the
    policy's metadata (joints, rate, limits) and file (for the log) are the runner's."""

    def __init__(self, runner, excitation: Excitation):
        self.runner, self.excitation = runner, excitation
        self.metadata, self.control_dt, self.policy = runner.metadata, runner.control_dt, runner.policy
        self.default = np.asarray(runner.metadata.default_joint_pos, np.float32)
        self.ticks = round(excitation.duration_s / self.control_dt)  # the routine's length
        self.reset()

    def reset(self) -> None:
        self.tick = 0
        self.last_obs = self.last_action = None  # no policy ran: the log's obs and actions are NaN

    def act(self, state: dict, command=None) -> np.ndarray:
        t = self.tick * self.control_dt
        self.tick += 1
        return (self.default + self.excitation.offsets(t, len(self.default))).astype(np.float32)
