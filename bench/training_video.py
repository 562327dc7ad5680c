"""What videos while training cost (``agent.video``): the seconds of one video (an episode of the
current policy in its one-world env, rendered by MuJoCo offscreen and encoded) against the seconds
of one training iteration, both measured in this process, and the share of training time that
makes at ``agent.video.every`` = 10, 50 and 100. Goal: under 5% at every 50.

    python bench/training_video.py [--task quadruped_flat] [--num-envs 4096] [--iterations 3] [--videos 2]
"""

import argparse
import tempfile
import time
from pathlib import Path

from common import compose, make_env, make_runner, print_table, write_json
from legion.sim2real.trajectories.record import TrainingVideo


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--task", default="quadruped_flat")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--iterations", type=int, default=3, help="training iterations timed (after one warm-up)")
    parser.add_argument("--videos", type=int, default=2, help="videos timed")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (e.g. agent.video.max_seconds=5)")
    args = parser.parse_args()

    cfg = compose(f"task={args.task}", f"sim.num_envs={args.num_envs}", "agent.video.every=1", *args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        env = make_env(cfg)
        runner = make_runner(env, cfg.agent, log_dir=Path(tmp), device=cfg.device)
        video = TrainingVideo(Path(tmp), cfg, make_env)
        runner.learn(1)  # warm-up: first-call costs out of the timing
        video(runner, 1)
        start = time.perf_counter()
        runner.learn(1 + args.iterations)
        iteration_s = (time.perf_counter() - start) / args.iterations
        seconds = []
        for k in range(args.videos):
            start = time.perf_counter()
            video(runner, 2 + k)
            seconds.append(time.perf_counter() - start)
        video.close()
        runner.log.close()
    video_s = sorted(seconds)[len(seconds) // 2]
    row = {"task": args.task, "num_envs": args.num_envs, "iteration_s": iteration_s, "video_s": video_s,
           "episode_s": cfg.agent.video.max_seconds,
           **{f"share_every_{n}": video_s / (n * iteration_s + video_s) for n in (10, 50, 100)}}
    print_table([row])
    print(f"wrote {write_json('training_video', [row], command='python bench/training_video.py', args=vars(args))}")


if __name__ == "__main__":
    main()
