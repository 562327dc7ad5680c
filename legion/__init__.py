"""legion-rl: robot policies trained on thousands of parallel Newton worlds, exported to ONNX.

One namespace over the repository's top-level folders, each linked from here (``legion/tasks``
is ``../tasks``): ``legion.tasks`` (experience: the simulation, envs, terms), ``legion.agents``
(learning: PPO, runners, checkpoints), ``legion.sim2real`` (artifacts: export, the edge runtime),
``legion.configs`` (Hydra configs, composed and typed), and beside them :mod:`legion.api` (the
library: envs, runners, trained runs), :mod:`legion.commands` (train, play) and :mod:`legion.cli`
(the ``legion`` command).

Importing ``legion`` imports nothing else: the edge runtime (``legion.sim2real.deploy``) runs
with numpy and onnxruntime only.
"""

import os

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
