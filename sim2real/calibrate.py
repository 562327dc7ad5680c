"""`legion calibrate`: the simulator's motor and joint parameters fitted to a robot's logs.

The logs are the control loop's (``legion deploy ... log=DIR``, :mod:`legion.sim2real.deploy.log`):
best an identification routine with the robot hung (``excite=chirp``, the base held: the legs'
motion is then the motors' and the joints' alone); with the robot standing or walking
(``hung=False``) the base's payload too, which the stance legs' torques carry. The model is the
export's ``robot.mjb`` with the parameters of a reality
(:class:`~legion.sim2real.reality.RealityRobot`), hung as the robot was or free: each short window
of the log (``window_s``) starts from the logged joint positions and velocities (and a free base's
logged pose and velocity) and replays the logged targets; the loss is the mean squared
joint-position error over the windows, in units of the logged motion's variance, plus, where the log holds the motors'
torques (a Unitree robot's tau_est), their mean squared error in units of their variance: from
positions alone the gains, the damping and the armature can be scaled together with the same
motion (the legs' own inertia is small), and the torques fix that scale. CMA-ES (the ``cma`` package) searches
the parameters asked for, each within its prior range, scaled to [0, 1].

Identifiability: a parameter is flagged as not pinned down by these logs where its loss profile
is flat (the loss rises by less than ``FLAT_RISE`` when it alone moves 20% of its range from the
estimate) or where its spread over a bootstrap (``bootstrap`` fits of windows drawn with
replacement, each started from the estimate) is wider than +-20% of it (of 5% of its range where
the estimate is near zero): CMA-ES's step size is not an uncertainty. Every fourth window is
held out: the RMSE there, nominal against calibrated, says whether the fit generalizes. Writes
``calibration.json``, ``reality_calibrated.yaml`` (a reality file of the estimates: ``legion
sim2sim reality=<it>`` runs the calibrated model), ``task_calibrated.yaml`` (the run's task whose
randomization is centred on the estimates, :func:`training_overlay`) and ``calibration.png``
(held-out windows, logged against the nominal and the calibrated model).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# name -> prior range; the joints' apply to every policy joint alike (or per joint group)
PARAMETERS = {"kp_scale": (0.5, 1.5), "kd_scale": (0.3, 3.0), "coulomb_friction": (0.0, 1.0),
              "viscous_friction": (0.0, 0.5), "armature": (0.0, 0.1), "latency_ms": (0.0, 30.0),
              "added_mass_kg": (-3.0, 10.0), "com_x_m": (-0.08, 0.08), "com_y_m": (-0.08, 0.08)}
NOMINAL = {"kp_scale": 1.0, "kd_scale": 1.0, "coulomb_friction": 0.0, "viscous_friction": 0.0, "armature": None,
           "latency_ms": 0.0, "added_mass_kg": 0.0, "com_x_m": 0.0, "com_y_m": 0.0}
WHOLE_ROBOT = ("latency_ms", "added_mass_kg", "com_x_m", "com_y_m")  # one value for the robot, not per joint group
FLAT_RISE = 0.05  # relative loss rise below which a parameter is not pinned down
HUNG_ANG_VEL = 0.5  # [rad/s] a logged base turning faster was not hung


@dataclass
class Window:
    joint_pos: np.ndarray  # (T + 1, J) logged, from the window's first state on
    joint_vel: np.ndarray  # (T + 1, J)
    targets: np.ndarray  # (T, J) written at each tick
    joint_torque: np.ndarray | None  # (T + 1, J) the motors' tau_est, where logged
    base: np.ndarray | None = None  # (13,) a free base's state at the start: position [m], quaternion
    # (x, y, z, w), linear and angular velocity (base frame) [m/s, rad/s]; None: the robot hung


BASE_KEYS = ("base_pos", "base_quat", "base_lin_vel", "base_ang_vel")


def load_windows(folder: str | Path, joint_names: list[str], control_dt: float, window_s: float,
                 hung: bool = True) -> list[Window]:
    """The logged episodes of ``folder`` cut into windows of ``window_s``; ValueError naming what is
    wrong with a log: another robot's joints or order, non-finite rows, too short, a base that
    turns in a log said to be hung, a free one without its state. ``hung=False``: the robot stood
    or walked; each window keeps its base's state at its start."""
    files = sorted(Path(folder).glob("episode_*.npz"))
    if not files:
        raise ValueError(f"log={folder}: no episode_*.npz (the logs of `legion deploy ... log=DIR`)")
    length = max(2, round(window_s / control_dt))
    windows = []
    for file in files:
        episode = np.load(file)
        meta = json.loads(str(episode["meta"]))
        if meta["joint_names"] != list(joint_names):
            raise ValueError(f"{file}: its joints are {meta['joint_names']}, the run's {list(joint_names)}: a log of "
                             "another robot, or of another joint order")
        if abs(meta["control_dt"] - control_dt) > 1e-9:
            raise ValueError(f"{file}: logged at a control dt of {meta['control_dt']} s, the run's is {control_dt} s")
        ran = episode["mode"] == 0  # ticks where the loop wrote targets (policy or routine)
        missing = [k for k in BASE_KEYS if k not in episode.files]
        if not hung and missing:
            raise ValueError(f"{file}: a log of a free base (hung=false) needs the base's state, and {missing} "
                             "are not logged")
        if hung and "base_ang_vel" in episode.files:
            turning = float(np.nanmax(np.abs(episode["base_ang_vel"][ran]), initial=0.0))
            if turning > HUNG_ANG_VEL:
                raise ValueError(f"{file}: the base turned at up to {turning:.2f} rad/s: a log of the robot hung "
                                 "(its base held still; legion bridge hung=true in simulation) running an "
                                 "excitation (legion deploy ... excite=chirp), or say it stood or walked: hung=false")
        q, dq, targets = episode["joint_pos"][ran], episode["joint_vel"][ran], episode["targets"][ran]
        tau = episode["joint_torque"][ran] if "joint_torque" in episode.files else None
        base = None if hung else np.concatenate([episode[k][ran] for k in BASE_KEYS], axis=1)
        bad = ~(np.isfinite(q).all(1) & np.isfinite(dq).all(1) & np.isfinite(targets).all(1)
                & (np.isfinite(tau).all(1) if tau is not None else True)
                & (np.isfinite(base).all(1) if base is not None else True))
        if bad.any():
            raise ValueError(f"{file}: {int(bad.sum())} of its {len(q)} ticks hold NaN or infinite values "
                             f"(first at tick {int(np.flatnonzero(bad)[0])}); drop them from the log")
        for start in range(0, len(q) - length, length):
            span = slice(start, start + length + 1)
            windows.append(Window(q[span], dq[span], targets[start:start + length],
                                  tau[span] if tau is not None else None, None if base is None else base[start]))
    if len(windows) < 4:
        raise ValueError(f"log={folder}: {len(windows)} windows of {window_s:g} s; calibrating needs at least 4 "
                         f"({4 * window_s:g} s of logged control)")
    return windows


def excitation_log(exported: str | Path, reality, excitation, folder: str | Path, hung: bool = True) -> Path:
    """The log of ``excitation`` run on the export's robot made of ``reality``, hung (or standing
    on the floor), through the control loop in simulated time: what ``legion deploy ... excite=...
    log=folder`` writes against ``legion bridge ... reality=... hung=true``, without DDS or the
    wall clock. Returns ``folder``."""
    from legion.sim2real.deploy import ControlLoop, PolicyRunner
    from legion.sim2real.deploy.excite import ExcitationRunner
    from legion.sim2real.deploy.log import TrajectoryLog
    from legion.sim2real.reality import RealityRobot

    exported = Path(exported)
    routine = ExcitationRunner(PolicyRunner(exported / "policy.onnx"), excitation)
    robot = RealityRobot(exported / "robot.mjb", routine.metadata, reality)
    if hung:
        robot.hang()
    with TrajectoryLog(folder, routine) as log:
        ControlLoop(robot, routine, now=robot.time, realtime=False, logger=log).run(routine.ticks)
    return Path(folder)


def fitted(params: list[str], groups: dict[str, str] | None = None) -> list[str]:
    """The names of the fitted values: each joint parameter once per joint group (``kp_scale@calf``),
    or once for every joint (``kp_scale``) without groups; latency and the base's payload once.
    ValueError for an unknown one."""
    unknown = [p for p in params if p not in PARAMETERS]
    if unknown or not params:
        raise ValueError(f"params={','.join(params)}: choose from {', '.join(PARAMETERS)}")
    return [name for p in params for name in ([p] if p in WHOLE_ROBOT or not groups else [f"{p}@{g}" for g in groups])]


def _base(name: str) -> str:
    return name.split("@")[0]


class Fit:
    """Simulates windows under candidate parameters (the module docstring). ``groups``: joint
    group name -> regular expression over the joint names (None: one group of every joint)."""

    def __init__(self, mjb: str | Path, metadata, windows: list[Window], names: list[str],
                 groups: dict[str, str] | None = None):
        import mujoco

        self.model = mujoco.MjModel.from_binary_path(str(mjb))
        self.metadata, self.windows, self.names, self.groups = metadata, windows, names, groups
        motion = np.concatenate([w.joint_pos for w in windows])
        self.scale = motion.var(0).mean()  # the loss's unit: the logged motion's variance
        torques = [w.joint_torque for w in windows if w.joint_torque is not None]
        self.torque_scale = np.concatenate(torques).var(0).mean() if len(torques) == len(windows) else None
        self.evaluations = 0

    def robot(self, values: dict):
        from legion.sim2real.reality import Base, Joints, Latency, Reality, RealityRobot

        joints = {pattern: Joints(**joint) for pattern, joint in joint_groups(values, self.groups).items()}
        reality = Reality(name="candidate", latency_ms=Latency(values.get("latency_ms") or 0.0), joints=joints,
                          base=Base(added_mass_kg=values.get("added_mass_kg") or 0.0,
                                    com_offset_m=[values.get("com_x_m") or 0.0, values.get("com_y_m") or 0.0, 0.0]))
        robot = RealityRobot(copy.copy(self.model), self.metadata, reality)
        if self.windows[0].base is None:
            robot.hang()  # as the logged robot was
        return robot

    def simulate(self, values: dict, windows: list[Window]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per window, the simulated joint positions and motor torques after each logged target: (T, J) each."""
        import mujoco

        robot, out = self.robot(values), []
        for w in windows:
            robot.reset(joint_pos=w.joint_pos[0])
            robot.data.qvel[robot.qvel_ids] = w.joint_vel[0]
            if w.base is not None:  # a free base where the log had it (MuJoCo: w x y z; linear velocity in the world)
                pos, (x, y, z, qw), lin, ang = w.base[:3], w.base[3:7], w.base[7:10], w.base[10:13]
                d = robot.data
                d.qpos[0:3], d.qpos[3:7] = pos, (qw, x, y, z)
                turn = np.empty(9)
                mujoco.mju_quat2Mat(turn, d.qpos[3:7])
                d.qvel[0:3], d.qvel[3:6] = turn.reshape(3, 3) @ lin, ang
                mujoco.mj_forward(robot.model, d)
            robot.acting = (w.targets[0].astype(np.float64), *robot.acting[1:])  # sent before the window began
            positions, torques = [], []
            for targets in w.targets:
                robot.write_targets(targets)
                positions.append(robot.data.qpos[robot.qpos_ids].copy())
                torques.append(robot.tau.copy())
            out.append((np.array(positions), np.array(torques)))
        return out

    def errors(self, values: dict, windows: list[Window] | None = None) -> np.ndarray:
        """Per window, the mean squared error of the simulated joint positions [rad^2] and motor
        torques [(N m)^2] from the logged ones: (windows, 2), the torques' NaN where not logged."""
        windows = windows if windows is not None else self.windows
        out = [(np.mean((positions - w.joint_pos[1:]) ** 2),
                np.mean((torques - w.joint_torque[1:]) ** 2) if w.joint_torque is not None else np.nan)
               for w, (positions, torques) in zip(windows, self.simulate(values, windows))]
        self.evaluations += 1
        return np.array(out)

    def loss(self, values: dict, windows: list[Window] | None = None) -> float:
        errors = self.errors(values, windows)
        torques = errors[:, 1].mean() / self.torque_scale if self.torque_scale else 0.0
        return float(errors[:, 0].mean() / self.scale + torques)

    def values(self, x: np.ndarray) -> dict:
        """Parameters from CMA-ES's [0, 1] coordinates."""
        ranges = [PARAMETERS[_base(name)] for name in self.names]
        return {name: low + float(np.clip(u, 0, 1)) * (high - low)
                for name, u, (low, high) in zip(self.names, x, ranges)}


def joint_groups(values: dict, groups: dict[str, str] | None) -> dict[str, dict]:
    """The joint parameters of ``values`` per joint pattern (a reality file's ``joints``)."""
    patterns = groups or {"": ".*"}
    return {pattern: {_base(k): v for k, v in values.items() if k not in WHOLE_ROBOT and v is not None
                      and (k.partition("@")[2] == label)}
            for label, pattern in patterns.items()}


def _search(fit: Fit, start: np.ndarray, sigma: float, budget: int, seed: int, say=None) -> tuple[np.ndarray, float]:
    """CMA-ES from ``start`` ([0, 1] coordinates) within ``budget`` evaluations: the best point and its loss."""
    import cma

    es = cma.CMAEvolutionStrategy(start, sigma, {"bounds": [0, 1], "seed": seed + 1, "verbose": -9,
                                               "maxfevals": budget})
    first, t0 = fit.evaluations, time.perf_counter()
    while not es.stop():
        candidates = es.ask()
        es.tell(candidates, [fit.loss(fit.values(np.asarray(x))) for x in candidates])
        if say is not None:
            done = fit.evaluations - first
            rate = done / (time.perf_counter() - t0)
            say(f"[calibrate] {done}/{budget} evaluations | loss {es.result.fbest:.4g} | {rate:.1f} evaluations/s | "
                f"ETA {max(0, budget - done) / rate:.0f} s")
    return np.asarray(es.result.xbest), float(es.result.fbest)


def calibrate(log: str | Path, exported: str | Path, params: list[str], window_s: float = 0.5,
              max_evaluations: int = 600, bootstrap: int = 8, bootstrap_evaluations: int = 60, seed: int = 0,
              out_dir: str | Path | None = None, groups: dict[str, str] | None = None, say=print,
              task: dict | None = None, hung: bool = True) -> dict:
    """``legion calibrate`` as a function (module docstring). Returns the report it writes.
    ``task``: the run's ``task`` config (plain dicts) for the training overlay (:func:`training_overlay`).
    ``hung=False``: the logs are of the robot standing or walking (:func:`load_windows`)."""
    from legion.sim2real.deploy.contract import PolicyContract

    exported = Path(exported)
    meta = PolicyContract.load(exported / "policy.json")
    windows = load_windows(log, meta.joint_names, meta.control_dt, window_s, hung)
    held_out = windows[3::4]
    fitting = [w for i, w in enumerate(windows) if i % 4 != 3]
    names = fitted(params, groups)
    fit = Fit(exported / "robot.mjb", meta, fitting, names, groups)
    nominal = {n: NOMINAL[_base(n)] for n in names}
    # Two starts, half the budget each: the nominal model and the middle of every prior (the loss has
    # local minima where latency trades against the gains; one start alone misses the truth on some logs)
    starts = [np.array([0.5 if NOMINAL[_base(n)] is None else (NOMINAL[_base(n)] - PARAMETERS[_base(n)][0]) /
                        (PARAMETERS[_base(n)][1] - PARAMETERS[_base(n)][0]) for n in names]),
              np.full(len(names), 0.5)]
    say(f"[calibrate] {len(fitting)} windows of {window_s:g} s to fit, {len(held_out)} held out; "
        f"parameters {', '.join(names)}; CMA-ES, at most {max_evaluations} evaluations, then a bootstrap of "
        f"{bootstrap} x {bootstrap_evaluations}")
    t0 = time.perf_counter()
    x, best_loss = min((_search(fit, start, 0.3, max_evaluations // len(starts), seed, say) for start in starts),
                       key=lambda found: found[1])
    best = fit.values(x)
    rng, resampled = np.random.default_rng(seed), []
    for b in range(bootstrap):
        sample = [fitting[i] for i in rng.integers(len(fitting), size=len(fitting))]
        resampled.append(fit.values(_search(Fit(exported / "robot.mjb", meta, sample, names, groups), x, 0.05,
                                            bootstrap_evaluations, seed + 1 + b)[0]))
        say(f"[calibrate] bootstrap {b + 1}/{bootstrap}")
    profile = {}
    for i, name in enumerate(names):  # the loss with this parameter alone moved 20% of its range either way
        rises = []
        for delta in (-0.2, 0.2):
            moved = x.copy()
            moved[i] = np.clip(moved[i] + delta, 0, 1)
            if moved[i] != x[i]:
                rises.append(fit.loss(fit.values(moved)) / best_loss - 1 if best_loss > 0 else np.inf)
        low, high = PARAMETERS[_base(name)]
        spread = [r[name] for r in resampled] or [best[name]]
        half_width = (max(spread) - min(spread)) / 2
        profile[name] = {"rise": float(min(rises)), "bootstrap": [float(min(spread)), float(max(spread))],
                         "pinned": bool(min(rises) >= FLAT_RISE
                                        and half_width <= 0.2 * max(abs(best[name]), 0.05 * (high - low)))}
    rmse = {label: float(np.sqrt(np.mean(fit.errors(values, held_out)[:, 0])))
            for label, values in (("nominal", nominal), ("calibrated", best))}
    report = {"log": str(log), "export": str(exported), "windows": len(fitting), "held_out": len(held_out),
              "evaluations": fit.evaluations, "bootstrap": bootstrap, "seconds": time.perf_counter() - t0,
              "loss": best_loss,
              "estimates": best, "profile": profile, "held_out_rmse_rad": rmse}
    out = Path(out_dir) if out_dir else Path(log)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(report, indent=2))
    lines = ["# Calibrated by `legion calibrate` from " + str(log), "name: calibrated",
             f"latency_ms: {{mean: {best.get('latency_ms', 0.0):.3f}}}"]
    if any(name in best for name in ("added_mass_kg", "com_x_m", "com_y_m")):
        lines.append(f"base: {{added_mass_kg: {best.get('added_mass_kg', 0.0):.5g}, com_offset_m: "
                     f"[{best.get('com_x_m', 0.0):.5g}, {best.get('com_y_m', 0.0):.5g}, 0.0]}}")
    joints = {pattern: joint for pattern, joint in joint_groups(best, groups).items() if joint}
    if joints:
        lines.append("joints:")
        lines += [f"  '{pattern}': {{" + ", ".join(f"{k}: {v:.5g}" for k, v in joint.items()) + "}"
                  for pattern, joint in joints.items()]
    (out / "reality_calibrated.yaml").write_text("\n".join(lines) + "\n")
    (out / "task_calibrated.yaml").write_text(training_overlay(report, meta, groups, task))
    plot(fit, held_out, nominal, best, meta.joint_names, out / "calibration.png")
    say(table(report))
    say(f"[calibrate] wrote {out / 'calibration.json'}, {out / 'reality_calibrated.yaml'}, "
        f"{out / 'task_calibrated.yaml'} (train on the calibrated simulator), {out / 'calibration.png'}")
    return report


# What training randomizes for each fitted parameter (legion.tasks.mdp.events), and how an estimate
# becomes that event's draw: the gains as scales of the model's, friction and armature as they are.
TRAINING_EVENTS = {"kp_scale": "stiffness_scale", "kd_scale": "damping_scale", "coulomb_friction": "joint_friction",
                   "armature": "joint_armature"}


def estimate_range(report: dict, name: str) -> tuple[float, float]:
    """The range training draws ``name`` from: centred on its estimate and as wide as its bootstrap
    spread (a point where there was no bootstrap); the whole prior where the logs did not pin it down."""
    low, high = PARAMETERS[_base(name)]
    profile, value = report["profile"][name], report["estimates"][name]
    if not profile["pinned"]:
        return low, high
    half = max(value - profile["bootstrap"][0], profile["bootstrap"][1] - value, 0.0)
    return max(value - half, low), value + half


def training_overlay(report: dict, meta, groups: dict[str, str] | None, task: dict | None = None) -> str:
    """A task file (``legion train task=<it> robot=...``) that is the run's task on the simulator the
    logs describe: per fitted joint group, training's events draw each parameter from
    :func:`estimate_range`; the task's own events of the same kind are turned off (``task``: the
    run's ``task`` config as plain dicts; without it, they stay as the task file sets them).

    Viscous friction b adds to the PD damping kd (both oppose the joint's speed): it joins the
    damping scale as kd_scale + b / kd where a group's joints share one kd. Latency: the event
    ``command_latency`` (physics steps) over its range, in place of the task's ``action_delay``.
    A payload: the event ``added_mass`` on the base, and ``com_offset`` per axis, in place of the
    task's own."""
    import re

    estimates, task = report["estimates"], task or {}
    header = ["# @package _global_",
              f"# Calibrated by `legion calibrate` from {report['log']}: the task {meta.task} on the simulator",
              "# these logs describe. Train or fine-tune on it with the robot you trained with, e.g.",
              "#   legion train task=<this file> robot=<the run's robot> agent.init_from=<the run>/model_N.pt"]
    lines = ["defaults:", f"  - {meta.task}", "  - _self_", "task:", "  events:"]
    funcs = set()
    for label, pattern in (groups or {"all": ".*"}).items():
        fitted_here = {_base(n): n for n in estimates
                       if n not in WHOLE_ROBOT and (n.partition("@")[2] or "all") == label}
        ranges = {p: estimate_range(report, n) for p, n in fitted_here.items()}
        if "viscous_friction" in ranges:
            kd = {d for name, d in zip(meta.joint_names, meta.joint_damping) if re.fullmatch(pattern, name)}
            b_low, b_high = ranges.pop("viscous_friction")
            if len(kd) == 1 and next(iter(kd)) > 0:
                kd_low, kd_high = ranges.get("kd_scale", (1.0, 1.0))
                ranges["kd_scale"] = (kd_low + b_low / next(iter(kd)), kd_high + b_high / next(iter(kd)))
            else:
                header.append(f"# viscous_friction of {pattern} not applied: its joints have no one PD damping")
        for param, (low, high) in ranges.items():
            funcs.add(TRAINING_EVENTS[param])
            lines.append(f"    calibrated_{param}_{label}: {{func: {TRAINING_EVENTS[param]}, mode: startup, "
                         f"range: [{low:.5g}, {high:.5g}], params: {{joints: '{pattern}'}}}}")
    if "latency_ms" in estimates:  # in physics steps, drawn per episode (the robot's link jitters)
        funcs.update(("command_latency", "action_delay"))  # (the task's delay in whole control steps: replaced)
        low, high = estimate_range(report, "latency_ms")
        lines.append(f"    calibrated_latency: {{func: command_latency, mode: reset, range: [{low:.4g}, {high:.4g}]}}"
                     f"   # ms, in physics steps of {meta.physics_dt * 1000:g} ms")
    if "added_mass_kg" in estimates:  # the base's mass, in kg added to the model's
        funcs.add("added_mass")
        low, high = estimate_range(report, "added_mass_kg")
        lines.append(f"    calibrated_added_mass: {{func: added_mass, mode: startup, range: [{low:.4g}, {high:.4g}], "
                     "params: {bodies: '${task.scene.robot.bodies.base}'}}   # kg")
    for axis in "xy":  # the base's centre of mass, each axis over its own range
        if f"com_{axis}_m" in estimates:
            funcs.add("com_offset")
            low, high = estimate_range(report, f"com_{axis}_m")
            lines.append(f"    calibrated_com_{axis}: {{func: com_offset, mode: startup, range: [{low:.4g}, "
                         f"{high:.4g}], params: {{bodies: '${{task.scene.robot.bodies.base}}', axes: {axis}}}}}   # m")
    for name, event in task.get("events", {}).items():
        if (event.get("func") or name) in funcs and event.get("enabled", True):
            lines.append(f"    {name}: {{enabled: false}}   # the calibrated draw above replaces it")
    return "\n".join(header + lines) + "\n"


def plot(fit: Fit, windows: list[Window], nominal: dict, calibrated: dict, joint_names: list[str], path: Path) -> None:
    """calibration.png: the held-out windows one after another, logged against the nominal and the
    calibrated model, for the joint the nominal model missed most (positions; torques where logged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not windows:
        return
    runs = {"nominal": fit.simulate(nominal, windows), "calibrated": fit.simulate(calibrated, windows)}
    logged_pos = np.concatenate([w.joint_pos[1:] for w in windows])
    sim = {label: [np.concatenate([r[i] for r in run]) for i in (0, 1)] for label, run in runs.items()}
    joint = int(np.argmax(((sim["nominal"][0] - logged_pos) ** 2).mean(0)))
    logged_torques = [w.joint_torque[1:] for w in windows if w.joint_torque is not None]
    torques = len(logged_torques) == len(windows)
    fig, axes = plt.subplots(2 if torques else 1, 1, figsize=(10, 6 if torques else 3.5), sharex=True, squeeze=False)
    t = np.arange(len(logged_pos)) * fit.metadata.control_dt
    logged = [logged_pos] + ([np.concatenate(logged_torques)] if torques else [])
    for row, (ax, unit) in enumerate(zip(axes[:, 0], ("position [rad]", "torque [N m]"))):
        ax.plot(t, logged[row][:, joint], "k", lw=1.5, label="logged")
        for label, style in (("nominal", "C3--"), ("calibrated", "C0")):
            ax.plot(t, sim[label][row][:, joint], style, lw=1, label=f"{label} model")
        ax.set_ylabel(f"{joint_names[joint]}\n{unit}")
    axes[0, 0].set_title("held-out windows of the log, each replayed from its logged state")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("time in the held-out windows [s]")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(report: dict) -> str:
    """What ``legion calibrate`` prints: each estimate, whether the logs pin it down, the held-out RMSE."""
    rows = ["parameter           estimate   bootstrap range        loss rise at +-20% of its range"]
    for name, value in report["estimates"].items():
        p = report["profile"][name]
        low, high = p["bootstrap"]
        rows.append(f"{name:<18} {value:9.4g}   [{low:8.4g}, {high:8.4g}]   {p['rise']:+.1%}"
                    + ("" if p["pinned"] else "   NOT PINNED DOWN by these logs"))
    rmse = report["held_out_rmse_rad"]
    rows.append(f"held-out joint RMSE: nominal {rmse['nominal']:.4f} rad, calibrated {rmse['calibrated']:.4f} rad "
                f"({rmse['calibrated'] / rmse['nominal']:.0%} of nominal)")
    if rmse["calibrated"] >= rmse["nominal"]:
        rows.append("WARNING: the calibrated model does not beat the nominal one on the held-out windows: it fitted "
                    "noise or effects outside its parameters; do not use these estimates")
    return "\n".join(rows)
