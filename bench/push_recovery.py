"""Push recovery of locomotion policies through the edge runtime in plain MuJoCo, side by side:
the push sweep of `legion sim2sim robustness=true` for each run given.

Per run (a run folder, taking its newest good checkpoint, or one of its checkpoints): its exported
policy (exported into <run>/exported first) drives the robot at each command; at each command, one
push per episode of every magnitude from every direction, at several moments of the gait (`legion
sim2sim --help`). One row per run: the tracking error without pushes, the share of pushes survived
within the training range and at each magnitude, the command and direction survived least, the
mean time to recover to the command, the largest tilt, and the tracking error from 1 s after a
push on (its mean [m/s], that over the unpushed episodes' on the same steps, and its mean at the
command where it is largest). A polar plot per run (pushes survived by direction) goes next to
the JSON.

    python bench/push_recovery.py --runs today=runs/quadruped_flat_deployable/<date> [label=<run> ...]
        [label=<run>/model_600.pt ...] [--pushes 0.5 1.0] [--directions 8] [--phases 3] [--duration-s 5]
        [--commands JSON]
"""

import argparse
import json
from pathlib import Path

import numpy as np

from common import RESULTS, print_table, write_json
from legion.sim2real import sim2sim


def measure(run: Path, args) -> tuple[dict, dict]:
    checkpoint = run if run.suffix == ".pt" else None  # a checkpoint of a run; else its newest good one
    run = run.parent if checkpoint else run
    pushes = {"directions": args.directions, "phases": args.phases}
    if args.pushes:
        pushes["magnitudes"] = args.pushes
    result = sim2sim.compare(run, checkpoint, duration_s=args.duration_s, commands=json.loads(args.commands),
                             robustness=True, pushes=pushes)
    summary = sim2sim.push_summary(result["push_sweep"])
    (c, direction), worst = min(summary["by_direction"].items(), key=lambda item: item[1]["survived"])
    command = result["push_sweep"]["nominal"][c]["command"]
    within = summary["within_training"]
    per_command: dict[int, list[float]] = {}
    for r in result["push_sweep"]["pushes"]:
        if r["error_after"] is not None and not r["beyond_training"]:
            per_command.setdefault(r["command"], []).append(r["error_after"])
    row = {"run": "", "err_xy without pushes": result["mean"]["mujoco"]["vel_error_xy"],
           "survived (within training)": within["survived"] if within["pushes"] else float("nan"),
           **{f"survived at {m:g} m/s": r["survived"] for m, r in summary["by_magnitude"].items()},
           "survived least": f"({', '.join(f'{v:+.1f}' for v in command)}) from {direction:.0f} deg: "
                             f"{worst['survived']:.0%}",
           "recover s": within["recover_s"] if within["recover_s"] is not None else float("nan"),
           "peak tilt deg": within["peak_tilt_deg"],
           "err_xy after pushes": within["error_after"] or float("nan"),
           "tracking after / nominal": within["tracking_vs_nominal"] or float("nan"),
           "... at the worst command": max((np.mean(e) for e in per_command.values()), default=float("nan")),
           "pushes": len(result["push_sweep"]["pushes"])}
    return row, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, help="label=<run folder or one of its checkpoints> ...")
    parser.add_argument("--pushes", type=float, nargs="+",
                        help="magnitudes [m/s] (default: half and all of the task's push range)")
    parser.add_argument("--directions", type=int, default=8)
    parser.add_argument("--phases", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=5.0, help="each episode (the pushes from 40%% on)")
    parser.add_argument("--commands", default=json.dumps(sim2sim.DEFAULT_COMMANDS))
    args = parser.parse_args()
    rows, sweeps = [], {}
    for given in args.runs:
        label, _, folder = given.rpartition("=")
        row, result = measure(Path(folder), args)
        rows.append({**row, "run": label or folder})
        sweeps[label or folder] = {"run": folder, "push_sweep": result["push_sweep"],
                                   "robustness": result["robustness"]}
        sim2sim.plot_pushes(result, RESULTS / f"push_recovery_{label or Path(folder).stem}.png")
    print_table(rows)
    out = write_json("push_recovery", rows, sweeps=sweeps, args=vars(args))
    print(f"wrote {out} and the plots beside it")


if __name__ == "__main__":
    main()
