r"""How well `legion calibrate` recovers a robot it cannot see: for each reality, a chirp excitation
logged from the hung robot made of it (or, with --walking, the policy walking on the floor),
through the control loop in simulated time (what `legion deploy excite=chirp log=...` writes
against `legion bridge reality=... hung=true`), then the fit.
One row per fitted value: the reality's value (the mean over the group's joints), the estimate,
its error, whether the logs pin it down, and per reality the held-out joint RMSE, nominal model
against calibrated, and the seconds the fit took.

    python bench/calibration.py --run <Go2 run or export>
        [--realities go2_worn_motors go2_payload go2_backlash go2_gear_play]
        [--params kp_scale kd_scale coulomb_friction armature latency_ms [latency_jitter_ms backlash encoder_bias]]
        [--groups calf:.*_calf_joint ...]
        [--seconds 20] [--evaluations 2400] [--bootstrap 200] [--workers N]
    python bench/calibration.py --run <Go2 run> --standing --params kp_scale added_mass_kg --amplitude 0.05 \
        --groups   # standing on the floor: the payload from the stance legs' torques
    python bench/calibration.py --run <Go2 run> --walking 0.5 0 0 --params kp_scale added_mass_kg com_x_m \
        foot_friction --groups --realities go2_payload   # the payload from the policy walking at 0.5 m/s
    python bench/calibration.py --run <Go2 run> --walking 0.5 0 0 --seconds 40 --hung-chirp 20 \
        --params kp_scale kd_scale coulomb_friction armature latency_ms added_mass_kg com_x_m foot_friction
        # 60 s of logs fitted together: a chirp hung (the motors) and a walk (the payload, the floor)
    python bench/calibration.py --run <Go2 run> --actuator-network   # and an actuator network per group

With ``--actuator-network`` a second table: per reality and joint group, the held-out torque RMSE
of the actuator network learned from the same log against the nominal and the fitted PD motor.
"""

import argparse
import re
import tempfile
from pathlib import Path

import numpy as np

from common import print_table, write_json
from legion.sim2real.calibrate import calibrate, simulated_log
from legion.sim2real.deploy.contract import PolicyContract
from legion.sim2real.deploy.excite import Excitation
from legion.sim2real.reality import Reality, RealityRobot, load_reality


def truth(exported: Path, reality, name: str, groups: dict) -> float:
    """The reality's value of a fitted parameter (``kp_scale@calf``): the mean over the group's joints."""
    if name == "latency_ms":
        return reality.latency_ms.mean
    if name == "latency_jitter_ms":
        return reality.latency_ms.jitter
    if name == "added_mass_kg":
        return reality.base.added_mass_kg
    if name in ("com_x_m", "com_y_m"):
        return reality.base.com_offset_m["xy".index(name[4])]
    if name == "encoder_bias":
        return reality.encoders.position_bias
    if name == "foot_friction":  # (NaN: the reality keeps the model's contacts)
        return float("nan") if reality.foot_friction is None else reality.foot_friction
    param, _, group = name.partition("@")
    meta = PolicyContract.load(exported / "policy.json")
    robot, nominal = (RealityRobot(exported / "robot.mjb", meta, r) for r in (reality, Reality()))
    joints = [k for k, joint in enumerate(meta.joint_names) if re.fullmatch(groups.get(group, ".*"), joint)]
    dofs = robot.qvel_ids[joints]
    values = {"kp_scale": robot.kp_scale[joints], "kd_scale": robot.kd_scale[joints],
              "coulomb_friction": robot.model.dof_frictionloss[dofs],
              "viscous_friction": robot.model.dof_damping[dofs] - nominal.model.dof_damping[dofs],
              "armature": robot.model.dof_armature[dofs], "backlash": robot.backlash[joints]}[param]
    return float(np.mean(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a Go2 run folder with exported/, or the export itself")
    parser.add_argument("--realities", nargs="+", default=["go2_worn_motors", "go2_payload", "go2_backlash",
                                                             "go2_gear_play"])
    parser.add_argument("--params", nargs="+", default=["kp_scale", "kd_scale", "coulomb_friction", "armature",
                                                         "latency_ms"])
    parser.add_argument("--groups", nargs="*", default=["calf:.*_calf_joint", "upper:.*_(hip|thigh)_joint"],
                        help="NAME:REGEX joint groups fitted apart (none: every joint alike)")
    parser.add_argument("--seconds", type=float, default=20.0, help="the chirp's length")
    parser.add_argument("--amplitude", type=float, default=0.15)
    parser.add_argument("--evaluations", type=int, default=2400)
    parser.add_argument("--window-s", type=float, default=0.5, help="calibrate window_s= (the replay window)")
    parser.add_argument("--workers", type=int, default=None, help="calibrate workers= (default: every usable core)")
    parser.add_argument("--bootstrap", type=int, default=200, help="calibrate bootstrap= (resamples)")
    parser.add_argument("--seed", type=int, default=0, help="the search's (calibrate seed=)")
    parser.add_argument("--standing", action="store_true",
                        help="the robot standing on the floor, not hung (calibrate hung=false; e.g. --params "
                             "kp_scale added_mass_kg --amplitude 0.05)")
    parser.add_argument("--walking", type=float, nargs=3, metavar=("VX", "VY", "WZ"),
                        help="the policy itself walking at this command for --seconds, not a chirp (calibrate "
                             "hung=false; e.g. --walking 0.5 0 0 --params added_mass_kg com_x_m foot_friction "
                             "--groups)")
    parser.add_argument("--hung-chirp", type=float, default=0.0, metavar="SECONDS",
                        help="with --walking or --standing: also a chirp of this length with the robot hung, "
                             "fitted together with the other log (calibrate log=hung,free hung=true,false)")
    parser.add_argument("--actuator-network", action="store_true",
                        help="also an actuator network per joint group (calibrate actuator_network=true)")
    args = parser.parse_args()
    exported = next(f for f in (Path(args.run), Path(args.run) / "exported") if (f / "robot.mjb").is_file())
    groups = dict(g.split(":", 1) for g in args.groups)
    free = args.standing or args.walking is not None  # the robot on the floor, its base free
    rows, networks, reports = [], [], {}
    for name in args.realities:
        reality = load_reality(name)
        with tempfile.TemporaryDirectory() as folder:
            excitation = None if args.walking else Excitation("chirp", args.amplitude, args.seconds)
            logs = [simulated_log(exported, reality, Path(folder) / "log", excitation, args.walking, args.seconds,
                                  hung=not free)]
            if free and args.hung_chirp:
                logs.append(simulated_log(exported, reality, Path(folder) / "hung",
                                          Excitation("chirp", args.amplitude, args.hung_chirp)))
            report = calibrate(logs, exported, args.params, window_s=args.window_s, max_evaluations=args.evaluations,
                               bootstrap=args.bootstrap, seed=args.seed, groups=groups or None, say=lambda line: None,
                               hung=[not free, True][:len(logs)],
                               actuator_network=args.actuator_network, workers=args.workers)
        reports[name] = report
        rmse = report["held_out_rmse_rad"]
        for value, estimate in report["estimates"].items():
            true = truth(exported, reality, value, groups)
            rows.append({"reality": name, "value": value, "truth": round(true, 4), "estimate": round(estimate, 4),
                         "error": f"{(estimate - true) / true:+.0%}" if true else f"{estimate - true:+.3g}",
                         "pinned": report["profile"][value]["pinned"],
                         "held-out RMSE nominal -> calibrated": f"{rmse['nominal']:.4f} -> {rmse['calibrated']:.4f}",
                         "fit s": round(report["seconds"])})
        for group, entry in report.get("actuator_network", {}).items():
            torque = entry["held_out_torque_rmse_nm"]
            networks.append({"reality": name, "group": group, "network N m": round(torque["network"], 4),
                             "nominal motor N m": round(torque["nominal"], 4),
                             "fitted motor N m": torque["fitted"] and round(torque["fitted"], 4),
                             "held-out joint RMSE [rad]: nominal / fitted / network":
                                 " / ".join(f"{rmse[k]:.4f}" for k in ("nominal", "calibrated", "actuator_network"))})
        print(f"[bench] {name}: {report['evaluations']} evaluations in {report['seconds']:.0f} s", flush=True)
    print_table(rows)
    if networks:
        print("\nHeld-out torque RMSE, actuator network against the PD motor:")
        print_table(networks)
    print(f"json: {write_json('calibration', rows, networks=networks, args=vars(args), reports=reports)}")


if __name__ == "__main__":
    main()
