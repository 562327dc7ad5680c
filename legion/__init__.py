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

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it)
