"""The library legion-rl's commands, tests, benchmarks and :mod:`legion.sim2real` stand on: from a
typed config (:mod:`legion.configs`) or a run folder to an env, a learner and a trained policy.

This is where a task (:mod:`legion.tasks`) is wired to a learner (:mod:`legion.agents`); neither
knows the other. It imports nothing that runs commands (:mod:`legion.commands`, :mod:`legion.cli`)
and nothing from :mod:`legion.sim2real`. Nothing here reads ``sys.argv`` or exits the process:
errors are :class:`~legion.configs.ConfigError` / :class:`RunError` with a message that names the
problem and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from legion import set_process_env
from legion.configs import FIX, ConfigError, load_run_config, scene_problems, schema

if TYPE_CHECKING:
    from legion.agents.distributed import Group
    from legion.agents.runner import Runner
    from legion.tasks.env import LegionEnv


class RunError(ValueError):
    """A run folder, or a checkpoint in it, is unusable."""


# --- process ---------------------------------------------------------------------------------------
def setup_process() -> None:
    """Process-wide settings every command shares: quiet Warp, torch threads,
    offscreen OpenGL for MuJoCo's renderer (chosen when mujoco is first imported), MKL's
    thread-independent matrix products (:data:`legion.PROCESS_ENV`)."""
    set_process_env()
    import torch
    import warp as wp

    if os.environ.get("OMP_NUM_THREADS") is None:
        # One Warp CPU thread simulates; leave torch the rest (measured on 2 cores: oversubscribing
        # them made torch 10-50x slower).
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    wp.config.log_level = wp.LOG_WARNING  # no per-module load lines
    # (Warp reads WARP_CACHE_PATH itself and keeps its kernels in a folder per version there; setting
    # kernel_cache_dir to that path after wp.init, as a second call here did, put them beside it)
    wp.init()


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def validate(cfg: schema.Train) -> None:
    """Checks the values a run needs before anything is built; one line per problem."""
    import torch

    from legion.tasks.sim.scene import resolve_asset
    from legion.tasks.sim.solver import SOLVERS

    problems = scene_problems(cfg.task.scene)
    try:
        resolve_asset(cfg.task.scene.robot.file)
    except FileNotFoundError as e:  # its message says where it looked and what a robot file can be
        problems.append(f"task.scene.robot.file={cfg.task.scene.robot.file}: {e}")
    sim, agent = cfg.sim, cfg.agent
    positive = {"sim.num_envs": sim.num_envs, "sim.decimation": sim.decimation, "sim.dt": sim.dt,
                "agent.num_steps_per_env": agent.num_steps_per_env, "agent.save_interval": agent.save_interval,
                "agent.log_interval": agent.log_interval, "agent.max_nonfinite_updates": agent.max_nonfinite_updates,
                "task.episode_length_s": cfg.task.episode_length_s,
                "agent.algorithm.learning_rate": agent.algorithm.learning_rate,
                "agent.algorithm.num_learning_epochs": agent.algorithm.num_learning_epochs,
                "agent.algorithm.num_mini_batches": agent.algorithm.num_mini_batches}
    problems += [f"{key}={value}: must be > 0" for key, value in positive.items() if not value > 0]
    if agent.max_iterations is not None and agent.max_iterations < 1:
        problems.append(f"agent.max_iterations={agent.max_iterations}: must be >= 1 (null: until stopped)")
    for key, limit in (("agent.keep_last", agent.keep_last), ("agent.keep_every", agent.keep_every),
                       ("agent.save_every_minutes", agent.save_every_minutes)):
        if limit is not None and limit <= 0:
            problems.append(f"{key}={limit}: must be > 0 or null")
    record = cfg.task.record
    if record.every is not None:
        problems += [f"task.record.{key}={getattr(record, key)}: must be > 0"
                     for key in ("every", "episodes", "num_envs") if not getattr(record, key) > 0]
    video = agent.video
    if video.every is not None:
        problems += [f"agent.video.{key}={getattr(video, key)}: must be > 0"
                     for key in ("every", "max_seconds", "fps", "height", "width") if not getattr(video, key) > 0]
    if agent.logger not in ("tensorboard", "wandb"):
        problems.append(f"agent.logger={agent.logger}: choose tensorboard or wandb")
    elif agent.logger == "wandb":
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            problems.append("agent.logger=wandb: the wandb package is not installed: pip install -e '.[wandb]' "
                            "(WANDB_MODE=offline runs without an account or network)")
    if agent.max_policy_lag < 0:
        problems.append(f"agent.max_policy_lag={agent.max_policy_lag}: must be >= 0")
    if agent.mode not in ("sync", "async", "bc", "dagger"):
        problems.append(f"agent.mode={agent.mode}: choose sync, async, bc or dagger")
    problems += _off_policy_problems(agent)
    if agent.mode == "bc" and not agent.imitation.demos:
        problems.append("agent.mode=bc: name the demonstrations, agent.imitation.demos=[demos.h5]")
    if agent.mode == "dagger" and not agent.imitation.expert:
        problems.append("agent.mode=dagger: name the expert, a scripted policy "
                        "(agent.imitation.expert=scripted:legion.tasks.manipulation.expert:lift) or a trained run "
                        "to distil (agent.imitation.expert=run:runs/<task>/<run>)")
    if agent.init_from is not None and not Path(agent.init_from).is_file():
        problems.append(f"agent.init_from={agent.init_from}: no such checkpoint file")
    if sim.solver not in SOLVERS:
        problems.append(f"sim.solver={sim.solver}: choose one of {sorted(SOLVERS)} (configs/sim/)")
    device = cfg.device
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        problems.append(f"device={device}: use cpu, cuda or cuda:N")
    elif device.startswith("cuda"):
        if not torch.cuda.is_available():
            problems.append(f"device={device}: CUDA is not available here: use device=cpu")
        elif ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
            problems.append(f"device={device}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                            f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    if problems:
        raise ConfigError("\n".join(problems))


def _off_policy_problems(agent: schema.Agent) -> list[str]:
    """What an off-policy learner (``agent.learner=sac | td3``) cannot run with, one line each."""
    if agent.learner == "ppo":
        return []
    if agent.learner not in ("sac", "td3"):
        return [f"agent.learner={agent.learner}: choose ppo, sac or td3"]
    off, learner = agent.off_policy, agent.learner
    problems = []
    if agent.mode not in ("sync", "async"):
        problems.append(f"agent.mode={agent.mode}: agent.learner={learner} trains with agent.mode=sync (acting and "
                        "learning in turn) or async (an actor and a learner thread)")
    if off.max_lag_steps < 0:
        problems.append(f"agent.off_policy.max_lag_steps={off.max_lag_steps}: must be >= 0")
    if agent.critic.rnn.type or agent.actor.estimator.target:
        problems.append(f"agent.learner={learner} takes feed-forward critics and no estimator: drop agent.critic.rnn / "
                        "agent.actor.estimator (give the critics what the actor cannot see in a `critic` observation "
                        "group; the actor may be recurrent: agent.actor.rnn)")
    if agent.actor.rnn.type:
        window = off.burn_in + off.sequence_length + off.n_step - 1
        if off.prioritized:
            problems.append("agent.off_policy.prioritized: a recurrent actor (agent.actor.rnn) replays sequences, "
                            "sampled uniformly; drop one of the two")
        if off.sequence_length < 1 or off.burn_in < 0:
            problems.append(f"agent.off_policy.sequence_length={off.sequence_length}, burn_in={off.burn_in}: a "
                            "recurrent actor needs sequence_length >= 1 and burn_in >= 0")
        elif off.buffer_size < window:
            problems.append(f"agent.off_policy.buffer_size={off.buffer_size}: a recurrent actor replays windows of "
                            f"burn_in + sequence_length + n_step - 1 = {window} steps; keep at least that many")
    if agent.symmetry.mirror_loss:
        problems.append(f"agent.symmetry.mirror_loss is PPO's (rsl-rl's extension); agent.learner={learner} takes "
                        "agent.symmetry.augmentation=true (mirrored replay batches)")
    if agent.symmetry.augmentation and agent.actor.rnn.type:
        problems.append("agent.symmetry.augmentation mirrors single transitions: it takes a feed-forward actor; drop "
                        "agent.actor.rnn or agent.symmetry.augmentation")
    if agent.init_from is not None:
        problems.append(f"agent.init_from starts PPO from a checkpoint; agent.learner={learner} starts from scratch")
    positive = {"buffer_size": off.buffer_size, "batch_size": off.batch_size, "update_to_data": off.update_to_data,
                "n_step": off.n_step, "policy_delay": off.policy_delay, "action_bound": off.action_bound,
                "actor_learning_rate": off.actor_learning_rate, "critic_learning_rate": off.critic_learning_rate,
                "init_alpha": off.init_alpha, "max_buffer_gb": off.max_buffer_gb}
    problems += [f"agent.off_policy.{key}={value}: must be > 0" for key, value in positive.items() if not value > 0]
    for key, value in (("gamma", off.gamma), ("tau", off.tau)):
        if not 0 < value <= 1:
            problems.append(f"agent.off_policy.{key}={value}: must be in (0, 1]")
    if not 0 <= off.policy_average <= 1:
        problems.append(f"agent.off_policy.policy_average={off.policy_average}: must be in [0, 1] (0: the actor "
                        "itself is the policy)")
    if len(off.exploration_noise) != 2 or not 0 <= off.exploration_noise[0] <= off.exploration_noise[1]:
        problems.append(f"agent.off_policy.exploration_noise={list(off.exploration_noise)}: give [low, high] with "
                        "0 <= low <= high")
    if off.distributional and not (off.num_atoms >= 2 and off.v_min < off.v_max):
        problems.append(f"agent.off_policy: a distributional critic needs num_atoms >= 2 and v_min < v_max (got "
                        f"{off.num_atoms}, [{off.v_min:g}, {off.v_max:g}])")
    return problems


# --- envs, runners, runs -----------------------------------------------------------------------------
def make_env(cfg: schema.Train) -> LegionEnv:
    """The task's env from a composed config."""
    from legion.tasks.env import LegionEnv

    sim = cfg.sim
    if sim.threads == 0 and cfg.agent.mode == "async":  # the learner computes beside the physics
        sim = dataclasses.replace(sim, threads=max(1, len(os.sched_getaffinity(0)) - 1))
    return LegionEnv(cfg.task, sim, device=cfg.device, seed=cfg.seed)


def make_runner(env: LegionEnv, agent: schema.Agent, log_dir: str | Path | None = None, device: str = "cpu",
                group: Group | None = None, **imitation) -> Runner:
    """The runner for ``agent.mode``: ``sync`` (collect, then update), ``async`` (overlapped), ``bc``
    or ``dagger`` (given ``imitation``: :func:`legion.sim2real.trajectories.demos.imitation_inputs`);
    ``group``: this rank's :class:`~legion.agents.distributed.Group` in a multi-process run. With
    ``agent.learner=sac | td3``, the off-policy runner (:mod:`legion.agents.off_policy`)."""
    if agent.learner != "ppo":
        from legion.agents.off_policy import OffPolicyRunner

        return OffPolicyRunner(env, agent, log_dir, device, group)
    if agent.mode == "sync":
        from legion.agents.runner import Runner

        return Runner(env, agent, log_dir, device, group)
    if agent.mode == "async":
        from legion.agents.async_runner import AsyncRunner

        return AsyncRunner(env, agent, log_dir, device, group)
    if agent.mode in ("bc", "dagger"):
        from legion.agents.imitation import ImitationRunner

        return ImitationRunner(env, agent, log_dir, device, group, **imitation)
    raise ConfigError(f"agent.mode must be sync, async, bc or dagger, got '{agent.mode}'")


@dataclass
class LoadedRun:
    """A trained policy, ready to act: its run folder and config (overrides applied), an env
    (observation noise off), the runner holding the policy, and the checkpoint it came from."""

    run: Path
    cfg: schema.Train
    env: LegionEnv
    runner: Runner
    checkpoint: Path


def with_policy(run: str | Path, cfg: schema.Train, env: LegionEnv, checkpoint: Path,
                contents: dict | None = None) -> LoadedRun:
    """``env`` (observation noise turned off) with the policy of ``checkpoint`` (``contents``: the
    checkpoint already read) in a runner that logs and saves nothing."""
    from legion.agents.checkpoints import CheckpointError

    env.noise_enabled = False
    agent = dataclasses.replace(cfg.agent, mode="sync")  # the policy acts here; nothing trains
    runner = make_runner(env, agent, log_dir=None, device=cfg.device)
    try:
        runner.load(checkpoint, contents, episodes=False)  # its user starts the episodes it runs
    except CheckpointError as e:
        raise RunError(str(e)) from None
    return LoadedRun(Path(run), cfg, env, runner, Path(checkpoint))


def checkpoint_in(run: str | Path, checkpoint: str | Path) -> Path:
    """``checkpoint=``: the file as given where it exists, else that name in the run folder
    (``checkpoint=model_6.pt``, whatever the working directory)."""
    path = Path(checkpoint)
    if not path.is_file() and (Path(run) / path).is_file():
        path = Path(run) / path
    if not path.is_file():
        found = sorted(p.name for p in Path(run).glob("model_*.pt"))
        raise RunError(f"checkpoint={checkpoint}: no such file, here or in {run}. Checkpoints of this run: "
                       f"{found or 'none'}")
    return path


def load_run(run: str | Path, checkpoint: str | Path | None = None, overrides=(), num_envs: int = 16) -> LoadedRun:
    """A run's env and its trained policy from a checkpoint (default: its newest good one).

    ``overrides`` are Hydra overrides of the run's config; ``sim.num_envs`` defaults to
    ``min(num_envs, the run's)``. The checkpoint may come from any device; a run trained on a GPU
    runs on the CPU where there is no CUDA (``device=...`` overrides that).
    """
    from legion.agents.checkpoints import CheckpointError, latest_good_checkpoint, load_checkpoint

    run = Path(run)
    cfg = load_run_config(run, overrides)
    if not any(o.lstrip("+").startswith("sim.num_envs=") for o in overrides):
        cfg.sim.num_envs = min(num_envs, cfg.sim.num_envs)
    if cfg.device.startswith("cuda") and not any(o.lstrip("+").startswith("device=") for o in overrides):
        import torch

        if not torch.cuda.is_available():
            print(f"[legion] note: {run} trained on {cfg.device}; this machine has no CUDA, so it runs on the CPU",
                  flush=True)
            cfg.device = "cpu"
    if not cfg.device.startswith("cuda"):
        cfg.sim.capture_step = False  # a speed setting of a GPU run: the same steps, eager, elsewhere
    validate(cfg)
    try:
        if checkpoint:
            path = checkpoint_in(run, checkpoint)
            contents = load_checkpoint(path)
        else:
            path, contents = latest_good_checkpoint(run)
    except CheckpointError as e:
        raise RunError(str(e)) from None
    setup_process()
    seed_everything(cfg.seed)
    try:
        env = make_env(cfg)
    except ValueError as e:
        raise RunError(f"the run's config.yaml does not build an env with this code: {e}{FIX}") from e
    return with_policy(run, cfg, env, path, contents)
