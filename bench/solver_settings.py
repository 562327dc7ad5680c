r"""SolverMuJoCo's iteration limits: speed against how often the solver stops short of converging,
and whether learning notices. quadruped_flat by default; ``--run`` measures a trained run's task
under its own policy (e.g. arm_lift's grasps, where contacts are hardest).

For each setting ``iterations/ls_iterations/tolerance`` (``sim.solver_options``):

- learning (only the settings of ``--train``): a short PPO run from the same seed, with
  ``--train-envs`` envs for ``--train-iterations`` iterations: env-steps/s over the run, the mean
  episode reward of the last 100 episodes, and the share of world control steps whose solver
  stopped at a limit while the policy learned;
- random actions, ``--num-envs`` envs for ``--steps`` control steps: env-steps/s and the share of
  world control steps whose solver stopped at the linesearch limit, at the iteration limit, or
  overflowed a capacity (``sim.solver_limits``);
- the trained policy: the same, with the policy the first ``--train`` setting learned (or the
  newest checkpoint of ``--run``) acting deterministically on those envs after a reset.

The envs of all settings are built first and step in turns, 10 steps at a time, so load from
other processes falls on every setting alike. Writes bench/results/solver_settings.json.

    python bench/solver_settings.py
    python bench/solver_settings.py --settings 10/10/1e-6 4/4/1e-6 --steps 20 --train 0 --train-iterations 2
    python bench/solver_settings.py --run runs/arm_lift/<date> --settings 10/10/1e-6 20/20/1e-6 \
        --num-envs 256 --steps 250
"""

import argparse
import time

from common import compose, make_env, make_runner, print_table, torch, write_json
from legion.api import load_run
from legion.configs import load_run_config
from legion.tasks.sim import SOLVER_LIMITS


def overrides(setting: str) -> list[str]:
    iterations, ls_iterations, tolerance = setting.split("/")
    return [f"++sim.solver_options.iterations={iterations}", f"++sim.solver_options.ls_iterations={ls_iterations}",
            f"++sim.solver_options.tolerance={tolerance}"]


def step_in_turns(envs: dict, act, steps: int, chunk: int = 10) -> dict:
    """Steps every env ``steps`` control steps with actions ``act(obs, step)``, in turns; per env its
    env-steps/s and the share of world control steps that hit each of SOLVER_LIMITS."""
    seconds = dict.fromkeys(envs, 0.0)
    hits = {name: torch.zeros(len(SOLVER_LIMITS), dtype=torch.long) for name in envs}
    obs = {name: env.get_observations() for name, env in envs.items()}
    with torch.no_grad():
        for start in range(0, steps, chunk):
            for name, env in envs.items():
                t = time.perf_counter()
                for i in range(start, min(start + chunk, steps)):
                    obs[name] = env.step(act(obs[name], i))[0]
                    hits[name] += env.sim.solver_limits
                seconds[name] += time.perf_counter() - t
    return {name: {"env-steps/s": steps * env.num_envs / seconds[name],
                   **{kind: (hits[name][k] / (steps * env.num_envs)).item() for k, kind in enumerate(SOLVER_LIMITS)}}
            for name, env in envs.items()}


def train(setting: str, num_envs: int, iterations: int, seed: int):
    """A short sync PPO run; returns its row and the trained runner."""
    cfg = compose("task=quadruped_flat", f"sim.num_envs={num_envs}", f"seed={seed}",
                  f"agent.log_interval={max(1, iterations // 4)}", *overrides(setting))
    env = make_env(cfg)
    hits = torch.zeros(len(SOLVER_LIMITS), dtype=torch.long)
    env_step = env.step

    def counting_step(actions):
        result = env_step(actions)
        hits.add_(env.sim.solver_limits)
        return result

    env.step = counting_step
    torch.manual_seed(seed)
    runner = make_runner(env, cfg.agent, log_dir=None, device=cfg.device)
    start = time.perf_counter()
    runner.learn(iterations)
    wall = time.perf_counter() - start
    world_steps = iterations * cfg.agent.num_steps_per_env * num_envs
    row = {"setting": setting, "env-steps/s": world_steps / wall, "final reward": runner.mean_episode_return,
           "limit": hits[0].item() / world_steps, "overflow": hits[-1].item() / world_steps}
    return row, runner


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+",
                        default=["10/10/1e-6", "20/20/1e-6", "10/4/1e-6", "8/8/1e-6", "6/6/1e-6", "4/4/1e-6",
                                 "10/10/1e-4"],
                        help="iterations/ls_iterations/tolerance of each setting")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=100, help="control steps per measurement")
    parser.add_argument("--train", type=int, nargs="*", default=[0, 4, 5],
                        help="indices into --settings of the settings to train (the first one's policy acts below)")
    parser.add_argument("--train-envs", type=int, default=256)
    parser.add_argument("--train-iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", default=None,
                        help="a run folder: measure its task, its newest checkpoint's policy acting (no training)")
    args = parser.parse_args()
    started = time.perf_counter()

    learning, policy, task = [], None, "quadruped_flat"
    if args.run:
        loaded = load_run(args.run, num_envs=1)
        policy, task = loaded.runner.policy.eval(), loaded.cfg.task.name
        config = lambda s: load_run_config(args.run, [f"sim.num_envs={args.num_envs}", f"seed={args.seed}",  # noqa: E731
                                                      *overrides(s)])
    else:
        for index in args.train:
            row, runner = train(args.settings[index], args.train_envs, args.train_iterations, args.seed)
            learning.append(row)
            if policy is None:
                policy = runner.policy.eval()
        config = lambda s: compose(f"task={task}", f"sim.num_envs={args.num_envs}", f"seed={args.seed}",  # noqa: E731
                                   *overrides(s))
    envs = {s: make_env(config(s)) for s in args.settings}
    num_actions = next(iter(envs.values())).num_actions
    actions = torch.randn(args.steps, args.num_envs, num_actions, generator=torch.Generator().manual_seed(args.seed))
    random = step_in_turns(envs, lambda obs, i: actions[i], args.steps)
    trained = {}
    if policy is not None:
        for env in envs.values():
            env.noise_enabled = False
            env.reset()
        trained = step_in_turns(envs, lambda obs, i: policy(obs), args.steps)

    rows = []
    for setting in args.settings:
        row = {"iterations/ls_iterations/tolerance": setting}
        for label, results in (("random", random), ("policy", trained)):
            if setting in results:
                r = results[setting]
                row.update({f"{label}: env-steps/s": r["env-steps/s"],
                            f"{label}: ls limit %": 100 * r["linesearch_limit"],
                            f"{label}: it limit %": 100 * r["iteration_limit"],
                            f"{label}: overflow %": 100 * r["overflow"]})
        rows.append(row)
    # Shares to 1e-4 %: one world control step in 100,000 (the default run measures ~100,000 per cell).
    print_table([{k: f"{v:.4f}" if k.endswith("%") else v for k, v in row.items()} for row in rows])
    if learning:
        print(f"\nlearning: {args.train_envs} envs, {args.train_iterations} iterations, seed {args.seed}")
        print_table([{**r, "limit": f"{r['limit']:.4%}", "overflow": f"{r['overflow']:.4%}"} for r in learning])
    minutes = (time.perf_counter() - started) / 60
    print(f"took {minutes:.1f} min")
    name = "solver_settings" if task == "quadruped_flat" else f"solver_settings_{task}"
    path = write_json(name, rows, task=task, run=args.run, num_envs=args.num_envs, steps=args.steps,
                      learning=learning, train_envs=args.train_envs, train_iterations=args.train_iterations,
                      seed=args.seed, minutes=minutes)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
