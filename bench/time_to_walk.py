"""Time to walk, as a user gets it: `legion train` with its defaults, run once per seed, stopped by
its own goal (`agent.stop_when`: `legion eval`'s forward tracking error < 0.1 m/s and falls < 5%
over its five commands, met at two evaluations in a row).

Each run is `legion train task=<task> robot=<robot> seed=<s>` in a process of its own, evaluated
every tenth of the robot's goal minutes of training (``--eval-every`` to change). A run's time to
walk is the training time at the first of the two evaluations that met the goal (evaluation time
excluded; building the env and compiling Warp's kernels come before the clock starts, and
``start_s`` times them: from the command to the first progress line); a run that reaches its
iteration cap first counts as not walking. The table gives each robot's median and range over
the seeds; bench/results/time_to_walk.json keeps every evaluation of every run, and
bench/results/time_to_walk.png plots them (forward error and falls against minutes of training,
a line per seed). The runs go to runs/time_to_walk/<robot>_seed<s>.

    python bench/time_to_walk.py --robots quadruped go2 --seeds 0 1 2
    python bench/time_to_walk.py --robots g1 --seeds 0 --eval-every 2.5
    python bench/time_to_walk.py --robots go2 --seeds 0 1 2 sim.num_envs=2048   # any override, every run
    python bench/time_to_walk.py --tag kl02 agent.algorithm.desired_kl=0.02   # an ablation: time_to_walk_kl02.json
"""

import argparse
import re
import statistics
import subprocess
import sys
import time

import yaml

from common import RESULTS, ROOT, RUNS, print_table, write_json

# robot -> (task, goal in minutes of training on this CPU: the evaluation cadence is a tenth of it)
ROBOTS = {"quadruped": ("quadruped_flat", 7.0), "go2": ("quadruped_flat", 12.0),
          "biped": ("biped_flat", 25.0), "g1": ("biped_flat", 25.0)}
MEASURES = re.compile(r"forward error ([\d.]+|-)(?: m/s)?, falls (\d+)%")
EVALUATION = re.compile(r"\[legion\] evaluation (\d+) at ([\d.]+) min of training \(iteration (\d+)\): "
                        r"(.*): goal (met|not met)")


def run(robot: str, seed: int, eval_every: float | None, overrides: list[str], tag: str = "") -> dict:
    task, goal_min = ROBOTS[robot]
    run_dir = RUNS / "time_to_walk" / f"{robot}{tag and '_' + tag}_seed{seed}"
    every = eval_every or goal_min / 10
    command = ["legion", "train", f"task={task}", f"robot={robot}", f"seed={seed}",
               f"agent.stop_when.every_min={every:g}", *overrides]
    started = time.perf_counter()
    first_iteration_s = None
    evaluations, lines = [], []
    with subprocess.Popen([sys.executable, "-m", "legion", *command[1:], f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(f"  {robot} seed {seed}: {line}", end="", flush=True)
            lines.append(line)
            if first_iteration_s is None and "steps/s" in line:  # the first progress line
                first_iteration_s = time.perf_counter() - started
            if match := EVALUATION.search(line):
                evaluations.append({"evaluation": int(match[1]), "trained_min": float(match[2]),
                                    "iteration": int(match[3]), "measures": match[4], "met": match[5] == "met"})
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{''.join(lines[-30:])}")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    steps_per_iteration = config["sim"]["num_envs"] * config["agent"]["num_steps_per_env"]
    confirm = config["agent"]["stop_when"]["confirm"]
    streak = 0
    walked = None
    for i, e in enumerate(evaluations):
        streak = streak + 1 if e["met"] else 0
        if streak == confirm:
            walked = evaluations[i - confirm + 1]
            break
    return {"robot": robot, "task": task, "seed": seed, "command": " ".join(command),
            "num_envs": config["sim"]["num_envs"], "walked_min": walked and walked["trained_min"],
            "iteration": walked and walked["iteration"],
            "env_steps": walked and walked["iteration"] * steps_per_iteration,
            "wall_min": (time.perf_counter() - started) / 60, "start_s": first_iteration_s,
            "evaluations": evaluations}


def plot(runs: list[dict], path) -> None:
    """Forward error and falls at each evaluation against minutes of training, a line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    robots = list(dict.fromkeys(r["robot"] for r in runs))
    fig, axes = plt.subplots(2, len(robots), figsize=(5 * len(robots), 6), sharex="col", squeeze=False)
    for column, robot in enumerate(robots):
        for r in (r for r in runs if r["robot"] == robot):
            minutes = [e["trained_min"] for e in r["evaluations"]]
            measures = [MEASURES.search(e["measures"]) for e in r["evaluations"]]
            error = [float(m[1]) if m and m[1] != "-" else float("nan") for m in measures]
            falls = [float(m[2]) if m else float("nan") for m in measures]
            for row, values in enumerate((error, falls)):
                axes[row, column].plot(minutes, values, marker="o", ms=3, label=f"seed {r['seed']}")
        axes[0, column].axhline(0.1, color="k", ls="--", lw=0.8)
        axes[1, column].axhline(5, color="k", ls="--", lw=0.8)
        axes[0, column].set_title(f"{runs[0]['task']}, {robot}")
        axes[0, column].set_ylabel("forward tracking error [m/s]")
        axes[1, column].set_ylabel("falls [%]")
        axes[1, column].set_xlabel("minutes of training")
        axes[0, column].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--robots", nargs="+", default=["quadruped"], choices=sorted(ROBOTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--eval-every", type=float, default=None,
                        help="minutes of training between evaluations (default: a tenth of the robot's goal)")
    parser.add_argument("--tag", default="", help="names the results (time_to_walk_<tag>.json) and run folders")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (key=value)")
    args = parser.parse_args()

    runs = [run(robot, seed, args.eval_every, args.overrides, args.tag) for robot in args.robots for seed in args.seeds]
    rows = []
    for robot in args.robots:
        mine = [r for r in runs if r["robot"] == robot]
        walked = sorted(r["walked_min"] for r in mine if r["walked_min"] is not None)
        median = f"**{statistics.median(walked):.1f}** ({walked[0]:.1f}-{walked[-1]:.1f})" \
            if len(walked) == len(mine) else f"{len(walked)} of {len(mine)} seeds walked"
        rows.append({"task, robot": f"{mine[0]['task']}, {robot}", "envs": mine[0]["num_envs"],
                     "minutes to walk, median (range)": median,
                     "iterations": " / ".join(str(r["iteration"] or "-") for r in mine),
                     "env-steps": " / ".join(f"{r['env_steps'] / 1e6:.1f}M" if r["env_steps"] else "-" for r in mine),
                     "seeds": " / ".join(str(r["seed"]) for r in mine)})
    print_table(rows)
    name = "time_to_walk" + (args.tag and "_" + args.tag)
    written = write_json(name, rows, runs=runs)  # (makes the results folder)
    plot(runs, RESULTS / f"{name}.png")
    print(f"written: {written}, {RESULTS / f'{name}.png'}")


if __name__ == "__main__":
    main()
