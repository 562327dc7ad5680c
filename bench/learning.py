r"""Learning against the clock: train a task from scratch for a wall-clock budget and measure the
policy with `legion eval`'s metrics as it learns.

Training runs in chunks; after every ``--eval-every`` minutes of training (and at 0 and at the
end) a checkpoint is written and evaluated on a second env of the same task (legion/evaluation.py:
held commands or whole episodes, noise off, randomization as trained). Evaluation time is not
training time: the clock counts training only. The goal, whose first evaluation that meets it
gives the time to goal: locomotion "walks" (forward tracking error < 0.1 m/s and falls < 5% over
all commands); goal tasks (arm_reach, arm_lift) a success rate >= --success-goal (0.97).

Writes bench/results/learning_<task>.json (per evaluation: training time, iteration, env-steps,
training reward, the summary metrics, the full `legion eval` rows and, for goal tasks, each reward
term per second of episode, the stages a staged task's policy reaches, and per axis how far the
goal is followed), bench/results/learning_<task>.png (tracking error and falls, or success rate
and final error, and training reward against minutes of training) and prints a markdown table.
The run itself (config, checkpoints, TensorBoard) goes to runs/<task>/<date>_learning.

    python bench/learning.py --task quadruped_flat --mode async --minutes 90 --eval-every 10 --num-envs 1024
    python bench/learning.py --task arm_reach --minutes 30 --eval-every 5
    python bench/learning.py --mode td3 --minutes 30 --eval-every 3 --stop-at-goal   # off-policy: learning_<task>_td3
    python bench/learning.py --mode sync --minutes 12 --eval-every 0.7 --stop-at-goal --tag seed0 seed=0  # to walk
    python bench/learning.py --task biped_flat --minutes 2 --eval-every 1 sim.num_envs=256   # a quick check
    python bench/learning.py --task quadruped_flat --minutes 45 --eval-every 9 robot=go2   # learning_quadruped_flat_go2
    python bench/learning.py --task quadruped_flat --minutes 45 --tag lstm robot=go2 agent.actor.rnn.type=lstm   # _lstm
    python bench/learning.py --task quadruped_flat --minutes 20 --eval-every 2 --num-envs 1024 sim.backend=warp
    python bench/learning.py --task arm_lift --minutes 60 --eval-every 15 --episodes 100 --resume   # 60 min more
    python bench/learning.py --task arm_lift_ik --mode dagger --num-envs 128 --minutes 8 --eval-every 2 \
        --success-goal 0.9 agent.imitation.expert=scripted:legion.tasks.manipulation.expert:lift   # DAgger

``--resume`` continues the run that bench/results/learning_<task>.json records, with that run's
config, from its newest checkpoint, for ``--minutes`` more of training: the clock, the env-steps
and the table go on from the record (a long CPU run in sessions, or a run stopped early). Overrides
given with ``--resume`` change how the run trains on (fine-tuning, e.g. ``robot=g1
task.action.clamp_to_limits=true``): the run's config.yaml takes them, and the record lists them
under ``resumed_with`` with the minute they began.

``--nproc K`` trains as K torchrun ranks on this machine (`legion train --nproc`: ``sim.num_envs``
per rank, gradients averaged), e.g. on a CPU whose task steps on one core (arm_lift). Rank 0
evaluates, keeps the clock and writes the record; the others wait for it at the next chunk.

    python bench/learning.py --task arm_lift --nproc 2 --mode sync --num-envs 512 --minutes 90 --eval-every 15
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from common import RESULTS, RUNS, compose, make_env, make_runner, print_table, write_json
from legion import evaluation
from legion.agents import distributed
from legion.agents.checkpoints import latest_good_checkpoint
from legion.api import seed_everything
from legion.configs import load_run_config, save_config
from legion.sim2real.trajectories.demos import imitation_inputs, with_teacher_observations


def summarize(report: dict, train_s: float, iteration: int, env_steps: int, reward: float,
              success_goal: float) -> dict:
    """One evaluation as a row: training progress, then the forward command's error and means over
    commands (locomotion) or the success rate and final errors (goal tasks); ``goal`` if met."""
    progress = {"train_min": train_s / 60, "iteration": iteration, "env_steps_M": env_steps / 1e6,
                "train_reward": reward}
    if report["kind"] in evaluation.GOAL_COMMANDS:
        return {**progress, **report["rows"][0], "goal": evaluation.goal_met(report, success_goal)}
    rows = {r["command"]: r for r in report["rows"]}
    moving = [r for r in report["rows"] if r["command"] != "stand"]
    def mean(key: str, rs: list[dict]) -> float | None:  # over the commands measured (None: all of them fell)
        values = [r[key] for r in rs if r[key] is not None]
        return sum(values) / len(values) if values else None

    forward = rows.get("forward")
    levels = [r["terrain_level"] for r in report["rows"] if r["terrain_level"] is not None]
    row = {
        **progress,
        "forward_error": forward["vel_error_xy"] if forward else None,
        "forward_drift": forward["lateral_drift"] if forward else None,  # signed v_y bias [m/s]
        "mean_error_xy": mean("vel_error_xy", moving) if moving else None,
        "mean_yaw_error": mean("yaw_rate_error", report["rows"]),
        "fall_rate": mean("fall_rate", report["rows"]),
        "terrain_level": sum(levels) / len(levels) if levels else None,
    }
    row["goal"] = evaluation.goal_met(report)
    return row


def plot(rows: list[dict], task: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["train_min"] for r in rows]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(7, 7.5), sharex=True)
    if "success_rate" in rows[0]:
        top.plot(minutes, [100 * r["success_rate"] for r in rows], marker="o")
        top.set_ylabel("success [%]")
        middle.plot(minutes, [100 * r["final_position_error_m"] for r in rows], marker="o", color="tab:red")
        middle.set_ylabel("final position error [cm]")
    else:
        plot_tracking(rows, minutes, top, middle)
    bottom.plot(minutes, [r["train_reward"] for r in rows], marker="o", color="tab:green")
    bottom.set_ylabel("training reward")
    bottom.set_xlabel("training time [min]")
    for ax in (top, middle, bottom):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{task}: legion eval metrics while learning", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_tracking(rows: list[dict], minutes: list[float], top, middle) -> None:
    for key, label in (("forward_error", "forward |v_xy error| [m/s]"), ("mean_error_xy", "mean over moving commands"),
                       ("mean_yaw_error", "mean |yaw rate error| [rad/s]")):
        if rows[0][key] is not None:
            top.plot(minutes, [r[key] for r in rows], marker="o", label=label)
    top.axhline(evaluation.WALK_ERROR, color="0.5", linestyle="--", linewidth=1)
    top.set_ylabel("tracking error")
    top.legend(fontsize=8, loc="best")
    middle.plot(minutes, [100 * r["fall_rate"] for r in rows], marker="o", color="tab:red")
    middle.axhline(100 * evaluation.WALK_FALLS, color="0.5", linestyle="--", linewidth=1)
    middle.set_ylabel("falls [%]")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="quadruped_flat")
    parser.add_argument("--minutes", type=float, default=90.0, help="training wall-clock budget")
    parser.add_argument("--eval-every", type=float, default=10.0, help="minutes of training between evaluations")
    parser.add_argument("--mode", default="async", choices=("sync", "async", "bc", "dagger", "sac", "td3"),
                        help="PPO (sync, async), learning from demonstrations (bc, dagger: agent.imitation.*) or an "
                             "off-policy learner (sac, td3: agent=sac|td3, agent.off_policy.*)")
    parser.add_argument("--num-envs", type=int, default=None, help="training envs (default: the task's)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--envs-per-command", type=int, default=16, help="evaluation envs per command")
    parser.add_argument("--eval-seconds", type=float, default=10.0, help="evaluation episode length")
    parser.add_argument("--episodes", type=int, default=200, help="goal tasks: evaluation episodes")
    parser.add_argument("--success-goal", type=float, default=0.97, help="goal tasks: success rate to reach")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run recorded in bench/results/learning_<task>.json for --minutes more, "
                             "with its own config (--mode, --num-envs, --device do not apply)")
    parser.add_argument("--nproc", type=int, default=1,
                        help="train as this many torchrun ranks on this machine (--num-envs per rank)")
    parser.add_argument("--stop-at-goal", action="store_true",
                        help="stop once the goal is met at two evaluations in a row; the time to goal is the "
                             "first of the two")
    parser.add_argument("--tag", default="",
                        help="a suffix for the record's and the run's names, so that runs of one task and robot "
                             "that differ otherwise (e.g. --tag lstm) keep records of their own")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the training config (key=value)")
    args = parser.parse_args()
    if args.nproc < 1:
        parser.error("--nproc K: K processes (ranks), K >= 1")
    if distributed.launched():
        args.nproc = int(os.environ["WORLD_SIZE"])
    elif args.nproc > 1:  # the ranks get the arguments less --nproc, which torchrun would take for its own
        rest = [a for i, a in enumerate(sys.argv[1:]) if not a.startswith("--nproc") and sys.argv[i] != "--nproc"]
        os.execvp(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   f"--nproc_per_node={args.nproc}", __file__, *rest])
    # robot=go2, sim.backend=warp or --mode dagger: a record of its own (learning_quadruped_flat_go2, ..._warp)
    name = f"learning_{args.task}" + "".join(f"_{o.split('=', 1)[1]}" for o in args.overrides
                                              if o.startswith(("robot=", "sim.backend=")))
    name += f"_{args.mode}" if args.mode in ("bc", "dagger", "sac", "td3") else ""  # learning_arm_lift_dagger
    name += f"_{args.tag}" if args.tag else ""
    record = RESULTS / f"{name}.json"
    changes: list[str] = []  # overrides a resumed run trains on with
    if args.resume:
        if not record.is_file():
            parser.error(f"--resume: no record of an earlier run at {record}; start one without --resume")
        previous = json.loads(record.read_text())
        if previous.get("ranks", 1) != args.nproc:  # env-steps are iterations x samples per iteration
            parser.error(f"--resume: the recorded run trained as {previous.get('ranks', 1)} rank(s); "
                         f"resume it with --nproc {previous.get('ranks', 1)}")
        run_dir = Path(previous["run"])
        # the run's own config (same task, robot, envs, mode); robot= only names the record. Other
        # overrides change how it trains on (e.g. task.action.clamp_to_limits=true): the run's
        # config.yaml then says so, as `legion train`'s does, for its evaluation, export and sim2sim.
        changes = [o for o in args.overrides if not o.startswith("robot=")]
        cfg = load_run_config(run_dir, changes)
        if changes:
            save_config(cfg, run_dir / "config.yaml")
    else:
        previous = None
        learner = [f"agent={args.mode}"] if args.mode in ("sac", "td3") else [f"agent.mode={args.mode}"]
        if any(o.startswith("agent=") for o in args.overrides):  # a preset of the mode's, e.g. agent=sac_efficient
            learner = []
        overrides = [f"task={args.task}", *learner, f"device={args.device}",
                     "agent.max_iterations=null", "agent.save_interval=1000000", "agent.save_every_minutes=null",
                     "agent.log_interval=10", *([f"sim.num_envs={args.num_envs}"] if args.num_envs else []),
                     *args.overrides]
        cfg = compose(*overrides)
        if cfg.agent.imitation.learning_rate_final is not None and cfg.agent.max_iterations is None:
            # a rate that falls over the run's iterations keeps the task's count (the clock still stops it)
            cfg = compose(*(o for o in overrides if o != "agent.max_iterations=null"))
    group = None
    if distributed.launched():  # an evaluation keeps the other ranks waiting: allow it an hour
        group, device = distributed.join(cfg.device, timeout_s=3600)
    main = group is None or group.is_main
    share = (lambda obj: distributed.broadcast(obj, group)) if group else (lambda obj: obj)  # rank 0's value
    if not previous:
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S") + "_learning" + (f"_{args.tag}" if args.tag else "")
        run_dir = share(RUNS / args.task / stamp if main else None)
        if main:
            run_dir.mkdir(parents=True)
            save_config(cfg, run_dir / "config.yaml")
    if group:
        cfg.device, cfg.seed = device, cfg.seed + group.rank  # as legion train's ranks
    seed_everything(cfg.seed)
    env = make_env(with_teacher_observations(cfg))
    runner = make_runner(env, cfg.agent, log_dir=run_dir if main else None, device=cfg.device, group=group,
                         **imitation_inputs(cfg.agent, env))
    if previous:
        path, contents = share(latest_good_checkpoint(run_dir) if main else None)
        runner.load(path, contents)
        if main:
            print(f"[learning] resumed {path} at iteration {runner.iteration}, "
                  f"{previous['rows'][-1]['train_min']:.1f} min of training so far", flush=True)
    if not main:  # train the chunks rank 0 plans, until it says stop (0)
        while chunk := share(None):
            runner.learn(runner.iteration + chunk)
        env.close()
        distributed.leave()
        return
    options = evaluation.Options(envs_per_command=args.envs_per_command, duration_s=args.eval_seconds,
                                 episodes=args.episodes)
    samples = cfg.agent.num_steps_per_env * cfg.sim.num_envs * args.nproc
    every = 60 * args.eval_every
    print(f"[learning] {args.task}, {cfg.sim.num_envs} envs{f' x {args.nproc} ranks' if group else ''}, "
          f"{cfg.agent.mode if cfg.agent.learner == 'ppo' else cfg.agent.learner}, "
          f"{args.minutes:g} min of training, evaluation every {args.eval_every:g} min; "
          f"run folder {run_dir}", flush=True)

    loaded, rows, evaluations, train_s, resumed_with = None, [], [], 0.0, []
    if previous:
        rows, evaluations, train_s = previous["rows"], previous["evaluations"], 60 * previous["rows"][-1]["train_min"]
        resumed_with = previous.get("resumed_with", []) + ([{"at_min": train_s / 60, "overrides": changes}]
                                                           if changes else [])
    budget = train_s + 60 * args.minutes

    def evaluate() -> None:
        nonlocal loaded
        path = runner.save()
        if loaded is None:  # the evaluation env, built once
            loaded = evaluation.load(run_dir, options, path)
        else:
            loaded.runner.load(path, episodes=False)
            loaded.checkpoint = path
        report = evaluation.measure(loaded, options)
        row = summarize(report, train_s, runner.iteration, runner.iteration * samples, runner.mean_episode_return,
                        args.success_goal)
        rows.append(row)
        evaluations.append({"train_min": row["train_min"], "iteration": row["iteration"], "rows": report["rows"],
                            "rewards": report.get("rewards"), "axes": report.get("axes")})
        if "success_rate" in row:
            what = (f"success {row['success_rate']:.1%}, final error {100 * row['final_position_error_m']:.1f} cm; "
                    f"{evaluation.reward_line(report['rewards'])}; {evaluation.axes_line(report['axes'])}")
        else:
            forward = row["forward_error"]
            what = f"forward error {forward if forward is None else round(forward, 3)}, falls {row['fall_rate']:.0%}"
        print(f"[learning] {row['train_min']:.1f} min, it {row['iteration']}: {what}"
              f"{', goal met' if row['goal'] else ''}", flush=True)

    if not previous:
        evaluate()
    next_eval = train_s + every
    # Seconds per iteration, of the latest chunk: an iteration slows by half once the policy touches
    # and grasps (contacts), so chunks are re-planned every few minutes at most.
    per_iteration, chunk = None, 1
    while train_s < budget - (per_iteration or 0) / 2:  # as the evaluation below: within half an iteration
        target = min(next_eval, budget)
        # ... and grow at most 4x a chunk: the first iterations can be far quicker than the rest (a
        # resumed DAgger student gathers samples before it updates).
        chunk = share(1 if per_iteration is None else
                      max(1, min(4 * chunk, round(min(target - train_s, 180) / per_iteration))))
        start = time.perf_counter()
        runner.learn(runner.iteration + chunk)
        per_iteration = (time.perf_counter() - start) / chunk
        train_s += per_iteration * chunk
        if train_s >= target - per_iteration / 2:
            evaluate()
            next_eval += every
            if args.stop_at_goal and len(rows) >= 2 and rows[-1]["goal"] and rows[-2]["goal"]:
                break
    share(0)  # the other ranks stop
    if rows[-1]["iteration"] != runner.iteration:
        evaluate()

    confirmed = [a for a, b in zip(rows, rows[1:]) if a["goal"] and b["goal"]]  # met at two in a row
    met = (confirmed[0] if confirmed else None) if args.stop_at_goal else next((r for r in rows if r["goal"]), None)
    goal = ({"success_rate_at_least": args.success_goal} if "success_rate" in rows[0] else
            {"forward_error_below": evaluation.WALK_ERROR, "falls_below": evaluation.WALK_FALLS})
    mode = cfg.agent.mode if cfg.agent.learner == "ppo" else cfg.agent.learner
    result = {"task": args.task, "robot": cfg.task.scene.robot.file, "mode": mode,
              "num_envs": cfg.sim.num_envs, "ranks": args.nproc,
              "device": cfg.device, "budget_min": budget / 60, "eval": options.__dict__, "run": str(run_dir),
              "goal": goal, "goal_confirmed_by_next_evaluation": args.stop_at_goal,
              "time_to_goal_min": met["train_min"] if met else None, "seed": cfg.seed,
              "resumed_with": resumed_with,
              "env_steps_to_goal_M": met["env_steps_M"] if met else None}
    print_table(rows)
    print(f"goal {goal} met after {result['time_to_goal_min']:.1f} min of training" if met else
          f"goal {goal} not met within {budget / 60:.1f} min")
    path = write_json(name, rows, **result, evaluations=evaluations)
    plot(rows, args.task, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    env.close()
    distributed.leave()


if __name__ == "__main__":
    main()
