"""`legion`: the one command line. Each subcommand takes Hydra-style `key=value` overrides.

This is where a task (tasks/) is wired to a learner (agents/); neither knows the other.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

USAGE = """usage: legion <command> [key=value ...]

commands:
  train          train a policy          legion train task=quadruped_flat sim.num_envs=256
                 a Hydra multirun        legion train -m seed=0,1,2
                 resume a run            legion train resume=runs/cartpole/<date>
  play           run a trained policy    legion play run=runs/cartpole/<date> [episodes=5]
  randomization  what each env draws     legion randomization task=quadruped_flat
  export         export to ONNX          legion export run=runs/quadruped_flat/<date> [out=DIR]
  sim2sim        MuJoCo next to Newton   legion sim2sim run=runs/quadruped_flat/<date>

`legion <command> --help` explains a command. Tasks: {tasks}
"""

PLAY_HELP = """usage: legion play run=<run folder> [episodes=N] [checkpoint=PATH] [key=value ...]

Loads the run's saved config.yaml and its latest checkpoint (or `checkpoint=`), runs the policy
deterministically with observation noise off, and prints the return and length of each
finished episode. Any config key can be overridden, e.g. sim.num_envs=4 device=cpu.
"""

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"  # legion.configs


def task_names() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "task").glob("*.yaml"))


def setup_process() -> None:
    """Process-wide settings every command shares."""
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
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


def compose(*overrides: str):
    """The config `legion train <overrides>` would run, without starting a job."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


def _container(node) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)


def make_env(cfg):
    """The task's env from a composed config."""
    from legion.tasks.env import LegionEnv

    return LegionEnv(_container(cfg.task), _container(cfg.sim), device=cfg.device, seed=cfg.seed)


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(cfg) -> None:
    """Hydra job: build the env and the learner, then train, writing into the run folder.

    With resume=<run folder> the run's saved config.yaml is the config, and this command's own
    key=value overrides apply on top (e.g. agent.max_iterations=null): nothing to repeat.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from legion.agents.runner import CheckpointError, latest_checkpoint, make_runner

    setup_process()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.resume:
        saved_path = Path(cfg.resume) / "config.yaml"
        if not saved_path.is_file():
            sys.exit(f"legion train: {cfg.resume} is not a run folder (no config.yaml). Runs are under runs/<task>/.")
        saved = OmegaConf.load(saved_path)
        for override in OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task)):
            key = override.key_or_group
            if key in ("task", "agent", "sim"):  # a config group: the run's own choice stands
                if key == "task" and override.value() != saved.task.name:
                    sys.exit(f"legion train: {cfg.resume} trained task {saved.task.name}; "
                             f"it cannot resume as {override.value()}.")
            elif key != "resume" and not key.startswith("hydra.") and not override.is_delete():
                # Hydra has already checked the key and typed the value in the composed config.
                OmegaConf.update(saved, key, OmegaConf.select(cfg, key), force_add=True)
        saved.resume = cfg.resume
        cfg = saved
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    mode = cfg.agent.get("mode", "sync")
    print(f"[legion] task {cfg.task.name}, {cfg.sim.num_envs} envs on {cfg.device}, {mode} PPO; run folder {run_dir}",
          flush=True)
    seed_everything(cfg.seed)
    print("[legion] building the simulation (the first run compiles Warp kernels: about a minute)", flush=True)
    env = make_env(cfg)
    runner = make_runner(env, _container(cfg.agent), log_dir=run_dir, device=cfg.device)
    if cfg.resume:
        checkpoint = latest_checkpoint(cfg.resume)
        runner.load(checkpoint)
        print(f"[legion] resumed from {checkpoint} at iteration {runner.iteration} "
              f"(learning rate {runner.ppo.learning_rate:.3g})", flush=True)
    try:
        runner.learn(cfg.agent.max_iterations)
    except KeyboardInterrupt:
        try:
            latest = f"latest checkpoint {latest_checkpoint(run_dir).name}"
        except CheckpointError:
            latest = "no checkpoint yet"
        print(f"\n[legion] interrupted at iteration {runner.iteration}; {latest} in {run_dir} "
              f"(continue: legion train resume={run_dir})", flush=True)


class RunError(ValueError):
    """A run folder, its config or an override for it is unusable; the message says how to fix it."""


def parse_run_args(args: list[str], command: str, help_text: str, defaults: dict) -> tuple[Path, dict, list[str]]:
    """Splits ``key=value`` args into (run folder, this command's own options, config overrides)."""
    deletions = [a for a in args if a.startswith("~")]
    pairs = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("~"))
    bad = [a for a in args if "=" not in a and not a.startswith("~")]
    if bad or "run" not in pairs:
        sys.exit(f"legion {command}: expected run=<run folder> and key=value options, got {' '.join(args) or 'nothing'}"
                 f"\n\n{help_text}")
    run = Path(pairs.pop("run"))
    if not (run / "config.yaml").is_file():
        sys.exit(f"legion {command}: {run} is not a run folder (no config.yaml). Runs are under runs/<task>/.")
    options = {key: pairs.pop(key, default) for key, default in defaults.items()}
    return run, options, deletions + [f"{k}={v}" for k, v in pairs.items()]


def load_run(run: Path, checkpoint: str | Path | None = None, overrides: list[str] = (), num_envs: int = 16):
    """The run's env (observation noise off) and its trained policy.

    Returns (cfg, env, runner, checkpoint path). ``overrides`` are ``key=value`` config
    overrides; ``sim.num_envs`` defaults to ``min(num_envs, the run's)``.
    """
    from omegaconf import OmegaConf, open_dict

    from legion.agents.runner import CheckpointError, Runner, latest_checkpoint

    cfg = OmegaConf.load(run / "config.yaml")
    OmegaConf.set_struct(cfg, True)
    overrides = list(overrides)
    if not any(o.startswith("sim.num_envs=") for o in overrides):
        overrides.append(f"sim.num_envs={min(num_envs, cfg.sim.num_envs)}")
    # As in Hydra: `key=value` must name an existing key (typos fail), `+key=value` adds one,
    # `~key` deletes one (e.g. a section an older run's config has and the current code refuses).
    try:
        for override in (o for o in overrides if o.startswith("~")):
            *parents, leaf = override[1:].split("=")[0].split(".")
            node = OmegaConf.select(cfg, ".".join(parents)) if parents else cfg
            if node is None or leaf not in node:
                raise KeyError(f"{override}: no key {override[1:]} in the run's config")
            with open_dict(node):
                del node[leaf]
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o for o in overrides if o[0] not in "+~"]))
        with open_dict(cfg):
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o[1:] for o in overrides if o.startswith("+")]))
    except Exception as e:
        raise RunError(f"bad override: {e}") from e
    checkpoint = Path(checkpoint) if checkpoint else latest_checkpoint(run)
    if not checkpoint.is_file():
        raise CheckpointError(f"{checkpoint} does not exist. Checkpoints of this run: "
                              f"{sorted(p.name for p in run.glob('model_*.pt')) or 'none'}")
    setup_process()
    seed_everything(cfg.seed)
    try:
        env = make_env(cfg)
    except ValueError as e:
        raise RunError(f"the run's config.yaml does not build an env with this code: {e}\nFix it on the "
                       "command line: key=value changes a key, +key=value adds one, ~key removes one.") from e
    env.noise_enabled = False
    runner = Runner(env, _container(cfg.agent), log_dir=None, device=cfg.device)
    runner.load(checkpoint)
    return cfg, env, runner, checkpoint



def play(args: list[str]) -> None:
    import torch

    from legion.agents.runner import CheckpointError

    run, options, overrides = parse_run_args(args, "play", PLAY_HELP, {"checkpoint": None, "episodes": "5"})
    try:
        cfg, env, runner, checkpoint = load_run(run, options["checkpoint"], overrides)
    except (RunError, CheckpointError) as e:
        sys.exit(f"legion play: {e}")
    episodes = int(options["episodes"])
    policy = runner.ppo.get_policy()
    policy.eval()
    print(f"[legion] playing {checkpoint} on {env.num_envs} envs of {cfg.task.name}", flush=True)
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
                    cause = "time out" if extras["time_outs"][i] else "terminated"
                    print(f"episode {finished + 1}: return {returns[i].item():8.3f}  length {lengths[i].item():5d}"
                          f"  ({cause})", flush=True)
                finished += 1
            returns[dones] = 0.0
            lengths[dones] = 0


def _hydra_train(args: list[str]) -> None:
    import hydra
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("legion_run_dir"):
        # Resuming writes into the resumed run's folder; a new run gets a fresh one.
        OmegaConf.register_new_resolver("legion_run_dir", lambda resume, new: resume or new)
    main = hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")(train)
    sys.argv = ["legion train", *args]
    main()


def _play(args: list[str]) -> None:
    if any(a in ("-h", "--help") for a in args):
        print(PLAY_HELP)
        return
    play(args)


# What `pip install "legion-rl[train]"` adds to the base (edge runtime) install.
TRAINING_STACK = {"torch", "warp", "newton", "mujoco", "mujoco_warp", "rsl_rl", "hydra", "omegaconf", "tensordict",
                  "tensorboard", "onnx"}

# Subcommands: name -> function taking the remaining arguments, or "module:function" imported
# only when the command runs (so `legion --help` stays fast and needs no optional package).
COMMANDS = {
    "train": _hydra_train,
    "play": _play,
    "randomization": "legion.tasks.randomization:main",
    "export": "legion.sim2real.export:main",
    "sim2sim": "legion.sim2real.sim2sim:main",
}


def main() -> None:
    args = sys.argv[1:]
    usage = USAGE.format(tasks=", ".join(task_names()))
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage)
        return
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        sys.exit(f"legion: unknown command '{command}'.\n\n{usage}")
    handler = COMMANDS[command]
    if isinstance(handler, str):
        import importlib

        module, function = handler.split(":")
        handler = getattr(importlib.import_module(module), function)
    try:
        handler(rest)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in TRAINING_STACK:
            sys.exit(f"legion {command} needs the training stack ({e.name} is missing): "
                     "pip install torch==2.13.0 && pip install 'legion-rl[train]'")
        raise


if __name__ == "__main__":
    main()
