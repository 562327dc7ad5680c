"""`legion play`: a trained policy on its task: episodes printed, recorded, rendered, or watched live."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from legion.api import LoadedRun
from legion.commands import RecordedEpisodes, flag, number, print_episode, run_args, viewer

HELP = """usage: legion play run=<run folder> [episodes=N] [checkpoint=PATH] [record=FILE]
                   [video=true] [viewer=web [host=127.0.0.1] [port=8080]] [key=value ...]

Loads the run's saved config.yaml and its newest good checkpoint (or `checkpoint=`), runs the
policy deterministically with observation noise off, and prints the return and length of each
finished episode. Any config key can be overridden, e.g. sim.num_envs=4 device=cpu (default
sim.num_envs: 16, or the run's if fewer).

  record=FILE      also record the episodes into a trajectory file (as `legion record`)
  video=true       render each episode to <run>/videos/<date>/demo_<k>.mp4 (MuJoCo offscreen,
                   camera tracking the robot; needs EGL or OSMesa, see the README)
  overwrite=true   replace an existing record= file or video folder
  viewer=web       a live 3-D view in the browser at http://<host>:<port> (printed; runs until
                   Ctrl-C): pause, step, speed; the env the camera follows; the command (sliders, a
                   draggable goal for arm tasks); observation noise, randomization at resets; reset
                   the followed env; reload the newest checkpoint of a run still training
  host=ADDR        where the viewer listens (default 127.0.0.1, this machine only; 0.0.0.0: all)
  port=N           the viewer's port (default 8080)
"""


def run(args: list[str]) -> None:
    from legion import api

    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    run, options, overrides = run_args(args, HELP, {"checkpoint": None, "episodes": "5", "record": None,
                                                               "video": "false", "overwrite": "false",
                                                               "viewer": "none", "host": "127.0.0.1", "port": "8080"})
    episodes = number("episodes", options["episodes"])
    video, overwrite = flag("video", options["video"]), flag("overwrite", options["overwrite"])
    if viewer(options):
        from legion.viewer import watch_policy

        try:
            watch_policy(api.load_run(run, options["checkpoint"], overrides), options["host"],
                         number("port", options["port"]))
        except KeyboardInterrupt:
            print("\n[legion] viewer stopped", flush=True)
        return
    if options["record"] or video:
        from datetime import datetime

        from legion.sim2real.trajectories.record import record_run

        video_dir = run / "videos" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S") if video else None
        out = Path(options["record"]) if options["record"] else None
        print(f"[legion] playing {run} for {episodes} episodes" + (f", recording into {out}" if out else "")
              + (f", videos into {video_dir}" if video else ""), flush=True)
        record_run(run, episodes, out, video_dir, options["checkpoint"], overrides, overwrite,
                   on_episode=RecordedEpisodes())
        return
    loaded = api.load_run(run, options["checkpoint"], overrides)
    print(f"[legion] playing {loaded.checkpoint} on {loaded.env.num_envs} envs of {loaded.cfg.task.name}", flush=True)
    for i, episode in enumerate(play(loaded, episodes)):
        print_episode(i, episode["return"], episode["length"], episode["time_out"])


def play(loaded: LoadedRun, episodes: int) -> Iterator[dict]:
    """Runs the trained policy deterministically (noise off) on the run's env; yields
    ``{"return", "length", "time_out"}`` for each of the first ``episodes`` episodes that finish."""
    import torch

    env = loaded.env
    policy = loaded.runner.policy
    policy.eval()
    obs = env.get_observations()
    returns = torch.zeros(env.num_envs, device=env.device)
    lengths = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
    finished = 0
    with torch.inference_mode():
        while finished < episodes:
            obs, rewards, dones, extras = env.step(policy(obs))
            policy.reset(dones)  # a recurrent policy's state ends with its episode
            returns += rewards
            lengths += 1
            for i in dones.nonzero().squeeze(-1).tolist():
                if finished < episodes:
                    yield {"return": returns[i].item(), "length": int(lengths[i]),
                           "time_out": bool(extras["time_outs"][i])}
                finished += 1
            returns[dones] = 0.0
            lengths[dones] = 0
