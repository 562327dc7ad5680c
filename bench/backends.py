"""MuJoCo's physics on this CPU three ways, per robot, in one run: MuJoCo Warp (``sim.backend=warp``,
Warp runs each kernel on one thread), MuJoCo's C library through legion-rl (``sim.backend=c``: a
thread per core, with Newton's conversions around it), and raw ``mujoco.rollout`` on the same
MjModels, from the same states, with nothing around it (the limit of this machine for MuJoCo).

Per robot (the authored quadruped, the Go2, the G1, the arm) and num_envs: env-steps/s of
LegionEnv.step with random actions, the physics world-steps/s timed inside those env steps
(NewtonSim.step), the env's overhead (env time over physics time), and for the C backend its
physics as a share of raw rollout's (goal >= 0.80) and its env step over its physics (goal <= 1.3).
The two backends take turns, ``--chunk`` control steps at a time, so a busy machine slows them
alike. The C backend's two ratios are medians over turns of their own, each with nothing else
between its turns that training would not have (another's turn leaves the caches cold: the arm's
C physics ran 25% slower after a Warp env's turn): its env step over its physics from turns of the
C env alone, one after the other, as training steps it; its physics over raw rollout's from turns
where the raw rollout steps the very states the C backend stepped in the turn before.

    python bench/backends.py [--num-envs 256 1024] [--steps 40] [--robots quadruped go2 g1 arm]
"""

import argparse
import time

import mujoco
import numpy as np

from common import compose, make_env, print_table, torch, write_json

ROBOTS = {  # name: the task and overrides that train it
    "quadruped": ("quadruped_flat",),
    "go2": ("quadruped_flat", "robot=go2"),
    "g1": ("biped_flat", "robot=g1"),
    "arm": ("arm_reach",),
}


class Timed:
    """An env whose NewtonSim.step is timed inside its env steps, per turn."""

    def __init__(self, robot: str, num_envs: int, backend: str):
        task, *overrides = ROBOTS[robot]
        cfg = compose(f"task={task}", *overrides, f"sim.num_envs={num_envs}", "device=cpu", f"sim.backend={backend}")
        self.env = make_env(cfg)
        if cfg.agent.random_episode_start:  # the episodes' phases spread as training spreads them (the
            # runner): else episodes that only time out all start on one step and no other step starts any
            buf = self.env.episode_length_buf
            buf.copy_(torch.randint_like(buf, high=int(self.env.max_episode_length)))
        self.env_s, self.physics_s = [], []  # per turn
        step = self.env.sim.step

        def timed():
            t = time.perf_counter()
            step()
            self.physics_s[-1] += time.perf_counter() - t

        self.env.sim.step = timed

    def run(self, actions: torch.Tensor) -> None:
        self.physics_s.append(0.0)
        t = time.perf_counter()
        with torch.inference_mode():  # as a rollout steps the env (its tensors then skip autograd's bookkeeping)
            for action in actions:
                self.env.step(action)
        self.env_s.append(time.perf_counter() - t)


class RawRollout:
    """``mujoco.rollout`` alone on the C backend's MjModels, from the very states, warm starts and
    controls its worlds were stepped from in the C backend's last turn (recorded as it stepped
    them, the copies' time taken out of its physics time): the same work with nothing around it."""

    def __init__(self, c: Timed):
        from mujoco import rollout

        self.c, self.solver = c, c.env.sim.solver
        self.pool = rollout.Rollout(nthread=len(self.solver._datas))
        # rollout takes one MjModel per world: each world's, its randomized values written in, its
        # sensors off as the C backend steps them (it evaluates them once per control step)
        self.models = [self.solver.world_model(w) for w in range(self.solver.sim.num_envs)]
        for model in self.models:
            model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_SENSOR)
        self.recorded, self.seconds = [], []
        run = self.solver._run

        def recording(steps: int):
            t = time.perf_counter()
            self.recorded.append(self.solver.states.copy())
            self.c.physics_s[-1] -= time.perf_counter() - t
            run(steps)

        self.solver._run = recording

    def run(self) -> None:
        steps, c = self.solver.sim.decimation, self.solver.columns
        spec = int(mujoco.mjtState.mjSTATE_CTRL | mujoco.mjtState.mjSTATE_QFRC_APPLIED
                   | mujoco.mjtState.mjSTATE_XFRC_APPLIED)
        physics = [c[k] for k in ("time", "qpos", "qvel", "act", "history", "plugin") if k in c]
        work = []
        for x in self.recorded:
            initial = np.concatenate([x[:, k] for k in physics], axis=1)
            control = np.repeat(np.concatenate([x[:, c[k]] for k in ("ctrl", "qfrc_applied", "xfrc_applied")],
                                               axis=1)[:, None], steps, axis=1)
            work.append((initial, control, x[:, c["warmstart"]].copy(), np.zeros((len(x), steps, initial.shape[1]))))
        self.recorded.clear()
        t = time.perf_counter()
        for initial, control, warmstart, states in work:
            self.pool.rollout(self.models, self.solver._datas, initial, control, control_spec=spec, nstep=steps,
                              initial_warmstart=warmstart, state=states, skip_checks=True)
        self.seconds.append(time.perf_counter() - t)


def measure(robot: str, num_envs: int, steps: int, chunk: int) -> dict:
    envs = {backend: Timed(robot, num_envs, backend) for backend in ("warp", "c")}
    num_actions = envs["c"].env.num_actions
    actions = torch.randn(3 * steps + 5, num_envs, num_actions, generator=torch.Generator().manual_seed(0)).clamp(-2, 2)
    for timed in envs.values():
        timed.run(actions[:5])  # warm up (the C backend's buffers, Warp's graph)
        timed.env_s, timed.physics_s = [], []
    turns = range(5, steps + 5, chunk)
    for start in turns:  # the two backends
        for timed in envs.values():
            timed.run(actions[start:start + chunk])
    decimation = envs["c"].env.sim.decimation
    row = {"robot": robot, "num_envs": num_envs}
    for backend, timed in envs.items():
        row[f"{backend} env-steps/s"] = steps * num_envs / sum(timed.env_s)
        row[f"{backend} physics world-steps/s"] = steps * num_envs * decimation / sum(timed.physics_s)
    warp_over_c = sum(envs["warp"].env_s) / sum(envs["c"].env_s)
    # Ratios of the same work, turn by turn: their median is immune to a turn the shared machine slowed
    c = envs["c"]
    c.env_s, c.physics_s = [], []
    for start in turns:  # the C env alone
        c.run(actions[steps + start:steps + start + chunk])
    env_over_physics = float(np.median(np.array(c.env_s) / np.array(c.physics_s)))
    c.env_s, c.physics_s = [], []
    raw = RawRollout(c)
    for start in turns:  # the C backend and raw rollout
        c.run(actions[2 * steps + start:2 * steps + start + chunk])
        raw.run()
    return row | {"raw rollout world-steps/s": steps * num_envs * decimation / sum(raw.seconds),
                  "c / warp (env)": warp_over_c,
                  "c physics / raw": float(np.median(np.array(raw.seconds) / np.array(c.physics_s))),
                  "c env / physics": env_over_physics}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--steps", type=int, default=40, help="control steps per measurement")
    parser.add_argument("--chunk", type=int, default=10, help="control steps per turn")
    parser.add_argument("--robots", nargs="+", default=list(ROBOTS), choices=list(ROBOTS))
    args = parser.parse_args()
    rows = []
    for robot in args.robots:
        for n in args.num_envs:
            rows.append(measure(robot, n, args.steps, args.chunk))
            print(rows[-1], flush=True)
    print_table(rows)
    print(f"wrote {write_json('backends', rows, steps=args.steps, command='python bench/backends.py')}")


if __name__ == "__main__":
    main()
