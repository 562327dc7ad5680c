"""`legion dataset convert`: trajectory files to LeRobot datasets, robot logs to trajectory files."""

from __future__ import annotations

from pathlib import Path

from legion.commands import UsageError, file_args, flag

HELP = """usage: legion dataset convert <input> format=lerobot|hdf5 [out=PATH] [run=<run folder>] [video=true]

  format=lerobot   <input> is a trajectory file (.h5): write a LeRobot v3.0 dataset folder
                   (default out: <file stem>_lerobot/): meta/info.json, meta/stats.json,
                   meta/tasks.parquet, meta/episodes/..., data/chunk-000/file-000.parquet;
                   video=true renders the episodes into videos/observation.images.tracking/...mp4
  format=hdf5      <input> is a robot log (a folder of episode_*.npz written by the edge runtime's
                   TrajectoryLog, or one file): write a trajectory file (default out:
                   <input>.h5). run= names the run the robot's policy was exported from (its
                   config hash is checked); `legion replay` then drives the simulator with it.
  overwrite=true   replace an existing output (never replaced otherwise)
"""


def run(args: list[str]) -> None:
    if not args or args[0] in ("-h", "--help") or any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    if args[0] != "convert":
        raise UsageError(f"unknown dataset command '{args[0]}'\n\n{HELP}")
    path, options = file_args(args[1:], HELP, {"format": None, "out": None, "run": None, "video": "false",
                                                        "overwrite": "false"})
    overwrite = flag("overwrite", options["overwrite"])
    if options["format"] == "lerobot":
        from legion.sim2real.trajectories.lerobot import to_lerobot

        out = Path(options["out"]) if options["out"] else path.with_name(path.stem + "_lerobot")
        to_lerobot(path, out, video=flag("video", options["video"]), overwrite=overwrite)
    elif options["format"] == "hdf5":
        from legion.sim2real.trajectories.record import convert_robot_log

        if not options["run"]:
            raise UsageError("format=hdf5 needs run=<run folder>: the run the robot's policy was exported from.")
        out = Path(options["out"]) if options["out"] else path.with_suffix(".h5") if path.is_file() \
            else path.with_name(path.name + ".h5")
        convert_robot_log(path, Path(options["run"]), out, overwrite)
    else:
        raise UsageError(f"format={options['format']}: choose format=lerobot (a trajectory file -> LeRobot v3) "
                         "or format=hdf5 (a robot log -> a trajectory file).")
    print(f"[legion] wrote {out}")
