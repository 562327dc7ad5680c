"""Unitree SDK2 low-level control over DDS: a Go2 or a G1 as a :class:`~legion.sim2real.deploy.RobotInterface`.

Unitree's robots speak DDS (CycloneDDS): the robot publishes ``rt/lowstate`` (IMU, every motor's
q and dq, foot forces) and takes ``rt/lowcmd`` (per motor: mode, q, dq, kp, kd, tau, and a CRC
over the whole message) at 500 Hz; Unitree's simulator (unitree_mujoco) and ``legion bridge``
speak the same topics. Imports numpy and ``cyclonedds`` only (``pip install 'legion-rl[unitree]'``).

Why not ``unitree_sdk2`` itself: its 1.0.1 wheel pins ``cyclonedds==0.10.2``, which has no binary
wheel for current Pythons (a source build needs the CycloneDDS C library), and its CRC loads a
``crc_amd64.so`` the wheel does not ship. The messages below are the SDK's IDL definitions
(unitree_sdk2_python ``unitree_sdk2py/idl``, BSD-3-Clause) on ``cyclonedds`` 11, whose wheels
install: same type names, same fields in the same order, so they are the same messages on the
wire. The CRC is Unitree's ``crc32_core`` (CRC-32/MPEG-2 over the message's C struct, 32-bit
little-endian words, the last one, the CRC, left out), computed with zlib; tests hold it to the
SDK's bit-by-bit reference.

What :class:`UnitreeRobot` does:

- Joint order: a robot's motors are numbered (:data:`ROBOTS`: Unitree's motor index -> joint name
  of the robot's URDF); that map is data, checked at start against the policy's joint names
  (refused, naming the joints that do not match).
- State: ``rt/lowstate`` -> joint_pos, joint_vel (policy order), base_quat (IMU, x y z w),
  base_ang_vel (IMU gyroscope, base frame), foot_force (Go2); each message's CRC is checked.
  ``timestamp`` is when the message arrived, on the loop's clock: a robot that stops publishing
  ages it, and the control loop holds, then stops. A policy that reads base_lin_vel or
  base_pos gets them from ``rt/sportmodestate`` (Unitree's state estimate, world frame, rotated
  into the base frame here; required at start then, else added whenever the robot publishes it);
  no Unitree topic carries a height scan (refused at start).
- Command: ``rt/lowcmd`` with the targets, the policy's PD gains, dq = tau = 0, and the CRC.
- Damping (the control loop's stop): kp = 0, kd = ``damping_kd`` on every motor, sent every tick.
- Start: refused without a fresh, valid ``rt/lowstate`` (and ``rt/sportmodestate`` if needed)
  within ``timeout_s``.
- Faults: a LowState whose CRC does not match, or with NaN or Inf, raises :class:`StateError`
  from ``read_state``: the control loop stops and damps.
"""

import functools
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any

import cyclonedds.idl as idl
import cyclonedds.idl.annotations as annotate
import cyclonedds.idl.types as types
import numpy as np
from cyclonedds.core import DDSException, InstanceState, ReadCondition, SampleState, ViewState, WaitSet
from cyclonedds.domain import Domain, DomainParticipant
from cyclonedds.idl import _machinery
from cyclonedds.internal import InvalidSample
from cyclonedds.pub import DataWriter
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration

from legion import StopRequests
from legion.sim2real.deploy.policy import StateError, quat_rotate_inverse

LOWSTATE, LOWCMD, SPORTSTATE = "rt/lowstate", "rt/lowcmd", "rt/sportmodestate"


# cyclonedds' IDL scalar types are typing aliases (Annotated[int, "uint8"]); typed Any here they go into
# types.array(...) of the annotations below, whose fields pyright then sees as the lists they are.
U8: Any = types.uint8
U16: Any = types.uint16
U32: Any = types.uint32
I16: Any = types.int16
F32: Any = types.float32


def _zeros(n: int, value: float = 0) -> Any:
    return field(default_factory=lambda: [value] * n)


def _structs(kind: type, n: int) -> Any:
    return field(default_factory=lambda: [kind() for _ in range(n)])


# --- a fast CDR codec for fixed-size messages ----------------------------------------------------
# cyclonedds' Python serializer walks a message value by value (~0.9 ms for a Go2 LowState, ~1.9 ms
# for a G1's: more than a 500 Hz tick). Unitree's messages are final structs of fixed-size fields,
# so their CDR encoding is one struct format: built here from cyclonedds' own description of the
# type (its serialization "machines"), and checked byte for byte against cyclonedds in the tests.
def _cdr_codes(machine, offset: int, out: list) -> int:
    """Appends the struct codes (padding included) of ``machine``'s XCDR1 encoding from ``offset``
    [bytes after the encapsulation header]; returns the offset after it."""
    if isinstance(machine, _machinery.InstanceMachine):  # a nested struct
        machine.type.__idl__.populate()
        return _cdr_codes(machine.type.__idl__.v1_machine, offset, out)
    if isinstance(machine, _machinery.StructMachine):
        for member in machine.members_machines.values():
            offset = _cdr_codes(member, offset, out)
        return offset
    if isinstance(machine, _machinery.ArrayMachine) and not machine.add_size_header:
        for _ in range(machine.size):
            offset = _cdr_codes(machine.submachine, offset, out)
        return offset
    if isinstance(machine, (_machinery.PrimitiveMachine, _machinery.PlainCdrV2ArrayOfPrimitiveMachine)):
        # a number, or an array of numbers (that machine serves XCDR1 too), aligned to the number's size
        pad = -offset % machine.alignment
        out.append("x" * pad + machine.code)
        return offset + pad + machine.size
    if isinstance(machine, _machinery.ByteArrayMachine):  # uint8[N]: N bytes, unaligned
        out.append(f"{machine.size}B")
        return offset + machine.size
    raise TypeError(f"{type(machine).__name__}: not a fixed-size CDR field")


def _fast_cdr(cls):
    """Gives an IDL message class of fixed-size fields a serialize/deserialize that packs and
    unpacks its XCDR1 encoding (what the DataWriter uses for these types, as Unitree's SDK does)
    with one little-endian ``struct`` format; anything else goes to cyclonedds' own codec."""
    packers: list = []

    def packer() -> struct.Struct:
        if not packers:
            cls.__idl__.populate()
            codes: list = []
            _cdr_codes(cls.__idl__.v1_machine, 0, codes)
            packers.append(struct.Struct("<" + "".join(codes)))
        return packers[0]

    header = b"\x00\x01\x00\x00"  # XCDR1 (CDR_LE): version 1, little-endian, no options

    def serialize(self, buffer=None, endianness=None, use_version_2=None) -> bytes:
        if use_version_2 or buffer is not None or endianness is not None:
            return idl.IdlStruct.serialize(self, buffer, endianness, use_version_2)
        return header + packer().pack(*_flat(self))

    def deserialize(kind, data, has_header: bool = True, use_version_2=None):
        if not has_header or bytes(data[:2]) != header[:2]:  # XCDR2, big-endian, no header: cyclonedds decodes it
            return idl.IdlStruct.deserialize.__func__(kind, data, has_header, use_version_2)
        return _build(kind, iter(packer().unpack_from(data, 4)))

    cls.serialize = serialize
    cls.deserialize = classmethod(deserialize)
    return cls


# --- Unitree's messages: unitree_go (Go2, B2) -------------------------------------------------
@dataclass
@annotate.final
@annotate.autoid("sequential")
class GoMotorCmd(idl.IdlStruct, typename="unitree_go.msg.dds_.MotorCmd_"):
    mode: types.uint8 = 0
    q: types.float32 = 0.0
    dq: types.float32 = 0.0
    tau: types.float32 = 0.0
    kp: types.float32 = 0.0
    kd: types.float32 = 0.0
    reserve: Annotated[list[int], types.array(U32, 3)] = _zeros(3)


@dataclass
@annotate.final
@annotate.autoid("sequential")
class GoMotorState(idl.IdlStruct, typename="unitree_go.msg.dds_.MotorState_"):
    mode: types.uint8 = 0
    q: types.float32 = 0.0
    dq: types.float32 = 0.0
    ddq: types.float32 = 0.0
    tau_est: types.float32 = 0.0
    q_raw: types.float32 = 0.0
    dq_raw: types.float32 = 0.0
    ddq_raw: types.float32 = 0.0
    temperature: types.uint8 = 0
    lost: types.uint32 = 0
    reserve: Annotated[list[int], types.array(U32, 2)] = _zeros(2)


@dataclass
@annotate.final
@annotate.autoid("sequential")
class GoIMUState(idl.IdlStruct, typename="unitree_go.msg.dds_.IMUState_"):
    quaternion: Annotated[list[float], types.array(F32, 4)] = field(default_factory=lambda: [1.0, 0, 0, 0])  # w x y z
    gyroscope: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)
    accelerometer: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)
    rpy: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)
    temperature: types.uint8 = 0


@dataclass
@annotate.final
@annotate.autoid("sequential")
class GoBmsCmd(idl.IdlStruct, typename="unitree_go.msg.dds_.BmsCmd_"):
    off: types.uint8 = 0
    reserve: Annotated[list[int], types.array(U8, 3)] = _zeros(3)


@dataclass
@annotate.final
@annotate.autoid("sequential")
class GoBmsState(idl.IdlStruct, typename="unitree_go.msg.dds_.BmsState_"):
    version_high: types.uint8 = 0
    version_low: types.uint8 = 0
    status: types.uint8 = 0
    soc: types.uint8 = 0
    current: types.int32 = 0
    cycle: types.uint16 = 0
    bq_ntc: Annotated[list[int], types.array(U8, 2)] = _zeros(2)
    mcu_ntc: Annotated[list[int], types.array(U8, 2)] = _zeros(2)
    cell_vol: Annotated[list[int], types.array(U16, 15)] = _zeros(15)


@_fast_cdr
@dataclass
@annotate.final
@annotate.autoid("sequential")
class GoLowCmd(idl.IdlStruct, typename="unitree_go.msg.dds_.LowCmd_"):
    head: Annotated[list[int], types.array(U8, 2)] = field(default_factory=lambda: [0xFE, 0xEF])
    level_flag: types.uint8 = 0xFF  # low-level control
    frame_reserve: types.uint8 = 0
    sn: Annotated[list[int], types.array(U32, 2)] = _zeros(2)
    version: Annotated[list[int], types.array(U32, 2)] = _zeros(2)
    bandwidth: types.uint16 = 0
    motor_cmd: Annotated[list[GoMotorCmd], types.array(GoMotorCmd, 20)] = _structs(GoMotorCmd, 20)
    bms_cmd: GoBmsCmd = field(default_factory=GoBmsCmd)
    wireless_remote: Annotated[list[int], types.array(U8, 40)] = _zeros(40)
    led: Annotated[list[int], types.array(U8, 12)] = _zeros(12)
    fan: Annotated[list[int], types.array(U8, 2)] = _zeros(2)
    gpio: types.uint8 = 0
    reserve: types.uint32 = 0
    crc: types.uint32 = 0


@_fast_cdr
@dataclass
@annotate.final
@annotate.autoid("sequential")
class GoLowState(idl.IdlStruct, typename="unitree_go.msg.dds_.LowState_"):
    head: Annotated[list[int], types.array(U8, 2)] = field(default_factory=lambda: [0xFE, 0xEF])
    level_flag: types.uint8 = 0
    frame_reserve: types.uint8 = 0
    sn: Annotated[list[int], types.array(U32, 2)] = _zeros(2)
    version: Annotated[list[int], types.array(U32, 2)] = _zeros(2)
    bandwidth: types.uint16 = 0
    imu_state: GoIMUState = field(default_factory=GoIMUState)
    motor_state: Annotated[list[GoMotorState], types.array(GoMotorState, 20)] = _structs(GoMotorState, 20)
    bms_state: GoBmsState = field(default_factory=GoBmsState)
    foot_force: Annotated[list[int], types.array(I16, 4)] = _zeros(4)
    foot_force_est: Annotated[list[int], types.array(I16, 4)] = _zeros(4)
    tick: types.uint32 = 0
    wireless_remote: Annotated[list[int], types.array(U8, 40)] = _zeros(40)
    bit_flag: types.uint8 = 0
    adc_reel: types.float32 = 0.0
    temperature_ntc1: types.uint8 = 0
    temperature_ntc2: types.uint8 = 0
    power_v: types.float32 = 0.0
    power_a: types.float32 = 0.0
    fan_frequency: Annotated[list[int], types.array(U16, 4)] = _zeros(4)
    reserve: types.uint32 = 0
    crc: types.uint32 = 0


@dataclass
@annotate.final
@annotate.autoid("sequential")
class TimeSpec(idl.IdlStruct, typename="unitree_go.msg.dds_.TimeSpec_"):
    sec: types.int32 = 0
    nanosec: types.uint32 = 0


@dataclass
@annotate.final
@annotate.autoid("sequential")
class PathPoint(idl.IdlStruct, typename="unitree_go.msg.dds_.PathPoint_"):
    t_from_start: types.float32 = 0.0
    x: types.float32 = 0.0
    y: types.float32 = 0.0
    yaw: types.float32 = 0.0
    vx: types.float32 = 0.0
    vy: types.float32 = 0.0
    vyaw: types.float32 = 0.0


@_fast_cdr
@dataclass
@annotate.final
@annotate.autoid("sequential")
class SportModeState(idl.IdlStruct, typename="unitree_go.msg.dds_.SportModeState_"):
    stamp: TimeSpec = field(default_factory=TimeSpec)
    error_code: types.uint32 = 0
    imu_state: GoIMUState = field(default_factory=GoIMUState)
    mode: types.uint8 = 0
    progress: types.float32 = 0.0
    gait_type: types.uint8 = 0
    foot_raise_height: types.float32 = 0.0
    position: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)  # world (odometry) frame [m]
    body_height: types.float32 = 0.0
    velocity: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)  # world frame [m/s]
    yaw_speed: types.float32 = 0.0
    range_obstacle: Annotated[list[float], types.array(F32, 4)] = _zeros(4, 0.0)
    foot_force: Annotated[list[int], types.array(I16, 4)] = _zeros(4)
    foot_position_body: Annotated[list[float], types.array(F32, 12)] = _zeros(12, 0.0)
    foot_speed_body: Annotated[list[float], types.array(F32, 12)] = _zeros(12, 0.0)
    path_point: Annotated[list[PathPoint], types.array(PathPoint, 10)] = _structs(PathPoint, 10)


# --- unitree_hg (G1, H1-2) -----------------------------------------------------------------------
@dataclass
@annotate.final
@annotate.autoid("sequential")
class HgMotorCmd(idl.IdlStruct, typename="unitree_hg.msg.dds_.MotorCmd_"):
    mode: types.uint8 = 0
    q: types.float32 = 0.0
    dq: types.float32 = 0.0
    tau: types.float32 = 0.0
    kp: types.float32 = 0.0
    kd: types.float32 = 0.0
    reserve: types.uint32 = 0


@dataclass
@annotate.final
@annotate.autoid("sequential")
class HgMotorState(idl.IdlStruct, typename="unitree_hg.msg.dds_.MotorState_"):
    mode: types.uint8 = 0
    q: types.float32 = 0.0
    dq: types.float32 = 0.0
    ddq: types.float32 = 0.0
    tau_est: types.float32 = 0.0
    temperature: Annotated[list[int], types.array(I16, 2)] = _zeros(2)
    vol: types.float32 = 0.0
    sensor: Annotated[list[int], types.array(U32, 2)] = _zeros(2)
    motorstate: types.uint32 = 0
    reserve: Annotated[list[int], types.array(U32, 4)] = _zeros(4)


@dataclass
@annotate.final
@annotate.autoid("sequential")
class HgIMUState(idl.IdlStruct, typename="unitree_hg.msg.dds_.IMUState_"):
    quaternion: Annotated[list[float], types.array(F32, 4)] = field(default_factory=lambda: [1.0, 0, 0, 0])  # w x y z
    gyroscope: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)
    accelerometer: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)
    rpy: Annotated[list[float], types.array(F32, 3)] = _zeros(3, 0.0)
    temperature: types.int16 = 0


@_fast_cdr
@dataclass
@annotate.final
@annotate.autoid("sequential")
class HgLowCmd(idl.IdlStruct, typename="unitree_hg.msg.dds_.LowCmd_"):
    mode_pr: types.uint8 = 0  # ankles in pitch/roll mode
    mode_machine: types.uint8 = 0  # echoed from LowState (the robot's model)
    motor_cmd: Annotated[list[HgMotorCmd], types.array(HgMotorCmd, 35)] = _structs(HgMotorCmd, 35)
    reserve: Annotated[list[int], types.array(U32, 4)] = _zeros(4)
    crc: types.uint32 = 0


@_fast_cdr
@dataclass
@annotate.final
@annotate.autoid("sequential")
class HgLowState(idl.IdlStruct, typename="unitree_hg.msg.dds_.LowState_"):
    version: Annotated[list[int], types.array(U32, 2)] = _zeros(2)
    mode_pr: types.uint8 = 0
    mode_machine: types.uint8 = 0
    tick: types.uint32 = 0
    imu_state: HgIMUState = field(default_factory=HgIMUState)
    motor_state: Annotated[list[HgMotorState], types.array(HgMotorState, 35)] = _structs(HgMotorState, 35)
    wireless_remote: Annotated[list[int], types.array(U8, 40)] = _zeros(40)
    reserve: Annotated[list[int], types.array(U32, 4)] = _zeros(4)
    crc: types.uint32 = 0


# The C struct layout the CRC runs over (unitree_sdk2py/utils/crc.py's formats: 4-byte aligned,
# little-endian; unsigned codes where the IDL field is unsigned, which packs the same bytes).
_STRUCT = {
    GoLowCmd: struct.Struct("<4B4IH2x" + "B3x5f3I" * 20 + "4B" + "55Bx2I"),  # 812 bytes
    GoLowState: struct.Struct("<4B4IH2x" + "13fB3x" + "B3x7fB3x3I" * 20 + "4BiH4B15H" + "8hI41B3xf2B2x2f4H2I"),  # 1180
    HgLowCmd: struct.Struct("<2B2x" + "B3x5fI" * 35 + "5I"),  # 1004
    HgLowState: struct.Struct("<2I2B2xI" + "13fh2x" + "B3x4f2hf7I" * 35 + "40B5I"),  # 2092
}
_REVERSED_BITS = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


def _flat(message, out: list | None = None) -> list:
    """Every value of a message, depth first in field order (the C struct's and CDR's order)."""
    out = [] if out is None else out
    for name, how, _, _ in _layout(type(message)):
        value = getattr(message, name)
        if how == "value":
            out.append(value)
        elif how == "values":
            out.extend(value)
        elif how == "struct":
            _flat(value, out)
        else:
            for item in value:
                _flat(item, out)
    return out


def _build(kind: type, values):
    """A message of type ``kind`` from its values in :func:`_flat`'s order (an iterator)."""
    fields_ = {}
    for name, how, count, sub in _layout(kind):
        if how == "value":
            fields_[name] = next(values)
        elif how == "values":
            fields_[name] = [next(values) for _ in range(count)]
        elif how == "struct":
            fields_[name] = _build(sub, values)
        else:
            fields_[name] = [_build(sub, values) for _ in range(count)]
    return kind(**fields_)


@functools.cache
def _layout(kind: type) -> tuple[tuple[str, str, int, Any], ...]:
    """(field name, value | values | struct | structs, length, struct type) of a message type, in order."""
    default, layout = kind(), []
    for f in fields(kind):
        value = getattr(default, f.name)
        if isinstance(value, list):
            nested = is_dataclass(value[0])
            layout.append((f.name, "structs" if nested else "values", len(value), type(value[0]) if nested else None))
        else:
            nested = is_dataclass(value)
            layout.append((f.name, "struct" if nested else "value", 1, type(value) if nested else None))
    return tuple(layout)


def crc32_core(words: bytes) -> int:
    """Unitree's ``crc32_core`` over 32-bit little-endian words: CRC-32/MPEG-2 (polynomial
    0x04C11DB7, register 0xFFFFFFFF, most significant bit first, no final xor), computed by zlib's
    reflected CRC-32 on bit-reversed bytes."""
    msb_first = np.frombuffer(words, "<u4").astype(">u4").tobytes()
    reflected = zlib.crc32(msb_first.translate(_REVERSED_BITS)) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def message_crc(message) -> int:
    """The CRC a LowCmd or LowState carries: over its C struct, the ``crc`` word left out."""
    packed = _STRUCT[type(message)].pack(*_flat(message))
    return crc32_core(packed[:-4])


@dataclass(frozen=True)
class UnitreeModel:
    """A Unitree robot's low-level interface: its message family (``go``: unitree_go, 20 motor
    slots; ``hg``: unitree_hg, 35), and the joint (URDF name) each motor index drives."""

    name: str
    family: str
    motors: tuple[str, ...]
    damping_kd: float  # [N m s/rad] the damping stop's kd

    @property
    def messages(self) -> tuple[type, type]:
        """(LowState, LowCmd) classes."""
        return (GoLowState, GoLowCmd) if self.family == "go" else (HgLowState, HgLowCmd)


_LEG = ("hip", "thigh", "calf")
_G1_SIDE = ("hip_pitch", "hip_roll", "hip_yaw", "knee", "ankle_pitch", "ankle_roll")
_G1_ARM = ("shoulder_pitch", "shoulder_roll", "shoulder_yaw", "elbow", "wrist_roll", "wrist_pitch", "wrist_yaw")
ROBOTS = {
    # Go2 (Unitree's low-level docs and unitree_sdk2's go2 examples): FR, FL, RR, RL legs, hip, thigh, calf.
    "go2": UnitreeModel("go2", "go", tuple(f"{leg}_{j}_joint" for leg in ("FR", "FL", "RR", "RL") for j in _LEG),
                        damping_kd=1.0),
    # G1 29 DoF (unitree_sdk2's g1 examples, G1JointIndex): legs, waist yaw/roll/pitch, arms. kd 8 damps as
    # unitree_rl_gym's deploy_real does.
    "g1": UnitreeModel("g1", "hg", tuple(
        [f"{side}_{j}_joint" for side in ("left", "right") for j in _G1_SIDE]
        + [f"waist_{j}_joint" for j in ("yaw", "roll", "pitch")]
        + [f"{side}_{j}_joint" for side in ("left", "right") for j in _G1_ARM]), damping_kd=8.0),
}


def motor_order(robot: UnitreeModel, joint_names: list[str]) -> np.ndarray:
    """Motor index of each policy joint; ValueError naming the joints that do not match the map."""
    index = {name: i for i, name in enumerate(robot.motors)}
    unknown = [n for n in joint_names if n not in index]
    unused = [n for n in robot.motors if n not in joint_names]
    if unknown or unused:
        problems = ([f"no {robot.name} motor drives {unknown}"] if unknown else []) + (
            [f"the policy leaves motors {unused} undriven"] if unused else [])
        raise ValueError(f"the policy's joints do not match the {robot.name}'s motor map: {'; '.join(problems)}. The "
                         f"policy was trained for another robot; its joints: {joint_names}.")
    return np.array([index[n] for n in joint_names])


def dds_config(interface: str | None) -> str:
    """CycloneDDS configuration: one network interface (``lo``: this machine only; unicast
    discovery, since Linux's loopback has no multicast) or CycloneDDS' choice (``None``)."""
    if interface is None:
        return "<CycloneDDS><Domain Id='any'/></CycloneDDS>"
    lo = interface in ("lo", "127.0.0.1")
    peers = "<Peers><Peer Address='127.0.0.1'/></Peers><ParticipantIndex>auto</ParticipantIndex>" \
            "<MaxAutoParticipantIndex>64</MaxAutoParticipantIndex>" if lo else ""
    return (f"<CycloneDDS><Domain Id='any'><General><Interfaces><NetworkInterface name='{interface}' "
            f"multicast='{'false' if lo else 'default'}'/></Interfaces>"
            f"{'<AllowMulticast>false</AllowMulticast>' if lo else ''}</General>"
            f"<Discovery>{peers}</Discovery></Domain></CycloneDDS>")


_DOMAINS: dict[int, tuple[Domain, str | None]] = {}  # CycloneDDS configures a domain once per process


def participant(domain: int, interface: str | None) -> DomainParticipant:
    """A DDS participant on ``domain`` and ``interface``; one process uses one interface per domain."""
    if not 0 <= domain <= 232:  # DDS's port mapping: 7400 + 250 domain must stay a valid UDP port
        raise ValueError(f"domain={domain}: a DDS domain id is 0-232 (Unitree robots use 0)")
    if domain not in _DOMAINS:
        try:
            _DOMAINS[domain] = (Domain(domain, dds_config(interface)), interface)
        except DDSException as e:  # CycloneDDS printed why (e.g. "nosuch0: does not match an available interface")
            interfaces = ", ".join(sorted(name for _, name in socket.if_nameindex()))
            raise ValueError(f"DDS domain {domain} on interface={interface or 'auto'} could not start ({e}); the "
                             f"network interfaces here: {interfaces}") from None
    elif _DOMAINS[domain][1] != interface:
        raise ValueError(f"DDS domain {domain} is already on interface {_DOMAINS[domain][1] or 'auto'} in this "
                         f"process; it cannot also use {interface or 'auto'}")
    return DomainParticipant(domain)


class Latest:
    """The newest sample of a topic and when it arrived (on the ``now`` clock), kept by a reader thread.

    A thread blocked in a DDS WaitSet, not a DDS listener: cyclonedds runs listeners on its own
    thread, and an entity garbage-collected there while another thread changes a listener
    deadlocks both (seen here)."""

    def __init__(self, participant_, topic: str, kind: type, now: Callable[[], float]):
        self.topic, self.now = topic, now
        self.newest: tuple = (None, float("-inf"))  # (sample, arrival time): replaced whole, read whole
        self.count = 0
        self.reader = DataReader(participant_, Topic(participant_, topic, kind))
        self._waitset = WaitSet(participant_)
        self._waitset.attach(ReadCondition(self.reader, SampleState.Any | ViewState.Any | InstanceState.Alive))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True, name=f"dds {topic}")
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            self._waitset.wait(duration(milliseconds=50))  # (releases the GIL while it waits)
            # (InvalidSample: no data, a writer's instance state changed, e.g. it left)
            samples = [s for s in self.reader.take(N=64) if not isinstance(s, InvalidSample)]
            if samples:
                self.newest, self.count = (samples[-1], self.now()), self.count + len(samples)

    def wait(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while self.newest[0] is None and time.monotonic() < end:
            time.sleep(0.002)
        return self.newest[0] is not None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


class UnitreeRobot:
    """A Unitree robot (or a simulator on its topics) over DDS, for :class:`~legion.sim2real.deploy.ControlLoop`.

    Args:
        robot: ``"go2"``, ``"g1"`` (:data:`ROBOTS`) or a :class:`UnitreeModel` (your motor map).
        runner: the :class:`~legion.sim2real.deploy.PolicyRunner` (its metadata: joint names and PD
            gains; its observation: which state fields to provide).
        domain: the DDS domain (Unitree's robots: 0; unitree_mujoco: 1; ``legion bridge``: its
            ``domain``, 0 by default).
        interface: the network interface the robot is on (e.g. ``enp2s0``), ``lo`` for a simulator
            on this computer, ``None``: CycloneDDS chooses.
        timeout_s: how long to wait at start for the robot's state.
        now: the control loop's clock (state timestamps are arrival times on it).
        damping_kd: kd [N m s/rad] of the damping stop (default: the robot's).

    Raises:
        ValueError: the policy's joints are not this robot's, or it reads a field no topic carries.
        TimeoutError: no valid state within ``timeout_s``.
    """

    def __init__(self, robot: str | UnitreeModel, runner, domain: int = 0, interface: str | None = None,
                 timeout_s: float = 2.0, now: Callable[[], float] = time.monotonic,
                 damping_kd: float | None = None):
        if isinstance(robot, str) and robot not in ROBOTS:
            raise ValueError(f"robot={robot}: known Unitree robots are {sorted(ROBOTS)}")
        model = ROBOTS[robot] if isinstance(robot, str) else robot
        self.model, self.now = model, now
        meta = runner.metadata
        self.motors = motor_order(model, meta.joint_names)
        needs = set(runner.state_keys)
        if "height_scan" in needs or "object_pos" in needs:
            raise ValueError(f"the policy reads {sorted(needs & {'height_scan', 'object_pos'})}, which no Unitree "
                             "topic carries: deploy a policy without them (e.g. a flat-terrain one).")
        self.kp = np.asarray(meta.joint_stiffness, np.float32)
        self.kd = np.asarray(meta.joint_damping, np.float32)
        self.damping_kd = model.damping_kd if damping_kd is None else damping_kd
        state_type, cmd_type = model.messages
        self.participant = participant(domain, interface)
        self.lowstate = Latest(self.participant, LOWSTATE, state_type, now)
        # The state estimate: required if the policy reads it, else logged whenever the robot publishes it.
        self.sport = Latest(self.participant, SPORTSTATE, SportModeState, now)
        self.sport_required = bool(needs & {"base_lin_vel", "base_pos"})
        self.writer = DataWriter(self.participant, Topic(self.participant, LOWCMD, cmd_type))
        self.cmd = cmd_type()
        self.sent = 0
        where = f"on DDS domain {domain}, interface {interface or 'auto'}"
        for latest in (self.lowstate, self.sport if self.sport_required else None):
            if latest is not None and not latest.wait(timeout_s):
                self.close()
                raise TimeoutError(f"no {latest.topic} within {timeout_s:g} s {where}: is the robot (or `legion "
                                   "bridge`) running, on the same domain and network interface?"
                                   + (" rt/sportmodestate carries the base velocity this policy reads: on a real "
                                      "robot, Unitree's state estimator (sport service) publishes it."
                                      if latest is self.sport else ""))
        self.read_state()  # a valid state (CRC, finite values) before anything is written

    def read_state(self) -> dict:
        """The newest LowState (and SportModeState) as the runtime's state dict; StateError if its
        CRC does not match or a value the policy reads is not finite."""
        msg, arrived = self.lowstate.newest
        if msg.crc != message_crc(msg):
            raise StateError(f"{LOWSTATE} failed its CRC check (carried {msg.crc:#010x}, computed "
                             f"{message_crc(msg):#010x}): a corrupted or foreign message")
        motors = [msg.motor_state[i] for i in self.motors]
        w, x, y, z = msg.imu_state.quaternion
        state = {"joint_pos": np.array([m.q for m in motors], np.float32),
                 "joint_vel": np.array([m.dq for m in motors], np.float32),
                 "base_quat": np.array([x, y, z, w], np.float32),
                 "base_ang_vel": np.array(msg.imu_state.gyroscope, np.float32),
                 # not read by a policy; logged (`legion deploy log=`) for calibrating the simulator
                 "joint_torque": np.array([m.tau_est for m in motors], np.float32),
                 "base_accel": np.array(msg.imu_state.accelerometer, np.float32),
                 "timestamp": arrived}
        if self.model.family == "go":
            state["foot_force"] = np.array(msg.foot_force, np.float32)
        sport, sport_arrived = self.sport.newest
        if sport is not None:
            state["base_lin_vel"] = quat_rotate_inverse(state["base_quat"], np.array(sport.velocity, np.float32))
            state["base_pos"] = np.array(sport.position, np.float32)
            if self.sport_required:
                state["timestamp"] = min(arrived, sport_arrived)  # as old as the older of the two
        bad = [k for k, v in state.items() if not np.all(np.isfinite(v))]
        if bad:
            raise StateError(f"non-finite values in {LOWSTATE}: {bad}")
        return state

    def _send(self, q, kp, kd) -> None:
        cmd = self.cmd
        if self.model.family == "hg":
            cmd.mode_machine = self.lowstate.newest[0].mode_machine  # the robot refuses another model's commands
        for k, motor in enumerate(self.motors):
            c = cmd.motor_cmd[motor]
            c.mode, c.q, c.dq, c.tau, c.kp, c.kd = 1, float(q[k]), 0.0, 0.0, float(kp[k]), float(kd[k])
        cmd.crc = message_crc(cmd)
        self.writer.write(cmd)
        self.sent += 1

    def write_targets(self, joint_pos_targets: np.ndarray) -> None:
        """A LowCmd: the targets with the policy's PD gains."""
        self._send(joint_pos_targets, self.kp, self.kd)

    def damp(self) -> None:
        """A LowCmd of pure damping: kp = 0, kd = ``damping_kd`` on every joint."""
        n = len(self.motors)
        self._send(np.zeros(n), np.zeros(n), np.full(n, self.damping_kd))

    def close(self) -> None:
        """Stops the reader threads (the DDS entities go with the object)."""
        self.lowstate.close()
        self.sport.close()


# --- legion deploy ---------------------------------------------------------------------------------
def exported_folder(path) -> Path:
    """The export folder of ``path``: itself if it holds policy.onnx, else ``path/exported``;
    ValueError saying what to run otherwise."""
    path = Path(path)
    for folder in (path, path / "exported"):
        if (folder / "policy.onnx").is_file():
            return folder
    raise ValueError(f"{path} holds no exported policy (policy.onnx, or exported/policy.onnx): run "
                     f"`legion export run={path}` first.")


def deploy(folder, robot: str = "go2", domain: int = 0, interface: str | None = None, command=(0.0, 0.0, 0.0),
           duration_s: float | None = None, stand_s: float = 2.0, hold_s: float = 1.0, confirm: bool = True,
           log_dir=None, say: Callable[[str], None] = print, safety=None, excite=None) -> dict:
    """``legion deploy`` as a function: an exported policy on a Unitree robot (or a simulated one) over DDS.

    Phases, each at the policy's control rate: (1) damping (kp = 0) until Enter is pressed (only
    with ``confirm``); (2) stand: targets move linearly from the measured joint positions to the
    policy's default pose over ``stand_s`` with the policy's gains; (3) hold the default pose
    for ``hold_s`` (with ``confirm``: until Enter); (4) the policy, through
    :class:`~legion.sim2real.deploy.ControlLoop` and its safety layer, for ``duration_s`` (None:
    until Ctrl-C), holding ``command`` (v_x [m/s], v_y [m/s], yaw rate [rad/s]). A status line
    every second. Whatever ends it (the duration, Ctrl-C, a fault the loop stops on), the robot
    is sent damping for half a second before this returns (or re-raises the fault's error).

    ``excite`` (an :class:`~legion.sim2real.deploy.excite.Excitation`): an identification routine
    runs between (3) and (4), through the same loop and safety layer (``duration_s=0``: instead of
    the policy). ``log_dir``: each of those phases as a :class:`~legion.sim2real.deploy.TrajectoryLog`
    episode (a folder that already holds a log is refused before anything is sent). Returns the
    loop's statistics, ``stopped`` (why, or None) and the log files.
    """
    import select
    import sys
    from contextlib import nullcontext

    from legion.sim2real.deploy.log import TrajectoryLog
    from legion.sim2real.deploy.loop import ControlLoop, SafetyConfig
    from legion.sim2real.deploy.policy import PolicyRunner

    if confirm and not sys.stdin.isatty():
        raise ValueError("confirm=true waits for Enter at a terminal, and stdin is none: run it in a terminal, or "
                         "pass confirm=false (no prompts: a simulated robot, a scripted run)")
    runner = PolicyRunner(Path(folder) / "policy.onnx")
    # Made before the robot is reached: a log folder it refuses (one holding a log) costs no session.
    log = TrajectoryLog(log_dir, runner) if log_dir else None
    unitree = UnitreeRobot(robot, runner, domain, interface)
    safety = safety or SafetyConfig()
    dt, default = runner.control_dt, np.asarray(runner.metadata.default_joint_pos, np.float32)
    say(f"[deploy] {unitree.model.name}: {len(unitree.motors)} motors on DDS domain {domain}, interface "
        f"{interface or 'auto'}; policy {runner.policy.path} at {1 / dt:.0f} Hz")

    def enter_pressed() -> bool:
        if select.select([sys.stdin], [], [], 0)[0]:
            sys.stdin.readline()
            return True
        return False

    def paced(seconds: float | None, action: Callable[[float], None], until_enter: bool) -> None:
        """``action(t)`` every control period for ``seconds`` (or until Enter), on fresh states only."""
        start = next_tick = time.perf_counter()
        while True:
            t = time.perf_counter() - start
            if (until_enter and enter_pressed()) or (not until_enter and seconds is not None and t >= seconds):
                return
            state = unitree.read_state()  # StateError on a bad CRC or NaN
            age = time.monotonic() - state["timestamp"]
            if age > safety.damp_after_s:
                raise StateError(f"{LOWSTATE} is {age * 1e3:.0f} ms old (limit {safety.damp_after_s * 1e3:.0f} ms): "
                                 "the robot stopped publishing")
            action(t)
            if requests.event.is_set():
                raise KeyboardInterrupt  # here, between two ticks, where it is safe to stop
            next_tick += dt
            time.sleep(max(0.0, next_tick - time.perf_counter()))

    def damp_briefly() -> None:
        for _ in range(int(0.5 / dt)):
            unitree.damp()
            time.sleep(dt)

    stopped, summary, log_paths = None, {}, []
    with StopRequests() as requests:  # Ctrl-C as a flag the phases check, never lost in a finalizer
        try:
            if confirm:
                say("[deploy] damping (kp = 0). Press Enter to stand up; Ctrl-C exits.")
                paced(None, lambda t: unitree.damp(), until_enter=True)
            start_pose = unitree.read_state()["joint_pos"]
            say(f"[deploy] standing up over {stand_s:g} s")
            paced(stand_s, lambda t: unitree.write_targets(start_pose + (default - start_pose) * min(1.0, t / stand_s)),
                  until_enter=False)
            say("[deploy] holding the default pose" + (": press Enter to start the policy" if confirm else ""))
            paced(hold_s, lambda t: unitree.write_targets(default), until_enter=confirm)
            with log if log is not None else nullcontext():

                def phase(acting, ticks: int | None, label: str) -> str | None:
                    """``acting`` (the policy, or an excitation) in the control loop for ``ticks`` (None: until
                    Ctrl-C), a status line a second, one log episode; returns why the loop stopped, if it did."""
                    nonlocal summary
                    if log is not None:
                        log.runner = acting  # the log's obs and actions are the acting one's
                    loop = ControlLoop(unitree, acting, safety=safety, logger=log)
                    steps_per_status, done, started = max(1, round(1.0 / dt)), 0, time.perf_counter()
                    while loop.stopped is None and (ticks is None or done < ticks):
                        chunk = steps_per_status if ticks is None else min(steps_per_status, ticks - done)
                        summary = loop.run(chunk, np.asarray(command, np.float32), stop=requests.event)
                        done += chunk
                        say(f"[deploy] {'stopped' if loop.stopped else label} {done * dt:6.1f} s | "
                            f"{done / (time.perf_counter() - started):.1f} Hz | deadline misses {summary['misses']} | "
                            f"latency p50 {summary['latency_p50_us']:.0f} us p99 {summary['latency_p99_us']:.0f} us | "
                            f"holds {summary['hold']} | LowCmd sent {unitree.sent}")
                    if log is not None:
                        log_paths.append(log.end_episode())
                    return loop.stopped

                if excite is not None:
                    from legion.sim2real.deploy.excite import ExcitationRunner

                    routine = ExcitationRunner(runner, excite)
                    say(f"[deploy] excitation {excite.name}: +-{excite.amplitude:g} rad about the default pose for "
                        f"{excite.duration_s:g} s")
                    stopped = phase(routine, routine.ticks, "excitation")
                if stopped is None and duration_s != 0:
                    say(f"[deploy] policy, command (v_x, v_y, yaw rate) = {tuple(float(c) for c in command)}"
                        + (f", for {duration_s:g} s" if duration_s else ", until Ctrl-C"))
                    stopped = phase(runner, None if duration_s is None else round(duration_s / dt), "policy")
        except KeyboardInterrupt:
            stopped = "interrupted"
        except BaseException as e:
            stopped = f"{e.__class__.__name__}: {e}"
            damp_briefly()
            unitree.close()
            say(f"[deploy] stopped ({stopped}); damping sent")
            raise
        damp_briefly()  # (a Ctrl-C now cannot cut it short)
        unitree.close()
    say(f"[deploy] {'stopped (' + stopped + ')' if stopped else 'done'}; damping sent")
    logs = [str(path) for path in log_paths if path is not None]
    return {**summary, "stopped": stopped, "log": logs[-1] if logs else None, "logs": logs}
