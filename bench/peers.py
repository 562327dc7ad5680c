"""legion-rl beside a peer on the same machine: mjlab's Go1 velocity task (its `train` command, its
own defaults: PPO from rsl-rl, MuJoCo Warp physics) against legion-rl's quadruped_flat with the
Go2 (`legion train`, its defaults), the same number of envs and iterations, one after the other.

mjlab pins mujoco-warp and mujoco 3.11 and rsl-rl 5.4, so it runs from a venv of its own:

    python3 -m venv ~/.venvs/mjlab && ~/.venvs/mjlab/bin/pip install torch==2.13.0 mjlab==1.6.0
    python bench/peers.py --mjlab-python ~/.venvs/mjlab/bin/python --num-envs 1024 --iterations 20
    python bench/peers.py --mjlab-python ... --device cuda:0 --num-envs 4096 --iterations 100

Per framework and seed: the env-steps/s of its training iterations (each framework's own figure,
collection and update together: legion-rl's progress line, rsl-rl's "Steps per second"; the median
over the iterations after the first two, which compile and warm up) and the seconds from the
command to its first iteration's report (building the sim, compiling kernels, that iteration).
The table's last column is legion-rl's env-steps/s over mjlab's; the JSON keeps every iteration's
figure.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, print_table, write_json

PROGRESS = {"legion-rl": re.compile(r"\[it \d+/\d+\] ([\d,]+) steps/s"),
            "mjlab": re.compile(r"Steps per second:\s+(\d+)")}


def command(framework: str, args, seed: int, log_dir: str) -> tuple[list[str], dict]:
    if framework == "legion-rl":
        return ([sys.executable, "-m", "legion", "train", "task=quadruped_flat", "robot=go2", f"seed={seed}",
                 f"device={args.device}", f"sim.num_envs={args.num_envs}", f"agent.max_iterations={args.iterations}",
                 "agent.stop_when.goal=false", f"hydra.run.dir={log_dir}"], dict(os.environ))
    # mjlab picks its device from CUDA_VISIBLE_DEVICES: none visible means the CPU
    gpu = args.device.split(":")[1] if args.device.startswith("cuda") else ""
    return ([args.mjlab_python, "-m", "mjlab.scripts.train", "Mjlab-Velocity-Flat-Unitree-Go1",
             "--env.scene.num-envs", str(args.num_envs), "--agent.max-iterations", str(args.iterations),
             "--agent.seed", str(seed), "--agent.logger", "tensorboard", "--log-root", log_dir],
            {**os.environ, "CUDA_VISIBLE_DEVICES": gpu})


def measure(framework: str, args, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as log_dir:
        cmd, env = command(framework, args, seed, log_dir)
        started = time.perf_counter()
        first_s, rates, tail = None, [], []
        with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              bufsize=1) as process:
            assert process.stdout is not None
            for line in process.stdout:
                tail = [*tail[-40:], line]
                if match := PROGRESS[framework].search(line):
                    first_s = first_s or time.perf_counter() - started
                    rates.append(float(match[1].replace(",", "")))
                    print(f"  {framework} seed {seed}, iteration {len(rates)}: {rates[-1]:,.0f} env-steps/s",
                          flush=True)
        if process.returncode != 0 or len(rates) < 3:
            raise SystemExit(f"{framework} seed {seed} failed (exit {process.returncode}, {len(rates)} iterations "
                             f"logged); its last lines:\n{''.join(tail)}")
    return {"framework": framework, "task": "quadruped_flat, Go2" if framework == "legion-rl" else
            "Mjlab-Velocity-Flat-Unitree-Go1", "device": args.device, "num_envs": args.num_envs, "seed": seed,
            "start s": first_s, "env-steps/s": statistics.median(rates[2:]), "per iteration": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mjlab-python", required=True, help="the python of a venv with mjlab installed")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:<n>, for both")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    if not Path(args.mjlab_python).is_file():
        parser.error(f"--mjlab-python {args.mjlab_python}: no such file; make mjlab's venv as this script's "
                     "--help shows")
    runs = [measure(framework, args, seed) for seed in args.seeds for framework in PROGRESS]
    rows = []
    for ours, peer in zip(runs[::2], runs[1::2]):  # legion-rl, then mjlab, per seed
        ratio = ours["env-steps/s"] / peer["env-steps/s"]
        rows += [{k: v for k, v in r.items() if k != "per iteration"} |
                 {"legion-rl / mjlab": ratio if r is ours else "-"} for r in (ours, peer)]
    print_table(rows)
    print(f"wrote {write_json('peers', rows, runs=runs, args=vars(args))}")


if __name__ == "__main__":
    main()
