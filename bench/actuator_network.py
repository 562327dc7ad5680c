"""What an actuator network and gear play cost: the Go2's env-steps/s with its legs driven by
their DC motors (the C backend steps them inside its compiled loop; Warp's by Newton's actuators)
against the same legs driven by an actuator network of Hwangbo et al.'s size (3 instants of
error and velocity, two hidden layers of 32 softsign units), evaluated in torch before every
physics step for all worlds (on the C backend the worlds then come back from C after each
physics step), and against the DC motors with gear play (the event joint_backlash, 0.02-0.06 rad:
a dead zone in their PD law, inside the compiled loop on the C backend).

Per backend and num_envs: env-steps/s of LegionEnv.step with random actions for each drive, in
turns of ``--chunk`` control steps (a busy machine slows them alike), and each one's over the
DC motors' time per step.

    python bench/actuator_network.py [--num-envs 256 1024] [--steps 40] [--backends c warp]
    python bench/actuator_network.py --device cuda:0 --backends warp --num-envs 4096 16384
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from common import compose, make_env, print_table, torch, write_json


def hwangbo_network(path: Path) -> str:
    from legion.sim2real.deploy.actuator_network import ActuatorNetwork

    rng = np.random.default_rng(0)
    sizes = [6, 32, 32, 1]
    ActuatorNetwork(weights=[rng.normal(0, 1 / np.sqrt(i), (o, i)) for i, o in zip(sizes, sizes[1:])],
                    biases=[np.zeros(o) for o in sizes[1:]], input_mean=np.zeros(6), input_std=np.ones(6),
                    output_scale=5.0).save(path)
    return str(path)


def measure(backend: str, num_envs: int, steps: int, chunk: int, network: str, device: str = "cpu") -> dict:
    drives = {"dc_motor": (), "network": [f"{plus}task.scene.robot.actuators.{group}.{key}"
                                          for group in ("hip_thigh", "knee")
                                          for plus, key in (("", "model=network"), ("+", f"network={network}"))],
              "gear play": ["+task.events.play={func: joint_backlash, mode: startup, range: [0.02, 0.06]}"]}
    envs = {name: make_env(compose("task=quadruped_flat", "robot=go2", f"sim.num_envs={num_envs}", f"device={device}",
                                   f"sim.backend={backend}", *overrides)) for name, overrides in drives.items()}
    seconds = {name: 0.0 for name in envs}
    actions = 0.5 * torch.randn(chunk, num_envs, 12, generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode():
        for env in envs.values():  # warm-up: first calls load kernels and fill caches
            env.step(actions[0])
        for _ in range(max(1, steps // chunk)):
            for name, env in envs.items():
                t = time.perf_counter()
                for action in actions:
                    env.step(action)
                if device != "cpu":
                    torch.cuda.synchronize()
                seconds[name] += time.perf_counter() - t
    done = max(1, steps // chunk) * chunk * num_envs
    return {"device": device, "backend": backend, "num_envs": num_envs,
            **{f"{name} env-steps/s": round(done / seconds[name]) for name in envs},
            **{f"{name} / dc_motor time": round(seconds[name] / seconds["dc_motor"], 2) for name in envs
               if name != "dc_motor"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--steps", type=int, default=40, help="control steps per measurement")
    parser.add_argument("--chunk", type=int, default=10, help="control steps per turn")
    parser.add_argument("--backends", nargs="+", default=["c", "warp"], choices=["c", "warp"],
                        help="on CUDA: warp only")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (the control step captured there)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        network = hwangbo_network(Path(folder) / "network.npz")
        for backend in args.backends:
            for n in args.num_envs:
                rows.append(measure(backend, n, args.steps, args.chunk, network, args.device))
                print(rows[-1], flush=True)
    print_table(rows)
    print(f"wrote {write_json('actuator_network', rows, steps=args.steps, command='python bench/actuator_network.py')}")


if __name__ == "__main__":
    main()
