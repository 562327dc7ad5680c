"""What the ``legion`` commands do, as functions: train a run, play a trained policy.

:mod:`legion.cli` parses arguments and calls these (and :mod:`legion.evaluation`,
:mod:`legion.sim2real`); tests and benchmarks call them too. Built on :mod:`legion.api`; nothing
below this layer imports it.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path

from legion.api import LoadedRun, RunError, make_env, make_runner, seed_everything, setup_process, validate
from legion.configs import save_config, schema


def play(loaded: LoadedRun, episodes: int) -> Iterator[dict]:
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
            policy.reset(dones)  # a recurrent policy's state ends with its episode
            returns += rewards
            lengths += 1
            for i in dones.nonzero().squeeze(-1).tolist():
                if finished < episodes:
                    yield {"return": returns[i].item(), "length": int(lengths[i]),
                           "time_out": bool(extras["time_outs"][i])}
                finished += 1
            returns[dones] = 0.0
            lengths[dones] = 0


def train(cfg: schema.Train, run_dir: Path, resume: bool = False, checkpoint: str | Path | None = None):
    """Builds the env and the learner and trains, writing into ``run_dir``; returns the runner.

    ``resume``: ``run_dir`` is an earlier run: continue from ``checkpoint`` or its newest good
    one. Ctrl-C or SIGTERM stops training after a checkpoint, and this returns normally. Started
    by torchrun as one of several ranks, it joins the process group
    (:mod:`legion.agents.distributed`): rank 0 reads the checkpoint and alone writes the run folder.
    """
    from legion.agents import distributed
    from legion.agents.checkpoints import CheckpointError, latest_good_checkpoint, load_checkpoint
    from legion.agents.runner import Interrupted

    validate(cfg)
    saved, cfg = cfg, dataclasses.replace(cfg)  # this rank's device and seed change below; config.yaml keeps the run's
    group = None
    if distributed.launched():
        group, cfg.device = distributed.join(cfg.device)
        cfg.seed += group.rank  # the global rank: a local rank repeats on every node
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
        learner = f"{cfg.agent.mode} PPO" if cfg.agent.mode in ("sync", "async") else cfg.agent.mode
        say(f"[legion] task {cfg.task.name}, {cfg.sim.num_envs} envs{ranks} on {cfg.device}, {learner}; "
            f"run folder {run_dir}", flush=True)
        seed_everything(cfg.seed)
        say("[legion] building the simulation (the first run compiles Warp kernels: about a minute)", flush=True)
        # Hydra creates a new run's folder before the job starts: empty (or absent) means new.
        new = main and not resume and not (run_dir.is_dir() and any(run_dir.iterdir()))
        try:
            from legion.sim2real.trajectories.demos import imitation_inputs, with_teacher_observations

            env = make_env(with_teacher_observations(cfg))  # a distillation's env also observes for its teacher
            if main:
                run_dir.mkdir(parents=True, exist_ok=True)
                save_config(saved, run_dir / "config.yaml")

            runner = make_runner(env, cfg.agent, log_dir=run_dir if main else None, device=cfg.device, group=group,
                                 **imitation_inputs(cfg.agent, env))
            if main and cfg.task.record.every is not None:
                from legion.sim2real.trajectories.record import TrainingRecorder

                # The recording env is built here, from the training's own config, when first needed.
                recording = dataclasses.replace(cfg,
                                                sim=dataclasses.replace(cfg.sim, num_envs=cfg.task.record.num_envs))
                if not recording.device.startswith("cuda"):
                    recording.sim.capture_step = False  # as any loaded run off the GPU: the same steps, eager
                runner.on_iteration.append(TrainingRecorder(run_dir, recording, make_env))
            if main and cfg.agent.video.every is not None:
                from legion.sim2real.trajectories.record import TrainingVideo

                runner.on_iteration.append(TrainingVideo(run_dir, cfg, make_env))
        except BaseException:
            if new:  # a run that never started leaves no folder behind (all in it was written just now)
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        if cfg.agent.init_from and not resume:
            runner.init_from(cfg.agent.init_from)
            say(f"[legion] starting from the networks of {cfg.agent.init_from}", flush=True)
        if resume:
            assert path is not None and contents is not None  # read above (rank 0) or broadcast
            runner.load(path, contents)
            say(f"[legion] resumed from {path} at iteration {runner.iteration} "
                f"(learning rate {runner.ppo.learning_rate:.3g})", flush=True)
        try:
            runner.learn(cfg.agent.max_iterations)
        except Interrupted as e:
            from legion.agents.checkpoints import checkpoints

            saved = checkpoints(run_dir)
            latest = f"latest checkpoint {saved[-1].name}" if saved else "no checkpoint yet"
            say(f"\n[legion] stopped by {e.signal_name} at iteration {runner.iteration}; {latest} in {run_dir} "
                f"(continue: legion train resume={run_dir})", flush=True)
        finally:
            runner.log.close()  # the last events written; a W&B run finished (its last step committed)
            for callback in runner.on_iteration:
                getattr(callback, "close", lambda: None)()
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
