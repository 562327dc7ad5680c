"""A robot stand-in that is not the training model: the export's ``robot.mjb`` with physics written
in a *reality* file, for ``legion bridge reality=<yaml>`` and ``legion sim2sim reality=<yaml>``.

A policy checked only on the model it trained on says nothing about the gap a real robot opens:
motor friction and armature, drivers whose gains and torque limits are not the datasheet's, latency
with jitter, a payload, foot friction, sensor noise and bias, gear play. A reality file writes such
a robot down (the format: :class:`Reality`, one example per file under ``configs/reality/``), and
:class:`RealityRobot` simulates it in plain MuJoCo. Nothing in training or calibration reads these
values: they stand for the physics a user cannot see.

What it simulates, per physics step of its own rate (``physics_hz``):

- **Commands** arrive ``latency_ms`` after they are sent, each with its own draw of the jitter
  (a normal of std ``jitter``, cut at zero), at physics-step resolution; the driver applies the
  newest that has arrived.
- **The motor drivers**: per joint, ``tau = kp_scale kp (dz(q* - q)) + kd_scale kd (dq* - dq) + tau_ff``
  with ``dz`` the gear play (``backlash``: a dead zone of half the play either side of the
  target), clipped to ``torque_limit`` and to a DC motor's torque-speed line (``torque_speed``),
  each replacing the model's where set. The torque it applies is the motor's ``tau_est``.
- **The joints**: Coulomb friction (MuJoCo's ``frictionloss``), viscous friction (added to the
  joint's damping), reflected rotor inertia (``armature``).
- **The base**: a payload (``added_mass_kg``) and a centre of mass moved by ``com_offset_m``.
- **Foot friction**: the sliding friction of every contact with the ground.
- **Sensors**: encoder noise and bias (joint positions), joint velocity noise, gyroscope and
  accelerometer noise and bias (Gaussian, per reading; biases constant).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
from numpy.typing import ArrayLike

from legion.sim2real.deploy.contract import PolicyContract
from legion.sim2real.deploy.mujoco_robot import MotorClip, MuJoCoRobot, motor_gains


@dataclass
class Latency:
    mean: float = 0.0  # [ms] from a command's sending to its effect
    jitter: float = 0.0  # [ms] std of a normal added per command (the sum cut at zero)


@dataclass
class TorqueSpeed:
    """A DC motor's torque-speed line (as the robot config's actuators write it)."""

    saturation: float = 0.0  # [N m] the stall torque
    velocity_limit: float = 0.0  # [rad/s] the no-load speed


@dataclass
class Joints:
    """The motors and joints a pattern names (``joints:`` maps a regular expression over the
    policy's joint names to one of these; a joint takes the first pattern that matches it whole)."""

    coulomb_friction: float = 0.0  # [N m]
    viscous_friction: float = 0.0  # [N m s/rad], added to the model's damping
    armature: Optional[float] = None  # [kg m^2] (null: the model's)
    kp_scale: float = 1.0  # the drivers' effective stiffness, times the commanded kp
    kd_scale: float = 1.0  # ... and damping
    torque_limit: Optional[float] = None  # [N m] (null: the model's effort limit)
    torque_speed: Optional[TorqueSpeed] = None  # (null: the model's motor line, if any)
    backlash: float = 0.0  # [rad] gear play: the position error within half of it drives nothing


@dataclass
class Base:
    added_mass_kg: float = 0.0  # a payload on the base
    com_offset_m: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # moves the base's centre of mass


@dataclass
class Imu:
    gyro_noise: float = 0.0  # [rad/s] std per reading
    gyro_bias: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # [rad/s]
    accel_noise: float = 0.0  # [m/s^2] std per reading
    accel_bias: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # [m/s^2]


@dataclass
class Encoders:
    position_noise: float = 0.0  # [rad] std per reading
    position_bias: float = 0.0  # [rad] every joint's zero offset
    velocity_noise: float = 0.0  # [rad/s] std per reading


@dataclass
class Reality:
    """A reality file (YAML); every key optional, defaults nominal. Units in the field comments."""

    name: str = "nominal"
    description: str = ""
    seed: int = 0  # its noise and jitter draws
    physics_hz: Optional[float] = None  # its own physics rate (null: the export's, or finer where that
    # does not divide the caller's step)
    latency_ms: Latency = field(default_factory=Latency)
    joints: dict[str, Joints] = field(default_factory=dict)
    base: Base = field(default_factory=Base)
    foot_friction: Optional[float] = None  # sliding friction of every contact with the ground
    imu: Imu = field(default_factory=Imu)
    encoders: Encoders = field(default_factory=Encoders)


def load_reality(path: str | Path) -> Reality:
    """A reality file (or the name of one in ``configs/reality/``), checked: ValueError naming the
    file and the key for anything unknown or ill-typed."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path, shipped = Path(path), Path(__file__).parent.parent / "configs" / "reality"
    if not path.is_file() and (shipped / f"{path}.yaml").is_file():  # a shipped reality by name
        path = shipped / f"{path}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in shipped.glob("*.yaml")))
        raise ValueError(f"reality={path}: no such file, nor a shipped reality ({names})")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Reality), OmegaConf.load(path))
        reality = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError, TypeError, yaml.YAMLError) as e:
        # (a YAML syntax error's lines say where; OmegaConf's first line says what)
        message = " ".join(str(e).split()) if isinstance(e, yaml.YAMLError) else str(e).split("\n")[0]
        raise ValueError(f"reality={path}: {message} (the format: legion/sim2real/reality.py, Reality)") from None
    assert isinstance(reality, Reality)
    problems = [f"{key}={value}: not a finite number" for key, value in _numbers(reality) if not math.isfinite(value)]
    problems += [f"latency_ms.{k}={v}: must be >= 0" for k, v in vars(reality.latency_ms).items() if v < 0]
    if reality.physics_hz is not None and reality.physics_hz <= 0:
        problems.append(f"physics_hz={reality.physics_hz}: must be > 0")
    if reality.foot_friction is not None and reality.foot_friction < 0:
        problems.append(f"foot_friction={reality.foot_friction}: must be >= 0")
    for pattern, joints in reality.joints.items():
        try:
            re.compile(pattern)
        except re.error as e:
            problems.append(f"joints.{pattern}: not a regular expression ({e})")
        for key in ("coulomb_friction", "viscous_friction", "backlash", "armature", "kd_scale"):
            if (getattr(joints, key) or 0.0) < 0:
                problems.append(f"joints.{pattern}.{key}={getattr(joints, key)}: must be >= 0")
        for key in ("kp_scale", "torque_limit"):  # a motor that pulls the wrong way or holds nothing
            if getattr(joints, key) is not None and getattr(joints, key) <= 0:
                problems.append(f"joints.{pattern}.{key}={getattr(joints, key)}: must be > 0")
        if joints.torque_speed is not None and min(vars(joints.torque_speed).values()) <= 0:
            problems.append(f"joints.{pattern}.torque_speed={vars(joints.torque_speed)}: both must be > 0")
    noises = {**{f"imu.{k}": v for k, v in vars(reality.imu).items() if k.endswith("noise")},
              **{f"encoders.{k}": v for k, v in vars(reality.encoders).items() if k.endswith("noise")}}
    problems += [f"{key}={value}: must be >= 0" for key, value in noises.items() if value < 0]
    for key, vector in (("base.com_offset_m", reality.base.com_offset_m), ("imu.gyro_bias", reality.imu.gyro_bias),
                        ("imu.accel_bias", reality.imu.accel_bias)):
        if len(vector) != 3:
            problems.append(f"{key}={list(vector)}: give [x, y, z]")
    if problems:
        raise ValueError(f"reality={path}: " + "; ".join(problems))
    return reality


def _numbers(node, name: str = ""):
    """(key, value) of every number in a reality, nested ones included (``base.com_offset_m[2]``)."""
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        yield name, float(node)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, f"{name}[{i}]")
    elif isinstance(node, dict) or hasattr(node, "__dataclass_fields__"):
        for key, value in (node if isinstance(node, dict) else vars(node)).items():
            yield from _numbers(value, f"{name}.{key}" if name else key)


class RealityRobot(MuJoCoRobot):
    """:class:`MuJoCoRobot` under a :class:`Reality` (module docstring). Its :meth:`physics_step`
    advances one *tick* of ``tick_s`` (the export's physics step, or the bridge's period) in steps
    of the reality's own rate; a command given there arrives after the latency.

    Args:
        source, metadata, options: as :class:`MuJoCoRobot`'s.
        reality: what differs from the model.
        tick_s: the caller's step [s] (default: the export's physics step).
        at_arrival: a command acts from the instant it arrives: each physics step runs on the
            expected command over it, each command weighted by the share of the step it is expected
            to have arrived for (its arrival a normal of the latency's mean and jitter; without
            jitter, the time-weighted mean of the command before it and it). Calibration's candidate
            models do, so that the latency and its jitter are continuous values and the fit's loss
            draws nothing. Else (a reality) each command draws its latency and acts from the first
            step it has arrived by (to half a step), as a driver that reads its commands once a
            physics step.
    """

    def __init__(self, source, metadata: PolicyContract, reality: Reality, options: dict | None = None,
                 tick_s: float | None = None, at_arrival: bool = False):
        super().__init__(source, metadata, options=options)
        self.at_arrival = at_arrival
        self.use_networks([])  # its motors are its drivers below, not an export's actuator networks
        self.reality, model = reality, self.model
        if not self.explicit_pd:  # the drivers are simulated here: the model's position actuators go slack
            ids = self.actuator_ids
            model.actuator_gainprm[ids, 0] = 0.0
            model.actuator_biasprm[ids, 1:3] = 0.0
            self.gains = motor_gains(metadata)
            self.explicit_pd = True
        names = metadata.joint_names
        n = len(names)
        self.kp_scale, self.kd_scale, self.backlash = np.ones(n), np.ones(n), np.zeros(n)
        effort, saturation, v_limit = (np.array(g) for g in self.gains[2:])
        matched = set()
        for k, name in enumerate(names):
            pattern = next((p for p in reality.joints if re.fullmatch(p, name)), None)
            if pattern is None:
                continue
            matched.add(pattern)
            j, dof = reality.joints[pattern], self.qvel_ids[k]
            model.dof_frictionloss[dof] = j.coulomb_friction
            model.dof_damping[dof] += j.viscous_friction
            if j.armature is not None:
                model.dof_armature[dof] = j.armature
            self.kp_scale[k], self.kd_scale[k], self.backlash[k] = j.kp_scale, j.kd_scale, j.backlash
            if j.torque_limit is not None:
                effort[k] = j.torque_limit
            if j.torque_speed is not None:
                saturation[k], v_limit[k] = j.torque_speed.saturation, j.torque_speed.velocity_limit
        unmatched = [p for p in reality.joints if p not in matched]
        if unmatched:
            raise ValueError(f"reality {reality.name}: joints {unmatched} match none of the policy's joints "
                             f"({', '.join(names)})")
        self.motor_clip = MotorClip(effort, saturation, v_limit)
        base = self.root_body
        if reality.base.added_mass_kg:
            # The payload's mass sits at the offset centre of mass; the base's inertia grows with its mass.
            mass = model.body_mass[base]
            model.body_inertia[base] *= (mass + reality.base.added_mass_kg) / mass
            model.body_mass[base] = mass + reality.base.added_mass_kg
        model.body_ipos[base] += np.asarray(reality.base.com_offset_m, np.float64)
        if reality.foot_friction is not None:
            self.set_floor_friction(reality.foot_friction)
        self.tick_s = tick_s or metadata.physics_dt
        if reality.physics_hz is None:
            # The export's step where it divides the caller's; else (the bridge's 2 ms ticks against
            # a 5 ms step) the fewest equal steps of the caller's tick no longer than the export's.
            self.substeps = max(1, math.ceil(self.tick_s / metadata.physics_dt - 1e-9))
        else:
            self.substeps = max(1, round(self.tick_s * reality.physics_hz))
            if abs(self.substeps / reality.physics_hz - self.tick_s) > 1e-9:
                raise ValueError(f"reality {reality.name}: physics_hz={reality.physics_hz:g} does not divide the "
                                 f"caller's step of {self.tick_s * 1e3:g} ms into whole steps")
        model.opt.timestep = self.tick_s / self.substeps
        self.rng = np.random.default_rng(reality.seed)
        self.reset()

    def reset(self, base_height: float | None = None, joint_pos=None, object_pose=None) -> None:
        super().reset(base_height, joint_pos, object_pose)
        if not hasattr(self, "reality"):  # MuJoCoRobot's constructor resets before this one has its fields
            return
        # (arrival time [s], q*, kp, kd, dq*, tau_ff): sent, not yet acting; then the one acting
        self.in_flight: list[tuple] = []
        kp, kd = self.gains[0], self.gains[1]
        self.acting = (self.targets.copy(), kp, kd, 0.0, 0.0)
        self.tau = np.zeros(len(self.qvel_ids))  # what the motors apply: the drivers' tau_est

    def send(self, q_target, kp=None, kd=None, dq_target: ArrayLike = 0.0, tau_ff: ArrayLike = 0.0) -> None:
        """A motor command sent now (gains: the metadata's where not given); it arrives after the
        latency, drawn for it."""
        self.targets = np.asarray(q_target, np.float64)
        latency = self.reality.latency_ms
        delay = latency.mean  # (at arrival the jitter is an expectation: expected_command)
        if latency.jitter and not self.at_arrival:
            delay = max(0.0, delay + latency.jitter * self.rng.standard_normal())
        command = (self.targets, self.gains[0] if kp is None else np.asarray(kp, np.float64),
                   self.gains[1] if kd is None else np.asarray(kd, np.float64), dq_target, tau_ff)
        self.in_flight.append((self.data.time + delay * 1e-3, *command))

    def physics_step(self, q_target=None, kp=None, kd=None, dq_target: ArrayLike = 0.0,
                     tau_ff: ArrayLike = 0.0) -> None:
        """One tick: a command (given here, or none) is sent (:meth:`send`), then ``substeps``
        physics steps, each with the newest command that has arrived (see ``at_arrival``)."""
        d = self.data
        if q_target is not None:
            self.send(q_target, kp, kd, dq_target, tau_ff)
        h = self.model.opt.timestep
        play = self.backlash.any()
        for _ in range(self.substeps):
            if self.at_arrival:
                q_star, p, v, dq_star, ff = self.expected_command(d.time, h)
            else:
                if self.in_flight:  # what has arrived by now, to half a step: the newest acts
                    now = d.time + 0.5 * h
                    arrived = [c for c in self.in_flight if c[0] <= now]
                    if arrived:
                        self.acting = max(arrived, key=lambda c: c[0])[1:]
                        self.in_flight = [c for c in self.in_flight if c[0] > now]
                q_star, p, v, dq_star, ff = self.acting
            q, dq = d.qpos[self.qpos_ids], d.qvel[self.qvel_ids]
            error = q_star - q
            if play:  # (without play this is the error itself, bit for bit)
                error = np.sign(error) * np.maximum(np.abs(error) - 0.5 * self.backlash, 0.0)
            tau = (p * self.kp_scale) * ((q + error) - q) + (v * self.kd_scale) * (dq_star - dq) + ff
            self.tau = self.motor_clip(tau, dq)
            if self.networks:  # (a calibration's)
                self.network_torques(q_star, q, dq, self.tau, self.motor_clip.high, ff)
            d.qfrc_applied[self.qvel_ids] = self.tau
            self.mj_step()

    def expected_command(self, start: float, h: float) -> tuple:
        """The expected command over the physics step [start, start + h] (``at_arrival``): the acting
        one, plus each command in flight's change on the one sent before it, times the share of the
        step it is expected to have arrived for. Arrivals spread as a normal of the jitter's std
        about the mean latency (its cut at zero neglected); a command retires to acting once the
        step's end is 4 std past its mean arrival. Commands sent in order arrive in order here."""
        if not self.in_flight:
            return self.acting
        sigma = self.reality.latency_ms.jitter * 1e-3
        expected, previous, retired = list(self.acting), self.acting, 0
        for arrival, *command in self.in_flight:
            if sigma > 0:  # the step's mean of the normal CDF: int Phi = x Phi(x) + phi(x)
                a, b = (start - arrival) / sigma, (start + h - arrival) / sigma
                share = sigma / h * (_integral_of_cdf(b) - _integral_of_cdf(a))
            else:  # (to a millionth of a step: the clock is a sum of floats)
                share = min(max((start + h - arrival) / h, 0.0), 1.0) if arrival > start + 1e-6 * h else 1.0
            if share <= 0.0:
                break
            # (a part sent unchanged, the gains as a rule, is the same object: nothing to blend)
            expected = [e if c is p else e + share * (np.asarray(c, np.float64) - p)
                        for e, c, p in zip(expected, command, previous)]
            previous = command
            retired += start + h >= arrival + 4 * sigma
        if retired:
            self.acting = tuple(self.in_flight[retired - 1][1:])
            self.in_flight = self.in_flight[retired:]
        return tuple(expected)

    def sense(self, joint_pos: np.ndarray, joint_vel: np.ndarray, gyro: np.ndarray,
              accel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What the robot's sensors read of the true values: noise and bias added."""
        e, imu, rng = self.reality.encoders, self.reality.imu, self.rng
        joint_pos = joint_pos + e.position_bias + e.position_noise * rng.standard_normal(joint_pos.shape)
        joint_vel = joint_vel + e.velocity_noise * rng.standard_normal(joint_vel.shape)
        gyro = gyro + np.asarray(imu.gyro_bias) + imu.gyro_noise * rng.standard_normal(3)
        accel = accel + np.asarray(imu.accel_bias) + imu.accel_noise * rng.standard_normal(3)
        return joint_pos, joint_vel, gyro, accel

    def read_state(self) -> dict:
        """:meth:`MuJoCoRobot.read_state` as the robot's sensors read it (:meth:`sense`), and the
        drivers' torque as a Unitree robot reports it (``joint_torque``: its tau_est)."""
        state = super().read_state()
        q, dq, gyro, _ = self.sense(state["joint_pos"], state["joint_vel"], state["base_ang_vel"], np.zeros(3))
        state.update(joint_pos=q.astype(np.float32), joint_vel=dq.astype(np.float32),
                     base_ang_vel=gyro.astype(np.float32), joint_torque=self.tau.astype(np.float32))  # tau_est
        return state


def _integral_of_cdf(x: float) -> float:
    """The integral of the standard normal CDF up to x: x Phi(x) + phi(x)."""
    return x * 0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) + math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
