"""`legion deploy`: an exported policy on a Unitree robot over DDS (the edge runtime only: no torch)."""

from __future__ import annotations

import json
import sys

from legion.commands import UsageError, dds_args, flag, number

HELP = """usage: legion deploy run=<run or exported folder> robot=go2|g1 [interface=NAME] [domain=0]
                     [command=[vx,vy,wz]] [duration_s=SECONDS] [confirm=true] [stand_s=2] [hold_s=1]
                     [log=DIR] [excite=chirp|steps [excite_s=20] [excite_amplitude=0.1]]

Runs an exported policy on a Unitree robot over DDS (rt/lowstate in, rt/lowcmd out), with the
edge runtime only (numpy, onnxruntime, cyclonedds: pip install 'legion-rl[unitree]'; no torch).
The policy's joint names are checked against the robot's motor map at start (refused, naming
the joints, if they differ), and nothing is sent before a fresh, valid LowState arrives.

Phases: damping (kp = 0) until Enter; stand up to the default pose over stand_s; hold it until
Enter; then the policy with the control loop's safety layer (stale state: hold the last targets,
then stop; bad CRC or NaN: stop; targets clamped to the joint limits and in rate) and a status
line every second. Any stop, and Ctrl-C, sends damping (kp = 0, kd > 0) before exiting.

  interface=NAME    the network interface the robot is on (e.g. eth0), lo for `legion bridge`
                    on this computer; default: CycloneDDS chooses
  domain=0          DDS domain
  command=[0,0,0]   velocity command (v_x [m/s], v_y [m/s], yaw rate [rad/s]), held
  duration_s=       policy phase length (default: until Ctrl-C)
  confirm=false     no Enter prompts (the simulated robot, scripted runs)
  stand_s, hold_s   stand-up ramp and hold [s]
  log=DIR           each phase after the hold (excitation, policy) as a TrajectoryLog episode
                    (legion dataset convert takes it)
  excite=chirp      an identification routine after the hold, before the policy (duration_s=0:
                    instead of it), through the same safety layer and logged: every joint about
                    the default pose, a sine sweeping 0.2 -> 5 Hz (chirp) or random steps of -A, 0,
                    +A every 0.5 s (steps), faded in and out over 1 s. Hang the robot (its base held)
                    to identify the motors; standing, keep the amplitude small
  excite_s=20       its length [s]
  excite_amplitude=0.1   its amplitude A [rad]
"""


def run(args: list[str]) -> None:
    from legion.sim2real.deploy.policy import StateError
    from legion.sim2real.deploy.unitree import deploy as run_deploy
    from legion.sim2real.deploy.unitree import exported_folder

    run, o = dds_args(args, HELP, {"robot": None, "domain": "0", "interface": None, "command": "[0,0,0]",
                                           "duration_s": None, "confirm": "true", "stand_s": "2", "hold_s": "1",
                                           "log": None, "excite": None, "excite_s": "20",
                                           "excite_amplitude": "0.1"})
    try:
        command = [float(c) for c in json.loads(o["command"])]
        assert len(command) == 3
    except (ValueError, TypeError, AssertionError):
        raise UsageError(f"command={o['command']}: expected [v_x, v_y, yaw_rate]\n\n{HELP}") from None
    excite = None
    if o["excite"]:
        from legion.sim2real.deploy.excite import Excitation

        try:
            excite = Excitation(o["excite"], number("excite_amplitude", o["excite_amplitude"], float),
                                number("excite_s", o["excite_s"], float))
        except ValueError as e:
            raise UsageError(f"{e}\n\n{HELP}") from None
    try:
        result = run_deploy(exported_folder(run), o["robot"], number("domain", o["domain"]), o["interface"] or None,
                            command, number("duration_s", o["duration_s"], float) if o["duration_s"] else None,
                            number("stand_s", o["stand_s"], float), number("hold_s", o["hold_s"], float),
                            flag("confirm", o["confirm"]), o["log"], say=lambda line: print(line, flush=True),
                            excite=excite)
    except (StateError, TimeoutError) as e:  # the robot's fault, after the loop damped it: exit 1
        print(f"legion deploy: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"[deploy] {json.dumps(result)}")
