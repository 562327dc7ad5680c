"""`legion bridge`: a simulated Unitree robot on the robot's own DDS topics, in plain MuJoCo.

The robot is the export's ``robot.mjb`` (the model Newton trained on, nominal parameters), or, with
``reality``, that model with the physics of a reality file (:mod:`legion.sim2real.reality`: latency,
motor friction, gains, payload, sensor noise ...: a stand-in that is not the training model). Each
tick of the robot's rate (500 Hz: Unitree's low-level rate; the physics timestep is one tick),
the bridge takes the newest ``rt/lowcmd``, applies each motor's command as the robot's motor
drivers do, ``tau = kp (q* - q) + kd (dq* - dq) + tau_ff`` clipped to the motor's torque limits
(the policy metadata's: effort limit, DC motor torque-speed line), steps the physics and
publishes ``rt/lowstate`` (IMU: orientation, gyroscope, accelerometer, roll-pitch-yaw; motor q,
dq, ddq, tau_est; foot contact forces) and ``rt/sportmodestate`` (position and velocity in the
world frame, what Unitree's state estimator reports), CRCs included. A LowCmd whose CRC does
not match is dropped and counted, as the robot drops it.

Until the first LowCmd arrives the robot stands still in its default pose (the physics waits:
as if it were held), so a controller can connect; from then on it runs in real time. Loopback
only unless told (``interface``). Nothing here is needed on a robot: it is the robot.

Fault drills (``faults``, for testing a controller's safety layer): ``silent`` stops publishing,
``bad_crc`` publishes LowStates with a wrong CRC, ``nan`` publishes a NaN joint position.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import mujoco
import numpy as np
from cyclonedds.pub import DataWriter
from cyclonedds.topic import Topic

from legion import StopRequests
from legion.sim2real.deploy.contract import PolicyContract
from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot, find_id
from legion.sim2real.deploy.unitree import (
    LOWCMD,
    LOWSTATE,
    ROBOTS,
    SPORTSTATE,
    Latest,
    SportModeState,
    exported_folder,
    message_crc,
    motor_order,
    participant,
)
from legion.sim2real.reality import RealityRobot

FAULTS = ("silent", "bad_crc", "nan")


class UnitreeBridge:
    """A Unitree robot simulated on DDS (see the module docstring).

    Args:
        exported: an export folder (``policy.json`` and ``robot.mjb``) or a run folder holding ``exported/``.
        robot: ``"go2"`` or ``"g1"`` (:data:`~legion.sim2real.deploy.unitree.ROBOTS`).
        domain, interface: DDS domain and network interface (``lo``: this computer only).
        rate_hz: LowState rate and physics rate [Hz] (a reality may step its physics faster).
        reality: a reality file (:func:`~legion.sim2real.reality.load_reality`) or a loaded one.
        hung: hold the base still and level, its feet 0.3 m above where they stand (a robot hung
            from a gantry, to identify its motors: ``legion deploy excite=...``).
    """

    def __init__(self, exported: str | Path, robot: str = "go2", domain: int = 0, interface: str | None = "lo",
                 rate_hz: float = 500.0, reality=None, hung: bool = False):
        folder = exported_folder(exported)
        if not (folder / "robot.mjb").is_file():
            raise ValueError(f"{folder} has no robot.mjb (the robot as trained, in MuJoCo): export again with this "
                             "version of legion (`legion export`), from a run trained with sim.solver=mujoco.")
        if robot not in ROBOTS:
            raise ValueError(f"robot={robot}: known Unitree robots are {sorted(ROBOTS)}")
        meta = PolicyContract.load(folder / "policy.json")
        self.spec = ROBOTS[robot]
        self.motors = motor_order(self.spec, meta.joint_names)  # motor index of each policy joint
        self.period = 1.0 / rate_hz
        if reality is not None:
            from legion.sim2real.reality import Reality, load_reality

            reality = reality if isinstance(reality, Reality) else load_reality(reality)
            self.sim: MuJoCoRobot = RealityRobot(folder / "robot.mjb", meta, reality, tick_s=self.period)
        else:
            self.sim = MuJoCoRobot(folder / "robot.mjb", meta)
            self.sim.model.opt.timestep = self.period
        self.reality = reality
        if hung:
            self.sim.hang()
        if not self.sim.explicit_pd:
            raise ValueError(f"{folder}/robot.mjb drives its joints with MuJoCo actuators; the bridge applies the "
                             "motor commands itself (export the run again with this version of legion).")
        model = self.sim.model
        self.feet = [find_id(model, mujoco.mjtObj.mjOBJ_BODY, f"{leg}_foot")  # foot_force's order
                     for leg in ("FR", "FL", "RR", "RL")]
        self.gravity = np.array(model.opt.gravity)
        self.faults: set[str] = set()
        state_type, cmd_type = self.spec.messages
        self.participant = participant(domain, interface)
        self.state_writer = DataWriter(self.participant, Topic(self.participant, LOWSTATE, state_type))
        self.sport_writer = DataWriter(self.participant, Topic(self.participant, SPORTSTATE, SportModeState))
        self.commands = Latest(self.participant, LOWCMD, cmd_type, time.monotonic)
        self.state, self.sport = state_type(), SportModeState()
        self.ticks = self.published = self.bad_crc = self.behind = 0
        self.last_command = None  # the newest valid LowCmd applied
        self.hold = True  # the physics waits for the first LowCmd
        self._seen = 0

    # --- one tick ----------------------------------------------------------------------------
    def _apply_command(self) -> None:
        command, _ = self.commands.newest
        if self.commands.count != self._seen and command is not None:
            self._seen = self.commands.count
            if command.crc != message_crc(command):
                self.bad_crc += 1
            else:
                self.last_command, self.hold = command, False
        if self.hold or self.last_command is None:
            return
        cmds = [self.last_command.motor_cmd[i] for i in self.motors]
        on = np.array([c.mode != 0 for c in cmds])  # mode 0: the motor is off (no torque), as on the robot
        self.sim.physics_step(np.array([c.q for c in cmds]), kp=on * np.array([c.kp for c in cmds]),
                              kd=on * np.array([c.kd for c in cmds]), dq_target=np.array([c.dq for c in cmds]),
                              tau_ff=on * np.array([c.tau for c in cmds]))

    def _publish(self) -> None:
        if "silent" in self.faults:
            return
        d, sim, msg = self.sim.data, self.sim, self.state
        quat = d.qpos[3:7]
        rot = np.empty(9)
        mujoco.mju_quat2Mat(rot, quat)
        rot = rot.reshape(3, 3)
        accel = rot.T @ (d.qacc[0:3] - self.gravity)  # an IMU's specific force [m/s^2], base frame
        q, dq, dd = d.qpos[sim.qpos_ids], d.qvel[sim.qvel_ids], d.qacc[sim.qvel_ids]
        tau, gyro = d.qfrc_applied[sim.qvel_ids], d.qvel[3:6]
        if isinstance(sim, RealityRobot):  # what the robot's sensors read
            q, dq, gyro, accel = sim.sense(q, dq, gyro, accel)
        w, x, y, z = quat
        rpy = [math.atan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y)),
               math.asin(max(-1.0, min(1.0, 2 * (w * y - z * x)))),
               math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))]
        for imu in (msg.imu_state, self.sport.imu_state):
            imu.quaternion, imu.gyroscope = quat.tolist(), gyro.tolist()
            imu.accelerometer, imu.rpy = accel.tolist(), rpy
        for k, motor in enumerate(self.motors):
            m = msg.motor_state[motor]
            m.mode, m.q, m.dq, m.ddq, m.tau_est = 1, float(q[k]), float(dq[k]), float(dd[k]), float(tau[k])
        if "nan" in self.faults:
            msg.motor_state[self.motors[0]].q = float("nan")
        if self.spec.family == "go":
            msg.foot_force = [int(min(sim.body_contact_force([f]), 32767)) if f >= 0 else 0 for f in self.feet]
        msg.tick = int(d.time * 1000) & 0xFFFFFFFF
        msg.crc = message_crc(msg) ^ (0xFFFFFFFF if "bad_crc" in self.faults else 0)
        self.sport.position, self.sport.velocity = d.qpos[0:3].tolist(), d.qvel[0:3].tolist()
        self.sport.yaw_speed = float((rot @ d.qvel[3:6])[2])
        seconds = time.time()
        self.sport.stamp.sec, self.sport.stamp.nanosec = int(seconds), int((seconds % 1) * 1e9)
        self.state_writer.write(msg)
        self.sport_writer.write(self.sport)
        self.published += 1

    def tick(self) -> None:
        """One robot period: the newest command applied, one physics step, the state published."""
        self._apply_command()
        self._publish()
        self.ticks += 1

    def run(self, duration_s: float | None = None, status=None, should_stop=lambda: False) -> dict:
        """Ticks in real time for ``duration_s`` (None: until ``should_stop()`` or Ctrl-C).
        ``status(bridge)`` is called once a second. Returns :meth:`summary`. Ctrl-C and SIGTERM
        are a flag checked every tick (:class:`legion.StopRequests`), which no finalizer can swallow."""
        start = next_tick = time.perf_counter()
        next_status = start + 1.0
        try:
            with StopRequests() as requests:
                while not (should_stop() or requests.event.is_set()) and (
                        duration_s is None or time.perf_counter() - start < duration_s):
                    self.tick()
                    next_tick += self.period
                    now = time.perf_counter()
                    if next_tick > now:
                        time.sleep(next_tick - now)
                    elif now - next_tick > self.period:  # more than a tick late: count it, do not burst
                        self.behind += 1
                        next_tick = now
                    if status is not None and now >= next_status:
                        status(self)
                        next_status += 1.0
        except KeyboardInterrupt:  # a second Ctrl-C, within a tick
            pass
        return self.summary()

    def close(self) -> None:
        """Stops the LowCmd reader thread."""
        self.commands.close()

    def summary(self) -> dict:
        return {"ticks": self.ticks, "published": self.published, "sim_time_s": float(self.sim.data.time),
                "commands": self.commands.count, "bad_crc_commands": self.bad_crc, "late_ticks": self.behind,
                "base_height_m": float(self.sim.data.qpos[2]), "waiting_for_command": self.hold}

    def status_line(self) -> str:
        s = self.summary()
        return (f"[bridge] {self.spec.name} sim {s['sim_time_s']:6.1f} s | LowCmd {s['commands']} "
                f"(bad CRC {s['bad_crc_commands']}) | late ticks {s['late_ticks']} | base height "
                f"{s['base_height_m']:.2f} m" + (" | waiting for the first LowCmd" if s["waiting_for_command"] else ""))
