"""The exported policy on a robot computer: load, check, build observations, act.

Imports numpy and onnxruntime only. ``legion export`` writes a folder with

- ``policy.onnx``: the actor with its observation normalizer in the graph; input ``obs``
  (B, obs_dim) float32, output ``actions`` (B, num_actions) float32. Recurrent policies add
  ``h_in``/``h_out`` (and ``c_in``/``c_out`` for an LSTM), shaped (layers, B, hidden).
- ``policy_fp16.onnx``: the same with float16 weights (float32 inputs and outputs).
- ``policy.json``: the metadata embedded in the ONNX file (``metadata_props``, one JSON value
  per key) plus the sha256 of each ONNX file, so a modified file is refused.

A robot state is a dict of numpy arrays, in SI units and the joint order of
``metadata["joint_names"]``:

- ``joint_pos`` (J,) [rad], ``joint_vel`` (J,) [rad/s]
- ``base_quat`` (4,) base orientation in the world frame, (x, y, z, w), a unit quaternion
- ``base_lin_vel`` (3,) [m/s] and ``base_ang_vel`` (3,) [rad/s], in the BASE frame (what an
  IMU and a state estimator report)
- ``base_pos`` (3,) [m], world frame (only if a policy term needs the base height)
- ``object_pos`` (3,) [m]: a manipulated object's position in the robot's BASE frame (what a
  camera calibrated to the robot reports); only if a policy term needs it (``object_position``)
- ``height_scan`` (P,) [m] (only if the policy scans the terrain): the terrain's height minus the
  base's height (negative below the base), at the P points ``metadata["height_scan"]["points"]``
  [m], given in the base's heading frame (x forward, y left; turning with the base's yaw only),
  in that order: what an elevation map around the robot reports
- ``timestamp`` [s]: when the sensors were sampled (used by the control loop's watchdog)

:meth:`PolicyRunner.act` checks every field the policy reads (present, numeric, of the shape
above, a unit quaternion) and raises :class:`StateError` naming the field otherwise; it raises
:class:`NonFiniteError` instead of returning a non-finite target. Other keys are ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort

METADATA_VERSIONS = (1, 2)  # 2 adds tracking terms, fall conditions and term params
REQUIRED_KEYS = (
    "metadata_version", "joint_names", "default_joint_pos", "action", "joint_stiffness", "joint_damping",
    "effort_limits", "joint_limits", "control_dt", "physics_dt", "decimation", "observation", "onnx",
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


# Observation terms of tasks/mdp/observations.py, on one robot's state. Each takes
# (state, command (3,), runner) and returns a (size,) float32 vector. The names are the
# term functions' names (``func`` in the metadata), so a task may rename its terms freely.
def _base_height(state, command, runner):
    return np.asarray(state["base_pos"], np.float32)[2:3]


def _projected_gravity(state, command, runner):
    quat = np.asarray(state["base_quat"], np.float32)
    norm = math.hypot(*quat.tolist())
    if abs(norm - 1.0) > QUAT_NORM_TOLERANCE:  # (NaN passes here: it is reported as non-finite)
        raise StateError(f"robot state 'base_quat' = {quat.tolist()} has norm {norm:.3g}: expected a unit quaternion "
                         "(x, y, z, w), the base orientation in the world frame")
    return quat_rotate_inverse(quat, GRAVITY_DIR)


OBSERVATION_TERMS = {
    "base_lin_vel": lambda state, command, runner: state["base_lin_vel"],
    "base_ang_vel": lambda state, command, runner: state["base_ang_vel"],
    "projected_gravity": _projected_gravity,
    "velocity_commands": lambda state, command, runner: command,
    "joint_pos_rel": lambda state, command, runner: (np.asarray(state["joint_pos"], np.float32)
                                                     - runner.default_joint_pos),
    "joint_vel": lambda state, command, runner: state["joint_vel"],
    "last_action": lambda state, command, runner: runner.last_action,
    "base_height": _base_height,
    # Manipulation: the command is the target in the robot's base frame, (x, y, z, qx, qy, qz, qw)
    # for a pose (the quaternion of either sign) and (x, y, z) for a position [m].
    "pose_command": lambda state, command, runner: runner.canonical_pose(command),
    "position_command": lambda state, command, runner: command,
    "object_position": lambda state, command, runner: state["object_pos"],
}
# Terms whose edge version depends on the term's exported params: func name -> params -> term.
PARAMETRIC_TERMS = {
    # Training: base height above the terrain at each point - offset.
    "height_scan": lambda params: (lambda state, command, runner, offset=float(params["offset"]):
                                   -np.asarray(state["height_scan"], np.float32) - offset),
}
# The robot-state keys each term reads (for clear errors at load time and at every step).
TERM_STATE_KEYS = {
    "height_scan": ("height_scan",),
    "base_lin_vel": ("base_lin_vel",), "base_ang_vel": ("base_ang_vel",), "projected_gravity": ("base_quat",),
    "joint_pos_rel": ("joint_pos",), "joint_vel": ("joint_vel",), "base_height": ("base_pos",),
    "velocity_commands": (), "last_action": (), "pose_command": (), "position_command": (),
    "object_position": ("object_pos",),
}
# The length of each robot-state field the terms read ("J": one value per joint).
STATE_LENGTHS = {"joint_pos": "J", "joint_vel": "J", "base_quat": 4, "base_lin_vel": 3, "base_ang_vel": 3,
                 "base_pos": 3, "object_pos": 3, "height_scan": "P"}  # J: one per joint, P: one per height-scan point


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


class OnnxPolicy:
    """An exported policy: an onnxruntime session plus its checked metadata.

    Args:
        path: ``policy.onnx`` (or ``policy_fp16.onnx``) written by ``legion export``.
        providers: onnxruntime execution providers; ``None`` picks TensorRT > CUDA > CPU.
        check_hash: refuse a file whose sha256 differs from the one in ``policy.json`` beside it.

    Raises:
        PolicyLoadError: unreadable, truncated or modified file, or inconsistent metadata.
    """

    def __init__(self, path: str | Path, providers: list[str] | None = None, check_hash: bool = True):
        path = Path(path)
        hint = "Re-export it on the training machine (legion export run=<run folder>) and copy the whole folder."
        if not path.is_file():
            raise PolicyLoadError(f"{path} does not exist. {hint}")
        sidecar_path, sidecar = path.parent / "policy.json", None
        if check_hash and sidecar_path.is_file():
            try:
                sidecar = json.loads(sidecar_path.read_text())
                files = sidecar["files"]
            except (ValueError, KeyError, TypeError) as e:
                raise PolicyLoadError(f"{sidecar_path} is not a legion policy.json ({e}). {hint}") from e
            expected, actual = files.get(path.name, {}).get("sha256"), sha256_file(path)
            if expected is None:
                raise PolicyLoadError(f"{sidecar_path} lists no sha256 for {path.name}. {hint}")
            if actual != expected:
                raise PolicyLoadError(
                    f"{path} was modified or truncated after export: its sha256 is {actual[:12]}..., "
                    f"policy.json says {expected[:12]}.... {hint}")
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
            self.metadata = {key: json.loads(value) for key, value in props.items()}
        except ValueError as e:
            raise PolicyLoadError(f"{path}: metadata_props hold invalid JSON ({e}). {hint}") from e
        missing = [k for k in REQUIRED_KEYS if k not in self.metadata]
        if missing:
            raise PolicyLoadError(f"{path} carries no legion metadata {missing}: was it written by legion export? "
                                  + hint)
        if self.metadata["metadata_version"] not in METADATA_VERSIONS:
            raise PolicyLoadError(f"{path} has metadata version {self.metadata['metadata_version']}; "
                                  f"this runtime reads versions {METADATA_VERSIONS}. Update legion-rl on the robot.")
        self.path = path
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.obs_dim = self.session.get_inputs()[0].shape[-1]
        self.num_actions = self.session.get_outputs()[0].shape[-1]
        self.recurrent = self.metadata["onnx"].get("recurrent")
        self._check_consistency()
        if sidecar is not None:
            self._check_agrees_with(sidecar, sidecar_path)

    def _check_agrees_with(self, sidecar: dict, sidecar_path: Path) -> None:
        """policy.json repeats the embedded metadata for the robot's own tools (servo gains, joint
        order): both must say the same, or the driver and this runtime would act on different values."""
        written = {k: v for k, v in sidecar.items() if k not in ("files", "verification")}
        differ = sorted(k for k in written.keys() | self.metadata.keys() if written.get(k) != self.metadata.get(k))
        if differ:
            key = differ[0]
            json_value, onnx_value = (json.dumps(m.get(key))[:200] for m in (written, self.metadata))
            raise PolicyLoadError(
                f"{sidecar_path} and the metadata embedded in {self.path.name} disagree on {differ} (e.g. '{key}': "
                f"policy.json says {json_value}, the ONNX file {onnx_value}). This runtime would use the embedded "
                "metadata (the sha256 in policy.json covers it), while tools reading policy.json would see other "
                "values, so the policy is refused. Re-export (legion export run=<run folder>) and copy the whole "
                "folder, or restore policy.json; check_hash=False ignores policy.json altogether.")

    def _check_consistency(self) -> None:
        meta, where = self.metadata, self.path
        layout_size = sum(t["size"] for t in meta["observation"]["terms"])
        if not (layout_size == meta["observation"]["size"] == self.obs_dim):
            raise PolicyLoadError(f"{where}: the observation layout adds up to {layout_size} values (size "
                                  f"{meta['observation']['size']}) but the model input 'obs' takes {self.obs_dim}. "
                                  "The metadata was edited or belongs to another model; re-export.")
        joints = len(meta["joint_names"])
        lengths = {k: len(meta[k]) for k in ("default_joint_pos", "joint_stiffness", "joint_damping",
                                             "effort_limits", "joint_limits")}
        if any(n != joints for n in lengths.values()) or self.num_actions != len(meta["action"]["joint_ids"]):
            raise PolicyLoadError(f"{where}: {joints} joint names but per-joint lists of lengths {lengths} and "
                                  f"{self.num_actions} actions for {len(meta['action']['joint_ids'])} actuated joints. "
                                  "Re-export.")
        expected_inputs = ["obs"] + (["h_in", "c_in"] if self.recurrent and self.recurrent["type"] == "lstm"
                                     else ["h_in"] if self.recurrent else [])
        if self.input_names != expected_inputs:
            raise PolicyLoadError(f"{where}: model inputs {self.input_names}, metadata implies {expected_inputs}. "
                                  "Re-export.")

    def initial_state(self, batch: int = 1) -> list[np.ndarray]:
        """Zero recurrent state: [h] (GRU) or [h, c] (LSTM), each (layers, batch, hidden); [] for an MLP."""
        if not self.recurrent:
            return []
        shape = (self.recurrent["num_layers"], batch, self.recurrent["hidden_size"])
        return [np.zeros(shape, np.float32) for _ in self.input_names[1:]]

    def __call__(self, obs: np.ndarray, state: list[np.ndarray] | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """Actions (B, num_actions) and the next recurrent state for observations (B, obs_dim)."""
        feeds = {"obs": np.ascontiguousarray(obs, dtype=np.float32)}
        state = self.initial_state(feeds["obs"].shape[0]) if state is None else state
        feeds.update(zip(self.input_names[1:], state))
        outputs = self.session.run(None, feeds)
        return outputs[0], outputs[1:]


class PolicyRunner:
    """One robot: robot state -> observation (exactly as training built it) -> joint position targets.

    Args:
        path: the exported ``policy.onnx``.
        providers, check_hash: as :class:`OnnxPolicy`.

    The observation is the concatenation of the training terms in the exported order, each
    clipped to ``[-clip, clip]`` then multiplied by its scale (noise is a training-only term).
    ``last_action`` is the previous action as it left the policy (after the action clip), and
    the recurrent state is carried between calls; :meth:`reset` zeroes both.
    """

    def __init__(self, path: str | Path, providers: list[str] | None = None, check_hash: bool = True):
        self.policy = OnnxPolicy(path, providers, check_hash)
        meta = self.metadata = self.policy.metadata
        action = meta["action"]
        if action["type"] not in ("joint_position", "joint_position_delta"):
            raise PolicyLoadError(f"{path}: action type '{action['type']}'. The edge runtime drives position-"
                                  "controlled joints (action type joint_position or joint_position_delta); effort "
                                  "policies need their own runner.")
        self.action_delta = action["type"] == "joint_position_delta"
        self.action_joint_ids = np.asarray(action["joint_ids"])
        self.action_limits = np.asarray(meta["joint_limits"], np.float32)[self.action_joint_ids]
        self.joint_names: list[str] = meta["joint_names"]
        self.control_dt: float = meta["control_dt"]
        # q and -q are one orientation; training observed the one in this quaternion's hemisphere.
        reference = (meta.get("command") or {}).get("quat_reference")
        self.quat_reference = None if reference is None else np.asarray(reference, np.float32)
        self.default_joint_pos = np.asarray(meta["default_joint_pos"], np.float32)
        self.action_scale = np.asarray(action["scale"], np.float32)
        self.action_offset = np.asarray(action["offset"], np.float32)
        self.action_clip = action.get("clip")
        self.action_clamp = action.get("clamp_to_limits", False)  # absent before metadata carried it
        self.terms = []  # (name, function, size)
        low, high, scale = [], [], []  # per observation element: the clip range and the scale
        for term in meta["observation"]["terms"]:
            func = OBSERVATION_TERMS.get(term["func"])
            if term["func"] in PARAMETRIC_TERMS:
                func = PARAMETRIC_TERMS[term["func"]](term.get("params") or {})
            if func is None:
                raise PolicyLoadError(f"{path}: observation term '{term['name']}' (function {term['func']}) has no "
                                      f"edge-runtime version; known: {sorted({*OBSERVATION_TERMS, *PARAMETRIC_TERMS})}. "
                                      "Add it to sim2real/deploy/policy.py OBSERVATION_TERMS.")
            joints = (term.get("params") or {}).get("joints")  # a subset of the joints (metadata version 2)
            if joints is not None and list(joints) != list(range(len(meta["joint_names"]))):
                func = (lambda state, command, runner, whole=func, ids=np.asarray(joints):
                        np.asarray(whole(state, command, runner), np.float32)[ids])
            clip = np.inf if term.get("clip") is None else term["clip"]
            size = term["size"]
            self.terms.append((term["name"], func, size))
            low.append(np.full(size, -clip, np.float32))
            high.append(np.full(size, clip, np.float32))
            scale.append(np.broadcast_to(np.asarray(term["scale"], np.float32), (size,)))
        self.obs_low, self.obs_high, self.obs_scale = (np.concatenate(v) for v in (low, high, scale))
        self.obs_clipped = bool(np.isfinite(self.obs_high).any())
        self.state_keys = sorted({k for t in meta["observation"]["terms"] for k in TERM_STATE_KEYS[t["func"]]})
        lengths = {"J": len(self.joint_names),
                   "P": next((t["size"] for t in meta["observation"]["terms"] if t["func"] == "height_scan"), 0)}
        self.state_shapes = [(k, (lengths.get(STATE_LENGTHS[k], STATE_LENGTHS[k]),)) for k in self.state_keys]
        self.reset()

    def reset(self) -> None:
        """Start of an episode: zero last action and recurrent state; delta actions start from the
        joint positions of the next state."""
        self.targets = None
        self.last_action = np.zeros(self.policy.num_actions, np.float32)
        self.hidden = self.policy.initial_state(1)

    def check_state(self, state: dict) -> None:
        """Raises :class:`StateError` unless every field the policy reads is in ``state``, numeric
        and of its shape (see the module docstring); other keys are not looked at."""
        for key, shape in self.state_shapes:
            value = state.get(key)
            # The common case, numeric arrays of the right shape, costs one comparison per field.
            if getattr(value, "shape", None) != shape or value.dtype.kind not in "iuf":
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
        if value.shape != shape or value.dtype.kind not in "iuf":
            order = {"J": ", one per joint in metadata['joint_names'] order",
                     "P": ", one per point in metadata['height_scan']['points'] order"}.get(STATE_LENGTHS[key], "")
            raise StateError(f"robot state '{key}' has shape {value.shape} and dtype {value.dtype}; the policy "
                             f"expects shape {shape} numbers{order} (see sim2real/deploy/policy.py for units "
                             "and frames)")

    def canonical_pose(self, pose: np.ndarray) -> np.ndarray:
        """A pose command (x, y, z, qx, qy, qz, qw) with the quaternion's sign as in training (policies
        exported before the reference was recorded saw w >= 0 and get the command unchanged)."""
        if self.quat_reference is not None and float(pose[3:7] @ self.quat_reference) < 0:
            return np.concatenate([pose[:3], -pose[3:7]])
        return pose

    def observation(self, state: dict, command=None) -> np.ndarray:
        """(obs_dim,) float32 policy input for a robot state and the task's command: velocity (v_x, v_y,
        yaw rate) [m/s, m/s, rad/s], or a pose (7,) / position (3,) target in the base frame [m].

        Raises :class:`StateError` for a state it cannot read and :class:`NonFiniteError` for NaN or
        Inf in the fields it reads or in the command (checked before the clip, which would hide an Inf).
        """
        self.check_state(state)
        command = np.zeros(3, np.float32) if command is None else np.asarray(command, np.float32)
        obs = np.empty(self.policy.obs_dim, np.float32)
        start = 0
        for name, func, size in self.terms:
            value = np.asarray(func(state, command, self), np.float32).reshape(-1)
            if value.shape[0] != size:
                raise ValueError(f"observation term '{name}' has {value.shape[0]} values, the policy expects {size}")
            obs[start:start + size] = value
            start += size
        # A NaN or Inf makes the sum non-finite; a Python (float64) sum of float32 values cannot overflow.
        # (Measured: a numpy reduction here costs ~8 us right after onnxruntime, this ~1 us.)
        if not math.isfinite(sum(obs.tolist())):
            bad = [k for k in self.state_keys if not np.isfinite(np.asarray(state[k], np.float32)).all()]
            raise NonFiniteError(f"non-finite robot state {bad + ['command'] * (not np.isfinite(command).all())}")
        if self.obs_clipped:
            np.minimum(obs, self.obs_high, out=obs)
            np.maximum(obs, self.obs_low, out=obs)
        obs *= self.obs_scale
        return obs

    def act(self, state: dict, command=None) -> np.ndarray:
        """Joint position targets of the action's joints [rad or m] for this state and command:
        default + scale * action (within the joint limits if the action clamps to them), or
        (``joint_position_delta``) the previous targets + scale * action within the joint limits.

        Also keeps the observation (``last_obs``) and action (``last_action``) it used. Never
        returns a non-finite target: raises :class:`NonFiniteError` instead (and then keeps the
        previous action and recurrent state), :class:`StateError` for a state it cannot read.
        """
        obs = self.observation(state, command)
        actions, hidden = self.policy(obs[None], self.hidden)
        action = actions[0]
        if self.action_clip:
            action = np.clip(action, -self.action_clip, self.action_clip)
        if self.action_delta:
            if self.targets is None:  # an episode starts from the joint positions it is in
                self.targets = np.asarray(state["joint_pos"], np.float32)[self.action_joint_ids]
            targets = np.clip(self.targets + self.action_scale * action, *self.action_limits.T)
        else:
            targets = self.action_offset + self.action_scale * action
            if self.action_clamp:
                targets = np.clip(targets, *self.action_limits.T)
        if not math.isfinite(sum(targets.tolist())):
            raise NonFiniteError("non-finite policy output (NaN or Inf) for a finite observation: the ONNX model "
                                 "is broken. Re-export it (legion export verifies the file before writing it).")
        self.last_obs, self.last_action, self.hidden = obs, action.astype(np.float32), hidden
        if self.action_delta:
            self.targets = targets.copy()  # the caller may write into what it gets
        return targets
