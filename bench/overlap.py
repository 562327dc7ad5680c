"""Threads or processes: which runs the actor and the learner side by side better on this CPU?

``agent.mode=async`` runs its actor and learner as two threads of one process: Warp kernels,
Warp graph replay and torch kernels release the GIL, and weights and rollouts pass by
reference. Two processes would never contend for the GIL, but would have to share rollouts and
weights through shared memory. This measures what the GIL costs before anyone builds that:

- the actor's work (policy forward pass + env step, as the async actor does it) and the
  learner's work (V-trace targets + rsl-rl's PPO update on a full rollout) are each run alone
  for a fixed time, then both at once as two threads of one process, then as two processes;
- each side reports its rate; "vs alone" is that rate over the rate alone, and "cores' worth"
  adds the two up (2.00 = both sides as fast as alone: perfect overlap on 2 cores).

Each side builds its own env and networks (in both layouts), so the only difference between
the two layouts is sharing one interpreter. Writes bench/results/overlap.json.

    python bench/overlap.py                                     # quadruped_flat and cartpole, 1024 envs
    python bench/overlap.py --tasks cartpole --seconds 10
"""

import argparse
import multiprocessing as mp
import queue
import statistics
import threading
import time

from common import compose, make_env, print_table, torch, write_json


def side(role: str, cfg, seconds: float, start, results) -> None:
    """One side's work for ``seconds`` after every side passed ``start`` (a barrier); puts
    (role, units per second) on ``results``: env-steps/s for the actor, samples/s for the learner."""
    try:
        results.put((role, _work(role, cfg, seconds, start)))
    except BaseException as e:
        start.abort()  # the other side must not wait for this one
        results.put((role, RuntimeError(f"{role}: {e!r}")))
        raise


def _work(role: str, cfg, seconds: float, start) -> float:
    from legion.agents.ppo import RolloutBuffer, build_behaviour_ppo, build_ppo, compute_returns_off_policy

    agent = cfg.agent
    env = make_env(cfg)
    steps, num_envs = agent.num_steps_per_env, env.num_envs
    storage = RolloutBuffer(env, steps, "cpu")
    if role == "actor":
        ppo = build_behaviour_ppo(env, agent, "cpu", critic=False)
        ppo.storage = storage
    else:
        ppo = build_ppo(env, agent, "cpu", storage=storage)
    obs = env.get_observations()

    @torch.inference_mode()
    def collect(obs):
        """One rollout, as the async actor collects it."""
        for _ in range(steps):
            obs, rewards, dones, extras = env.step(ppo.act(obs))
            ppo.process_env_step(obs, rewards, dones, extras)
        storage.last_obs.copy_(obs)
        return obs

    if role == "learner":
        obs = collect(obs)  # one rollout to learn from, over and over
    ppo.train_mode()
    start.wait()
    units, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if role == "actor":
            obs = collect(obs)
            storage.clear()
        else:
            with torch.inference_mode():
                compute_returns_off_policy(ppo, storage, 1.0, 1.0)
            ppo.update()
        units += steps * num_envs
    return units / (time.perf_counter() - t0)


def measure(layout: str, roles: list[str], task: str, num_envs: int, seconds: float) -> dict:
    """Runs ``roles`` at once as threads of this process or as separate processes."""
    cfg = compose(f"task={task}", f"sim.num_envs={num_envs}")  # here: Hydra's compose is not thread-safe
    if layout == "thread":
        start, results = threading.Barrier(len(roles)), queue.Queue()
        workers = [threading.Thread(target=side, args=(r, cfg, seconds, start, results)) for r in roles]
    else:
        ctx = mp.get_context("spawn")  # fresh interpreters, as a process-based runner would start
        start, results = ctx.Barrier(len(roles)), ctx.Queue()
        workers = [ctx.Process(target=side, args=(r, cfg, seconds, start, results)) for r in roles]
    for worker in workers:
        worker.start()
    rates = dict(results.get() for _ in roles)
    for worker in workers:
        worker.join()
    errors = [rate for rate in rates.values() if isinstance(rate, BaseException)]
    if errors:
        raise errors[0]
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["quadruped_flat", "cartpole"])
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each measurement runs")
    parser.add_argument("--repeats", type=int, default=2, help="alternating rounds of every layout (median kept)")
    args = parser.parse_args()

    rows = []
    for task in args.tasks:
        samples = {key: [] for key in ("actor alone", "learner alone", "thread", "process")}
        for _ in range(args.repeats):  # alternate, so that load from elsewhere falls on every layout alike
            samples["actor alone"].append(measure("thread", ["actor"], task, args.num_envs, args.seconds))
            samples["learner alone"].append(measure("thread", ["learner"], task, args.num_envs, args.seconds))
            samples["thread"].append(measure("thread", ["actor", "learner"], task, args.num_envs, args.seconds))
            samples["process"].append(measure("process", ["actor", "learner"], task, args.num_envs, args.seconds))
        median = {key: {role: statistics.median(s[role] for s in runs) for role in runs[0]}
                  for key, runs in samples.items()}
        alone = {"actor": median["actor alone"]["actor"], "learner": median["learner alone"]["learner"]}
        for layout, label in (("thread", "two threads, one process (agent.mode=async)"), ("process", "two processes")):
            actor, learner = median[layout]["actor"] / alone["actor"], median[layout]["learner"] / alone["learner"]
            rows.append({
                "task": f"{task} ({args.num_envs} envs)", "layout": label,
                "actor env-steps/s": median[layout]["actor"], "actor vs alone": f"{actor:.2f}",
                "learner samples/s": median[layout]["learner"], "learner vs alone": f"{learner:.2f}",
                "cores' worth": f"{actor + learner:.2f}",
            })
        print(f"{task}: alone, actor {alone['actor']:,.0f} env-steps/s, learner {alone['learner']:,.0f} samples/s",
              flush=True)
    print_table(rows)
    print(f"wrote {write_json('overlap', rows, seconds=args.seconds, repeats=args.repeats)}")


if __name__ == "__main__":
    main()
