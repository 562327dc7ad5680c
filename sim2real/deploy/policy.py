"""The exported policy on a robot computer: load, check, build observations, act.

Imports numpy and onnxruntime only. ``legion export`` writes a folder with

- ``policy.onnx``: the actor with its observation normalizer in the graph; input ``obs``
  (B, obs_dim) float32 (a policy that sees: then each image group, (B, C, H, W) float32), output
  ``actions`` (B, num_actions) float32. Recurrent policies add
  ``h_in``/``h_out`` (and ``c_in``/``c_out`` for an LSTM), shaped (layers, B, hidden).
- ``policy_fp16.onnx``: the same with float16 weights (float32 inputs and outputs).
- ``policy.json``: the metadata embedded in the ONNX file (``metadata_props``, one JSON value
  per key) plus the sha256 of each ONNX file, so a modified file is refused. Both are the policy
  contract, :class:`~legion.sim2real.deploy.contract.PolicyContract` (typed, versioned, checked
  field by field at load).

A robot state is a dict of numpy arrays, in SI units and the joint order of
``metadata.joint_names``:

- ``joint_pos`` (J,) [rad], ``joint_vel`` (J,) [rad/s]
- ``base_quat`` (4,) base orientation in the world frame, (x, y, z, w), a unit quaternion
- ``base_lin_vel`` (3,) [m/s] of the base frame's origin and ``base_ang_vel`` (3,) [rad/s], in the
  BASE frame (what an IMU and a state estimator report). Training observes and tracks the base's
  centre of mass, ``metadata.base_com`` [m] from that origin (7.6 cm below a G1's pelvis):
  the observation adds ``base_ang_vel x base_com`` (:func:`com_velocity`)
- ``base_pos`` (3,) [m]: x, y in the world (odometry) frame, z the base's height above the
  ground under it (the world z on flat ground); only if a policy term needs the base height
- ``object_pos`` (3,) [m]: a manipulated object's position in the robot's BASE frame (what a
  camera calibrated to the robot reports); only if a policy term needs it (``object_position``)
- ``height_scan`` (P,) [m] (only if the policy scans the terrain): the terrain's height minus the
  base's height (negative below the base), at the P points ``metadata.height_scan.points``
  [m], given in the base's heading frame (x forward, y left; turning with the base's yaw only),
  in that order: what an elevation map around the robot reports
- ``<camera>/depth`` (H, W) float32 [m] and ``<camera>/rgb`` (H, W, 3) uint8 (only for a policy
  that sees, for each camera of ``metadata.cameras`` its image terms read): planar depth along
  the optical axis (0, NaN or outside the camera's [near, far]: no return) and sRGB colour, of a
  camera at the mount, resolution and field of view the contract states; optionally
  ``<camera>/timestamp`` [s], when that image was taken (the control loop holds on a stale one)
- ``timestamp`` [s]: when the sensors were sampled (used by the control loop's watchdog)

A task-space policy (``action.type`` task_space) acts on its body's pose: the runtime turns the
action into joint targets by differential IK on the kinematic chain exported with it
(:class:`TaskSpaceTargets`, numpy), and its ``body_position`` observation is forward kinematics of
``joint_pos`` on the same chain.

The command (velocity, pose or position target) and the previous action are the runtime's own
inputs, not robot state. :data:`OBSERVATION_TERMS` says which fields each observation term reads:
most are computed here from joint and IMU data; ``object_pos`` and ``height_scan`` come from the
robot's perception as they are (the runtime cannot compute them). tests/test_observations_match.py
holds every term of every task to the training env's value (1e-5), from the sim's robot state.

:meth:`PolicyRunner.act` checks every field the policy reads (present, numeric, of the shape
above, a unit quaternion) and raises :class:`StateError` naming the field otherwise; it raises
:class:`NonFiniteError` instead of returning a non-finite target. Other keys are ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnxruntime as ort

from legion.sim2real.deploy.contract import (
    Camera,
    ContractError,
    ImageInput,
    Observation,
    PolicyContract,
    TaskSpace,
    TaskSpaceChain,
)


class PolicyLoadError(RuntimeError):
    """The exported policy cannot be used as it is; the message says why and what to do."""


class StateError(ValueError):
    """A robot state the policy cannot read: a field is missing, not numeric or of the wrong
    shape, or the quaternion is not a unit one. The message names the field and what it must be."""


class NonFiniteError(FloatingPointError):
    """NaN or Inf in the robot state the policy reads, or in the policy's output; the message
    names which. :class:`~legion.sim2real.deploy.ControlLoop` stops (and damps) on it."""


def quat_rotate_inverse(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotates vectors ``v`` (..., 3) from the world frame into the frame of ``q`` (..., 4), (x, y, z, w).

    Same formula as tasks/math.py: v - w t + xyz x t with t = 2 xyz x v. Written out with
    plain arithmetic: np.cross on 3-vectors costs more than the whole policy inference.
    """
    q, v = np.asarray(q, np.float32), np.asarray(v, np.float32)
    if q.ndim == 1 and v.ndim == 1:  # one robot: Python floats are ~10x faster than numpy ops on 3-vectors
        (x, y, z, w), (v0, v1, v2) = q.tolist(), v.tolist()
    else:
        x, y, z, w = q[..., 0:1], q[..., 1:2], q[..., 2:3], q[..., 3:4]
        v0, v1, v2 = v[..., 0:1], v[..., 1:2], v[..., 2:3]
    t0, t1, t2 = 2 * (y * v2 - z * v1), 2 * (z * v0 - x * v2), 2 * (x * v1 - y * v0)
    out = [v0 - w * t0 + (y * t2 - z * t1), v1 - w * t1 + (z * t0 - x * t2), v2 - w * t2 + (x * t1 - y * t0)]
    return np.array(out, np.float32) if q.ndim == 1 and v.ndim == 1 else np.concatenate(out, axis=-1)


GRAVITY_DIR = np.array([0.0, 0.0, -1.0], np.float32)
# |norm - 1| of base_quat beyond which it is refused: a float32 unit quaternion is within ~1e-7;
# a zeroed or garbled driver message is far off (and would tilt projected gravity unnoticed).
QUAT_NORM_TOLERANCE = 0.01


# --- observation terms ---------------------------------------------------------------------------
@dataclass(frozen=True)
class EdgeTerm:
    """The edge version of one observation term: the robot-state keys it reads, and its function
    ``(state, command (C,), last_action (A,), terms: ObservationTerms) -> (size,)`` float32 (before
    the term's clip and scale). ``parametric``: ``func(params)`` builds that function from the
    term's exported params."""

    reads: tuple[str, ...]
    func: Callable[..., Any]
    parametric: bool = False


def _projected_gravity(state, command, last_action, terms):
    quat = np.asarray(state["base_quat"], np.float32)
    norm = math.hypot(*quat.tolist())
    if abs(norm - 1.0) > QUAT_NORM_TOLERANCE:  # (NaN passes here: it is reported as non-finite)
        raise StateError(f"robot state 'base_quat' = {quat.tolist()} has norm {norm:.3g}: expected a unit quaternion "
                         "(x, y, z, w), the base orientation in the world frame")
    return quat_rotate_inverse(quat, GRAVITY_DIR)


def _height_scan(params: dict[str, Any]):
    offset = float(params["offset"])  # training: base height above the terrain at each point - offset

    def height_scan(state, command, last_action, terms):
        return -np.asarray(state["height_scan"], np.float32) - offset

    return height_scan


# Every observation term of tasks/mdp/observations.py and tasks/manipulation/terms.py, by the training
# function's name (``func`` in the metadata, so a task may name its terms freely). Most are computed
# from what the robot measures; object_position and height_scan are the robot's perception's named
# inputs (``object_pos``, ``height_scan``), taken as they are. A term missing here is refused at load.
OBSERVATION_TERMS: dict[str, EdgeTerm] = {
    "base_lin_vel": EdgeTerm(("base_lin_vel", "base_ang_vel"), lambda state, command, last_action, terms:
                             com_velocity(state, terms.base_com)),
    "base_ang_vel": EdgeTerm(("base_ang_vel",), lambda state, command, last_action, terms: state["base_ang_vel"]),
    "projected_gravity": EdgeTerm(("base_quat",), _projected_gravity),
    "base_height": EdgeTerm(("base_pos",), lambda state, command, last_action, terms:
                            np.asarray(state["base_pos"], np.float32)[2:3]),
    "joint_pos_rel": EdgeTerm(("joint_pos",), lambda state, command, last_action, terms:
                              np.asarray(state["joint_pos"], np.float32) - terms.default_joint_pos),
    "joint_vel": EdgeTerm(("joint_vel",), lambda state, command, last_action, terms: state["joint_vel"]),
    "last_action": EdgeTerm((), lambda state, command, last_action, terms: last_action),
    "velocity_commands": EdgeTerm((), lambda state, command, last_action, terms: command),
    # Manipulation: the command is the target in the robot's base frame, (x, y, z, qx, qy, qz, qw)
    # for a pose (the quaternion of either sign) and (x, y, z) for a position [m].
    "pose_command": EdgeTerm((), lambda state, command, last_action, terms: terms.canonical_pose(command)),
    "position_command": EdgeTerm((), lambda state, command, last_action, terms: command),
    # The task-space action's body in the base frame: forward kinematics of the joint encoders.
    "body_position": EdgeTerm(("joint_pos",), lambda state, command, last_action, terms:
                              terms.kinematics(np.asarray(state["joint_pos"], np.float64))[0]),
    # Perception's named inputs.
    "object_position": EdgeTerm(("object_pos",), lambda state, command, last_action, terms: state["object_pos"]),
    "height_scan": EdgeTerm(("height_scan",), _height_scan, parametric=True),
}
# The length of each robot-state field the terms read ("J": one value per joint).
STATE_LENGTHS = {"joint_pos": "J", "joint_vel": "J", "base_quat": 4, "base_lin_vel": 3, "base_ang_vel": 3,
                 "base_pos": 3, "object_pos": 3, "height_scan": "P"}  # J: one per joint, P: one per height-scan point


def com_velocity(state: dict, base_com: np.ndarray) -> np.ndarray:
    """(3,) [m/s] the velocity of the base's centre of mass, ``base_com`` [m] from the base frame's
    origin, in the base frame: what training calls the base's linear velocity (Newton's free joint
    carries its body's centre-of-mass velocity), from the state's origin velocity: v + w x c."""
    lin_vel, ang_vel = np.asarray(state["base_lin_vel"], np.float32), np.asarray(state["base_ang_vel"], np.float32)
    return lin_vel + np.cross(ang_vel, base_com).astype(np.float32)


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _providers(preferred: list[str] | None) -> list:
    """TensorRT (FP16, engine cache), then CUDA, then CPU: whichever this onnxruntime build has."""
    available = ort.get_available_providers()
    if preferred is not None:
        missing = [p for p in preferred if p not in available]
        if missing:
            raise PolicyLoadError(f"onnxruntime here lacks {missing}; available: {available}. "
                                  "On a Jetson install NVIDIA's onnxruntime-gpu wheel for your JetPack.")
        return list(preferred)
    providers: list = []
    if "TensorrtExecutionProvider" in available:
        cache = str(Path.home() / ".cache" / "legion_trt")
        providers.append(("TensorrtExecutionProvider", {"trt_fp16_enable": True, "trt_engine_cache_enable": True,
                                                        "trt_engine_cache_path": cache}))
    if "CUDAExecutionProvider" in available:
        providers.append("CUDAExecutionProvider")
    return providers + ["CPUExecutionProvider"]


def skew(v) -> np.ndarray:
    """(3,) -> (3, 3): the matrix of the cross product ``v x``."""
    x, y, z = v
    return np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])


def rotation_matrix(rotvec: np.ndarray) -> np.ndarray:
    """(3,) rotation vector (axis times angle [rad]) -> (3, 3) rotation matrix (Rodrigues)."""
    angle = float(np.linalg.norm(rotvec))
    k = skew(rotvec / max(angle, 1e-9))
    return np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * (k @ k)


class Kinematics:
    """Pose and geometric Jacobian of the task-space action's body, in the robot's base frame, from
    the joint positions: the chain ``legion export`` read from the simulated model
    (:class:`legion.tasks.manipulation.ik.KinematicChain`, exported as ``action.task_space.chain``),
    evaluated in numpy (float64) as training evaluates it in torch."""

    def __init__(self, chain: TaskSpaceChain):
        parents, inv_children = (np.asarray(v, np.float64) for v in (chain.parent_frames, chain.inv_child_frames))
        # Between two joints' motions the frames compose to one constant transform: the first joint's
        # parent frame, then a joint's child frame inverted times the next one's parent frame (the tip
        # after the last joint).
        ends = [*parents[1:], np.asarray(chain.tip, np.float64)]
        self.links = [parents[0]] + [inv_child @ end for inv_child, end in zip(inv_children, ends)]
        self.axes = np.asarray(chain.axes, np.float64)  # (k, 3) unit axes, each in its joint's frame
        self.revolute = np.asarray(chain.revolute, bool)  # else prismatic
        self.columns: list[int] = chain.joint_ids  # the joints (of the policy's joint order) that move the body
        # A joint's motion as 4x4 generators: I + sin(q) K + (1 - cos(q)) K^2 turns about a unit axis
        # (Rodrigues, K its cross-product matrix); I + q K slides along it.
        self.generators = np.zeros((len(self.axes), 4, 4))
        for i, (axis, revolute) in enumerate(zip(self.axes, self.revolute)):
            if revolute:
                self.generators[i, :3, :3] = skew(axis)
            else:
                self.generators[i, :3, 3] = axis
        self.squares = self.generators @ self.generators
        self._last: tuple[np.ndarray, tuple] | None = None  # the latest joint positions and their result

    def __call__(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Position (3,) [m], rotation (3, 3) and Jacobian (6, k) (linear rows first) at joint positions q (J,)."""
        values = q[self.columns]
        if self._last is not None and np.array_equal(values, self._last[0]):  # the observation's, then the action's
            return self._last[1]
        turn = np.where(self.revolute, np.sin(values), values)
        bend = np.where(self.revolute, 1 - np.cos(values), 0.0)
        motions = np.eye(4) + turn[:, None, None] * self.generators + bend[:, None, None] * self.squares
        frame, joints = self.links[0], []
        for motion, link in zip(motions, self.links[1:]):
            joints.append(frame)  # the joint's frame before it moves
            frame = frame @ motion @ link
        joints = np.stack(joints)
        origins, axes = joints[:, :3, 3], np.einsum("kij,kj->ki", joints[:, :3, :3], self.axes)
        position = frame[:3, 3]
        spin = self.revolute[:, None]
        arm = position - origins  # axis x arm, written out: np.cross costs more than the rest of this method
        cross = axes[:, [1, 2, 0]] * arm[:, [2, 0, 1]] - axes[:, [2, 0, 1]] * arm[:, [1, 2, 0]]
        linear = np.where(spin, cross, axes)
        result = position, frame[:3, :3], np.concatenate([linear, axes * spin], 1).T
        self._last = values, result
        return result


class TaskSpaceTargets:
    """A task-space action turned into joint targets on the robot, as
    :class:`legion.tasks.mdp.actions.TaskSpaceAction` does in training: the body's desired pose
    (held from tick to tick, from the pose an episode starts at) moved by the action, clamped to
    ``max_error`` of the reached position, then one damped-least-squares step on the Jacobian at the
    measured joint positions, within the joint limits; the gripper to its open or closed limit by the
    sign of the last action component. (Training solves the 6x6 system by unrolled conjugate
    gradients, which ONNX and CUDA graphs take; here it is solved directly: the same step to ~1e-6.)"""

    def __init__(self, kinematics: Kinematics, spec: TaskSpace, scale: float | list[float], joint_limits: np.ndarray,
                 default_joint_pos: np.ndarray):
        self.kinematics = kinematics  # the observation's (ObservationTerms.kinematics): one evaluation per tick
        self.mode = spec.mode
        # ``scale``: the action's, one value [m per unit] (a task-space action scales its position step by one)
        self.scale, self.rotation_scale = float(np.asarray(scale)), float(spec.rotation_scale)
        self.damping, self.max_error = float(spec.damping), float(spec.max_error)
        self.arm_limits = joint_limits[self.kinematics.columns]
        self.gripper_limits = joint_limits[spec.gripper_joint_ids]
        self.default_pos, self.default_rot, _ = self.kinematics(default_joint_pos)  # absolute mode's origin
        self.reset()

    def reset(self) -> None:
        """Start of an episode: the desired pose becomes the pose of the next state."""
        self.desired: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, q: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Targets of the arm's joints (k,) then the gripper's, for joint positions q (J,) and the action."""
        position, rotation, jacobian = self.kinematics(q)
        held_pos, held_rot = self.desired or (position, rotation)
        if self.mode == "relative":
            desired_pos = held_pos + self.scale * action[:3]
            desired_rot = rotation_matrix(self.rotation_scale * action[3:6]) @ held_rot
        else:
            desired_pos = self.default_pos + self.scale * action[:3]
            desired_rot = rotation_matrix(self.rotation_scale * action[3:6]) @ self.default_rot
        desired_pos = position + np.clip(desired_pos - position, -self.max_error, self.max_error)
        e = desired_rot @ rotation.T  # the rotation error as training takes it: sin(angle) times the axis
        error = np.concatenate([desired_pos - position, 0.5 * np.array([e[2, 1] - e[1, 2], e[0, 2] - e[2, 0],
                                                                        e[1, 0] - e[0, 1]])])
        system = jacobian @ jacobian.T + self.damping ** 2 * np.eye(6)
        step = jacobian.T @ np.linalg.solve(system, error)
        arm = np.clip(q[self.kinematics.columns] + step, *self.arm_limits.T)
        gripper = self.gripper_limits[:, 1] if len(action) > 6 and action[6] > 0 else self.gripper_limits[:, 0]
        targets = np.concatenate([arm, gripper])
        if np.isfinite(targets).all():  # a NaN is the caller's to report; the pose held stays as it was
            self.desired = desired_pos, desired_rot
        return targets


class OnnxPolicy:
    """An exported policy: an onnxruntime session plus its checked metadata (``metadata``: the
    :class:`~legion.sim2real.deploy.contract.PolicyContract` embedded in the file).

    Args:
        path: ``policy.onnx`` (or ``policy_fp16.onnx``) written by ``legion export``.
        providers: onnxruntime execution providers; ``None`` picks TensorRT > CUDA > CPU.
        check_hash: refuse a file whose sha256 differs from the one in ``policy.json`` beside it.

    Raises:
        PolicyLoadError: unreadable, truncated or modified file; metadata that is no contract this
            runtime reads (a missing, unknown or mistyped field, another version) or that disagrees
            with the model or with policy.json.
    """

    def __init__(self, path: str | Path, providers: list[str] | None = None, check_hash: bool = True):
        path = Path(path)
        hint = "Re-export it on the training machine (legion export run=<run folder>) and copy the whole folder."
        if path.is_dir() and (path / "policy.onnx").is_file():  # an export folder: its policy
            path = path / "policy.onnx"
        if path.suffix == ".json" and (path.parent / "policy.onnx").is_file():
            raise PolicyLoadError(f"{path} is the policy's metadata: give {path.parent / 'policy.onnx'}.")
        if not path.is_file():
            raise PolicyLoadError(f"{path} does not exist. {hint}")
        sidecar_path, sidecar = path.parent / "policy.json", None
        if check_hash and sidecar_path.is_file():
            try:
                sidecar = PolicyContract.load(sidecar_path)
            except ContractError as e:
                raise PolicyLoadError(str(e)) from e
            digest = (sidecar.files or {}).get(path.name)
            if digest is None:
                raise PolicyLoadError(f"{sidecar_path} lists no sha256 for {path.name}. {hint}")
            actual = sha256_file(path)
            if actual != digest.sha256:
                raise PolicyLoadError(
                    f"{path} was modified or truncated after export: its sha256 is {actual[:12]}..., "
                    f"policy.json says {digest.sha256[:12]}.... {hint}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # batch-1 MLPs: one thread is fastest and leaves the cores to the robot
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), options, providers=_providers(providers))
        except Exception as e:  # onnxruntime raises its own exception types per failure
            raise PolicyLoadError(f"{path} is not a loadable ONNX model (truncated or corrupted?): "
                                  f"{e.__class__.__name__}: {str(e)[:300]}. {hint}") from e
        props = self.session.get_modelmeta().custom_metadata_map
        try:
            embedded = {key: json.loads(value) for key, value in props.items()}
        except ValueError as e:
            raise PolicyLoadError(f"{path}: metadata_props hold invalid JSON ({e}). {hint}") from e
        try:
            self.metadata = PolicyContract.from_dict(embedded, path)  # the contract this runtime acts on
        except ContractError as e:
            raise PolicyLoadError(str(e)) from e
        self.path = path
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.obs_dim = self.session.get_inputs()[0].shape[-1]
        self.num_actions = self.session.get_outputs()[0].shape[-1]
        self.recurrent = self.metadata.onnx.recurrent
        self.image_names = [image.group for image in self.metadata.observation.images]  # inputs after obs
        self.state_names = self.input_names[1 + len(self.image_names):]  # then the recurrent state
        self._check_consistency()
        if sidecar is not None:
            self._check_agrees_with(sidecar, sidecar_path)

    def _check_agrees_with(self, sidecar: PolicyContract, sidecar_path: Path) -> None:
        """policy.json repeats the embedded metadata for the robot's own tools (servo gains, joint
        order): both must say the same, or the driver and this runtime would act on different values."""
        written, embedded = sidecar.embedded(), self.metadata.embedded()
        differ = sorted(k for k in written.keys() | embedded.keys() if written.get(k) != embedded.get(k))
        if differ:
            key = differ[0]
            json_value, onnx_value = (json.dumps(m.get(key))[:200] for m in (written, embedded))
            raise PolicyLoadError(
                f"{sidecar_path} and the metadata embedded in {self.path.name} disagree on {differ} (e.g. '{key}': "
                f"policy.json says {json_value}, the ONNX file {onnx_value}). This runtime would use the embedded "
                "metadata (the sha256 in policy.json covers it), while tools reading policy.json would see other "
                "values, so the policy is refused. Re-export (legion export run=<run folder>) and copy the whole "
                "folder, or restore policy.json; check_hash=False ignores policy.json altogether.")

    def _check_consistency(self) -> None:
        meta, where = self.metadata, self.path
        layout_size = sum(t.size for t in meta.observation.terms)
        if not (layout_size == meta.observation.size == self.obs_dim):
            raise PolicyLoadError(f"{where}: the observation layout adds up to {layout_size} values (size "
                                  f"{meta.observation.size}) but the model input 'obs' takes {self.obs_dim}. "
                                  "The metadata was edited or belongs to another model; re-export.")
        joints = len(meta.joint_names)
        lengths = {k: len(getattr(meta, k)) for k in ("default_joint_pos", "joint_stiffness", "joint_damping",
                                                      "effort_limits", "joint_limits")}
        task_space = meta.action.task_space  # a pose (6) and the gripper's open/close, if it has one
        actions = 6 + bool(task_space.gripper_joint_ids) if task_space else len(meta.action.joint_ids)
        if any(n != joints for n in lengths.values()) or self.num_actions != actions:
            raise PolicyLoadError(f"{where}: {joints} joint names but per-joint lists of lengths {lengths} and "
                                  f"{self.num_actions} actions where the action ({meta.action.type} of "
                                  f"{len(meta.action.joint_ids)} joints) takes {actions}. Re-export.")
        states = [] if not self.recurrent else ["h_in", "c_in"] if self.recurrent.type == "lstm" else ["h_in"]
        expected_inputs = ["obs"] + self.image_names + states
        if self.input_names != expected_inputs:
            raise PolicyLoadError(f"{where}: model inputs {self.input_names}, metadata implies {expected_inputs}. "
                                  "Re-export.")
        shapes = {i.name: list(i.shape[1:]) for i in self.session.get_inputs()}
        for image in meta.observation.images:
            cameras = [t.params.get("camera") for t in image.terms]
            if shapes[image.group] != list(image.shape) or any(c not in meta.cameras for c in cameras):
                raise PolicyLoadError(f"{where}: image input '{image.group}' takes {shapes[image.group]} from cameras "
                                      f"{cameras}; the metadata says {image.shape} and has cameras "
                                      f"{sorted(meta.cameras)}. Re-export.")
        types = {t.name: t.type for t in (*self.session.get_inputs(), *self.session.get_outputs())}
        if any(t != "tensor(float)" for t in types.values()):
            raise PolicyLoadError(f"{where}: model inputs and outputs of types {types}; a legion policy takes and "
                                  "returns float32 tensors. Re-export.")

    def initial_state(self, batch: int = 1) -> list[np.ndarray]:
        """Zero recurrent state: [h] (GRU) or [h, c] (LSTM), each (layers, batch, hidden); [] for an MLP."""
        if not self.recurrent:
            return []
        shape = (self.recurrent.num_layers, batch, self.recurrent.hidden_size)
        return [np.zeros(shape, np.float32) for _ in self.state_names]

    def __call__(self, obs: np.ndarray, state: list[np.ndarray] | None = None,
                 images: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """Actions (B, num_actions) and the next recurrent state for observations (B, obs_dim) and,
        for a policy that sees, its image groups (name -> (B, C, H, W), :meth:`ObservationTerms.images`)."""
        feeds = {"obs": np.ascontiguousarray(obs, dtype=np.float32)}
        for name in self.image_names:
            feeds[name] = np.ascontiguousarray((images or {})[name], dtype=np.float32)
        state = self.initial_state(feeds["obs"].shape[0]) if state is None else state
        feeds.update(zip(self.state_names, state))
        # Dense float32 tensors: the outputs' types are checked at load (_check_consistency).
        outputs = cast(list[np.ndarray], self.session.run(None, feeds))
        return outputs[0], outputs[1:]


class ObservationTerms:
    """The policy's observation on one robot, built from the exported metadata alone: the training
    terms in the exported order (:data:`OBSERVATION_TERMS`), each clipped to ``[-clip, clip]`` then
    multiplied by its scale (noise is training-only). Independent of the action type (an effort
    policy's observation is built the same way). :meth:`of` builds it from a policy's contract.

    Args:
        observation: the layout (the contract's ``observation``).
        joint_names: the policy's joint order; default_joint_pos (J,) [rad or m] in it.
        base_com: (3,) [m] the base's centre of mass in the base frame (``base_lin_vel`` is its velocity).
        quat_reference: a pose command's reference quaternion (x, y, z, w); None: the command as given.
        task_space: the task-space action's IK (its chain gives ``body_position``); None: none.
        where: what to name in errors (the policy file).

    Raises:
        PolicyLoadError: a term without an edge version in :data:`OBSERVATION_TERMS`.
    """

    def __init__(self, observation: Observation, joint_names: list[str], default_joint_pos: Sequence[float], *,
                 base_com: Sequence[float] = (0.0, 0.0, 0.0), quat_reference: Sequence[float] | None = None,
                 task_space: TaskSpace | None = None, cameras: dict[str, Camera] | None = None,
                 where: str | Path = "policy.json"):
        self.joint_names = joint_names
        self.default_joint_pos = np.asarray(default_joint_pos, np.float32)
        self.base_com = np.asarray(base_com, np.float32)
        # q and -q are one orientation; training observed the one in this quaternion's hemisphere.
        self.quat_reference = None if quat_reference is None else np.asarray(quat_reference, np.float32)
        terms = observation.terms
        self.size = observation.size
        self.kinematics = Kinematics(task_space.chain) if task_space else None
        moved = [task_space.body_id] if task_space else None  # the one body forward kinematics gives
        self.terms = []  # (name, function, size)
        low, high, scale = [], [], []  # per observation element: the clip range and the scale
        for term in terms:
            edge = OBSERVATION_TERMS.get(term.func)
            if edge is None:
                raise PolicyLoadError(f"{where}: observation term '{term.name}' (function {term.func}) has no "
                                      f"edge-runtime version; known: {sorted(OBSERVATION_TERMS)}. Add it to "
                                      "sim2real/deploy/policy.py OBSERVATION_TERMS.")
            params = term.params
            if term.func == "body_position" and params.get("bodies") != moved:
                raise PolicyLoadError(f"{where}: observation term '{term.name}' (body_position of bodies "
                                      f"{params.get('bodies')}) is computed on the robot by forward kinematics of the "
                                      "task-space action's chain, and this policy's action moves no such body. "
                                      "Observe the task-space action's own body (task.action.params.body).")
            func = edge.func(params) if edge.parametric else edge.func
            joints = params.get("joints")  # a subset of the joints (metadata version 2)
            if joints is not None and list(joints) != list(range(len(self.joint_names))):
                func = _joint_subset(func, np.asarray(joints))
            clip = np.inf if term.clip is None else term.clip
            self.terms.append((term.name, func, term.size))
            low.append(np.full(term.size, -clip, np.float32))
            high.append(np.full(term.size, clip, np.float32))
            scale.append(np.broadcast_to(np.asarray(term.scale, np.float32), (term.size,)))
        self.low, self.high, self.scale = (np.concatenate(v) for v in (low, high, scale))
        self.clipped = bool(np.isfinite(self.high).any())
        self.state_keys = sorted({k for t in terms for k in OBSERVATION_TERMS[t.func].reads})
        lengths = {"J": len(self.joint_names), "P": next((t.size for t in terms if t.func == "height_scan"), 0)}
        self.state_shapes: list[tuple[str, tuple]] = [(k, (lengths.get(STATE_LENGTHS[k], STATE_LENGTHS[k]),))
                                                      for k in self.state_keys]
        self.image_inputs = [_ImageGroup(image, cameras or {}, where) for image in observation.images]
        self.state_kinds = {k: "iuf" for k in self.state_keys}  # numpy dtype kinds each field may have
        for image in self.image_inputs:
            self.state_keys = sorted({*self.state_keys, *image.keys})
            self.state_shapes += list(image.keys.items())
            self.state_kinds |= image.kinds

    @classmethod
    def of(cls, contract: PolicyContract, where: str | Path = "policy.json",
           observation: Observation | None = None) -> ObservationTerms:
        """The observation of the policy ``contract`` describes (or another ``observation`` layout
        on the same robot, e.g. a critic group's)."""
        command = contract.command
        return cls(observation or contract.observation, contract.joint_names, contract.default_joint_pos,
                   base_com=contract.base_com, quat_reference=command.quat_reference if command else None,
                   task_space=contract.action.task_space, cameras=contract.cameras, where=where)

    def check_state(self, state: dict) -> None:
        """Raises :class:`StateError` unless every field the policy reads is in ``state``, numeric
        and of its shape (see the module docstring); other keys are not looked at."""
        kinds = self.state_kinds
        for key, shape in self.state_shapes:
            value = state.get(key)
            # The common case, numeric arrays of the right shape, costs one comparison per field.
            if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype.kind not in kinds[key]:
                self._refuse_field(state, key, shape)

    def _refuse_field(self, state: dict, key: str, shape: tuple) -> None:
        """Raises StateError naming what is wrong with ``state[key]`` (a list of the right length passes)."""
        missing = [k for k in self.state_keys if k not in state]
        if missing:
            raise StateError(f"robot state lacks {missing} (the policy's observation needs {self.state_keys}); "
                             "see sim2real/deploy/policy.py for the keys, units and frames")
        try:
            value = np.asarray(state[key])
        except (TypeError, ValueError) as e:  # e.g. a ragged list
            raise StateError(f"robot state '{key}' is not an array of numbers ({e}); the policy expects shape "
                             f"{shape}") from None
        if value.shape != shape or value.dtype.kind not in self.state_kinds[key]:
            orders = {"J": ", one per joint in the order of policy.json's joint_names",
                      "P": ", one per point in the order of policy.json's height_scan.points"}
            order = orders.get(STATE_LENGTHS.get(key, ""), "")
            if "/" in key:  # an image: <camera>/depth or <camera>/rgb
                camera, kind = key.split("/")
                order = f" ({kind} of camera '{camera}' as policy.json's cameras.{camera} says: {kind} "
                order += "(H, W) float32 [m])" if kind == "depth" else "(H, W, 3) uint8)"
            raise StateError(f"robot state '{key}' has shape {value.shape} and dtype {value.dtype}; the policy "
                             f"expects shape {shape} numbers{order} (see sim2real/deploy/policy.py for units "
                             "and frames)")

    def images(self, state: dict) -> dict[str, np.ndarray]:
        """The policy's image groups, name -> (C, H, W) float32, from the state's camera images
        (``<camera>/depth``, ``<camera>/rgb``) as training built them: depth with no return (0,
        NaN, or outside the camera's [near, far]) read as far; colour in [0, 1]; each term
        clipped, then scaled. Call :meth:`check_state` first (:meth:`observation` does)."""
        return {image.group: image(state) for image in self.image_inputs}

    def canonical_pose(self, pose: np.ndarray) -> np.ndarray:
        """A pose command (x, y, z, qx, qy, qz, qw) with the quaternion's sign as in training (policies
        exported before the reference was recorded saw w >= 0 and get the command unchanged)."""
        if self.quat_reference is not None and float(pose[3:7] @ self.quat_reference) < 0:
            return np.concatenate([pose[:3], -pose[3:7]])
        return pose

    def observation(self, state: dict, command, last_action: np.ndarray) -> np.ndarray:
        """(size,) float32 observation for a robot state, the task's command (``None``: zeros (3,)) and
        the previous action as it left the policy (A,).

        Raises :class:`StateError` for a state it cannot read and :class:`NonFiniteError` for NaN or
        Inf in the fields it reads or in the command (checked before the clip, which would hide an Inf).
        """
        self.check_state(state)
        command = np.zeros(3, np.float32) if command is None else np.asarray(command, np.float32)
        obs = np.empty(self.size, np.float32)
        start = 0
        for name, func, size in self.terms:
            value = np.asarray(func(state, command, last_action, self), np.float32).reshape(-1)
            if value.shape[0] != size:
                raise ValueError(f"observation term '{name}' has {value.shape[0]} values, the policy expects {size}")
            obs[start:start + size] = value
            start += size
        # A NaN or Inf makes the sum non-finite; a Python (float64) sum of float32 values cannot overflow.
        # (Measured: a numpy reduction here costs ~8 us right after onnxruntime, this ~1 us.)
        if not math.isfinite(sum(obs.tolist())):
            bad = [k for k in self.state_keys if not np.isfinite(np.asarray(state[k], np.float32)).all()]
            raise NonFiniteError(f"non-finite robot state {bad + ['command'] * (not np.isfinite(command).all())}")
        if self.clipped:
            np.minimum(obs, self.high, out=obs)
            np.maximum(obs, self.low, out=obs)
        obs *= self.scale
        return obs


def _depth_image(image: np.ndarray, camera: Camera) -> np.ndarray:
    depth = np.asarray(image, np.float32)
    with np.errstate(invalid="ignore"):  # NaN: no return
        valid = (depth >= camera.near) & (depth <= camera.far)
    return np.where(valid, depth, np.float32(camera.far))[None]


def _rgb_image(image: np.ndarray, camera: Camera) -> np.ndarray:
    return np.asarray(image, np.float32).transpose(2, 0, 1) / np.float32(255.0)


# The image terms' edge versions: (the state key's suffix, its shape after (H, W), its numpy dtype
# kinds, the function (image, camera) -> (C, H, W) float32)
IMAGE_TERMS: dict[str, tuple[str, tuple[int, ...], str, Callable[[np.ndarray, Camera], np.ndarray]]] = {
    "depth_image": ("depth", (), "f", _depth_image),
    "rgb_image": ("rgb", (3,), "u", _rgb_image),
}


class _ImageGroup:
    """One image input (:class:`~legion.sim2real.deploy.contract.ImageInput`) built from camera images."""

    def __init__(self, image: ImageInput, cameras: dict[str, Camera], where):
        self.group, self.shape = image.group, tuple(image.shape)
        self.keys: dict[str, tuple[int, ...]] = {}
        self.kinds: dict[str, str] = {}
        self.terms = []  # (state key, function, camera, clip, scale)
        for term in image.terms:
            if term.func not in IMAGE_TERMS:
                raise PolicyLoadError(f"{where}: image term '{term.name}' (function {term.func}) has no edge-runtime "
                                      f"version; known: {sorted(IMAGE_TERMS)}.")
            name = str(term.params.get("camera"))
            camera = cameras.get(name)
            if camera is None:
                raise PolicyLoadError(f"{where}: image term '{term.name}' reads camera '{name}', which the "
                                      f"metadata's cameras ({sorted(cameras)}) lack. Re-export.")
            suffix, trailing, kinds, func = IMAGE_TERMS[term.func]
            key = f"{name}/{suffix}"
            self.keys[key], self.kinds[key] = (camera.height, camera.width, *trailing), kinds
            clip = np.inf if term.clip is None else term.clip
            scale = np.asarray(term.scale, np.float32).reshape(-1, 1, 1)
            self.terms.append((key, func, camera, clip, scale))

    def __call__(self, state: dict) -> np.ndarray:
        parts = [np.clip(func(state[key], camera), -clip, clip) * scale
                 for key, func, camera, clip, scale in self.terms]
        return np.concatenate(parts).astype(np.float32, copy=False)


def _joint_subset(whole: Callable[..., Any], ids: np.ndarray) -> Callable[..., np.ndarray]:
    """A per-joint term restricted to the joints ``ids`` (the term's ``joints`` param)."""
    def subset(state, command, last_action, terms):
        return np.asarray(whole(state, command, last_action, terms), np.float32)[ids]

    return subset


class PolicyRunner:
    """One robot: robot state -> observation (exactly as training built it) -> joint position targets.

    Args:
        path: the exported ``policy.onnx``.
        providers, check_hash: as :class:`OnnxPolicy`.

    The observation is :meth:`ObservationTerms.observation` (``terms``) of the state, the command and
    ``last_action``: the previous action as it left the policy (after the action clip). It and
    the recurrent state are carried between calls; :meth:`reset` zeroes both.
    """

    def __init__(self, path: str | Path, providers: list[str] | None = None, check_hash: bool = True):
        self.policy = OnnxPolicy(path, providers, check_hash)
        meta = self.metadata = self.policy.metadata  # the policy's contract
        action = meta.action
        if action.type not in ("joint_position", "joint_position_delta", "task_space"):
            raise PolicyLoadError(f"{path}: action type '{action.type}'. The edge runtime drives position-"
                                  "controlled joints (action type joint_position, joint_position_delta or "
                                  "task_space); effort policies need their own runner (ObservationTerms builds "
                                  "their observation).")
        self.action_delta = action.type == "joint_position_delta"
        self.action_joint_ids = np.asarray(action.joint_ids)
        self.action_limits = np.asarray(meta.joint_limits, np.float32)[self.action_joint_ids]
        self.joint_names = meta.joint_names
        self.control_dt = meta.control_dt
        self.action_scale = np.asarray(action.scale, np.float32)
        self.action_offset = np.asarray(action.offset, np.float32)
        self.action_clip = action.clip
        self.action_clamp = action.clamp_to_limits
        self.action_rate = action.max_target_rate  # [rad/s] or None
        self.terms = ObservationTerms.of(meta, path)
        self.state_keys = self.terms.state_keys
        self.task_space = None if self.terms.kinematics is None or action.task_space is None else TaskSpaceTargets(
            self.terms.kinematics, action.task_space, action.scale, np.asarray(meta.joint_limits, np.float64),
            np.asarray(meta.default_joint_pos, np.float64))
        self.reset()

    def reset(self) -> None:
        """Start of an episode: zero last action and recurrent state; delta actions start from the
        joint positions of the next state."""
        self.targets = None
        self.last_action = np.zeros(self.policy.num_actions, np.float32)
        self.hidden = self.policy.initial_state(1)
        if self.task_space is not None:
            self.task_space.reset()

    def check_state(self, state: dict) -> None:
        """Raises :class:`StateError` unless every field the policy reads is in ``state``, numeric
        and of its shape (see the module docstring); other keys are not looked at."""
        self.terms.check_state(state)

    def observation(self, state: dict, command=None) -> np.ndarray:
        """(obs_dim,) float32 policy input for a robot state and the task's command: velocity (v_x, v_y,
        yaw rate) [m/s, m/s, rad/s], or a pose (7,) / position (3,) target in the base frame [m].

        Raises :class:`StateError` for a state it cannot read and :class:`NonFiniteError` for NaN or
        Inf in the fields it reads or in the command (checked before the clip, which would hide an Inf).
        """
        return self.terms.observation(state, command, self.last_action)

    def act(self, state: dict, command=None) -> np.ndarray:
        """Joint position targets (J,) [rad or m], every joint in the policy's joint order, for this
        state and command: on the action's joints default + scale * action (within the joint
        limits if the action clamps to them, and within ``max_target_rate`` of the previous
        targets if it has one), or (``joint_position_delta``) the previous targets +
        scale * action within the joint limits, or (``task_space``) the arm's targets toward the
        desired pose of its body and the gripper's (:class:`TaskSpaceTargets`); joints the action
        does not drive (e.g. a gripper's second finger) hold the default pose, as in training.

        Also keeps the observation (``last_obs``) and action (``last_action``) it used. Never
        returns a non-finite target: raises :class:`NonFiniteError` instead (and then keeps the
        previous action and recurrent state), :class:`StateError` for a state it cannot read.
        """
        obs = self.terms.observation(state, command, self.last_action)
        images = {name: image[None] for name, image in self.terms.images(state).items()}
        actions, hidden = self.policy(obs[None], self.hidden, images)
        action = actions[0]
        if self.action_clip:
            action = np.clip(action, -self.action_clip, self.action_clip)
        if self.action_delta:
            if self.targets is None:  # an episode starts from the joint positions it is in
                self.targets = np.asarray(state["joint_pos"], np.float32)[self.action_joint_ids]
            targets = np.clip(self.targets + self.action_scale * action, *self.action_limits.T)
        elif self.task_space is not None:
            targets = self.task_space(np.asarray(state["joint_pos"], np.float64), action).astype(np.float32)
        else:
            targets = self.action_offset + self.action_scale * action
            if self.action_clamp:
                targets = np.clip(targets, *self.action_limits.T)
            if self.action_rate is not None and self.targets is not None:  # an episode's first targets are free
                step = np.float32(self.action_rate * self.control_dt)
                targets = np.clip(targets, self.targets - step, self.targets + step)
        if not math.isfinite(sum(targets.tolist())):
            raise NonFiniteError("non-finite policy output (NaN or Inf) for a finite observation: the ONNX model "
                                 "is broken. Re-export it (legion export verifies the file before writing it).")
        self.last_obs, self.last_action, self.hidden = obs, action.astype(np.float32), hidden
        if self.action_delta or self.action_rate is not None:
            self.targets = targets.copy()  # the caller may write into what it gets
        if len(targets) == len(self.joint_names):
            return targets
        full = np.asarray(self.metadata.default_joint_pos, np.float32).copy()
        full[self.action_joint_ids] = targets
        return full
