"""`legion eval`: a trained policy measured (tracking, falls, success) into a table, JSON and a plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

from legion.commands import UsageError, number, run_args

HELP = """usage: legion eval run=<run folder> [checkpoint=PATH] [commands=...] [envs=16] [duration_s=10]
                   [settle_s=1] [episodes=100] [randomization=trained|off] [out=DIR] [key=value ...]

Measures the run's newest good checkpoint (or `checkpoint=`): the policy acts deterministically
(observation noise off) for duration_s seconds on `envs` envs per command, each env one episode
from a fresh reset, and the metrics are printed as a table and written to DIR (default
<run>/eval/) as <checkpoint>.json and <checkpoint>.png (commanded vs actual velocity over time).

Locomotion (velocity-command tasks), per command, over the steps after settle_s before any fall:
  vel_error_xy       mean |v_xy,cmd - v_xy| [m/s], base frame (none: every env of the command fell first)
  yaw_rate_error     mean |yaw rate_cmd - yaw rate| [rad/s]
  lateral_drift      mean v_y - v_y,cmd [m/s], signed (+: to the left): the gait's left-right bias
  fall_rate          share of envs whose episode ended in a failure (a termination term)
  survival_s         mean time to that failure (duration_s if none) [s]
  terrain_level      mean terrain level of the envs (rough terrain: the levels the training
                     curriculum reached, saved in the checkpoint; frozen while evaluating)
  power_w            mean mechanical power, sum over joints of |torque x joint velocity| [W]
  cost_of_transport  energy / (mass x g x distance walked); - for commands without linear velocity

  commands=forward,backward,lateral,yaw,stand       (the default; names from this set)
    forward (1, 0, 0)  backward (-0.5, 0, 0)  lateral (0, 0.5, 0)  yaw (0, 0, 1)  stand (0, 0, 0)
  commands='{"fast": [1.5, 0, 0], "turn": [0.5, 0, 0.5]}'   your own, as JSON: name -> [v_x, v_y, yaw rate]
  Commands outside the task's command ranges are clamped to them (marked * in the table).

Goal tasks (pose or position commands: arm_reach, arm_lift), over `episodes` whole episodes run
on `envs` envs, the task's own commands (commands= and duration_s= do not apply):
  success_rate                 share of episodes that met task.success (e.g. within 2 cm and
                               0.1 rad, held 0.5 s)
  time_to_success_s            mean episode time at which that hold was complete (successes only)
  final_position_error_m       mean distance of the commanded body from its goal at the end [m]
  final_orientation_error_rad  the same for orientation (pose commands) [rad]
  and each reward term per second of episode, as TensorBoard's Episode_Reward/<term> (for arm_lift
  the stages the policy reaches: grasp, lift, bring), and per axis of the base frame the mean final
  error and how far the final position follows the goal (the slope of one on the other: 1 ends at
  the goal, 0 ignores it). The PNG shows each episode's final error and the times to success.
  randomization=trained  every event term as the run configures it (pushes, friction, ...; default)
  randomization=off      none: default pose, level, at rest, the model's own physical parameters

Works for runs trained on any device (a run trained on a GPU runs on the CPU where there is no
CUDA). Config keys can be overridden as in `legion play`.
"""


def run(args: list[str]) -> None:
    from legion import evaluation

    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    defaults = evaluation.Options()
    run, options, overrides = run_args(args, HELP, {
        "checkpoint": None, "commands": ",".join(evaluation.DEFAULT_COMMANDS), "envs": str(defaults.envs_per_command),
        "duration_s": str(defaults.duration_s), "settle_s": str(defaults.settle_s),
        "episodes": str(defaults.episodes), "randomization": defaults.randomization, "out": None})
    text = options["commands"].strip()
    if text.startswith("{"):
        try:
            commands = json.loads(text)
        except ValueError as e:
            raise UsageError(f"commands: invalid JSON ({e}); expected {{name: [v_x, v_y, yaw_rate], ...}}") from None
    else:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in evaluation.DEFAULT_COMMANDS]
        if unknown:
            raise UsageError(f"commands: unknown {unknown}; choose from {list(evaluation.DEFAULT_COMMANDS)} "
                             "or give JSON {name: [v_x, v_y, yaw_rate]}")
        commands = {n: evaluation.DEFAULT_COMMANDS[n] for n in names}
    chosen = evaluation.Options(commands=commands, envs_per_command=number("envs", options["envs"]),
                                duration_s=number("duration_s", options["duration_s"], float),
                                settle_s=number("settle_s", options["settle_s"], float),
                                episodes=number("episodes", options["episodes"]),
                                randomization=options["randomization"])
    out = Path(options["out"]) if options["out"] else Path(run) / "eval"
    if options["out"]:  # a folder it cannot write is refused now, not after the evaluation
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"out={out}: cannot make that folder ({e.strerror})") from None
        if not os.access(out, os.W_OK):
            raise UsageError(f"out={out}: not writable")
    loaded = evaluation.load(run, chosen, options["checkpoint"], overrides)
    if loaded.cfg.task.command is not None and loaded.cfg.task.command.type in evaluation.GOAL_COMMANDS:
        what = f"{chosen.episodes} episodes on {chosen.envs_per_command} envs"
    else:
        what = f"{len(commands)} commands x {chosen.envs_per_command} envs x {chosen.duration_s:g} s"
    print(f"[legion] evaluating {loaded.checkpoint} of {loaded.cfg.task.name}: {what}, randomization "
          f"{chosen.randomization}", flush=True)
    report = evaluation.measure(loaded, chosen)
    print(evaluation.table(report))
    written = evaluation.write(report, out)
    print(f"[legion] wrote {', '.join(str(p) for p in written)}")
