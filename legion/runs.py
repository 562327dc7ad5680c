"""The library the ``legion`` command stands on: configs, envs, runners and run folders.

:mod:`legion.cli` parses arguments and calls these functions; tests, benchmarks and
:mod:`legion.sim2real` use them too. This is where a task (:mod:`legion.tasks`) is wired to a
learner (:mod:`legion.agents`); neither knows the other. Nothing here reads ``sys.argv`` or
exits the process: errors are :class:`ConfigError` / :class:`RunError` with a message that
names the problem and the fix.

One override grammar, Hydra's, for every command: ``key=value`` changes a key, ``+key=value``
adds one, ``++key=value`` adds or changes, ``~key`` removes one. A new run composes
``configs/train.yaml``; a run folder's ``config.yaml`` is itself a Hydra config over the same
schema (:mod:`legion.configs.schema`), so ``legion play|export|sim2sim|eval run=<folder>`` and
``legion train resume=<folder>`` take the same overrides.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import legion.configs
from legion.configs import schema

CONFIG_DIR = Path(legion.configs.__file__).resolve().parent
GROUPS = ("task", "agent", "sim")


class ConfigError(ValueError):
    """A config (its files, an override, or a run's saved config) is invalid."""


class RunError(ValueError):
    """A run folder, or a checkpoint in it, is unusable."""


# --- process ---------------------------------------------------------------------------------------
def setup_process() -> None:
    """Process-wide settings every command shares: quiet Warp with its kernel cache, torch threads,
    offscreen OpenGL for MuJoCo's renderer (chosen when mujoco is first imported)."""
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    os.environ.setdefault("MUJOCO_GL", "egl")
    import torch
    import warp as wp

    if os.environ.get("OMP_NUM_THREADS") is None:
        # One Warp CPU thread simulates; leave torch the rest (PLATFORM.md: oversubscribing 2
        # cores made torch 10-50x slower).
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))
    wp.config.quiet = True
    wp.config.log_level = wp.LOG_WARNING  # no per-module load lines
    if os.environ.get("WARP_CACHE_PATH"):
        wp.config.kernel_cache_dir = os.environ["WARP_CACHE_PATH"]
    wp.init()


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- configs ---------------------------------------------------------------------------------------
def task_names() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "task").glob("*.yaml"))


def compose(*overrides: str):
    """The config ``legion train <overrides>`` would run (an OmegaConf DictConfig), without starting a job."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    schema.register()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose("train", overrides=list(overrides))
    except Exception as e:
        raise ConfigError(explain(e)) from None
    typed(cfg)  # named entries (terms, objects) are checked here
    return cfg


def load_run_config(run: str | Path, overrides=()):
    """A run folder's saved config with ``overrides`` applied, checked against the schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    run = Path(run)
    if not (run / "config.yaml").is_file():
        raise RunError(f"{run} is not a run folder (no config.yaml). Runs are under runs/<task>/.")
    groups = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in GROUPS]
    if groups:
        raise ConfigError(f"{' '.join(groups)}: a run keeps the task, agent and sim it was trained with; "
                          "override single keys instead (e.g. sim.num_envs=16).")
    fix = "\nFix it on the command line: key=value changes a key, +key=value adds one, ~key removes one."
    try:
        # The saved file alone, then the overrides (so ~key can remove what this code refuses),
        # then the schema's check.
        with initialize_config_dir(str(run.resolve()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=list(overrides))
        checked = OmegaConf.merge(OmegaConf.structured(schema.Train), cfg)
    except Exception as e:
        raise ConfigError(f"{run / 'config.yaml'}: {explain(e)}{fix}") from None
    try:
        typed(checked)
    except ConfigError as e:
        raise ConfigError(f"{run / 'config.yaml'}: {e}{fix}") from None
    return checked


def save_config(cfg, path: Path) -> None:
    """Writes the resolved config, every default filled in: enough to reproduce the run, and
    what :func:`load_run_config` reads."""
    from omegaconf import OmegaConf

    OmegaConf.save(OmegaConf.structured(typed(cfg)), path)


def typed(cfg) -> schema.Train:
    """The config as :mod:`legion.configs.schema` dataclasses (``cfg`` a DictConfig or already typed)."""
    if isinstance(cfg, schema.Train):
        return cfg
    try:
        return schema.typed(cfg)
    except schema.SchemaError as e:
        raise ConfigError(str(e)) from None


def validate(cfg: schema.Train) -> None:
    """Checks the values a run needs before anything is built; one line per problem."""
    import torch

    from legion.tasks.sim.solver import SOLVERS

    problems = []
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
    for key, value in (("agent.keep_last", agent.keep_last), ("agent.keep_every", agent.keep_every),
                       ("agent.save_every_minutes", agent.save_every_minutes)):
        if value is not None and value <= 0:
            problems.append(f"{key}={value}: must be > 0 or null")
    record = cfg.task.record
    if record.every is not None:
        problems += [f"task.record.{key}={getattr(record, key)}: must be > 0"
                     for key in ("every", "episodes", "num_envs") if not getattr(record, key) > 0]
    if agent.max_policy_lag < 0:
        problems.append(f"agent.max_policy_lag={agent.max_policy_lag}: must be >= 0")
    if agent.mode not in ("sync", "async"):
        problems.append(f"agent.mode={agent.mode}: choose sync or async")
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


def explain(error: Exception) -> str:
    """One clear message for a Hydra or OmegaConf error: the key, what is wrong, what is valid."""
    if getattr(error, "full_key", None) is None and not any(
            getattr(c, "full_key", None) for c in (error.__cause__, error.__context__) if c is not None):
        return str(error).split("Config search path:")[0].strip()  # e.g. an unknown task: Hydra lists the valid ones
    return schema.describe(error)


# --- envs, runners, runs -----------------------------------------------------------------------------
def make_env(cfg):
    """The task's env from a composed config (DictConfig or :class:`~legion.configs.schema.Train`)."""
    from legion.tasks.env import LegionEnv

    cfg = typed(cfg)
    return LegionEnv(cfg.task, cfg.sim, device=cfg.device, seed=cfg.seed)


def make_runner(env, agent: schema.Agent, log_dir: str | Path | None = None, device: str = "cpu", group=None):
    """The runner for ``agent.mode``: ``sync`` (collect, then update) or ``async`` (overlapped);
    ``group``: this rank's :class:`~legion.agents.distributed.Group` in a multi-process run."""
    if agent.mode == "sync":
        from legion.agents.runner import Runner

        return Runner(env, agent, log_dir, device, group)
    if agent.mode == "async":
        from legion.agents.async_runner import AsyncRunner

        return AsyncRunner(env, agent, log_dir, device, group)
    raise ConfigError(f"agent.mode must be 'sync' or 'async', got '{agent.mode}'")


@dataclass
class LoadedRun:
    """A trained run, ready to act: its folder and config, an env (observation noise off) and its runner."""

    run: Path
    cfg: object  # the DictConfig, overrides applied
    env: object
    runner: object
    checkpoint: Path

    @property
    def settings(self) -> schema.Train:
        return typed(self.cfg)


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
    if str(cfg.device).startswith("cuda") and not any(o.lstrip("+").startswith("device=") for o in overrides):
        import torch

        if not torch.cuda.is_available():
            print(f"[legion] note: {run} trained on {cfg.device}; this machine has no CUDA, so it runs on the CPU",
                  flush=True)
            cfg.device = "cpu"
    if not str(cfg.device).startswith("cuda"):
        cfg.sim.capture_step = False  # a speed setting of a GPU run: the same steps, eager, elsewhere
    settings = typed(cfg)
    validate(settings)
    try:
        if checkpoint:
            path = Path(checkpoint)
            if not path.is_file():
                found = sorted(p.name for p in run.glob("model_*.pt"))
                raise RunError(f"{path} does not exist. Checkpoints of this run: {found or 'none'}")
            contents = load_checkpoint(path)
        else:
            path, contents = latest_good_checkpoint(run)
    except CheckpointError as e:
        raise RunError(str(e)) from None
    setup_process()
    seed_everything(settings.seed)
    try:
        env = make_env(settings)
    except ValueError as e:
        raise RunError(f"the run's config.yaml does not build an env with this code: {e}\nFix it on the command "
                       "line: key=value changes a key, +key=value adds one, ~key removes one.") from e
    env.noise_enabled = False
    from legion.agents.runner import Runner

    runner = Runner(env, settings.agent, log_dir=None, device=settings.device)
    try:
        runner.load(path, contents)
    except CheckpointError as e:
        raise RunError(str(e)) from None
    return LoadedRun(run, cfg, env, runner, path)


def play(loaded: LoadedRun, episodes: int):
    """Runs the trained policy deterministically (noise off) on the run's env; yields
    ``{"return", "length", "time_out"}`` for each of the first ``episodes`` episodes that finish."""
    import torch

    env = loaded.env
    policy = loaded.runner.ppo.get_policy()
    policy.eval()
    obs = env.get_observations()
    returns = torch.zeros(env.num_envs, device=env.device)
    lengths = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
    finished = 0
    with torch.inference_mode():
        while finished < episodes:
            obs, rewards, dones, extras = env.step(policy(obs))
            returns += rewards
            lengths += 1
            for i in dones.nonzero().squeeze(-1).tolist():
                if finished < episodes:
                    yield {"return": returns[i].item(), "length": int(lengths[i]), "time_out": bool(extras["time_outs"][i])}
                finished += 1
            returns[dones] = 0.0
            lengths[dones] = 0


def train(cfg, run_dir: Path, resume: bool = False, checkpoint: str | Path | None = None):
    """Builds the env and the learner and trains, writing into ``run_dir``; returns the runner.

    ``resume``: ``run_dir`` is an earlier run: continue from ``checkpoint`` or its newest good
    one. Ctrl-C or SIGTERM stops training after a checkpoint, and this returns normally. Started
    by torchrun as one of several ranks, it joins the process group
    (:mod:`legion.agents.distributed`): rank 0 reads the checkpoint and alone writes the run folder.
    """
    from legion.agents import distributed
    from legion.agents.checkpoints import CheckpointError, latest_good_checkpoint, load_checkpoint
    from legion.agents.runner import Interrupted

    settings = typed(cfg)
    validate(settings)
    group = None
    if distributed.launched():
        group, settings.device = distributed.join(settings.device)
        settings.seed += group.rank  # the global rank: a local rank repeats on every node
    main = group is None or group.is_main
    say = print if main else (lambda *args, **kwargs: None)
    try:
        path = contents = None
        if resume and main:
            try:
                path, contents = (Path(checkpoint), load_checkpoint(checkpoint)) if checkpoint \
                    else latest_good_checkpoint(run_dir)
            except CheckpointError as e:
                raise RunError(str(e)) from None
        if resume and group is not None:
            path, contents = distributed.broadcast((path, contents), group)
        setup_process()
        ranks = f" x {group.world_size} ranks ({group.backend})" if group else ""
        say(f"[legion] task {settings.task.name}, {settings.sim.num_envs} envs{ranks} on {settings.device}, "
            f"{settings.agent.mode} PPO; run folder {run_dir}", flush=True)
        seed_everything(settings.seed)
        say("[legion] building the simulation (the first run compiles Warp kernels: about a minute)", flush=True)
        # Hydra creates a new run's folder before the job starts: empty (or absent) means new.
        new = main and not resume and not (run_dir.is_dir() and any(run_dir.iterdir()))
        try:
            env = make_env(settings)
            if main:
                run_dir.mkdir(parents=True, exist_ok=True)
                save_config(cfg, run_dir / "config.yaml")
            runner = make_runner(env, settings.agent, log_dir=run_dir if main else None, device=settings.device,
                                 group=group)
            if main and settings.task.record.every is not None:
                from legion.sim2real.trajectories.record import TrainingRecorder

                runner.on_iteration.append(TrainingRecorder(run_dir, settings))
        except BaseException:
            if new:  # a run that never started leaves no folder behind (all in it was written just now)
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        if resume:
            runner.load(path, contents)
            say(f"[legion] resumed from {path} at iteration {runner.iteration} "
                f"(learning rate {runner.ppo.learning_rate:.3g})", flush=True)
        try:
            runner.learn(settings.agent.max_iterations)
        except Interrupted as e:
            from legion.agents.checkpoints import checkpoints

            saved = checkpoints(run_dir)
            latest = f"latest checkpoint {saved[-1].name}" if saved else "no checkpoint yet"
            say(f"\n[legion] stopped by {e.signal_name} at iteration {runner.iteration}; {latest} in {run_dir} "
                f"(continue: legion train resume={run_dir})", flush=True)
        return runner
    except Exception as e:
        if group is not None and distributed.is_lost_rank(e):
            raise distributed.RankLost(
                f"rank {group.rank} of {group.world_size}: another rank stopped answering ({str(e).splitlines()[0]}); "
                "it died, was killed or its machine became unreachable: see that rank's output. Rank 0 writes the "
                f"checkpoints: continue with legion train resume={run_dir}.") from e
        raise
    finally:
        if group is not None:
            distributed.leave()
