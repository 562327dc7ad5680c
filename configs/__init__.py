"""legion-rl's configs: the Hydra files in this folder, their typed schema (:mod:`.schema`), and
the functions that compose, check, save and load them.

A config is composed once and converted once: every function here returns the typed root,
:class:`~legion.configs.schema.Train`, and that object flows from the command to the runner; the
OmegaConf form exists only inside Hydra's composition and when a config is written to disk.

One override grammar, Hydra's, for every command: ``key=value`` changes a key, ``+key=value``
adds one, ``++key=value`` adds or changes, ``~key`` removes one. A new run composes
``train.yaml``; a run folder's ``config.yaml`` is itself a Hydra config over the same schema,
so a saved run takes the same overrides.

A user's own configs live outside the package: a group chosen by a YAML file's path
(``robot=my/a1.yaml``, also task=, agent=, sim=), or folders laid out as this one (robot/NAME.yaml,
task/NAME.yaml, ...) named by ``LEGION_CONFIG_PATH`` (``:``-separated), which join Hydra's search
path. The run's config.yaml holds the composed result, so a run needs neither afterwards.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from legion.configs import schema

CONFIG_DIR = Path(__file__).resolve().parent
GROUPS = ("task", "robot", "agent", "sim")
# Where a group's file lands in the root config when its header (``# @package ...``) does not say.
PACKAGES = {"task": "_global_", "robot": "task.scene.robot", "agent": "agent", "sim": "sim"}
USER_PATH = "LEGION_CONFIG_PATH"
YAML = (".yaml", ".yml")
FIX = "\nFix it on the command line: key=value changes a key, +key=value adds one, ~key removes one."


class ConfigError(ValueError):
    """A config (its files, an override, or a run's saved config) is invalid."""


# --- where configs are found -----------------------------------------------------------------------
def user_config_dirs() -> list[Path]:
    """The folders of ``LEGION_CONFIG_PATH``, in order (each laid out as configs/: robot/NAME.yaml, ...)."""
    return [Path(p).expanduser().resolve() for p in os.environ.get(USER_PATH, "").split(os.pathsep) if p]


def config_names(group: str) -> list[str]:
    """The configs of a group: configs/<group>/*.yaml and those of the LEGION_CONFIG_PATH folders."""
    return sorted({p.stem for folder in (CONFIG_DIR, *user_config_dirs()) for p in (folder / group).glob("*.yaml")})


def task_names() -> list[str]:
    return config_names("task")


def config_file(group: str, name: str) -> Path:
    """The YAML file ``group=name`` names: a path (ending .yaml or .yml), or <group>/<name>.yaml in
    configs/ or, after it, in a LEGION_CONFIG_PATH folder."""
    if name.endswith(YAML):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"{group}={name}: no such file (from {Path.cwd()}); give the path of a YAML file "
                              f"laid out as configs/{group}/*.yaml (legion robot inspect writes one for a robot).")
        return path
    found = next((folder / group / f"{name}.yaml" for folder in (CONFIG_DIR, *user_config_dirs())
                  if (folder / group / f"{name}.yaml").is_file()), None)
    if found is None:
        raise ConfigError(f"{group}={name}: no such config; {group} configs: {', '.join(config_names(group))}. "
                          f"Yours: {group}=<path to a .yaml file>, or {group}/{name}.yaml in a folder of {USER_PATH}.")
    return found


_STORED: dict[Path, str] = {}  # a group's YAML file given by its path -> its name in Hydra's ConfigStore


def hydra_overrides(overrides) -> list[str]:
    """``overrides`` as Hydra takes them: a group chosen by a YAML file's path (``robot=my/a1.yaml``)
    becomes an entry of Hydra's ConfigStore (composed as a file of the group would be, into the
    typed schema), and LEGION_CONFIG_PATH's folders join Hydra's search path (after configs/: a
    name configs/ has stays the package's, :func:`compose_run` refuses the clash)."""
    result = []
    for override in overrides:
        key, equals, value = override.partition("=")
        if equals and key in GROUPS and any(v.endswith(YAML) for v in value.split(",")):  # a,b: a sweep
            override = f"{key}={','.join(_store(key, v) if v.endswith(YAML) else v for v in value.split(','))}"
        result.append(override)
    folders = user_config_dirs()
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        raise ConfigError(f"{USER_PATH}: no such folder {', '.join(missing)}; it names folders laid out as "
                          "configs/ (robot/NAME.yaml, task/NAME.yaml, ...), separated by ':'.")
    if folders and not any(o.startswith("hydra.searchpath=") for o in overrides):  # one given here wins
        result.append("hydra.searchpath=[" + ",".join(f'"file://{f}"' for f in folders) + "]")
    return result


def _store(group: str, file: str) -> str:
    """Puts a group's YAML file into Hydra's ConfigStore; returns the name that chooses it."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import DictConfig, OmegaConf

    path = config_file(group, file).resolve()
    text = path.read_text()
    try:
        node = OmegaConf.create(text)
    except Exception as e:
        raise ConfigError(f"{group}={file}: not a valid YAML file: {str(e).splitlines()[0]}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{group}={file}: expected a mapping of keys (as configs/{group}/*.yaml), got {text[:40]!r}")
    header = re.match(r"(\s*#[^\n]*\n?)*", text)  # the leading comments, where Hydra reads `# @package X`
    package = re.search(r"#\s*@package\s+(\S+)", header.group(0) if header else "")
    if path not in _STORED:  # file:<stem>, unless another file of that stem was stored
        name = f"file:{path.stem}"
        _STORED[path] = name if name not in _STORED.values() else f"{name}-{len(_STORED)}"
    ConfigStore.instance().store(group=group, name=_STORED[path], node=node,
                                 package=package.group(1) if package else PACKAGES[group])
    return _STORED[path]


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
            cfg = hydra_compose("train", overrides=hydra_overrides(overrides), return_hydra_config=True)
        run_dir = Path(cfg.hydra.run.dir)
    except ConfigError:
        raise
    except Exception as e:
        message = explain(e)
        if "Could not override 'robot'" in message:
            task = next((o.split("=", 1)[1] for o in overrides if o.startswith("task=")), "cartpole")
            message = f"task={task} has no robot group (its robot is part of its task file): drop robot=."
        elif re.search(r"Could not find '(task|robot|agent|sim)/", message):
            message = re.sub(r"\n\tfile:\S*", "", message)  # Hydra's list of options: not the files given by path
            message += (f"\nYour own: <group>=<path to a .yaml file> (e.g. robot=my_robot.yaml), or <group>/NAME.yaml "
                        f"in a folder of {USER_PATH} (now: {os.environ.get(USER_PATH) or 'unset'}).")
        raise ConfigError(message) from None
    choices = {group: cfg.hydra.runtime.choices.get(group) for group in GROUPS}
    _refuse_shadowed(choices)
    with open_dict(cfg):
        del cfg["hydra"]
    stored = {name: path for path, name in _STORED.items()}
    robot = choices["robot"] and f"robot={stored.get(choices['robot'], choices['robot'])}"
    return typed(cfg, robot), run_dir


def _refuse_shadowed(choices: dict) -> None:
    """A chosen name both configs/ and a LEGION_CONFIG_PATH folder have: Hydra takes configs/'s,
    which the user, who wrote theirs, would not expect."""
    for group, name in choices.items():
        theirs = [f / group / f"{name}.yaml" for f in user_config_dirs() if (f / group / f"{name}.yaml").is_file()]
        if name and theirs and (CONFIG_DIR / group / f"{name}.yaml").is_file():
            raise ConfigError(f"{group}={name}: {theirs[0]} ({USER_PATH}) has the name of the package's "
                              f"configs/{group}/{name}.yaml, which comes first: rename yours (e.g. {group}/"
                              f"my_{name}.yaml) or choose it by its path, {group}={theirs[0]}")


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
        broken = next((c for c in (e, e.__cause__, e.__context__) if type(c).__module__.startswith("yaml")), None)
        if broken is not None:  # e.g. a file cut short by a full disk or a killed copy
            mark = getattr(broken, "problem_mark", None)
            raise ConfigError(f"{run / 'config.yaml'}: not valid YAML ({getattr(broken, 'problem', broken)}"
                              + (f", line {mark.line + 1}" if mark else "") + "): the file is damaged. It holds "
                              "how this run was configured; restore it from a copy, or train a new run.") from None
        raise ConfigError(f"{run / 'config.yaml'}: {explain(e)}{FIX}") from None
    try:
        return typed(cfg)
    except ConfigError as e:
        raise ConfigError(f"{run / 'config.yaml'}: {e}{FIX}") from None


def save_config(cfg: schema.Train, path: Path) -> None:
    """Writes the resolved config, every default filled in: enough to reproduce the run, and
    what :func:`load_run_config` reads. Written whole or not at all (a temporary file renamed)."""
    from omegaconf import OmegaConf

    tmp = path.with_name(f".{path.name}.tmp")
    OmegaConf.save(OmegaConf.structured(cfg), tmp)
    os.replace(tmp, path)


def typed(cfg, robot: str | None = None) -> schema.Train:
    """A composed OmegaConf config (or a plain dict) as checked :mod:`.schema` dataclasses; named
    entries (terms, objects) are checked here. ``robot``: how the robot was chosen (robot=go2), for
    the message when the task names a body or joint group the robot does not define."""
    try:
        return schema.typed(cfg)
    except schema.SchemaError as e:
        missing = re.search(r"Interpolation key 'task\.scene\.robot\.(bodies|joints)\.([^'.]+)' not found", str(e))
        if missing is None:
            raise ConfigError(str(e)) from None
        raise ConfigError(_missing_group(cfg, robot, *missing.groups())) from None


def _missing_group(cfg, robot: str | None, kind: str, group: str) -> str:
    """Which robots define the body or joint group a task names (``${task.scene.robot.bodies.feet}``)."""
    from omegaconf import DictConfig, OmegaConf

    defining = []
    for name in config_names("robot"):
        try:
            node = OmegaConf.load(config_file("robot", name))
        except Exception:  # a broken YAML of the user's defines nothing
            continue
        if isinstance(node, DictConfig) and group in (node.get(kind) or {}):
            defining.append(name)
    def value(key: str):
        return OmegaConf.select(cfg, key, default="?") if OmegaConf.is_config(cfg) else "?"

    task = value("task.name")
    robot = robot or f"its robot (task.scene.robot.file={value('task.scene.robot.file')})"
    what = "body" if kind == "bodies" else "joint"
    return (f"task={task} needs the robot's {what} group '{group}' (task.scene.robot.{kind}.{group}), which {robot} "
            f"does not define; robots that do: {', '.join(defining) or 'none'}. Choose one of them, or add "
            f"{kind}: {{{group}: <{what} name regex>}} to the robot's YAML.")


def robot_problems(robot: schema.Robot, key: str = "task.scene.robot") -> list[str]:
    """The values of a robot config no robot can have, one line each, keys under ``key`` (the model
    file is checked where it is loaded). A gain of 0 is a joint without that spring or damper (passive, effort
    controlled, a wheel); a limit of 0 would be a motor without torque or speed."""
    problems = []
    for group, actuator in robot.actuators.items():
        where = f"{key}.actuators.{group}" if key else f"actuators.{group}"
        for name, unit in (("stiffness", "N m/rad or N/m"), ("damping", "N m s/rad or N s/m"),
                           ("armature", "kg m^2"), ("friction", "N m or N")):
            value = getattr(actuator, name)
            if value is not None and not value >= 0:
                problems.append(f"{where}.{name}={value:g}: must be >= 0 [{unit}] (0: none, e.g. a passive or "
                                "effort-controlled joint; null: the model file's)")
        for name, meaning in (("effort_limit", "the motors' peak torque [N m or N]"),
                              ("saturation_effort", "the motor's stall torque [N m or N]"),
                              ("velocity_limit", "the speed at which the motor's torque reaches zero [rad/s or m/s]")):
            value = getattr(actuator, name)
            if value is not None and not value > 0:
                problems.append(f"{where}.{name}={value:g}: must be > 0, {meaning} (null: the model file's; a "
                                "passive joint: stiffness 0, damping 0)")
        if actuator.delay < 0:
            problems.append(f"{where}.delay={actuator.delay}: must be >= 0 physics steps")
    return problems


def scene_problems(scene: schema.Scene) -> list[str]:
    """:func:`robot_problems`, and the masses and sizes of the scene's objects and fixtures."""
    problems = robot_problems(scene.robot)
    for kind, entries in (("objects", scene.objects), ("fixtures", scene.fixtures)):
        for name, entry in entries.items():
            where = f"task.scene.{kind}.{name}"
            if kind == "objects" and not entry.mass > 0:
                problems.append(f"{where}.mass={entry.mass:g}: must be > 0 [kg]")
            if not all(size > 0 for size in entry.size):
                problems.append(f"{where}.size={list(entry.size)}: every size must be > 0 [m]")
    return problems


def explain(error: Exception) -> str:
    """One clear message for a Hydra or OmegaConf error: the key, what is wrong, what is valid."""
    if getattr(error, "full_key", None) is None and not any(
            getattr(c, "full_key", None) for c in (error.__cause__, error.__context__) if c is not None):
        return str(error).split("Config search path:")[0].strip()  # e.g. an unknown task: Hydra lists the valid ones
    return schema.describe(error)
