"""The `legion` commands: one module per command, each with its ``HELP`` and ``run(args)``, which
parses the command's options and calls the library (:mod:`legion.api`, :mod:`legion.evaluation`,
:mod:`legion.sim2real`, :mod:`legion.viewer`) and prints what it did. Here: the argument helpers
they share, and :func:`guarded`, which turns bad input into one message and exit code 2. Nothing
below this layer imports it; :mod:`legion.cli` dispatches to it."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TypeVar

# command -> its module in this package
COMMANDS = {"train": "train", "play": "play", "eval": "evaluate", "record": "record", "replay": "replay",
            "dataset": "dataset", "randomization": "randomization", "export": "export", "sim2sim": "sim2sim",
            "robot": "robot", "bridge": "bridge", "deploy": "deploy",
            "calibrate": "calibrate"}

TRAINING_STACK = {"torch", "warp", "newton", "mujoco", "mujoco_warp", "rsl_rl", "hydra", "omegaconf", "tensordict",
                  "tensorboard", "onnx", "h5py", "imageio", "pyarrow", "matplotlib", "cma"}


Number = TypeVar("Number", int, float)


class UsageError(Exception):
    """Bad arguments: printed as one message, exit code 2."""


def fail(command: str, message: str) -> None:
    print(f"legion {command}: {message}", file=sys.stderr)
    sys.exit(2)


def run_args(args: list[str], help_text: str, options: dict, overrides_allowed: bool = True
             ) -> tuple[Path, dict, list[str]]:
    """Splits ``run=<folder>``, this command's ``options`` (name -> default) and config overrides
    (where ``overrides_allowed``; else the caller refuses what is left)."""
    bad = [a for a in args if "=" not in a and not a.startswith("~")]
    run = [a.split("=", 1)[1] for a in args if a.startswith("run=")]
    if bad or len(run) != 1:
        raise UsageError(f"expected run=<run folder> and key=value options, got {' '.join(args) or 'nothing'}"
                         f"\n\n{help_text}")
    import dataclasses

    from legion.configs import schema

    chosen, overrides = dict(options), []
    roots = {f.name for f in dataclasses.fields(schema.Train)}
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "run":
            continue
        if key in options:
            chosen[key] = value
        elif overrides_allowed and "." not in key and key.lstrip("+~") not in roots:  # a misspelt option
            raise UsageError(f"{key}: no such option; options: {', '.join(['run', *options])}, or config overrides "
                             f"(task.*, sim.*, agent.*, {', '.join(sorted(roots - {'task', 'sim', 'agent'}))})"
                             f"\n\n{help_text}")
        else:
            overrides.append(arg)
    return Path(run[0]), chosen, overrides


def file_args(args: list[str], help_text: str, options: dict) -> tuple[Path, dict]:
    """One positional path and this command's ``option=value``s (no config overrides)."""
    paths = [a for a in args if "=" not in a]
    if len(paths) != 1:
        raise UsageError(f"expected one file, got {paths or 'none'}\n\n{help_text}")
    chosen = dict(options)
    for arg in args:
        if "=" in arg:
            key, _, value = arg.partition("=")
            if key not in options:
                raise UsageError(f"{key}: no such option; options: {', '.join(options)}\n\n{help_text}")
            chosen[key] = value
    return Path(paths[0]), chosen


def dds_args(args: list[str], help_text: str, options: dict) -> tuple[Path, dict]:
    """run=<folder> and this command's options (no config overrides); robot= is required."""
    if any(a in ("-h", "--help") for a in args):
        print(help_text)
        raise SystemExit(0)
    run, chosen, unknown = run_args(args, help_text, options, overrides_allowed=False)
    if unknown:
        raise UsageError(f"unknown option(s) {' '.join(unknown)}; options: {', '.join(options)}\n\n{help_text}")
    if not chosen["robot"]:
        raise UsageError(f"robot= is required (go2 or g1)\n\n{help_text}")
    return run, chosen


def number(name: str, value: str, kind: type[Number] = int) -> Number:
    try:
        return kind(value)
    except ValueError:
        raise UsageError(f"{name}={value}: expected a{'n integer' if kind is int else ' number'}") from None


def flag(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise UsageError(f"{name}={value}: expected true or false")
    return value.lower() == "true"


def viewer(options: dict) -> bool:
    if options["viewer"] not in ("none", "web"):
        raise UsageError(f"viewer={options['viewer']}: the viewer is viewer=web (a live view in the browser).")
    return options["viewer"] == "web"


def print_episode(k: int, episode_return: float, length: int, time_out: bool, success: bool | None = None) -> None:
    cause = "time out" if time_out else "terminated"
    outcome = "" if success is None else ", succeeded" if success else ", failed"
    print(f"episode {k + 1}: return {episode_return:8.3f}  length {length:5d}  ({cause}{outcome})", flush=True)


class RecordedEpisodes:
    """Prints each recorded episode as it ends; ``summary()`` gives the success count, if the task has one."""

    def __init__(self):
        self.successes = []

    def __call__(self, k: int, episode) -> None:
        success = episode.attrs.get("success")
        if success is not None:
            self.successes.append(bool(success))
        print_episode(k, episode.attrs["return"], episode.length, episode.attrs["time_out"], success)

    def summary(self) -> str:
        return f"; {sum(self.successes)} of {len(self.successes)} succeeded" if self.successes else ""


def guarded(command: str, function, *args) -> None:
    """Runs a command; bad input (any ValueError: its message names the fix) exits with code 2, a
    training that cannot go on with code 1, Ctrl-C with 130 (as a shell reports it), each with one
    message and no traceback."""
    try:
        function(*args)
    except KeyboardInterrupt as e:  # Ctrl-C where the command does not stop on it itself (training does)
        name = getattr(e, "signal_name", "SIGINT")  # legion.Interrupted's, or a plain KeyboardInterrupt's
        print(f"\nlegion {command}: stopped ({'Ctrl-C' if name == 'SIGINT' else name})", file=sys.stderr)
        sys.exit(128 + signal.Signals[name])
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush stays quiet
        sys.exit(0)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "cyclonedds":
            fail(command, "needs DDS (cyclonedds is missing): pip install 'legion-rl[unitree]'")
        if e.name and e.name.split(".")[0] in TRAINING_STACK:
            fail(command, f"needs the training stack ({e.name} is missing): "
                           "pip install torch==2.13.0 && pip install 'legion-rl[train]'")
        raise
    except (UsageError, ValueError) as e:  # ConfigError, RunError, bad requests
        fail(command, str(e))
    except RuntimeError as e:
        from legion.sim2real.deploy import PolicyLoadError
        from legion.sim2real.export import ExportError

        if isinstance(e, (ExportError, PolicyLoadError)):
            fail(command, str(e))
        if "legion.sim2real.trajectories.media" in sys.modules:
            from legion.sim2real.trajectories.media import RenderingUnavailable

            if isinstance(e, RenderingUnavailable):
                fail(command, str(e))
        if "torch" in sys.modules:
            from legion.agents.runner import TrainingDiverged

            if isinstance(e, TrainingDiverged):  # its message names the causes
                print(f"legion {command}: {e}", file=sys.stderr)
                sys.exit(1)
        raise
