"""`legion export`: a run's policy as ONNX with its contract, verified before it is written.

Writes into ``<run>/exported/`` (or ``out=``):

- ``policy.onnx``: one file, opset 17, dynamic batch axis, the observation normalizer in the
  graph. Input ``obs`` (B, obs_dim), output ``actions`` (B, num_actions), float32; an actor
  that reads images (rsl-rl's CNN model) takes each image group as an input of its own,
  (B, C, H, W) float32, named after the group, after ``obs``. A recurrent
  actor (rsl-rl's RNNModel, LSTM or GRU) adds ``h_in``/``h_out`` (and ``c_in``/``c_out``),
  shaped (layers, B, hidden).
- ``policy_fp16.onnx``: float16 weights and arithmetic, float32 inputs and outputs.
- ``policy.json``: the metadata that is also embedded in each ONNX file's ``metadata_props``
  (one JSON value per key), plus the sha256 of both files and the verification numbers. A
  task-space policy's (``action.task_space``) carries the kinematic chain its IK runs on, which
  the edge runtime evaluates in numpy (the network's output is the pose step, as in training).
- ``robot.mjb`` (a run simulated with sim.solver=mujoco): the robot and its ground as a plain
  MuJoCo model, nominal parameters, exactly as trained: what ``legion bridge`` simulates (and
  what sim2sim runs for a URDF robot). MuJoCo's binary format: the same MuJoCo version loads it.

Verification, at every export (the command fails and writes nothing if any check fails):
``onnx.checker`` (full check); onnxruntime against the torch policy on observations drawn from
the environment (max |diff| <= 1e-5 for fp32, <= 1e-2 for fp16); every operator in the set
TensorRT's ONNX parser supports (``TENSORRT_OPS``); the edge runtime loads the file.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from legion.sim2real.deploy.contract import (
    METADATA_VERSION,
    Action,
    Actuator,
    Camera,
    Command,
    ExportedFile,
    Fall,
    HeightScan,
    ImageInput,
    Observation,
    ObservationTerm,
    Onnx,
    PolicyContract,
    Recurrent,
    TaskSpace,
    TaskSpaceChain,
    Tracking,
    TrackingTerm,
)
from legion.sim2real.deploy.contract import ActuatorNetwork as ActuatorNetworkEntry
from legion.sim2real.deploy.policy import IMAGE_TERMS

if TYPE_CHECKING:
    from legion.api import LoadedRun

OPSET = 17
FP32_TOLERANCE = 1e-5
FP16_TOLERANCE = 1e-2

# Operators TensorRT's ONNX parser (onnx-tensorrt, TensorRT 8.4+, as on JetPack 5/6) supports,
# default ONNX domain. An exported graph may use these only.
TENSORRT_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast Ceil Celu Clip
Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear Div Dropout
Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather GatherElements GatherND Gemm GlobalAveragePool
GlobalLpPool GlobalMaxPool Greater GreaterOrEqual HardSigmoid Identity If ImageScaler InstanceNormalization IsNaN
LRN LSTM LeakyRelu Less LessOrEqual Log LogSoftmax Loop LpNormalization LpPool MatMul Max MaxPool Mean Min Mul
Neg Not Or PRelu Pad ParametricSoftplus Pow QuantizeLinear RNN RandomUniform RandomUniformLike Range ReduceL1
ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu
Reshape Resize ReverseSequence Round ScaledTanh Scan Scatter ScatterElements ScatterND Selu Shape Sigmoid Sign
Sin Sinh Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu
Tile TopK Transpose Unsqueeze Upsample Where Xor
""".split())


class ExportError(RuntimeError):
    """An export check failed; nothing was written."""


def legion_version() -> str:
    import legion

    return legion.__version__


# --- metadata --------------------------------------------------------------------------------
def build_metadata(loaded: LoadedRun, actor) -> PolicyContract:
    """Everything a robot needs besides the network (:class:`PolicyContract`, plain JSON values:
    lists, floats, str), from a loaded run (:class:`legion.api.LoadedRun`): its env, its runner and
    its config."""
    import torch

    from legion.sim2real.deploy.actuator_network import load as load_network
    from legion.tasks.mdp import rewards, terminations
    from legion.tasks.mdp.commands import PoseCommand
    from legion.tasks.sim.scene import joint_actuators

    env, settings = loaded.env, loaded.cfg
    robot, task = env.robot, settings.task
    layout = env.observation_layout()
    terms, start = [], 0
    for group in actor.obs_groups:  # the actor's input is its groups concatenated in this order
        for entry in layout[group]:
            terms.append(ObservationTerm(name=entry["name"], func=entry["func"], group=group, start=start,
                                         size=entry["size"], scale=entry["scale"], clip=entry["clip"],
                                         params=entry["params"]))
            start += entry["size"]
    images, cameras = [], {}
    for group in getattr(actor, "obs_groups_2d", []):  # rsl-rl's CNNModel: its image groups, beside obs_groups
        unknown = [e["name"] for e in layout[group] if e["func"] not in IMAGE_TERMS]
        if unknown:
            raise ExportError(f"the actor reads image terms {unknown} of group '{group}', which no robot's camera "
                              f"gives (the edge runtime builds {sorted(IMAGE_TERMS)}): give them to the critic or a "
                              "teacher and distil a student that sees depth or RGB.")
        shape = list(env.get_observations()[group].shape[1:])
        images.append(ImageInput(group=group, shape=shape, terms=[
            ObservationTerm(name=e["name"], func=e["func"], group=group, start=e["start"], size=e["size"],
                            scale=e["scale"], clip=e["clip"], params=e["params"]) for e in layout[group]]))
        for entry in layout[group]:
            name = entry["params"]["camera"]
            cameras[name] = camera_contract(task.scene.cameras[name], env.step_dt)
    # The enabled event terms as configured, with the ranges in effect at the checkpoint (a
    # curriculum may have moved them).
    randomization = {}
    for name, entry in env.state_dict()["randomization"].items():
        spec = dataclasses.asdict(task.events[name])
        randomization[name] = {**{k: v for k, v in spec.items() if v is not None}, **entry}
    tracking = Tracking(lin_vel_xy=None, ang_vel_z=None)
    for term in env.reward_terms:
        for key, func in (("lin_vel_xy", rewards.track_lin_vel_xy_exp), ("ang_vel_z", rewards.track_ang_vel_z_exp)):
            if term.func is func:
                setattr(tracking, key, TrackingTerm(weight=term.weight, std=term.params["std"]))
    fall = Fall(contact_bodies=[], contact_threshold=None, min_base_height=None)
    for term in env.termination_terms:
        if term.func is terminations.illegal_contact:
            fall.contact_bodies += [robot.body_names[i] for i in term.params["bodies"].tolist()]
            fall.contact_threshold = term.params["threshold"]
        elif term.func is terminations.base_height_below:
            fall.min_base_height = term.params["height"]
    scan = next((t for t in terms if t.func == "height_scan"), None)
    height_scan = None
    if scan is not None:  # the points a robot reports terrain heights at, in this order
        from legion.tasks.mdp.observations import scan_points

        params = scan.params
        points = scan_points(tuple(params["size"]), float(params["resolution"]))
        height_scan = HeightScan(points=[[round(v, 6) for v in p] for p in points.tolist()], offset=params["offset"],
                                 frame="base heading (yaw only): x forward, y left [m]",
                                 value="terrain height - base height at each point [m] (robot state key height_scan)")
    recurrent = None
    if getattr(actor, "is_recurrent", False):
        rnn = actor.rnn.rnn
        recurrent = Recurrent(type="lstm" if isinstance(rnn, torch.nn.LSTM) else "gru", hidden_size=rnn.hidden_size,
                              num_layers=rnn.num_layers)
    state_names = [] if not recurrent else ["h_in", "c_in"] if recurrent.type == "lstm" else ["h_in"]
    inputs = ["obs"] + [image.group for image in images] + state_names
    outputs = ["actions"] + [name.replace("_in", "_out") for name in state_names]

    def floats(t: torch.Tensor) -> list:
        # 7 significant digits: float32's precision, without float32's decimal noise (23.7000008)
        return [float(f"{v:.7g}") for v in t.reshape(-1).tolist()] if t.dim() <= 1 else [floats(r) for r in t]

    nominal = robot.defaults  # world 0 holds the model's own values before randomization
    scale = env.action.scale  # one value, or one per joint (robot.action_scale)
    task_space = None
    if task.action.type == "task_space":  # what the runtime's IK needs (sim2real/deploy/policy.py TaskSpaceTargets)
        term, chain = env.action, env.action.chain
        task_space = TaskSpace(
            body=chain.body, body_id=robot.body_names.index(chain.body), mode=term.mode,
            rotation_scale=term.rotation_scale, damping=term.damping,  # (its position scale: action.scale)
            max_error=term.max_error, gripper_joint_ids=term.gripper_ids.tolist(),
            chain=TaskSpaceChain(joint_ids=chain.joint_ids, revolute=chain.revolute, axes=floats(chain.axes),
                                 parent_frames=floats(chain.parent_frames),
                                 inv_child_frames=floats(chain.inv_child_frames), tip=floats(chain.tip)))
    action = Action(type=task.action.type, joint_ids=env.action.joint_ids.tolist(),
                    scale=floats(scale) if isinstance(scale, torch.Tensor) else float(scale),
                    offset=floats(env.action.offset[0]), clip=env.action.clip,
                    clamp_to_limits=env.action.clamp_to_limits, max_target_rate=env.action.max_target_rate,
                    task_space=task_space)
    command = None
    if task.command is not None:
        configured = task.command
        command = Command(type=configured.type, ranges={k: list(v) for k, v in configured.ranges.items()},
                          resampling_time_s=configured.resampling_time_s,
                          standing_fraction=configured.standing_fraction, entity=configured.entity,
                          body=configured.body,
                          # a pose's quaternion takes this one's sign
                          quat_reference=floats(env.command.reference) if isinstance(env.command, PoseCommand)
                          else None)
    return PolicyContract(
        metadata_version=METADATA_VERSION,
        legion_version=legion_version(),
        task=task.name,
        robot=task.scene.robot.file,
        checkpoint=loaded.checkpoint.name,
        iteration=int(loaded.runner.iteration),
        config_sha256=hashlib.sha256((loaded.run / "config.yaml").read_bytes()).hexdigest(),
        joint_names=list(robot.joint_names),
        default_joint_pos=floats(robot.default_joint_pos[0]),
        default_root_height=task.scene.robot.root_height,
        # The base's centre of mass in its frame: the base velocity training observed is its velocity
        # (sim2real/deploy/policy.py com_velocity), a state estimator's is the frame origin's.
        base_com=floats(nominal["body_com"][0, 0]) if robot.floating_base else [0.0, 0.0, 0.0],
        action=action,
        joint_stiffness=floats(nominal["joint_stiffness"][0]),
        joint_damping=floats(nominal["joint_damping"][0]),
        effort_limits=floats(robot.effort_limits),
        joint_armature=floats(nominal["joint_armature"][0]),
        joint_friction=floats(nominal["joint_friction"][0]),
        # Per joint, the drive the policy was trained with (configs/robot/): implicit PD, a DC motor
        # whose torque falls from saturation_effort at stall to zero at velocity_limit, or an actuator
        # network (its parameters in actuator_networks: the runtime needs no file of it).
        actuators=[Actuator(model="dc_motor", saturation_effort=a.saturation_effort, velocity_limit=a.velocity_limit)
                   if a is not None and a.model == "dc_motor" else
                   Actuator(model="network", saturation_effort=None, velocity_limit=None,
                            network=[n["file"] for n in env.sim.networks].index(a.network))
                   if a is not None and a.model == "network" else
                   Actuator(model="implicit", saturation_effort=None, velocity_limit=None)
                   for a in joint_actuators(task.scene.robot, robot.joint_names)],
        actuator_networks=[ActuatorNetworkEntry(**load_network(n["path"]).contract()) for n in env.sim.networks],
        joint_limits=floats(robot.joint_limits),
        control_dt=float(env.step_dt),
        physics_dt=float(env.sim.physics_dt),
        decimation=int(env.sim.decimation),
        observation=Observation(groups=list(actor.obs_groups), size=start, terms=terms, images=images),
        command=command,
        randomization=randomization,
        ground_friction=task.scene.ground.friction if task.scene.ground else None,
        tracking=tracking,
        fall=fall,
        height_scan=height_scan,
        cameras=cameras,
        normalizer=("in the graph: (obs - mean) / (std + eps)" + (", each image per channel alike" if images else ""))
        if actor.obs_normalization else "none",
        onnx=Onnx(opset=OPSET, inputs=inputs, outputs=outputs, recurrent=recurrent, obs_dim=start,
                  num_actions=env.num_actions),
    )


def camera_contract(cam, control_dt: float) -> Camera:
    """A ``task.scene.cameras`` entry as the contract states it (the pinhole's intrinsics from its
    vertical field of view: fy = (H / 2) / tan(fov / 2), square pixels, centred)."""
    import math

    f = cam.height / 2 / math.tan(math.radians(cam.fov) / 2)
    return Camera(body=cam.body, pos=list(cam.pos), quat=list(cam.quat), width=cam.width, height=cam.height,
                  fov=cam.fov, intrinsics=[round(f, 6), round(f, 6), cam.width / 2, cam.height / 2],
                  near=cam.near, far=cam.far, frame_period_s=round(cam.period * control_dt, 9),
                  depth="(H, W) float32 planar depth [m] along the optical axis; 0, or outside [near, far]: no return",
                  rgb="(H, W, 3) uint8 sRGB")


# --- export and verification -----------------------------------------------------------------
def to_onnx(actor, metadata: PolicyContract | None = None):
    """The deterministic actor (normalizer included) as an ``onnx.ModelProto``, with the metadata
    in ``metadata_props`` if given."""
    import onnx
    import torch

    module = actor.as_onnx(verbose=False)  # rsl-rl's export wrapper: normalizer -> (RNN) -> MLP -> mean
    module = module.to("cpu").eval()
    inputs, outputs = module.input_names, module.output_names  # obs [h_in [c_in]] -> actions [h_out [c_out]]
    images = list(getattr(actor, "obs_groups_2d", []))  # CNN inputs after obs, batch first
    dynamic_axes = {name: {0: "batch"} for name in ("obs", "actions", *images)}
    dynamic_axes.update({name: {1: "batch"} for name in inputs[1 + len(images):] + outputs[1:]})
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        # dynamo=False: the TorchScript exporter (~15x faster to export than dynamo's, needs no onnxscript).
        # A file-like object is documented for f; torch 2.13's annotation names paths only.
        torch.onnx.export(module, module.get_dummy_inputs(), buffer, opset_version=OPSET,  # pyright: ignore[reportArgumentType]
                          input_names=inputs, output_names=outputs, dynamic_axes=dynamic_axes, dynamo=False)
    model = onnx.load_from_string(buffer.getvalue())
    return with_metadata(model, metadata) if metadata else model


def with_metadata(model, metadata: PolicyContract):
    """``model`` with the contract in its ``metadata_props``, one JSON value per top-level field."""
    del model.metadata_props[:]
    for key, value in metadata.embedded().items():
        model.metadata_props.add(key=key, value=json.dumps(value))
    model.producer_name, model.producer_version = "legion-rl", metadata.legion_version
    model.doc_string = f"legion-rl policy for task {metadata.task} ({metadata.checkpoint})"
    return model


def to_fp16(model, metadata: PolicyContract | None = None):
    """float16 weights and arithmetic; inputs and outputs stay float32 (Cast nodes at the edges)."""
    from onnxruntime.transformers import float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = float16.convert_float_to_float16(model, keep_io_types=True)
    # The converter appends its input Casts after the nodes that read them; ONNX wants
    # topological order (onnx.checker refuses the file otherwise).
    known = {i.name for i in half.graph.input} | {i.name for i in half.graph.initializer} | {""}
    pending, ordered = list(half.graph.node), []
    while pending:
        ready = [n for n in pending if all(name in known for name in n.input)]
        if not ready:
            raise ExportError("fp16 conversion produced a graph with a cycle or a dangling input")
        for node in ready:
            ordered.append(node)
            known.update(node.output)
        pending = [n for n in pending if n not in ready]
    del half.graph.node[:]
    half.graph.node.extend(ordered)
    return with_metadata(half, metadata) if metadata else half


def check_model(model, name: str) -> list[str]:
    """onnx.checker (full) and TensorRT's operator set; returns the operators used."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as e:
        raise ExportError(f"{name}: onnx.checker failed: {e}") from e
    ops = sorted({(node.domain or "ai.onnx", node.op_type) for node in model.graph.node})
    unsupported = [f"{domain}::{op}" for domain, op in ops if domain != "ai.onnx" or op not in TENSORRT_OPS]
    if unsupported:
        raise ExportError(f"{name}: operators {unsupported} are outside TensorRT's ONNX parser set "
                          "(sim2real/export.py TENSORRT_OPS): the engine build on the robot would fail.")
    return [op for _, op in ops]


def reference_actions(actor, observations: list) -> tuple[list, list]:
    """The torch policy's deterministic actions (and final recurrent state) on a sequence of TensorDicts."""
    import torch

    actions = []
    with torch.inference_mode():
        actor.reset()
        for obs in observations:
            actions.append(actor(obs).cpu().numpy())
        hidden = actor.get_hidden_state()
    hidden = [] if hidden is None else [h.cpu().numpy() for h in (hidden if isinstance(hidden, tuple) else (hidden,))]
    return actions, hidden


def compare(model_bytes: bytes, actor, observations: list, expected: tuple, tolerance: float, name: str) -> float:
    """Max |onnxruntime - torch| over actions (and recurrent state) on the observation sequence.

    MLPs run the whole set as one batch and also row by row for a few rows (batch 1).
    """
    import numpy as np
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    input_names = [i.name for i in session.get_inputs()]
    flat = [torch.cat([obs[g] for g in actor.obs_groups], dim=-1).cpu().numpy() for obs in observations]
    images = list(getattr(actor, "obs_groups_2d", []))
    actions, hidden = expected
    if len(input_names) == 1 + len(images):  # feed-forward: one batch of everything, then rows one by one
        def feeds(rows: slice) -> dict:
            return {"obs": np.concatenate(flat)[rows],
                    **{g: np.concatenate([obs[g].cpu().numpy() for obs in observations])[rows] for g in images}}

        got = session.run(None, feeds(slice(None)))[0]
        error = float(np.abs(got - np.concatenate(actions)).max())
        for row in range(min(4, len(flat[0]))):
            single = session.run(None, feeds(slice(row, row + 1)))[0]
            error = max(error, float(np.abs(single - actions[0][row:row + 1]).max()))
    else:
        batch = flat[0].shape[0]
        rnn, state_names = actor.rnn.rnn, input_names[1 + len(images):]
        state = [np.zeros((rnn.num_layers, batch, rnn.hidden_size), np.float32) for _ in state_names]
        error = 0.0
        for obs, step, ref in zip(flat, observations, actions):
            out = session.run(None, {"obs": obs, **{g: step[g].cpu().numpy() for g in images},
                                     **dict(zip(state_names, state))})
            state = out[1:]
            error = max(error, float(np.abs(out[0] - ref).max()))
        for got_h, ref_h in zip(state, hidden):
            error = max(error, float(np.abs(got_h - ref_h).max()))
    if not error <= tolerance:  # also catches NaN
        raise ExportError(f"{name}: onnxruntime differs from the torch policy by {error:.3g} (limit {tolerance:g}) "
                          f"on {sum(len(f) for f in flat)} observations from the environment.")
    return error


def sample_observations(env, actor, steps: int) -> list:
    """TensorDicts of the actor's observations along ``steps`` deterministic policy steps in ``env``."""
    import torch

    observations = []
    obs = env.get_observations()
    with torch.inference_mode():
        actor.reset()
        for _ in range(steps):
            observations.append(obs.clone())
            obs, _, dones, _ = env.step(actor(obs))
            actor.reset(dones)
    return observations


def export_policy(actor, metadata: PolicyContract, observations: list, out_dir: Path) -> dict:
    """Exports, verifies, then writes policy.onnx, policy_fp16.onnx and policy.json into ``out_dir``.

    Returns the verification report. Raises :class:`ExportError` (writing nothing) if a check fails.
    """

    from legion.sim2real.deploy.policy import OnnxPolicy

    actor.reset()  # drops any recurrent state (inference tensors do not deep-copy)
    actor = copy.deepcopy(actor).cpu().eval()
    observations = [obs.to("cpu") for obs in observations]
    expected = reference_actions(actor, observations)
    model = to_onnx(actor, metadata)
    half = to_fp16(model, metadata)
    report: dict = {"observations": sum(obs.batch_size[0] for obs in observations)}
    files = {}
    for name, proto, tolerance in (("policy.onnx", model, FP32_TOLERANCE), ("policy_fp16.onnx", half, FP16_TOLERANCE)):
        ops = check_model(proto, name)
        data = proto.SerializeToString()
        error = compare(data, actor, observations, expected, tolerance, name)
        files[name] = data
        report[name] = {"max_abs_diff": error, "tolerance": tolerance, "operators": ops, "bytes": len(data)}

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = {name: out_dir / f".{name}.tmp" for name in files}
    for name, data in files.items():
        tmp[name].write_bytes(data)
        try:  # the edge runtime itself must accept the file (metadata consistency included)
            OnnxPolicy(tmp[name], providers=["CPUExecutionProvider"], check_hash=False)
        except Exception as e:
            for path in tmp.values():
                path.unlink(missing_ok=True)
            raise ExportError(f"{name}: the edge runtime refuses it: {e}") from e
    sidecar = dataclasses.replace(
        metadata, files={name: ExportedFile(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
                         for name, data in files.items()},
        verification=copy.deepcopy(report))
    for name, path in tmp.items():
        path.replace(out_dir / name)
    (out_dir / "policy.json").write_text(sidecar.to_json())
    return report


def export_run(run: Path, checkpoint=None, out_dir: Path | None = None, steps: int = 50, overrides=(),
               loaded=None) -> tuple[Path, dict]:
    """``legion export`` as a function: returns (output folder, verification report).

    ``loaded`` reuses a :func:`legion.api.load_run` result instead of building one.
    """
    from legion.api import load_run

    loaded = loaded or load_run(run, checkpoint, overrides)
    actor = loaded.runner.policy
    actor.eval()
    metadata = build_metadata(loaded, actor)
    observations = sample_observations(loaded.env, actor, steps)
    out_dir = Path(out_dir) if out_dir else Path(run) / "exported"
    report = export_policy(actor, metadata, observations, out_dir)
    solver = loaded.env.sim.solver
    if hasattr(solver, "mujoco_model"):  # the robot as trained, for plain MuJoCo: sim2sim, the DDS bridge
        import mujoco

        tmp = out_dir / ".robot.mjb.tmp"
        mujoco.mj_saveModel(solver.mujoco_model(), str(tmp), None)
        report["robot.mjb"] = {"bytes": tmp.stat().st_size, "mujoco": mujoco.__version__}
        tmp.replace(out_dir / "robot.mjb")
    return out_dir, report


def summary(run: Path, out_dir: Path, report: dict) -> str:
    """What ``legion export`` prints: files, verification numbers, the policy's contract."""
    meta = PolicyContract.load(out_dir / "policy.json")
    lines = [f"[legion] exported {meta.checkpoint} of {run} -> {out_dir}"]
    for name in ("policy.onnx", "policy_fp16.onnx"):
        r = report[name]
        lines.append(f"  {name:17s} {r['bytes'] / 1e6:6.2f} MB  onnxruntime vs torch max |diff| "
                     f"{r['max_abs_diff']:.2e} (limit {r['tolerance']:g}) on {report['observations']} env observations")
    lines.append(f"  operators         {', '.join(report['policy.onnx']['operators'])} "
                 "(all in TensorRT's ONNX parser set)")
    if "robot.mjb" in report:
        lines.append(f"  robot.mjb         {report['robot.mjb']['bytes'] / 1e6:6.2f} MB  the robot as trained, in "
                     f"plain MuJoCo {report['robot.mjb']['mujoco']} (legion bridge, sim2sim)")
    obs, recurrent = meta.observation, meta.onnx.recurrent
    lines.append(f"  policy.json       {len(meta.joint_names)} joints, obs {obs.size} = "
                 + " + ".join(f"{t.name}[{t.size}]" for t in obs.terms)
                 + f", control dt {meta.control_dt:g} s, recurrent: "
                 + (f"{recurrent.type}, {recurrent.num_layers} x {recurrent.hidden_size}" if recurrent else "no"))
    return "\n".join(lines)
