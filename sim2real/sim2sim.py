"""`legion sim2sim`: the exported policy in plain MuJoCo (through the edge runtime) next to Newton.

Locomotion (velocity commands) below; goal tasks with a position command (arm_lift): episode
for episode from the same start, success rates side by side (:func:`compare_goals`).

Both engines start the robot at rest in the default pose, base level at the task's default
height, and hold one velocity command per episode for ``duration_s``. The same exported
``policy.onnx`` drives both: in Newton through onnxruntime on the env's observations, in
MuJoCo through :class:`~legion.sim2real.deploy.PolicyRunner` and :class:`~legion.sim2real.deploy.ControlLoop`
(with its clamps and watchdog) on :class:`~legion.sim2real.deploy.mujoco_robot.MuJoCoRobot`.

Per engine and command: velocity tracking error (mean over the steps before any fall of
|v_xy,cmd - v_xy| [m/s] and |yaw rate_cmd - yaw rate| [rad/s], base frame), whether the robot
fell (the policy metadata's ``fall`` conditions: base contact, base height; or non-finite
state), survival time, and the tracking return: the sum over those steps of the metadata's
``tracking`` reward terms times weight and control dt, computed from the recorded velocities by
one function for both engines. Everything task-specific comes from the exported metadata.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from legion.sim2real.deploy.contract import Fall, Tracking

DEFAULT_COMMANDS = [[0.5, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


def physics_options(physics: str, sim) -> dict:
    """MuJoCo solver options: ``mjcf`` keeps the robot file's own (MuJoCo's defaults where it sets
    none: Euler, 100 iterations); ``matched`` copies the training run's Newton SolverMuJoCo setup
    (``sim``: its :class:`legion.configs.schema.Sim`)."""
    if physics == "mjcf":
        return {}
    if physics != "matched":
        raise ValueError(f"physics={physics}: choose physics=mjcf or physics=matched.")
    if sim.solver != "mujoco":
        raise ValueError(f"physics=matched copies Newton's MuJoCo solver; the run trained with sim={sim.solver}. "
                         "Use physics=mjcf.")
    newton_defaults = {"integrator": "implicitfast", "cone": "pyramidal", "solver": "newton"}
    keys = (*newton_defaults, "iterations", "ls_iterations", "impratio", "tolerance")
    return {**newton_defaults, **{k: v for k, v in sim.solver_options.items() if k in keys}}


def episode_metrics(command, lin_vel, ang_vel, fell_at: int | None, dt: float, tracking: Tracking) -> dict:
    """Metrics of one episode from per-step base-frame velocities (T, 3) [m/s, rad/s].

    Steps from ``fell_at`` on (the step that ended in a fall) are excluded. ``tracking``: the
    policy metadata's tracking terms (weight and std of each; ``None``: the task has none).
    """
    steps = len(lin_vel) if fell_at is None else max(1, fell_at)
    lin_vel, ang_vel = np.asarray(lin_vel[:steps]), np.asarray(ang_vel[:steps])
    error_xy = np.linalg.norm(lin_vel[:, :2] - np.asarray(command[:2]), axis=1)
    error_yaw = np.abs(ang_vel[:, 2] - command[2])
    rewards = np.zeros_like(error_xy)
    for term, error in ((tracking.lin_vel_xy, error_xy), (tracking.ang_vel_z, error_yaw)):
        if term is not None:
            rewards += term.weight * np.exp(-error**2 / term.std ** 2)
    return {"command": [float(c) for c in command], "vel_error_xy": float(error_xy.mean()),
            "yaw_rate_error": float(error_yaw.mean()),
            "fell": fell_at is not None, "survived_s": steps * dt, "tracking_return": float(rewards.sum() * dt)}


def run_newton(env, policy, commands: np.ndarray, steps: int) -> list[dict]:
    """One env per command, the ONNX policy on the env's observations (batch = commands)."""
    import torch

    n = len(commands)
    groups = policy.metadata.observation.groups
    state = policy.initial_state(n)
    lin, ang = [], []
    fell_at: list[int | None] = [None] * n
    with torch.inference_mode():  # as in training: the env's buffers are inference tensors
        env.command.hold(commands)  # one command per env, kept across the episode
        env.reset()
        obs = env.get_observations()
        images = policy.image_names  # a policy that sees: its image groups as the env renders them
        for t in range(steps):
            flat = torch.cat([obs[g] for g in groups], dim=-1).cpu().numpy()
            actions, state = policy(flat, state, {g: obs[g].cpu().numpy() for g in images})
            obs, _, dones, extras = env.step(torch.as_tensor(actions, device=env.device))
            lin.append(env.robot.root_lin_vel_b.cpu().numpy())
            ang.append(env.robot.root_ang_vel_b.cpu().numpy())
            failed = (dones & ~extras["time_outs"]).cpu().numpy()
            for i in np.flatnonzero(failed):
                if fell_at[i] is None:
                    fell_at[i] = t
            # Finished envs were reset: ignored from fell_at on.
    lin, ang = np.stack(lin, 1), np.stack(ang, 1)
    tracking = policy.metadata.tracking
    return [episode_metrics(commands[i], lin[i], ang[i], fell_at[i], env.step_dt, tracking) for i in range(n)]


class FallDetector:
    """The policy metadata's fall conditions, on the MuJoCo robot: contact of named bodies, base height."""

    def __init__(self, robot, fall: Fall):
        import mujoco

        from legion.sim2real.deploy.mujoco_robot import find_id

        self.robot = robot
        self.body_ids = [find_id(robot.model, mujoco.mjtObj.mjOBJ_BODY, b) for b in fall.contact_bodies]
        self.threshold, self.min_height = fall.contact_threshold, fall.min_base_height

    def __call__(self, state: dict) -> bool:
        if not all(np.all(np.isfinite(v)) for v in state.values()):
            return True
        if self.min_height is not None and state["base_pos"][2] < self.min_height:
            return True
        return bool(self.body_ids) and self.robot.body_contact_force(self.body_ids) > self.threshold


def trained_mujoco_model(env):
    """One world of ``env`` as a plain ``mujoco.MjModel`` (the robot and its ground as the MuJoCo
    solver simulates them); ValueError for another solver."""
    if not hasattr(env.sim.solver, "mujoco_model"):
        raise ValueError(f"the run simulates with sim.solver={env.sim.solver.name}: plain MuJoCo needs the robot's "
                         "MJCF, or a run trained with sim.solver=mujoco (its MuJoCo model).")
    return env.sim.solver.mujoco_model()


@dataclass
class Perturbation:
    """A robustness condition of the MuJoCo robot (:data:`ROBUSTNESS`); the defaults are nominal."""

    name: str = "nominal"
    friction: float | None = None  # floor friction of every contact (None: the model's own)
    base_mass: float = 1.0  # the base's mass and inertia, times
    stiffness: float = 1.0  # every joint's kp, times
    latency_s: float = 0.0  # from a target's write to its effect [s], whole control steps
    noise: float = 0.0  # sensor noise, times SENSOR_NOISE (uniform, +-)
    push_mps: float = 0.0  # a horizontal base velocity kick [m/s] every PUSH_EVERY_S, random direction


# legged_gym's observation noise (uniform half-widths), applied to what the robot reports.
SENSOR_NOISE = {"joint_pos": 0.01, "joint_vel": 1.5, "base_lin_vel": 0.1, "base_ang_vel": 0.2}
PUSH_EVERY_S = 3.0
ROBUSTNESS = [
    Perturbation(), Perturbation("friction 0.25", friction=0.25), Perturbation("friction 0.4", friction=0.4),
    Perturbation("base mass +20%", base_mass=1.2), Perturbation("base mass -20%", base_mass=0.8),
    Perturbation("kp -20%", stiffness=0.8), Perturbation("latency 20 ms", latency_s=0.02),
    Perturbation("latency 40 ms", latency_s=0.04), Perturbation("sensor noise", noise=1.0),
    Perturbation("pushes 0.5 m/s", push_mps=0.5),
    Perturbation("combined", friction=0.4, base_mass=1.2, latency_s=0.04, noise=1.0),
]


class PerturbedRobot:
    """A :class:`MuJoCoRobot` as the control loop sees it under a :class:`Perturbation`: noisy
    sensors, targets that act ``latency_s`` late, pushes; the physical changes are made to the
    robot's model here once."""

    def __init__(self, robot, perturbation: Perturbation, control_dt: float, seed: int = 0):
        self.robot, self.p = robot, perturbation
        if perturbation.friction is not None:
            robot.set_floor_friction(perturbation.friction)
        robot.scale_base_mass(perturbation.base_mass)
        robot.scale_stiffness(perturbation.stiffness)
        self.delay = round(perturbation.latency_s / control_dt)
        self.push_every = max(1, round(PUSH_EVERY_S / control_dt))
        self.rng = np.random.default_rng(seed)
        self.reset()

    def reset(self) -> None:
        self.robot.reset()
        self.pending: list[np.ndarray] = []  # targets written, not yet acting
        self.writes = 0

    def read_state(self) -> dict:
        state = self.robot.read_state()
        if self.p.noise:
            for key, width in SENSOR_NOISE.items():
                noise = self.rng.uniform(-width, width, state[key].shape) * self.p.noise
                state[key] = (state[key] + noise).astype(np.float32)
        return state

    def write_targets(self, joint_pos_targets: np.ndarray) -> None:
        self.pending.append(np.array(joint_pos_targets))
        acting = self.pending.pop(0) if len(self.pending) > self.delay else self.robot.targets
        self.writes += 1
        if self.p.push_mps and self.writes % self.push_every == 0:
            angle = self.rng.uniform(0, 2 * np.pi)
            self.robot.data.qvel[0:2] += self.p.push_mps * np.array([np.cos(angle), np.sin(angle)])
        self.robot.write_targets(acting)


def run_mujoco(model, onnx_path: Path, commands: np.ndarray, steps: int, realtime: bool,
               options: dict, perturbation: Perturbation | None = None, reality=None) -> tuple[list[dict], dict]:
    """One episode per command on the MuJoCo robot (``model``: an MJCF path or an MjModel) through
    the edge runtime's control loop; ``options``: MuJoCo solver options (see :class:`MuJoCoRobot`);
    ``perturbation``: a robustness condition (default: nominal); ``reality``: a
    :class:`~legion.sim2real.reality.Reality` the robot is made of (default: the model's own physics)."""
    episodes = MuJoCoEpisodes(model, onnx_path, options, realtime, perturbation, reality)
    results = []
    for command in commands:
        trace = episodes.run(command, steps)
        results.append(episode_metrics(command, trace["lin_vel"], trace["ang_vel"], trace["fell_at"],
                                       episodes.dt, episodes.meta.tracking))
    return results, episodes.loop_summary()


class MuJoCoEpisodes:
    """Episodes of the exported policy on one MuJoCo robot through the edge runtime's control loop
    (:class:`~legion.sim2real.deploy.ControlLoop`), each from rest in the default pose; the loop's
    statistics add up over them (:meth:`loop_summary`)."""

    def __init__(self, model, onnx_path: Path, options: dict, realtime: bool = False,
                 perturbation: Perturbation | None = None, reality=None):
        from legion.sim2real.deploy import PolicyRunner
        from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot
        from legion.sim2real.reality import RealityRobot

        self.runner = PolicyRunner(onnx_path)
        self.meta, self.dt, self.realtime = self.runner.metadata, self.runner.control_dt, realtime
        self.plain = (RealityRobot(model, self.meta, reality, options=options) if reality is not None
                      else MuJoCoRobot(model, self.meta, options=options))
        self.robot = PerturbedRobot(self.plain, perturbation or Perturbation(), self.dt)
        self.falls = FallDetector(self.plain, self.meta.fall)
        self.latency: list[float] = []
        self.counts: dict[str, int] = {}

    def run(self, command, steps: int, push: tuple[int, np.ndarray] | None = None) -> dict:
        """``steps`` control steps at ``command``; ``push``: (control step, (2,) world-frame base
        velocity change [m/s]) added after that step's targets acted. Returns the base-frame
        velocities of the base's centre of mass ``lin_vel`` and ``ang_vel`` (T, 3), the base's
        tilt from upright [deg] and ``heading`` [rad] (T,), ``fell_at`` (the step that ended in a
        fall, or None) and ``jump``: the world-frame centre-of-mass velocity change the push
        made, as the state reads it (None without a push)."""
        from legion.sim2real.deploy import ControlLoop
        from legion.sim2real.deploy.policy import com_velocity

        self.robot.reset()
        self.runner.reset()
        loop = ControlLoop(self.robot, self.runner, now=self.plain.time, realtime=self.realtime)
        com = self.runner.terms.base_com
        lin, ang, tilt, heading, fell_at, jump = [], [], [], [], None, None
        for t in range(steps):
            loop.step(command)
            state = self.plain.read_state()  # the truth, for the metrics
            lin.append(com_velocity(state, com))  # what Newton's column tracks
            ang.append(state["base_ang_vel"])
            tilt.append(_tilt_deg(state["base_quat"]))
            heading.append(_heading(state["base_quat"]))
            if loop.stopped or self.falls(state):
                fell_at = t
                break
            if push is not None and t == push[0]:
                before = _world(state, com_velocity(state, com))
                self.plain.data.qvel[0:2] += push[1]  # the free joint's world-frame linear velocity
                after = self.plain.read_state()
                jump = _world(after, com_velocity(after, com)) - before
        self.latency += loop.stats.latency
        for key, value in loop.stats.summary().items():
            if key in ("misses", "limit_clamped", "rate_clamped", "hold", "stop"):
                self.counts[key] = self.counts.get(key, 0) + value
        return {"lin_vel": np.array(lin), "ang_vel": np.array(ang), "tilt": np.array(tilt),
                "heading": np.array(heading), "fell_at": fell_at, "jump": jump}

    def loop_summary(self) -> dict:
        return {**self.counts, "latency_p50_us": float(np.percentile(self.latency, 50) * 1e6),
                "latency_p99_us": float(np.percentile(self.latency, 99) * 1e6), "ticks": len(self.latency)}


def _rotation(quat_xyzw) -> np.ndarray:
    x, y, z, w = (float(v) for v in quat_xyzw)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def _world(state: dict, base_frame: np.ndarray) -> np.ndarray:
    return _rotation(state["base_quat"]) @ base_frame


def _tilt_deg(quat_xyzw) -> float:
    """The angle [deg] between the base's up axis and the world's."""
    return float(np.degrees(np.arccos(np.clip(_rotation(quat_xyzw)[2, 2], -1.0, 1.0))))


def _heading(quat_xyzw) -> float:
    """The base's yaw [rad]: where its forward axis points, projected on the ground."""
    forward = _rotation(quat_xyzw)[:, 0]
    return float(np.arctan2(forward[1], forward[0]))


# --- the push sweep -----------------------------------------------------------------------------
PUSH_PHASE_SPAN_S = 0.5  # the push times at one command spread over this: about a trot's cycle
RECOVERY_SMOOTHING_S = 0.2  # recovered: the tracking error, averaged over this long, ...
RECOVERY_MARGIN = (0.1, 0.1)  # ... within the unpushed episode's + this [m/s of v_xy, rad/s of yaw rate] ...
RECOVERY_HOLD_S = 0.5  # ... for this long
SETTLED_AFTER_S = 1.0  # the tracking compared with nominal starts this long after the push


@dataclass
class PushSweep:
    """Push recovery through the edge runtime in MuJoCo (``legion sim2sim robustness=true``): at
    each command, one push per episode for every magnitude [m/s] from each of ``directions``
    directions (evenly spaced in the robot's heading frame: 0 deg forward, 90 deg to its left),
    landing at ``phases`` moments spread over :data:`PUSH_PHASE_SPAN_S` (other feet in stance).
    A push adds its velocity to the base at once, as training's ``push_base`` does.
    ``trained_up_to``: the task's push range per axis [m/s] (None: training did not push)."""

    magnitudes: tuple[float, ...]
    directions: int = 8
    phases: int = 3
    trained_up_to: float | None = None

    def __post_init__(self):
        if not self.magnitudes or any(not (np.isfinite(m) and m > 0) for m in self.magnitudes):
            raise ValueError(f"pushes={','.join(f'{m:g}' for m in self.magnitudes)}: give push magnitudes in m/s, "
                             "positive, comma-separated, e.g. pushes=0.5,1.0.")
        for name in ("directions", "phases"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 1:
                raise ValueError(f"push_{name}={getattr(self, name)}: a whole number of at least 1.")

    @classmethod
    def for_task(cls, task, magnitudes=None, directions: int = 8, phases: int = 3) -> PushSweep:
        """The sweep of ``task`` (:class:`legion.configs.schema.Task`): by default half and all
        of its push range (``task.events.push``), or 0.5 and 1.0 m/s for a task without pushes."""
        event = task.events.get("push")
        trained = None
        if event is not None and event.enabled and event.func == "push_base":
            trained = float(max(abs(v) for v in event.range))
        if magnitudes is None:
            magnitudes = (0.5 * trained, trained) if trained else (0.5, 1.0)
        return cls(tuple(float(m) for m in magnitudes), directions, phases, trained)

    def beyond_training(self, magnitude: float) -> bool:
        return self.trained_up_to is None or magnitude > self.trained_up_to + 1e-9


def push_sweep(episodes: MuJoCoEpisodes, commands: np.ndarray, steps: int, sweep: PushSweep) -> dict:
    """Runs ``sweep`` at each command (episodes of ``steps`` control steps, the pushes from 40% of
    the episode on) and returns ``{"pushes": one row per push, "nominal": per command, "push_steps"}``.

    Per push: ``survived``; ``recover_s``, the time from the push until the tracking error is back
    near the unpushed episode's (:func:`_recovery`; None: not within the episode); ``peak_tilt_deg``
    after the push; ``error_after``, the mean v_xy error [m/s] from :data:`SETTLED_AFTER_S` after the
    push to the episode's end, and ``nominal_after``, the unpushed episode's over the same steps (both
    None: fell, or no such steps);
    ``jump``, the base velocity change the push made in the heading frame [m/s]."""
    dt = episodes.dt
    span = min(PUSH_PHASE_SPAN_S, 0.2 * steps * dt)
    push_steps = [int(round(0.4 * steps + k * span / dt / sweep.phases)) for k in range(sweep.phases)]
    settled = round(SETTLED_AFTER_S / dt)
    rows, nominal_rows = [], []
    for c, command in enumerate(commands):
        nominal = episodes.run(command, steps)
        reference = _errors(nominal, command)
        nominal_rows.append({"command": [float(v) for v in command], "fell": nominal["fell_at"] is not None})
        for k, p in enumerate(push_steps):
            heading = nominal["heading"][min(p, len(nominal["heading"]) - 1)]  # the pushed episode retraces it
            to_heading = np.array([[np.cos(heading), np.sin(heading)], [-np.sin(heading), np.cos(heading)]])
            for d in range(sweep.directions):
                angle = 2 * np.pi * d / sweep.directions
                for magnitude in sweep.magnitudes:
                    push = magnitude * np.array([np.cos(heading + angle), np.sin(heading + angle)])
                    trace = episodes.run(command, steps, (p, push))
                    errors, fell = _errors(trace, command), trace["fell_at"] is not None
                    end = min(len(errors[0]), len(reference[0]))
                    recover = _recovery(errors, reference, p, end, dt)
                    after = slice(p + 1 + settled, end)
                    tracked = not fell and after.start < after.stop
                    rows.append({"command": c, "direction_deg": float(np.degrees(angle)), "magnitude": magnitude,
                                 "phase": k, "survived": not fell, "recover_s": None if fell else recover,
                                 "peak_tilt_deg": float(trace["tilt"][p:].max(initial=0.0)),
                                 "error_after": float(errors[0][after].mean()) if tracked else None,
                                 "nominal_after": float(reference[0][after].mean()) if tracked else None,
                                 "jump": None if trace["jump"] is None else [float(v) for v in
                                                                            to_heading @ trace["jump"][:2]],
                                 "beyond_training": sweep.beyond_training(magnitude)})
    return {"pushes": rows, "nominal": nominal_rows, "push_steps": push_steps,
            "magnitudes": list(sweep.magnitudes), "directions": sweep.directions, "phases": sweep.phases,
            "trained_up_to": sweep.trained_up_to}


def push_summary(result: dict) -> dict:
    """The sweep's pushes grouped: ``by_direction`` ((command, direction) -> row) and
    ``by_magnitude`` (magnitude -> row); each row: ``pushes``, ``survived`` (share),
    ``recover_s`` (mean over the pushes survived and recovered from), ``not_recovered``,
    ``peak_tilt_deg`` (the largest), ``error_after`` (the mean [m/s]) and ``tracking_vs_nominal``
    (that over the unpushed episodes' mean over the same steps: a ratio of means, since standing
    still an unpushed error is near zero); ``within_training``: the row of every push no larger than
    the training range."""
    def row(pushes: list[dict]) -> dict:
        recovered = [r["recover_s"] for r in pushes if r["recover_s"] is not None]
        tracked = [r for r in pushes if r["error_after"] is not None]
        error = float(np.mean([r["error_after"] for r in tracked])) if tracked else None
        ratio = error / max(float(np.mean([r["nominal_after"] for r in tracked])), 1e-6) if error is not None else None
        return {"pushes": len(pushes), "survived": float(np.mean([r["survived"] for r in pushes])) if pushes else None,
                "recover_s": float(np.mean(recovered)) if recovered else None,
                "not_recovered": sum(r["survived"] and r["recover_s"] is None for r in pushes),
                "peak_tilt_deg": max((r["peak_tilt_deg"] for r in pushes), default=0.0),
                "error_after": error, "tracking_vs_nominal": ratio}

    rows = result["pushes"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["command"], r["direction_deg"]), []).append(r)
    return {"by_direction": {key: row(group) for key, group in groups.items()},
            "by_magnitude": {m: row([r for r in rows if r["magnitude"] == m]) for m in result["magnitudes"]},
            "within_training": row([r for r in rows if not r["beyond_training"]])}


def push_table(result: dict) -> str:
    """What ``legion sim2sim robustness=true`` prints for the push sweep: per command and direction,
    then per magnitude (those beyond the training range marked)."""
    sweep, summary = result["push_sweep"], push_summary(result["push_sweep"])

    def cells(r: dict) -> str:
        recover = f"{r['recover_s']:.2f} s" if r["recover_s"] is not None else "-"
        tracking = (f"{r['error_after']:.3f} m/s ({r['tracking_vs_nominal']:.2f}x)"
                    if r["error_after"] is not None else "-")
        return (f"{round(r['survived'] * r['pushes']):>3d} / {r['pushes']:<3d} | {recover:>9s} "
                f"{'(' + str(r['not_recovered']) + ' not)' if r['not_recovered'] else '':8s} | "
                f"{r['peak_tilt_deg']:5.1f} deg | {tracking:>20s}")

    trained = sweep["trained_up_to"]
    lines = [f"Pushes of {', '.join(f'{m:g}' for m in sweep['magnitudes'])} m/s from {sweep['directions']} directions "
             f"(0 deg: forward, 90 deg: left) at {sweep['phases']} moments of the gait, at each command "
             + (f"(training pushed up to {trained:g} m/s per axis):" if trained else "(training did not push):"),
             f"{'command (vx, vy, wz)':22s} | {'push':>7s} | {'survived':>9s} | {'recovered in':>18s} | "
             f"{'peak tilt':>9s} | {'tracking':>20s}"]
    for (c, direction), r in summary["by_direction"].items():
        command = "(" + ", ".join(f"{v:+.1f}" for v in sweep["nominal"][c]["command"]) + ")"
        lines.append(f"{command:22s} | {direction:3.0f} deg | {cells(r)}")
    for magnitude, r in summary["by_magnitude"].items():
        beyond = any(p["beyond_training"] for p in sweep["pushes"] if p["magnitude"] == magnitude)
        lines.append(f"{magnitude:g} m/s, every command and direction: survived {r['survived']:.0%} of {r['pushes']}"
                     + (" (beyond the training range)" if beyond else ""))
    lines.append(f"recovered in: until the tracking error (averaged over {RECOVERY_SMOOTHING_S:g} s) stays within "
                 f"{RECOVERY_MARGIN[0]:g} m/s and {RECOVERY_MARGIN[1]:g} rad/s of the unpushed episode's for "
                 f"{RECOVERY_HOLD_S:g} s; tracking: the v_xy error from {SETTLED_AFTER_S:g} s after the push on "
                 "(and over the unpushed episode's on the same steps)")
    return "\n".join(lines)


def plot_pushes(result: dict, path: Path) -> None:
    """The share of pushes survived by direction, one polar panel per command, a line per magnitude."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = result["push_sweep"]
    commands = sweep["nominal"]
    fig, axes = plt.subplots(1, len(commands), subplot_kw={"projection": "polar"},
                             figsize=(3.2 * len(commands), 3.6), squeeze=False)
    directions = sorted({r["direction_deg"] for r in sweep["pushes"]})
    angles = np.radians([*directions, directions[0]])
    for c, ax in enumerate(axes[0]):
        for magnitude in sweep["magnitudes"]:
            share = [np.mean([r["survived"] for r in sweep["pushes"]
                              if (r["command"], r["direction_deg"], r["magnitude"]) == (c, d, magnitude)])
                     for d in directions]
            ax.plot(angles, [*share, share[0]], marker="o", label=f"{magnitude:g} m/s")
        ax.set_ylim(0, 1)
        ax.set_title("(" + ", ".join(f"{v:+.1f}" for v in commands[c]["command"]) + ")", fontsize=9)
        ax.set_theta_zero_location("N")  # forward up, left to the left
        ax.tick_params(labelsize=7)
    axes[0][-1].legend(loc="lower right", fontsize=7, bbox_to_anchor=(1.3, -0.15))
    fig.suptitle("Pushes survived (share) by direction, per command (vx, vy, wz)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _recovery(errors, reference, push: int, end: int, dt: float) -> float | None:
    """Seconds from the push until the tracking errors (v_xy, yaw rate), smoothed over
    :data:`RECOVERY_SMOOTHING_S` (a gait's velocity swings within a stride), stay within
    :data:`RECOVERY_MARGIN` of the unpushed episode's mean after the push for
    :data:`RECOVERY_HOLD_S`; None: not within the episode."""
    smooth, hold = max(1, round(RECOVERY_SMOOTHING_S / dt)), max(1, round(RECOVERY_HOLD_S / dt))
    within = np.ones(max(0, end - push - smooth), bool)
    for error, nominal, margin in zip(errors, reference, RECOVERY_MARGIN):
        after = np.convolve(error[push + 1:end], np.ones(smooth) / smooth, mode="valid")  # at t: over [t, t + smooth)
        within &= after[:len(within)] <= nominal[push + 1:end].mean() + margin
    held = 0
    for t, ok in enumerate(within):
        held = held + 1 if ok else 0
        if held == hold:
            return (t - hold + 2) * dt  # the first step of the run that held
    return None


def _errors(trace: dict, command) -> tuple[np.ndarray, np.ndarray]:
    """(T,) tracking errors of v_xy [m/s] and yaw rate [rad/s] of an episode."""
    return (np.linalg.norm(trace["lin_vel"][:, :2] - np.asarray(command[:2]), axis=1),
            np.abs(trace["ang_vel"][:, 2] - command[2]))


def runtime_notes(action, loop: dict) -> list[str]:
    """What the edge runtime's safety clamps did that training did not: a policy that leans on
    targets past the joint limits (its PD pushing into a limit) or on target jumps faster than the
    runtime's rate limit is driven otherwise on the robot than in Newton (the G1 fell walking
    backward in MuJoCo only, until it trained clamped)."""
    from legion.sim2real.deploy.loop import SafetyConfig

    notes, ticks, rate = [], loop["ticks"], SafetyConfig().max_target_rate
    if not action.clamp_to_limits and loop["limit_clamped"] > 0.1 * ticks:
        notes.append(f"the edge runtime clamped the targets to the joint limits in {loop['limit_clamped']} of {ticks} "
                     "ticks, and the policy trained unclamped: train (or fine-tune) with "
                     "task.action.clamp_to_limits=true, as the robot will act")
    if (action.max_target_rate is None or action.max_target_rate > rate) and loop["rate_clamped"] > 0.1 * ticks:
        notes.append(f"the edge runtime held the targets' rate of change to {rate:g} rad/s (its safety clamp) in "
                     f"{loop['rate_clamped']} of {ticks} ticks, and the policy trained without that limit: train (or "
                     f"fine-tune) with task.action.max_target_rate={rate:g}")
    return notes


def mean_row(rows: list[dict]) -> dict:
    """The mean over episodes; ``fell`` becomes the number of falls."""
    keys = ("vel_error_xy", "yaw_rate_error", "survived_s", "tracking_return")
    return {**{k: float(np.mean([r[k] for r in rows])) for k in keys}, "fell": int(sum(r["fell"] for r in rows))}


def compare(run: Path, checkpoint=None, onnx: Path | None = None, duration_s: float = 10.0,
            commands=DEFAULT_COMMANDS, physics: str = "mjcf", realtime: bool = False, overrides=(),
            robustness: bool = False, episodes: int = 50, pushes: dict | None = None, reality=None) -> dict:
    """``legion sim2sim`` as a function: the exported policy in Newton and in plain MuJoCo. A task
    with a position or pose command (arm_lift, arm_reach) goes to :func:`compare_goals`
    (``episodes``); the rest of this describes velocity commands (locomotion).

    Exports the run (into ``<run>/exported``) unless ``onnx`` names a ``policy.onnx``. Every env
    starts like the MuJoCo robot (default pose, level, at rest) with the model's own physical
    parameters: every event term (reset perturbations, randomization, pushes) is off. Returns
    ``{"newton": rows, "mujoco": rows, "mean": {...}, "loop": control-loop statistics, "steps",
    "control_dt", "onnx"}``, and with ``robustness`` the MuJoCo robot's mean row under each
    :data:`ROBUSTNESS` condition (``"robustness"``: condition name -> row, the forward command's
    error added) and the push sweep (``"push_sweep"``: :func:`push_sweep` in episodes of
    ``min(duration_s, 5)`` seconds; ``pushes``: :meth:`PushSweep.for_task`'s keyword arguments);
    ``reality`` (a reality file, :mod:`legion.sim2real.reality`) makes the MuJoCo robot of every
    episode a stand-in with that physics (``"reality"``: its name). Raises ValueError (and the
    load/export errors) for a bad request.
    """
    from legion.api import load_run
    from legion.configs import load_run_config
    from legion.sim2real.deploy import OnnxPolicy
    from legion.tasks.mdp.commands import VelocityCommand
    from legion.tasks.sim import resolve_asset

    task = load_run_config(run).task
    if task.command is not None and task.command.type in ("position", "pose"):
        return compare_goals(run, checkpoint, onnx, episodes, physics, overrides)
    sweep = PushSweep.for_task(task, **(pushes or {})) if robustness else None  # refused before any work
    if reality is not None:
        from legion.sim2real.reality import load_reality

        reality = load_reality(reality)
    commands = np.asarray(commands, dtype=np.float32).reshape(-1, 3)
    still = [f"sim.num_envs={len(commands)}"] + [f"++task.events.{name}.enabled=false" for name in task.events]
    loaded = load_run(run, checkpoint, [*still, *overrides])
    env, settings = loaded.env, loaded.cfg
    if not isinstance(env.command, VelocityCommand) or not env.robot.floating_base:
        raise ValueError(f"task {settings.task.name} has no velocity command or no floating base; sim2sim compares "
                         "velocity-tracking (locomotion) and goal (position command) policies.")
    model = resolve_asset(settings.task.scene.robot.file)
    # A URDF or USD robot, or a policy that sees (the scene it saw: fixtures, objects): MuJoCo as
    # Newton built it (robot.mjb of the export)
    if model.suffix != ".xml" or settings.task.scene.cameras:
        model = trained_mujoco_model(env)
    options = physics_options(physics, settings.sim)
    if onnx is None:
        onnx = export_for_sim2sim(Path(run), loaded)
    policy = OnnxPolicy(onnx)
    steps = int(round(min(duration_s, settings.task.episode_length_s) / env.step_dt))
    newton = run_newton(env, policy, commands, steps)
    mujoco_rows, loop = run_mujoco(model, Path(onnx), commands, steps, realtime, options, reality=reality)
    result = {"newton": newton, "mujoco": mujoco_rows,
              "mean": {"newton": mean_row(newton), "mujoco": mean_row(mujoco_rows)},
              "loop": loop, "steps": steps, "control_dt": env.step_dt, "onnx": str(onnx),
              "reality": reality.name if reality is not None else None}
    result["notes"] = runtime_notes(env.action, loop)
    if sweep is not None:
        result["robustness"] = {}
        for condition in ROBUSTNESS:
            rows, _ = run_mujoco(model, Path(onnx), commands, steps, realtime, options, condition, reality)
            result["robustness"][condition.name] = {**mean_row(rows), "forward_error": rows[0]["vel_error_xy"]}
        runtime = MuJoCoEpisodes(model, Path(onnx), options, reality=reality)
        push_steps = int(round(min(duration_s, 5.0, settings.task.episode_length_s) / env.step_dt))
        result["push_sweep"] = push_sweep(runtime, commands, push_steps, sweep)
    return result


def export_for_sim2sim(run: Path, loaded) -> Path:
    """Exports ``loaded``'s checkpoint (as ``legion export``) and returns its policy.onnx: into
    ``<run>/exported``, unless that holds the export of another checkpoint (one ``legion export
    checkpoint=`` made for the robot, which is kept): then into ``<run>/sim2sim_exported``, and a
    note says so."""
    from legion.sim2real.export import export_run

    exported, checkpoint = run / "exported", loaded.checkpoint.name
    try:
        kept = json.loads((exported / "policy.json").read_text()).get("checkpoint")
    except (OSError, ValueError):  # no export yet (or an unreadable one, replaced)
        kept = None
    if kept not in (None, checkpoint):
        print(f"[sim2sim] {exported} holds the export of {kept} (kept); {checkpoint} is exported to "
              f"{run / 'sim2sim_exported'}", flush=True)
        exported = run / "sim2sim_exported"
    out_dir, _ = export_run(run, steps=20, loaded=loaded, out_dir=exported)
    return out_dir / "policy.onnx"


def goal_reached(distance: np.ndarray, threshold: float, hold_steps: int) -> int | None:
    """The step (0-based) at which ``distance`` (T,) [m] had been within ``threshold`` for
    ``hold_steps`` steps in a row (the task's success: ``SuccessTracker``), or None."""
    held = 0
    for t, d in enumerate(distance):
        held = held + 1 if d <= threshold else 0
        if held >= hold_steps:
            return t
    return None


def goal_row(distance: np.ndarray, threshold: float, hold_steps: int, dt: float) -> dict:
    reached = goal_reached(distance, threshold, hold_steps)
    return {"success": reached is not None, "time_s": None if reached is None else (reached + 1) * dt,
            "final_distance_m": float(distance[-1]), "min_distance_m": float(distance.min())}


def compare_goals(run: Path, checkpoint=None, onnx: Path | None = None, episodes: int = 50, physics: str = "mjcf",
                  overrides=()) -> dict:
    """A goal task's exported policy (``object_position`` observed: arm_lift) in Newton and
    through the edge runtime in plain MuJoCo, episode for episode from the same start.

    Newton runs ``episodes`` envs with the task's reset randomization (the object's place, joint
    offsets) and its goals; its model-changing randomization (startup and interval events: the
    object's size, mass, friction) is off, so that one MuJoCo model (Newton's of world 0, from the
    export: the robot, the object, the table) matches every env. Each MuJoCo episode starts from
    its Newton env's joint positions and object pose and holds its goal. Success, as the task's
    ``task.success``: the object within ``position_threshold`` of the goal for ``hold_s`` in a row.
    Returns ``{"kind": "goals", "newton": rows, "mujoco": rows, "mean": {...}, "agree", "loop",
    "steps", "control_dt", "onnx"}``.
    """
    import torch

    from legion.api import load_run
    from legion.configs import load_run_config
    from legion.sim2real.deploy import ControlLoop, OnnxPolicy, PolicyRunner
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot
    from legion.tasks.mdp.commands import PoseCommand, PositionCommand

    task = load_run_config(run).task
    still = [f"++task.events.{name}.enabled=false" for name, event in task.events.items() if event.mode != "reset"]
    loaded = load_run(run, checkpoint, [f"sim.num_envs={episodes}", *still, *overrides])
    env, settings = loaded.env, loaded.cfg
    command, success = env.command, task.success
    if (not isinstance(command, PositionCommand) or isinstance(command, PoseCommand) or success is None
            or "position_threshold" not in success.params):
        raise ValueError(f"task {task.name}: sim2sim compares goal tasks with a position command and a success "
                         "condition (task.success with position_threshold), e.g. arm_lift.")
    if onnx is None:
        onnx = export_for_sim2sim(Path(run), loaded)
    policy = OnnxPolicy(onnx)
    entity = command.body[0]  # the object the goal is for (its root pose starts each MuJoCo episode)
    threshold, hold = float(success.params["position_threshold"]), max(1, round(success.hold_s / env.step_dt))
    steps = env.max_episode_length - 1  # the whole episode, before the time-out's reset
    groups = policy.metadata.observation.groups

    # Newton: every env's start, then its episode (an env the task ends early keeps its last distance).
    with torch.inference_mode():
        env.reset()
        starts = {"joint_pos": env.robot.joint_pos.cpu().numpy().copy(),
                  "object_pose": entity.root_pose_w.cpu().numpy().copy(),
                  "goal": command.value[:, :3].cpu().numpy().copy()}
        command.hold(command.value.clone())
        obs, state = env.get_observations(), policy.initial_state(episodes)
        distance, ended = np.zeros((steps, episodes)), np.zeros(episodes, bool)
        for t in range(steps):
            actions, state = policy(torch.cat([obs[g] for g in groups], dim=-1).cpu().numpy(), state,
                                    {g: obs[g].cpu().numpy() for g in policy.image_names})
            obs, _, dones, _ = env.step(torch.as_tensor(actions, device=env.device))
            now = command.position_error().cpu().numpy()
            distance[t] = np.where(ended, distance[t - 1], now)
            ended |= dones.cpu().numpy()
    newton = [goal_row(distance[:, i], threshold, hold, env.step_dt) for i in range(episodes)]

    # MuJoCo: the edge runtime's control loop on Newton's model of the scene.
    runner = PolicyRunner(onnx)
    robot = MuJoCoRobot(trained_mujoco_model(env), runner.metadata, options=physics_options(physics, settings.sim),
                        object_body=entity.body_names[command.body[1]])
    mujoco_rows, latency, stops = [], [], 0
    for i in range(episodes):
        robot.reset(joint_pos=starts["joint_pos"][i], object_pose=starts["object_pose"][i])
        loop = ControlLoop(robot, runner, now=robot.time, realtime=False)
        goal = starts["goal"][i]
        d = np.zeros(steps)
        for t in range(steps):
            loop.step(goal)
            d[t] = np.linalg.norm(robot.read_state()["object_pos"] - goal)
        stops += loop.stopped is not None
        latency += loop.stats.latency
        mujoco_rows.append(goal_row(d, threshold, hold, runner.control_dt))
    robot.close()

    def mean(rows: list[dict]) -> dict:
        times = [r["time_s"] for r in rows if r["time_s"] is not None]
        return {"success_rate": float(np.mean([r["success"] for r in rows])),
                "time_s": float(np.mean(times)) if times else None,
                "final_distance_m": float(np.mean([r["final_distance_m"] for r in rows]))}

    return {"kind": "goals", "newton": newton, "mujoco": mujoco_rows,
            "mean": {"newton": mean(newton), "mujoco": mean(mujoco_rows)},
            "agree": int(sum(a["success"] == b["success"] for a, b in zip(newton, mujoco_rows))),
            "loop": {"latency_p50_us": float(np.percentile(latency, 50) * 1e6),
                     "latency_p99_us": float(np.percentile(latency, 99) * 1e6), "stops": stops},
            "steps": steps, "control_dt": env.step_dt, "onnx": str(onnx)}


def goals_table(result: dict) -> str:
    """What ``legion sim2sim`` prints for a goal task: success and distances per engine."""
    lines = [f"{'engine':24s} | {'success':>7s} | {'time to success':>15s} | {'final distance':>14s}"]
    for name, key in (("Newton (training engine)", "newton"), ("MuJoCo C (edge runtime)", "mujoco")):
        m = result["mean"][key]
        when = f"{m['time_s']:.2f} s" if m["time_s"] is not None else "-"
        lines.append(f"{name:24s} | {m['success_rate']:7.0%} | {when:>15s} | {100 * m['final_distance_m']:11.1f} cm")
    n, loop = len(result["newton"]), result["loop"]
    lines.append(f"The same outcome in {result['agree']} of {n} episodes. MuJoCo control loop: latency p50 "
                 f"{loop['latency_p50_us']:.0f} us, p99 {loop['latency_p99_us']:.0f} us, stops {loop['stops']}")
    return "\n".join(lines)


def robustness_table(result: dict) -> str:
    """What ``legion sim2sim robustness=true`` adds: one line per condition (MuJoCo robot)."""
    n = len(result["mujoco"])
    lines = [f"{'condition':18s} | {'falls':>7s} | {'first command err_xy':>20s} | {'mean err_xy':>11s} | "
             f"{'mean err_wz':>11s}"]
    for name, r in result["robustness"].items():
        lines.append(f"{name:18s} | {r['fell']:>3d} / {n:<2d} | {r['forward_error']:20.3f} | "
                     f"{r['vel_error_xy']:11.3f} | {r['yaw_rate_error']:11.3f}")
    return "\n".join(lines)


def table(result: dict) -> str:
    """The side-by-side table ``legion sim2sim`` prints."""
    def cells(r: dict) -> str:
        fell = ("fell" if r["fell"] else "-") if isinstance(r["fell"], bool) else r["fell"]  # a row / a count
        return (f"{r['vel_error_xy']:6.3f} {r['yaw_rate_error']:6.3f} {fell:>5} {r['survived_s']:5.1f} "
                f"{r['tracking_return']:7.2f}")

    head = f"{'err_xy':>6s} {'err_wz':>6s} {'falls':>5s} {'alive':>5s} {'return':>7s}"
    lines = [f"{'command (vx, vy, wz)':22s} | {'Newton (training engine)':^34s} | {'MuJoCo C (edge runtime)':^34s}",
             f"{'':22s} | {head} | {head}"]
    for a, b in zip(result["newton"], result["mujoco"]):
        command = "(" + ", ".join(f"{c:+.1f}" for c in a["command"]) + ")"
        lines.append(f"{command:22s} | {cells(a)} | {cells(b)}")
    lines.append(f"{'mean (falls: total)':22s} | {cells(result['mean']['newton'])} | {cells(result['mean']['mujoco'])}")
    loop = result["loop"]
    lines.append(f"MuJoCo control loop: {loop['ticks']} ticks, latency p50 {loop['latency_p50_us']:.0f} us, "
                 f"p99 {loop['latency_p99_us']:.0f} us, deadline misses {loop['misses']}, ticks clamped to joint "
                 f"limits {loop['limit_clamped']} / in rate {loop['rate_clamped']}, watchdog holds {loop['hold']}, "
                 f"stops {loop['stop']}")
    lines += [f"note: {note}" for note in result.get("notes", [])]
    return "\n".join(lines)
