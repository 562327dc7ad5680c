"""`legion calibrate`: the simulator's motor and joint parameters fitted to a robot's logs.

The logs are the control loop's (``legion deploy ... log=DIR``, :mod:`legion.sim2real.deploy.log`):
best an identification routine with the robot hung (``excite=chirp``, the base held: the legs'
motion is then the motors' and the joints' alone); with the robot standing or walking
(``hung=False``) the base's payload too, which the stance legs' torques carry; logs of both kinds
are fitted in two stages (the motors from the hung ones, then the body and the drivers' kp). The
model is the export's ``robot.mjb`` with the parameters of a reality
(:class:`~legion.sim2real.reality.RealityRobot`; each command acting from the instant it arrives,
over a normal spread of arrivals where the link's
jitter is fitted (``latency_jitter_ms``), so that the latency and its jitter are continuous values
and no candidate draws anything), hung as the robot was or free: each short window of the log
(``window_s``) starts from the logged joint positions and velocities (and a free base's logged pose
and velocity; the positions less the encoders' zero offset where ``encoder_bias`` is fitted) and
replays the logged targets; the loss is the mean squared joint-position error over
the windows, in units of the logged motion's variance, plus, where the log holds the motors' torques
(a Unitree robot's tau_est), their mean squared error in units of their variance: from positions
alone the gains, the damping and the armature can be scaled together with the same motion (the legs'
own inertia is small), and the torques fix that scale. CMA-ES (the ``cma`` package) searches the
parameters asked for, each within its prior range, scaled to [0, 1], and Levenberg-Marquardt steps
on the windows' residuals take its best to the floor of the valley it stopped in (:meth:`Fit.polish`).

Identifiability: a parameter is flagged as not pinned down by these logs where its loss profile is
flat (the loss rises by less than ``FLAT_RISE`` when it alone moves 20% of its range from the
estimate) or where the 95% interval of a bootstrap (``bootstrap`` resamples of the windows drawn
with replacement, each refit one Gauss-Newton step from the estimate: :func:`one_step_bootstrap`)
reaches further than +-20% of it (5% of its range where the estimate is near zero): CMA-ES's step
size is not an uncertainty. The interval is the logs' noise and nothing else: an effect the fitted
model lacks biases an estimate without widening it. Every fourth window is held out: the RMSE there,
nominal against calibrated, says whether the fit generalizes. With logs of both kinds, the motors
fitted hung must also predict the torques of the held-out windows on the ground better than the
nominal model; where they do not, they stand in for an effect the fitted model lacks (gear play not
fitted, a torque-speed curve) and are flagged (``inconsistent``). Writes ``calibration.json``,
``reality_calibrated.yaml`` (a reality file of the estimates: ``legion sim2sim reality=<it>`` runs
the calibrated model), ``task_calibrated.yaml`` (the run's task whose randomization is centred on
the estimates, :func:`training_overlay`) and ``calibration.png`` (held-out windows, logged against
the nominal and the calibrated model).

With ``actuator_network=True`` it also learns, per joint group, an actuator network (Hwangbo et
al. 2019; :mod:`legion.sim2real.deploy.actuator_network`) from the logged tau_est
(:func:`learn_actuator_networks`): ``actuator_network.npz`` (per group
``actuator_network_<group>.npz``), its held-out torque RMSE against the nominal and the fitted
analytic motor in the report, and the task file's robot drives the group's joints with it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from legion.sim2real.deploy.actuator_network import ActuatorNetwork

# name -> prior range; the joints' apply to every policy joint alike (or per joint group)
PARAMETERS = {"kp_scale": (0.5, 1.5), "kd_scale": (0.3, 3.0), "coulomb_friction": (0.0, 1.0),
              "viscous_friction": (0.0, 0.5), "armature": (0.0, 0.1), "latency_ms": (0.0, 30.0),
              "latency_jitter_ms": (0.0, 10.0), "added_mass_kg": (-3.0, 10.0), "com_x_m": (-0.08, 0.08),
              "com_y_m": (-0.08, 0.08), "foot_friction": (0.1, 1.5), "backlash": (0.0, 0.08),
              "encoder_bias": (-0.05, 0.05)}
NOMINAL = {"kp_scale": 1.0, "kd_scale": 1.0, "coulomb_friction": 0.0, "viscous_friction": 0.0, "armature": None,
           "latency_ms": 0.0, "latency_jitter_ms": 0.0, "added_mass_kg": 0.0, "com_x_m": 0.0, "com_y_m": 0.0,
           "foot_friction": None, "backlash": 0.0, "encoder_bias": 0.0}
# one value for the robot, not per joint group (foot friction: every contact with the ground)
WHOLE_ROBOT = ("latency_ms", "latency_jitter_ms", "added_mass_kg", "com_x_m", "com_y_m", "foot_friction",
               "encoder_bias")
# what only logs of the robot standing or walking tell (a hung robot's feet touch nothing)
ON_THE_GROUND = ("added_mass_kg", "com_x_m", "com_y_m", "foot_friction")
FLAT_RISE = 0.05  # relative loss rise below which a parameter is not pinned down
SEARCH_EVALUATIONS = 600  # the budget of Fit.search's second search, from the middle of the priors
HUNG_ANG_VEL = 0.5  # [rad/s] a logged base turning faster was not hung


@dataclass
class Window:
    joint_pos: np.ndarray  # (T + 1, J) logged, from the window's first state on
    joint_vel: np.ndarray  # (T + 1, J)
    targets: np.ndarray  # (T, J) written at each tick
    joint_torque: np.ndarray | None  # (T + 1, J) the motors' tau_est, where logged
    base: np.ndarray | None = None  # (13,) a free base's state at the start: position [m], quaternion
    # (x, y, z, w), linear and angular velocity (base frame) [m/s, rad/s]; None: the robot hung
    before: np.ndarray | None = None  # (J,) the target written at the tick before the window: the one
    # acting as it starts (its first is in flight for the latency); None at an episode's first tick


BASE_KEYS = ("base_pos", "base_quat", "base_lin_vel", "base_ang_vel")


def load_windows(folder: str | Path, joint_names: list[str], control_dt: float, window_s: float,
                 hung: bool = True) -> list[Window]:
    """The logged episodes of ``folder`` cut into windows of ``window_s``; ValueError naming what is
    wrong with a log: another robot's joints or order, non-finite rows, too short, a base that
    turns in a log said to be hung, a free one without its state. ``hung=False``: the robot stood
    or walked; each window keeps its base's state at its start."""
    files = sorted(Path(folder).glob("episode_*.npz"))
    if not files:
        raise ValueError(f"log={folder}: no episode_*.npz (the logs of `legion deploy ... log=DIR`)")
    length = max(2, round(window_s / control_dt))
    windows = []
    for file in files:
        episode = np.load(file)
        meta = json.loads(str(episode["meta"]))
        if meta["joint_names"] != list(joint_names):
            raise ValueError(f"{file}: its joints are {meta['joint_names']}, the run's {list(joint_names)}: a log of "
                             "another robot, or of another joint order")
        if abs(meta["control_dt"] - control_dt) > 1e-9:
            raise ValueError(f"{file}: logged at a control dt of {meta['control_dt']} s, the run's is {control_dt} s")
        ran = episode["mode"] == 0  # ticks where the loop wrote targets (policy or routine)
        missing = [k for k in BASE_KEYS if k not in episode.files]
        if not hung and missing:
            raise ValueError(f"{file}: a log of a free base (hung=false) needs the base's state, and {missing} "
                             "are not logged")
        if hung and "base_ang_vel" in episode.files:
            turning = float(np.nanmax(np.abs(episode["base_ang_vel"][ran]), initial=0.0))
            if turning > HUNG_ANG_VEL:
                raise ValueError(f"{file}: the base turned at up to {turning:.2f} rad/s: a log of the robot hung "
                                 "(its base held still; legion bridge hung=true in simulation) running an "
                                 "excitation (legion deploy ... excite=chirp), or say it stood or walked: hung=false")
        q, dq, targets = episode["joint_pos"][ran], episode["joint_vel"][ran], episode["targets"][ran]
        tau = episode["joint_torque"][ran] if "joint_torque" in episode.files else None
        base = None if hung else np.concatenate([episode[k][ran] for k in BASE_KEYS], axis=1)
        bad = ~(np.isfinite(q).all(1) & np.isfinite(dq).all(1) & np.isfinite(targets).all(1)
                & (np.isfinite(tau).all(1) if tau is not None else True)
                & (np.isfinite(base).all(1) if base is not None else True))
        if bad.any():
            raise ValueError(f"{file}: {int(bad.sum())} of its {len(q)} ticks hold NaN or infinite values "
                             f"(first at tick {int(np.flatnonzero(bad)[0])}); drop them from the log")
        for start in range(0, len(q) - length, length):
            span = slice(start, start + length + 1)
            windows.append(Window(q[span], dq[span], targets[start:start + length],
                                  tau[span] if tau is not None else None, None if base is None else base[start],
                                  targets[start - 1] if start else None))
    if len(windows) < 4:
        raise ValueError(f"log={folder}: {len(windows)} windows of {window_s:g} s; calibrating needs at least 4 "
                         f"({4 * window_s:g} s of logged control)")
    return windows


def simulated_log(exported: str | Path, reality, folder: str | Path, excitation=None, command=None,
                  seconds: float = 10.0, hung: bool = True) -> Path:
    """The log of the export's robot made of ``reality`` through the control loop in simulated
    time, hung (or on the floor): ``excitation`` run (what ``legion deploy ... excite=...
    log=folder`` writes against ``legion bridge ... reality=... hung=true``), or else the policy
    itself for ``seconds`` at ``command`` (vx, vy, wz: walking, ``hung=False``), without DDS or the
    wall clock. Returns ``folder``."""
    from legion.sim2real.deploy import ControlLoop, PolicyRunner
    from legion.sim2real.deploy.excite import ExcitationRunner
    from legion.sim2real.deploy.log import TrajectoryLog
    from legion.sim2real.reality import RealityRobot

    exported = Path(exported)
    runner = PolicyRunner(exported / "policy.onnx")
    ticks = round((seconds if excitation is None else excitation.duration_s) / runner.control_dt)
    if excitation is not None:
        runner = ExcitationRunner(runner, excitation)
    robot = RealityRobot(exported / "robot.mjb", runner.metadata, reality)
    if hung:
        robot.hang()
    with TrajectoryLog(folder, runner) as log:
        ControlLoop(robot, runner, now=robot.time, realtime=False, logger=log).run(
            ticks, None if command is None else np.asarray(command, np.float32))
    return Path(folder)


def fitted(params: list[str], groups: dict[str, str] | None = None) -> list[str]:
    """The names of the fitted values: each joint parameter once per joint group (``kp_scale@calf``),
    or once for every joint (``kp_scale``) without groups; latency and the base's payload once.
    ValueError for an unknown one."""
    unknown = [p for p in params if p not in PARAMETERS]
    if unknown or not params:
        raise ValueError(f"params={','.join(params)}: choose from {', '.join(PARAMETERS)}")
    return [name for p in params for name in ([p] if p in WHOLE_ROBOT or not groups else [f"{p}@{g}" for g in groups])]


def _base(name: str) -> str:
    return name.split("@")[0]


class Fit:
    """Simulates windows under candidate parameters (the module docstring). ``groups``: joint
    group name -> regular expression over the joint names (None: one group of every joint);
    ``fixed``: values held while ``names`` are searched (an earlier stage's estimates); ``workers``:
    processes that share each evaluation's windows (None: every window replayed here)."""

    def __init__(self, mjb: str | Path, metadata, windows: list[Window], names: list[str],
                 groups: dict[str, str] | None = None, fixed: dict | None = None, workers: Workers | None = None):
        import mujoco

        self.mjb, self.model = str(mjb), mujoco.MjModel.from_binary_path(str(mjb))
        self.metadata, self.windows, self.names, self.groups, self.workers = metadata, windows, names, groups, workers
        self.fixed = fixed or {}
        motion = np.concatenate([w.joint_pos for w in windows])
        self.scale = motion.var(0).mean()  # the loss's unit: the logged motion's variance
        torques = [w.joint_torque for w in windows if w.joint_torque is not None]
        self.torque_scale = np.concatenate(torques).var(0).mean() if len(torques) == len(windows) else None
        self.evaluations = 0

    def robot(self, values: dict, hung: bool):
        from legion.sim2real.reality import Base, Joints, Latency, Reality, RealityRobot

        joints = {pattern: Joints(**joint) for pattern, joint in joint_groups(values, self.groups).items()}
        latency = Latency(values.get("latency_ms") or 0.0, values.get("latency_jitter_ms") or 0.0)
        reality = Reality(name="candidate", latency_ms=latency, joints=joints,
                          base=Base(added_mass_kg=values.get("added_mass_kg") or 0.0,
                                    com_offset_m=[values.get("com_x_m") or 0.0, values.get("com_y_m") or 0.0, 0.0]))
        reality.foot_friction = values.get("foot_friction")  # (None: the model's)
        robot = RealityRobot(copy.copy(self.model), self.metadata, reality, at_arrival=True)
        if hung:
            robot.hang()  # as the logged robot was
        return robot

    def simulate(self, values: dict, windows: list[Window], prepare=None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per window, the simulated joint positions (as the encoders read them: plus ``encoder_bias``)
        and motor torques after each logged target: (T, J) each; on the model of ``values``, hung where
        the window's robot was (no base state), each robot passed to ``prepare`` first where given (e.g.
        to drive it by actuator networks)."""
        import mujoco

        if self.workers is not None and prepare is None and len(windows) > 1:
            return self.workers.simulate(self, values, windows)
        robots, out, bias = {}, [], values.get("encoder_bias") or 0.0
        for w in windows:
            hung = w.base is None
            if hung not in robots:
                robots[hung] = self.robot(values, hung)
                if prepare is not None:
                    prepare(robots[hung])
            robot = robots[hung]
            robot.reset(joint_pos=w.joint_pos[0] - bias)  # the joints where they were, not where read
            robot.data.qvel[robot.qvel_ids] = w.joint_vel[0]
            if w.base is not None:  # a free base where the log had it (MuJoCo: w x y z; linear velocity in the world)
                pos, (x, y, z, qw), lin, ang = w.base[:3], w.base[3:7], w.base[7:10], w.base[10:13]
                d = robot.data
                d.qpos[0:3], d.qpos[3:7] = pos, (qw, x, y, z)
                turn = np.empty(9)
                mujoco.mju_quat2Mat(turn, d.qpos[3:7])
                d.qvel[0:3], d.qvel[3:6] = turn.reshape(3, 3) @ lin, ang
                mujoco.mj_forward(robot.model, d)
            if hasattr(robot, "acting"):  # a reality's latency: the target sent before the window began
                before = w.targets[0] if w.before is None else w.before
                robot.acting = (before.astype(np.float64), *robot.acting[1:])
            positions, torques = [], []
            for targets in w.targets:
                robot.write_targets(targets)
                positions.append(robot.data.qpos[robot.qpos_ids] + bias)
                torques.append(getattr(robot, "tau", robot.data.qfrc_applied[robot.qvel_ids]).copy())
            out.append((np.array(positions), np.array(torques)))
        return out

    def errors(self, values: dict, windows: list[Window] | None = None) -> np.ndarray:
        """Per window, the mean squared error of the simulated joint positions [rad^2] and motor
        torques [(N m)^2] from the logged ones: (windows, 2), the torques' NaN where not logged."""
        windows = windows if windows is not None else self.windows
        self.evaluations += 1
        out = [(np.mean((positions - w.joint_pos[1:]) ** 2),
                np.mean((torques - w.joint_torque[1:]) ** 2) if w.joint_torque is not None else np.nan)
               for w, (positions, torques) in zip(windows, self.simulate(values, windows))]
        return np.array(out).reshape(len(windows), 2)

    def loss(self, values: dict, windows: list[Window] | None = None) -> float:
        errors = self.errors(values, windows)
        torques = errors[:, 1].mean() / self.torque_scale if self.torque_scale else 0.0
        return float(errors[:, 0].mean() / self.scale + torques)

    def rise(self, x: np.ndarray, i: int, loss: float) -> float:
        """The loss's relative rise from ``loss`` at ``x`` ([0, 1] coordinates) where the i-th value
        alone moves 20% of its prior, the smaller of the two ways; a way a prior's bound cuts to
        under half of that does not count (from a hair above zero, the move down is no move)."""
        rises = []
        for delta in (-0.2, 0.2):
            moved = x.copy()
            moved[i] = np.clip(moved[i] + delta, 0, 1)
            if abs(moved[i] - x[i]) >= 0.1:
                rises.append(self.loss(self.values(moved)) / loss - 1 if loss > 0 else np.inf)
        return float(min(rises))

    def residuals(self, values: dict) -> np.ndarray:
        """Per window, its errors in joint position and (where logged) motor torque, scaled so that
        their squares sum to the window's term of :meth:`loss` (the mean of those terms): (windows, K)."""
        self.evaluations += 1
        out = []
        for w, (positions, torques) in zip(self.windows, self.simulate(values, self.windows)):
            parts = [(positions - w.joint_pos[1:]).ravel() / np.sqrt(positions.size * self.scale)]
            if self.torque_scale:
                parts.append((torques - w.joint_torque[1:]).ravel() / np.sqrt(torques.size * self.torque_scale))  # pyright: ignore[reportOptionalSubscript]
            out.append(np.concatenate(parts))
        return np.array(out)

    def jacobian(self, values: dict) -> tuple[np.ndarray, np.ndarray]:
        """The residuals at ``values`` ((windows, K), :meth:`residuals`) and their derivatives in the
        [0, 1] coordinates of ``names`` ((windows, K, names)), by central differences (one-sided at a
        prior's bound) 1% of each prior wide."""
        x = self.coordinates(values)
        columns = []
        for i in range(len(self.names)):
            below, above = x.copy(), x.copy()
            below[i], above[i] = max(x[i] - 0.01, 0.0), min(x[i] + 0.01, 1.0)
            columns.append((self.residuals(self.values(above)) - self.residuals(self.values(below)))
                           / (above[i] - below[i]))
        return self.residuals(self.values(x)), np.stack(columns, -1)

    def nominal(self, name: str) -> float | None:
        """The model's own value of a fitted parameter: :data:`NOMINAL`'s, or for the armature
        the model's, averaged over the group's joints (None: foot friction, the model's contacts)."""
        if _base(name) != "armature":
            return NOMINAL[_base(name)]
        import mujoco

        pattern = (self.groups or {}).get(name.partition("@")[2], ".*")
        dofs = [self.model.jnt_dofadr[mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, joint)]
                for joint in self.metadata.joint_names if re.fullmatch(pattern, joint)]
        return float(np.mean(self.model.dof_armature[dofs]))

    def values(self, x: np.ndarray) -> dict:
        """Parameters from CMA-ES's [0, 1] coordinates (and the fixed ones)."""
        ranges = [PARAMETERS[_base(name)] for name in self.names]
        return {**self.fixed, **{name: low + float(np.clip(u, 0, 1)) * (high - low)
                                 for name, u, (low, high) in zip(self.names, x, ranges)}}

    def coordinates(self, values: dict) -> np.ndarray:
        """CMA-ES's [0, 1] coordinates of ``values`` (the middle of the prior where one is None)."""
        ranges = [PARAMETERS[_base(name)] for name in self.names]
        return np.array([0.5 if values[name] is None else (values[name] - low) / (high - low)
                         for name, (low, high) in zip(self.names, ranges)])

    def torque_gains(self) -> dict:
        """The drivers' kp and kd scales per joint group fitted to the logged torques by least
        squares, ``tau_est = kp (q* - q) - kd dq`` at each logged tick (the tick's target acting by
        then, the joints' state of the physics step before it; whatever the legs carry): where the
        motion lets latency trade against the gains, the torques do not. Where gear play is fitted
        too, its dead zone is in the law: ``kp (e - sign(e) b / 2)`` is linear in kp and kp b, fitted
        where ``|e|`` is past the play (a second pass, once the first has sized it); else a lower kp
        would stand in for the play. Where the encoders' zero offset is fitted too, it is the law's
        constant term over kp (the mean over the groups). Only the values among ``names``; {} where the
        logs hold no torques."""
        if self.torque_scale is None:
            return {}
        from legion.sim2real.deploy.mujoco_robot import motor_gains

        kp, kd = motor_gains(self.metadata)[:2]
        step, names, out = self.metadata.physics_dt, self.metadata.joint_names, {}
        play = "backlash" in {_base(name) for name in self.names}
        offset, biases = "encoder_bias" in self.names, []  # (the joints read off by b: the law's error is e + b)
        for label, pattern in (self.groups or {"": ".*"}).items():
            joints = [k for k, joint in enumerate(names) if re.fullmatch(pattern, joint)]
            # every tick of every window, the group's joints side by side: (ticks, joints)
            error = np.concatenate([w.targets[:, joints] - w.joint_pos[1:, joints] + step * w.joint_vel[1:, joints]
                                    for w in self.windows])
            dq = np.concatenate([w.joint_vel[1:, joints] for w in self.windows])
            torque = np.concatenate([w.joint_torque[1:, joints] for w in self.windows])  # pyright: ignore[reportOptionalSubscript]
            columns = [kp[joints] * error, -kd[joints] * dq] + ([-0.5 * kp[joints] * np.sign(error)] if play else [])
            columns += [np.broadcast_to(kp[joints], error.shape)] if offset else []
            rows, used = np.stack([c.ravel() for c in columns], 1), np.ones(error.size, bool)
            suffix = f"@{label}" if self.groups else ""
            for _ in range(2 if play else 1):  # with play, the second fit where the error is past it
                scales = np.linalg.lstsq(rows[used], torque.ravel()[used], rcond=None)[0]
                backlash = max(scales[2] / scales[0], 0.0) if play and scales[0] > 0 else 0.0
                out |= {f"kp_scale{suffix}": scales[0], f"kd_scale{suffix}": scales[1], f"backlash{suffix}": backlash}
                used = np.abs(error.ravel()) > 0.5 * backlash
            biases += [scales[-1] / scales[0]] if offset and scales[0] > 0 else []
        out |= {"encoder_bias": float(np.mean(biases))} if biases else {}
        return {name: float(np.clip(value, *PARAMETERS[_base(name)])) for name, value in out.items()
                if name in self.names}

    def search(self, budget: int, seed: int, say=None) -> tuple[dict, float]:
        """The best values CMA-ES finds within ``budget`` evaluations, and their loss: one search
        from the nominal model (its own armature; its gains those of the logged torques,
        :meth:`torque_gains`, searched about with a step of 0.1 of each prior) with all the budget
        but :data:`SEARCH_EVALUATIONS` (half of it where that leaves less), and one with those from
        the middle of every prior (0.3, seed ``seed + 1``: for logs without torques, or torques that
        mislead); the lower loss kept, the nominal model's included. A search takes about a thousand
        evaluations to settle: on a worn Go2's hung logs, from the torques' gains, searches stopped at
        600 had its calves at 1.17x kp and 2.75x kd for 0.85x and 1.2x (3.9x the loss), or 0.91x and
        1.65x (1.4x), where by 1,200 each of the four seeds was within 0.3% of one loss and 0.2% of
        one kp, 3% from the truth's (four searches of 600 were the default before). The best is then
        polished (:meth:`polish`)."""
        nominal = {n: self.nominal(n) for n in self.names}
        torques, middle = (self.coordinates(nominal | self.torque_gains()), 0.1), (np.full(len(self.names), 0.5), 0.3)
        aside = min(SEARCH_EVALUATIONS, budget // 2)
        found = [_search(self, *torques, budget - aside, seed, say), _search(self, *middle, aside, seed + 1, say)]
        model = self.coordinates(nominal)  # (a robot the model describes keeps the model)
        x, loss = self.polish(*min([*found, (model, self.loss(self.values(model)))], key=lambda result: result[1]))
        return self.values(x), loss

    def polish(self, x: np.ndarray, loss: float, iterations: int = 3) -> tuple[np.ndarray, float]:
        """Levenberg-Marquardt steps from ``x`` ([0, 1] coordinates, at ``loss``) on the windows'
        residuals (:meth:`jacobian`), each step the best of four dampings, kept while the loss falls
        by more than 0.1%: where CMA-ES stops in a long valley short of its floor. (On a worn Go2's
        logs the search had the calves' Coulomb and viscous friction at 0.377 and 0.102 for 0.40 and
        0.08, traded one for the other; one step took them to 0.400 and 0.082, the loss 13% lower.)"""
        for _ in range(iterations):
            r, jac = self.jacobian(self.values(x))
            jac = jac.reshape(-1, len(x))
            hessian, gradient = jac.T @ jac, jac.T @ r.ravel()
            tried = []
            for damping in (1e-4, 1e-3, 1e-2, 1e-1):
                damped = hessian + damping * np.diag(np.diag(hessian)) + 1e-12 * np.eye(len(x))
                moved = np.clip(x - np.linalg.solve(damped, gradient), 0, 1)
                tried.append((moved, self.loss(self.values(moved))))
            moved, moved_loss = min(tried, key=lambda result: result[1])
            if moved_loss >= loss:
                break
            x, loss, fell = moved, moved_loss, 1 - moved_loss / loss
            if fell < 1e-3:
                break
        return x, loss


class Workers:
    """``count`` processes among which a :class:`Fit` shares each evaluation's windows (one
    evaluation replays tens of independent windows: a fit runs about ``count`` times as fast).
    Forked where the system can (a spawned process re-runs the caller's script, which a script
    without a ``__main__`` guard does not survive); they run MuJoCo and NumPy only. A context
    manager that ends them."""

    def __init__(self, count: int):
        import multiprocessing

        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self.count, self.pool = count, multiprocessing.get_context(method).Pool(count)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.terminate()

    def simulate(self, fit: Fit, values: dict, windows: list[Window]) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`Fit.simulate` with the windows split into one contiguous share per process."""
        bounds = np.linspace(0, len(windows), min(self.count, len(windows)) + 1).astype(int)
        shares = [(fit.mjb, fit.metadata, fit.groups, values, windows[a:b]) for a, b in zip(bounds, bounds[1:])]
        return [window for share in self.pool.map(_replayed, shares) for window in share]


def usable_cores() -> int:
    """The cores this process may run on (taskset, a container's cpuset), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_worker_fits: dict[tuple[str, str], Fit] = {}  # a worker's models, loaded once


def _replayed(share: tuple) -> list[tuple[np.ndarray, np.ndarray]]:
    mjb, metadata, groups, values, windows = share
    key = (mjb, repr(groups))
    if key not in _worker_fits:
        _worker_fits[key] = Fit(mjb, metadata, windows, [], groups)
    return _worker_fits[key].simulate(values, windows)


def joint_groups(values: dict, groups: dict[str, str] | None) -> dict[str, dict]:
    """The joint parameters of ``values`` per joint pattern (a reality file's ``joints``)."""
    patterns = groups or {"": ".*"}
    return {pattern: {_base(k): v for k, v in values.items() if k not in WHOLE_ROBOT and v is not None
                      and (k.partition("@")[2] == label)}
            for label, pattern in patterns.items()}


def _search(fit: Fit, start: np.ndarray, sigma: float, budget: int, seed: int, say=None) -> tuple[np.ndarray, float]:
    """CMA-ES from ``start`` ([0, 1] coordinates) within ``budget`` evaluations: the best point and its
    loss; ``start`` itself where nothing the search tried beats it (CMA-ES samples around its mean
    and never scores the mean: a robot the model already describes keeps the model). One parameter alone is
    searched with a second coordinate the loss ignores (pycma's bounded search does not run in one
    dimension)."""
    import cma

    dims = len(start)
    start_loss = fit.loss(fit.values(start))
    es = cma.CMAEvolutionStrategy(np.append(start, 0.5) if dims == 1 else start, sigma,
                                  {"bounds": [0, 1], "seed": seed + 1, "verbose": -9, "maxfevals": budget})
    first, t0 = fit.evaluations, time.perf_counter()
    while not es.stop():
        candidates = es.ask()
        es.tell(candidates, [fit.loss(fit.values(np.asarray(x)[:dims])) for x in candidates])
        if say is not None:
            done = fit.evaluations - first
            rate = done / (time.perf_counter() - t0)
            say(f"[calibrate] {done}/{budget} evaluations | loss {es.result.fbest:.4g} | {rate:.1f} evaluations/s | "
                f"ETA {max(0, budget - done) / rate:.0f} s")
    if start_loss <= es.result.fbest:
        return np.asarray(start, np.float64), start_loss
    return np.asarray(es.result.xbest)[:dims], float(es.result.fbest)


def one_step_bootstrap(stages: list[tuple[Fit, int]], best: dict, resamples: int, seed: int) -> list[dict]:
    """The estimates refit on ``resamples`` resamples of the windows (drawn with replacement), each refit
    one Gauss-Newton step from ``best`` on its resample's loss (the one-step bootstrap), from one
    :meth:`Fit.jacobian` per stage: two evaluations per value and one per stage, however many
    resamples. ``stages``: the fit's stages in order, each a Fit over its windows whose ``names``
    are the values it held then its own, and how many are its own; a stage's step moves with each
    resample's values of the earlier stages (it was fitted with them held), and a value a later
    stage fits again takes that stage's step. (Refits by CMA-ES from the estimate, 60
    evaluations each, were the bootstrap before: on a resample of a worn Go2's hung windows such a
    refit ended at a loss of 0.0073 where the estimate itself had 0.0049, and 600 evaluations were
    needed to beat it: their spread was the search's, not the logs'.)"""
    rng, steps = np.random.default_rng(seed), {}  # name -> (B,) each resample's step
    for fit, count in stages:
        r, jac = fit.jacobian(best)  # (W, K), (W, K, D)
        weights = rng.multinomial(len(r), np.full(len(r), 1 / len(r)), size=resamples) / len(r)  # (B, W)
        gradient = weights @ (2 * np.einsum("wk,wkd->wd", r, jac))  # each resample's loss: weighted windows
        hessian = np.einsum("bw,wde->bde", weights, 2 * np.einsum("wkd,wke->wde", jac, jac))  # Gauss-Newton's
        known = len(fit.names) - count
        held = np.stack([steps[name] for name in fit.names[:known]], 1) if known else np.zeros((resamples, 0))
        own = hessian[:, known:, known:] + 1e-9 * np.eye(count) * np.trace(
            hessian, axis1=1, axis2=2)[:, None, None]  # (a value the loss ignores steps nowhere)
        rhs = gradient[:, known:] + np.einsum("bij,bj->bi", hessian[:, known:, :known], held)
        steps |= dict(zip(fit.names[known:], -np.linalg.solve(own, rhs[..., None])[..., 0].T))
    last = stages[-1][0]
    moved = np.stack([steps[name] for name in last.names], 1)
    return [last.values(np.clip(last.coordinates(best) + step, 0, 1)) for step in moved]


def calibrate(log: str | Path | list, exported: str | Path, params: list[str], window_s: float = 0.5,
              max_evaluations: int = 2400, bootstrap: int = 200, seed: int = 0,
              out_dir: str | Path | None = None, groups: dict[str, str] | None = None, say=print,
              task: dict | None = None, hung: bool | list[bool] = True, actuator_network: bool = False,
              workers: int | None = None, overwrite: bool = True) -> dict:
    """``legion calibrate`` as a function (module docstring). Returns the report it writes.
    ``task``: the run's ``task`` config (plain dicts) for the training overlay (:func:`training_overlay`).
    ``log``: a folder of logs, or several fitted together; ``hung``: whether the robot was hung in
    them, one value for every folder or one per folder (False: standing or walking,
    :func:`load_windows`): an excitation hung pins the motors, walking the payload and the floor.
    ``actuator_network=True``: also an actuator network per joint group, learned from the logged
    tau_est (:func:`learn_actuator_networks`), written as ``actuator_network.npz`` (per group:
    ``actuator_network_<group>.npz``) and compared on the held-out windows with the nominal and the
    fitted analytic motor; ValueError where the logs hold no joint_torque.
    ``workers``: processes that share the replays (:class:`Workers`; default: every core this process may
    use). ``overwrite=False``: ValueError, before the fit, where the output folder holds a calibration."""
    from legion.sim2real.deploy.contract import PolicyContract

    exported = Path(exported)
    meta = PolicyContract.load(exported / "policy.json")
    names = fitted(params, groups)  # (an unknown parameter is refused before anything runs)
    logs = [Path(folder) for folder in (log if isinstance(log, list | tuple) else [log])]
    hung = list(hung) if isinstance(hung, list | tuple) else [hung] * len(logs)
    if len(hung) != len(logs):
        raise ValueError(f"hung={','.join(str(h).lower() for h in hung)}: one value for every log folder, or one for "
                         f"each of the {len(logs)} ({', '.join(map(str, logs))})")
    on_the_ground = [p for p in ON_THE_GROUND if p in params]
    if all(hung) and on_the_ground:
        raise ValueError(f"params={','.join(on_the_ground)}: a hung robot's legs carry no weight and its feet touch "
                         "nothing; fit them from logs of it standing or walking (hung=false)")
    windows = [w for folder, held in zip(logs, hung)
               for w in load_windows(folder, meta.joint_names, meta.control_dt, window_s, held)]
    if actuator_network and any(w.joint_torque is None for w in windows):
        raise ValueError(f"actuator_network=true: the logs in {', '.join(map(str, logs))} hold no joint_torque, the "
                         "motors' tau_est (a Unitree robot reports it; `legion bridge` publishes it), and an actuator "
                         "network learns the torque from it")
    if actuator_network:
        network_split(windows)  # (too few windows: refused before the fit)
    out = Path(out_dir) if out_dir else logs[0]
    if not overwrite and (out / "calibration.json").exists():
        # (a run fine-tuned on its task_calibrated.yaml reads its actuator networks from there)
        raise ValueError(f"{out} already holds a calibration (calibration.json, task_calibrated.yaml, ...): give "
                         "out=<another folder>, or overwrite=true to replace it")
    held_out = windows[3::4]
    fitting = [w for i, w in enumerate(windows) if i % 4 != 3]
    workers = workers or usable_cores()
    fit = Fit(exported / "robot.mjb", meta, fitting, names, groups)
    nominal = {n: fit.nominal(n) for n in names}
    # Logs of both kinds: the motors from the hung windows first (there the legs' motion is the
    # motors' alone), with the whole budget, as a hung log alone gets, then the body from the
    # standing or walking ones with the rest of the motors held, with a quarter more. All at once,
    # the search over a dozen values missed both (a payload reality's calf damping 22% off, its
    # payload 19%). The drivers' stiffness is searched again with the body: the stance legs' sag
    # under it is their stiffness, and a hung leg's can be a jittery link's (the jitter's drift,
    # which a lower gain shrinks, had gear play's calves 3-10% low at three seeds, within 0.3% from
    # the walk), while their damping is left to the hung logs (fitted again walking, worn motors' hip
    # and thigh kd came out 14% high against 1% hung).
    motors = [n for n in names if _base(n) not in ON_THE_GROUND]
    body = [n for n in names if _base(n) in ON_THE_GROUND]
    stages = [(names, fitting, max_evaluations)]
    if motors and body and any(hung) and not all(hung):
        stages = [(motors, [w for w in fitting if w.base is None], max_evaluations),
                  (body + [n for n in motors if _base(n) == "kp_scale"], [w for w in fitting if w.base is not None],
                   max_evaluations // 4)]
    say(f"[calibrate] {len(fitting)} windows of {window_s:g} s to fit, {len(held_out)} held out; "
        f"parameters {', '.join(names)}; CMA-ES, at most {max_evaluations} evaluations"
        + (f" for the motors from the hung logs, then {max_evaluations // 4} for the body (and the drivers' kp) "
           "from the others"
           if len(stages) > 1 else "")
        + (f", then a one-step bootstrap of {bootstrap} resamples" if bootstrap else ""))
    with Workers(workers) if workers > 1 else contextlib.nullcontext() as pool:
        fit.workers = pool
        t0 = time.perf_counter()
        best, evaluations, searched, stage_fits, hung_motors = {}, 0, [], [], {}
        for stage, stage_windows, budget in stages:
            stage_fit = Fit(exported / "robot.mjb", meta, stage_windows, stage, groups, fixed=best, workers=pool)
            best, _ = stage_fit.search(budget, seed, say)
            hung_motors = hung_motors or best  # (the first stage's: the motors as the hung logs have them)
            evaluations += stage_fit.evaluations
            searched = [n for n in searched if n not in stage] + stage  # what it held, then its own
            stage_fits.append((Fit(exported / "robot.mjb", meta, stage_windows, list(searched), groups, fixed=best,
                                   workers=pool), len(stage)))
        x, best_loss = fit.coordinates(best), fit.loss(best)
        resampled = one_step_bootstrap(stage_fits, best, bootstrap, seed) if bootstrap else []
        replays = sum(f.evaluations for f, _ in stage_fits)
        evaluations += replays
        if bootstrap:
            say(f"[calibrate] one-step bootstrap: {bootstrap} resamples of the windows, from {replays} evaluations")
        profile = {}
        for i, name in enumerate(names):
            rise = fit.rise(x, i, best_loss)
            low, high = PARAMETERS[_base(name)]
            # the bootstrap's 95% interval (a point without one) must lie within +-20% of the estimate
            # (of 5% of the prior near zero)
            interval = np.percentile([r[name] for r in resampled] or [best[name]], [2.5, 97.5])
            reach = max(interval[1] - best[name], best[name] - interval[0])
            allowed = 0.2 * max(abs(best[name]), 0.05 * (high - low))
            profile[name] = {"rise": rise, "bootstrap": [float(interval[0]), float(interval[1])],
                             "pinned": bool(rise >= FLAT_RISE and reach <= allowed)}
        rmse = {label: float(np.sqrt(np.mean(fit.errors(values, held_out)[:, 0])))
                for label, values in (("nominal", nominal), ("calibrated", best))}
        # The motors fitted hung, checked where the legs carry the robot: a motor the fitted model
        # describes predicts the torques there better than the nominal model (a worn Go2's or a
        # payload's 0.16-0.17x on walking windows); values that predict them worse (gear play's
        # softer calves, 1.2x) compensate for what the model lacks and are not the robot's. (Milder
        # compensation passes: the same gear play fitted from another split of windows, 0.76x.)
        ground = [w for w in held_out if w.base is not None]
        motor_torques = None
        if len(stages) > 1 and fit.torque_scale is not None and ground:
            hung_fit = {**best, **{name: hung_motors[name] for name in motors}}
            motor_torques = {label: float(np.sqrt(np.mean(fit.errors(values, ground)[:, 1])))
                             for label, values in (("nominal", nominal), ("fitted_hung", hung_fit))}
            if motor_torques["fitted_hung"] >= motor_torques["nominal"]:
                for name in motors:
                    profile[name].update(pinned=False, inconsistent=True)
    fit.workers = None  # (ended)
    report = {"log": ", ".join(map(str, logs)), "export": str(exported), "windows": len(fitting),
              "held_out": len(held_out),
              "evaluations": evaluations + fit.evaluations, "bootstrap": bootstrap, "seconds": time.perf_counter() - t0,
              "loss": best_loss,
              "estimates": best, "profile": profile, "held_out_rmse_rad": rmse}
    if motor_torques is not None:
        report["held_out_torque_rmse_on_the_ground_nm"] = motor_torques
    out.mkdir(parents=True, exist_ok=True)
    if actuator_network:
        say(f"[calibrate] an actuator network per joint group ({', '.join(groups or {'all': '.*'})}), from "
            "the logged tau_est")
        learned = learn_actuator_networks(windows, meta, groups, best, seed, info={
            "log": ", ".join(str(folder.resolve()) for folder in logs), "export": str(exported.resolve()),
            "groups": groups or {"all": ".*"}})
        report["actuator_network"] = {}
        rmse["actuator_network"] = network_rmse(fit, learned, held_out, best)
        for label, actuator in learned.items():
            path = (out / ("actuator_network.npz" if groups is None else f"actuator_network_{label}.npz")).resolve()
            actuator.network.save(path)
            columns = [meta.joint_names.index(joint) for joint in actuator.joints]
            seen = np.concatenate([np.abs(w.joint_torque[:, columns]).ravel() for w in windows
                                   if w.joint_torque is not None])
            report["actuator_network"][label] = {"file": str(path), "pattern": (groups or {"all": ".*"})[label],
                                                 "joints": actuator.joints,
                                                 "training": actuator.network.info["training"],
                                                 "held_out_torque_rmse_nm": actuator.rmse,
                                                 # what it has seen: a network extrapolates flat past it
                                                 "torque_p99_nm": float(np.percentile(seen, 99)),
                                                 "on_the_ground": any(w.base is not None for w in windows)}
    (out / "calibration.json").write_text(json.dumps(report, indent=2))
    lines = ["# Calibrated by `legion calibrate` from " + ", ".join(map(str, logs)), "name: calibrated",
             f"latency_ms: {{mean: {best.get('latency_ms', 0.0):.3f}, "
             f"jitter: {best.get('latency_jitter_ms', 0.0):.3f}}}"]
    if any(name in best for name in ("added_mass_kg", "com_x_m", "com_y_m")):
        lines.append(f"base: {{added_mass_kg: {best.get('added_mass_kg', 0.0):.5g}, com_offset_m: "
                     f"[{best.get('com_x_m', 0.0):.5g}, {best.get('com_y_m', 0.0):.5g}, 0.0]}}")
    if "foot_friction" in best:
        lines.append(f"foot_friction: {best['foot_friction']:.5g}")
    if "encoder_bias" in best:
        lines.append(f"encoders: {{position_bias: {best['encoder_bias']:.5g}}}")
    joints = {pattern: joint for pattern, joint in joint_groups(best, groups).items() if joint}
    if joints:
        lines.append("joints:")
        lines += [f"  '{pattern}': {{" + ", ".join(f"{k}: {v:.5g}" for k, v in joint.items()) + "}"
                  for pattern, joint in joints.items()]
    (out / "reality_calibrated.yaml").write_text("\n".join(lines) + "\n")
    (out / "task_calibrated.yaml").write_text(training_overlay(report, meta, groups, task))
    plot(fit, held_out, nominal, best, meta.joint_names, out / "calibration.png")
    say(table(report))
    networks = [entry["file"] for entry in report.get("actuator_network", {}).values()]
    say(f"[calibrate] wrote {out / 'calibration.json'}, {out / 'reality_calibrated.yaml'}, "
        f"{out / 'task_calibrated.yaml'} (train on the calibrated simulator), {out / 'calibration.png'}"
        + "".join(f", {file}" for file in networks))
    return report


# What training randomizes for each fitted parameter (legion.tasks.mdp.events), and how an estimate
# becomes that event's draw: the gains as scales of the model's, friction and armature as they are.
TRAINING_EVENTS = {"kp_scale": "stiffness_scale", "kd_scale": "damping_scale", "coulomb_friction": "joint_friction",
                   "armature": "joint_armature", "backlash": "joint_backlash"}


def estimate_range(report: dict, name: str) -> tuple[float, float]:
    """The range training draws ``name`` from: centred on its estimate and as wide as its bootstrap
    spread (a point where there was no bootstrap); the whole prior where its loss profile is flat
    (the logs say nothing of it). A value flagged only because its spread reaches too far to be
    reported is still bounded by that spread: gear play's calves' viscous friction, 0.017
    N m s/rad with an interval of 0.001-0.035, would otherwise draw up to the prior's 0.5, training on
    twice the Go2's damping (and its centre of mass, 2 mm with an interval of 0.3-3.5 mm, over
    +-8 cm)."""
    low, high = PARAMETERS[_base(name)]
    profile, value = report["profile"][name], report["estimates"][name]
    if profile["rise"] < FLAT_RISE:
        return low, high
    half = max(value - profile["bootstrap"][0], profile["bootstrap"][1] - value, 0.0)
    return max(value - half, low), value + half


def training_overlay(report: dict, meta, groups: dict[str, str] | None, task: dict | None = None) -> str:
    """A task file (``legion train task=<it> robot=...``) that is the run's task on the simulator the
    logs describe: per fitted joint group, training's events draw each parameter from
    :func:`estimate_range`; the task's own events of the same kind are turned off (``task``: the
    run's ``task`` config as plain dicts; without it, they stay as the task file sets them).

    Viscous friction b adds to the PD damping kd (both oppose the joint's speed): it joins the
    damping scale as kd_scale + b / kd where a group's joints share one kd. Latency: the event
    ``command_latency`` (physics steps) over its range widened by twice the fitted jitter's std
    (training draws a latency per episode, the robot's link per command) within the latency's
    prior, in place of the task's ``action_delay``.
    A payload: the event ``added_mass`` on the base, and ``com_offset`` per axis, in place of the
    task's own. Foot friction: the event ``friction`` on every body of the robot (its value is the
    one in effect against the ground), in place of the task's own. Actuator networks drive their
    groups' joints with the export's gains and effort limits."""
    task = task or {}
    header = ["# @package _global_",
              f"# Calibrated by `legion calibrate` from {report['log']}: the task {meta.task} on the simulator",
              "# these logs describe. Train or fine-tune on it with the robot you trained with, e.g.",
              "#   legion train task=<this file> robot=<the run's robot> agent.init_from=<the run>/model_N.pt"]
    inconsistent = [n for n, p in report["profile"].items() if p.get("inconsistent")]
    if inconsistent:  # values that compensate for what the model lacks are no simulator to train on
        header.append(f"# {', '.join(inconsistent)}: fitted hung, inconsistent with the logs on the ground; "
                      "the task's own randomization of them is kept")
    estimates = {n: v for n, v in report["estimates"].items() if n not in inconsistent}
    if "encoder_bias" in estimates:  # a reading's offset: corrected on the robot, not randomized in training
        header.append(f"# encoder_bias: the robot's encoders read {estimates['encoder_bias']:+.4g} rad off the joints; "
                      "training does not simulate it")
    lines = ["defaults:", f"  - {meta.task}", "  - _self_", "task:", "  events:"]
    funcs = set()
    for label, pattern in (groups or {"all": ".*"}).items():
        fitted_here = {_base(n): n for n in estimates
                       if n not in WHOLE_ROBOT and (n.partition("@")[2] or "all") == label}
        ranges = {p: estimate_range(report, n) for p, n in fitted_here.items()}
        if "viscous_friction" in ranges:
            kd = {d for name, d in zip(meta.joint_names, meta.joint_damping) if re.fullmatch(pattern, name)}
            b_low, b_high = ranges.pop("viscous_friction")
            if len(kd) == 1 and next(iter(kd)) > 0:
                kd_low, kd_high = ranges.get("kd_scale", (1.0, 1.0))
                ranges["kd_scale"] = (kd_low + b_low / next(iter(kd)), kd_high + b_high / next(iter(kd)))
            else:
                header.append(f"# viscous_friction of {pattern} not applied: its joints have no one PD damping")
        for param, (low, high) in ranges.items():
            funcs.add(TRAINING_EVENTS[param])
            lines.append(f"    calibrated_{param}_{label}: {{func: {TRAINING_EVENTS[param]}, mode: startup, "
                         f"range: [{low:.5g}, {high:.5g}], params: {{joints: '{pattern}'}}}}")
    if "latency_ms" in estimates:  # in physics steps, drawn per episode (the robot's link jitters)
        funcs.update(("command_latency", "action_delay"))  # (the task's delay in whole control steps: replaced)
        low, high = estimate_range(report, "latency_ms")
        jitter = 2 * estimates.get("latency_jitter_ms", 0.0)  # the jitter's spread, drawn per episode in training
        low, high = max(low - jitter, 0.0), min(high + jitter, PARAMETERS["latency_ms"][1])
        lines.append(f"    calibrated_latency: {{func: command_latency, mode: reset, range: [{low:.4g}, {high:.4g}]}}"
                     f"   # ms, in physics steps of {meta.physics_dt * 1000:g} ms")
    if "added_mass_kg" in estimates:  # the base's mass, in kg added to the model's
        funcs.add("added_mass")
        low, high = estimate_range(report, "added_mass_kg")
        lines.append(f"    calibrated_added_mass: {{func: added_mass, mode: startup, range: [{low:.4g}, {high:.4g}], "
                     "params: {bodies: '${task.scene.robot.bodies.base}'}}   # kg")
    for axis in "xy":  # the base's centre of mass, each axis over its own range
        if f"com_{axis}_m" in estimates:
            funcs.add("com_offset")
            low, high = estimate_range(report, f"com_{axis}_m")
            lines.append(f"    calibrated_com_{axis}: {{func: com_offset, mode: startup, range: [{low:.4g}, "
                         f"{high:.4g}], params: {{bodies: '${{task.scene.robot.bodies.base}}', axes: {axis}}}}}   # m")
    if "foot_friction" in estimates:  # the robot's shapes' friction, the one in effect against the ground
        funcs.add("friction")
        low, high = estimate_range(report, "foot_friction")
        lines.append(f"    calibrated_friction: {{func: friction, mode: startup, range: [{low:.4g}, {high:.4g}], "
                     "params: {bodies: '.*'}}")
    for name, event in task.get("events", {}).items():
        if (event.get("func") or name) in funcs and event.get("enabled", True):
            lines.append(f"    {name}: {{enabled: false}}   # the calibrated draw above replaces it")
    networks = report.get("actuator_network", {})
    if networks:  # the learned actuator networks drive their groups' joints (configs/schema.py, Actuator)
        lines += ["  scene:", "    robot:", "      actuators:"]
        for label, entry in networks.items():
            # An entry is a joint's whole drive: it keeps the export's gains (the torque penalty's
            # estimate, the gain events) and effort limit (the network's torque is clipped to it),
            # one entry per set of joints that share them.
            drives: dict[tuple, list[str]] = {}
            for joint in entry["joints"]:
                k = meta.joint_names.index(joint)
                drive = (meta.joint_stiffness[k], meta.joint_damping[k], meta.effort_limits[k])
                drives.setdefault(drive, []).append(joint)
            for i, ((kp, kd, effort), joints) in enumerate(drives.items()):
                pattern = entry["pattern"] if len(drives) == 1 else "|".join(map(re.escape, joints))
                lines.append(f"        {label if len(drives) == 1 else f'{label}_{i}'}: {{joints: {_quoted(pattern)}, "
                             f"model: network, network: {_quoted(entry['file'])}, stiffness: {kp:g}, damping: {kd:g}, "
                             f"effort_limit: {effort:g}}}")
    return "\n".join(header + lines) + "\n"


def _quoted(text: str) -> str:
    """``text`` as a single-quoted YAML string (a regex's backslashes stay as written)."""
    return "'" + text.replace("'", "''") + "'"


def plot(fit: Fit, windows: list[Window], nominal: dict, calibrated: dict, joint_names: list[str], path: Path) -> None:
    """calibration.png: the held-out windows one after another, logged against the nominal and the
    calibrated model, for the joint the nominal model missed most (positions; torques where logged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not windows:
        return
    runs = {"nominal": fit.simulate(nominal, windows), "calibrated": fit.simulate(calibrated, windows)}
    logged_pos = np.concatenate([w.joint_pos[1:] for w in windows])
    sim = {label: [np.concatenate([r[i] for r in run]) for i in (0, 1)] for label, run in runs.items()}
    joint = int(np.argmax(((sim["nominal"][0] - logged_pos) ** 2).mean(0)))
    logged_torques = [w.joint_torque[1:] for w in windows if w.joint_torque is not None]
    torques = len(logged_torques) == len(windows)
    fig, axes = plt.subplots(2 if torques else 1, 1, figsize=(10, 6 if torques else 3.5), sharex=True, squeeze=False)
    t = np.arange(len(logged_pos)) * fit.metadata.control_dt
    logged = [logged_pos] + ([np.concatenate(logged_torques)] if torques else [])
    for row, (ax, unit) in enumerate(zip(axes[:, 0], ("position [rad]", "torque [N m]"))):
        ax.plot(t, logged[row][:, joint], "k", lw=1.5, label="logged")
        for label, style in (("nominal", "C3--"), ("calibrated", "C0")):
            ax.plot(t, sim[label][row][:, joint], style, lw=1, label=f"{label} model")
        ax.set_ylabel(f"{joint_names[joint]}\n{unit}")
    axes[0, 0].set_title("held-out windows of the log, each replayed from its logged state")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time in the held-out windows [s]")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(report: dict) -> str:
    """What ``legion calibrate`` prints: each estimate, whether the logs pin it down, the held-out RMSE."""
    rows = ["parameter           estimate   bootstrap 95%          loss rise at +-20% of its range"]
    for name, value in report["estimates"].items():
        p = report["profile"][name]
        low, high = p["bootstrap"]
        rows.append(f"{name:<18} {value:9.4g}   [{low:8.4g}, {high:8.4g}]   {p['rise']:+.1%}"
                    + ("" if p["pinned"] else "   INCONSISTENT with the logs on the ground" if p.get("inconsistent")
                       else "   NOT PINNED DOWN by these logs"))
    rmse = report["held_out_rmse_rad"]
    rows.append(f"held-out joint RMSE: nominal {rmse['nominal']:.4f} rad, calibrated {rmse['calibrated']:.4f} rad "
                f"({rmse['calibrated'] / rmse['nominal']:.0%} of nominal)"
                + (f"; with the actuator networks {rmse['actuator_network']:.4f} rad "
                   f"({rmse['actuator_network'] / rmse['nominal']:.0%})" if "actuator_network" in rmse else ""))
    if rmse["calibrated"] >= rmse["nominal"]:
        rows.append("WARNING: the calibrated model does not beat the nominal one on the held-out windows: it fitted "
                    "noise or effects outside its parameters; do not use these estimates")
    torques = report.get("held_out_torque_rmse_on_the_ground_nm")
    if torques is not None and torques["fitted_hung"] >= torques["nominal"]:
        rows.append(f"WARNING: the motors fitted to the hung logs predict the torques on the ground worse than the "
                    f"nominal model (held-out: {torques['fitted_hung']:.3f} against {torques['nominal']:.3f} N m): the "
                    "robot has an effect the fitted model lacks (gear play, a motor's torque-speed curve, ...) and "
                    "their estimates compensate for it, so they are flagged, not the robot's values; the task file "
                    "keeps the task's own randomization of them")
    for label, entry in report.get("actuator_network", {}).items():
        torque = entry["held_out_torque_rmse_nm"]
        fitted_motor = (f"fitted motor {torque['fitted']:.4f} ({', '.join(torque['fitted_with'])})"
                        if torque["fitted"] is not None else
                        f"no fitted motor ({', '.join(MOTOR_PARAMS)} not fitted in this run)")
        rows.append(f"actuator network {label} ({len(entry['joints'])} joints): held-out torque RMSE network "
                    f"{torque['network']:.4f} N m, nominal motor {torque['nominal']:.4f}, {fitted_motor}")
        if torque["network"] >= min(t for t in (torque["nominal"], torque["fitted"]) if t is not None):
            rows.append(f"WARNING: the actuator network of {label} does not beat the analytic motor on the held-out "
                        "windows: more (or more varied) logs, or keep the analytic motor")
        if entry.get("on_the_ground") is False:
            rows.append(f"WARNING: the actuator network of {label} learned from a hung robot only (torques up to "
                        f"{entry['torque_p99_nm']:.2g} N m, 99th percentile): on the ground the legs carry the robot "
                        "with torques it has not seen, where a network's torque levels off (a Go2 trained on one fell "
                        "a third of a second into each episode). Before training on it, log the robot standing or "
                        "walking too: log=<hung>,<walking> hung=true,false")
    return "\n".join(rows)


# --- the actuator network (Hwangbo et al. 2019; legion.sim2real.deploy.actuator_network) -----------
NETWORK_HISTORY = 3  # instants of position error and velocity, consecutive control ticks
NETWORK_HIDDEN = (32, 32)  # softsign layers, as Hwangbo's
MOTOR_PARAMS = ("kp_scale", "kd_scale", "latency_ms")  # what the fitted analytic motor takes of a calibration


@dataclass
class MotorSamples:
    """Per logged tick with a whole history and per joint (rows: ticks, columns: joints): what an
    actuator network and the analytic motor read there, and the logged torque."""

    errors: np.ndarray  # (N, J, history) the target in effect minus the joint position, now first
    velocities: np.ndarray  # (N, J, history) the joint velocities, now first
    torques: np.ndarray  # (N, J) the motors' tau_est
    targets: np.ndarray  # (N, J) the target in effect now (written at the tick before)
    positions: np.ndarray  # (N, J) q now
    speeds: np.ndarray  # (N, J) dq now

    def pooled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """errors, velocities (N J, history) and torques (N J,): every joint a sample, as Hwangbo pooled them."""
        h = self.errors.shape[-1]
        return self.errors.reshape(-1, h), self.velocities.reshape(-1, h), self.torques.reshape(-1)


def motor_samples(windows: list[Window], joints: list[int], history: int = NETWORK_HISTORY,
                  delay: int = 0) -> MotorSamples:
    """The :class:`MotorSamples` of ``joints`` (indices) in ``windows``. At a logged tick t (state
    t read: q(t), dq(t), tau_est(t)) the target in effect is the one written at the tick before,
    ``targets[t - 1]``, so ``error(t) = targets[t - 1] - joint_pos[t]``; the history steps back one
    tick at a time, and a window's first ``history`` ticks, whose history lies before it, give no
    sample. ``delay``: the ``targets`` an analytic motor with that many ticks of latency acts on,
    ``targets[t - 1 - delay]`` (the errors keep ``targets[t - 1]``)."""
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("errors", "velocities", "torques", "targets", "positions",
                                                        "speeds")}
    for w in windows:
        if w.joint_torque is None:
            raise ValueError("a window without joint_torque (tau_est): the motors' torques label the samples")
        ticks = np.arange(history, len(w.targets) + 1)  # t, whose instants t - i (i < history) all hold a target
        if not len(ticks):
            continue
        lag = ticks[:, None] - np.arange(history)  # (n, history): the instants, now first
        q, dq, targets = (np.asarray(a, np.float64)[:, joints] for a in (w.joint_pos, w.joint_vel, w.targets))
        out["errors"].append((targets[lag - 1] - q[lag]).transpose(0, 2, 1))
        out["velocities"].append(dq[lag].transpose(0, 2, 1))
        out["torques"].append(np.asarray(w.joint_torque, np.float64)[ticks][:, joints])
        out["targets"].append(targets[np.maximum(ticks - 1 - delay, 0)])
        out["positions"].append(q[ticks])
        out["speeds"].append(dq[ticks])
    if not out["errors"]:
        raise ValueError(f"no window holds more than {history} ticks: an actuator network's history needs longer "
                         "windows (window_s)")
    return MotorSamples(**{k: np.concatenate(v) for k, v in out.items()})


def fit_actuator_network(errors: np.ndarray, velocities: np.ndarray, torques: np.ndarray,
                         validation: tuple[np.ndarray, np.ndarray, np.ndarray], stride_s: float, seed: int = 0,
                         hidden: tuple[int, ...] = NETWORK_HIDDEN, activation: str = "softsign",
                         batch: int = 1024, lr: float = 1e-2, max_epochs: int = 500, patience: int = 40,
                         info: dict | None = None) -> tuple[ActuatorNetwork, torch.nn.Module]:
    """An actuator network learned from samples (errors, velocities: (N, history), now first;
    torques (N,) [N m]): torch, Adam on the mean squared torque error over shuffled batches of
    ``batch`` samples, the inputs normalized by their mean and std, the output scaled by the
    torques' std. After each pass over the samples (an epoch) it scores the ``validation`` samples;
    it stops when that loss has not improved for ``patience`` epochs and keeps the weights that were
    best there. Deterministic for a ``seed`` (one CPU thread, float32). Returns the
    :class:`~legion.sim2real.deploy.actuator_network.ActuatorNetwork` (what the file holds) and the
    trained torch module, in float64: torques from error and velocity tensors, the same function."""
    import torch

    from legion.sim2real.deploy.actuator_network import ActuatorNetwork

    history = errors.shape[-1]
    inputs = np.concatenate([errors, velocities], axis=-1)
    mean, std = inputs.mean(0), np.maximum(inputs.std(0), 1e-9)
    scale = float(max(torques.std(), 1e-9))
    act = {"softsign": torch.nn.functional.softsign, "tanh": torch.tanh, "relu": torch.relu}[activation]

    mean_t, std_t = torch.as_tensor(mean, dtype=torch.float64), torch.as_tensor(std, dtype=torch.float64)

    class Network(torch.nn.Module):
        def __init__(self, layers: list[torch.nn.Linear]):
            super().__init__()
            self.layers = torch.nn.ModuleList(layers)

        def normalized(self, x):  # the last layer's output from normalized inputs (what is trained)
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = act(x)
            return x[..., 0]

        def forward(self, errors, velocities):  # (float64 once trained, as the file)
            return self.normalized((torch.cat([errors, velocities], -1) - mean_t) / std_t) * scale

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: a second thread costs more than it gives (and would reorder sums)
    try:
        with torch.random.fork_rng(devices=[]):  # the seed's weights and batches; the caller's generator untouched
            torch.manual_seed(seed)
            sizes = [2 * history, *hidden, 1]
            layers = [torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
            module = Network(layers)
            x = torch.as_tensor((inputs - mean) / std, dtype=torch.float32)
            y = torch.as_tensor(torques / scale, dtype=torch.float32)
            x_val = torch.as_tensor((np.concatenate(validation[:2], axis=-1) - mean) / std, dtype=torch.float32)
            y_val = torch.as_tensor(validation[2] / scale, dtype=torch.float32)
            optimizer = torch.optim.Adam(module.parameters(), lr=lr)
            best, best_state, since, epochs = np.inf, None, 0, 0
            while epochs < max_epochs:
                epochs += 1
                for rows in torch.randperm(len(x)).split(batch):
                    optimizer.zero_grad()
                    loss = torch.mean((module.normalized(x[rows]) - y[rows]) ** 2)
                    loss.backward()
                    optimizer.step()
                with torch.no_grad():
                    held = float(torch.mean((module.normalized(x_val) - y_val) ** 2))
                if held < best:
                    best, since = held, 0
                    best_state = {k: v.clone() for k, v in module.state_dict().items()}
                else:
                    since += 1
                    if since >= patience:
                        break
    finally:
        torch.set_num_threads(threads)
    if best_state is not None:
        module.load_state_dict(best_state)
    module.double().eval()
    network = ActuatorNetwork(weights=[layer.weight.detach().numpy().copy() for layer in layers],
                              biases=[layer.bias.detach().numpy().copy() for layer in layers],
                              input_mean=mean, input_std=std, output_scale=scale, history=history,
                              stride_s=stride_s, activation=activation, info=dict(info or {}))
    network.info["training"] = {"epochs": epochs, "samples": len(x), "validation_rmse_nm": float(np.sqrt(best) * scale)}
    return network, module


@dataclass
class LearnedActuator:
    """One joint group's actuator network, from :func:`learn_actuator_networks`."""

    network: ActuatorNetwork  # what the file holds
    module: torch.nn.Module  # the trained torch module: torques from (errors, velocities) tensors (..., history)
    joints: list[str]  # the group's joints, every one a sample
    rmse: dict  # held-out torque RMSE [N m]: network, nominal, fitted (None: no motor parameter fitted)


def network_rmse(fit: Fit, learned: dict[str, LearnedActuator], windows: list[Window], values: dict) -> float:
    """The joint-position RMSE [rad] over ``windows`` of the calibrated model (``values``: its latency,
    its joints' friction and armature, its payload) with each group's joints driven by its learned
    actuator network in place of the PD law, as :class:`Fit` replays them. The network stands for
    the motor, whose torque tau_est reports, on the targets after the latency; the joint's friction
    acts after it."""
    names = fit.metadata.joint_names
    networks = [(np.array([names.index(n) for n in actuator.joints]), actuator.network)
                for actuator in learned.values()]
    simulated = fit.simulate(values, windows, prepare=lambda robot: robot.use_networks(networks))
    return float(np.sqrt(np.mean([np.mean((positions - w.joint_pos[1:]) ** 2)
                                  for w, (positions, _) in zip(windows, simulated)])))


def _rmse(predicted: np.ndarray, logged: np.ndarray) -> float:
    return float(np.sqrt(np.mean((predicted - logged) ** 2)))


def network_split(windows: list[Window]) -> tuple[list[Window], list[Window], list[Window]]:
    """An actuator network's windows: to train on, to stop its training (every fifth of those
    :func:`calibrate` fits to) and held out (every fourth, as :func:`calibrate` holds them out);
    ValueError where they are too few (:func:`motor_samples` refuses a window without joint_torque)."""
    held_out = windows[3::4]
    fitting = [w for i, w in enumerate(windows) if i % 4 != 3]
    training, validation = [w for i, w in enumerate(fitting) if i % 5 != 4], fitting[4::5]
    if not validation:
        raise ValueError(f"{len(windows)} windows of the logs: an actuator network needs at least 6 (every fourth "
                         "held out, every fifth of the rest to stop its training)")
    return training, validation, held_out


def learn_actuator_networks(windows: list[Window], meta, groups: dict[str, str] | None = None,
                            estimates: dict | None = None, seed: int = 0, history: int = NETWORK_HISTORY,
                            hidden: tuple[int, ...] = NETWORK_HIDDEN, info: dict | None = None
                            ) -> dict[str, LearnedActuator]:
    """Per joint group (``groups``: name -> regex over the joint names; None: one, ``all``), an
    actuator network learned from the windows' joint positions, velocities, targets and tau_est,
    every joint of the group pooled (:func:`motor_samples`, :func:`fit_actuator_network`; the
    history's stride is the log's control dt). Every fourth window is held out, as
    :func:`calibrate` holds them out; every fifth of the rest decides when training stops. On the
    held-out windows, the torque RMSE of the network, of the export's PD law (``nominal``:
    :func:`~legion.sim2real.deploy.mujoco_robot.pd_torque` with the metadata's gains and clip, at
    the same target in effect, q and dq) and of that law with a calibration's ``estimates``
    (``fitted``: kp_scale, kd_scale and latency_ms, the latency as whole ticks of delay; None where
    ``estimates`` holds none of them for the group)."""
    import math

    from legion.sim2real.deploy.mujoco_robot import motor_gains, pd_torque

    training, validation, held_out = network_split(windows)
    estimates = estimates or {}
    kp, kd, effort, saturation, v_limit = motor_gains(meta)
    learned = {}
    for label, pattern in (groups or {"all": ".*"}).items():
        joints = [k for k, name in enumerate(meta.joint_names) if re.fullmatch(pattern, name)]
        if not joints:
            raise ValueError(f"joint group {label} ({pattern}) matches none of the joints "
                             f"({', '.join(meta.joint_names)})")
        names = [meta.joint_names[k] for k in joints]
        network, module = fit_actuator_network(*motor_samples(training, joints, history).pooled(),
                                               motor_samples(validation, joints, history).pooled(),
                                               meta.control_dt, seed=seed, hidden=hidden,
                                               info={**(info or {}), "group": label, "pattern": pattern,
                                                     "joints": names})
        test = motor_samples(held_out, joints, history)
        clip = (effort[joints], saturation[joints], v_limit[joints])
        rmse: dict = {"network": _rmse(network(test.errors, test.velocities), test.torques),
                      "nominal": _rmse(pd_torque(test.targets, test.positions, test.speeds, kp[joints], kd[joints],
                                                 *clip), test.torques)}
        values = {p: estimates[name] for p in MOTOR_PARAMS
                  for name in (p, f"{p}@{label}") if estimates.get(name) is not None}
        rmse["fitted"] = None
        if values:
            # the target in effect at the last physics step before a reading (the logs' control dt
            # apart, the latency's at physics-step resolution, as RealityRobot applies it)
            latency, dt, step = values.get("latency_ms", 0.0) * 1e-3, meta.control_dt, meta.physics_dt
            delay = max(0, math.ceil((latency + 0.5 * step) / dt - 1e-9) - 1)
            late = motor_samples(held_out, joints, history, delay)
            rmse["fitted"] = _rmse(pd_torque(late.targets, late.positions, late.speeds,
                                             kp[joints] * values.get("kp_scale", 1.0),
                                             kd[joints] * values.get("kd_scale", 1.0), *clip), late.torques)
            rmse["fitted_with"] = values
        network.info["held_out_torque_rmse_nm"] = rmse
        learned[label] = LearnedActuator(network, module, names, rmse)
    return learned
