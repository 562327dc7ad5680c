r"""Asynchronous vs synchronous PPO, side by side in one run: wall-clock throughput and learning.

For each task, seed and mode, trains the same number of iterations from the same seed and
reports env-steps/s over the whole run (wall clock; building the env is excluded), the
async/sync ratio (also without the first iteration, which async cannot overlap: it matters in
short runs only), and the final mean episode reward (last 100 episodes) with its spread over
seeds. Also the CPU cores each run actually got (process CPU time / wall time): sync needs
~1, async up to ~2, and on a shared machine other busy sessions cap it (the load average
before and after each run is in the JSON). Sync and async runs alternate (seed 0 sync,
seed 0 async, seed 1 sync, ...) so that load from other processes falls on both modes alike.
One env per task is built once and reset (and reseeded) before every run.

Writes bench/results/async_vs_sync.json and bench/results/async_vs_sync.png (reward against
wall-clock time, both modes; needs matplotlib). With ``agent=sac`` or ``agent=td3`` among the
overrides it compares the off-policy learner's actor-learner split with its sync loop at the same
update-to-data ratio (``async_vs_sync_<learner>.json``, ``.png``).

    python bench/async_vs_sync.py                                  # full run: 100 / 150 iterations, 3 seeds
    python bench/async_vs_sync.py --iterations 4 15 --seeds 0 1 2  # a quick check
    python bench/async_vs_sync.py device=cuda:0 sim.capture_step=true \
        --tasks quadruped_flat --num-envs 4096 --iterations 400 --seeds 0   # Hydra overrides for every run first
    python bench/async_vs_sync.py agent=td3 --tasks quadruped_flat --num-envs 1024 --iterations 20 --seeds 0 1 2
"""

import argparse
import copy
import os
import statistics
import time

from common import RESULTS, compose, make_env, make_runner, print_table, torch, write_json


def train_once(env, task: str, num_envs: int, mode: str, seed: int, iterations: int, lag: int,
               initial_env_state, overrides=()) -> dict:
    """One training run on an existing env; returns its throughput, final reward and curve."""
    cfg = compose(f"task={task}", f"sim.num_envs={num_envs}", f"seed={seed}", f"agent.mode={mode}",
                  f"agent.max_policy_lag={lag}", f"agent.log_interval={max(1, iterations // 5)}", *overrides)
    env.generator.manual_seed(seed)
    if initial_env_state is not None:
        env.load_state_dict(initial_env_state)
    with torch.inference_mode():  # training made the env's buffers inference tensors
        env.reset()
    torch.manual_seed(seed)
    runner = make_runner(env, cfg.agent, log_dir=None, device=cfg.device)
    load_before = os.getloadavg()[0]
    start, cpu_start = time.perf_counter(), time.process_time()
    runner.learn(iterations)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    history = list(runner.history)
    mean = lambda key: statistics.fmean(h[key] for h in history) if key in history[0] else None  # noqa: E731
    steps = iterations * cfg.agent.num_steps_per_env * num_envs
    return {
        "task": task, "mode": mode, "seed": seed, "num_envs": num_envs, "iterations": iterations,
        "wall_s": wall, "env_steps_per_s": steps / wall, "cores_used": cpu / wall,
        # After the first iteration, which async cannot overlap (nothing to learn from yet).
        "steady_env_steps_per_s": (steps - steps // iterations) / (history[-1]["time_s"] - history[0]["time_s"])
        if iterations > 1 else None,
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
        "final_reward": runner.mean_episode_return, "final_episode_length": runner.mean_episode_length,
        "collect_s_per_it": mean("collection_time_s"), "update_s_per_it": mean("learning_time_s"),
        "actor_wait_s_per_it": mean("actor_wait_s"), "learner_wait_s_per_it": mean("learner_wait_s"),
        "overlap_fraction": mean("overlap_fraction"), "lag_mean": mean("lag_mean"),
        "curve": [(h["time_s"], h["mean_reward"]) for h in history],
    }


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for task in dict.fromkeys(r["task"] for r in runs):
        by_mode = {m: [r for r in runs if r["task"] == task and r["mode"] == m] for m in ("sync", "async")}
        sync_rate = statistics.fmean(r["env_steps_per_s"] for r in by_mode["sync"])
        sync_steady = by_mode["sync"][0]["steady_env_steps_per_s"] and statistics.fmean(
            r["steady_env_steps_per_s"] for r in by_mode["sync"])
        sync_rewards = [r["final_reward"] for r in by_mode["sync"]]
        for mode, group in by_mode.items():
            rates, rewards = [r["env_steps_per_s"] for r in group], [r["final_reward"] for r in group]

            def fmt(key, group=group):
                return f"{statistics.fmean(r[key] for r in group):.2f}" if group[0][key] is not None else "-"

            rows.append({
                "task": f"{task} ({group[0]['num_envs']} envs, {group[0]['iterations']} it)",
                "mode": mode,
                "env-steps/s": statistics.fmean(rates),
                "min-max": f"{min(rates):,.0f}-{max(rates):,.0f}",
                "async/sync": f"{statistics.fmean(rates) / sync_rate:.2f}",
                "async/sync after it 1": "-" if group[0]["steady_env_steps_per_s"] is None else
                f"{statistics.fmean(r['steady_env_steps_per_s'] for r in group) / sync_steady:.2f}",
                "final reward": f"{statistics.fmean(rewards):.2f}",
                "reward min-max": f"{min(rewards):.2f}-{max(rewards):.2f}",
                "within sync spread": "-" if mode == "sync" else
                ("yes" if statistics.fmean(rewards) >= min(sync_rewards) else "no"),
                "cores used": fmt("cores_used"),
                "collect s/it": fmt("collect_s_per_it"), "update s/it": fmt("update_s_per_it"),
                "actor wait s/it": fmt("actor_wait_s_per_it"), "learner wait s/it": fmt("learner_wait_s_per_it"),
                "overlap": fmt("overlap_fraction"), "lag": fmt("lag_mean"),
            })
    return rows


def plot(runs: list[dict], path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no learning-curve plot (pip install matplotlib)")
        return False
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for mode, color in (("sync", "tab:blue"), ("async", "tab:orange")):
            for i, run in enumerate(r for r in runs if r["task"] == task and r["mode"] == mode):
                t, reward = zip(*run["curve"])
                ax.plot(t, reward, color=color, alpha=0.8, label=mode if i == 0 else None)
        ax.set(title=task, xlabel="wall-clock time [s]", ylabel="mean episode reward")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["quadruped_flat", "cartpole"])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1024, 1024], help="one per task")
    parser.add_argument("--iterations", type=int, nargs="+", default=[100, 150], help="one per task")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-policy-lag", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (key=value), e.g. device=cuda:0")
    args = parser.parse_args()
    if not len(args.tasks) == len(args.num_envs) == len(args.iterations):
        parser.error("give one --num-envs and one --iterations value per task")

    runs = []
    for task, num_envs, iterations in zip(args.tasks, args.num_envs, args.iterations):
        env = make_env(compose(f"task={task}", f"sim.num_envs={num_envs}", *args.overrides))
        initial_env_state = copy.deepcopy(env.state_dict()) if hasattr(env, "state_dict") else None
        for seed in args.seeds:
            for mode in ("sync", "async"):
                print(f"--- {task}, {num_envs} envs, {mode}, seed {seed}: {iterations} iterations "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
                runs.append(train_once(env, task, num_envs, mode, seed, iterations, args.max_policy_lag,
                                       initial_env_state, args.overrides))
        env.close()
    rows = summarize(runs)
    print_table(rows)
    learner = compose(f"task={args.tasks[0]}", *args.overrides).agent.learner
    name = "async_vs_sync" if learner == "ppo" else f"async_vs_sync_{learner}"
    path = write_json(name, rows, seeds=args.seeds, max_policy_lag=args.max_policy_lag,
                      overrides=args.overrides, runs=runs)
    print(f"wrote {path}")
    png = RESULTS / f"{name}.png"
    if plot(runs, png):
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
