"""`legion replay`: a trajectory file (a recording or a robot log) replayed in the simulator."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from legion.commands import UsageError, file_args, flag, number, viewer

if TYPE_CHECKING:
    from legion.sim2real.trajectories.replay import ReplayResult
    from legion.viewer import ReplayView

HELP = """usage: legion replay <file.h5> [mode=actions|states] [episodes=0,2] [video=true] [plots=true]
                     [viewer=web] [html=true] [out=DIR] [device=DEV]

Replays the episodes of a trajectory file (all, or episodes=i,j,...) in the simulator, each in its
own world, and prints how far the replay is from the file.

  mode=actions     (default) a recording: reset to its initial state and physical parameters
                   (friction, masses, gains, gravity, actuator delay), apply the recorded actions
                   (and pushes), compare every state; bit-exact on CPU with the same versions,
                   the divergence is reported otherwise (e.g. on a GPU: device=cuda:0).
                   A robot log (legion dataset convert ... format=hdf5): drive the simulator with
                   the logged joint targets from the logged initial state; error per joint.
  mode=states      set the recorded states frame by frame (viewing)
  video=true       an MP4 per episode of the replayed motion (camera tracking the robot)
  plots=true       PNGs per episode: joint positions vs targets, commanded vs actual base
                   velocity, reward terms; robot logs: simulated vs logged, error per joint
  viewer=web       watch the replay live in the browser (as legion play viewer=web; host=, port=),
                   at real time; the view stays open on the last frame until Ctrl-C
  html=true        <out>/replay.html: the first replayed episode as one self-contained HTML file
                   that opens from disk in a browser, no server (timeline, orbit, zoom)
  out=DIR          where video, plots, replay.html and replay.json go (default <file>_replay/)
  overwrite=true   write into an existing, non-empty out folder
"""


def run(args: list[str]) -> None:
    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    path, options = file_args(args, HELP, {"mode": "actions", "episodes": None, "video": "false",
                                                   "plots": "false", "out": None, "device": None, "overwrite": "false",
                                                   "viewer": "none", "html": "false", "host": "127.0.0.1",
                                                   "port": "8080"})
    if options["mode"] not in ("actions", "states"):
        raise UsageError(f"mode={options['mode']}: choose mode=actions or mode=states.")
    episodes = None if options["episodes"] is None else \
        [number("episodes", e) for e in options["episodes"].split(",") if e]
    video, plots = flag("video", options["video"]), flag("plots", options["plots"])
    live, html = viewer(options), flag("html", options["html"])
    from legion.api import setup_process
    from legion.viewer import ReplayView

    setup_process()
    view = ReplayView(live, html, options["host"], number("port", options["port"]), f"legion-rl: {path.name}") \
        if live or html else None
    try:
        result, written = replay_and_write(path, options["mode"], episodes, options["device"], video, plots,
                                           options["out"], flag("overwrite", options["overwrite"]), view)
    except BaseException as e:  # the viewer's server goes with the replay (a recording's stopped in finish())
        if view is not None:
            view.close()
        if isinstance(e, KeyboardInterrupt):
            print("\n[legion] replay stopped", flush=True)
            return
        raise
    print(result.report())
    if written:
        print(f"[legion] wrote {len(written)} files into {written[0].parent}")
    if view is not None and live:
        print("[legion] the replay ended; the viewer shows its last frame until Ctrl-C", flush=True)
        view.serve_until_stopped()


def replay_and_write(path: Path, mode: str, episodes, device, video: bool, plots: bool, out: Path | None,
                     overwrite: bool, view: ReplayView | None = None) -> tuple[ReplayResult, list[Path]]:
    """``legion replay`` as a function: replay (drawn by ``view``: a live viewer, an HTML file),
    then the outputs (default folder ``<file>_replay/``)."""
    from legion.sim2real.trajectories.file import refuse_existing
    from legion.sim2real.trajectories.replay import replay, write_outputs

    path = Path(path)
    out = Path(out) if out else path.with_name(path.stem + "_replay")
    if (video or plots or (view and view.html)) and out.exists() and any(out.iterdir()) and not overwrite:
        refuse_existing(out, overwrite)  # before the replay runs: fail fast
    if view is not None:
        view.out = out
    result = replay(path, mode, episodes, device, view)
    written = view.finish() if view is not None else []
    if video or plots:
        written += write_outputs(result, out, video, plots, overwrite=True)
    return result, written
