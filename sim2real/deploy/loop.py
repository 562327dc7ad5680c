"""The fixed-rate control loop around a :class:`PolicyRunner`, with its safety layer.

Each tick (period = the policy's control dt): read the robot state, check it, run the policy,
clamp the targets, write them. Imports numpy only.

Safety, in the order it is applied:

- Clock: a state ``timestamp`` more than ``max_clock_skew_s`` AHEAD of the loop's clock
  (``now``), or not a finite number, -> the loop STOPS: the driver stamps another clock than
  the loop reads (e.g. ``time.time()`` against ``time.monotonic()``), and the watchdog below
  cannot work. A missing or non-numeric ``timestamp`` raises (see "Errors").
- Watchdog: sensor data older than ``stale_after_s`` -> the loop HOLDS the last targets it
  wrote (the policy does not run on stale data); older than ``damp_after_s`` -> it STOPS. A
  camera's image may carry its own time (``<camera>/timestamp``: cameras run at their own rate,
  slower than the loop); older than ``image_stale_after_s`` (default: the camera's frame period
  in training plus ``stale_after_s``) it HOLDS, older than ``image_damp_after_s`` it STOPS, and
  its clock is checked as the state's. Without it, an image is as old as the state.
- NaN guard: a non-finite value in the state the policy reads, or in the policy's output
  (:class:`~legion.sim2real.deploy.policy.NonFiniteError`) -> it STOPS.
- STOP is latched (restart the loop to leave it): every later tick calls ``robot.damp()`` if
  the robot has one (e.g. kp = 0, kd > 0 on hardware), else writes the last finite measured
  joint positions as targets, so the PD servos only resist motion.
- Errors: any exception in ``read_state``, the policy (a malformed state:
  :class:`~legion.sim2real.deploy.policy.StateError`), ``write_targets``, ``damp`` or the
  command function stops the loop the same way at once (``stopped`` names the exception and
  where it came from), then propagates unchanged, traceback included, out of :meth:`step`
  and :meth:`run`. Ctrl-C or SIGTERM stops the loop before the next tick and :meth:`run` returns.
- Clamps on every target written: inside the joint limits (minus ``limit_margin``), and at
  most ``max_target_rate * dt`` away from the previous target.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from legion import StopRequests
from legion.sim2real.deploy.policy import NonFiniteError, StateError

POLICY, HOLD, STOP = "policy", "hold", "stop"
# A stale-data stop this old or older is far more likely two clocks than a sensor that froze.
CLOCK_MISMATCH_HINT_S = 10.0


@runtime_checkable
class RobotInterface(Protocol):
    """What the loop needs from a robot. Implement it for your hardware (see MuJoCoRobot).

    ``read_state()`` returns the dict described in :mod:`legion.sim2real.deploy.policy`, with
    ``timestamp`` [s] on the clock given to :class:`ControlLoop` (``now``). ``write_targets``
    takes joint position targets (J,) [rad] in the policy's joint order. Optionally, ``damp()``
    switches the joints to pure damping (used once the loop stops).
    """

    def read_state(self) -> dict: ...

    def write_targets(self, joint_pos_targets: np.ndarray) -> None: ...


@dataclass
class SafetyConfig:
    stale_after_s: float = 0.05  # sensor age [s] beyond which the last targets are held
    damp_after_s: float = 0.25  # sensor age [s] beyond which the loop stops and damps
    max_target_rate: float = 20.0  # [rad/s] largest change of any joint target
    limit_margin: float = 0.0  # [rad] kept inside the joint limits
    max_clock_skew_s: float = 0.01  # [s] how far a state timestamp may lie ahead of the loop's clock
    # image age [s] beyond which the last targets are held; None: its camera's frame period + stale_after_s
    image_stale_after_s: float | None = None
    image_damp_after_s: float = 0.5  # image age [s] beyond which the loop stops and damps


@dataclass
class LoopStats:
    """Deadline statistics. ``latency`` is read -> write per tick [s]; a miss is a tick whose
    work ended after its deadline (start of the next period)."""

    period: float
    latency: list = field(default_factory=list)
    misses: int = 0
    modes: dict = field(default_factory=lambda: {POLICY: 0, HOLD: 0, STOP: 0})
    limit_clamped: int = 0  # ticks where the joint-limit clamp changed a target
    rate_clamped: int = 0  # ticks where the rate clamp changed a target

    def summary(self) -> dict:
        lat = np.asarray(self.latency) if self.latency else np.zeros(1)
        return {"ticks": len(self.latency), "period_ms": self.period * 1e3,
                "latency_p50_us": float(np.percentile(lat, 50) * 1e6),
                "latency_p99_us": float(np.percentile(lat, 99) * 1e6),
                "misses": self.misses, "limit_clamped": self.limit_clamped, "rate_clamped": self.rate_clamped,
                **self.modes}


class ControlLoop:
    """Runs a policy on a robot at the policy's control rate.

    Args:
        robot: a :class:`RobotInterface`.
        runner: a :class:`~legion.sim2real.deploy.policy.PolicyRunner` (its metadata gives dt and joint limits).
        safety: watchdog and clamp settings.
        now: the clock of the state timestamps [s]; ``time.monotonic`` for hardware, the
            simulator's time for a simulated robot.
        realtime: sleep to hold the period (hardware); ``False`` runs as fast as the robot steps.
        logger: gets every tick (e.g. a :class:`~legion.sim2real.deploy.log.TrajectoryLog`).
    """

    def __init__(self, robot: RobotInterface, runner, safety: SafetyConfig | None = None,
                 now: Callable[[], float] = time.monotonic, realtime: bool = True, logger=None):
        self.robot, self.runner, self.now, self.realtime, self.logger = robot, runner, now, realtime, logger
        self.safety = safety or SafetyConfig()
        self.dt = runner.control_dt
        limits = np.asarray(runner.metadata.joint_limits, np.float32)
        self.lower = limits[:, 0] + self.safety.limit_margin
        self.upper = limits[:, 1] - self.safety.limit_margin
        self.stats = LoopStats(self.dt)
        # per camera the policy sees through: how old its image may be before the targets are held
        stale = self.safety.image_stale_after_s
        self.image_stale_after_s = {name: camera.frame_period_s + self.safety.stale_after_s if stale is None else stale
                                    for name, camera in runner.metadata.cameras.items()}
        self.stopped: str | None = None  # why the loop stopped, once it has
        self.last_targets: np.ndarray | None = None
        self.last_joint_pos: np.ndarray | None = None
        runner.reset()  # a (re)started loop starts the policy afresh: no last action, no recurrent state

    def clamp(self, targets: np.ndarray) -> np.ndarray:
        """Targets inside the joint limits and within ``max_target_rate * dt`` of the previous ones."""
        out = np.clip(targets, self.lower, self.upper)
        self.stats.limit_clamped += int(not np.array_equal(out, targets))
        if self.last_targets is not None:
            step = self.safety.max_target_rate * self.dt * (1 + 1e-6)  # a policy trained to the same limit passes it
            limited = np.clip(out, self.last_targets - step, self.last_targets + step)
            self.stats.rate_clamped += int(not np.array_equal(limited, out))
            out = limited
        return out.astype(np.float32)

    def stop(self, reason: str) -> None:
        """Latches the stop; every later tick damps."""
        if self.stopped is None:
            self.stopped = reason

    def _damp(self) -> None:
        damp = getattr(self.robot, "damp", None)  # optional: not part of RobotInterface
        if damp is not None:
            damp()
        elif self.last_joint_pos is not None:
            self.robot.write_targets(self.last_joint_pos)
        elif self.last_targets is not None:
            self.robot.write_targets(self.last_targets)

    def _stop_on_error(self, reason: str) -> None:
        """The safe stop while an exception propagates: latch and damp. A failing damp is added to
        ``stopped``, never raised in place of the original error."""
        self.stop(reason)
        try:
            self._damp()
        except Exception as e:
            self.stopped = f"{self.stopped or reason}; damping failed too ({e.__class__.__name__}: {e})"

    def sensor_age(self, state: dict, key: str = "timestamp") -> float:
        """Age [s] of a state by its ``timestamp`` (or another key's time) on the loop's clock:
        negative if it lies in the future, not finite if the timestamp is not. Raises StateError
        without a numeric timestamp."""
        if key not in state:
            raise StateError(f"robot state lacks '{key}': the watchdog needs when the sensors were sampled [s], "
                             "on the loop's clock (ControlLoop(now=...), time.monotonic by default)")
        try:
            return self.now() - float(state[key])
        except (TypeError, ValueError):
            raise StateError(f"robot state '{key}' = {state[key]!r} is not a number; it must be when the "
                             "sensors were sampled [s], on the loop's clock (ControlLoop(now=...))") from None

    def _watchdog(self, state: dict) -> str:
        """POLICY, HOLD or STOP (latched, with its reason) by the age of the state and of each
        camera image that carries its own time (the module docstring)."""
        safety = self.safety
        ages = [("sensor data", "timestamp", self.sensor_age(state), safety.stale_after_s, safety.damp_after_s)]
        ages += [(f"camera '{name}' image", f"{name}/timestamp", self.sensor_age(state, f"{name}/timestamp"), stale,
                  safety.image_damp_after_s) for name, stale in self.image_stale_after_s.items()
                 if f"{name}/timestamp" in state]
        mode = POLICY
        for what, key, age, stale, damp in ages:
            if not math.isfinite(age):
                self.stop(f"non-finite robot state ['{key}']")
            elif age < -safety.max_clock_skew_s:
                stamp = "timestamp" if key == "timestamp" else f"'{key}'"
                self.stop(f"clock mismatch: the state's {stamp} is {-age:.3f} s ahead of the loop's clock "
                          f"(tolerance {safety.max_clock_skew_s * 1e3:.0f} ms). The robot driver must stamp "
                          "states with the clock the loop reads (ControlLoop(now=...), time.monotonic by "
                          "default; not time.time() in one and time.monotonic() in the other).")
            elif age > damp:
                hint = (" (that old: does the driver stamp another clock than the loop's now(), e.g. time.time() "
                        "against time.monotonic()?)" if age >= CLOCK_MISMATCH_HINT_S else "")
                self.stop(f"{what} {age * 1e3:.0f} ms old (limit {damp * 1e3:.0f} ms){hint}")
            elif age > stale:
                mode = HOLD
            if self.stopped is not None:
                return STOP
        return mode

    def step(self, command=None) -> str:
        """One tick: returns the mode it ran in (``"policy"``, ``"hold"`` or ``"stop"``).

        Any exception stops the loop safely, then propagates (see the module docstring)."""
        start = time.perf_counter()
        mode, where, state = STOP, "damp", None
        try:
            if self.stopped is None:
                where = "read_state"
                state = self.robot.read_state()
                watchdog = self._watchdog(state)
                if watchdog == HOLD:
                    mode = HOLD
                    if self.last_targets is not None:
                        where = "write_targets"
                        self.robot.write_targets(self.last_targets)
                elif watchdog == POLICY:
                    where = "the policy"
                    try:
                        targets = self.runner.act(state, command)
                    except NonFiniteError as e:  # the NaN guard: a designed stop, not an error
                        self.stop(str(e))
                    else:
                        self.last_joint_pos = np.array(state["joint_pos"], np.float32)
                        mode, where = POLICY, "write_targets"
                        self.last_targets = self.clamp(targets)
                        self.robot.write_targets(self.last_targets)
            if mode == STOP:
                where = "damp"
                self._damp()
        except BaseException as e:
            mode = STOP
            if isinstance(e, KeyboardInterrupt):
                self._stop_on_error("interrupted")
            elif where == "damp":  # the safe stop itself failed: nothing safer to fall back to
                self.stop(f"{e.__class__.__name__} in damp: {e}")
            else:
                self._stop_on_error(f"{e.__class__.__name__} in {where}: {e}")
            raise
        finally:
            elapsed = time.perf_counter() - start
            self.stats.latency.append(elapsed)
            self.stats.modes[mode] += 1
            if elapsed > self.dt:
                self.stats.misses += 1
            if self.logger is not None:
                self.logger.tick(state, None if mode == STOP else self.last_targets, mode, elapsed, command,
                                 self.stopped)
        return mode

    def run(self, steps: int, command: Callable[[int], np.ndarray] | np.ndarray | None = None,
            stop: threading.Event | None = None) -> dict:
        """``steps`` ticks at the control rate; ``command`` is fixed or a function of the tick.

        Returns :meth:`LoopStats.summary`. Ctrl-C or SIGTERM stops the loop (damping) before the
        next tick and returns too: the signal sets a flag (:class:`legion.StopRequests`), so it
        cannot be lost in a finalizer. A program with signal handling of its own passes the event
        its handlers set as ``stop``, and the loop installs none. Any other exception stops it
        safely and propagates with its traceback.
        """
        next_tick = time.perf_counter()
        requests = StopRequests(stop)  # (its handlers installed only where the caller has none)
        try:
            with requests if stop is None else contextlib.nullcontext():
                for k in range(steps):
                    if requests.event.is_set():
                        self._stop_on_error("interrupted")
                        break
                    self.step(command(k) if callable(command) else command)
                    if self.realtime:
                        next_tick += self.dt
                        delay = next_tick - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                        else:  # late: count it and re-anchor instead of bursting to catch up
                            self.stats.misses += int(self.stats.latency[-1] <= self.dt)
                            next_tick = time.perf_counter()
        except KeyboardInterrupt:  # a second Ctrl-C, within a tick
            self._stop_on_error("interrupted")
        except BaseException as e:
            if self.stopped is None:  # not from step(), which stops safely itself: the command function
                self._stop_on_error(f"{e.__class__.__name__} in the command function: {e}")
            raise
        return self.stats.summary()
