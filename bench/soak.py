"""Soak test: continuous asynchronous training for --minutes, its memory sampled every minute.

Starts `legion train agent.mode=async agent.max_iterations=null` with a snapshot every minute
(--sample-s), reads the training process's resident memory (VmRSS) as often, stops it with SIGTERM (as a
cluster preempting the job would) and loads every snapshot it wrote. Goals: resident memory grows
by at most 5% from minute --settle on; every snapshot loads; SIGTERM ends the run cleanly.

    python bench/soak.py [--task quadruped_flat] [--num-envs 512] [--minutes 30] [--settle 5]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, RUNS, print_table, write_json


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="quadruped_flat")
    parser.add_argument("--num-envs", type=int, default=512)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--settle", type=float, default=5, help="minutes of warm-up excluded from the growth goal")
    parser.add_argument("--sample-s", type=float, default=60, help="seconds between samples (and snapshots)")
    args = parser.parse_args()

    from legion.agents.checkpoints import checkpoints, load_checkpoint

    RUNS.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="soak-", dir=RUNS))
    command = [sys.executable, "-m", "legion", "train", f"task={args.task}", f"sim.num_envs={args.num_envs}",
               "agent.mode=async", "agent.max_iterations=null", f"agent.save_every_minutes={args.sample_s / 60}",
               "agent.keep_last=null",
               "agent.save_interval=1000000", "agent.log_interval=10"]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = open(folder / "train.out", "w")
    process = subprocess.Popen(command, cwd=folder, env=environ, stdout=log, stderr=subprocess.STDOUT)
    samples, start = [], time.time()
    try:
        for k in range(1, int(args.minutes * 60 / args.sample_s) + 1):
            time.sleep(max(0.0, start + args.sample_s * k - time.time()))
            if process.poll() is not None:
                raise RuntimeError(f"training ended early (exit {process.returncode}); see {folder / 'train.out'}")
            samples.append({"minute": round(args.sample_s * k / 60, 2), "rss_mb": rss_mb(process.pid)})
            print(f"minute {samples[-1]['minute']:g}: {samples[-1]['rss_mb']:,.0f} MiB", flush=True)
    finally:
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(timeout=300)
        log.close()
    run = next(folder.glob(f"runs/{args.task}/*"), None)
    if run is None:
        raise RuntimeError(f"training had not made its run folder when it was stopped: give it more --minutes; "
                           f"see {folder / 'train.out'}")
    snapshots = checkpoints(run)
    loaded = sum(1 for path in snapshots if load_checkpoint(path))
    settled = [s["rss_mb"] for s in samples if s["minute"] >= args.settle]
    growth = settled[-1] / settled[0] - 1 if len(settled) > 1 else 0.0
    iterations = load_checkpoint(snapshots[-1])["iteration"] if snapshots else 0
    print_table(samples)
    summary = {"minutes": args.minutes, "iterations": iterations, "snapshots": len(snapshots), "loaded": loaded,
               "rss_growth_after_settle": growth, "sigterm_exit_code": exit_code,
               "goal_met": growth <= 0.05 and loaded == len(snapshots) > 0 and exit_code == 0}
    print(f"{iterations} iterations, {len(snapshots)} snapshots ({loaded} load), resident memory {growth:+.1%} from "
          f"minute {args.settle} to {args.minutes}, SIGTERM exit code {exit_code}: goal "
          f"{'met' if summary['goal_met'] else 'NOT met'}")
    print(f"wrote {write_json('soak', samples, task=args.task, num_envs=args.num_envs, **summary)}")
    if summary["goal_met"]:  # a minute's snapshot each: kept only where there is something to look into
        shutil.rmtree(folder)
    else:
        print(f"the run and its log stay in {folder}")


if __name__ == "__main__":
    main()
