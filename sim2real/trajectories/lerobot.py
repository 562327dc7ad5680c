"""``legion dataset convert <file.h5> format=lerobot``: a trajectory file as a LeRobot v3.0 dataset.

Written with pyarrow alone (the ``lerobot`` package pins torch<2.11; it is not needed to write, or
to be here). The layout is LeRobot's codebase version 3.0 (``lerobot/datasets/utils.py``,
``lerobot_dataset.py`` of lerobot 0.4)::

    meta/info.json                          fps, features, totals, path templates
    meta/stats.json                         per feature: min, max, mean, std, count, q01 ... q99
    meta/tasks.parquet                      task string (the index) -> task_index
    meta/episodes/chunk-000/file-000.parquet  one row per episode: its length, data/video file
                                            and index ranges, per-episode stats
    data/chunk-000/file-000.parquet         one row per frame
    videos/observation.images.tracking/chunk-000/file-000.mp4   (video=true) H.264, every episode

Features of a frame: ``observation.state`` (the robot's root pose and velocity, world frame, then
joint positions and velocities), ``observation.environment_state`` (free objects' poses, if any),
``observation.<group>`` per observation group (what the policy / critic saw), ``observation.command``
(if the task has one), ``action``, ``next.reward`` (simulator recordings), ``next.done``, plus
LeRobot's ``timestamp``, ``frame_index``, ``episode_index``, ``index``, ``task_index``. Every vector
feature lists its element names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from legion.sim2real.trajectories.file import Episode, TrajectoryFile, TrajectoryFileError

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk folder
DATA_FILE_SIZE_IN_MB = 100  # a data file is closed once it holds this much
VIDEO_FILE_SIZE_IN_MB = 200
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
CAMERA = "observation.images.tracking"
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
ROOT_NAMES = {"root_pose_w": ["x", "y", "z", "qx", "qy", "qz", "qw"],
              "root_vel_w": ["vx", "vy", "vz", "wx", "wy", "wz"]}


def frame_features(f: TrajectoryFile, episode: Episode) -> dict[str, tuple[dict, np.ndarray]]:
    """LeRobot features of one episode's frames: name -> (feature spec, values (T, D))."""
    joints, layout, action = _joint_names(f), f.attrs["observation_layout"], f.attrs.get("action")
    # JSON-decoded attributes, as the recorder writes them (legion.sim2real.trajectories.record)
    assert isinstance(layout, dict) and (action is None or isinstance(action, dict))
    states = episode.group("states")
    parts, names = [], []
    for view in ("root_pose_w", "root_vel_w"):
        if f"robot/{view}" in states:
            parts.append(states[f"robot/{view}"])
            names += [f"base.{n}" for n in ROOT_NAMES[view]]
    parts += [states["robot/joint_pos"], states["robot/joint_vel"]]
    names += [f"{j}.pos" for j in joints] + [f"{j}.vel" for j in joints]
    columns = {"observation.state": (names, np.concatenate(parts, axis=1))}
    objects = sorted({key.split("/")[0] for key in states
                      if key.endswith("/root_pose_w") and key != "robot/root_pose_w"})
    if objects:
        columns["observation.environment_state"] = (
            [f"{o}.{n}" for o in objects for n in ROOT_NAMES["root_pose_w"]],
            np.concatenate([states[f"{o}/root_pose_w"] for o in objects], axis=1))
    for group, terms in layout.items():
        values = [episode.data[f"obs/{group}/{t['name']}"] for t in terms]
        columns[f"observation.{group}"] = ([f"{t['name']}.{k}" for t in terms for k in range(t["size"])],
                                           np.concatenate(values, axis=1))
    if "commands" in episode.data:
        columns["observation.command"] = (["v_x", "v_y", "yaw_rate"], episode.data["commands"])
    actions = episode.data["actions"]
    named = list(action["joints"]) if action else joints  # a joint-space action: one per joint
    columns["action"] = (named if len(named) == actions.shape[1] else [f"action.{k}" for k in range(actions.shape[1])],
                         actions)
    features = {key: ({"dtype": "float32", "shape": [values.shape[1]], "names": names},
                      values.astype(np.float32)) for key, (names, values) in columns.items()}
    if "rewards" in episode.data:
        features["next.reward"] = ({"dtype": "float32", "shape": [1], "names": None},
                                   episode.data["rewards"].astype(np.float32)[:, None])
    features["next.done"] = ({"dtype": "bool", "shape": [1], "names": None},
                             episode.data["dones"].astype(bool)[:, None])
    return features


def read_policy_demos(root: str | Path) -> dict:
    """What learning from demonstrations needs from a LeRobot dataset that ``legion dataset
    convert`` wrote: ``task``, the robot's ``joints``, the policy observation ``terms`` ((name,
    size) in order) and per frame ``observations`` (N, D) and ``actions`` (N, A), float32."""
    root = Path(root)
    info = json.loads((root / "meta" / "info.json").read_text())
    features = info["features"]
    if "observation.policy" not in features:
        raise TrajectoryFileError(f"{root}: a LeRobot dataset without observation.policy (what the policy saw): "
                                  "convert a legion recording with legion dataset convert.")
    terms: dict[str, int] = {}
    for name in features["observation.policy"]["names"]:
        term = name.rpartition(".")[0]
        terms[term] = terms.get(term, 0) + 1
    tasks = pq.read_table(root / "meta" / "tasks.parquet").column("__index_level_0__").to_pylist()
    state = features["observation.state"]["names"]
    joints = [n[:-len(".pos")] for n in state if n.endswith(".pos")]
    table = pa.concat_tables([pq.read_table(p, columns=["observation.policy", "action"])
                              for p in sorted((root / "data").rglob("*.parquet"))])
    stack = lambda column: np.asarray(table.column(column).to_pylist(), np.float32)  # noqa: E731
    return {"task": tasks[0] if len(tasks) == 1 else tasks, "joints": joints, "terms": list(terms.items()),
            "observations": stack("observation.policy"), "actions": stack("action")}


def _joint_names(f: TrajectoryFile) -> list[str]:
    names = f.attrs["joint_names"]
    assert isinstance(names, list), "a JSON list in every trajectory file"
    return names


def _column(values: np.ndarray, dtype: str) -> pa.Array:
    """A scalar column for shape (1,) features, a fixed-size list column (``datasets.Sequence``) otherwise."""
    kind = {"float32": pa.float32(), "int64": pa.int64(), "bool": pa.bool_()}[dtype]
    if values.ndim == 1 or values.shape[1] == 1:
        return pa.array(values.reshape(-1), type=kind)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=kind), values.shape[1])


def feature_stats(values: np.ndarray, axis=0, keepdims: bool = False) -> dict[str, np.ndarray]:
    """LeRobot's per-feature statistics: min, max, mean, std, count and the quantiles q01 ... q99."""
    values = np.asarray(values, np.float64)
    stats = {"min": values.min(axis, keepdims=keepdims), "max": values.max(axis, keepdims=keepdims),
             "mean": values.mean(axis, keepdims=keepdims), "std": values.std(axis, keepdims=keepdims),
             "count": np.array([values.shape[0]])}
    for q in QUANTILES:
        stats[f"q{int(round(q * 100)):02d}"] = np.quantile(values, q, axis=axis, keepdims=keepdims)
    return stats


def aggregate(stats: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Dataset statistics from per-episode ones, as LeRobot aggregates them (count-weighted;
    quantiles: the count-weighted mean of the episodes')."""
    counts = np.array([s["count"][0] for s in stats], np.float64)
    total = counts.sum()
    weights = counts.reshape(-1, *[1] * np.ndim(stats[0]["mean"])) / total
    mean = sum(w * s["mean"] for w, s in zip(weights, stats))
    variance = sum(w * (s["std"] ** 2 + (s["mean"] - mean) ** 2) for w, s in zip(weights, stats))
    out = {"min": np.min([s["min"] for s in stats], 0), "max": np.max([s["max"] for s in stats], 0), "mean": mean,
           "std": np.sqrt(variance), "count": np.array([int(total)])}
    for key in stats[0]:
        if key.startswith("q"):
            out[key] = sum(w * s[key] for w, s in zip(weights, stats))
    return out


def _listed(stats: dict[str, np.ndarray]) -> dict:
    return {key: np.asarray(value).tolist() for key, value in stats.items()}


def _tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet`` as pandas writes ``DataFrame({"task_index": ...}, index=tasks)`` (LeRobot
    reads it with pandas and takes the task string from the index)."""
    pandas = {"index_columns": ["__index_level_0__"],
              "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                                  "metadata": {"encoding": "UTF-8"}}],
              "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                           "numpy_type": "int64", "metadata": None},
                          {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode",
                           "numpy_type": "object", "metadata": None}],
              "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__},
              "pandas_version": "2.2.0"}
    schema = pa.schema([("task_index", pa.int64()), ("__index_level_0__", pa.string())],
                       metadata={b"pandas": json.dumps(pandas).encode()})
    return pa.table({"task_index": list(range(len(tasks))), "__index_level_0__": tasks}, schema=schema)


def to_lerobot(path: str | Path, out: str | Path, video: bool = False, size: tuple[int, int] = (480, 640),
               overwrite: bool = False) -> Path:
    """Converts the trajectory file ``path`` into a LeRobot v3.0 dataset folder ``out``; with
    ``video`` the episodes are rendered (camera tracking the robot, ``size`` = (height, width)) into
    MP4. The folder appears under its name only when complete. Returns ``out``."""
    path, out = Path(path), Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise TrajectoryFileError(f"{out} exists and is not empty; choose another out= or pass overwrite=true.")
        if not (out / "meta" / "info.json").is_file():
            raise TrajectoryFileError(f"{out} is not a LeRobot dataset (no meta/info.json): refusing to replace it.")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with TrajectoryFile(path) as f:
        control_dt = float(f.attrs["control_dt"])
        fps = 1.0 / control_dt
        if abs(fps - round(fps)) > 1e-6:
            raise TrajectoryFileError(f"LeRobot datasets need a whole number of frames per second; the control dt "
                                      f"{control_dt:g} s is {fps:.4g} Hz.")
        fps = int(round(fps))
        task = f.attrs["task"]
        renderer = None
        if video:
            from legion.sim2real.trajectories import media

            renderer = media.SceneRenderer(f.config, *size)
        try:
            _write(f, partial, fps, task, renderer, size)
        finally:
            if renderer is not None:
                renderer.close()
    if out.exists():
        shutil.rmtree(out)
    partial.replace(out)
    return out


def _write(f: TrajectoryFile, root: Path, fps: int, task: str, renderer, size) -> None:
    features, episodes, all_stats = None, [], []
    chunk = file = 0
    writer = video = None
    video_frames = writer_bytes = 0
    for episode_index, name in enumerate(f.episodes):
        episode = f.episode(name)
        columns = frame_features(f, episode)
        length = episode.length
        if features is None:
            features = {key: spec for key, (spec, _) in columns.items()}
            if renderer is not None:
                features[CAMERA] = {"dtype": "video", "shape": [size[0], size[1], 3],
                                    "names": ["height", "width", "channels"],
                                    "info": {"video.height": size[0], "video.width": size[1], "video.codec": "h264",
                                             "video.pix_fmt": "yuv420p", "video.is_depth_map": False,
                                             "video.fps": fps, "video.channels": 3, "has_audio": False}}
            features.update(DEFAULT_FEATURES)
        frame_index = np.arange(length)
        start = sum(e["length"] for e in episodes)
        frames: dict[str, np.ndarray] = {key: values for key, (_, values) in columns.items()}
        frames.update({"timestamp": (frame_index / fps).astype(np.float32), "frame_index": frame_index,
                       "episode_index": np.full(length, episode_index), "index": start + frame_index,
                       "task_index": np.zeros(length, np.int64)})
        table = pa.table({key: _column(np.asarray(values), features[key]["dtype"]) for key, values in frames.items()})
        if writer is not None and writer_bytes + table.nbytes > DATA_FILE_SIZE_IN_MB * 2**20:
            writer.close()
            if video is not None:
                video.close()
                video = None
            file += 1
            chunk, file = (chunk + 1, 0) if file == CHUNKS_SIZE else (chunk, file)
            writer = None
        if writer is None:
            data_path = root / DATA_PATH.format(chunk_index=chunk, file_index=file)
            data_path.parent.mkdir(parents=True, exist_ok=True)
            writer, writer_bytes = pq.ParquetWriter(data_path, table.schema, compression="snappy"), 0
        writer.write_table(table)
        writer_bytes += table.nbytes
        stats = {key: feature_stats(np.asarray(values, np.float64).reshape(length, -1) if values.ndim > 1
                                    else np.asarray(values, np.float64)[:, None])
                 for key, values in frames.items()}
        row = {"episode_index": episode_index, "tasks": [task], "length": length,
               "data/chunk_index": chunk, "data/file_index": file,
               "dataset_from_index": start, "dataset_to_index": start + length}
        if renderer is not None:
            if video is None:
                video, video_frames = _video_writer(root / VIDEO_PATH.format(video_key=CAMERA, chunk_index=chunk,
                                                                             file_index=file), fps), 0
            pixels = _render(renderer, episode, _joint_names(f), video)
            stats[CAMERA] = {k: (v if k == "count" else v[:, None, None] / 255.0)
                             for k, v in feature_stats(pixels.reshape(-1, 3)).items()}
            stats[CAMERA]["count"] = np.array([length])
            row.update({f"videos/{CAMERA}/chunk_index": chunk, f"videos/{CAMERA}/file_index": file,
                        f"videos/{CAMERA}/from_timestamp": video_frames / fps,
                        f"videos/{CAMERA}/to_timestamp": (video_frames + length) / fps})
            video_frames += length
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        row.update({f"stats/{key}/{stat}": np.asarray(value).tolist() for key, s in stats.items()
                    for stat, value in s.items()})
        episodes.append(row)
        all_stats.append(stats)
    if writer is not None:
        writer.close()
    if video is not None:
        video.close()
    total = sum(e["length"] for e in episodes)
    info = {"codebase_version": CODEBASE_VERSION, "robot_type": Path(f.attrs["robot_file"]).stem,
            "total_episodes": len(episodes), "total_frames": total, "total_tasks": 1, "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILE_SIZE_IN_MB, "video_files_size_in_mb": VIDEO_FILE_SIZE_IN_MB,
            "fps": fps, "splits": {"train": f"0:{len(episodes)}"}, "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if renderer is not None else None, "features": features}
    meta = root / "meta"
    (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(episodes), root / EPISODES_PATH)
    pq.write_table(_tasks_table([task]), meta / "tasks.parquet")
    stats = {key: _listed(aggregate([s[key] for s in all_stats])) for key in all_stats[0]}
    (meta / "stats.json").write_text(json.dumps(stats, indent=4))
    (meta / "info.json").write_text(json.dumps(info, indent=4))


def _video_writer(path: Path, fps: int):
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    return imageio.get_writer(str(path), fps=fps, codec="libx264", pixelformat="yuv420p", macro_block_size=2,
                              ffmpeg_log_level="error")


def _render(renderer, episode: Episode, joint_names: list[str], video) -> np.ndarray:
    """Renders each state of the episode into ``video``; returns a sample of the frames (K, H, W, 3)
    for the statistics."""
    from legion.sim2real.trajectories.media import episode_frames

    sample = []
    every = max(1, episode.length // 50)
    for t, state in enumerate(episode_frames(episode)):
        frame = renderer.render(state, joint_names)
        video.append_data(frame)
        if t % every == 0:
            sample.append(frame)
    return np.stack(sample).astype(np.float64)
