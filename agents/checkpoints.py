"""Checkpoints: written atomically, verified on load, loadable on any device, pruned as training runs.

A checkpoint ``model_<iteration>.pt`` is a dict: ``policy`` (networks with their normalizers,
optimizer, learning rate), ``iteration``, ``rng`` (torch CPU, CUDA, numpy, Python and the env's
generator, all as CPU tensors or plain data), ``env`` (the env's state: randomization ranges,
curriculum) and ``sha256``, the checksum of everything else, so a file damaged after it was
written is recognized on load. All tensors are stored on the CPU side of ``torch.load``'s
``map_location="cpu"``: a run trained on ``cuda:0`` loads on a CPU-only machine and vice versa.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import warnings
from pathlib import Path

import torch

from legion.agents.ppo import map_tensors


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message says why and what to do."""


def checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's ``model_<iteration>.pt`` files, oldest iteration first."""
    found = [p for p in Path(run_dir).glob("model_*.pt") if p.stem.split("_", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.stem.split("_", 1)[1]))


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest ``model_<it>.pt`` in a run folder (not checked; see :func:`latest_good_checkpoint`)."""
    found = checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"No checkpoint (model_<iteration>.pt) in {run_dir}. Train first: legion train ...")
    return found[-1]


def latest_good_checkpoint(run_dir: str | Path) -> tuple[Path, dict]:
    """The newest checkpoint that loads and passes its checksum, with its contents. Each newer,
    damaged one is skipped with a warning naming it (it is left in place for inspection)."""
    found = checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"No checkpoint (model_<iteration>.pt) in {run_dir}. Train first: legion train ...")
    bad = []
    for path in reversed(found):
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointError as e:
            bad.append(path.name)
            warnings.warn(f"{e} Falling back to an earlier checkpoint.", stacklevel=2)
            continue
        return path, checkpoint
    raise CheckpointError(f"Every checkpoint in {run_dir} is damaged ({', '.join(bad)}); the run cannot continue. "
                          "Start a new run, or train from one of them with legion train resume=<run> checkpoint=<file> "
                          "after repairing it.")


def _digest(payload: dict) -> str:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def save_checkpoint(checkpoint: dict, path: Path) -> None:
    """Writes ``checkpoint`` (tensors moved to the CPU) with its checksum to a temporary file in the
    same folder, then renames it: a reader never sees a half-written file, and a crash leaves the
    previous one intact."""
    body = map_tensors({k: v for k, v in checkpoint.items() if k != "sha256"}, lambda t: t.detach().cpu())
    data = io.BytesIO()
    torch.save({**body, "sha256": _digest(body)}, data)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint's contents, every tensor on the CPU; raises :class:`CheckpointError` if the file is
    unreadable, not a legion-rl checkpoint, or fails its checksum."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise CheckpointError(f"Checkpoint {path} is unreadable ({e.__class__.__name__}: {e}). "
                              "Use an earlier model_<it>.pt from the same run folder.") from e
    if not isinstance(checkpoint, dict) or "policy" not in checkpoint or "iteration" not in checkpoint:
        raise CheckpointError(f"{path} is not a legion-rl checkpoint (missing 'policy'/'iteration').")
    expected = checkpoint.pop("sha256", None)
    if expected is not None and _digest(checkpoint) != expected:
        raise CheckpointError(f"Checkpoint {path} fails its checksum: it was changed or damaged after it was written. "
                              "Use an earlier model_<it>.pt from the same run folder.")
    return checkpoint


def prune(run_dir: Path, keep_last: int | None, keep_every: int | None) -> list[Path]:
    """Deletes all but the newest ``keep_last`` checkpoints (``None``: keep all), sparing every
    ``keep_every``-th iteration. Returns the deleted files."""
    if keep_last is None:
        return []
    found = checkpoints(run_dir)
    old = found[:-keep_last] if keep_last > 0 else found
    doomed = [p for p in old if not (keep_every and int(p.stem.split("_", 1)[1]) % keep_every == 0)]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def rng_states(env=None) -> dict:
    """Every random generator's state as CPU data: torch (CPU and each CUDA device), numpy, Python, env."""
    import random

    import numpy as np

    return {
        "torch": torch.get_rng_state(),
        "cuda": [s.cpu() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "env": env.generator.get_state().cpu() if env is not None and hasattr(env, "generator") else None,
    }


def set_rng_states(rng: dict | None, env=None) -> list[str]:
    """Restores what :func:`rng_states` saved, on whatever device the env runs now. Returns the
    generators it could not restore (a checkpoint from an older version, or from another number
    of CUDA devices), which keep their current state."""
    import random

    import numpy as np

    if not rng:
        return ["torch", "cuda", "numpy", "python", "env"]
    skipped = []
    torch.set_rng_state(rng["torch"].cpu())
    cuda = rng.get("cuda")
    if torch.cuda.is_available():
        if cuda is not None and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
        else:
            skipped.append("cuda")
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if env is not None and hasattr(env, "generator"):
        if rng.get("env") is not None:
            try:
                env.generator.set_state(rng["env"].cpu())  # a generator takes its state as a CPU byte tensor
            except RuntimeError:  # a CUDA generator's state does not fit a CPU one, and vice versa
                skipped.append("env")
        else:
            skipped.append("env")
    return skipped
