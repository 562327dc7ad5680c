"""Scaling over torch.distributed: env-steps/s and learner samples/s with 1..K processes (ranks).

Each measurement is a real `legion train` run under torchrun (gloo on the CPU, NCCL with
--device cuda), every rank with --num-envs envs, for --iterations iterations; the figures are
rank 0's medians after the first two iterations, totalled over the ranks (the ranks move in lock
step: every update all-reduces their gradients). Speed-up is over one process.

On this 2-core machine each rank runs one Warp simulation thread and one torch thread, so two
ranks can at best double the physics; the update's gradient all-reduce is the price.

    python bench/scaling.py [--tasks cartpole quadruped_flat] [--procs 1 2] [--num-envs 256] [--iterations 12]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, print_table, write_json


def worker(task: str, num_envs: int, iterations: int, device: str, out: Path) -> None:
    """One rank: trains through legion.commands.train.train; rank 0 writes its per-iteration history."""
    from common import compose
    from legion.commands.train import train

    cfg = compose(f"task={task}", f"sim.num_envs={num_envs}", f"agent.max_iterations={iterations}",
                  "agent.save_interval=100000", f"device={device}")
    runner = train(cfg, out.parent / "run")
    if int(os.environ.get("RANK", "0")) == 0:
        out.write_text(json.dumps(list(runner.history)))


def measure(task: str, procs: int, num_envs: int, iterations: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "history.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", __file__,
                   "--worker", task, str(num_envs), str(iterations), device, str(out)]
        environ = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        result = subprocess.run(command, env=environ, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{task} with {procs} processes failed:\n{result.stderr[-3000:]}")
        history = json.loads(out.read_text())[2:]  # after the first two iterations (compile, warm-up)
    return {"task": task, "processes": procs, "envs per process": num_envs,
            "env-steps/s": statistics.median(h["env_steps_per_s"] for h in history),
            "learner samples/s": statistics.median(h["learner_samples_per_s"] for h in history)}


def main():
    if sys.argv[1:2] == ["--worker"]:
        task, num_envs, iterations, device, out = sys.argv[2:7]
        worker(task, int(num_envs), int(iterations), device, Path(out))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["cartpole", "quadruped_flat"])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-envs", type=int, default=256, help="envs per process")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (rank r uses cuda:r)")
    args = parser.parse_args()
    rows = []
    for task in args.tasks:
        for procs in args.procs:
            row = measure(task, procs, args.num_envs, args.iterations, args.device)
            base = next((r for r in rows if r["task"] == task and r["processes"] == args.procs[0]), row)
            row["speed-up"] = row["env-steps/s"] / base["env-steps/s"]
            rows.append(row)
            print(f"{task}, {procs} processes: {row['env-steps/s']:,.0f} env-steps/s", flush=True)
    print_table(rows)
    print(f"wrote {write_json('scaling', rows, iterations=args.iterations, device=args.device)}")


if __name__ == "__main__":
    main()
