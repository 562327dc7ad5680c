"""Sim-to-real: ONNX export and its checks, the edge runtime (parity, safety), a deploy-only venv, sim2sim."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import version

import numpy as np
import onnx
import pytest
import torch

from conftest import ROOT, ctrl_c_inside_a_finalizer, export_untrained_run, legion_in_process, lockstep_errors

LEGION = [sys.executable, "-m", "legion"]


def legion(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*LEGION, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder (config.yaml + model_1.pt) of a quadruped_flat policy with a non-trivial
    observation normalizer, its exported folder, and the live env and runner."""
    return export_untrained_run(tmp_path_factory.mktemp("run"), "task=quadruped_flat")


def robot_state(env, i: int) -> dict:
    """What a robot's sensors and estimator report for world ``i``: velocities in the base frame."""
    robot = env.robot
    return {
        "joint_pos": robot.joint_pos[i].numpy().copy(), "joint_vel": robot.joint_vel[i].numpy().copy(),
        "base_quat": robot.root_quat_w[i].numpy().copy(), "base_pos": robot.root_pos_w[i].numpy().copy(),
        "base_lin_vel": robot.root_link_lin_vel_b[i].numpy(), "base_ang_vel": robot.root_ang_vel_b[i].numpy(),
        "timestamp": 0.0,
    }


def nan_output_policy(trained, folder):
    """The trained policy exported with a NaN in one output bias (unverified, on purpose): its path."""
    import copy

    from legion.sim2real.deploy.contract import PolicyContract
    from legion.sim2real.export import to_onnx

    actor = copy.deepcopy(trained["runner"].ppo.get_policy())
    with torch.no_grad():
        actor.mlp[-1].bias[3] = float("nan")
    onnx.save(to_onnx(actor, PolicyContract.load(trained["out"] / "policy.json")), folder / "policy.onnx")
    return folder / "policy.onnx"


# --- export ------------------------------------------------------------------------------------
def test_export_verifies_fp32_and_fp16(trained):
    report, out = trained["report"], trained["out"]
    assert sorted(p.name for p in out.iterdir()) == ["policy.json", "policy.onnx", "policy_fp16.onnx", "robot.mjb"]
    assert report["policy.onnx"]["max_abs_diff"] <= 1e-5
    assert 0 < report["policy_fp16.onnx"]["max_abs_diff"] <= 1e-2  # fp16 really is half precision
    assert report["observations"] == 40  # 10 policy steps x 4 envs
    assert report["policy.onnx"]["operators"] == ["Div", "Elu", "Gemm", "Sub"]
    model = onnx.load(out / "policy.onnx")
    assert model.opset_import[0].version == 17
    assert not any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"  # dynamic batch
    half = onnx.load(out / "policy_fp16.onnx")
    assert half.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # float32 I/O
    assert half.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert {i.data_type for i in half.graph.initializer} == {onnx.TensorProto.FLOAT16}
    # robot.mjb: the robot as trained in plain MuJoCo, every policy joint in it, at the physics dt
    import mujoco

    from legion.sim2real.deploy.contract import PolicyContract
    from legion.sim2real.deploy.mujoco_robot import find_id

    robot = mujoco.MjModel.from_binary_path(str(out / "robot.mjb"))
    meta = PolicyContract.load(out / "policy.json")
    assert all(find_id(robot, mujoco.mjtObj.mjOBJ_JOINT, n) >= 0 for n in meta.joint_names)
    assert robot.opt.timestep == pytest.approx(meta.physics_dt)


def test_onnx_matches_torch_on_env_observations(trained):
    from legion.sim2real.deploy import OnnxPolicy

    env, actor = trained["env"], trained["runner"].ppo.get_policy()
    with torch.inference_mode():
        obs = env.get_observations()
        expected = actor(obs).numpy()
    policy = OnnxPolicy(trained["out"] / "policy.onnx")
    actions, _ = policy(obs["policy"].numpy())
    assert np.abs(actions - expected).max() <= 1e-5
    single, _ = policy(obs["policy"][2:3].numpy())  # batch 1 through the dynamic axis
    assert np.abs(single - expected[2:3]).max() <= 1e-5
    half, _ = OnnxPolicy(trained["out"] / "policy_fp16.onnx")(obs["policy"].numpy())
    assert np.abs(half - expected).max() <= 1e-2


def test_metadata_round_trip(trained):
    """policy.json and each ONNX file's metadata_props hold one contract, which reads back exactly."""
    from legion.sim2real.deploy import PolicyRunner
    from legion.sim2real.deploy.contract import METADATA_VERSION, PolicyContract

    env, cfg, out = trained["env"], trained["cfg"], trained["out"]
    text = (out / "policy.json").read_text()
    sidecar = json.loads(text)
    contract = PolicyContract.from_json(text)
    assert contract.to_dict() == sidecar and contract.to_json() == text  # exactly what legion export wrote
    assert PolicyContract.from_dict(contract.to_dict()) == contract
    files, verification = sidecar.pop("files"), sidecar.pop("verification")
    for name in ("policy.onnx", "policy_fp16.onnx"):
        embedded = {p.key: json.loads(p.value) for p in onnx.load(out / name).metadata_props}
        assert embedded == sidecar == contract.embedded()
        assert files[name]["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert contract.files is not None and contract.files[name].sha256 == files[name]["sha256"]
    meta = PolicyRunner(out / "policy.onnx").metadata
    assert isinstance(meta, PolicyContract) and meta.embedded() == sidecar
    assert verification["policy.onnx"]["max_abs_diff"] <= 1e-5

    robot = env.robot
    assert meta.metadata_version == METADATA_VERSION == 4
    assert meta.cameras == {} and meta.observation.images == []  # a policy that sees: tests/test_cameras.py
    assert meta.joint_names == robot.joint_names
    assert meta.default_joint_pos == pytest.approx(robot.default_joint_pos[0].tolist(), abs=1e-6)
    assert sidecar["action"] == {"type": "joint_position", "joint_ids": list(range(12)), "scale": 0.25,
                                 "offset": meta.default_joint_pos, "clip": None, "clamp_to_limits": False,
                                 "max_target_rate": None, "task_space": None}
    assert meta.joint_stiffness == [80.0] * 12 and meta.joint_damping == [2.0] * 12
    assert meta.effort_limits == pytest.approx([23.7, 23.7, 45.43] * 4)
    assert np.allclose(meta.joint_limits, robot.joint_limits.numpy(), atol=1e-6)
    assert (meta.control_dt, meta.physics_dt, meta.decimation) == pytest.approx((0.02, 0.005, 4))
    layout = env.observation_layout()["policy"]
    assert [(t.name, t.size, t.scale, t.clip) for t in meta.observation.terms] == \
        [(t["name"], t["size"], t["scale"], t["clip"]) for t in layout]
    assert meta.observation.size == 48 and not any("noise" in t for t in sidecar["observation"]["terms"])
    assert meta.command is not None and meta.command.ranges["lin_vel_x"] == list(cfg.task.command.ranges["lin_vel_x"])
    # The enabled event terms with the ranges the env holds now.
    assert "friction" in meta.randomization and "restitution" not in meta.randomization
    friction = meta.randomization["friction"]
    assert friction["range"] == [0.5, 1.25] and friction["mode"] == "startup"
    # What sim2sim needs, from the env's resolved terms.
    assert sidecar["tracking"] == {"lin_vel_xy": {"weight": 1.0, "std": 0.5}, "ang_vel_z": {"weight": 0.5, "std": 0.5}}
    assert sidecar["fall"] == {"contact_bodies": ["base"], "contact_threshold": 1.0, "min_base_height": None}
    assert meta.config_sha256 == hashlib.sha256((trained["run"] / "config.yaml").read_bytes()).hexdigest()
    import legion

    assert meta.legion_version == legion.__version__ == version("legion-rl")
    assert meta.onnx.recurrent is None and meta.checkpoint == "model_1.pt"


def older_versions(sidecar: dict) -> tuple[dict, dict, dict, dict]:
    """The file as version 3 wrote it (no actuator networks), as version 2 wrote it (no cameras, no
    image inputs), as an early version-2 export
    wrote it (also before base_com, the actuators, joint armature and friction, the height scan, the
    action's clamp, rate limit and IK, the command's entity, body and reference quaternion) and as
    version 1 wrote it (also without tracking terms, fall conditions and term params, its command
    the task config's ``commands`` section)."""
    import copy

    v3 = copy.deepcopy(sidecar)
    v3["metadata_version"] = 3
    del v3["actuator_networks"]
    for actuator in v3["actuators"]:
        del actuator["network"]
    v2 = copy.deepcopy(v3)
    v2["metadata_version"] = 2
    del v2["cameras"], v2["observation"]["images"]
    early = copy.deepcopy(v2)
    for key in ("base_com", "actuators", "joint_armature", "joint_friction", "height_scan"):
        del early[key]
    for key in ("clamp_to_limits", "max_target_rate", "task_space"):
        del early["action"][key]
    for key in ("entity", "body", "quat_reference"):
        del early["command"][key]
    v1 = copy.deepcopy(early)
    v1["metadata_version"] = 1
    del v1["tracking"], v1["fall"]
    for term in v1["observation"]["terms"]:
        del term["params"]
    command = v1.pop("command")
    v1["commands"] = {**command["ranges"], "resampling_time_s": command["resampling_time_s"],
                      "standing_fraction": command["standing_fraction"]}
    return v3, v2, early, v1


def test_version_1_and_2_files_load_migrated(trained, tmp_path):
    """Files of every version the runtime reads load: what an older one lacks reads as absent (the
    values the runtime assumed before the field existed), and the runtime acts on it."""
    from legion.sim2real.deploy import PolicyRunner
    from legion.sim2real.deploy.contract import READABLE_VERSIONS, Actuator, Fall, PolicyContract, Tracking

    assert READABLE_VERSIONS == (1, 2, 3, 4)
    current = json.loads((trained["out"] / "policy.json").read_text())
    v3, v2, early, v1 = older_versions(current)
    assert PolicyContract.from_dict(v3).embedded() == {**PolicyContract.from_dict(current).embedded(),
                                                       "metadata_version": 3}
    assert PolicyContract.from_dict(v2).embedded() == {**PolicyContract.from_dict(current).embedded(),
                                                       "metadata_version": 2}
    for data in (early, v1):
        contract = PolicyContract.from_dict(data)
        assert contract.metadata_version == data["metadata_version"]
        assert contract.cameras == {} and contract.observation.images == []
        assert contract.base_com == [0.0, 0.0, 0.0] and contract.height_scan is None
        assert contract.joint_armature is None and contract.joint_friction is None
        assert contract.actuators == [Actuator(model="implicit", saturation_effort=None, velocity_limit=None)] * 12
        assert contract.action.clamp_to_limits is False and contract.action.max_target_rate is None
        assert contract.action.task_space is None
        assert contract.command is not None and contract.command.quat_reference is None
        assert contract.command.ranges == current["command"]["ranges"] and contract.command.entity == "robot"
        assert contract.joint_stiffness == current["joint_stiffness"] and contract.files is not None
    migrated = PolicyContract.from_dict(v1)
    assert migrated.tracking == Tracking(lin_vel_xy=None, ang_vel_z=None)
    assert migrated.fall == Fall(contact_bodies=[], contact_threshold=None, min_base_height=None)
    assert all(t.params == {} for t in migrated.observation.terms)
    assert PolicyContract.from_dict(early).tracking == PolicyContract.from_dict(current).tracking

    # The runtime loads a version-1 file embedded in the ONNX file and acts on it.
    model = onnx.load(trained["out"] / "policy.onnx")
    del model.metadata_props[:]
    for key, value in v1.items():
        if key not in ("files", "verification"):
            model.metadata_props.add(key=key, value=json.dumps(value))
    onnx.save(model, tmp_path / "policy.onnx")
    runner = PolicyRunner(tmp_path / "policy.onnx", check_hash=False)
    assert runner.metadata.metadata_version == 1
    assert np.isfinite(runner.act(robot_state(trained["env"], 0), [0.5, 0.0, 0.0])).all()


def test_a_policy_file_with_a_missing_or_mistyped_field_is_refused_naming_the_field(trained, tmp_path):
    import copy

    from legion.sim2real.deploy import PolicyLoadError, PolicyRunner
    from legion.sim2real.deploy.contract import ContractError, PolicyContract

    good = json.loads((trained["out"] / "policy.json").read_text())
    edits = {
        r"policy.json: control_dt: missing \(expected a number\)": lambda d: d.pop("control_dt"),
        r"policy.json: observation.terms\[0\].func: missing \(expected a string\)":
            lambda d: d["observation"]["terms"][0].pop("func"),
        r"policy.json: onnx.recurrent: missing \(expected an object \(Recurrent\) or null\)":
            lambda d: d["onnx"].pop("recurrent"),
        r"policy.json: action.scale: expected a number or a list of numbers, got 'abc'":
            lambda d: d["action"].update(scale="abc"),
        r"policy.json: action.scale\[1\]: expected a number, got None": lambda d: d["action"].update(scale=[1, None]),
        r"policy.json: observation.terms\[2\].size: expected an integer, got 3.5":
            lambda d: d["observation"]["terms"][2].update(size=3.5),
        r"policy.json: joint_names\[0\]: expected a string, got 7": lambda d: d["joint_names"].__setitem__(0, 7),
        r"policy.json: fall.min_base_height: expected a number or null, got 'low'":
            lambda d: d["fall"].update(min_base_height="low"),
        r"policy.json: tracking.lin_vel_xy.std: expected a number, got True":
            lambda d: d["tracking"]["lin_vel_xy"].update(std=True),
        r"policy.json: onnx: unknown fields \['precision'\] \(Onnx has \['opset', .*\]\)":
            lambda d: d["onnx"].update(precision="fp32"),
    }
    for message, edit in edits.items():
        data = copy.deepcopy(good)
        edit(data)
        with pytest.raises(ContractError, match=message + r".*Re-export the policy \(legion export run=<run folder>\)"):
            PolicyContract.from_dict(data)
    # Through the runtime: the file named, as a PolicyLoadError.
    folder = tmp_path / "edited"
    shutil.copytree(trained["out"], folder)
    (folder / "policy.json").write_text(json.dumps({**good, "decimation": "4"}))
    with pytest.raises(PolicyLoadError, match=rf"{folder / 'policy.json'}: decimation: expected an integer, got '4'"):
        PolicyRunner(folder / "policy.onnx")


def test_an_unknown_version_or_a_foreign_json_is_refused_naming_the_versions_read(trained, tmp_path):
    from legion.sim2real.deploy.contract import ContractError, PolicyContract

    good = json.loads((trained["out"] / "policy.json").read_text())
    refused = {
        "newer.json": ({**good, "metadata_version": 5}, r"newer.json: metadata_version: 5 is not a version this "
                       r"runtime reads \(1, 2, 3, 4\). It was exported by a newer legion-rl: update legion-rl on the "
                       r"robot"),
        "zero.json": ({**good, "metadata_version": 0}, r"zero.json: metadata_version: 0 is not a version this "
                      r"runtime reads \(1, 2, 3, 4\). Re-export the policy"),
        "text.json": ({**good, "metadata_version": "3"}, r"metadata_version: '3' is not a version this runtime reads"),
        "foreign.json": ({"name": "a model", "layers": [64, 64]}, r"foreign.json: metadata_version: missing, so this "
                         r"is no legion policy file \(legion export writes metadata_version 4; this runtime reads "
                         r"versions 1, 2, 3, 4\)"),
        "list.json": ([1, 2, 3], r"list.json: not a legion policy file: expected a JSON object with metadata_version "
                      r"\(this runtime reads versions 1, 2, 3, 4\), got a list"),
        "broken.json": ("{not json", r"broken.json: not JSON"),
    }
    for name, (data, message) in refused.items():
        (tmp_path / name).write_text(data if isinstance(data, str) else json.dumps(data))
        with pytest.raises(ContractError, match=message):
            PolicyContract.load(tmp_path / name)


def test_the_shipped_json_schema_is_the_one_the_contract_generates():
    """policy.schema.json cannot go stale (regenerate it with write_schema, as the contract's docstring says)."""
    from legion.sim2real.deploy.contract import SCHEMA_FILE, json_schema, schema_text

    assert SCHEMA_FILE.read_text() == schema_text(), \
        "stale: regenerate it: python -c \"import legion.sim2real.deploy.contract as c; c.write_schema()\""
    schema = json_schema()
    assert schema["properties"]["metadata_version"]["const"] == 4 and "files" not in schema["required"]
    assert schema["$defs"]["Action"]["properties"]["scale"]["anyOf"] == [
        {"type": "number"}, {"type": "array", "items": {"type": "number"}}]
    assert schema["$defs"]["Action"]["properties"]["scale"]["description"].startswith("target = offset + scale")
    # The contract is the edge runtime's: the standard library only (policy.py adds numpy and onnxruntime).
    script = "import sys, legion.sim2real.deploy.contract as c; c.schema_text(); print(' '.join(sys.modules))"
    modules = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert not {"torch", "warp", "omegaconf", "hydra", "mujoco"} & {m.split(".")[0] for m in modules}


# --- the edge runtime against the env -------------------------------------------------------------
def test_numpy_rotation_matches_training_math():
    from legion.sim2real.deploy import quat_rotate_inverse
    from legion.tasks.math import quat_rotate_inverse as torch_rotate

    q = torch.nn.functional.normalize(torch.randn(64, 4), dim=-1)
    v = torch.randn(64, 3)
    expected = torch_rotate(q, v).numpy()
    assert np.abs(quat_rotate_inverse(q.numpy(), v.numpy()) - expected).max() < 1e-5  # batched
    single = np.stack([quat_rotate_inverse(q[i].numpy(), v[i].numpy()) for i in range(64)])  # one robot
    assert np.abs(single - expected).max() < 1e-5


def test_runtime_observation_and_targets_match_env(trained):
    """Lock-step with world 0: same observation (noise off), same action, same joint targets."""
    from legion.sim2real.deploy import PolicyRunner

    env, actor = trained["env"], trained["actor"]
    runtime = PolicyRunner(trained["out"] / "policy.onnx")
    errors = lockstep_errors(env, actor, runtime, lambda env: robot_state(env, 0))
    assert max(errors.values()) <= 1e-5, errors
    assert np.abs(runtime.last_action).max() > 0.05  # the comparison covered a moving last_action


def test_act_names_the_bad_field_and_never_returns_a_non_finite_target(trained, tmp_path):
    """Each malformed robot state is refused naming the field and what it must be; NaN or Inf in
    the state, or out of the network, raises instead of becoming a target; unknown keys are ignored."""
    from legion.sim2real.deploy import NonFiniteError, PolicyRunner, StateError

    runtime = PolicyRunner(trained["out"] / "policy.onnx")
    good = {**robot_state(trained["env"], 0), "mode": "walking", "note": None}  # extra keys, not numbers
    assert np.all(np.isfinite(runtime.act(good)))
    as_lists = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in good.items()}
    assert np.array_equal(runtime.observation(as_lists), runtime.observation(good))  # plain lists are fine too
    refused = {
        "base_quat": (np.zeros(4, np.float32), StateError,
                      r"'base_quat' = \[0.0, 0.0, 0.0, 0.0\] has norm 0: expected a unit quaternion \(x, y, z, w\)"),
        "joint_pos": (np.zeros(11, np.float32), StateError,
                      r"'joint_pos' has shape \(11,\) and dtype float32; the policy expects shape \(12,\) numbers, "
                      r"one per joint in the order of policy.json's joint_names"),
        "joint_vel": (["fast"] * 12, StateError, r"'joint_vel' has shape \(12,\) and dtype <U4"),
        "base_lin_vel": ([[0.0, 0.1], [0.2]], StateError, r"'base_lin_vel' is not an array of numbers"),
    }
    for key, (value, error, message) in refused.items():
        with pytest.raises(error, match=message):
            runtime.act({**good, key: value})
    missing = dict(good)
    del missing["base_ang_vel"]
    with pytest.raises(StateError, match=r"robot state lacks \['base_ang_vel'\] \(the policy's observation needs"):
        runtime.act(missing)

    last_action = runtime.last_action.copy()
    with pytest.raises(NonFiniteError, match=r"non-finite robot state \['base_lin_vel', 'joint_vel'\]"):
        runtime.act({**good, "joint_vel": np.full(12, np.nan, np.float32), "base_lin_vel": np.array([np.inf, 0, 0])})
    with pytest.raises(NonFiniteError, match=r"non-finite robot state \['base_quat'\]"):
        runtime.act({**good, "base_quat": np.array([np.nan, 0, 0, 1], np.float32)})
    with pytest.raises(NonFiniteError, match=r"non-finite robot state \['command'\]"):
        runtime.act(good, [np.nan, 0.0, 0.0])
    assert np.array_equal(runtime.last_action, last_action)  # nothing of a refused call is kept

    broken = PolicyRunner(nan_output_policy(trained, tmp_path))
    with pytest.raises(NonFiniteError, match="non-finite policy output .* the ONNX model is broken. Re-export"):
        broken.act(good)


def test_recurrent_policies_export_with_hidden_state(trained, tmp_path):
    """rsl-rl's RNNModel (LSTM and GRU): explicit h/c inputs and outputs, carried by the runtime."""
    from rsl_rl.models import RNNModel

    from legion.sim2real.deploy import OnnxPolicy
    from legion.sim2real.deploy.contract import Recurrent
    from legion.sim2real.export import build_metadata, export_policy, sample_observations

    env = trained["env"]
    for rnn_type in ("lstm", "gru"):
        actor = RNNModel(env.get_observations(), {"actor": ["policy"]}, "actor", env.num_actions, hidden_dims=[64, 64],
                         obs_normalization=True, rnn_type=rnn_type, rnn_hidden_dim=32, rnn_num_layers=2,
                         distribution_cfg={"class_name": "GaussianDistribution", "init_std": 1.0})
        actor.eval()
        metadata = build_metadata(trained["loaded"], actor)
        observations = sample_observations(env, actor, 6)
        report = export_policy(actor, metadata, observations, tmp_path / rnn_type)
        assert report["policy.onnx"]["max_abs_diff"] <= 1e-5 and report["policy_fp16.onnx"]["max_abs_diff"] <= 1e-2

        policy = OnnxPolicy(tmp_path / rnn_type / "policy.onnx")
        assert policy.recurrent == Recurrent(type=rnn_type, hidden_size=32, num_layers=2)
        assert policy.input_names == (["obs", "h_in", "c_in"] if rnn_type == "lstm" else ["obs", "h_in"])
        state, actions = policy.initial_state(1), []
        for obs in observations:
            action, state = policy(obs["policy"][:1].numpy(), state)
            actions.append(action[0])
        with torch.inference_mode():
            actor.reset()
            expected = [actor(obs[:1]).numpy()[0] for obs in observations]
        assert np.abs(np.array(actions) - np.array(expected)).max() <= 1e-5
        assert np.abs(actions[-1] - policy(observations[-1]["policy"][:1].numpy())[0][0]).max() > 1e-4  # memory matters


def test_export_fails_on_a_broken_policy(trained, tmp_path):
    import copy

    from legion.sim2real.export import ExportError, build_metadata, export_policy

    env, runner = trained["env"], trained["runner"]
    actor = copy.deepcopy(runner.ppo.get_policy())
    with torch.no_grad():
        actor.mlp[0].bias[0] = float("nan")
    metadata = build_metadata(trained["loaded"], actor)
    with pytest.raises(ExportError, match="onnxruntime differs from the torch policy by nan"):
        export_policy(actor, metadata, [env.get_observations()], tmp_path / "broken")
    assert not (tmp_path / "broken").exists() or not any((tmp_path / "broken").iterdir())


# --- damaged files --------------------------------------------------------------------------------
def test_truncated_or_tampered_files_are_refused(trained, tmp_path):
    from legion.sim2real.deploy import PolicyLoadError, PolicyRunner

    data = (trained["out"] / "policy.onnx").read_bytes()
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "policy.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(PolicyLoadError, match=r"not a loadable ONNX model \(truncated or corrupted\?\).*legion export"):
        PolicyRunner(bare / "policy.onnx")

    folder = tmp_path / "with_json"
    shutil.copytree(trained["out"], folder)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # one weight byte: onnxruntime alone would load this
    (folder / "policy.onnx").write_bytes(bytes(flipped))
    with pytest.raises(PolicyLoadError, match="modified or truncated after export.*sha256"):
        PolicyRunner(folder / "policy.onnx")

    model = onnx.load(trained["out"] / "policy.onnx")  # metadata edited by hand, no policy.json
    for prop in model.metadata_props:
        if prop.key == "observation":
            layout = json.loads(prop.value)
            layout["terms"] = layout["terms"][:-1]
            prop.value = json.dumps(layout)
    onnx.save(model, bare / "edited.onnx")
    with pytest.raises(PolicyLoadError, match="observation layout adds up to 36 values"):
        PolicyRunner(bare / "edited.onnx")

    del model.metadata_props[:]
    onnx.save(model, bare / "foreign.onnx")
    with pytest.raises(PolicyLoadError, match=r"foreign.onnx: metadata_version: missing, so this is no legion policy "
                                              r"file \(legion export writes metadata_version 4; this runtime reads "
                                              r"versions 1, 2, 3, 4\). Was it written by legion export\?"):
        PolicyRunner(bare / "foreign.onnx")


def test_policy_json_that_disagrees_with_the_onnx_metadata_is_refused_naming_both(trained, tmp_path):
    """A robot's driver may set its servos from policy.json while the runtime reads the embedded
    metadata: an edit to one of them must not pass silently."""
    from legion.sim2real.deploy import PolicyLoadError, PolicyRunner

    folder = tmp_path / "edited_json"
    shutil.copytree(trained["out"], folder)
    sidecar = json.loads((folder / "policy.json").read_text())
    sidecar["joint_stiffness"] = [60.0] * 12  # e.g. gains retuned by hand in the JSON only
    (folder / "policy.json").write_text(json.dumps(sidecar))
    with pytest.raises(PolicyLoadError, match=r"(?s)policy.json and the metadata embedded in policy.onnx disagree on "
                       r"\['joint_stiffness'\] \(e.g. 'joint_stiffness': policy.json says \[60.0, .*the ONNX file "
                       r"\[80.0, .*This runtime would use the embedded metadata.*Re-export"):
        PolicyRunner(folder / "policy.onnx")
    assert PolicyRunner(folder / "policy.onnx", check_hash=False).metadata.joint_stiffness == [80.0] * 12


# --- the control loop's safety layer, on the MuJoCo robot ---------------------------------------------
class FlakySensors:
    """Wraps a MuJoCoRobot: ``freeze()`` makes read_state return the last sample forever;
    ``poison`` puts a NaN into the next joint velocity reading."""

    def __init__(self, robot):
        self.robot, self.frozen, self.poison = robot, None, False

    def freeze(self):
        self.frozen = self.robot.read_state()

    def read_state(self):
        state = self.frozen if self.frozen is not None else self.robot.read_state()
        if self.poison:
            state = {**state, "joint_vel": np.full_like(state["joint_vel"], np.nan)}
        return state

    def write_targets(self, targets):
        self.robot.write_targets(targets)


class Driver(FlakySensors):
    """What a hardware driver adds to the sensors: ``damp()`` (counted), its own clock
    (``clock``: the timestamp it stamps, default the simulator's; ``offset`` added to it), an
    extra key that is not a number, and ``faults``: tick -> a function that breaks that tick
    (raise in read_state or write_targets, or change the state)."""

    def __init__(self, robot):
        super().__init__(robot)
        self.damped, self.clock, self.offset, self.faults, self.reads = 0, None, 0.0, {}, 0

    def read_state(self):
        self.reads += 1
        state = {**super().read_state(), "gait": "trot"}
        state["timestamp"] = (self.clock() if self.clock else state["timestamp"]) + self.offset
        return self.faults.get(self.reads, lambda where, state: state)("read_state", state)

    def write_targets(self, targets):
        self.faults.get(self.reads, lambda where, state: state)("write_targets", None)
        super().write_targets(targets)

    def damp(self):
        self.damped += 1


@pytest.fixture
def driver_loop(trained):
    """A ControlLoop on a Driver over the MuJoCo robot; ``now`` and the driver's clock settable."""
    from legion.sim2real.deploy import ControlLoop, PolicyRunner
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot

    runner = PolicyRunner(trained["out"] / "policy.onnx")
    robot = MuJoCoRobot(ROOT / "tasks" / "assets" / "quadruped.xml", runner.metadata)
    driver = Driver(robot)
    return ControlLoop(driver, runner, now=robot.time, realtime=False), driver


def test_a_timestamp_ahead_of_the_loop_clock_or_from_another_clock_stops_naming_the_clock(driver_loop):
    import time

    loop, driver = driver_loop
    driver.offset = 0.005  # within max_clock_skew_s (10 ms): two clocks a little apart
    assert [loop.step() for _ in range(3)] == ["policy"] * 3 and driver.damped == 0

    driver.offset = 5.0  # a state frozen 5 s ahead: once it ran the policy on every tick
    assert [loop.step() for _ in range(20)] == ["stop"] * 20
    assert loop.stopped.startswith("clock mismatch: the state's timestamp is 5.000 s ahead of the loop's clock "
                                   "(tolerance 10 ms)")
    assert "time.time()" in loop.stopped and driver.damped == 20

    for stamp, now, message in ((time.time, time.monotonic, "clock mismatch: the state's timestamp is"),
                                (time.monotonic, time.time, "ms old (limit 250 ms) (that old: does the driver stamp "
                                                            "another clock than the loop's now()")):
        loop.stopped, loop.now, driver.clock, driver.offset = None, now, stamp, 0.0
        assert loop.step() == "stop" and message in loop.stopped


def test_ctrl_c_inside_a_finalizer_stops_the_control_loop_before_its_next_tick(driver_loop):
    """Ctrl-C is a flag the loop checks every tick: even handled inside a finalizer (where Python
    drops a KeyboardInterrupt and a loop waiting for one ran on to its end), the loop stops, damps
    and returns, and the process's own Ctrl-C handler is back."""
    import signal

    loop, driver = driver_loop
    handler = signal.getsignal(signal.SIGINT)
    driver.faults[5] = lambda where, state: (ctrl_c_inside_a_finalizer(), state)[1] if where == "read_state" else state
    summary = loop.run(50, np.array([0.5, 0.0, 0.0], np.float32))
    assert loop.stopped == "interrupted" and driver.reads == 5 and driver.damped == 1
    assert summary["policy"] == 5 and signal.getsignal(signal.SIGINT) is handler


FAULTS = ("read_state", "write_targets", "a malformed state", "no timestamp", "command")


@pytest.mark.parametrize("entry, fault", [(entry, fault) for entry in ("step", "run") for fault in FAULTS
                                          if (entry, fault) != ("step", "command")])  # run() calls the command
def test_any_exception_ends_in_the_safe_stop_then_propagates_with_its_traceback(driver_loop, fault, entry):
    loop, driver = driver_loop
    error = OSError("CAN bus timeout")

    def fail(where, state):
        if where == fault:
            raise error
        if fault == "a malformed state" and state is not None:
            return {**state, "joint_pos": state["joint_pos"][:11]}  # a driver that lost a joint
        if fault == "no timestamp" and state is not None:
            return {k: v for k, v in state.items() if k != "timestamp"}
        return state

    def command(k):
        if k == 3 and fault == "command":
            raise error
        return np.array([0.5, 0.0, 0.0])

    driver.faults[4] = fail
    with pytest.raises(Exception) as raised:
        if entry == "run":
            loop.run(10, command)
        else:
            for k in range(10):
                loop.step(command(k))
    assert driver.damped == 1 and loop.stats.modes == {"policy": 3, "hold": 0, "stop": int(fault != "command")}
    expected = {"read_state": ("OSError in read_state: CAN bus timeout", ["read_state", "fail"]),
                "write_targets": ("OSError in write_targets: CAN bus timeout", ["write_targets", "fail"]),
                "a malformed state": ("StateError in the policy: robot state 'joint_pos' has shape (11,) and dtype "
                                      "float32; the policy expects shape (12,)",
                                      ["act", "observation", "check_state", "_refuse_field"]),
                "no timestamp": ("StateError in read_state: robot state lacks 'timestamp': the watchdog needs when "
                                 "the sensors were sampled [s]", ["sensor_age"]),
                "command": ("OSError in the command function: CAN bus timeout", ["run", "command"])}
    reason, origin = expected[fault]
    assert loop.stopped.startswith(reason)
    frames = [frame.name for frame in raised.traceback]  # the original traceback, down to where it was raised
    assert frames[-len(origin):] == origin, frames
    if isinstance(raised.value, OSError):
        assert raised.value is error
    assert loop.step() == "stop" and driver.damped == 2  # latched


@pytest.fixture
def mujoco_loop(trained):
    from legion.sim2real.deploy import ControlLoop, PolicyRunner, SafetyConfig
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot

    runner = PolicyRunner(trained["out"] / "policy.onnx")
    robot = MuJoCoRobot(ROOT / "tasks" / "assets" / "quadruped.xml", runner.metadata)
    sensors = FlakySensors(robot)
    safety = SafetyConfig(stale_after_s=0.05, damp_after_s=0.25)
    return ControlLoop(sensors, runner, safety, now=robot.time, realtime=False), sensors, robot


def test_watchdog_holds_then_stops_on_stale_data(mujoco_loop):
    loop, sensors, robot = mujoco_loop
    modes = [loop.step([0.5, 0.0, 0.0]) for _ in range(5)]
    sensors.freeze()  # the sensor sample stops advancing; the simulated clock does not
    held_targets = None
    for _ in range(20):
        modes.append(loop.step([0.5, 0.0, 0.0]))
        if modes[-1] == "hold":
            held_targets = loop.last_targets.copy()
            assert np.array_equal(robot.data.ctrl[robot.actuator_ids].astype(np.float32), held_targets)
    # sensor ages 0, 0.02, 0.04 s: policy; 0.06 ... 0.24 s: hold; above 0.25 s: stop (latched)
    assert modes == ["policy"] * 8 + ["hold"] * 10 + ["stop"] * 7
    assert "old (limit 250 ms)" in loop.stopped
    damp = loop.last_joint_pos
    assert np.allclose(robot.data.ctrl[robot.actuator_ids], damp)  # targets = last measured pose
    sensors.frozen = None  # fresh data again: the stop stays latched
    assert loop.step() == "stop"
    assert loop.stats.summary()["hold"] == 10


def test_nan_guard_stops_and_damps(mujoco_loop):
    loop, sensors, robot = mujoco_loop
    for _ in range(3):
        assert loop.step() == "policy"
    last_good = loop.last_joint_pos.copy()
    sensors.poison = True
    assert loop.step() == "stop"
    assert loop.stopped == "non-finite robot state ['joint_vel']"
    assert np.allclose(robot.data.ctrl[robot.actuator_ids], last_good)
    assert np.all(np.isfinite(robot.data.qpos))


def test_nan_policy_output_stops(trained, tmp_path):
    from legion.sim2real.deploy import ControlLoop, PolicyRunner
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot

    runner = PolicyRunner(nan_output_policy(trained, tmp_path))
    robot = MuJoCoRobot(ROOT / "tasks" / "assets" / "quadruped.xml", runner.metadata)
    loop = ControlLoop(robot, runner, now=robot.time, realtime=False)
    assert loop.step() == "stop" and loop.stopped.startswith("non-finite policy output (NaN or Inf)")
    assert np.all(np.isfinite(robot.data.ctrl))


def test_clamps_and_realtime_deadlines(mujoco_loop):
    loop, sensors, robot = mujoco_loop
    lower, upper = loop.lower, loop.upper
    loop.last_targets = None
    assert np.array_equal(loop.clamp(upper + 1.0), upper)  # joint limits
    loop.last_targets = np.zeros(12, np.float32) + (lower + upper) / 2
    step = loop.safety.max_target_rate * loop.dt
    jumped = loop.clamp(loop.last_targets + 0.5)  # inside the limits, faster than 20 rad/s
    assert step == pytest.approx(0.4) and np.allclose(jumped - loop.last_targets, step, atol=1e-6)
    assert (loop.stats.limit_clamped, loop.stats.rate_clamped) == (1, 1)

    loop.realtime, loop.last_targets = True, None
    start = robot.time()
    import time

    wall = time.perf_counter()
    stats = loop.run(10, command=np.array([0.5, 0.0, 0.0]))
    assert time.perf_counter() - wall >= 9 * loop.dt  # paced at the control rate
    assert stats["ticks"] == 10 and stats["policy"] == 10 and stats["misses"] <= 1
    assert 0 < stats["latency_p50_us"] <= stats["latency_p99_us"] < loop.dt * 1e6
    assert robot.time() - start == pytest.approx(10 * loop.dt)


# --- a robot computer: numpy + onnxruntime only ----------------------------------------------------
def test_deploy_only_venv_runs_the_runtime(trained, tmp_path):
    from legion.sim2real.deploy import PolicyRunner

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # Exactly what a robot computer runs: the package with its deploy extra, from PyPI and this tree.
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          f"{ROOT}[deploy,unitree]"], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, f"pip install 'legion-rl[deploy,unitree]' failed (PyPI needed):\n{pip.stderr[-2000:]}"
    state = robot_state(trained["env"], 1)
    (tmp_path / "state.json").write_text(json.dumps({k: np.asarray(v).tolist() for k, v in state.items()}))
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from legion.sim2real.deploy import ControlLoop, PolicyRunner
        from legion.sim2real.deploy.unitree import UnitreeRobot, deploy  # DDS for Unitree robots
        for name in ("torch", "warp", "mujoco"):
            try:
                __import__(name)
                sys.exit(name + " is importable in the deploy venv")
            except ImportError:
                pass
        state = {{k: np.asarray(v, np.float32) for k, v in json.load(open({str(tmp_path / "state.json")!r})).items()}}
        runner = PolicyRunner({str(trained["out"] / "policy.onnx")!r})
        targets = [runner.act(state, [0.5, 0.0, 0.2]).tolist() for _ in range(2)]
        print(json.dumps({{"targets": targets, "modules": sorted(sys.modules)}}))
    """)
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    top_level = {m.split(".")[0] for m in out["modules"]}
    assert not {"torch", "warp", "mujoco", "tasks", "agents"} & top_level
    assert not [m for m in out["modules"]
                if m.startswith(("legion.tasks", "legion.agents", "legion.cli", "legion.runs"))]
    runner = PolicyRunner(trained["out"] / "policy.onnx")
    expected = [runner.act({k: np.asarray(v, np.float32) for k, v in state.items()}, [0.5, 0.0, 0.2]) for _ in range(2)]
    assert np.abs(np.array(out["targets"]) - np.array(expected)).max() <= 1e-6
    assert np.abs(expected[0] - expected[1]).max() > 0  # the second call saw its own last action
    # `legion deploy` on the robot computer: its help, and its refusal of a folder with no export
    deploy_help = subprocess.run([str(venv / "bin" / "legion"), "deploy", "--help"], capture_output=True, text=True,
                                 timeout=60, env={"PATH": os.environ["PATH"]})
    assert deploy_help.returncode == 0 and "legion deploy run=<run or exported folder>" in deploy_help.stdout
    no_export = subprocess.run([str(venv / "bin" / "legion"), "deploy", f"run={tmp_path}", "robot=go2"],
                               capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert no_export.returncode == 2 and "holds no exported policy" in no_export.stderr, no_export.stderr


# --- command line ----------------------------------------------------------------------------------
def test_cli_help_and_bad_run(tmp_path):
    for command in ("export", "sim2sim"):
        result = legion(command, "--help", cwd=tmp_path)
        assert result.returncode == 0 and f"legion {command} run=<run folder>" in result.stdout
    bad = legion("export", f"run={tmp_path}", cwd=tmp_path)
    assert bad.returncode != 0 and "is not a run folder (no config.yaml)" in bad.stderr
    (tmp_path / "policy.onnx").write_text("")
    code, _, err = legion_in_process("export", f"run={tmp_path}", f"out={tmp_path / 'policy.onnx'}")
    assert code == 2 and "policy.onnx is a file: give a folder" in err
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "policy.json").write_text('{"checkpoint": "model_900.pt", "task": "quadruped_flat"}')
    code, _, err = legion_in_process("export", f"run={tmp_path}", f"out={tmp_path / 'deploy'}")
    assert code == 2 and ("deploy already holds an export (model_900.pt of task quadruped_flat): give another folder, "
                          "or overwrite=true") in err, err
    top = legion("--help", cwd=tmp_path)
    assert "export" in top.stdout and "sim2sim" in top.stdout


def test_sim2sim_matched_physics_reproduces_newton(trained, tmp_path):
    """With Newton's solver settings, plain MuJoCo driven by the edge runtime (state dict ->
    observation -> ONNX -> targets -> position actuators) retraces Newton's episodes: an
    end-to-end check of joint order, frames, gains, scales and timing."""
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    code, out, err = legion_in_process("sim2sim", f"run={run}", "duration_s=0.4", "commands=[[0.5,0,0],[0,0,0.5]]",
                                       "physics=matched", f"json={tmp_path / 'sim2sim.json'}", "robustness=true")
    assert code == 0, err[-3000:]
    assert "Newton (training engine)" in out and "MuJoCo C (edge runtime)" in out
    assert "(+0.5, +0.0, +0.0)" in out and "latency p50" in out
    assert "not restored" not in err  # the events sim2sim turns off are no config that changed
    table = json.loads((tmp_path / "sim2sim.json").read_text())
    for newton, mujoco in zip(table["newton"], table["mujoco"]):
        assert newton["command"] == mujoco["command"] and newton["survived_s"] == pytest.approx(0.4)
        for key in ("vel_error_xy", "yaw_rate_error", "tracking_return"):
            assert newton[key] == pytest.approx(mujoco[key], abs=1e-3), key
    assert table["mean"]["newton"]["vel_error_xy"] > 0.05  # the commands were not met: a real comparison
    assert table["loop"]["ticks"] == 40 and (run / "exported" / "policy.onnx").is_file()
    # robustness=true: one line per condition; the nominal one is the MuJoCo column's mean again
    from legion.sim2real.sim2sim import ROBUSTNESS

    assert list(table["robustness"]) == [c.name for c in ROBUSTNESS]
    assert "latency 40 ms" in out and "combined" in out
    assert table["robustness"]["nominal"]["vel_error_xy"] == pytest.approx(table["mean"]["mujoco"]["vel_error_xy"])
    assert table["robustness"]["latency 40 ms"]["vel_error_xy"] != table["robustness"]["nominal"]["vel_error_xy"]
    # ... and the push sweep: 2 commands x 8 directions x 2 magnitudes (half and all of the task's +-1 m/s) x 3 moments
    sweep = table["push_sweep"]
    assert len(sweep["pushes"]) == 96 and sweep["magnitudes"] == [0.5, 1.0] and sweep["trained_up_to"] == 1.0
    assert "Pushes of 0.5, 1 m/s from 8 directions" in out
    assert "beyond the training range" not in out
    assert (run / "sim2sim_pushes.png").stat().st_size > 10_000


def test_sim2sim_says_when_the_runtime_clamps_what_training_did_not(trained, tmp_path):
    """The edge runtime keeps every target inside the joint limits and its change under 20 rad/s;
    a policy trained without those clamps is driven otherwise in MuJoCo, and sim2sim says so and
    what to do (the G1 fell walking backward for this reason). Trained with them
    (task.action.clamp_to_limits, task.action.max_target_rate), the runtime acts as training did."""
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    code, out, err = legion_in_process("sim2sim", f"run={run}", "duration_s=0.2", "commands=[[0.5,0,0]]",
                                       "task.action.scale=20", f"json={tmp_path / 'free.json'}")
    assert code == 0, err[-3000:]
    loop = json.loads((tmp_path / "free.json").read_text())["loop"]
    assert loop["limit_clamped"] > 0.5 * loop["ticks"] and loop["rate_clamped"] > 0.5 * loop["ticks"]
    assert "train (or fine-tune) with task.action.clamp_to_limits=true" in out
    assert "train (or fine-tune) with task.action.max_target_rate=20" in out
    assert "episodes in progress" not in out  # a policy loaded to run starts its own
    code, out, err = legion_in_process("sim2sim", f"run={run}", "duration_s=0.2", "commands=[[0.5,0,0]]",
                                       "task.action.scale=20", "task.action.clamp_to_limits=true",
                                       "task.action.max_target_rate=20", "physics=matched",
                                       f"json={tmp_path / 'clamped.json'}")
    assert code == 0, err[-3000:]
    table = json.loads((tmp_path / "clamped.json").read_text())
    assert table["notes"] == [] and table["loop"]["limit_clamped"] == 0 and table["loop"]["rate_clamped"] == 0
    newton, mujoco = table["mean"]["newton"], table["mean"]["mujoco"]
    assert newton["vel_error_xy"] == pytest.approx(mujoco["vel_error_xy"], abs=1e-3)


def test_sim2sim_keeps_an_export_of_another_checkpoint_and_exports_beside_it(trained, tmp_path):
    """A user's `legion export checkpoint=` of another policy, kept for the robot: sim2sim of the
    newest checkpoint leaves it as it was, exports into sim2sim_exported/ and says so."""
    run = shutil.copytree(trained["run"], tmp_path / "run")
    sidecar = run / "exported" / "policy.json"
    shutil.copytree(trained["out"], run / "exported", dirs_exist_ok=True)
    sidecar.write_text(sidecar.read_text().replace('"checkpoint": "model_1.pt"', '"checkpoint": "model_0.pt"'))
    kept = sidecar.read_bytes()
    code, out, err = legion_in_process("sim2sim", f"run={run}", "duration_s=0.2", "commands=[[0.5,0,0]]")
    assert code == 0, err[-3000:]
    assert "exported holds the export of model_0.pt (kept); model_1.pt is exported to" in out
    assert sidecar.read_bytes() == kept and (run / "sim2sim_exported" / "policy.onnx").is_file()


def test_the_runtime_takes_an_export_folder_and_says_which_file_when_given_the_metadata(trained):
    from legion.sim2real.deploy import PolicyRunner
    from legion.sim2real.deploy.policy import PolicyLoadError

    assert PolicyRunner(trained["out"]).policy.path == trained["out"] / "policy.onnx"
    with pytest.raises(PolicyLoadError, match=r"policy.json is the policy's metadata: give .*policy.onnx"):
        PolicyRunner(trained["out"] / "policy.json")
    code, _, err = legion_in_process("sim2sim", f"run={trained['run']}", "commands=[1,2]")
    assert code == 2 and "commands must be a JSON list of [v_x, v_y, yaw_rate] triples (got [1,2])" in err


def test_sim2sim_perturbations_act_on_the_mujoco_robot(trained):
    """Each robustness condition changes what it names: a floor slipperier than the feet (MuJoCo
    would take the larger friction), targets that act one write late, noisy sensors, a heavier base."""
    from legion.sim2real.deploy import PolicyRunner
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot
    from legion.sim2real.sim2sim import SENSOR_NOISE, Perturbation, PerturbedRobot

    runner = PolicyRunner(trained["out"] / "policy.onnx")
    robot = MuJoCoRobot(ROOT / "tasks" / "assets" / "quadruped.xml", runner.metadata)
    mass = robot.model.body_mass[robot.model.jnt_bodyid[0]]
    perturbed = PerturbedRobot(robot, Perturbation(friction=0.1, base_mass=1.2, latency_s=0.02, noise=1.0),
                               runner.control_dt)
    assert robot.model.body_mass[robot.model.jnt_bodyid[0]] == pytest.approx(1.2 * mass)
    default = np.asarray(runner.metadata.default_joint_pos)
    first, second = default + 0.1, default - 0.1
    perturbed.write_targets(first)
    assert np.allclose(robot.targets, default)  # the first write is not acting yet
    perturbed.write_targets(second)
    assert np.allclose(robot.targets, first)  # one control step (20 ms) late
    assert robot.data.ncon > 0 and all(robot.data.contact[i].friction[0] == pytest.approx(0.1)
                                       for i in range(robot.data.ncon))
    truth, seen = robot.read_state(), perturbed.read_state()
    difference = np.abs(seen["joint_vel"] - truth["joint_vel"])
    assert 0 < difference.max() <= SENSOR_NOISE["joint_vel"]


def test_the_push_sweep_pushes_by_what_it_says_and_marks_pushes_beyond_training(trained):
    """Each push of the sweep changes the base's velocity (as the robot's state reads it) by its
    magnitude in its direction of the robot's heading frame; the table counts every push and marks
    a magnitude beyond the task's training range."""
    from legion.sim2real.sim2sim import MuJoCoEpisodes, PushSweep, push_summary, push_sweep, push_table

    episodes = MuJoCoEpisodes(ROOT / "tasks" / "assets" / "quadruped.xml", trained["out"] / "policy.onnx", {})
    sweep = PushSweep((0.3, 1.5), directions=4, phases=2, trained_up_to=1.0)
    result = push_sweep(episodes, np.array([[0.5, 0.0, 0.0], [0.0, 0.0, 0.5]]), 40, sweep)
    rows = result["pushes"]
    assert len(rows) == 2 * 4 * 2 * 2 and result["push_steps"] == [16, 20]
    for row in rows:
        angle = np.radians(row["direction_deg"])
        expected = row["magnitude"] * np.array([np.cos(angle), np.sin(angle)])
        assert np.abs(np.array(row["jump"]) - expected).max() < 1e-6, row
        assert row["beyond_training"] == (row["magnitude"] == 1.5)
    summary = push_summary(result)
    assert [r["pushes"] for r in summary["by_magnitude"].values()] == [16, 16]
    assert summary["within_training"]["pushes"] == 16
    table = push_table({"push_sweep": result})
    assert "1.5 m/s, every command and direction: survived" in table
    assert table.count("(beyond the training range)") == 1 and "0.3 m/s, every command" in table
    assert "training pushed up to 1 m/s per axis" in table
    # Tracking from 1 s after a push on, against the unpushed episode on the same steps: a push of
    # next to nothing retraces it.
    result = push_sweep(episodes, np.array([[0.5, 0.0, 0.0]]), 100, PushSweep((1e-9, 0.5), 1, 1, 1.0))
    still, pushed = result["pushes"]
    assert still["nominal_after"] == pushed["nominal_after"] > 0.0
    assert still["error_after"] == pytest.approx(still["nominal_after"], rel=1e-4)
    assert abs(pushed["error_after"] - still["error_after"]) > 1e-3
    row = push_summary(result)["within_training"]
    assert row["tracking_vs_nominal"] == pytest.approx((still["error_after"] + pushed["error_after"])
                                                       / (2 * still["nominal_after"]))
    assert f"{row['error_after']:.3f} m/s ({row['tracking_vs_nominal']:.2f}x)" in push_table({"push_sweep": result})


def test_the_velocity_estimator_is_exported_inside_the_policy_and_estimates_there_as_in_training(tmp_path):
    """A deployable policy with agent.actor.estimator: the ONNX graph takes the policy observation
    alone (no base velocity), and the estimate inside it is the trained estimator's to 1e-5."""
    import onnxruntime as ort
    from tensordict import TensorDict

    made = export_untrained_run(tmp_path, "task=quadruped_flat_deployable",
                                "agent.actor.estimator.target=base_velocity")
    actor, env = made["actor"], made["env"]
    model = onnx.load(made["out"] / "policy.onnx")
    assert [i.name for i in model.graph.input] == ["obs"] and made["report"]["policy.onnx"]["max_abs_diff"] <= 1e-5
    terms = [t["func"] for t in json.loads((made["out"] / "policy.json").read_text())["observation"]["terms"]]
    assert "base_lin_vel" not in terms
    concat = [n for n in model.graph.node if n.op_type == "Concat"]
    assert len(concat) == 1  # [observation, estimate] into the policy's MLP
    model.graph.output.append(onnx.helper.make_tensor_value_info(concat[0].input[1], onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with torch.inference_mode():
        obs = env.get_observations()
        for _ in range(5):
            obs, *_ = env.step(actor(obs))
        policy = obs["policy"].clone()
    exported = session.run(None, {"obs": policy.numpy()})[1]
    with torch.no_grad():
        trained = actor.estimate(TensorDict({"policy": policy}, batch_size=[len(policy)])).numpy()
    assert exported.shape == (env.num_envs, 3) and np.abs(exported - trained).max() < 1e-5


def test_a_malformed_push_sweep_is_refused_by_name(trained):

    for option, message in (("pushes=fast", "pushes=fast: expected a number"),
                            ("pushes=0.5,-1", "pushes=0.5,-1: give push magnitudes in m/s, positive"),
                            ("push_directions=0", "push_directions=0: a whole number of at least 1"),
                            ("push_phases=2.5", "push_phases=2.5: expected an integer")):
        code, _, err = legion_in_process("sim2sim", f"run={trained['run']}", "robustness=true", option)
        assert code == 2 and message in err, (option, err)


def test_sim2sim_of_a_goal_task_starts_each_mujoco_episode_where_newton_started_it(tmp_path):
    """arm_lift through the edge runtime on Newton's model of the scene (the arm, the cube, the
    table): with Newton's solver settings each episode from the same joints, cube pose and goal
    ends at the same distance in both engines, with the same outcome. The runtime drives every
    joint, the second finger (no action) at its default, as in training."""
    from legion.sim2real.deploy import PolicyRunner
    from legion.sim2real.sim2sim import compare_goals, goals_table

    made = export_untrained_run(tmp_path, "task=arm_lift")
    result = compare_goals(tmp_path, onnx=made["out"] / "policy.onnx", episodes=4, physics="matched")
    print(goals_table(result))
    assert result["agree"] == 4 and result["loop"]["stops"] == 0
    starts = {round(r["min_distance_m"], 2) for r in result["newton"]}
    assert len(starts) > 1  # four different cube places and goals
    for newton, mujoco in zip(result["newton"], result["mujoco"]):
        assert mujoco["final_distance_m"] == pytest.approx(newton["final_distance_m"], abs=2e-3)
        assert mujoco["min_distance_m"] == pytest.approx(newton["min_distance_m"], abs=2e-3)
    runner = PolicyRunner(made["out"] / "policy.onnx")
    meta = runner.metadata
    state = {"joint_pos": np.asarray(meta.default_joint_pos, np.float32), "joint_vel": np.zeros(9, np.float32),
             "object_pos": np.array([0.5, 0.0, 0.03], np.float32)}
    targets = runner.act(state, np.array([0.5, 0.0, 0.3], np.float32))
    assert len(meta.joint_names) == len(targets) == 9 and len(meta.action.joint_ids) == 8
    assert targets[8] == meta.default_joint_pos[8]  # finger_joint2: not an action joint


def test_an_actuator_network_goes_into_the_contract_and_the_runtime_drives_with_it(tmp_path):
    """A Go2 whose knees are driven by an actuator network (random weights, 3 instants of history):
    the export carries the network in its contract (no file beside it), the runtime's numpy
    network gives the simulator's torch network's torques (1e-5 N m), and plain MuJoCo drives the
    knees with it from the first physics step after a reset (history = the present), the other
    joints with their DC motors' PD law."""
    from legion.sim2real.deploy.actuator_network import ActuatorNetwork
    from legion.sim2real.deploy.contract import PolicyContract
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot, pd_torque

    rng = np.random.default_rng(0)
    network = ActuatorNetwork(weights=[rng.normal(0, 0.5, (16, 6)), rng.normal(0, 0.5, (1, 16))],
                              biases=[rng.normal(0, 0.1, 16), np.zeros(1)], input_mean=np.zeros(6),
                              input_std=np.array([0.2, 0.2, 0.2, 2.0, 2.0, 2.0]), output_scale=10.0)
    network.save(tmp_path / "knee.npz")
    (tmp_path / "run").mkdir()
    made = export_untrained_run(tmp_path / "run", "task=quadruped_flat", "robot=go2",
                                "task.scene.robot.actuators.knee.model=network",
                                f"+task.scene.robot.actuators.knee.network={tmp_path / 'knee.npz'}")
    contract = PolicyContract.load(made["out"] / "policy.json")
    knees = [j for j, name in enumerate(contract.joint_names) if name.endswith("calf_joint")]
    assert [j for j, a in enumerate(contract.actuators) if a.model == "network"] == knees
    assert {contract.actuators[j].network for j in knees} == {0} and len(contract.actuator_networks) == 1
    assert not list(made["out"].glob("*.npz"))

    sim = made["env"].sim  # the simulator's network on random errors and velocities
    inputs = torch.tensor(rng.normal(0, [0.3, 0.3, 0.3, 3, 3, 3], (64, 6)), dtype=torch.float32)
    net = sim.networks[0]
    simulated = net["mlp"]((inputs - net["mean"]) / net["std"])[:, 0] * net["scale"]
    runtime = ActuatorNetwork.from_contract(contract.actuator_networks[0])
    assert np.abs(runtime(inputs[:, :3].double().numpy(), inputs[:, 3:].double().numpy())
                  - simulated.double().numpy()).max() < 1e-5

    robot = MuJoCoRobot(made["out"] / "robot.mjb", contract)
    robot.reset()
    q0 = robot.data.qpos[robot.qpos_ids].copy()
    targets = q0 + rng.uniform(-0.3, 0.3, len(q0))
    robot.physics_step(targets)
    error = np.repeat((targets - q0)[knees, None], 3, 1)
    effort = np.asarray(contract.effort_limits)
    expected = pd_torque(targets, q0, 0.0, contract.joint_stiffness, contract.joint_damping, effort)
    expected[knees] = np.clip(runtime(error, np.zeros_like(error)), -effort[knees], effort[knees])
    assert np.abs(robot.data.qfrc_applied[robot.qvel_ids] - expected).max() < 1e-9
    assert np.abs(expected[knees]).min() > 0.1  # the network pushed
