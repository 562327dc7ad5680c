"""`legion deploy` against `legion bridge` over DDS on loopback: loop timing and velocity tracking
next to `legion sim2sim`'s, for the same exported policy and commands.

For each command, a fresh `legion bridge` process (the robot: plain MuJoCo, 500 Hz, LowState
and SportModeState out, LowCmd in) and, in this process, `legion deploy`'s function (the edge
runtime: PolicyRunner, ControlLoop at the policy's 50 Hz, UnitreeRobot over DDS): stand up 1 s,
hold 1 s, then the policy for --seconds with the command held, logged by TrajectoryLog. From the
log: the tracking error of (v_x, v_y) and yaw rate and falls, computed with sim2sim's own
function (sim2real/sim2sim.py: episode_metrics; base velocity from rt/sportmodestate, the
state estimate a Go2 publishes), and the control loop's tick latency (read -> write) p50/p99
and deadline misses; from the bridge: ticks later than one period (of 500 Hz). Then `legion
sim2sim` on the same export and commands (Newton, and MuJoCo in process).

Goal: tracking within 10% of sim2sim's figure (mean forward error over the commands).

    python bench/deploy_dds.py --run runs/quadruped_flat/<go2 run> [--seconds 10] [--robot go2]

Writes bench/results/deploy_dds_<robot>.json and prints a markdown table; the robot-side logs go to
runs/deploy_dds_<time>/<command>/.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import RUNS, print_table, write_json
from legion.sim2real import sim2sim as s2s
from legion.sim2real.deploy import unitree
from legion.sim2real.deploy.contract import PolicyContract


def over_dds(folder: Path, robot: str, command, seconds: float, log_dir: Path, domain: int) -> tuple[dict, dict]:
    """One episode of the policy through DDS against a fresh bridge: (tracking row, timing row)."""
    bridge = subprocess.Popen([sys.executable, "-m", "legion", "bridge", f"run={folder}", f"robot={robot}",
                               f"domain={domain}", "interface=lo", f"duration_s={seconds + 30}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        result = unitree.deploy(folder, robot, domain, "lo", command, seconds, stand_s=1.0, hold_s=1.0, confirm=False,
                                log_dir=log_dir, say=lambda line: None)
    finally:
        bridge.terminate()  # (SIGTERM: the bridge's summary is not needed; its status lines are)
        out, _ = bridge.communicate(timeout=30)
    late = [int(line.split("late ticks ")[1].split()[0]) for line in out.splitlines() if "late ticks" in line]
    log = np.load(result["log"])
    meta = json.loads(str(log["meta"]))
    contract = PolicyContract.load(folder / "policy.json")
    policy = log["mode"] == 0
    lin, ang = log["base_lin_vel"][policy], log["base_ang_vel"][policy]
    low = np.flatnonzero(log["base_pos"][policy][:, 2] < (contract.fall.min_base_height or -np.inf))
    fell_at = int(low[0]) if len(low) else (len(lin) if result["stopped"] else None)
    row = s2s.episode_metrics(command, lin, ang, fell_at, meta["control_dt"], contract.tracking)
    timing = {"ticks": result["ticks"], "latency_p50_us": result["latency_p50_us"],
              "latency_p99_us": result["latency_p99_us"], "deadline_misses": result["misses"],
              "holds": result["hold"], "bridge_late_ticks": late[-1] if late else None}
    return row, timing


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a run folder with exported/ (legion export) or an export folder")
    parser.add_argument("--robot", default="go2")
    parser.add_argument("--seconds", type=float, default=10.0, help="policy phase per command")
    parser.add_argument("--domain", type=int, default=51)
    parser.add_argument("--commands", default=json.dumps(s2s.DEFAULT_COMMANDS))
    args = parser.parse_args()
    folder = unitree.exported_folder(args.run)
    run = folder.parent
    commands = json.loads(args.commands)
    logs = RUNS / f"deploy_dds_{int(time.time())}"  # what the robot's side logged, per command
    dds, timing = [], []
    for k, command in enumerate(commands):
        row, tick = over_dds(folder, args.robot, command, args.seconds, logs / str(k), args.domain)
        dds.append(row)
        timing.append({"command": command, **tick})
        print(f"[deploy_dds] {command}: forward error {row['vel_error_xy']:.3f} m/s, fell {row['fell']}, "
              f"tick p99 {tick['latency_p99_us']:.0f} us", flush=True)
    compared = s2s.compare(run, onnx=folder / "policy.onnx", duration_s=args.seconds, commands=commands)
    rows = []
    for newton, mujoco, over in zip(compared["newton"], compared["mujoco"], dds):
        rows.append({"command": str(newton["command"]), "newton_err_xy": newton["vel_error_xy"],
                     "sim2sim_err_xy": mujoco["vel_error_xy"], "dds_err_xy": over["vel_error_xy"],
                     "sim2sim_err_wz": mujoco["yaw_rate_error"], "dds_err_wz": over["yaw_rate_error"],
                     "falls_sim2sim": int(mujoco["fell"]), "falls_dds": int(over["fell"])})
    mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0] if k.endswith(("_xy", "_wz"))}
    mean["dds_vs_sim2sim_xy"] = mean["dds_err_xy"] / mean["sim2sim_err_xy"]
    print_table(rows)
    print_table([{"command": "mean", **mean}])
    print_table(timing)
    out = write_json(f"deploy_dds_{args.robot}", rows, mean=mean, timing=timing, run=str(run),
                     command=" ".join(sys.argv), sim2sim_loop=compared["loop"])
    print(f"[deploy_dds] wrote {out}")


if __name__ == "__main__":
    main()
