"""`legion calibrate`: the simulator's motor and joint parameters fitted to a robot's logs."""

from __future__ import annotations

from legion.commands import UsageError, flag, number, run_args

HELP = """usage: legion calibrate run=<run or exported folder> log=<folder of logs>[,<another>...]
                        [params=kp_scale,coulomb_friction,latency_ms] [window_s=0.5] [evaluations=2400]
                        [groups=NAME:REGEX,...] [hung=true] [bootstrap=200] [seed=0] [out=DIR]
                        [actuator_network=false] [workers=auto] [overwrite=false]

Fits the motor and joint parameters of the export's robot.mjb (the model the policy trained on)
to a robot's logs (`legion deploy ... log=DIR`; best an identification routine with the robot
hung: `legion deploy ... excite=chirp`). Each 0.5 s window of the logs is replayed from its
logged joint state with its logged targets; CMA-ES searches the parameters for the smallest
joint-position error, and Levenberg-Marquardt steps polish its best. Prints the estimates with
their spread over a bootstrap (refits on windows drawn with replacement), which of them the logs
do not pin down (a flat loss, or a 95% interval reaching past +-20%), and the joint RMSE on
held-out windows, nominal against calibrated. Writes into out (default: the log folder)
calibration.json, reality_calibrated.yaml (`legion sim2sim reality=<it>` runs the calibrated
robot), task_calibrated.yaml (the run's task with its randomization centred on the estimates and
as wide as their spread, the whole prior where the loss is flat: `legion train task=<it>
robot=...` trains or fine-tunes on the calibrated simulator) and calibration.png
(held-out windows: logged, nominal and calibrated joint positions and torques). A folder that
already holds a calibration is refused before the fit unless overwrite=true (runs fine-tuned on its
task_calibrated.yaml read their actuator networks from it).

  params=           which to fit: kp_scale, kd_scale (the drivers' effective gains), coulomb_friction
                    [N m], viscous_friction [N m s/rad], armature [kg m^2], backlash [rad] (gear
                    play; every joint alike, or per group), latency_ms, latency_jitter_ms (the
                    std of the link's latency per command: where it jitters by a physics step or
                    more, and with gear play), encoder_bias [rad] (every joint encoder's
                    zero offset: the joints' state read off by it), added_mass_kg, com_x_m,
                    com_y_m (a payload on the base and its centre of mass), foot_friction (of
                    every contact with the ground: where the feet slip); the last four from logs
                    of the robot standing or walking, hung=false
  log=              a folder of logs, or several, comma-separated, fitted together (e.g. a chirp
                    with the robot hung, which pins the motors, and a walk, which pins the payload
                    and the floor: log=logs/chirp,logs/walk hung=true,false); motors fitted hung
                    that predict the held-out torques on the ground worse than the nominal model
                    compensate for what the model lacks (unfitted gear play): flagged
                    INCONSISTENT, and the task file keeps the task's own randomization of them
  hung=true         the logs are of the robot hung (its base held still); false: standing or
                    walking, each window started from the logged base pose and velocity; one value
                    for every log folder, or one per folder
  groups=           joint groups fitted apart, e.g. calf:.*_calf_joint,upper:.*_(hip|thigh)_joint
                    (a joint in none keeps the model's values; a regex may not hold a comma)
  window_s=0.5      replay window [s]
  bootstrap=200     resamples of the windows for the spread, each refit by one Gauss-Newton step
                    from the estimates (all of them from one Jacobian: two evaluations per fitted
                    value, whatever the number; 0: none)
  evaluations=2400  CMA-ES's budget (one evaluation replays every window once; ~10 per second and
                    core on a Go2 with 8 s of logs), spent in two searches: all but 600 from the
                    nominal model with its gains fitted to the logged torques (where there are
                    any), 600 from the middle of every prior (seed + 1; half each below 1,200),
                    the lower loss kept; a search needs about 1,000 to settle (stopped at 600, a
                    worn Go2's calves came out at 1.17x kp for 0.85x, or 1.65x kd for 1.2x)
  workers=auto      processes that replay the windows in parallel (auto: every core this process
                    may use; 1: none)
  actuator_network=false
                    true: also an actuator network per joint group (Hwangbo et al. 2019: an MLP
                    from each joint's last 3 position errors and velocities, one control tick
                    apart, to its torque; every joint of a group pooled), learned from the
                    logged tau_est (logs without it are refused); writes actuator_network.npz
                    (per group: actuator_network_<group>.npz), prints its held-out torque RMSE
                    against the nominal and the fitted analytic motor, and task_calibrated.yaml
                    drives the group's joints with it (task.scene.robot.actuators.<group>:
                    {joints: REGEX, model: network, network: <file>, and the export's gains and
                    effort limit}). It knows only the torques its logs hold: learn it from logs of
                    the robot on the ground too (from a hung robot alone: warned)

With hung=true a log whose base turns is refused (hung: legion bridge hung=true in simulation);
with hung=false the logs must hold the base's state (a Unitree robot's sport-mode estimate).
"""


def run(args: list[str]) -> None:
    import re
    from pathlib import Path

    from omegaconf import OmegaConf

    from legion.sim2real.calibrate import calibrate

    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    run, o, unknown = run_args(args, HELP, {"log": None, "params": "kp_scale,coulomb_friction,latency_ms",
                                            "window_s": "0.5", "evaluations": "2400", "bootstrap": "200", "seed": "0",
                                            "groups": "", "out": None, "hung": "true",
                                            "actuator_network": "false", "workers": "auto", "overwrite": "false"},
                                   overrides_allowed=False)
    if unknown:
        raise UsageError(f"unknown option(s) {' '.join(unknown)}\n\n{HELP}")
    if not o["log"]:
        raise UsageError(f"log= is required: the folder of `legion deploy ... log=DIR`\n\n{HELP}")
    groups = {}
    for item in filter(None, o["groups"].split(",")):
        name, _, pattern = item.partition(":")
        if not name or not pattern:
            raise UsageError(f"groups={o['groups']}: give NAME:REGEX pairs, comma-separated\n\n{HELP}")
        try:
            re.compile(pattern)
        except re.error as e:
            raise UsageError(f"groups={o['groups']}: {pattern!r} is not a regular expression ({e})") from None
        groups[name] = pattern
    window_s, evaluations = number("window_s", o["window_s"], float), number("evaluations", o["evaluations"])
    bootstrap = number("bootstrap", o["bootstrap"])
    for key, bad, rule in (("window_s", not window_s > 0, "> 0 s"), ("evaluations", evaluations < 1, ">= 1"),
                           ("bootstrap", bootstrap < 0, ">= 0")):
        if bad:
            raise UsageError(f"{key}={o[key]}: must be {rule}\n\n{HELP}")
    exported = next((f for f in (Path(run), Path(run) / "exported") if (f / "robot.mjb").is_file()), None)
    if exported is None:
        raise UsageError(f"run={run}: no robot.mjb there nor in its exported/ (run `legion export run={run}`)")
    workers = None if o["workers"] == "auto" else number("workers", o["workers"])
    if workers is not None and workers < 1:
        raise UsageError(f"workers={workers}: give a number of processes, 1 or more (or auto)")
    config = next((f / "config.yaml" for f in (Path(run), exported.parent) if (f / "config.yaml").is_file()), None)
    task = OmegaConf.to_container(OmegaConf.load(config).task) if config else None
    calibrate(o["log"].split(","), exported, [p for p in o["params"].split(",") if p],
              window_s, evaluations, bootstrap, seed=number("seed", o["seed"]), out_dir=o["out"],
              groups=groups or None, hung=[flag("hung", value) for value in o["hung"].split(",")],
              actuator_network=flag("actuator_network", o["actuator_network"]),
              workers=workers, overwrite=flag("overwrite", o["overwrite"]),
              say=lambda line: print(line, flush=True), task=task)  # pyright: ignore[reportArgumentType]
