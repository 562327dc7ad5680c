"""Batch-1 latency of the locomotion policy: onnxruntime CPU fp32 and fp16 versus torch eager.

The network is quadruped_flat's actor: 48 observations -> [512, 256, 128] ELU MLP -> 12 actions,
with the observation normalizer in the graph, exported exactly as `legion export` does. Each
row times ``--calls`` single-observation calls (after 500 warm-up calls) on one thread and
reports the median and the 99th percentile. The last row is the whole edge-runtime step
(`PolicyRunner.act`: observation from a robot-state dict, onnxruntime fp32, joint targets).
Goal (issue 5): onnxruntime median <= 50 us, p99 <= 200 us on this CPU.

    python bench/policy_latency.py [--calls 10000]
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from common import ROOT, print_table, torch, write_json


def timed(fn, calls: int) -> dict:
    for _ in range(500):
        fn()
    samples = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter_ns()
        fn()
        samples[i] = time.perf_counter_ns() - t
    return {"median_us": float(np.median(samples) / 1e3), "p99_us": float(np.percentile(samples, 99) / 1e3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    args = parser.parse_args()

    import onnxruntime as ort
    from rsl_rl.models import MLPModel
    from tensordict import TensorDict

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
        rows.append({"runtime": name, **timed(lambda: session.run(None, {"obs": x_np}), args.calls)})

    # The deploy path: a real export's metadata (joint order, obs layout of quadruped_flat).
    from common import compose, make_env

    from legion.agents.runner import Runner
    from legion.runs import LoadedRun, save_config
    from legion.sim2real.export import build_metadata

    cfg = compose("task=quadruped_flat", "sim.num_envs=1")
    with tempfile.TemporaryDirectory() as tmp:  # a stand-in run folder: its config, the env and a runner
        run = Path(tmp)
        save_config(cfg, run / "config.yaml")
        env = make_env(cfg)
        loaded = LoadedRun(run, cfg, env, Runner(env, cfg.agent), run / "model_0.pt")
        meta = build_metadata(loaded, actor)
        import onnx

        onnx.save(with_metadata(fp32, meta), run / "policy.onnx")
        runner = PolicyRunner(run / "policy.onnx", providers=["CPUExecutionProvider"])
        state = {"joint_pos": np.asarray(meta["default_joint_pos"], np.float32), "joint_vel": np.zeros(12, np.float32),
                 "base_quat": np.array([0, 0, 0, 1], np.float32), "base_lin_vel": np.zeros(3, np.float32),
                 "base_ang_vel": np.zeros(3, np.float32), "base_pos": np.array([0, 0, 0.3], np.float32)}
        command = np.array([0.5, 0.0, 0.0], np.float32)
        rows.append({"runtime": "edge runtime PolicyRunner.act (obs + ort fp32)",
                     **timed(lambda: runner.act(state, command), args.calls)})

    print(f"batch-1 latency, {args.calls} calls each, 1 thread ({ort.__version__=}, {torch.__version__=})")
    print_table(rows)
    ort_rows = [r for r in rows if r["runtime"].startswith("onnxruntime")]
    goal = all(r["median_us"] <= 50 and r["p99_us"] <= 200 for r in ort_rows)
    print(f"goal (onnxruntime median <= 50 us, p99 <= 200 us): {'met' if goal else 'NOT met'}")
    out = write_json("policy_latency", rows, calls=args.calls, network="48 -> [512, 256, 128] ELU -> 12",
                     onnxruntime=ort.__version__, goal_met=goal)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
