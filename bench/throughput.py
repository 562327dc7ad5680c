"""Throughput of a task (default quadruped_flat) on this machine: raw Newton physics vs the full env.

For each num_envs: env-steps/s of LegionEnv.step with random actions (physics + actions,
commands, rewards, terminations, resets, observations) and the world-steps/s of the decimated
physics (NewtonSim.step, one captured Warp graph): on the CPU timed inside those same env steps,
on CUDA as a loop of its own (every clock read after torch.cuda.synchronize). The overhead ratio
is env time per control step over its physics time (1.20 = the env adds 20%). On CUDA the env is
also measured with the whole control step captured as one CUDA graph (``sim.capture_step=true``):
its env-steps/s and its ratio to the same physics time.

Then the cost of domain randomization, env-steps/s of five envs of the same size stepping in
turns, 10 steps at a time (so a busy machine slows them alike):
- off: every event term of task.events off (episodes start at the exact default state) and no
  observation noise;
- default: the task's config as it is (legged_gym's set: friction, added base mass, pushes,
  random initial state);
- all on: every term on as configured (physical parameters drawn once at startup; initial
  state, latency and observation noise at each episode start; pushes);
- all on but joint_friction: the same without dry joint friction, whose cost is MuJoCo's own
  (a friction-loss constraint row per joint for its solver), not the randomization's;
- all on, per reset: the same with every physical parameter re-drawn at every episode start
  (the solver is told of new masses, gains and materials at nearly every step).

The process's peak memory so far (resident set) is reported with each row: with num_envs in
rising order, that of the largest env yet.

    python bench/throughput.py [--task quadruped_flat] [--num-envs 64 256 1024] [--steps 100]
                               [--device cpu|cuda:0] [--no-randomization] [Hydra overrides, e.g. robot=go2]
"""

import argparse
import resource
import time

from common import compose, make_env, print_table, torch, write_json


def measure(num_envs: int, steps: int, device: str, task: str = "quadruped_flat", overrides=()) -> dict:
    env = make_env(compose(f"task={task}", f"sim.num_envs={num_envs}", f"device={device}", *overrides))
    actions = torch.randn(steps, num_envs, env.num_actions, generator=torch.Generator().manual_seed(0)).to(device)
    for i in range(5):  # warm up
        env.step(actions[i])
    if device.startswith("cuda"):
        # Launches return before the GPU is done: synchronize before every clock read. Timing the
        # physics inside env.step would add synchronizations to the env step, so the decimated
        # physics alone runs as its own loop, after the env steps, from the states they left.
        env_s = timed_steps(env, actions, range(steps), device)
        t0 = time.perf_counter()
        for _ in range(steps):
            env.sim.step()
        torch.cuda.synchronize()
        physics_s = time.perf_counter() - t0
        captured = make_env(compose(f"task={task}", f"sim.num_envs={num_envs}", f"device={device}",
                                    "sim.capture_step=true", *overrides))
        for i in range(5):  # warm up: eager steps, then the capture
            captured.step(actions[i])
        captured_s = timed_steps(captured, actions, range(steps), device)
    else:
        # On the CPU every call returns when its work is done: the physics time is measured inside
        # env.step, on the very steps the env takes, so both see the same states and contacts.
        physics_s = 0.0
        sim_step = env.sim.step

        def timed_sim_step():
            nonlocal physics_s
            t = time.perf_counter()
            sim_step()
            physics_s += time.perf_counter() - t

        env.sim.step = timed_sim_step
        env_s = timed_steps(env, actions, range(steps), device)
    decimation = env.sim.decimation
    row = {
        "num_envs": num_envs,
        "physics world-steps/s": steps * num_envs * decimation / physics_s,
        "physics control-steps/s (x num_envs)": steps * num_envs / physics_s,
        "env-steps/s": steps * num_envs / env_s,
        "overhead ratio": env_s / physics_s,
        "peak RSS [GB]": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,  # Linux: kB
    }
    if device.startswith("cuda"):
        row.update({"captured env-steps/s": steps * num_envs / captured_s, "captured ratio": captured_s / physics_s})
    return row


def timed_steps(env, actions: torch.Tensor, indices: range, device: str) -> float:
    """Seconds for the env steps with ``actions[i]`` for i in ``indices``; on CUDA the queue is
    drained before and after (launches return before the GPU is done)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in indices:
        env.step(actions[i])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def randomization_cost(num_envs: int, steps: int, device: str, task: str = "quadruped_flat", chunk: int = 10,
                       overrides=()) -> dict:
    base = (f"task={task}", f"sim.num_envs={num_envs}", f"device={device}", *overrides)
    events = compose(*base).task.events
    physics = [n for n, e in events.items() if e.mode == "startup"]
    every = [f"++task.events.{n}.enabled=true" for n in events]
    variants = {
        "off": [f"++task.events.{n}.enabled=false" for n in events],
        "default": [],
        "all on": every,
        "all on but joint_friction": every + ["task.events.joint_friction.enabled=false"],
        "all on, per reset": every + [f"task.events.{n}.mode=reset" for n in physics],
    }
    envs = {name: make_env(compose(*base, *overrides)) for name, overrides in variants.items()}
    envs["off"].noise_enabled = False
    actions = torch.randn(steps + 5, num_envs, envs["off"].num_actions,
                          generator=torch.Generator().manual_seed(0)).to(device)
    seconds = dict.fromkeys(envs, 0.0)
    for env in envs.values():
        for i in range(5):  # warm up
            env.step(actions[i])
    for start in range(5, steps + 5, chunk):
        for name, env in envs.items():
            seconds[name] += timed_steps(env, actions, range(start, min(start + chunk, steps + 5)), device)
    rate = {name: steps * num_envs / s for name, s in seconds.items()}
    row = {"num_envs": num_envs, "off (env-steps/s)": rate["off"]}
    for name in list(variants)[1:]:
        row[name] = f"{rate[name]:,.0f} ({rate[name] / rate['off'] - 1:+.1%})"
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=100, help="control steps per measurement")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--task", default="quadruped_flat")
    parser.add_argument("--randomization", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the cost of domain randomization")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the task's config (e.g. robot=go2)")
    args = parser.parse_args()
    rows = [measure(n, args.steps, args.device, args.task, args.overrides) for n in args.num_envs]
    print_table(rows)
    cost = None
    if args.randomization:
        print()
        cost = [randomization_cost(n, args.steps, args.device, args.task, overrides=args.overrides)
                for n in args.num_envs]
        print_table(cost)
    name = "throughput" if args.task == "quadruped_flat" else f"throughput_{args.task}"
    name += "".join(f"_{o.split('=', 1)[1]}" for o in args.overrides if o.startswith("robot="))
    path = write_json(name, rows, task=args.task, steps=args.steps, device=args.device, randomization=cost,
                      overrides=args.overrides)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
