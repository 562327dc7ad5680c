"""The policy contract: what ``legion export`` promises a robot about a policy, as one typed,
versioned dataclass tree (:class:`PolicyContract`).

It is ``policy.json`` beside the ONNX files, and the same values embedded in each ONNX file's
``metadata_props`` (one JSON value per top-level field, without ``files`` and ``verification``).
``legion export`` builds it (``sim2real/export.py build_metadata``); the edge runtime, sim2sim,
deploy and the DDS bridge read it through :meth:`PolicyContract.from_dict`, which refuses a file
with a missing, unknown or mistyped field naming the field's path and the file, and a file of a
version this runtime cannot read naming the versions it reads.

Versions: :data:`METADATA_VERSION` is what ``legion export`` writes; :data:`READABLE_VERSIONS`
are read, the older ones migrated on load (:func:`migrate`) by filling what they lack with the
values that mean "absent" (what the runtime assumed before the field existed). Version-2 exports
also gained fields over time without a bump (base_com, actuators, the action's clamp, rate limit
and IK, ...); a version-2 file from before one is filled the same way. From here on, a change of
the layout (a field added, removed, renamed or retyped) bumps :data:`METADATA_VERSION` and adds a
migration from the previous one: a reader refuses fields it does not know.

``policy.schema.json`` beside this file is the JSON schema of the layout, generated from these
dataclasses (:func:`json_schema`); tests/test_sim2real.py fails when it is stale. Regenerate it
(from the checkout, after changing a dataclass) with::

    python -c "import legion.sim2real.deploy.contract as c; c.write_schema()"

Imports the standard library only (the edge runtime installs without torch).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METADATA_VERSION = 4  # the layout legion export writes (2 added tracking terms, fall conditions, term params; 3 images;
# 4 actuator networks)
READABLE_VERSIONS = tuple(range(1, METADATA_VERSION + 1))  # what this runtime reads; older ones migrated (migrate)
SCHEMA_FILE = Path(__file__).with_name("policy.schema.json")  # the JSON schema of the layout (json_schema)


class ContractError(ValueError):
    """A file that is not a policy contract this runtime reads: the message names the file, the
    field's path (``action.scale``, ``observation.terms[3].size``), what it must be and what to do."""


REEXPORT = "Re-export the policy (legion export run=<run folder>) and copy the whole folder."


# --- the contract ---------------------------------------------------------------------------------
# Units: [rad or m] per joint is rad for a revolute joint and m for a prismatic one (forces and
# torques alike). Per-joint lists follow ``joint_names``.
@dataclass
class TaskSpaceChain:
    """The kinematic chain the task-space action's IK runs on, read from the simulated model."""

    joint_ids: list[int]  # the joints (indices into joint_names) that move the body, root to tip
    revolute: list[bool]  # per chain joint: revolute (else prismatic)
    axes: list[list[float]]  # (k, 3) each joint's unit axis in its own frame
    parent_frames: list[list[list[float]]]  # (k, 4, 4) each joint's frame in its parent body's frame [m]
    inv_child_frames: list[list[list[float]]]  # (k, 4, 4) inverse of each joint's frame in its child body [m]
    tip: list[list[float]]  # (4, 4) the body's frame in the last chain link's frame [m]


@dataclass
class TaskSpace:
    """A task-space action: the policy moves a body's pose, the runtime's differential IK follows it."""

    body: str  # the body whose pose the action moves (e.g. tcp)
    body_id: int  # its index in the robot's bodies (what body_position terms name)
    mode: str  # relative: moved from the pose held | absolute: from the default pose
    rotation_scale: float  # [rad] rotation per unit action (the position's scale is action.scale [m])
    damping: float  # damped least squares' damping [m]
    max_error: float  # per-axis clamp of the position error per step [m]
    gripper_joint_ids: list[int]  # the gripper's joints (open/closed by the last action's sign); [] without one
    chain: TaskSpaceChain  # the arm's kinematic chain


@dataclass
class Action:
    """How the network's output becomes joint targets."""

    type: str  # joint_position | joint_position_delta | joint_effort | task_space
    joint_ids: list[int]  # the joints the action drives (indices into joint_names)
    scale: float | list[float]  # target = offset + scale * action [rad or m per unit]; one, or one per action joint
    offset: list[float]  # per action joint [rad or m] (joint_position: the default pose)
    clip: float | None  # the raw action is clipped to [-clip, clip] first; null: no clip
    clamp_to_limits: bool  # joint_position: the targets are clamped to the joint limits
    max_target_rate: float | None  # [rad/s or m/s] most a target moves per second; null: no limit
    task_space: TaskSpace | None  # type task_space: the IK's body and chain; else null


@dataclass
class Actuator:
    """The drive a joint was trained with."""

    model: str  # implicit: PD clipped to the effort limit | dc_motor: PD clipped by the torque-speed line | network
    saturation_effort: float | None  # dc_motor: stall torque [N m or N]; else null
    velocity_limit: float | None  # dc_motor: speed at which the torque reaches zero [rad/s or m/s]; else null
    network: int | None = None  # network: its index in actuator_networks; else null


@dataclass
class ActuatorNetwork:
    """An actuator network (sim2real/deploy/actuator_network.py): per joint, ``history`` position
    errors ``q* - q`` then as many velocities, now first, ``stride_s`` apart, normalized by
    ``input_mean``/``input_std``, through the layers (``activation`` between them), times
    ``output_scale``: the torque [N m], clipped to the joint's effort limit."""

    history: int  # instants of error and velocity
    stride_s: float  # [s] between two instants
    activation: str  # softsign | tanh | relu
    output_scale: float  # [N m] per unit of the last layer's output
    input_mean: list[float]  # (2 history,)
    input_std: list[float]  # (2 history,)
    weights: list[list[list[float]]]  # per layer (out, in)
    biases: list[list[float]]  # per layer (out,)


@dataclass
class ObservationTerm:
    """One term of the observation, computed on the robot by the training function's edge version."""

    name: str  # the task's name for the term
    func: str  # the training function's name (sim2real/deploy/policy.py OBSERVATION_TERMS)
    group: str  # the observation group it belongs to
    start: int  # its first index in the policy's input
    size: int  # number of values
    scale: float | list[float]  # multiplies the clipped value; one, or one per value
    clip: float | None  # the value is clipped to [-clip, clip] before scaling; null: no clip
    params: dict[str, Any]  # the term's params as trained (index lists, sizes, offsets)


@dataclass
class ImageInput:
    """An observation group of images: one ONNX input of its own, (B, C, H, W) float32, its terms'
    channels stacked in order (each term: ``start`` its first channel, ``size`` its channels)."""

    group: str  # the observation group, and the ONNX input's name
    shape: list[int]  # (C, H, W)
    terms: list[ObservationTerm]  # depth_image (1 channel) or rgb_image (3), params {camera: name}


@dataclass
class Observation:
    """The policy's input: its vector groups' terms, concatenated in order (ONNX input ``obs``), and
    its image groups (their own inputs)."""

    groups: list[str]  # the vector observation groups the actor reads, in order
    size: int  # total number of values (the ONNX input's width)
    terms: list[ObservationTerm]  # in input order
    images: list[ImageInput]  # the image groups, in the ONNX inputs' order after obs; [] for none


@dataclass
class Camera:
    """A camera a policy sees through, as trained: an ideal pinhole camera (square pixels, the
    principal point at the image's centre), rendered by ray tracing."""

    body: str | None  # the robot body it is mounted on; null: fixed in the world (env) frame
    pos: list[float]  # (3,) its position in that frame [m]
    quat: list[float]  # (4,) (x, y, z, w) its orientation in that frame; the camera looks along its +x, z up
    width: int  # [pixels]
    height: int  # [pixels]
    fov: float  # vertical field of view [deg]
    intrinsics: list[float]  # (fx, fy, cx, cy) [pixels]: the same pinhole as fov, width and height
    near: float  # [m] depth nearer than this reads as no return
    far: float  # [m] depth farther than this reads as no return; the observation reads no return as far
    frame_period_s: float  # [s] between frames in training (period x control_dt)
    depth: str  # robot state key <camera>/depth, in words
    rgb: str  # robot state key <camera>/rgb, in words


@dataclass
class Command:
    """The task's command as configured (configs/schema.py Command)."""

    type: str  # velocity | pose | position
    ranges: dict[str, list[float]]  # per component: [low, high] sampled in training [m/s, rad/s or m, rad]
    resampling_time_s: float  # [s] between resamples in training
    standing_fraction: float  # velocity: share of exactly-zero commands in training
    entity: str  # pose, position: the scene entity whose body is commanded
    body: str | None  # pose, position: that body; null: the entity's first body
    quat_reference: list[float] | None  # pose: (x, y, z, w) whose hemisphere the target quaternion takes; else null


@dataclass
class TrackingTerm:
    """A velocity-tracking reward term: weight * exp(-error^2 / std^2)."""

    weight: float  # reward weight (per second)
    std: float  # [m/s or rad/s]


@dataclass
class Tracking:
    """The velocity-tracking reward terms, for sim2sim's tracking return."""

    lin_vel_xy: TrackingTerm | None  # base linear velocity in x, y; null: the task has none
    ang_vel_z: TrackingTerm | None  # base yaw rate; null: the task has none


@dataclass
class Fall:
    """The conditions that end an episode as a fall, for sim2sim."""

    contact_bodies: list[str]  # bodies whose ground contact is a fall; [] for none
    contact_threshold: float | None  # [N] contact force that counts; null: no contact condition
    min_base_height: float | None  # [m] base height below which the robot fell; null: none


@dataclass
class HeightScan:
    """The points a policy that scans the terrain reads heights at (robot state key height_scan)."""

    points: list[list[float]]  # (P, 2) [m] in the base's heading frame, in observation order
    offset: float  # [m] subtracted from the base height above the terrain at each point, as in training
    frame: str  # the points' frame, in words
    value: str  # what each reported value is, in words


@dataclass
class Recurrent:
    """A recurrent actor's memory, carried between calls as extra ONNX inputs and outputs."""

    type: str  # lstm (h and c) | gru (h)
    hidden_size: int  # width of each state
    num_layers: int  # layers (each state is shaped (layers, batch, hidden_size))


@dataclass
class Onnx:
    """The ONNX graph's interface."""

    opset: int  # ONNX opset
    inputs: list[str]  # obs, then each image group's, then h_in (and c_in) for a recurrent actor
    outputs: list[str]  # actions, then h_out (and c_out)
    recurrent: Recurrent | None  # null: an MLP
    obs_dim: int  # width of the obs input
    num_actions: int  # width of the actions output


@dataclass
class ExportedFile:
    """One file legion export wrote, so a modified copy is refused."""

    sha256: str  # hex digest of the file's bytes
    bytes: int  # its size [bytes]


@dataclass
class PolicyContract:
    """Everything a robot needs besides the network: ``policy.json`` and, less ``files`` and
    ``verification``, each ONNX file's ``metadata_props``."""

    metadata_version: int  # the layout version the file was written in (see READABLE_VERSIONS)
    legion_version: str  # legion-rl that exported it
    task: str  # the task's name (configs/task)
    robot: str  # the robot model file the task simulated
    checkpoint: str  # the checkpoint file exported
    iteration: int  # its training iteration
    config_sha256: str  # sha256 of the run's config.yaml
    joint_names: list[str]  # the policy's joint order: every per-joint list and robot state follows it
    default_joint_pos: list[float]  # per joint: the default pose [rad or m]
    default_root_height: float | None  # floating base: initial base height [m]; null: the model's
    base_com: list[float]  # (3,) the base's centre of mass in the base frame [m] (training observes its velocity)
    action: Action  # how actions become targets
    joint_stiffness: list[float]  # per joint: PD stiffness kp [N m/rad or N/m]
    joint_damping: list[float]  # per joint: PD damping kd [N m s/rad or N s/m]
    effort_limits: list[float]  # per joint: effort limit [N m or N]
    joint_armature: list[float] | None  # per joint: armature [kg m^2 or kg]; null: not recorded (older exports)
    joint_friction: list[float] | None  # per joint: friction [N m or N]; null: not recorded (older exports)
    actuators: list[Actuator]  # per joint: the drive it was trained with
    actuator_networks: list[ActuatorNetwork]  # the networks of the actuators whose model is network
    joint_limits: list[list[float]]  # per joint: [lower, upper] [rad or m]
    control_dt: float  # policy period [s]
    physics_dt: float  # physics step in training [s]
    decimation: int  # physics steps per policy step
    observation: Observation  # the policy's input layout
    command: Command | None  # the task's command; null: none
    randomization: dict[str, dict[str, Any]]  # per event term: its config, with the ranges in effect at the checkpoint
    ground_friction: float | None  # the training ground's friction coefficient; null: no ground
    tracking: Tracking  # velocity-tracking reward terms
    fall: Fall  # fall conditions
    height_scan: HeightScan | None  # the height-scan points; null: the policy does not scan
    cameras: dict[str, Camera]  # the cameras the policy's image inputs come from, by name; {} for none
    normalizer: str  # the observation normalizer, in words (it is inside the ONNX graph)
    onnx: Onnx  # the graph's inputs and outputs
    files: dict[str, ExportedFile] | None = None  # policy.json only: per ONNX file, its digest
    verification: dict[str, Any] | None = None  # policy.json only: legion export's checks of the files

    SIDECAR_ONLY: typing.ClassVar[tuple[str, ...]] = ("files", "verification")  # not in the ONNX files

    @classmethod
    def from_dict(cls, data: Any, where: str | Path = "policy.json") -> PolicyContract:
        """The contract in ``data`` (parsed JSON, any readable version, migrated), checked field by
        field. Raises :class:`ContractError` naming ``where`` and the field otherwise."""
        return _parse(PolicyContract, migrate(data, where), "", str(where))

    @classmethod
    def from_json(cls, text: str, where: str | Path = "policy.json") -> PolicyContract:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ContractError(f"{where}: not JSON ({e}). {REEXPORT}") from e
        return cls.from_dict(data, where)

    @classmethod
    def load(cls, path: str | Path) -> PolicyContract:
        """Reads and checks a ``policy.json``."""
        return cls.from_json(Path(path).read_text(), path)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; ``files`` and ``verification`` only where set (policy.json's)."""
        data = dataclasses.asdict(self)
        return {k: v for k, v in data.items() if not (k in self.SIDECAR_ONLY and v is None)}

    def embedded(self) -> dict[str, Any]:
        """What each ONNX file's ``metadata_props`` holds: the contract less ``files`` and ``verification``."""
        return {k: v for k, v in self.to_dict().items() if k not in self.SIDECAR_ONLY}

    def to_json(self) -> str:
        """Indented JSON with each list of numbers or names on one line (readable per-joint lists)."""
        data = json.loads(json.dumps(self.to_dict()))  # tuples as lists, as a reader sees them
        text = json.dumps(data, indent=2)
        compact = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]",
                         lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
        return (compact if json.loads(compact) == data else text) + "\n"


# --- reading older versions ------------------------------------------------------------------------
def migrate(data: Any, where: str | Path = "policy.json") -> dict:
    """``data`` (a parsed policy.json or ONNX metadata) in the current layout: a copy with what an
    older file lacks filled with the values that mean "absent" (what the runtime assumed before the
    field existed). Raises :class:`ContractError` for JSON that is no legion policy file or a version
    this runtime does not read."""
    readable = ", ".join(map(str, READABLE_VERSIONS))
    if not isinstance(data, dict):
        raise ContractError(f"{where}: not a legion policy file: expected a JSON object with metadata_version "
                            f"(this runtime reads versions {readable}), got {_json_kind(data)}. Was it written by "
                            "legion export?")
    if "metadata_version" not in data:
        raise ContractError(f"{where}: metadata_version: missing, so this is no legion policy file (legion export "
                            f"writes metadata_version {METADATA_VERSION}; this runtime reads versions {readable}). "
                            "Was it written by legion export?")
    version = data["metadata_version"]
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > METADATA_VERSION
        raise ContractError(f"{where}: metadata_version: {version!r} is not a version this runtime reads "
                            f"({readable}). " + ("It was exported by a newer legion-rl: update legion-rl on the robot "
                                                 "(pip install -U 'legion-rl[deploy]')." if newer else REEXPORT))
    data = copy.deepcopy(data)
    if version == 1:
        _migrate_v1(data)
    if version <= 2:
        _fill_version_2_additions(data)
        _migrate_v2(data)
    if version <= 3:  # 4 added actuator networks: none before
        data.setdefault("actuator_networks", [])
        for actuator in _dicts(data.get("actuators")):
            actuator.setdefault("network", None)
    return data


def _migrate_v1(data: dict) -> None:
    """Version 1 lacked tracking terms, fall conditions and term params, and named the command
    ``commands`` (the task config's section of velocity ranges)."""
    commands = data.pop("commands", None)
    if isinstance(commands, dict) and "command" not in data:
        data["command"] = {"type": "velocity", "ranges": {k: v for k, v in commands.items() if isinstance(v, list)},
                           "resampling_time_s": commands.get("resampling_time_s", 10.0),
                           "standing_fraction": commands.get("standing_fraction", 0.0)}
    data.setdefault("command", None)
    data.setdefault("tracking", {"lin_vel_xy": None, "ang_vel_z": None})
    data.setdefault("fall", {"contact_bodies": [], "contact_threshold": None, "min_base_height": None})
    for term in _dicts((data.get("observation") or {}).get("terms")):
        term.setdefault("params", {})


def _fill_version_2_additions(data: dict) -> None:
    """Fields version-2 exports gained over time (a file from before one lacks it), as absent: the
    runtime took the base frame origin's velocity as it came (base_com zero), every drive as an
    implicit PD, targets unclamped and unlimited in rate, no IK, no height scan."""
    data.setdefault("base_com", [0.0, 0.0, 0.0])
    data.setdefault("joint_armature", None)
    data.setdefault("joint_friction", None)
    joints = data.get("joint_names")
    data.setdefault("actuators", [{"model": "implicit"} for _ in joints] if isinstance(joints, list) else None)
    for actuator in _dicts(data["actuators"]):
        actuator.setdefault("saturation_effort", None)
        actuator.setdefault("velocity_limit", None)
    data.setdefault("height_scan", None)
    if isinstance(data.get("action"), dict):
        for key, absent in (("clamp_to_limits", False), ("max_target_rate", None), ("task_space", None)):
            data["action"].setdefault(key, absent)
    if isinstance(data.get("command"), dict):
        for key, absent in (("entity", "robot"), ("body", None), ("quat_reference", None)):
            data["command"].setdefault(key, absent)


def _migrate_v2(data: dict) -> None:
    """Version 2 had no image inputs and no cameras."""
    if isinstance(data.get("observation"), dict):
        data["observation"].setdefault("images", [])
    data.setdefault("cameras", {})


def _dicts(values: Any) -> list[dict]:
    return [v for v in values if isinstance(v, dict)] if isinstance(values, list) else []


# --- checking: one walk over the dataclasses' field types -----------------------------------------
def _parse(hint: Any, value: Any, path: str, where: str) -> Any:
    """``value`` as ``hint`` says (a dataclass, list[...], dict[str, ...], a union, str, int, float,
    bool, None or Any); raises ContractError naming ``path`` otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        # The member of the value's JSON kind, so an error deep inside it names its own path.
        members = [a for a in args if a is not type(None) and _json_kind(value) == _kind_of(a)]
        if len(members) == 1:
            return _parse(members[0], value, path, where)
        for member in members:  # (several of one kind: the first that takes it)
            try:
                return _parse(member, value, path, where)
            except ContractError:
                pass
    elif dataclasses.is_dataclass(hint) and isinstance(hint, type) and isinstance(value, dict):
        known = {f.name: f for f in dataclasses.fields(hint)}
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ContractError(f"{where}: {path + ': ' if path else ''}unknown fields {unknown} ({hint.__name__} "
                                f"has {list(known)}). {REEXPORT}")
        hints = typing.get_type_hints(hint)
        out = {}
        for name, f in known.items():
            inner = f"{path}.{name}" if path else name
            if name not in value:
                if f.default is dataclasses.MISSING:
                    raise ContractError(f"{where}: {inner}: missing (expected {_describe(hints[name])}). {REEXPORT}")
                continue
            out[name] = _parse(hints[name], value[name], inner, where)
        return hint(**out)
    elif origin is list and isinstance(value, list):
        return [_parse(args[0], v, f"{path}[{i}]", where) for i, v in enumerate(value)]
    elif origin is dict and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _parse(args[1], v, f"{path}.{k}", where) for k, v in value.items()}
    elif _json_kind(value) == _kind_of(hint) and (hint is not int or isinstance(value, int)):
        return value
    raise ContractError(f"{where}: {path}: expected {_describe(hint)}, got {_shown(value)}. {REEXPORT}")


def _json_kind(value: Any) -> str:
    """The JSON kind of a parsed value, as a field type's (_kind_of) and in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def _kind_of(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if hint is bool:
        return "true or false"
    if hint in (int, float):
        return "a number"
    if hint is str:
        return "a string"
    if hint is type(None):
        return "null"
    if origin is list:
        return "a list"
    return "an object"  # a dataclass or dict[str, ...]


def _describe(hint: Any, plural: bool = False) -> str:
    """A field type in words: 'a number or a list of numbers'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a, plural) for a in sorted(args, key=lambda a: a is type(None)))
    if origin is list:
        return ("lists" if plural else "a list") + f" of {_describe(args[0], True)}"
    if origin is dict:
        values = "" if args[1] is Any else f" of {_describe(args[1], True)}"
        return ("objects" if plural else "an object") + values
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return f"objects ({hint.__name__})" if plural else f"an object ({hint.__name__})"
    words = {str: ("a string", "strings"), int: ("an integer", "integers"), float: ("a number", "numbers"),
             bool: ("true or false", "booleans"), type(None): ("null", "nulls")}
    return words[hint][plural] if hint in words else "any JSON value"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- the JSON schema -------------------------------------------------------------------------------
def json_schema() -> dict:
    """The JSON schema (draft 2020-12) of the current layout, from the dataclasses: their field
    types, which fields are required, and each field's comment as its description."""
    defs: dict[str, dict] = {}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "legion-rl policy.json",
              **_object_schema(PolicyContract, defs)}
    schema["properties"]["metadata_version"]["const"] = METADATA_VERSION
    return {**schema, "$defs": dict(sorted(defs.items()))}


def _object_schema(cls: type, defs: dict) -> dict:
    hints, docs = typing.get_type_hints(cls), _field_comments(cls)
    fields = dataclasses.fields(cls)
    return {"type": "object", "description": " ".join((cls.__doc__ or "").split()),
            "properties": {f.name: {"description": docs.get(f.name, ""), **_type_schema(hints[f.name], defs)}
                           for f in fields},
            "required": [f.name for f in fields if f.default is dataclasses.MISSING],
            "additionalProperties": False}


def _type_schema(hint: Any, defs: dict) -> dict:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a, defs) for a in args]}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0], defs)}
    if origin is dict:
        return {"type": "object"} if args[1] is Any else {"type": "object",
                                                          "additionalProperties": _type_schema(args[1], defs)}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # (reserved first: a dataclass may nest itself)
            defs[hint.__name__] = _object_schema(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    names = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
    return {"type": names[hint]} if hint in names else {}


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's trailing ``# comment`` in the class's source: its description in the schema."""
    comments = {}
    for line in inspect.getsource(cls).splitlines():
        match = re.match(r"    (\w+): [^#]*#\s*(.*)$", line)
        if match:
            comments[match.group(1)] = match.group(2).strip()
    return comments


def schema_text() -> str:
    """policy.schema.json's text: what :data:`SCHEMA_FILE` must hold."""
    return json.dumps(json_schema(), indent=2) + "\n"


def write_schema() -> Path:
    """Regenerates :data:`SCHEMA_FILE` from the dataclasses; returns its path."""
    SCHEMA_FILE.write_text(schema_text())
    return SCHEMA_FILE
