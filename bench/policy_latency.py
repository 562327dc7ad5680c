"""Batch-1 latency of the locomotion policy: onnxruntime CPU fp32 and fp16 versus torch eager.

The network is quadruped_flat's actor: 48 observations -> [512, 256, 128] ELU MLP -> 12 actions,
with the observation normalizer in the graph, exported exactly as `legion export` does. Each
row times ``--calls`` single-observation calls (after 500 warm-up calls) on one thread and
reports the median and the 99th percentile. The last rows are the whole edge-runtime step (robot
state dict -> joint targets) two ways, timed in turn in blocks (so both see the same load):

- (a) `PolicyRunner.act`: the observation built in numpy (sim2real/deploy/policy.py), then
  onnxruntime fp32 on it, then the joint targets (what legion ships);
- (b) a prototype with the observation inside the ONNX graph (:class:`ObservationInGraph`: raw
  state arrays, command and last action in, actions out; projected gravity as one MatMul, joint
  offsets and scales as one Sub and one Mul) with the same state checks and targets around it;

and their parts: (a)'s numpy observation alone, (b)'s session.run alone. Then a policy that sees:
the same actor with a 64x64 depth image from a camera on the base (rsl-rl's CNN model, the default
encoder, ``agent.actor.cnn``), its onnxruntime fp32 and fp16 call and its whole
`PolicyRunner.act` (the depth image built from the state's ``front/depth`` as training did).
Goals: onnxruntime median <= 50 us, p99 <= 200 us; PolicyRunner.act p99 <= 100 us
(the edge latency budget); with the 64x64 depth image, act p99 <= 2 ms; on this CPU.

    python bench/policy_latency.py [--calls 10000]
"""

import argparse
import dataclasses
import io
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import cast

import numpy as np
from tensordict import TensorDict

from common import print_table, torch, write_json
from legion.sim2real.deploy.contract import PolicyContract


def timed(fn, calls: int) -> dict:
    for _ in range(500):
        fn()
    samples = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter_ns()
        fn()
        samples[i] = time.perf_counter_ns() - t
    return {"median_us": float(np.median(samples) / 1e3), "p99_us": float(np.percentile(samples, 99) / 1e3)}


def timed_in_turn(fns: dict, calls: int, rounds: int = 10) -> dict:
    """:func:`timed` for several functions, in turn: ``rounds`` rounds, each timing a block of
    ``calls // rounds`` calls of every function (after 20 untimed ones), so that whatever else runs
    on the machine slows them alike while each block keeps its own caches warm."""
    for fn in fns.values():
        for _ in range(500):
            fn()
    block = calls // rounds
    samples = {name: np.empty(block * rounds) for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            for _ in range(20):
                fn()
            for i in range(r * block, (r + 1) * block):
                t = time.perf_counter_ns()
                fn()
                samples[name][i] = time.perf_counter_ns() - t
    return {name: {"median_us": float(np.median(s) / 1e3), "p99_us": float(np.percentile(s, 99) / 1e3)}
            for name, s in samples.items()}


class ObservationInGraph(torch.nn.Module):
    """Option (b), a prototype: the locomotion observation computed inside the ONNX graph, in front
    of the exported actor. Inputs (B, ...) float32: ``joint_pos``, ``joint_vel``, ``base_quat``
    (x, y, z, w), ``base_lin_vel``, ``base_ang_vel`` (base frame), ``command``, ``last_action``;
    output ``actions``. Covers the terms of quadruped_flat's policy only (no clip, no joint subset)."""

    INPUTS = ("joint_pos", "joint_vel", "base_quat", "base_lin_vel", "base_ang_vel", "command", "last_action")
    SOURCES = {"base_lin_vel": "base_lin_vel", "base_ang_vel": "base_ang_vel", "projected_gravity": "gravity",
               "velocity_commands": "command", "joint_pos_rel": "joint_pos", "joint_vel": "joint_vel",
               "last_action": "last_action"}

    offset: torch.Tensor  # buffers (register_buffer), typed for the checker
    scale: torch.Tensor
    gravity: torch.Tensor
    gravity_bias: torch.Tensor

    def __init__(self, actor: torch.nn.Module, contract: PolicyContract):
        super().__init__()
        self.actor = actor
        terms = contract.observation.terms
        unknown = [t.func for t in terms if t.func not in self.SOURCES or t.clip is not None]
        if unknown:
            raise ValueError(f"the prototype does not compute {unknown}")
        self.sources = [self.SOURCES[t.func] for t in terms]
        # Gravity (0, 0, -1) in the base frame from the quaternion's outer product q q^T (16,):
        # -(2 (xz - wy), 2 (yz + wx), 1 - 2 (x^2 + y^2)).
        x, y, z, w = range(4)
        gravity = torch.zeros(16, 3)
        for (i, j), column, value in (((x, z), 0, -2), ((w, y), 0, 2), ((y, z), 1, -2), ((w, x), 1, -2),
                                      ((x, x), 2, 2), ((y, y), 2, 2)):
            gravity[4 * i + j, column] = value
        self.register_buffer("gravity", gravity)
        self.register_buffer("gravity_bias", torch.tensor([0.0, 0.0, -1.0]))
        default = torch.tensor(contract.default_joint_pos)
        offset = [default if t.func == "joint_pos_rel" else torch.zeros(t.size) for t in terms]
        scale = [torch.broadcast_to(torch.tensor(t.scale, dtype=torch.float32).reshape(-1), (t.size,)) for t in terms]
        self.register_buffer("offset", torch.cat(offset)[None])
        self.register_buffer("scale", torch.cat(scale)[None])

    def forward(self, joint_pos, joint_vel, base_quat, base_lin_vel, base_ang_vel, command, last_action):
        outer = (base_quat[:, :, None] * base_quat[:, None, :]).reshape(-1, 16)
        values = {"joint_pos": joint_pos, "joint_vel": joint_vel, "base_lin_vel": base_lin_vel,
                  "base_ang_vel": base_ang_vel, "command": command, "last_action": last_action,
                  "gravity": outer @ self.gravity + self.gravity_bias}
        obs = (torch.cat([values[s] for s in self.sources], dim=-1) - self.offset) * self.scale
        return self.actor(obs)

    def to_onnx(self, example: dict) -> bytes:
        """The module as ONNX (opset 17, dynamic batch), as `legion export` writes the actor."""
        from legion.sim2real.export import OPSET

        buffer = io.BytesIO()
        names = list(self.INPUTS)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(self.eval(), tuple(torch.from_numpy(example[n]) for n in names),
                              buffer,  # pyright: ignore[reportArgumentType]  (the legacy exporter writes to a file object)
                              opset_version=OPSET, input_names=names, output_names=["actions"],
                              dynamic_axes={n: {0: "batch"} for n in [*names, "actions"]}, dynamo=False)
        return buffer.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    args = parser.parse_args()

    import onnxruntime as ort
    from rsl_rl.models import MLPModel

    from legion.sim2real.deploy import PolicyRunner
    from legion.sim2real.export import to_fp16, to_onnx, with_metadata

    torch.manual_seed(0)
    obs = TensorDict({"policy": torch.randn(256, 48)}, batch_size=[256])
    actor = MLPModel(obs, {"actor": ["policy"]}, "actor", 12, hidden_dims=[512, 256, 128], activation="elu",
                     obs_normalization=True, distribution_cfg={"class_name": "GaussianDistribution", "init_std": 1.0})
    actor.train()
    actor.update_normalization(obs)
    actor.eval()
    x = torch.randn(1, 48)
    x_np = x.numpy()

    rows = []
    module = actor.as_onnx(verbose=False).eval()  # normalizer + MLP + mean, as exported
    with torch.inference_mode():
        rows.append({"runtime": "torch eager (inference_mode)", **timed(lambda: module(x), args.calls)})

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    fp32 = to_onnx(actor)
    fp16 = to_fp16(fp32)
    for name, model in (("onnxruntime CPU fp32", fp32), ("onnxruntime CPU fp16", fp16)):
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        rows.append({"runtime": name, **timed(lambda session=session: session.run(None, {"obs": x_np}), args.calls)})

    # The deploy path: a real export's metadata (joint order, obs layout of quadruped_flat).
    import onnx

    from legion.agents.runner import Runner
    from legion.api import LoadedRun, make_env
    from legion.configs import compose, save_config
    from legion.sim2real.deploy.policy import QUAT_NORM_TOLERANCE, NonFiniteError, StateError
    from legion.sim2real.export import build_metadata

    cfg = compose("task=quadruped_flat", "sim.num_envs=1")
    with tempfile.TemporaryDirectory() as tmp:  # a stand-in run folder: its config, the env and a runner
        run = Path(tmp)
        save_config(cfg, run / "config.yaml")
        env = make_env(cfg)
        loaded = LoadedRun(run, cfg, env, Runner(env, cfg.agent), run / "model_0.pt")
        meta = build_metadata(loaded, actor)
        onnx.save(with_metadata(fp32, meta), run / "policy.onnx")
        runner = PolicyRunner(run / "policy.onnx", providers=["CPUExecutionProvider"])
    # A tilted, moving robot: the values change no work, they make the check of (b) against (a) mean something.
    rng = np.random.default_rng(0)
    quat = rng.normal(size=4).astype(np.float32)
    state = {"joint_pos": np.asarray(meta.default_joint_pos, np.float32) + rng.normal(0, 0.1, 12).astype(np.float32),
             "joint_vel": rng.normal(0, 2, 12).astype(np.float32), "base_quat": quat / np.linalg.norm(quat),
             "base_lin_vel": rng.normal(0, 0.5, 3).astype(np.float32),
             "base_ang_vel": rng.normal(0, 0.5, 3).astype(np.float32), "base_pos": np.array([0, 0, 0.3], np.float32)}
    command = np.array([0.5, 0.0, 0.2], np.float32)

    # (b): the same actor behind the observation in the graph, and the step around it.
    in_graph = ObservationInGraph(actor.as_onnx(verbose=False).eval(), meta)
    example = {name: np.asarray(state.get(name, command if name == "command" else runner.last_action),
                                np.float32)[None] for name in ObservationInGraph.INPUTS}
    model_b = in_graph.to_onnx(example)
    session_b = ort.InferenceSession(model_b, options, providers=["CPUExecutionProvider"])
    previous = {"action": np.zeros(runner.policy.num_actions, np.float32)}

    def act_in_graph(state: dict, command: np.ndarray) -> np.ndarray:
        """(b)'s edge step with (a)'s checks: fields and shapes, a unit quaternion, finite targets."""
        runner.check_state(state)
        if abs(math.hypot(*state["base_quat"].tolist()) - 1.0) > QUAT_NORM_TOLERANCE:
            raise StateError("base_quat is not a unit quaternion")
        action = cast(list[np.ndarray], session_b.run(None, {
            "joint_pos": state["joint_pos"][None], "joint_vel": state["joint_vel"][None],
            "base_quat": state["base_quat"][None], "base_lin_vel": state["base_lin_vel"][None],
            "base_ang_vel": state["base_ang_vel"][None], "command": command[None],
            "last_action": previous["action"][None]}))[0][0]
        targets = runner.action_offset + runner.action_scale * action
        if not math.isfinite(sum(targets.tolist())):
            raise NonFiniteError("non-finite policy output")
        previous["action"] = action
        return targets

    expected = runner.policy(runner.observation(state, command)[None])[0]
    mismatch = float(np.abs(session_b.run(None, example)[0] - expected).max())
    if not mismatch <= 1e-5:
        raise SystemExit(f"the in-graph observation's actions differ from PolicyRunner's by {mismatch:.3g}")
    timings = timed_in_turn({
        "(a) edge step PolicyRunner.act: numpy observation + ort fp32": lambda: runner.act(state, command),
        "(b) edge step, observation in the ONNX graph (prototype) + ort fp32": lambda: act_in_graph(state, command),
        "(a) part: the numpy observation (PolicyRunner.observation)": lambda: runner.observation(state, command),
        "(b) part: session.run of observation + actor": lambda: session_b.run(None, example),
    }, args.calls)
    rows += [{"runtime": name, **timing} for name, timing in timings.items()]
    rows += depth_rows(args.calls, state, command)

    print(f"batch-1 latency, {args.calls} calls each, 1 thread ({ort.__version__=}, {torch.__version__=})")
    print_table(rows)
    ort_rows = [r for r in rows if r["runtime"].startswith("onnxruntime")]
    goal = all(r["median_us"] <= 50 and r["p99_us"] <= 200 for r in ort_rows)
    print(f"goal (onnxruntime median <= 50 us, p99 <= 200 us): {'met' if goal else 'NOT met'}")
    edge = {r["runtime"][:3]: r["p99_us"] <= 100 for r in rows if r["runtime"].startswith(("(a) edge", "(b) edge"))}
    sees = rows[-1]["p99_us"] <= 2000
    print(f"edge step with a 64x64 depth image (act p99 <= 2 ms): {'met' if sees else 'NOT met'}")
    print(f"edge budget (edge step p99 <= 100 us): (a) {'met' if edge['(a)'] else 'NOT met'}, "
          f"(b) {'met' if edge['(b)'] else 'NOT met'}; (b) graph: {len(onnx.load_from_string(model_b).graph.node)} "
          f"nodes, the actor alone {len(fp32.graph.node)}; (b) actions = (a) actions within {mismatch:.1g}")
    out = write_json("policy_latency", rows, calls=args.calls, network="48 -> [512, 256, 128] ELU -> 12",
                     onnxruntime=ort.__version__, goal_met=goal, edge_budget_met={"a": edge["(a)"], "b": edge["(b)"]},
                     depth_edge_step_met=sees)
    print(f"wrote {out}")


def depth_rows(calls: int, state: dict, command: np.ndarray) -> list[dict]:
    """A policy that sees: quadruped_flat's actor with a 64x64 depth image of a camera on its base,
    exported with legion export's code; onnxruntime fp32 and fp16 calls and `PolicyRunner.act`."""
    import onnx
    import onnxruntime as ort
    from rsl_rl.models import CNNModel

    from legion.agents.runner import Runner
    from legion.api import LoadedRun, make_env
    from legion.configs import compose, save_config
    from legion.configs.schema import ConvEncoder
    from legion.sim2real.deploy import PolicyRunner
    from legion.sim2real.export import build_metadata, to_fp16, to_onnx, with_metadata

    cfg = compose("task=quadruped_flat", "sim.num_envs=1",
                  "+task.scene.cameras.front={body: base, pos: [0.35, 0, 0.05], width: 64, height: 64}",
                  "+task.observations.policy_depth={depth: {func: depth_image, params: {camera: front}}}")
    obs = TensorDict({"policy": torch.randn(64, 48), "policy_depth": torch.rand(64, 1, 64, 64) * 5}, batch_size=[64])
    actor = CNNModel(obs, {"actor": ["policy", "policy_depth"]}, "actor", 12, hidden_dims=[512, 256, 128],
                     activation="elu", obs_normalization=True, cnn_cfg=dataclasses.asdict(ConvEncoder()),
                     distribution_cfg={"class_name": "GaussianDistribution", "init_std": 1.0})
    actor.update_normalization(obs)
    actor.eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    fp32 = to_onnx(actor)
    feeds = {"obs": obs["policy"][:1].numpy(), "policy_depth": obs["policy_depth"][:1].numpy()}
    rows = []
    for name, model in (("64x64 depth CNN: onnxruntime CPU fp32", fp32), ("64x64 depth CNN: onnxruntime CPU fp16",
                                                                          to_fp16(fp32))):
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        rows.append({"runtime": name, **timed(lambda session=session: session.run(None, feeds), calls)})
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        save_config(cfg, run / "config.yaml")
        env = make_env(cfg)
        meta = build_metadata(LoadedRun(run, cfg, env, Runner(env, cfg.agent), run / "model_0.pt"), actor)
        onnx.save(with_metadata(fp32, meta), run / "policy.onnx")
        runner = PolicyRunner(run / "policy.onnx", providers=["CPUExecutionProvider"])
    seeing = {**state, "front/depth": np.random.default_rng(0).uniform(0, 5, (64, 64)).astype(np.float32)}
    rows.append({"runtime": "64x64 depth CNN: edge step PolicyRunner.act", **timed(lambda: runner.act(seeing, command),
                                                                                  calls)})
    return rows


if __name__ == "__main__":
    main()
