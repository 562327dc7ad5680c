"""`legion eval`: what a trained policy does, measured on fixed tasks instead of read off a reward.

Two layers, so that a new kind of task plugs in with one function:

- :func:`rollout`, task-agnostic: runs a loaded run's policy deterministically (observation
  noise off; randomization as trained, or off) on every env from a fresh reset for a fixed
  number of control steps, and after each step hands the caller which envs are still in their
  first episode and which failed. Each env counts once: a world that failed or finished is
  reset by the env and ignored from then on.
- Metrics, one function per kind of task, ``f(loaded, options) -> report``, chosen by the task's
  command type (:data:`METRICS`). :func:`locomotion` holds one velocity command per group of envs
  and reports, per command, the tracking errors after a settling time, falls, survival time,
  terrain level and energy. :func:`goals` (pose and position commands: reach, lift) counts whole
  episodes and reports the success rate, time to success and final errors.

A report is ``{"rows": [one dict per condition, the table's rows], "series": {...}}`` plus the
run's identity; :func:`write` prints the table and saves JSON and a PNG (commanded vs actual
velocity over time; final errors and times to success) into ``<run>/eval/``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from legion.api import LoadedRun, load_run
from legion.configs import load_run_config

# v_x [m/s], v_y [m/s], yaw rate [rad/s] in the base frame; clamped to the task's command ranges.
DEFAULT_COMMANDS = {
    "forward": [1.0, 0.0, 0.0],
    "backward": [-0.5, 0.0, 0.0],
    "lateral": [0.0, 0.5, 0.0],
    "yaw": [0.0, 0.0, 1.0],
    "stand": [0.0, 0.0, 0.0],
}


@dataclass
class Options:
    """What to evaluate and how (``legion eval --help`` lists them with their defaults)."""

    commands: dict[str, list[float]] = field(default_factory=lambda: dict(DEFAULT_COMMANDS))
    envs_per_command: int = 16
    duration_s: float = 10.0  # per env: one episode of this length (no time-out before)
    settle_s: float = 1.0  # tracking errors count from this time on
    randomization: str = "trained"  # trained: every event term as the run configures it | off: none
    episodes: int = 100  # goal tasks (pose/position commands): whole episodes counted, on envs_per_command envs

    def check(self) -> None:
        problems = []
        if self.randomization not in ("trained", "off"):
            problems.append(f"randomization={self.randomization}: choose trained or off")
        if self.envs_per_command < 1:
            problems.append(f"envs={self.envs_per_command}: must be >= 1")
        if not self.duration_s > 0:
            problems.append(f"duration_s={self.duration_s}: must be > 0")
        if not 0 <= self.settle_s < self.duration_s:
            problems.append(f"settle_s={self.settle_s}: must be in [0, duration_s={self.duration_s})")
        if self.episodes < 1:
            problems.append(f"episodes={self.episodes}: must be >= 1")
        if not self.commands:
            problems.append("commands: none given")
        for name, value in self.commands.items():
            if not (isinstance(value, (list, tuple)) and len(value) == 3
                    and all(isinstance(v, (int, float)) and math.isfinite(v) for v in value)):
                problems.append(f"commands: {name}={value!r} is not [v_x, v_y, yaw_rate] (3 finite numbers)")
        if problems:
            raise ValueError("\n".join(problems))


def load(run: str | Path, options: Options, checkpoint=None, overrides=()) -> LoadedRun:
    """The run's env and policy, set up for evaluation: ``len(commands) * envs_per_command`` envs
    with episodes long enough for ``duration_s`` (goal tasks: ``envs_per_command`` envs, episodes as
    trained), randomization as ``options`` says, a terrain curriculum frozen at the levels the
    checkpoint reached, on the CPU if the run trained on a GPU this machine lacks (``overrides``
    may name another device)."""
    options.check()
    cfg = load_run_config(run)
    metrics_kind(cfg)  # a task without metrics is refused before its env is built
    if cfg.task.command is not None and cfg.task.command.type in GOAL_COMMANDS:
        setup = [f"sim.num_envs={options.envs_per_command}"]
    else:
        setup = [f"sim.num_envs={len(options.commands) * options.envs_per_command}",
                 f"task.episode_length_s={max(cfg.task.episode_length_s, options.duration_s + 1.0)}"]
    if options.randomization == "off":
        setup += [f"++task.events.{name}.enabled=false" for name in cfg.task.events]
    if cfg.task.scene.ground is not None and cfg.task.scene.ground.terrain is not None:
        setup.append("task.scene.ground.terrain.curriculum=false")  # levels come from the checkpoint
    with warnings.catch_warnings():
        if options.randomization == "off":  # the checkpoint's ranges of the terms turned off here
            warnings.filterwarnings("ignore", message="Saved randomization ranges")
        return load_run(run, checkpoint, [*setup, *overrides])


def rollout(loaded: LoadedRun, steps: int, observe) -> None:
    """Runs the policy deterministically for ``steps`` control steps, every env from a fresh reset.

    After step ``t`` (0-based) calls ``observe(t, running, failed)``: ``running`` (num_envs,) bool,
    the envs still in their first episode (their state is that episode's); ``failed`` (num_envs,)
    bool, the envs whose first episode ended in a failure at this step (not a time-out). Nothing
    is read back to the host, so ``observe`` can keep its sums on the device.
    """
    import torch

    env = loaded.env
    policy = loaded.runner.policy
    policy.eval()
    with torch.inference_mode():
        policy.reset()
        obs = env.reset()
        running = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
        for t in range(steps):
            obs, _, dones, extras = env.step(policy(obs))
            policy.reset(dones)
            failed = running & dones & ~extras["time_outs"]
            running = running & ~dones
            observe(t, running, failed)


# --- locomotion ----------------------------------------------------------------------------------
def locomotion(loaded: LoadedRun, options: Options) -> dict:
    """Velocity tracking per command (envs ``i * envs_per_command ...`` hold command ``i``).

    Per command, over the envs holding it and the steps after ``settle_s`` before any fall:
    ``vel_error_xy`` mean |v_xy,cmd - v_xy| [m/s] and ``yaw_rate_error`` mean |yaw rate_cmd -
    yaw rate| [rad/s], both in the base frame; ``lateral_drift`` mean v_y - v_y,cmd [m/s], signed
    (positive: to the left), the gait's left-right bias (a mirror-symmetric policy drifts
    neither way); ``fall_rate`` the share of envs whose episode
    ended in a failure; ``survival_s`` mean time to that failure (``duration_s`` if none);
    ``terrain_level`` the mean terrain level (rough terrain; ``None`` on a plane); ``power_w`` mean
    mechanical power sum |torque x joint velocity| [W]; ``cost_of_transport`` energy / (mass x g x
    distance walked), dimensionless (``None`` for commands without linear velocity).
    ``series``: per command the mean commanded and actual (v_x, v_y, yaw rate) over time.
    """
    import torch

    from legion.tasks.mdp.commands import VelocityCommand

    env, command = loaded.env, loaded.env.command
    if not isinstance(command, VelocityCommand) or not env.robot.floating_base:
        raise ValueError(f"task {loaded.cfg.task.name} has no velocity command or no floating base: "
                         "locomotion metrics need both.")
    names = list(options.commands)
    per, count = options.envs_per_command, len(names)
    ranges = command.ranges  # (3, 2): [low, high] of v_x, v_y, yaw rate
    asked = torch.tensor([options.commands[n] for n in names], dtype=torch.float32, device=env.device)
    held = torch.minimum(torch.maximum(asked, ranges[:, 0]), ranges[:, 1])
    command.hold(held.repeat_interleave(per, dim=0))
    steps = round(options.duration_s / env.step_dt)
    settle = round(options.settle_s / env.step_dt)
    robot, dt, n = env.robot, env.step_dt, env.num_envs
    zeros = lambda *shape: torch.zeros(n, *shape, device=env.device)  # noqa: E731
    sums = {"err_xy": zeros(), "err_yaw": zeros(), "drift": zeros(), "steps": zeros(), "energy": zeros(),
            "path": zeros()}
    fell, survived = torch.zeros(n, dtype=torch.bool, device=env.device), zeros()
    series = torch.zeros(steps, count, 3, device=env.device)  # mean actual velocity per command group
    mass = robot.body_mass.sum(dim=1)
    gravity = env.sim.gravity.norm(dim=1)

    lin_vel_w = robot.root_lin_vel_w
    assert lin_vel_w is not None  # a floating base (checked above) has its root's views

    def observe(t: int, running, failed) -> None:
        velocity = torch.cat([robot.root_lin_vel_b[:, :2], robot.root_ang_vel_b[:, 2:]], dim=1)  # (n, 3)
        live = running.float()
        survived.add_(live * dt)
        fell.logical_or_(failed)
        group_live = live.view(count, per).sum(1).clamp(min=1.0)
        series[t] = (velocity * live[:, None]).view(count, per, 3).sum(1) / group_live[:, None]
        if t < settle:
            return
        error = velocity - command.value
        sums["err_xy"].add_(error[:, :2].norm(dim=1) * live)
        sums["err_yaw"].add_(error[:, 2].abs() * live)
        sums["drift"].add_(error[:, 1] * live)
        sums["steps"].add_(live)
        power = (env.action.applied_torque() * robot.joint_vel[:, env.action.joint_ids]).abs().sum(dim=1)
        sums["energy"].add_(power * dt * live)
        sums["path"].add_(lin_vel_w[:, :2].norm(dim=1) * dt * live)

    rollout(loaded, steps, observe)
    group = lambda x: x.view(count, per)  # noqa: E731
    # Steps measured per command: none when every env of it fell before settle_s. Its errors and power
    # are then undefined (None in the rows), not 0: a command nobody stayed up for was not tracked.
    measured = group(sums["steps"]).sum(1)
    measured = torch.where(measured > 0, measured, torch.nan)
    levels = env.terrain_levels.levels.float() if env.terrain_levels is not None else None
    result = {
        "vel_error_xy": group(sums["err_xy"]).sum(1) / measured,
        "yaw_rate_error": group(sums["err_yaw"]).sum(1) / measured,
        "lateral_drift": group(sums["drift"]).sum(1) / measured,
        "fall_rate": group(fell.float()).mean(1),
        "survival_s": group(survived).mean(1),
        "power_w": group(sums["energy"]).sum(1) / (measured * dt),
        "cost_of_transport": group(sums["energy"]).sum(1)
                             / (group(mass * gravity * sums["path"]).sum(1)).clamp(min=1e-9),
    }
    if levels is not None:
        result["terrain_level"] = group(levels).mean(1)
    result = {k: v.tolist() for k, v in result.items()}  # the one read-back
    held, asked = ([[round(v, 6) for v in c] for c in x.tolist()] for x in (held, asked))
    rows = []
    defined = lambda x: None if math.isnan(x) else x  # noqa: E731
    for i, name in enumerate(names):
        moving = math.hypot(held[i][0], held[i][1]) > 0.0
        rows.append({
            "command": name, "v_x": held[i][0], "v_y": held[i][1], "yaw_rate": held[i][2],
            "clamped": held[i] != asked[i],
            "vel_error_xy": defined(result["vel_error_xy"][i]), "yaw_rate_error": defined(result["yaw_rate_error"][i]),
            "lateral_drift": defined(result["lateral_drift"][i]),
            "fall_rate": result["fall_rate"][i], "survival_s": result["survival_s"][i],
            "terrain_level": result["terrain_level"][i] if levels is not None else None,
            "power_w": defined(result["power_w"][i]),
            "cost_of_transport": result["cost_of_transport"][i] if moving else None,
        })
    time_s = [(t + 1) * dt for t in range(steps)]
    actual = series.tolist()
    return {"rows": rows, "series": {"time_s": time_s, "commands": {
        name: {"commanded": held[i], "actual": [step[i] for step in actual]} for i, name in enumerate(names)}}}


def plot_velocity(report: dict, path: Path) -> None:
    """A PNG of commanded (dashed) vs actual (solid, mean over the command's envs) v_x, v_y and
    yaw rate over time, one panel per command; the shaded span is the settling time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = report["series"]
    commands = series["commands"]
    fig, axes = plt.subplots(len(commands), 1, figsize=(8, 2.2 * len(commands)), sharex=True, squeeze=False)
    labels = ("v_x [m/s]", "v_y [m/s]", "yaw rate [rad/s]")
    colours = ("tab:blue", "tab:orange", "tab:green")
    for ax, (name, data) in zip(axes[:, 0], commands.items()):
        for k in range(3):
            ax.plot(series["time_s"], [step[k] for step in data["actual"]], color=colours[k], label=labels[k])
            ax.axhline(data["commanded"][k], color=colours[k], linestyle="--", linewidth=1)
        ax.axvspan(0, report["options"]["settle_s"], color="0.9")
        ax.set_title(f"{name}: command ({', '.join(f'{c:+.2f}' for c in data['commanded'])})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("time [s]")
    fig.suptitle(f"{report['task']} {report['checkpoint']}: commanded (dashed) vs actual (mean over envs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --- goals: reach, lift ---------------------------------------------------------------------------
GOAL_COMMANDS = ("pose", "position")


def goals(loaded: LoadedRun, options: Options) -> dict:
    """Success rate, time to success and final errors over ``options.episodes`` whole episodes.

    For tasks with a ``task.success`` and a pose or position command (``arm_reach``, ``arm_lift``).
    Every env starts a fresh episode, so each counted episode is whole; commands are the task's
    (or what the caller fixed with ``loaded.env.command.hold``). One row: ``success_rate``,
    ``time_to_success_s`` (episode time at which the success condition had held ``hold_s``; over
    the successful episodes), ``final_position_error_m`` and ``final_orientation_error_rad`` (the
    commanded body's distance and angle from the command at the start of the episode's last
    control step: the step that ends an episode also resets its world), means; ``None`` where
    nothing was measured (no success; a position command has no orientation). ``summary``: mean,
    median and max of each; ``rewards``: each reward term's mean over the episodes, per second of
    episode as in training's ``Episode_Reward/<term>`` (for staged tasks the stages the policy
    reaches: grasp, lift, bring); ``axes``: per axis of the base frame, see :func:`axes`;
    ``series["episodes"]``: one record per episode (with its world, ``env``, its ``rewards``, and
    the goal and the body's final position in the base frame, ``goal_b_m`` and ``final_b_m``), in
    the order they ended. Every world counts ``ceil(episodes / num_envs)`` episodes at most.
    """
    from legion.tasks.mdp.commands import PoseCommand, PositionCommand

    env, command, success = loaded.env, loaded.env.command, loaded.env.success
    if success is None:
        raise ValueError(f"task {loaded.cfg.task.name} defines no success (task.success): there is no success rate "
                         "to measure. Add a success section to its config (see configs/task/arm_reach.yaml).")
    if not isinstance(command, PositionCommand):
        raise ValueError(f"task {loaded.cfg.task.name} has no position or pose command: no goal to measure.")
    policy = loaded.runner.policy
    policy.eval()
    records: list[dict] = []
    # Each world counts as many episodes: counting the first to end would over-count worlds whose
    # episodes end early (failures that terminate; a cube drawn hard to hold) and bias the rate down.
    quota, counted = math.ceil(options.episodes / env.num_envs), [0] * env.num_envs
    episode_s = env.max_episode_length * env.step_dt  # the env's Episode_Reward normalization
    obs = env.reset()
    policy.reset()
    while len(records) < options.episodes:
        position_error = command.position_error()
        orientation_error = command.orientation_error() if isinstance(command, PoseCommand) else None
        goal_b, final_b = command.value[:, :3].clone(), command.position_b()
        # The step that ends an episode also zeroes its sums: keep them (its own reward is added below).
        sums = {name: s.clone() for name, s in env.episode_sums.items()}
        obs, _, dones, _ = env.step(policy(obs))
        policy.reset(dones)
        ended = dones.nonzero().squeeze(-1).tolist()  # one read-back per step: evaluation, not training
        for i in ended:
            if counted[i] == quota or len(records) == options.episodes:
                continue
            counted[i] += 1
            succeeded = bool(success.last_succeeded[i])
            records.append({
                "env": i,
                "success": succeeded,
                "time_to_success_s": float(success.last_time_s[i]) if succeeded else None,
                "final_position_error_m": float(position_error[i]),
                "final_orientation_error_rad": float(orientation_error[i]) if orientation_error is not None else None,
                "goal_b_m": goal_b[i].tolist(),
                "final_b_m": final_b[i].tolist(),
                "rewards": {name: float(sums[name][i] + env.reward_values[name][i]) / episode_s for name in sums},
            })

    def summary(key: str) -> dict | None:
        values = [r[key] for r in records if r[key] is not None and not math.isnan(r[key])]
        if not values:
            return None
        return {"mean": statistics.fmean(values), "median": statistics.median(values), "max": max(values)}

    keys = ("time_to_success_s", "final_position_error_m", "final_orientation_error_rad")
    summaries = {k: summary(k) for k in keys}
    row = {"episodes": len(records), "success_rate": sum(r["success"] for r in records) / len(records),
           **{k: s["mean"] if s else None for k, s in summaries.items()}}
    rewards = {name: statistics.fmean(r["rewards"][name] for r in records) for name in env.episode_sums}
    return {"rows": [row], "summary": summaries, "rewards": rewards, "axes": axes(records),
            "series": {"episodes": records}}


def axes(records: list[dict]) -> dict:
    """Where the commanded body ends against its goal, per axis of the base frame (x, y, z):
    ``mean_abs_error_m`` and ``follows_goal``, the least-squares slope of the final position on the
    goal over the episodes: 1 when the body ends where the goal is, 0 when it ends at the same
    place whatever the goal (a policy that has not yet learned that axis); ``None`` when the goals
    do not vary along the axis."""
    result = {}
    for axis, name in enumerate("xyz"):
        goal = [r["goal_b_m"][axis] for r in records]
        final = [r["final_b_m"][axis] for r in records]
        try:
            slope = statistics.linear_regression(goal, final).slope
        except statistics.StatisticsError:  # one goal (held, or a range of one value), or one episode
            slope = None
        result[name] = {"mean_abs_error_m": statistics.fmean(abs(f - g) for g, f in zip(goal, final)),
                        "follows_goal": slope}
    return result


def axes_line(axes: dict) -> str:
    """A goal report's ``axes`` as one line."""
    cells = [f"{k} error {100 * a['mean_abs_error_m']:.1f} cm, follows the goal "
             + ("-" if a["follows_goal"] is None else f"{a['follows_goal']:.2f}") for k, a in axes.items()]
    return "per axis (base frame): " + "; ".join(cells) + " (follows: 1 ends at the goal, 0 ignores it)"


def plot_goals(report: dict, path: Path) -> None:
    """A PNG of each episode's final position error (sorted; successes in green) and a histogram
    of the times to success."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    episodes = sorted(report["series"]["episodes"], key=lambda r: r["final_position_error_m"])
    fig, (errors, times) = plt.subplots(1, 2, figsize=(10, 3.2))
    errors.bar(range(len(episodes)), [100 * r["final_position_error_m"] for r in episodes], width=1.0,
               color=["tab:green" if r["success"] else "tab:red" for r in episodes])
    errors.set(xlabel="episode (sorted)", ylabel="final position error [cm]", yscale="log",
               title=f"success {report['rows'][0]['success_rate']:.1%} (green)")
    times.hist([r["time_to_success_s"] for r in episodes if r["success"]], bins=20, color="tab:green")
    times.set(xlabel="time to success [s]", ylabel="episodes")
    fig.suptitle(f"{report['task']} {report['checkpoint']}: {len(episodes)} episodes", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# Each kind of task's (metrics function, plot function), by the task's command type. Another kind
# of task adds its entry here: f(loaded, options) -> {"rows": [...], ...} (rollout() runs the policy).
METRICS = {"velocity": (locomotion, plot_velocity), **{kind: (goals, plot_goals) for kind in GOAL_COMMANDS}}


def metrics_kind(cfg) -> str:
    """The kind of task ``cfg`` is, for :data:`METRICS`; ValueError where legion eval has none."""
    kind = cfg.task.command.type if cfg.task.command else None
    if kind not in METRICS:
        raise ValueError(f"task {cfg.task.name}: no evaluation metrics for command type {kind!r}; "
                         f"legion eval measures {sorted(METRICS)} tasks.")
    return kind


def measure(loaded: LoadedRun, options: Options) -> dict:
    """The metrics of the loaded run (from :func:`load`) for its kind of task, with the run's identity."""
    kind = metrics_kind(loaded.cfg)
    import torch

    with torch.inference_mode():  # no autograd bookkeeping: evaluation only reads the policy
        report = METRICS[kind][0](loaded, options)
    return {"task": loaded.cfg.task.name, "kind": kind, "run": str(loaded.run), "checkpoint": loaded.checkpoint.name,
            "iteration": int(loaded.runner.iteration), "device": loaded.cfg.device,
            "options": asdict(options), **report}


def evaluate(run: str | Path, options: Options | None = None, checkpoint=None, overrides=()) -> dict:
    """``legion eval`` as a function: loads the run (see :func:`load`) and returns :func:`measure`'s report."""
    options = options or Options()
    return measure(load(run, options, checkpoint, overrides), options)


WALK_ERROR, WALK_FALLS = 0.1, 0.05  # the walking goal: forward tracking error [m/s], share of envs that fell


def _walking(report: dict) -> tuple[float | None, float]:
    """A locomotion report's forward tracking error [m/s] (None: every env fell first) and its
    share of fallen envs, on average over the commands."""
    forward = next((r for r in report["rows"] if r["command"] == "forward"), None)
    falls = [r["fall_rate"] for r in report["rows"] if r["fall_rate"] is not None]
    return forward and forward["vel_error_xy"], sum(falls) / max(len(falls), 1)


def goal_met(report: dict, success_rate: float = 0.97) -> bool:
    """Whether :func:`measure`'s report meets its task's goal: a goal task's success rate at least
    ``success_rate``; a locomotion task walks (the forward command tracked within ``WALK_ERROR`` and
    fewer than ``WALK_FALLS`` of the envs fallen, on average over the commands)."""
    if report["kind"] in GOAL_COMMANDS:
        return report["rows"][0]["success_rate"] >= success_rate
    error, falls = _walking(report)
    return error is not None and error < WALK_ERROR and falls < WALK_FALLS


def goal_line(report: dict) -> str:
    """The goal's measures in a few words."""
    if report["kind"] in GOAL_COMMANDS:
        return f"success {report['rows'][0]['success_rate']:.1%}"
    error, falls = _walking(report)
    return f"forward error {'-' if error is None else f'{error:.3f} m/s'}, falls {falls:.0%}"


class StopAtGoal:
    """``agent.stop_when.goal``: after every ``every_min`` minutes of training, the policy is saved
    and measured as ``legion eval`` does (:func:`load`, :func:`measure`: an env of its own, built at
    the first evaluation; noise off, randomization as trained); once :func:`goal_met` holds at
    ``confirm`` evaluations in a row it raises :class:`GoalReached`. A
    :class:`~legion.agents.runner.Runner` calls it after each iteration (``on_iteration``)."""

    def __init__(self, run_dir: Path, cfg):
        stop = cfg.agent.stop_when
        self.run_dir, self.stop = Path(run_dir), stop
        self.options = Options(envs_per_command=stop.envs_per_command, episodes=stop.episodes)
        self.loaded: LoadedRun | None = None
        self.streak, self.evaluations, self.evaluated = 0, 0, -1
        self.clock, self.trained_s = time.perf_counter(), 0.0  # training time: evaluations excluded

    def __call__(self, runner, iteration: int, last: bool = False) -> None:
        """After an iteration: evaluates when ``every_min`` more minutes of training are done (or,
        ``last``, the run's final policy if not evaluated yet)."""
        now = time.perf_counter()
        self.trained_s += now - self.clock
        self.clock = now
        due = last or self.trained_s >= 60 * self.stop.every_min * (self.evaluations + 1)
        if not due or iteration == self.evaluated:
            return
        self.evaluated = iteration
        path = runner.save()
        if self.loaded is None:
            self.loaded = load(self.run_dir, self.options, path)
        else:
            self.loaded.runner.load(path, episodes=False)
            self.loaded.checkpoint = path
        report = measure(self.loaded, self.options)
        self.evaluations += 1
        met = goal_met(report, self.stop.success_rate)
        self.streak = self.streak + 1 if met else 0
        print(f"[legion] evaluation {self.evaluations} at {self.trained_s / 60:.1f} min of training (iteration "
                 f"{iteration}): {goal_line(report)}: goal {'met' if met else 'not met'}"
                 f"{f' ({self.streak} of {self.stop.confirm} in a row)' if met else ''}", flush=True)
        self.clock = time.perf_counter()
        if self.streak >= self.stop.confirm:
            raise GoalReached(path, iteration, self.trained_s, report)

    def close(self) -> None:
        if self.loaded is not None:
            self.loaded.env.close()


class GoalReached(Exception):
    """Training met its goal (``agent.stop_when``) at ``iteration``; ``checkpoint`` holds that policy
    (an asynchronous learner may have gone on an iteration or two while stopping)."""

    def __init__(self, checkpoint: Path, iteration: int, trained_s: float, report: dict):
        super().__init__(f"goal met: {goal_line(report)}")
        self.checkpoint, self.iteration, self.trained_s, self.report = checkpoint, iteration, trained_s, report


def table(report: dict) -> str:
    """The report's rows as a text table (numbers to 3 decimals; ``-`` for none)."""
    rows = report["rows"]
    keys = [k for k in rows[0] if k != "clamped"]

    def cell(row, key):
        value = row[key]
        if value is None:
            return "-"
        if key == "command" and row.get("clamped"):
            return f"{value}*"
        if key in ("fall_rate", "success_rate"):
            return f"{value:.0%}"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    cells = [[cell(r, k) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    if any(r.get("clamped") for r in rows):
        lines.append("* clamped to the task's command ranges")
    if "rewards" in report:
        lines.append(reward_line(report["rewards"]))
    if "axes" in report:
        lines.append(axes_line(report["axes"]))
    return "\n".join(lines)


def reward_line(rewards: dict[str, float]) -> str:
    """A goal report's ``rewards`` as one line: each term per second of episode."""
    return "reward per second of episode: " + ", ".join(f"{k} {v:.3g}" for k, v in rewards.items())


def write(report: dict, out_dir: str | Path) -> list[Path]:
    """Saves ``<checkpoint>.json`` and the kind's plot as ``<checkpoint>.png`` into ``out_dir``;
    returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(report["checkpoint"]).stem
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    METRICS[report["kind"]][1](report, out_dir / f"{stem}.png")
    return [path, out_dir / f"{stem}.png"]
