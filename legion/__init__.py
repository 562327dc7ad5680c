"""legion-rl: robot policies trained on thousands of parallel Newton worlds, exported to ONNX.

One namespace over the repository's top-level folders: ``legion.tasks`` (experience: the
simulation, envs, terms), ``legion.agents`` (learning: PPO, runners, checkpoints),
``legion.sim2real`` (artifacts: export, the edge runtime), ``legion.configs`` (Hydra), and
:mod:`legion.runs`, the library the ``legion`` command (:mod:`legion.cli`) is built on.

Importing ``legion`` imports nothing else: the edge runtime (``legion.sim2real.deploy``) runs
with numpy and onnxruntime only.
"""

from pathlib import Path as _Path

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it)

# Installed (pip install, editable or not), setuptools maps the folders into this package. A
# checkout used without installing (PYTHONPATH=<checkout>, e.g. on a machine with no package
# index) finds them beside this folder.
_checkout = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "tasks").exists() and (_checkout / "pyproject.toml").is_file() \
        and (_checkout / "tasks" / "__init__.py").is_file():
    __path__.append(str(_checkout))
