r"""The learner's update on a CPU (PPO's, SAC's/TD3's with ``agent=sac|td3``, a DAgger student's with
``agent=dagger``): samples/s at each thread count, in each precision of the update's products
(``agent.precision``), under each of MKL's numerical modes and torch's CPU dispatches, for a pixel
policy in each memory layout of its CNNs' filters, and whether the weights come out the same on
every thread count.

legion-rl sets ``MKL_CBWR=AUTO,STRICT`` (MKL's conditional numerical reproducibility, strict: a
matrix product's result does not depend on the thread count) so that an update on every core
gives the weights of one thread bit for bit. This measures what that costs against MKL's default
(``MKL_CBWR=OFF``), and which settings keep the weights identical across thread counts.

``agent.precision=bf16`` (bfloat16 products; the default on a CPU with AMX or AVX512-BF16) against
``fp32``: how much faster, and that it keeps the weights independent of the thread count. ``ONEDNN_MAX_CPU_ISA`` in
the environment (e.g. ``AVX2``) caps oneDNN's instructions; it is no stand-in for another CPU (capped
at ``AVX512_CORE_BF16`` on an AMX Xeon, bf16 was slower than fp32; on an AMD EPYC with AVX512-BF16 it
is 1.5-1.7x faster).

Each (precision, MKL mode, dispatch, layout) runs in a process of its own (MKL reads ``MKL_CBWR`` at its first
call): it collects one rollout of the task, then runs the update from that same state (weights,
optimizer, random generator) ``--repeats`` times per thread count and reports the median time.
"same weights" compares the weights after one update on each thread count with those of the
first thread count, bit for bit.

    python bench/update.py [--task quadruped_flat] [--num-envs 1024] [--threads 1 2] [--repeats 5]
    python bench/update.py --modes OFF AUTO,STRICT --dispatches default avx2 avx512
    python bench/update.py --precisions fp32 bf16 --modes AUTO,STRICT --threads 1 2 4 8
    python bench/update.py --threads 1 2 --repeats 3 agent=td3   # an iteration's gradient steps
    python bench/update.py --task arm_lift_camera --num-envs 128 --threads 1 2 --repeats 3 --precisions fp32 \
        --cnn-layouts contiguous_format channels_last -- agent=dagger \
        agent.imitation.expert=scripted:legion.tasks.manipulation.expert:lift   # NCHW against NHWC filters
"""

import argparse
import itertools
import json
import os
import subprocess
import sys


def worker(task: str, num_envs: int, threads: list[int], repeats: int, cnn_layout: str, overrides: list[str]) -> dict:
    """In this process (its MKL mode and dispatch set by the caller): the update's median seconds per
    thread count, and whether each thread count's weights equal the first's."""
    import statistics
    import time

    from common import compose, make_env, make_runner, torch
    from legion.agents.imitation import ImitationRunner
    from legion.agents.off_policy import OffPolicyRunner
    from legion.agents.ppo import clone_tree, load_policy_state, policy_state
    from legion.sim2real.trajectories.demos import imitation_inputs, with_teacher_observations

    mode = [] if any(o.startswith(("agent.mode=", "agent=")) for o in overrides) else ["agent.mode=sync"]
    cfg = compose(f"task={task}", f"sim.num_envs={num_envs}", *mode, *overrides)
    torch.manual_seed(cfg.seed)
    env = make_env(with_teacher_observations(cfg))
    runner = make_runner(env, cfg.agent, device=cfg.device, **imitation_inputs(cfg.agent, env))
    owner = runner.learner if isinstance(runner, OffPolicyRunner) else runner.ppo
    layout = torch.channels_last if cnn_layout == "channels_last" else torch.contiguous_format
    for conv in (m for net in (owner.actor, owner.critic) for m in net.modules() if isinstance(m, torch.nn.Conv2d)):
        # the CNNs' filters, before any optimizer state
        conv.to(memory_format=layout)  # pyright: ignore[reportCallIssue]  (Module.to takes it; its stubs do not)
    if isinstance(runner, ImitationRunner):  # an iteration's gradient steps on the samples one rollout labelled
        actor, optimizer, generator = runner.ppo.actor, runner.optimizer, runner.generator
        runner.learn(1)
        state = lambda: {"actor": actor.state_dict(), "optimizer": optimizer.state_dict(),  # noqa: E731
                         "generator": generator.get_state()}  # its mini-batches come from its generator
        load = lambda s: (actor.load_state_dict(s["actor"]), optimizer.load_state_dict(s["optimizer"]),  # noqa: E731
                          generator.set_state(s["generator"]))
        update, modules = runner._update, (actor,)
        samples, epochs = cfg.agent.imitation.updates_per_iteration * cfg.agent.imitation.batch_size, 1
    elif isinstance(runner, OffPolicyRunner):  # an iteration's gradient steps on the buffer one iteration filled
        learner, off = runner.learner, cfg.agent.off_policy
        steps = cfg.agent.num_steps_per_env * off.update_to_data
        runner.learn(1)
        buffer = runner.buffer
        assert buffer is not None
        state, update = learner.state_dict, lambda: [learner.update(buffer) for _ in range(steps)]
        load, modules = learner.load_state_dict, (learner.actor, learner.critic)
        samples, epochs = steps * off.batch_size, 1
    else:  # a rollout, its returns, and a first update
        ppo = runner.ppo
        runner.learn(1)
        state, update = (lambda: policy_state(ppo)), ppo.update
        load, modules = (lambda s: load_policy_state(ppo, s)), (ppo.actor, ppo.critic)
        samples = cfg.agent.num_steps_per_env * num_envs  # a rollout, as the progress line counts
        epochs = cfg.agent.algorithm.num_learning_epochs
    start, rng = clone_tree(state()), torch.get_rng_state()
    seconds, weights = {}, {}
    for count in threads:
        torch.set_num_threads(count)
        times = []
        for _ in range(repeats):
            load(clone_tree(start))
            torch.set_rng_state(rng)  # the same mini-batches
            t0 = time.perf_counter()
            update()
            times.append(time.perf_counter() - t0)
        seconds[count] = statistics.median(times)
        weights[count] = [t.clone() for m in modules for t in m.state_dict().values()]
    first = weights[threads[0]]
    return {"capability": torch.backends.cpu.get_cpu_capability(), "samples": samples, "epochs": epochs,
            "seconds": seconds,
            "same": {c: all(torch.equal(a, b) for a, b in zip(first, weights[c])) for c in threads}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="quadruped_flat")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], help="values of agent.precision")
    parser.add_argument("--modes", nargs="+", default=["AUTO,STRICT"],
                        help="values of MKL_CBWR (OFF: MKL's default; AUTO,STRICT: legion-rl's)")
    parser.add_argument("--dispatches", nargs="+", default=[""],
                        help="values of ATEN_CPU_CAPABILITY (default, avx2, avx512; empty: torch's choice)")
    parser.add_argument("--cnn-layouts", nargs="+", default=["channels_last"],
                        choices=["channels_last", "contiguous_format"],
                        help="memory formats of the CNNs' filters (pixel policies; channels_last: legion-rl's)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (e.g. robot=go2)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.task, args.num_envs, args.threads, args.repeats, args.cnn_layouts[0],
                                args.overrides)))
        return

    from common import print_table, write_json

    rows, baseline = [], {}
    for precision, dispatch, mode, layout in itertools.product(args.precisions, args.dispatches, args.modes,
                                                               args.cnn_layouts):
        env = {**os.environ, "MKL_CBWR": mode, "OMP_NUM_THREADS": str(max(args.threads))}
        env.pop("ATEN_CPU_CAPABILITY", None)
        if dispatch:
            env["ATEN_CPU_CAPABILITY"] = dispatch
        out = subprocess.run([sys.executable, __file__, "--worker", "--task", args.task, "--num-envs",
                              str(args.num_envs), "--threads", *map(str, args.threads), "--repeats",
                              str(args.repeats), "--cnn-layouts", layout, "--", f"agent.precision={precision}",
                              *args.overrides],
                             env=env, capture_output=True, text=True, check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        for count in args.threads:
            s = result["seconds"][str(count)]
            key = (result["capability"], count)
            baseline.setdefault(key, s)  # the first (precision, mode, layout) is the reference
            rows.append({"precision": precision, "MKL_CBWR": mode, "dispatch": result["capability"],
                         "CNN layout": layout, "threads": count, "update s": s, "samples/s": result["samples"] / s,
                         "gradient-samples/s": result["samples"] * result["epochs"] / s,
                         "speed vs first": baseline[key] / s,
                         f"same weights as {args.threads[0]} thread(s)": result["same"][str(count)]})
    print_table(rows)
    print(f"wrote {write_json('update', rows, task=args.task, num_envs=args.num_envs, repeats=args.repeats)}")


if __name__ == "__main__":
    main()
