"""`legion sim2sim`: the exported policy in plain MuJoCo (through the edge runtime) next to Newton.

Both engines start the robot at rest in the default pose, base level at the task's default
height, and hold one velocity command per episode for ``duration_s``. The same exported
``policy.onnx`` drives both: in Newton through onnxruntime on the env's observations, in
MuJoCo through :class:`~legion.sim2real.deploy.PolicyRunner` and :class:`~legion.sim2real.deploy.ControlLoop`
(with its clamps and watchdog) on :class:`~legion.sim2real.deploy.mujoco_robot.MuJoCoRobot`.

Per engine and command: velocity tracking error (mean over the steps before any fall of
|v_xy,cmd - v_xy| [m/s] and |yaw rate_cmd - yaw rate| [rad/s], base frame), whether the robot
fell (the task's base-contact / base-height terminations, or non-finite state), survival time,
and the tracking return: the sum over those steps of the task's two tracking reward terms
(track_lin_vel_xy_exp, track_ang_vel_z_exp) times weight and control dt, computed from the
recorded velocities by one function for both engines.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

HELP = """usage: legion sim2sim run=<run folder> [duration_s=10] [commands=JSON] [realtime=false] [key=value ...]

Exports the run's policy (as `legion export`, into <run>/exported/ unless onnx=PATH names an
existing policy.onnx), then drives the robot with it in Newton and in plain MuJoCo (the edge
runtime's control loop on the MuJoCo robot, loading the same robot MJCF plus a floor), one
episode of duration_s per velocity command, and prints the metrics side by side: tracking
error of (v_x, v_y) and yaw rate, falls, survival time, tracking return.

  commands=[[0.5,0,0],[1,0,0],[0,0.5,0],[0,0,1],[0,0,0]]   (v_x [m/s], v_y [m/s], yaw rate [rad/s])
  physics=mjcf       MuJoCo as the robot file configures it (default: Euler, 100 solver iterations)
  physics=matched    Newton SolverMuJoCo's setup of the training run (implicitfast, its iterations):
                     then the two columns agree to ~1e-6 and check the export and the runtime end to end
  realtime=true      pace the MuJoCo loop at the control rate (deadline stats then mean wall time)
  json=PATH          also write the table as JSON
"""

DEFAULT_COMMANDS = [[0.5, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


def physics_options(physics: str, sim_cfg: dict) -> dict:
    """MuJoCo solver options: ``mjcf`` keeps the robot file's own (MuJoCo's defaults where it sets
    none: Euler, 100 iterations); ``matched`` copies the training run's Newton SolverMuJoCo setup."""
    if physics == "mjcf":
        return {}
    if sim_cfg.get("solver") != "mujoco":
        sys.exit(f"legion sim2sim: physics=matched copies Newton's MuJoCo solver; the run trained with "
                 f"sim={sim_cfg.get('solver')}. Use physics=mjcf.")
    solver = sim_cfg.get("solver_options") or {}
    newton_defaults = {"integrator": "implicitfast", "cone": "pyramidal", "solver": "newton"}
    return {**newton_defaults, **{k: v for k, v in solver.items() if k in (*newton_defaults, "iterations",
                                                                          "ls_iterations", "impratio", "tolerance")}}


def tracking_terms(task: dict) -> dict:
    """(weight, std) of the task's tracking rewards by function name; zero weight if absent."""
    terms = {"track_lin_vel_xy_exp": (0.0, 1.0), "track_ang_vel_z_exp": (0.0, 1.0)}
    for name, spec in (task.get("rewards") or {}).items():
        func = (spec or {}).get("func", name)
        if func in terms:
            terms[func] = (float(spec.get("weight", 1.0)), float(spec["params"]["std"]))
    return terms


def episode_metrics(command, lin_vel, ang_vel, fell_at: int | None, dt: float, terms: dict) -> dict:
    """Metrics of one episode from per-step base-frame velocities (T, 3) [m/s, rad/s].

    Steps from ``fell_at`` on (the step that ended in a fall) are excluded.
    """
    steps = len(lin_vel) if fell_at is None else max(1, fell_at)
    lin_vel, ang_vel = np.asarray(lin_vel[:steps]), np.asarray(ang_vel[:steps])
    error_xy = np.linalg.norm(lin_vel[:, :2] - np.asarray(command[:2]), axis=1)
    error_yaw = np.abs(ang_vel[:, 2] - command[2])
    (w_lin, std_lin), (w_ang, std_ang) = terms["track_lin_vel_xy_exp"], terms["track_ang_vel_z_exp"]
    rewards = w_lin * np.exp(-error_xy**2 / std_lin**2) + w_ang * np.exp(-error_yaw**2 / std_ang**2)
    return {"command": [float(c) for c in command], "vel_error_xy": float(error_xy.mean()),
            "yaw_rate_error": float(error_yaw.mean()),
            "fell": fell_at is not None, "survived_s": steps * dt, "tracking_return": float(rewards.sum() * dt)}


def run_newton(env, policy, commands: np.ndarray, steps: int, terms: dict) -> list[dict]:
    """One env per command, the ONNX policy on the env's observations (batch = commands)."""
    import torch

    from legion.tasks.mdp.observations import base_ang_vel, base_lin_vel

    n = len(commands)
    groups = policy.metadata["observation"]["groups"]
    state = policy.initial_state(n)
    lin, ang, fell_at = [], [], [None] * n
    with torch.inference_mode():  # as in training: the env's buffers are inference tensors
        env.reset()
        env.command.value[:] = torch.as_tensor(commands, dtype=torch.float32, device=env.device)
        env.command.steps_left[:] = 1 << 40  # never resample during the episode
        # The reset computed observations with the sampled commands; rebuild them with ours.
        obs = env.refresh_observations()
        for t in range(steps):
            flat = torch.cat([obs[g] for g in groups], dim=-1).cpu().numpy()
            actions, state = policy(flat, state)
            obs, _, dones, extras = env.step(torch.as_tensor(actions, device=env.device))
            lin.append(base_lin_vel(env).cpu().numpy())
            ang.append(base_ang_vel(env).cpu().numpy())
            failed = (dones & ~extras["time_outs"]).cpu().numpy()
            for i in np.flatnonzero(failed):
                if fell_at[i] is None:
                    fell_at[i] = t
            # Finished envs were reset (and got a new command): ignored from fell_at on.
    lin, ang = np.stack(lin, 1), np.stack(ang, 1)
    return [episode_metrics(commands[i], lin[i], ang[i], fell_at[i], env.step_dt, terms) for i in range(n)]


class FallDetector:
    """The task's terminations that MuJoCo can evaluate: contact of named bodies, base height."""

    def __init__(self, robot, task: dict):
        import mujoco

        self.robot, self.body_ids, self.threshold, self.min_height = robot, [], None, None
        self.skipped = []
        names = [robot.model.body(i).name for i in range(robot.model.nbody)]
        for name, spec in (task.get("terminations") or {}).items():
            func, params = (spec or {}).get("func", name), (spec or {}).get("params") or {}
            if func == "illegal_contact":
                self.body_ids += [mujoco.mj_name2id(robot.model, mujoco.mjtObj.mjOBJ_BODY, b)
                                  for b in names if re.fullmatch(params["bodies"], b)]
                self.threshold = float(params.get("threshold", 1.0))
            elif func == "base_height_below":
                self.min_height = float(params["height"])
            else:
                self.skipped.append(name)

    def __call__(self, state: dict) -> bool:
        if not all(np.all(np.isfinite(v)) for v in state.values()):
            return True
        if self.min_height is not None and state["base_pos"][2] < self.min_height:
            return True
        return bool(self.body_ids) and self.robot.body_contact_force(self.body_ids) > self.threshold


def run_mujoco(model_path: Path, onnx_path: Path, commands: np.ndarray, steps: int, task: dict, terms: dict,
               realtime: bool, options: dict) -> tuple[list[dict], dict, list[str]]:
    """One episode per command on the MuJoCo robot through the edge runtime's control loop;
    ``options``: MuJoCo solver options (see :class:`MuJoCoRobot`)."""
    from legion.sim2real.deploy import ControlLoop, PolicyRunner
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot

    runner = PolicyRunner(onnx_path)
    robot = MuJoCoRobot(model_path, runner.metadata, floor_friction=task.get("ground_friction", 1.0),
                        options=options)
    falls = FallDetector(robot, task)
    results, latency, summary = [], [], {}
    for command in commands:
        robot.reset()
        runner.reset()
        loop = ControlLoop(robot, runner, now=robot.time, realtime=realtime)
        lin, ang, fell_at = [], [], None
        for t in range(steps):
            loop.step(command)
            state = robot.read_state()
            lin.append(state["base_lin_vel"])
            ang.append(state["base_ang_vel"])
            if loop.stopped or falls(state):
                fell_at = t
                break
        results.append(episode_metrics(command, lin, ang, fell_at, runner.control_dt, terms))
        latency += loop.stats.latency
        for key, value in loop.stats.summary().items():
            if key in ("misses", "limit_clamped", "rate_clamped", "hold", "stop"):
                summary[key] = summary.get(key, 0) + value
    summary["latency_p50_us"] = float(np.percentile(latency, 50) * 1e6)
    summary["latency_p99_us"] = float(np.percentile(latency, 99) * 1e6)
    summary["ticks"] = len(latency)
    return results, summary, falls.skipped


def mean_row(rows: list[dict]) -> dict:
    """The mean over episodes; ``fell`` becomes the number of falls."""
    keys = ("vel_error_xy", "yaw_rate_error", "survived_s", "tracking_return")
    return {**{k: float(np.mean([r[k] for r in rows])) for k in keys}, "fell": int(sum(r["fell"] for r in rows))}


def print_table(newton: list[dict], mujoco: list[dict]) -> None:
    def cells(r: dict) -> str:
        fell = ("fell" if r["fell"] else "-") if isinstance(r["fell"], bool) else r["fell"]  # a row / a count
        return (f"{r['vel_error_xy']:6.3f} {r['yaw_rate_error']:6.3f} {fell:>5} {r['survived_s']:5.1f} "
                f"{r['tracking_return']:7.2f}")

    head = f"{'err_xy':>6s} {'err_wz':>6s} {'falls':>5s} {'alive':>5s} {'return':>7s}"
    print(f"{'command (vx, vy, wz)':22s} | {'Newton (training engine)':^34s} | {'MuJoCo C (edge runtime)':^34s}")
    print(f"{'':22s} | {head} | {head}")
    for a, b in zip(newton, mujoco):
        command = "(" + ", ".join(f"{c:+.1f}" for c in a["command"]) + ")"
        print(f"{command:22s} | {cells(a)} | {cells(b)}")
    print(f"{'mean (falls: total)':22s} | {cells(mean_row(newton))} | {cells(mean_row(mujoco))}")


def main(args: list[str]) -> None:
    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    from omegaconf import OmegaConf

    from legion.cli import RunError, load_run, parse_run_args
    from legion.sim2real.export import ExportError, export_run

    run, options, overrides = parse_run_args(args, "sim2sim", HELP, {
        "checkpoint": None, "onnx": None, "duration_s": "10", "commands": json.dumps(DEFAULT_COMMANDS),
        "realtime": "false", "json": None, "physics": "mjcf"})
    from legion.agents.runner import CheckpointError
    from legion.sim2real.deploy import OnnxPolicy, PolicyLoadError

    if options["physics"] not in ("mjcf", "matched"):
        sys.exit(f"legion sim2sim: physics={options['physics']}: choose physics=mjcf or physics=matched.")
    try:
        commands = np.asarray(json.loads(options["commands"]), dtype=np.float32).reshape(-1, 3)
        duration_s = float(options["duration_s"])
    except ValueError as e:
        sys.exit(f"legion sim2sim: commands must be a JSON list of [v_x, v_y, yaw_rate] triples and duration_s a "
                 f"number ({e})\n\n{HELP}")
    task_cfg = OmegaConf.load(run / "config.yaml").task
    if not task_cfg.get("commands") or "default_root_height" not in task_cfg:
        sys.exit(f"legion sim2sim: task {task_cfg.name} has no velocity commands or floating base; "
                 "sim2sim compares velocity-tracking (locomotion) policies.")
    # Every env starts like the MuJoCo robot (default pose, level, at rest) with the model's own
    # physical parameters: every event term (reset perturbations, randomization, pushes) is off.
    still = [f"sim.num_envs={len(commands)}"] + [
        f"{'' if 'enabled' in (spec or {}) else '+'}task.events.{name}.enabled=false"
        for name, spec in (task_cfg.get("events") or {}).items()]
    try:
        loaded = load_run(run, options["checkpoint"], still + overrides)
        if options["onnx"]:
            onnx_path = Path(options["onnx"])
        else:
            out_dir, _ = export_run(run, steps=20, loaded=loaded)
            onnx_path = out_dir / "policy.onnx"
        policy = OnnxPolicy(onnx_path)
    except (ExportError, RunError, CheckpointError, PolicyLoadError) as e:
        sys.exit(f"legion sim2sim: {e}")
    cfg, env, _, _ = loaded
    task = OmegaConf.to_container(cfg.task, resolve=True)
    env.noise_enabled = False
    steps = int(round(min(duration_s, task["episode_length_s"]) / env.step_dt))
    terms = tracking_terms(task)
    print(f"[legion] sim2sim {onnx_path}: {len(commands)} commands x {steps * env.step_dt:g} s "
          f"({steps} control steps of {env.step_dt:g} s), MuJoCo physics={options['physics']}", flush=True)

    newton = run_newton(env, policy, commands, steps, terms)
    from legion.tasks.sim import resolve_asset

    mujoco_options = physics_options(options["physics"], OmegaConf.to_container(cfg.sim, resolve=True))
    mujoco_rows, loop, skipped = run_mujoco(resolve_asset(task["robot"]), onnx_path, commands, steps, task, terms,
                                            options["realtime"].lower() == "true", mujoco_options)
    print_table(newton, mujoco_rows)
    print(f"MuJoCo control loop: {loop['ticks']} ticks, latency p50 {loop['latency_p50_us']:.0f} us, "
          f"p99 {loop['latency_p99_us']:.0f} us, deadline misses {loop['misses']}, ticks clamped to joint limits "
          f"{loop['limit_clamped']} / in rate {loop['rate_clamped']}, watchdog holds {loop['hold']}, stops {loop['stop']}")
    if skipped:
        print(f"(terminations not evaluated in MuJoCo: {skipped})")
    if options["json"]:
        table = {"newton": newton, "mujoco": mujoco_rows, "mean": {"newton": mean_row(newton),
                                                                   "mujoco": mean_row(mujoco_rows)}, "loop": loop}
        Path(options["json"]).write_text(json.dumps(table, indent=2))
