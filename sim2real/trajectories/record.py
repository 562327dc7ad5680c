"""Making trajectory files: a policy's episodes in the simulator, and robot logs converted.

:func:`record` steps an env with a policy and yields every finished episode (an
:class:`~legion.sim2real.trajectories.file.Episode`); :func:`record_run` is ``legion record`` (and
``legion play record=``): a trained run's policy into a file. :func:`convert_robot_log` turns the
edge runtime's ``.npz`` logs (:mod:`legion.sim2real.deploy.log`) into the same format.

What the env computes inside ``env.step`` but does not return is read through its public hooks:
the state right after physics, before finished worlds are reset and interval events such as
pushes write it, and the joint command the action term applied (``env.after_physics``), and each
reward term's value (``env.reward_values``).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from legion.configs.schema import Train
from legion.sim2real.trajectories.file import (
    Episode,
    TrajectoryFileError,
    TrajectoryWriter,
    refuse_existing,
    sha256_file,
)

if TYPE_CHECKING:
    from legion.api import LoadedRun
    from legion.tasks.env import LegionEnv

# The view the action term writes its joint command into, per action type.
TARGET_VIEWS = {"joint_position": "joint_pos_target", "joint_position_delta": "joint_pos_target",
                "task_space": "joint_pos_target", "joint_effort": "joint_effort"}


def state_views(env) -> dict[str, torch.Tensor]:
    """The state of every world as named views, ``"<entity>/<view>"`` -> (num_envs, ...):
    ``root_pose_w`` / ``root_vel_w`` of each free root, ``joint_pos`` / ``joint_vel`` of the robot.
    Together they are the simulation's generalized coordinates and velocities (checked)."""
    views = {}
    for name, entity in env.scene.items():
        if getattr(entity, "floating_base", False):
            views[f"{name}/root_pose_w"], views[f"{name}/root_vel_w"] = entity.root_pose_w, entity.root_vel_w
        if hasattr(entity, "joint_pos"):
            views[f"{name}/joint_pos"], views[f"{name}/joint_vel"] = entity.joint_pos, entity.joint_vel
    covered = sum(v.shape[1] for v in views.values())
    total = env.sim.joint_q.shape[1] + env.sim.joint_qd.shape[1]
    if covered != total:
        raise ValueError(f"the scene's state views cover {covered} of the {total} generalized coordinates and "
                         "velocities: trajectories/record.py state_views does not know an entity kind of this scene.")
    return views


def param_views(env) -> dict[str, torch.Tensor]:
    """Per-env physical parameters as named views, ``"<entity>/<name>"`` -> (num_envs, ...), plus
    ``"gravity"`` (num_envs, 3), ``"action_delay"`` (num_envs,) [control steps] and, where the
    event ``command_latency`` runs, ``"command_latency"`` (num_envs,) [physics steps]. Ask again
    after a reset: the action term replaces its delay tensor when the ``action_delay`` event draws."""
    views = {f"{name}/{param}": getattr(entity, param) for name, entity in env.scene.items() for param in entity.params}
    views |= {"gravity": env.sim.gravity, "action_delay": env.action.delay}
    return views if env.sim.command_latency is None else views | {"command_latency": env.sim.command_latency}


class Layout:
    """Named per-env tensors (num_envs, *shape) packed into one (num_envs, D) float32 row, and
    recorded rows (T, D) unpacked into named arrays (T, *shape) of the original dtypes."""

    def __init__(self, sample: dict[str, torch.Tensor]):
        self.shapes = {name: tuple(value.shape[1:]) for name, value in sample.items()}
        self.dtypes = {name: torch.empty(0, dtype=value.dtype).numpy().dtype for name, value in sample.items()}
        self.slices, start = {}, 0
        for name, shape in self.shapes.items():
            size = int(np.prod(shape, dtype=np.int64))
            self.slices[name], start = slice(start, start + size), start + size
        self.size = start

    def pack(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        n = next(iter(values.values())).shape[0]
        return torch.cat([values[name].reshape(n, -1).float() for name in self.shapes], dim=1)

    def unpack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        lead = rows.shape[:-1]
        return {name: rows[..., s].reshape(lead + self.shapes[name]).astype(self.dtypes[name])
                for name, s in self.slices.items()}


class _AfterPhysics:
    """Registered in ``env.after_physics`` while recording: after each physics step, ``post_state``
    (num_envs, D) holds the packed state, ``post_params`` the packed physical parameters (before a
    reset draws new ones) and ``targets`` the applied joint command."""

    def __init__(self, env, states: Layout, views: dict[str, torch.Tensor], settings: Layout):
        self.env, self.states, self.views, self.settings = env, states, views, settings
        self.target_view = getattr(env.robot, TARGET_VIEWS[env.cfg.action.type])
        self.joint_ids = env.action.joint_ids
        env.after_physics.append(self)

    def __call__(self, env) -> None:
        self.post_state = self.states.pack(self.views)
        self.post_params = self.settings.pack(param_views(env))
        self.targets = self.target_view[:, self.joint_ids].clone()

    def close(self) -> None:
        self.env.after_physics.remove(self)


def _observations(env, obs) -> dict[str, torch.Tensor]:
    """``"<group>/<term>"`` -> (num_envs, size): each observation term, as the policy's input holds it."""
    return {f"{group}/{term['name']}": obs[group][:, term["start"]:term["start"] + term["size"]]
            for group, terms in env.observation_layout().items() for term in terms}


def record(env, policy, episodes: int) -> Iterator[Episode]:
    """Runs ``policy`` on ``env`` from a fresh reset and yields ``episodes`` whole episodes as they finish.

    The episodes recorded are the first ``episodes`` to START (ties by env index), so short
    (failed) episodes are not favoured over long ones. Every step stays on the env's device in a
    buffer of (max_episode_length, num_envs, D) floats; an episode goes to the host when it ends.
    Memory does not grow with the number of episodes.

    Args:
        env: a :class:`~legion.tasks.env.LegionEnv`.
        policy: observations (TensorDict) -> actions (num_envs, num_actions); with a ``reset(dones)``
            method it is called when episodes end (recurrent policies).
        episodes: how many episodes to yield.
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes}: record at least one episode.")
    n, device = env.num_envs, env.device
    views = state_views(env)
    states, settings = Layout(views), Layout(param_views(env))
    taps = _AfterPhysics(env, states, views, settings)
    try:
        with torch.inference_mode():
            obs = env.reset()
            sample = {"actions": torch.zeros(n, env.num_actions, device=device),
                      "targets": taps.target_view[:, taps.joint_ids],
                      **({"commands": env.command.value} if env.command is not None else {}),
                      "rewards": torch.zeros(n, device=device),
                      **{f"reward_terms/{t.name}": torch.zeros(n, device=device) for t in env.reward_terms},
                      **{f"obs/{k}": v for k, v in _observations(env, obs).items()}}
            steps = Layout(sample)
            buffer = torch.zeros(env.max_episode_length, n, steps.size + 2 * states.size, device=device)
            start_params = settings.pack(param_views(env))
            step = torch.zeros(n, dtype=torch.long, device=device)
            index = torch.arange(n, device=device)
            returns = torch.zeros(n, device=device)
        chosen = index < episodes
        started, done_count = min(n, episodes), 0
        while done_count < episodes:
            with torch.inference_mode():
                before = states.pack(views)
                commands = env.command.value.clone() if env.command is not None else None
                observed = _observations(env, obs)
                actions = policy(obs)
                obs, rewards, dones, extras = env.step(actions)
                row = steps.pack({"actions": actions, "targets": taps.targets,
                                  **({"commands": commands} if commands is not None else {}), "rewards": rewards,
                                  **{f"reward_terms/{name}": value for name, value in env.reward_values.items()},
                                  **{f"obs/{k}": v for k, v in observed.items()}})
                buffer[step, index] = torch.cat([row, before, taps.post_state], dim=1)
                step += 1
                returns += rewards
                # An interval event may have changed parameters mid-episode: replay cannot know when.
                params_changed = (taps.post_params != start_params).any(1)
                ready = [_episode(buffer[:int(step[i]), i].cpu().numpy(), steps, states,
                                  settings.unpack(start_params[i].cpu().numpy()),
                                  {"env_index": i, "time_out": bool(extras["time_outs"][i]),
                                   "return": float(returns[i]), "params_changed": bool(params_changed[i]),
                                   **({"success": bool(env.success.last_succeeded[i])} if env.success else {})})
                         for i in (dones & chosen).nonzero().squeeze(-1).tolist()]
                if hasattr(policy, "reset"):
                    policy.reset(dones)
                # The envs that finished start their next episode now: chosen while places are left.
                rank = torch.cumsum(dones.long(), 0) - 1
                chosen = torch.where(dones, rank < episodes - started, chosen)
                started = min(episodes, started + int(dones.sum()))
                start_params = torch.where(dones[:, None], settings.pack(param_views(env)), start_params)
                step[dones] = 0
                returns[dones] = 0.0
            done_count += len(ready)
            yield from ready
    finally:
        taps.close()


def _episode(rows: np.ndarray, steps: Layout, states: Layout, params: dict, attrs: dict) -> Episode:
    """An episode from its recorded rows (T, steps + 2 states): step data, then the state before
    each step, then the state right after its physics."""
    length = len(rows)
    data = steps.unpack(rows[:, :steps.size])
    before = states.unpack(rows[:, steps.size:steps.size + states.size])
    after = states.unpack(rows[:, steps.size + states.size:])
    dones = np.zeros(length, np.uint8)
    dones[-1] = 1
    return Episode({**data, "dones": dones,
                    **{f"states/{k}": v for k, v in before.items()},
                    **{f"next_states/{k}": v for k, v in after.items()},
                    **{f"initial_state/{k}": v[0] for k, v in before.items()},
                    **{f"params/{k}": v for k, v in params.items()}}, attrs)


# --- the file's attributes ---------------------------------------------------------------------
def versions() -> dict[str, str]:
    """The versions that decide the physics' bits (an exact replay needs the same ones)."""
    from importlib.metadata import PackageNotFoundError, version

    import legion

    found = {"legion-rl": legion.__version__}
    for package in ("newton", "warp-lang", "mujoco-warp", "mujoco", "torch", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "none"
    return found


def file_attrs(settings: Train, env, source: str = "sim", checkpoint: Path | None = None) -> dict:
    """The ``/data`` attributes: the resolved config (YAML), what replay needs to rebuild the env
    and check it is the same (robot model hash, versions), and the names that explain the arrays."""
    from legion.tasks.sim import resolve_asset

    robot_file = resolve_asset(settings.task.scene.robot.file)
    robot = env.robot
    return {
        "source": source, "config": _config_yaml(settings),
        "env_args": {"env_name": settings.task.name, "type": "legion",
                     "env_kwargs": {"task": settings.task.name, "seed": settings.seed, "device": settings.device,
                                    "num_envs": env.num_envs}},
        "task": settings.task.name, "seed": settings.seed, "device": settings.device,
        "control_dt": env.step_dt, "physics_dt": env.sim.physics_dt, "decimation": env.sim.decimation,
        "robot_file": str(robot_file), "robot_sha256": sha256_file(robot_file),
        "joint_names": list(robot.joint_names),
        "action": {"type": settings.task.action.type, "joints": [robot.joint_names[i] for i in env.action.joint_ids],
                   "scale": settings.task.action.scale, "clip": settings.task.action.clip},
        "observation_layout": {g: [{k: t[k] for k in ("name", "func", "start", "size")} for t in terms]
                               for g, terms in env.observation_layout().items()},
        "checkpoint": str(checkpoint) if checkpoint else None,
        "checkpoint_sha256": sha256_file(checkpoint) if checkpoint else None,
        "versions": versions(), "legion_version": versions()["legion-rl"], "created": time.time(),
    }


def record_run(run: Path, episodes: int, out: Path | None = None, video_dir: Path | None = None, checkpoint=None,
               overrides=(), overwrite: bool = False, loaded: LoadedRun | None = None, on_episode=None,
               size: tuple[int, int] = (480, 640)) -> LoadedRun:
    """``legion record`` and ``legion play record= video=``: the run's policy, deterministic and with
    observation noise off, on ``sim.num_envs`` envs (default min(episodes, 16)). Each episode goes
    into the trajectory file ``out`` and/or is rendered to ``video_dir/demo_<k>.mp4`` as it ends;
    ``on_episode(k, episode)`` is called after (printing). Existing outputs are refused unless
    ``overwrite``. Returns the loaded run (:class:`legion.api.LoadedRun`).
    """
    from legion.api import load_run

    if out is not None:
        refuse_existing(Path(out), overwrite, file=True)
    if video_dir is not None and Path(video_dir).exists() and any(Path(video_dir).iterdir()) and not overwrite:
        refuse_existing(Path(video_dir), overwrite, "video folder")
    loaded = loaded or load_run(run, checkpoint, overrides, num_envs=min(episodes, 16))
    policy = loaded.runner.policy
    policy.eval()
    attrs = file_attrs(loaded.cfg, loaded.env, checkpoint=loaded.checkpoint) if out is not None else {}
    write_episodes(loaded.cfg, loaded.env, policy, episodes, out, attrs, video_dir, overwrite, on_episode, size)
    return loaded


def write_episodes(cfg: Train, env, policy, episodes: int, out: Path | None, attrs: dict, video_dir: Path | None,
                   overwrite: bool = False, on_episode=None, size: tuple[int, int] = (480, 640)) -> None:
    """:func:`record`'s episodes into the trajectory file ``out`` (with ``attrs``) and/or rendered to
    ``video_dir/demo_<k>.mp4``, each as it ends; ``on_episode(k, episode)`` after each."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        writer = renderer = videos = None
        if out is not None:
            writer = stack.enter_context(TrajectoryWriter(out, attrs, overwrite=overwrite))
        if video_dir is not None:
            from legion.sim2real.trajectories import media

            renderer = media.SceneRenderer(cfg, *size)
            stack.callback(renderer.close)
            videos = Path(video_dir)
            videos.mkdir(parents=True, exist_ok=True)
        for k, episode in enumerate(record(env, policy, episodes)):
            if writer is not None:
                writer.add(episode)
            if renderer is not None and videos is not None:
                media.write_video(renderer, media.episode_frames(episode), videos / f"demo_{k}.mp4",
                                  1.0 / env.step_dt, env.robot.joint_names)
            if on_episode is not None:
                on_episode(k, episode)


def scripted_policy(spec: str, env):
    """The policy ``scripted:<module>:<function>`` names: ``function(env)`` returns a callable
    observations -> actions (e.g. ``scripted:legion.tasks.manipulation.expert:lift``)."""
    import importlib

    kind, _, target = spec.partition(":")
    module, _, name = target.partition(":")
    if kind != "scripted" or not module or not name:
        raise ValueError(f"policy={spec}: expected scripted:<module>:<function>, e.g. "
                         "policy=scripted:legion.tasks.manipulation.expert:lift")
    try:
        make = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"policy={spec}: cannot load {module}:{name} ({e}).") from None
    return make(env)


def record_scripted(spec: str, episodes: int, out: Path | None, video_dir: Path | None = None, overrides=(),
                    overwrite: bool = False, on_episode=None) -> Train:
    """``legion record policy=scripted:...``: a scripted policy's episodes on the task the overrides
    compose (``sim.num_envs`` default min(episodes, 16); observation noise off, as for a trained
    run's). Returns the config."""
    from legion.api import make_env, seed_everything, validate
    from legion.configs import compose

    if out is not None:
        refuse_existing(Path(out), overwrite, file=True)
    if not any(o.startswith("sim.num_envs=") for o in overrides):
        overrides = (*overrides, f"sim.num_envs={min(episodes, 16)}")
    cfg = compose(*overrides)
    validate(cfg)
    seed_everything(cfg.seed)
    env = make_env(cfg)
    env.noise_enabled = False
    policy = scripted_policy(spec, env)
    attrs = {**file_attrs(cfg, env), "policy": spec} if out is not None else {}
    write_episodes(cfg, env, policy, episodes, out, attrs, video_dir, overwrite, on_episode)
    return cfg


class TrainingRecorder:
    """``task.record``: every ``every`` iterations, a checkpoint of the current policy and its
    episodes in ``<run>/trajectories/iter_<k>.h5`` (and MP4s with ``video``). The episodes run in a
    second env, built by the training code's ``make_env(cfg)`` at the first recording and kept
    (``cfg``: the training's config with ``task.record.num_envs`` worlds); the training's random
    generators are left as they were, so recording does not change what a run learns.
    A :class:`~legion.agents.runner.Runner` calls it after each iteration (``on_iteration``)."""

    def __init__(self, run_dir: Path, cfg: Train, make_env: Callable[[Train], LegionEnv]):
        self.run_dir, self.cfg, self.make_env = Path(run_dir), cfg, make_env
        self.loaded: LoadedRun | None = None

    def __call__(self, runner, iteration: int) -> None:
        from legion.api import seed_everything, with_policy

        schedule = self.cfg.task.record
        if schedule.every is None or iteration % schedule.every:
            return
        out = self.run_dir / "trajectories" / f"iter_{iteration}.h5"
        if out.exists():  # a run resumed from an earlier checkpoint records this iteration again
            out = out.with_name(f"iter_{iteration}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.h5")
        with _generators_kept(self.cfg.device):
            checkpoint = runner.save()
            if self.loaded is None:
                seed_everything(self.cfg.seed)  # the recording env draws from its own seeded start
                self.loaded = with_policy(self.run_dir, self.cfg, self.make_env(self.cfg), checkpoint)
            else:
                self.loaded.runner.load(checkpoint, episodes=False)
                self.loaded.checkpoint = checkpoint
            record_run(self.run_dir, schedule.episodes, out, out.with_name(out.stem + "_videos") if schedule.video
                       else None, loaded=self.loaded)
        print(f"[legion] recorded {schedule.episodes} episodes of iteration {iteration} ({checkpoint.name}) into {out}",
              flush=True)


class TrainingVideo:
    """``agent.video``: every ``every`` iterations, one episode of the current policy (deterministic,
    observation noise off, cut at ``max_seconds``) in a one-world env beside the training's, built
    at construction; rendered to ``<run>/videos/iter_<k>.mp4`` and handed to the run's log
    (TensorBoard, W&B). The training's random generators are left as they were. A
    :class:`~legion.agents.runner.Runner` calls it after each iteration (``on_iteration``)."""

    def __init__(self, run_dir: Path, cfg: Train, make_env: Callable[[Train], LegionEnv]):
        import dataclasses

        from legion.api import make_runner, seed_everything
        from legion.sim2real.trajectories import media

        video = cfg.agent.video
        self.run_dir, self.every, self.fps = Path(run_dir), video.every, video.fps
        self.cfg = dataclasses.replace(cfg, sim=dataclasses.replace(cfg.sim, num_envs=1, capture_step=False),
                                       task=dataclasses.replace(cfg.task, episode_length_s=min(
                                           cfg.task.episode_length_s, video.max_seconds)))
        # The renderer first: a robot it cannot draw stops the run before training starts.
        try:
            self.renderer = media.SceneRenderer(self.cfg, video.height, video.width)
        except ValueError as e:
            raise ValueError(f"agent.video: {e} Train without videos (agent.video.every=null) and watch the "
                             "policy with legion play viewer=web, which draws any robot.") from None
        with _generators_kept(cfg.device):
            seed_everything(cfg.seed)
            self.env = make_env(self.cfg)
        self.env.noise_enabled = False
        agent = dataclasses.replace(self.cfg.agent, mode="sync")  # only its policy acts here
        self.policy = make_runner(self.env, agent, log_dir=None, device=self.cfg.device).policy

    def __call__(self, runner, iteration: int) -> None:
        from legion.sim2real.trajectories import media

        if self.every is None or iteration % self.every:
            return
        policy = self.policy
        policy.load_state_dict(runner.policy.state_dict())  # the training's actor and its normalizer
        policy.eval()
        with _generators_kept(self.cfg.device):
            episode = next(record(self.env, policy, 1))
        path = self.run_dir / "videos" / f"iter_{iteration}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        # Rendering is most of a video's cost: draw every control step's state only up to fps.
        step = max(1, round(1.0 / (self.env.step_dt * self.fps)))
        fps = 1.0 / (self.env.step_dt * step)
        stride = max(1, round(fps / 10))  # the log's animation: about 10 frames per second
        shown: list[np.ndarray] = []
        media.write_video(self.renderer, itertools.islice(media.episode_frames(episode), 0, None, step), path, fps,
                          self.env.robot.joint_names,
                          on_frame=lambda k, image: shown.append(image) if k % stride == 0 else None)
        runner.log.add_video(path, iteration, shown, fps / stride)

    def close(self) -> None:
        self.renderer.close()
        self.env.close()


class _generators_kept:
    """Restores Python's, numpy's and torch's global random generators on exit."""

    def __init__(self, device: str):
        self.devices = [torch.device(device).index or 0] if device.startswith("cuda") else []

    def __enter__(self):
        import random

        self.states = random.getstate(), np.random.get_state()
        self.torch = torch.random.fork_rng(devices=self.devices)
        self.torch.__enter__()

    def __exit__(self, *exc):
        import random

        self.torch.__exit__(*exc)
        random.setstate(self.states[0])
        np.random.set_state(self.states[1])


# --- robot logs ----------------------------------------------------------------------------------
def convert_robot_log(logs: Path, run: Path, out: Path, overwrite: bool = False) -> Path:
    """``legion dataset convert <logs> format=hdf5 run=<run>``: the edge runtime's episode logs
    (a folder of ``episode_*.npz`` or one file) as a trajectory file of ``source="robot"``.

    The run must be the one the robot's policy was exported from (its config hash is checked),
    so the file carries the config a replay rebuilds the simulator from. Base velocities are
    turned from the base frame (what the robot logs) into the world frame (what the simulator's
    state holds); a robot that logs no base position gets (0, 0, the task's base height).
    """
    from legion.configs import load_run_config
    from legion.sim2real.deploy.policy import quat_rotate_inverse
    from legion.tasks.sim import resolve_asset

    logs, out = Path(logs), Path(out)
    refuse_existing(out, overwrite, file=True)
    files = sorted(logs.glob("episode_*.npz")) if logs.is_dir() else [logs]
    if not files or not all(f.is_file() for f in files):
        raise TrajectoryFileError(f"{logs}: no robot log (episode_*.npz from legion.sim2real.deploy.TrajectoryLog).")
    settings = load_run_config(run)
    config_sha256 = sha256_file(Path(run) / "config.yaml")
    robot_file = resolve_asset(settings.task.scene.robot.file)
    episodes, meta = [], None
    for path in files:
        try:
            with np.load(path) as npz:
                arrays = {key: npz[key] for key in npz.files}
            meta = json.loads(str(arrays.pop("meta")))
        except Exception as e:  # zipfile, pickle and JSON errors: the file is damaged
            raise TrajectoryFileError(f"{path} is not a readable robot log (truncated or corrupt?): {e}") from None
        if meta.get("config_sha256") != config_sha256:
            raise TrajectoryFileError(
                f"{path} was recorded with a policy exported from another run (config sha256 "
                f"{str(meta.get('config_sha256'))[:12]}...), not {run} ({config_sha256[:12]}...). "
                "Convert it with the run the robot's policy.onnx came from.")
        episodes.append(_robot_episode(arrays, meta, settings, quat_rotate_inverse, path.name))
    assert meta is not None  # there was at least one file
    attrs = {
        "source": "robot", "config": _config_yaml(settings), "task": settings.task.name, "seed": settings.seed,
        "device": settings.device, "control_dt": meta["control_dt"], "robot_file": str(robot_file),
        "robot_sha256": sha256_file(robot_file), "joint_names": meta["joint_names"],
        "policy_sha256": meta["policy_sha256"], "observation_layout": _log_layout(meta),
        "env_args": {"env_name": settings.task.name, "type": "legion", "env_kwargs": {"task": settings.task.name}},
        "versions": versions(), "legion_version": versions()["legion-rl"], "created": time.time(),
    }
    with TrajectoryWriter(out, attrs, overwrite=overwrite) as writer:
        for episode in episodes:
            writer.add(episode)
    return out


def _config_yaml(settings) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(settings))


def _log_layout(meta: dict) -> dict:
    layout: dict[str, list] = {}
    for term in meta.get("observation", {}).get("terms", []):
        layout.setdefault(term["group"], []).append({k: term[k] for k in ("name", "func", "start", "size")})
    return layout


def _robot_episode(log: dict, meta: dict, settings, quat_rotate_inverse, name: str) -> Episode:
    """One logged episode in the trajectory layout (robot joints in the policy's joint order)."""
    length = len(log["mode"])
    states = {"robot/joint_pos": log["joint_pos"], "robot/joint_vel": log["joint_vel"]}
    if "base_quat" in log:
        quat = log["base_quat"].astype(np.float32)
        pos = log["base_pos"] if "base_pos" in log else np.tile(
            [0.0, 0.0, settings.task.scene.robot.root_height or 0.0], (length, 1))
        conjugate = quat * np.array([-1.0, -1.0, -1.0, 1.0], np.float32)  # R(q) v = R(q*)^T v
        lin = quat_rotate_inverse(conjugate, log["base_lin_vel"])
        ang = quat_rotate_inverse(conjugate, log["base_ang_vel"])
        states["robot/root_pose_w"] = np.concatenate([pos, quat], axis=1).astype(np.float32)
        states["robot/root_vel_w"] = np.concatenate([lin, ang], axis=1).astype(np.float32)
    dones = np.zeros(length, np.uint8)
    dones[-1] = 1
    data = {"actions": log["actions"], "targets": log["targets"], "commands": log["command"], "dones": dones,
            **{f"states/{k}": v.astype(np.float32) for k, v in states.items()},
            **{f"initial_state/{k}": v[0].astype(np.float32) for k, v in states.items()},
            **{f"timing/{k}": log[k] for k in ("timestamp", "tick_time", "latency", "mode") if k in log}}
    for group, terms in _log_layout(meta).items():
        for term in terms:
            data[f"obs/{group}/{term['name']}"] = log["obs"][:, term["start"]:term["start"] + term["size"]]
    return Episode(data, {"log_file": name, "stop_reason": meta.get("stop_reason"), "started": meta.get("started")})
