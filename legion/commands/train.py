"""`legion train`: a new run (Hydra composes it; -m sweeps; torchrun ranks), or `resume=` an earlier one."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from legion.agents.ppo import update_precision
from legion.api import RunError, checkpoint_in, make_env, make_runner, seed_everything, setup_process, validate
from legion.commands import UsageError, guarded, run_args
from legion.configs import save_config, schema

HELP = """usage: legion train resume=<run folder> [checkpoint=FILE] [key=value ...]

Continues a run in its own folder from its newest good checkpoint (a damaged newer one is
skipped with a warning) or from checkpoint=FILE (a path, or a name in the run folder:
model_6.pt), with the run's saved config.yaml and any overrides on top (e.g.
agent.max_iterations=null). Networks, normalizers, optimizer, learning rate, iteration,
randomization ranges and random generators continue where they stopped. A checkpoint that does
not fit the networks the overrides make stops it before anything in the folder changes.
"""


def run(args: list[str]) -> None:
    from legion import configs

    if "--nproc" in args:  # a shortcut for torchrun on this machine
        at = args.index("--nproc")
        if at + 1 >= len(args) or not args[at + 1].isdigit() or int(args[at + 1]) < 1:
            raise UsageError("--nproc K: K processes (ranks) on this machine, K >= 1")
        nproc, rest = args[at + 1], args[:at] + args[at + 2:]
        os.execvp(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   f"--nproc_per_node={nproc}", "-m", "legion", "train", *rest])
    if any(a.startswith("resume=") for a in args):
        if any(a in ("-h", "--help") for a in args):
            print(HELP)
            return
        resumed = [f"run={a.split('=', 1)[1]}" if a.startswith("resume=") else a for a in args]
        run, options, overrides = run_args(resumed, HELP, {"checkpoint": None})
        train(configs.load_run_config(run, overrides), run, resume=True, checkpoint=options["checkpoint"])
        return
    multirun = any(a in ("-m", "--multirun") for a in args)
    rank = int(os.environ.get("RANK", "0"))
    if rank > 0 and multirun:
        raise UsageError("a Hydra multirun cannot run under torchrun; sweep the distributed runs one by one.")
    if multirun or any(a.startswith("-") for a in args):  # a sweep, or Hydra's own flags (--help, --cfg job, ...)
        _hydra_train(args)
        return
    cfg, run_dir = configs.compose_run(*args)  # one run: composed once, Hydra's folder name included
    if rank > 0:  # torchrun's other ranks: rank 0 alone writes the run folder
        run_dir = Path(tempfile.gettempdir()) / f"legion-rank{rank}-{os.getpid()}"
    train(cfg, run_dir)


def _hydra_train(args: list[str]) -> None:
    """A Hydra job per run (a ``-m`` sweep, or Hydra's flags): each job's config typed once."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from legion import configs

    def job(cfg) -> None:  # Hydra reports a job's errors its own way: report ours as main() does first
        guarded("train", lambda: train(configs.typed(cfg), Path(HydraConfig.get().runtime.output_dir)))

    configs.schema.register()
    main = hydra.main(config_path=str(configs.CONFIG_DIR), config_name="train", version_base="1.3")(job)
    sys.argv = ["legion train", *configs.hydra_overrides(args)]  # robot=<file.yaml>, LEGION_CONFIG_PATH
    main()


def train(cfg: schema.Train, run_dir: Path, resume: bool = False, checkpoint: str | Path | None = None):
    """Builds the env and the learner and trains, writing into ``run_dir``; returns the runner.

    ``resume``: ``run_dir`` is an earlier run: continue from ``checkpoint`` or its newest good
    one. Ctrl-C or SIGTERM stops training after a checkpoint, and this returns normally. Started
    by torchrun as one of several ranks, it joins the process group
    (:mod:`legion.agents.distributed`): rank 0 reads the checkpoint and alone writes the run folder.
    """
    from legion import Interrupted
    from legion.agents import distributed
    from legion.agents.checkpoints import CheckpointError, latest_good_checkpoint, load_checkpoint

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
                if checkpoint:
                    path = checkpoint_in(run_dir, checkpoint)
                    contents = load_checkpoint(path)
                else:
                    path, contents = latest_good_checkpoint(run_dir)
            except CheckpointError as e:
                raise RunError(str(e)) from None
        if resume and group is not None:
            path, contents = distributed.broadcast((path, contents), group)
        setup_process()
        ranks = f" x {group.world_size} ranks ({group.backend})" if group else ""
        learner = cfg.agent.mode
        if cfg.agent.learner != "ppo":
            off = cfg.agent.off_policy
            learner = (f"{cfg.agent.learner.upper()} (replay {off.buffer_size} steps per env, batch {off.batch_size}, "
                       f"{off.update_to_data} updates per step, in {update_precision(cfg.agent, cfg.device)})")
        elif cfg.agent.mode in ("sync", "async"):
            a = cfg.agent.algorithm  # (a task may set them per robot: configs/tuning/)
            rate = f"learning rate {a.learning_rate:g} fixed" if a.schedule == "fixed" else \
                f"learning rate adapted to KL {a.desired_kl:g}"
            learner = (f"{cfg.agent.mode} PPO ({rate}, entropy {a.entropy_coef:g}, "
                       f"update in {update_precision(cfg.agent, cfg.device)})")
        n = cfg.agent.max_iterations
        iterations = "until stopped" if n is None else f"{n} iteration{'' if n == 1 else 's'}"
        stop = cfg.agent.stop_when
        if stop.goal:
            from legion.evaluation import METRICS

            if cfg.task.command is None or cfg.task.command.type not in METRICS:
                raise RunError(f"agent.stop_when.goal: task {cfg.task.name} has no goal that legion eval measures (a "
                               f"velocity, pose or position command); train it with agent.stop_when.goal=false.")
        if stop.goal and group is not None:  # (rank 0 alone could not stop the others between iterations)
            say("[legion] note: agent.stop_when.goal is off with torchrun ranks: agent.max_iterations stops the run",
                flush=True)
            stop = dataclasses.replace(stop, goal=False)
        if stop.goal:
            iterations = (f"until it meets its goal at {stop.confirm} evaluations in a row (every {stop.every_min:g} "
                          f"min of training) or {iterations}")
        say(f"[legion] task {cfg.task.name}, {cfg.sim.num_envs} envs{ranks} on {cfg.device}, {iterations}, "
            f"{learner}; run folder {run_dir}", flush=True)
        seed_everything(cfg.seed)
        say("[legion] building the simulation (the first run compiles Warp kernels: about a minute)", flush=True)
        # Hydra creates a new run's folder before the job starts: empty (or absent) means new.
        new = main and not resume and not (run_dir.is_dir() and any(run_dir.iterdir()))
        try:
            from legion.sim2real.trajectories.demos import imitation_inputs, with_teacher_observations

            env = make_env(with_teacher_observations(cfg))  # a distillation's env also observes for its teacher
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
            goal_stop = None
            if stop.goal:
                from legion.evaluation import StopAtGoal

                goal_stop = StopAtGoal(run_dir, cfg)
                runner.on_iteration.append(goal_stop)
            # The checkpoint last (it restores the generators the above drew from), and before
            # config.yaml: one that does not fit these networks leaves the run folder as it was.
            try:
                if cfg.agent.init_from and not resume:
                    runner.init_from(cfg.agent.init_from)
                if resume:
                    assert path is not None and contents is not None  # read above (rank 0) or broadcast
                    runner.load(path, contents)
            except CheckpointError as e:
                if resume:
                    raise RunError(f"{path} does not fit this task/agent config: {_misfit(e)}. Resume without the "
                                   "overrides that change the networks, or train such networks in a new run "
                                   "(agent.init_from=<checkpoint> starts one from networks of the same shapes).") \
                        from None
                raise RunError(f"agent.init_from={cfg.agent.init_from} does not fit this task/agent config: "
                               f"{_misfit(e)}. Give the new run the networks of the checkpoint's run (agent.actor, "
                               "agent.critic in its config.yaml).") from None
            limit = cfg.agent.max_iterations
            if resume and limit is not None and runner.iteration >= limit:
                raise RunError(f"{path} is at iteration {runner.iteration}, agent.max_iterations={limit}: nothing to "
                               f"train. Give more (agent.max_iterations={runner.iteration + 100}, or null: until "
                               "stopped).")
            if main:
                run_dir.mkdir(parents=True, exist_ok=True)
                save_config(saved, run_dir / "config.yaml")
        except BaseException:
            if new:  # a run that never started leaves no folder behind (all in it was written just now)
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        if cfg.agent.init_from and not resume:
            say(f"[legion] starting from the networks of {cfg.agent.init_from}", flush=True)
        if resume:
            rate = f" (learning rate {runner.ppo.learning_rate:.3g})" if cfg.agent.learner == "ppo" else ""
            say(f"[legion] resumed from {path} at iteration {runner.iteration}{rate}", flush=True)
            if main:
                set_aside_later_checkpoints(run_dir, runner.iteration, say)
        from legion.evaluation import GoalReached

        try:
            runner.learn(cfg.agent.max_iterations)
            if goal_stop is not None:  # max_iterations came first: where the last policy stands
                goal_stop(runner, runner.iteration, last=True)
                say(f"[legion] agent.max_iterations={cfg.agent.max_iterations} reached before the goal was met at "
                    f"{stop.confirm} evaluations in a row", flush=True)
        except GoalReached as e:
            say(f"[legion] goal met at {e.trained_s / 60:.1f} min of training, iteration {e.iteration} ({e}): "
                f"the policy is {e.checkpoint}", flush=True)
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


def set_aside_later_checkpoints(run_dir: Path, iteration: int, say=print) -> None:
    """A run resumed from an earlier checkpoint branches off: its checkpoints past ``iteration``
    move to ``superseded_from_it<iteration>/`` (kept, not deleted), or the newest, not this
    branch's, would be what play, export and the next resume pick."""
    from legion.agents.checkpoints import checkpoints

    later = [p for p in checkpoints(run_dir) if int(p.stem.split("_", 1)[1]) > iteration]
    if not later:
        return
    folder = run_dir / f"superseded_from_it{iteration}"
    folder.mkdir(exist_ok=True)
    for checkpoint in later:
        checkpoint.replace(folder / checkpoint.name)
    say(f"[legion] note: the run's later checkpoints ({', '.join(p.name for p in later)}) moved to {folder}: "
        "this resume branches off before them", flush=True)


def _misfit(e: Exception) -> str:
    """What of a checkpoint does not fit, in one line: the first of torch's lines (one per tensor)."""
    cause = e.__cause__
    if not isinstance(cause, RuntimeError):  # a KeyError: something the checkpoint lacks
        return f"it lacks {cause}" if isinstance(cause, KeyError) else str(e)
    lines = [line.strip() for line in str(cause).splitlines()[1:] if line.strip()] or [str(cause)]
    shape = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[.*?\])\) from checkpoint, "
                       r"the shape in current model is torch\.Size\((\[.*?\])\)\.")
    first = shape.sub(r"its \1 has shape \2, this config's \3", lines[0]).rstrip(".")
    return first + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")
