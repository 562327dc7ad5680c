"""`legion sim2sim`: the exported policy through the edge runtime in plain MuJoCo, next to Newton."""

from __future__ import annotations

import json
from pathlib import Path

from legion.commands import UsageError, flag, number, run_args

HELP = """usage: legion sim2sim run=<run folder> [duration_s=10] [commands=JSON] [realtime=false]
                      [reality=<yaml>] [robustness=true [pushes=0.5,1.0] [push_directions=8] [push_phases=3]]
                      [key=value ...]

Exports the run's policy (as `legion export`, into <run>/exported/, or <run>/sim2sim_exported/
where exported/ holds another checkpoint's export; not with onnx=PATH naming an existing
policy.onnx), then drives the robot with it in Newton and in plain MuJoCo (the edge
runtime's control loop on the MuJoCo robot, loading the same robot MJCF plus a floor), one
episode of duration_s per velocity command, and prints the metrics side by side: tracking
error of (v_x, v_y) and yaw rate, falls, survival time, tracking return.

  commands=[[0.5,0,0],[1,0,0],[0,0.5,0],[0,0,1],[0,0,0]]   (v_x [m/s], v_y [m/s], yaw rate [rad/s])
  physics=mjcf       MuJoCo as the robot file configures it (default: Euler, 100 solver iterations)
  physics=matched    Newton SolverMuJoCo's setup of the training run (implicitfast, its iterations):
                     then the two columns agree to ~1e-6 and check the export and the runtime end to end
  realtime=true      pace the MuJoCo loop at the control rate (deadline stats then mean wall time)
  json=PATH          also write the table as JSON
  reality=<yaml>     the MuJoCo robot has the physics of this reality file, not the training model's:
                     latency with jitter, motor friction, armature, gains, torque limits, gear play,
                     payload, foot friction, sensor noise and bias, its own physics rate (examples:
                     configs/reality/*.yaml; the format: docs/deployment.md)
  robustness=true    also run the MuJoCo robot under each condition of sim2sim.ROBUSTNESS, alone and
                     combined: floor friction 0.25 and 0.4, base mass +-20%, kp -20%, actuator
                     latency 20 and 40 ms, sensor noise (legged_gym's), pushes of 0.5 m/s every 3 s;
                     one line each: falls and tracking error. Then the push sweep: at each command,
                     one push per episode (episodes of min(duration_s, 5) s, pushed from 40% on) of
                     each magnitude from each direction at several moments of the gait: pushes
                     survived, time to recover to the command, peak tilt and tracking afterwards,
                     per command and direction, and a plot (plot=PATH, default
                     <run>/sim2sim_pushes.png)
  pushes=0.5,1.0     the push magnitudes [m/s] (default: half and all of the task's training range,
                     task.events.push; a magnitude beyond it is marked so in the table)
  push_directions=8  directions evenly spaced around the robot (0 deg: forward, 90 deg: left)
  push_phases=3      moments of the gait each push lands at, spread over 0.5 s

A goal task (a position command: arm_lift) compares episodes instead: episodes=50 envs with the
task's reset randomization (object place, joint offsets; its size, mass and friction nominal),
each MuJoCo episode started from its Newton env's joints and object pose, holding its goal, on
Newton's model of the scene (robot.mjb); success as the task's (the object within its threshold
of the goal for hold_s), time to success and final distance per engine.

  episodes=50        goal tasks: the number of episodes
"""


def run(args: list[str]) -> None:
    from legion.sim2real import sim2sim as s2s

    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    run, options, overrides = run_args(args, HELP, {
        "checkpoint": None, "onnx": None, "duration_s": "10", "commands": json.dumps(s2s.DEFAULT_COMMANDS),
        "realtime": "false", "json": None, "physics": "mjcf", "robustness": "false", "episodes": "50",
        "pushes": None, "push_directions": "8", "push_phases": "3", "plot": None, "reality": None})
    try:
        commands = json.loads(options["commands"])
        if not (isinstance(commands, list) and commands and all(
                isinstance(c, list) and len(c) == 3 and all(isinstance(x, (int, float)) for x in c) for c in commands)):
            raise ValueError(f"got {options['commands']}")
    except ValueError as e:
        raise UsageError(f"commands must be a JSON list of [v_x, v_y, yaw_rate] triples ({e})"
                         f"\n\n{HELP}") from None
    pushes: dict = {"directions": number("push_directions", options["push_directions"]),
              "phases": number("push_phases", options["push_phases"])}
    if options["pushes"] is not None:
        pushes["magnitudes"] = [number("pushes", m, float) for m in options["pushes"].split(",")]
    if options["physics"] not in ("mjcf", "matched"):
        raise UsageError(f"physics={options['physics']}: choose physics=mjcf or physics=matched.")
    result = s2s.compare(run, options["checkpoint"], Path(options["onnx"]) if options["onnx"] else None,
                         number("duration_s", options["duration_s"], float), commands, options["physics"],
                         options["realtime"].lower() == "true", overrides, flag("robustness", options["robustness"]),
                         number("episodes", options["episodes"], int), pushes, options["reality"])
    if result.get("kind") == "goals":
        print(f"[legion] sim2sim {result['onnx']}: {len(result['newton'])} episodes x "
              f"{result['steps'] * result['control_dt']:g} s from the same starts, MuJoCo physics={options['physics']}")
        print(s2s.goals_table(result))
        if options["json"]:
            Path(options["json"]).write_text(json.dumps(result, indent=2))
        return
    print(f"[legion] sim2sim {result['onnx']}: {len(result['newton'])} commands x "
          f"{result['steps'] * result['control_dt']:g} s "
          f"({result['steps']} control steps of {result['control_dt']:g} s), MuJoCo physics={options['physics']}"
          + (f", the MuJoCo robot made of reality {result['reality']}" if result.get("reality") else ""))
    print(s2s.table(result))
    if "robustness" in result:
        print(f"\nThe MuJoCo robot under each condition ({len(commands)} commands; falls; tracking error "
              "[m/s, rad/s]):")
        print(s2s.robustness_table(result))
        plot = Path(options["plot"]) if options["plot"] else run / "sim2sim_pushes.png"
        s2s.plot_pushes(result, plot)
        print("\n" + s2s.push_table(result) + f"\nplot: {plot}")
    if options["json"]:
        keys = ("newton", "mujoco", "mean", "loop", "robustness", "push_sweep", "notes")
        Path(options["json"]).write_text(json.dumps({k: result[k] for k in keys if k in result}, indent=2))
