"""The trajectory file: HDF5 in robomimic's layout, written one episode at a time, read with checks.

See the package docstring (:mod:`legion.sim2real.trajectories`) for the layout. Writing goes to
``<file>.partial`` and becomes ``<file>`` when the writer closes, so a file under its own name is
always complete; an existing file is never replaced unless asked. Every dataset is chunked,
gzip-compressed and carries a Fletcher-32 checksum, so damage is found when it is read, named by
the dataset it hit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

FORMAT_VERSION = 1
SOURCES = ("sim", "robot")  # a simulator recording, or a converted robot log
REQUIRED = ("actions", "dones", "states")  # what every episode holds (besides initial_state)


class TrajectoryFileError(ValueError):
    """A trajectory file cannot be used as it is; the message names the problem and the fix."""


@dataclass
class Episode:
    """One episode of T steps: ``data`` maps a dataset path inside the episode's group
    (``"actions"``, ``"obs/policy/joint_vel"``, ``"states/robot/joint_pos"``, ...) to its array,
    first axis time unless it is ``initial_state/...`` or ``params/...``; ``attrs`` are its scalar
    attributes (``num_samples`` is set on writing)."""

    data: dict[str, np.ndarray]
    attrs: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.data["actions"])

    def group(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays under ``prefix/`` (e.g. ``"states"``), keyed by the rest of their path."""
        start = prefix.rstrip("/") + "/"
        return {key[len(start):]: value for key, value in self.data.items() if key.startswith(start)}


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def refuse_existing(path: Path, overwrite: bool, option: str = "out", file: bool = False) -> None:
    """An existing output is an error unless ``overwrite``: nothing is replaced silently. A ``file``
    output that is a folder is an error either way: a file cannot replace it."""
    if file and path.is_dir():
        raise TrajectoryFileError(f"{path} is a folder, not a trajectory file: name the file to write "
                                  f"(e.g. {path / 'demos.h5'}).")
    if path.exists() and not overwrite:
        raise TrajectoryFileError(f"{path} exists; choose another {option}= or pass overwrite=true to replace it.")


class TrajectoryWriter:
    """Streams episodes into a new trajectory file.

    Args:
        path: the file to write (``.h5``). It appears under this name only when the writer closes.
        attrs: the file's attributes (``/data``): JSON-able values; dicts and lists are stored as
            JSON strings. Must hold ``source`` (``"sim"`` or ``"robot"``) and ``config``.
        overwrite: replace an existing ``path``.

    Memory: the episode being written; each is flushed to disk by :meth:`add`.
    """

    def __init__(self, path: str | Path, attrs: dict, overwrite: bool = False):
        self.path = Path(path)
        refuse_existing(self.path, overwrite, file=True)
        if attrs.get("source") not in SOURCES or "config" not in attrs:
            raise ValueError(f"a trajectory file needs attrs source (one of {SOURCES}) and config")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.file = h5py.File(self.partial, "w")
        self.data = self.file.create_group("data")
        for key, value in {**attrs, "format_version": FORMAT_VERSION, "complete": False}.items():
            self.data.attrs[key] = _attr(value)
        self.episodes = self.samples = 0

    def add(self, episode: Episode) -> None:
        """Writes one episode as ``/data/demo_<k>`` and flushes it."""
        name = f"demo_{self.episodes}"
        group = self.data.create_group(name)
        try:
            for key, value in episode.data.items():
                value = np.asarray(value)  # (ascontiguousarray would make a 0-d value 1-d)
                filters = dict(compression="gzip", compression_opts=4, shuffle=True, fletcher32=True) \
                    if value.ndim else {}
                group.create_dataset(key, data=value, **filters)
            for key, value in {**episode.attrs, "num_samples": episode.length}.items():
                group.attrs[key] = _attr(value)
        except BaseException:
            del self.data[name]  # never leave half an episode
            raise
        self.episodes += 1
        self.samples += episode.length
        self.data.attrs["total"] = self.samples
        self.file.flush()

    def close(self) -> Path:
        """Marks the file complete and gives it its name; returns the path."""
        if self.file.id.valid:
            self.data.attrs["total"] = self.samples
            self.data.attrs["complete"] = True
            self.file.close()
            self.partial.replace(self.path)
        return self.path

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        # Every episode in the file is whole: keep them (also after Ctrl-C), unless nothing was written.
        if kind is not None and not self.episodes:
            self.file.close()
            self.partial.unlink(missing_ok=True)
        else:
            self.close()


class TrajectoryFile:
    """A trajectory file opened for reading, checked before anything uses it.

    Raises:
        TrajectoryFileError: not a legion trajectory file, truncated, corrupt, written by an
            interrupted recording, or inconsistent (episode lengths, missing datasets).

    Attributes:
        attrs: the file's attributes, JSON strings decoded.
        episodes: the episode names (``demo_0``, ``demo_1``, ...) in order.
    """

    def __init__(self, path: str | Path):
        self.path = path = Path(path)
        fix = "Record or convert it again (legion record / legion dataset convert)."
        if not path.is_file():
            partial = path.with_name(path.name + ".partial")
            hint = f" ({partial.name} is there: that recording never finished)" if partial.exists() else ""
            raise TrajectoryFileError(f"{path} does not exist{hint}.")
        try:
            self.file = h5py.File(path, "r")
        except OSError as e:
            raise TrajectoryFileError(f"{path} is not a readable HDF5 file "
                                      f"(truncated or corrupt?): {e}. {fix}") from None
        try:
            data = self.file.get("data")
            if not isinstance(data, h5py.Group) or "format_version" not in data.attrs:
                raise TrajectoryFileError(f"{path} is an HDF5 file but not a legion trajectory file "
                                          "(no /data group with a format_version).")
            self.data = data
            self.attrs: dict[str, Any] = {key: _decode(value) for key, value in data.attrs.items()}
            if self.attrs["format_version"] > FORMAT_VERSION:
                raise TrajectoryFileError(f"{path} has format version {self.attrs['format_version']}; this legion-rl "
                                          f"reads up to {FORMAT_VERSION}. Update legion-rl.")
            if not self.attrs.get("complete"):
                raise TrajectoryFileError(f"{path} was not closed by its writer (an interrupted recording). {fix}")
            self.episodes = sorted(data, key=lambda name: int(name.rpartition("_")[2]))
            lengths = [int(data[name].attrs.get("num_samples", -1)) for name in self.episodes]
            if sum(lengths) != self.attrs.get("total"):
                raise TrajectoryFileError(f"{path}: its episodes hold {sum(lengths)} samples, /data says "
                                          f"total={self.attrs.get('total')}: the file was altered. {fix}")
            for name, length in zip(self.episodes, lengths):
                self._check_episode(data[name], name, length)
        except TrajectoryFileError:
            self.file.close()
            raise
        # HDF5 metadata damaged past the superblock: h5py raises RuntimeError where a group's header or
        # B-tree is damaged, TypeError for a damaged attribute's type
        except (OSError, KeyError, ValueError, RuntimeError, TypeError) as e:
            self.file.close()
            raise TrajectoryFileError(f"{path} is corrupt: {e}. {fix}") from None

    def _check_episode(self, group, name: str, length: int) -> None:
        missing = [key for key in REQUIRED if key not in group]
        if missing:
            raise TrajectoryFileError(f"{self.path}: {name} lacks {missing}; every episode holds {list(REQUIRED)}.")
        for key in _datasets(group):
            if key.startswith(("initial_state/", "params/")):
                continue
            if group[key].shape[0] != length:
                raise TrajectoryFileError(f"{self.path}: {name}/{key} has {group[key].shape[0]} steps, the episode "
                                          f"{length} (num_samples): the file was altered or truncated.")

    @property
    def config(self):
        """The recording's config as :class:`legion.configs.schema.Train` (needs the training stack)."""
        return config_of(self.attrs, self.path)

    def episode(self, name: str) -> Episode:
        """An episode's arrays and attributes, read and checksum-verified."""
        group = self.data[name]
        if not isinstance(group, h5py.Group):
            raise TrajectoryFileError(f"{self.path}: data/{name} is not an episode group. Episodes: {self.episodes}")
        data = {}
        for key in _datasets(group):
            dataset = group[key]
            assert isinstance(dataset, h5py.Dataset)  # _datasets lists datasets only
            try:
                data[key] = dataset[()]
            except (OSError, ValueError) as e:  # a chunk that fails its checksum; a damaged datatype
                raise TrajectoryFileError(f"{self.path}: data/{name}/{key} cannot be read ({e}): the file is "
                                          "corrupt. Record or convert it again.") from None
        return Episode(data, {key: _decode(value) for key, value in group.attrs.items()})

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> TrajectoryFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def config_of(attrs: dict, path: str | Path = "the trajectory file"):
    """The config stored in a trajectory file's attributes, as :class:`legion.configs.schema.Train`;
    TrajectoryFileError where it cannot be read."""
    from omegaconf import OmegaConf

    from legion.configs import typed

    try:
        return typed(OmegaConf.create(attrs["config"]))
    except Exception as e:  # YAML that does not parse, keys or values the schema refuses
        raise TrajectoryFileError(f"{path}: the config it was recorded with cannot be read ("
                                  f"{str(e).strip().splitlines()[0]}): the file is corrupt or was altered. Record or "
                                  "convert it again.") from None


def _datasets(group) -> list[str]:
    names = []
    group.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    damaged = [name for name in names if not isinstance(name, str)]  # h5py gives bytes for a name not UTF-8
    if damaged:
        raise ValueError(f"dataset names that are not UTF-8: {damaged}")
    return names


def _attr(value):
    """HDF5 attributes hold numbers, strings and arrays; dicts and lists go in as JSON."""
    return json.dumps(value) if isinstance(value, (dict, list, tuple)) or value is None else value


def _decode(value) -> Any:
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and (value[:1] in "[{" or value == "null"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, np.generic):
        return value.item()
    return value
