"""`legion record`: episodes of a trained or scripted policy into a trajectory file (HDF5)."""

from __future__ import annotations

from pathlib import Path

from legion.commands import RecordedEpisodes, flag, number, run_args

HELP = """usage: legion record run=<run folder> [episodes=10] [out=FILE.h5] [checkpoint=PATH]
                     [video=true] [key=value ...]
       legion record policy=scripted:<module>:<function> task=<task> [episodes=10] [out=FILE.h5] [key=value ...]

Runs the run's policy (deterministic, observation noise off) and records the first `episodes`
episodes to start (short failed episodes are not favoured) into an HDF5 trajectory file in
robomimic's layout (default out: <run>/trajectories/<date>.h5): per step the actions, the
applied joint targets, every observation term, rewards per term, dones, and the state (joint
positions and velocities, root and object poses and velocities); per episode the initial state
and the physical parameters it ran with; the resolved config, seed, robot model hash and versions.
`legion replay` reproduces it bit for bit on CPU.

  episodes=N       how many episodes (default 10); sim.num_envs defaults to min(N, 16)
  video=true       also render each episode to <out stem>_videos/demo_<k>.mp4
  overwrite=true   replace an existing file (never replaced otherwise)
  policy=scripted:<module>:<function>
                   record a scripted policy instead of a run's: <function>(env) returns it, e.g. the
                   arm_lift expert: policy=scripted:legion.tasks.manipulation.expert:lift task=arm_lift_ik
                   (default out: trajectories/<task>_<date>.h5)
Config keys can be overridden as in `legion play` (e.g. task.events.push.enabled=false).
"""


def run(args: list[str]) -> None:
    from datetime import datetime

    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    from legion.api import setup_process
    from legion.sim2real.trajectories.record import record_run, record_scripted

    setup_process()  # before mujoco is imported (video=true: the offscreen OpenGL backend)
    if any(a.startswith("policy=") for a in args):
        options = {"policy": None, "episodes": "10", "out": None, "video": "false", "overwrite": "false"}
        overrides = [a for a in args if a.partition("=")[0] not in options]
        for key, _, value in (a.partition("=") for a in args):
            if key in options:
                options[key] = value
        episodes = number("episodes", options["episodes"])
        task = next((o.split("=", 1)[1] for o in overrides if o.startswith("task=")), "task")
        out = Path(options["out"] or f"trajectories/{task}_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}.h5")
        video_dir = out.with_name(out.stem + "_videos") if flag("video", options["video"]) else None
        print(f"[legion] recording {episodes} episodes of {options['policy']} into {out}", flush=True)
        overwrite, printed = flag("overwrite", options["overwrite"]), RecordedEpisodes()
        record_scripted(options["policy"], episodes, out, video_dir, overrides, overwrite, on_episode=printed)
        print(f"[legion] wrote {out}" + (f" and {video_dir}" if video_dir else "") + printed.summary(), flush=True)
        return
    run, options, overrides = run_args(args, HELP, {"checkpoint": None, "episodes": "10", "out": None,
                                                                 "video": "false", "overwrite": "false"})
    episodes = number("episodes", options["episodes"])
    video, overwrite = flag("video", options["video"]), flag("overwrite", options["overwrite"])
    out = Path(options["out"]) if options["out"] else \
        run / "trajectories" / f"{datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}.h5"
    video_dir = out.with_name(out.stem + "_videos") if video else None
    print(f"[legion] recording {episodes} episodes of {run} into {out}", flush=True)
    printed = RecordedEpisodes()
    record_run(run, episodes, out, video_dir, options["checkpoint"], overrides, overwrite, on_episode=printed)
    print(f"[legion] wrote {out}" + (f" and {video_dir}" if video else "") + printed.summary(), flush=True)
