"""legion-rl: robot policies trained on thousands of parallel Newton worlds, exported to ONNX.

One namespace over the repository's top-level folders, each linked from here (``legion/tasks``
is ``../tasks``): ``legion.tasks`` (experience: the simulation, envs, terms), ``legion.agents``
(learning: PPO, runners, checkpoints), ``legion.sim2real`` (artifacts: export, the edge runtime),
``legion.configs`` (Hydra configs, composed and typed), and beside them :mod:`legion.api` (the
library: envs, runners, trained runs), :mod:`legion.commands` (train, play) and :mod:`legion.cli`
(the ``legion`` command).

Importing ``legion`` imports nothing else: the edge runtime (``legion.sim2real.deploy``) runs
with numpy and onnxruntime only. What every long-running command shares lives here: the process's
settings (:func:`set_process_env`) and Ctrl-C as a flag (:class:`StopRequests`).
"""

from __future__ import annotations

import os
import signal
import threading

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it)

PROCESS_ENV = {
    # MKL's conditional numerical reproducibility, strict: a matrix product's result does not depend
    # on how many threads compute it, so PPO's update on 2 cores gives the weights of 1 bit for bit
    # (without it MKL splits the sums on some CPUs, AVX-512 Intel ones among them). MKL reads it at
    # its first call: a program that computes with torch before importing legion sets it itself.
    "MKL_CBWR": "AUTO,STRICT",
    # Offscreen OpenGL for MuJoCo's renderer, bound when mujoco is first imported.
    "MUJOCO_GL": "egl",
    "GIT_PYTHON_REFRESH": "quiet",  # rsl-rl's GitPython, on machines without a git binary
}


def set_process_env() -> None:
    """The process-wide settings in :data:`PROCESS_ENV`, where the environment does not set them
    already; the ``legion`` command and :func:`legion.api.setup_process` call it first."""
    for key, value in PROCESS_ENV.items():
        os.environ.setdefault(key, value)


class Interrupted(KeyboardInterrupt):
    """Stopped on Ctrl-C (SIGINT) or SIGTERM, cleanly (training: after writing a checkpoint).

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


class StopRequests:
    """Ctrl-C and SIGTERM (e.g. a cluster preempting a job) as a flag, for every loop that runs
    until stopped: training, the live viewer, the control loop on a robot, the robot bridge.

    The handlers only set ``event``; the loop checks it at a point of its own choosing (between
    env steps, between control ticks) and stops cleanly. Why not Python's KeyboardInterrupt:
    Python raises it in whatever Python code the main thread runs when it handles the signal, and
    when that code is a finalizer the garbage collector runs (a ``__del__``, a generator being
    closed), Python reports "Exception ignored" and drops it. That is how one Ctrl-C went missing
    and a continuous training run kept writing snapshots for 31 minutes. A flag cannot be lost.
    A second Ctrl-C raises KeyboardInterrupt at once, for a loop that does not come back to check.

    Handlers are installed only in the main thread (Python delivers signals there only). Nested
    requests may share one event: the inner one's handlers serve while it is entered.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, event: threading.Event | None = None):
        self.event = event if event is not None else threading.Event()
        self.signal_name: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.event.is_set() and signum == signal.SIGINT and self.signal_name is not None:
            raise KeyboardInterrupt  # asked twice
        self.signal_name = signal.Signals(signum).name
        self.event.set()

    def __enter__(self) -> StopRequests:
        self.signal_name = None
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def raise_if_requested(self) -> None:
        if self.signal_name is not None:
            raise Interrupted(self.signal_name)
