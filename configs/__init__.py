"""legion-rl's configs: the Hydra files in this folder, their typed schema (:mod:`.schema`), and
the functions that compose, check, save and load them.

A config is composed once and converted once: every function here returns the typed root,
:class:`~legion.configs.schema.Train`, and that object flows from the command to the runner; the
OmegaConf form exists only inside Hydra's composition and when a config is written to disk.

One override grammar, Hydra's, for every command: ``key=value`` changes a key, ``+key=value``
adds one, ``++key=value`` adds or changes, ``~key`` removes one. A new run composes
``train.yaml``; a run folder's ``config.yaml`` is itself a Hydra config over the same schema,
so a saved run takes the same overrides.
"""

from __future__ import annotations

from pathlib import Path

from legion.configs import schema

CONFIG_DIR = Path(__file__).resolve().parent
GROUPS = ("task", "robot", "agent", "sim")
FIX = "\nFix it on the command line: key=value changes a key, +key=value adds one, ~key removes one."


class ConfigError(ValueError):
    """A config (its files, an override, or a run's saved config) is invalid."""


def task_names() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "task").glob("*.yaml"))


def compose(*overrides: str) -> schema.Train:
    """The config ``legion train <overrides>`` runs, without starting a job."""
    return compose_run(*overrides)[0]


def compose_run(*overrides: str) -> tuple[schema.Train, Path]:
    """The config ``legion train <overrides>`` runs and the folder Hydra names for the run
    (``hydra.run.dir``: ``runs/<task>/<date>``), composed once, without starting a job."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    schema.register()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose("train", overrides=list(overrides), return_hydra_config=True)
        run_dir = Path(cfg.hydra.run.dir)
    except Exception as e:
        message = explain(e)
        if "Could not override 'robot'" in message:
            task = next((o.split("=", 1)[1] for o in overrides if o.startswith("task=")), "cartpole")
            message = f"task={task} has no robot group (its robot is part of configs/task/{task}.yaml): drop robot=."
        raise ConfigError(message) from None
    with open_dict(cfg):
        del cfg["hydra"]
    return typed(cfg), run_dir


def load_run_config(run: str | Path, overrides=()) -> schema.Train:
    """A run folder's saved config with ``overrides`` applied, checked against the schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    run = Path(run)
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"{run} is not a run folder (no config.yaml). Runs are under runs/<task>/.")
    groups = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in GROUPS]
    if groups:
        raise ConfigError(f"{' '.join(groups)}: a run keeps the task, robot, agent and sim it was trained with; "
                          "override single keys instead (e.g. sim.num_envs=16).")
    try:
        # The saved file alone, then the overrides (so ~key can remove what this code refuses),
        # then the schema's check.
        with initialize_config_dir(str(run.resolve()), version_base="1.3"):
            cfg = hydra_compose("config", overrides=list(overrides))
    except Exception as e:
        raise ConfigError(f"{run / 'config.yaml'}: {explain(e)}{FIX}") from None
    try:
        return typed(cfg)
    except ConfigError as e:
        raise ConfigError(f"{run / 'config.yaml'}: {e}{FIX}") from None


def save_config(cfg: schema.Train, path: Path) -> None:
    """Writes the resolved config, every default filled in: enough to reproduce the run, and
    what :func:`load_run_config` reads."""
    from omegaconf import OmegaConf

    OmegaConf.save(OmegaConf.structured(cfg), path)


def typed(cfg) -> schema.Train:
    """A composed OmegaConf config (or a plain dict) as checked :mod:`.schema` dataclasses; named
    entries (terms, objects) are checked here."""
    try:
        return schema.typed(cfg)
    except schema.SchemaError as e:
        raise ConfigError(str(e)) from None


def explain(error: Exception) -> str:
    """One clear message for a Hydra or OmegaConf error: the key, what is wrong, what is valid."""
    if getattr(error, "full_key", None) is None and not any(
            getattr(c, "full_key", None) for c in (error.__cause__, error.__context__) if c is not None):
        return str(error).split("Config search path:")[0].strip()  # e.g. an unknown task: Hydra lists the valid ones
    return schema.describe(error)
