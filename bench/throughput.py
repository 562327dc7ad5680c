"""Throughput of quadruped_flat on this machine: raw Newton physics vs the full env.

For each num_envs: env-steps/s of LegionEnv.step with random actions (physics + actions,
commands, rewards, terminations, resets, observations) and, timed inside those same steps,
the world-steps/s of the decimated physics (NewtonSim.step, one captured Warp graph). The
overhead ratio is env time per control step over its physics time (1.20 = the env adds 20%).

    python bench/throughput.py [--num-envs 64 256 1024] [--steps 100]
"""

import argparse
import time

from common import compose, print_table, torch, write_json


def measure(num_envs: int, steps: int) -> dict:
    from legion.cli import make_env

    env = make_env(compose("task=quadruped_flat", f"sim.num_envs={num_envs}"))
    actions = torch.randn(steps, num_envs, env.num_actions, generator=torch.Generator().manual_seed(0))
    for i in range(5):  # warm up
        env.step(actions[i])
    # The physics time is measured inside env.step, on the very steps the env takes, so both
    # see the same states, contacts and solver iterations.
    physics_s = 0.0
    sim_step = env.sim.step

    def timed_sim_step():
        nonlocal physics_s
        t = time.perf_counter()
        sim_step()
        physics_s += time.perf_counter() - t

    env.sim.step = timed_sim_step
    t0 = time.perf_counter()
    for i in range(steps):
        env.step(actions[i])
    env_s = time.perf_counter() - t0
    decimation = env.sim.decimation
    return {
        "num_envs": num_envs,
        "physics world-steps/s": steps * num_envs * decimation / physics_s,
        "physics control-steps/s (x num_envs)": steps * num_envs / physics_s,
        "env-steps/s": steps * num_envs / env_s,
        "overhead ratio": env_s / physics_s,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=100, help="control steps per measurement")
    args = parser.parse_args()
    rows = [measure(n, args.steps) for n in args.num_envs]
    print_table(rows)
    print(f"wrote {write_json('throughput', rows, task='quadruped_flat', steps=args.steps)}")


if __name__ == "__main__":
    main()
