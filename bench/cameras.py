"""Cameras in every world: rendered frames/s and env-steps/s with a camera on and off.

The Go2 on flat ground (``task=quadruped_flat robot=go2``) with one camera on its base looking
forward (Newton's ray-traced SensorCamera on the env's device), read every control step by an
observation group of the policy, so every step renders a frame per world. Per num_envs and
camera (off; depth or RGB at each resolution; depth every ``--period`` steps): env-steps/s of
LegionEnv.step with random actions, frames/s, and the env step's time over the camera-off one.

    python bench/cameras.py [--num-envs 64 256 1024] [--steps 20] [--sizes 64 128] [--period 4] [--device cuda:0]

``--renderers``: instead, the two renderers of a depth camera on the CPU, in arm_lift_camera's scene
(the arm, the table and the cube: its visible shapes are its colliding ones), its front camera at
each size: the C backend casts the rays with MuJoCo's mj_multiRay on every core, the Warp backend
renders with SensorCamera. A frame's cost is the env step's time with the camera less without it.

    python bench/cameras.py --renderers [--num-envs 64 256] [--sizes 48 64 128]
"""

import argparse
import time
from typing import NamedTuple

from common import compose, make_env, print_table, torch, write_json

TASK = ("task=quadruped_flat", "robot=go2")
CAMERA = "{{body: base, pos: [0.35, 0, 0.05], width: {size}, height: {size}, channels: [{channel}], period: {period}}}"
TERMS = {"depth": "depth_image", "rgb": "rgb_image"}


class Camera(NamedTuple):
    channel: str  # depth | rgb
    size: int  # width and height [pixels]
    period: int  # control steps per frame


def step_rate(num_envs: int, steps: int, camera: Camera | None, device: str, overrides=()) -> float:
    """Env-steps/s of ``steps`` control steps, after two warm-up ones (kernels loaded, first frame)."""
    overrides = [*(overrides or TASK), f"sim.num_envs={num_envs}", f"device={device}"]
    if camera is not None and not overrides[0].startswith("task=arm_lift_camera"):
        overrides += [f"+task.scene.cameras.front={CAMERA.format(**camera._asdict())}",
                      f"+task.observations.policy_camera={{image: {{func: {TERMS[camera.channel]}, "
                      "params: {camera: front}}}"]
    env = make_env(compose(*overrides))
    actions = torch.zeros(num_envs, env.num_actions, device=device)
    with torch.inference_mode():
        for _ in range(2):
            env.step(actions)
        synchronize = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
        synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            env.step(actions.uniform_(-1, 1))
        synchronize()
        return num_envs * steps / (time.perf_counter() - start)


def renderers(num_envs: list[int], sizes: list[int], steps: int) -> None:
    """The ``--renderers`` table (module docstring)."""
    rows = []
    for n in num_envs:
        for size in sizes:
            for backend, threads, renderer in (("c", 1, "mj_multiRay (C backend, 1 thread)"),
                                               ("c", 0, "mj_multiRay (C backend, every core)"),
                                               ("warp", 0, "SensorCamera (Warp)")):
                task = ["task=arm_lift_camera", f"sim.backend={backend}", f"sim.threads={threads}"]
                off = step_rate(n, steps, None, "cpu", [*task, "~task.observations.policy_depth",
                                                          "task.scene.cameras={}"])
                size_it = [f"task.scene.cameras.front.width={size}", f"task.scene.cameras.front.height={size}"]
                on = step_rate(n, steps, Camera("depth", size, 1), "cpu", [*task, *size_it])
                frames = 1.0 / (1.0 / on - 1.0 / off)
                rows.append({"num_envs": n, "depth": f"{size}x{size}", "renderer": renderer, "env_steps_per_s": on,
                             "frames_per_s": frames})
                print(f"  {n} envs, {size}x{size}, {renderer}: {frames:,.0f} frames/s", flush=True)
    print_table(rows)
    write_json("camera_renderers", rows, task="arm_lift_camera", steps=steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--period", type=int, default=4, help="the depth camera's period in the 'every N' rows")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--renderers", action="store_true", help="compare mj_multiRay and SensorCamera (docstring)")
    args = parser.parse_args()
    if args.renderers:
        renderers(args.num_envs, args.sizes, args.steps)
        return
    cameras = [None, *(Camera(c, s, 1) for s in args.sizes for c in ("depth", "rgb")),
               Camera("depth", args.sizes[0], args.period)]
    rows = []
    for num_envs in args.num_envs:
        off = None
        for camera in cameras:
            rate = step_rate(num_envs, args.steps, camera, args.device)
            off = off or rate
            name = "off" if camera is None else f"{camera.channel} {camera.size}x{camera.size}" + (
                f" every {camera.period}" if camera.period > 1 else "")
            frames = 0.0 if camera is None else rate / camera.period
            rows.append({"num_envs": num_envs, "camera": name, "env_steps_per_s": rate, "frames_per_s": frames,
                         "step_time_vs_off": off / rate})
            print(f"  {num_envs} envs, camera {name}: {rate:,.0f} env-steps/s", flush=True)
    print_table(rows)
    write_json("cameras" if args.device == "cpu" else "cameras_cuda", rows, task=" ".join(TASK), steps=args.steps,
               device=args.device)


if __name__ == "__main__":
    main()
