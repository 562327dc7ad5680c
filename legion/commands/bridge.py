"""`legion bridge`: a simulated Unitree robot on its own DDS topics, to deploy against."""

from __future__ import annotations

import json

from legion.commands import UsageError, dds_args, flag, number

HELP = """usage: legion bridge run=<run or exported folder> robot=go2|g1 [domain=0] [interface=lo]
                     [rate=500] [duration_s=SECONDS] [faults=silent,bad_crc,nan] [reality=<yaml>]
                     [hung=true]

Simulates the robot in plain MuJoCo (the export's robot.mjb: the model the policy trained on) and
speaks the robot's own DDS topics, as Unitree's low-level interface does: publishes rt/lowstate
(IMU, motors, foot forces) and rt/sportmodestate (position and velocity, world frame), applies
rt/lowcmd (per motor: q, dq, kp, kd, tau; CRC checked, bad ones dropped) at `rate` Hz, in real
time. The robot stands still in its default pose until the first LowCmd arrives. Run `legion
deploy ... interface=lo` against it, exactly as against the robot. A status line every second.

  domain=0          DDS domain (Unitree's robots use 0; unitree_mujoco uses 1)
  interface=lo      network interface: lo keeps everything on this computer
  rate=500          robot rate [Hz]: LowState publishing and physics step
  duration_s=       stop after this long (default: until Ctrl-C)
  reality=<yaml>    the robot has the physics of this reality file, not the training model's: latency
                    with jitter, motor friction, armature, gains, torque limits, gear play, payload,
                    foot friction, IMU and encoder noise and bias, its own physics rate (examples:
                    configs/reality/*.yaml; the format: docs/deployment.md)
  hung=true         the base held still in the air, feet 0.3 m above the ground: the robot hung
                    from a gantry, as its motors are identified (legion deploy excite=chirp)
  faults=           fault drills for a controller's safety layer: silent (stop publishing), bad_crc
                    (LowStates with a wrong CRC), nan (a NaN joint position)
"""


def run(args: list[str]) -> None:
    from legion.sim2real.bridge import FAULTS, UnitreeBridge

    run, o = dds_args(args, HELP, {"robot": None, "domain": "0", "interface": "lo", "rate": "500",
                                           "duration_s": None, "faults": "", "reality": None,
                                           "hung": "false"})
    faults = {f for f in o["faults"].split(",") if f}
    if faults - set(FAULTS):
        raise UsageError(f"faults={o['faults']}: choose from {', '.join(FAULTS)}")
    sim = UnitreeBridge(run, o["robot"], number("domain", o["domain"]), o["interface"] or None,
                        number("rate", o["rate"], float), reality=o["reality"], hung=flag("hung", o["hung"]))
    sim.faults = faults
    print(f"[bridge] {o['robot']} on DDS domain {o['domain']}, interface {o['interface'] or 'auto'}, "
          f"{o['rate']} Hz{', faults: ' + ','.join(sorted(faults)) if faults else ''}"
          f"{', reality ' + sim.reality.name if sim.reality is not None else ''}"
          f"{', hung' if sim.sim.held_base is not None else ''}; Ctrl-C stops", flush=True)
    summary = sim.run(number("duration_s", o["duration_s"], float) if o["duration_s"] else None,
                      status=lambda b: print(b.status_line(), flush=True))
    sim.close()
    print(f"[bridge] stopped: {json.dumps(summary)}")
