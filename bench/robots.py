"""Throughput of each real robot against legion-rl's authored model of its kind, in one run.

For each pair (task: authored robot vs real robot), two envs of the same size step in turns, 10
steps at a time (so a busy machine slows both alike), with the same random actions: env-steps/s
of each, the real robot's share of the authored one's, and the contacts per robot MuJoCo Warp
made at the last step (the cost that grows with mesh colliders; sim.backend=warp only).

    python bench/robots.py [--num-envs 256] [--steps 100] [--device cpu|cuda:0] [--robots go2 g1 panda]
"""

import argparse

from throughput import timed_steps

from common import compose, make_env, print_table, torch, write_json

PAIRS = [("quadruped_flat", "quadruped", "go2"), ("biped_flat", "biped", "g1"), ("arm_reach", "arm", "panda")]


def contacts_per_robot(env) -> float | None:
    """MuJoCo Warp's contact count over the robots; None on the C backend, which keeps none (MuJoCo
    Warp's data there holds the state, not the contacts)."""
    if env.sim.backend == "c":
        return None
    return round(int(env.sim.solver.solver.mjw_data.nacon.numpy()[0]) / env.num_envs, 1)


def measure(task: str, robots: tuple[str, str], num_envs: int, steps: int, device: str, chunk: int = 10) -> dict:
    envs = {robot: make_env(compose(f"task={task}", f"robot={robot}", f"sim.num_envs={num_envs}", f"device={device}"))
            for robot in robots}
    seconds = dict.fromkeys(robots, 0.0)
    actions = {robot: torch.randn(steps + 5, num_envs, env.num_actions, generator=torch.Generator().manual_seed(0))
               .to(device) for robot, env in envs.items()}
    for robot, env in envs.items():
        timed_steps(env, actions[robot], range(5), device)  # warm up
    for start in range(5, steps + 5, chunk):
        for robot, env in envs.items():
            seconds[robot] += timed_steps(env, actions[robot], range(start, min(start + chunk, steps + 5)), device)
    rate = {robot: steps * num_envs / s for robot, s in seconds.items()}
    authored, real = robots
    return {"task": task, "num_envs": num_envs, "authored (env-steps/s)": f"{authored}: {rate[authored]:,.0f}",
            "real (env-steps/s)": f"{real}: {rate[real]:,.0f}",
            "real / authored": round(rate[real] / rate[authored], 3),
            "backend": envs[real].sim.backend,
            "contacts per robot (authored, real)": (contacts_per_robot(envs[authored]), contacts_per_robot(envs[real]))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100, help="control steps per robot")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--robots", nargs="+", default=[real for _, _, real in PAIRS], help="real robots to measure")
    args = parser.parse_args()
    rows = [measure(task, (authored, real), args.num_envs, args.steps, args.device)
            for task, authored, real in PAIRS if real in args.robots]
    print_table(rows)
    print(f"wrote {write_json('robots', rows, steps=args.steps, device=args.device)}")


if __name__ == "__main__":
    main()
