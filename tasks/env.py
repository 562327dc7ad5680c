"""The batched env: rsl-rl's VecEnv over a :class:`legion.tasks.sim.NewtonSim`, composed from terms.

One control step is: apply the action, run ``decimation`` physics steps (one Warp graph),
advance commands, contact timers and the task's success, evaluate terminations and rewards,
reset the finished worlds, fire the interval events (pushes, ...), and compute the observations
of every group.
Everything is a batched tensor operation over all environments; nothing loops over
environments in Python, no term looks a name up, and nothing is read back to the host while the
env steps: finished worlds are reset by mask (every reset operation leaves the other worlds
exactly as they were), and episode statistics stay on the device until the runner reads them
once per iteration. On a GPU this keeps the step free of synchronizations.

The task config (``configs/task/*.yaml``, schema :class:`legion.configs.schema.Task`) names the
terms; see :mod:`legion.tasks.mdp` for the term signatures and :mod:`legion.tasks.mdp.events`
for the event terms (episode starts and domain randomization, ``task.events``).
"""

from __future__ import annotations

import math

import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from legion.configs.schema import Sim, Task
from legion.tasks import mdp
from legion.tasks.sim import SOLVER_LIMITS, NewtonSim


class ContactTimers:
    """Per-body air and contact time of the robot, for gait rewards. Shapes (num_envs, num_bodies) [s]:
    ``air_time`` / ``contact_time`` the current phase's duration so far (0 in the other phase),
    ``last_air_time`` the last completed flight, ``first_contact`` a touchdown this step."""

    def __init__(self, env, threshold: float = 1.0):
        n, b = env.num_envs, env.robot.num_bodies
        self.env, self.threshold = env, threshold
        self.air_time = torch.zeros(n, b, device=env.device)
        self.contact_time = torch.zeros_like(self.air_time)
        self.last_air_time = torch.zeros_like(self.air_time)
        self.first_contact = torch.zeros(n, b, dtype=torch.bool, device=env.device)

    # In-place updates only (as SuccessTracker): the state stays usable whether the env steps in
    # inference mode or not.
    def step(self, dt: float) -> None:
        in_contact = torch.norm(self.env.robot.contact_forces_w, dim=-1) > self.threshold
        self.first_contact.copy_(in_contact & (self.air_time > 0.0))
        self.last_air_time.copy_(torch.where(self.first_contact, self.air_time + dt, self.last_air_time))
        self.air_time.copy_(torch.where(in_contact, 0.0, self.air_time + dt))
        self.contact_time.copy_(torch.where(in_contact, self.contact_time + dt, 0.0))

    def reset(self, mask: torch.Tensor) -> None:
        self.air_time.masked_fill_(mask[:, None], 0.0)
        self.contact_time.masked_fill_(mask[:, None], 0.0)
        self.last_air_time.masked_fill_(mask[:, None], 0.0)


class SuccessTracker:
    """The task's success (``task.success``): its condition met for ``hold_s`` without a break,
    latched per episode; it never ends an episode.

    Attributes:
        succeeded: (num_envs,) bool, the current episode has succeeded.
        time_s: (num_envs,) [s] episode time at which it succeeded (the hold complete; NaN before).
        last_succeeded, last_time_s: the same for each env's last finished episode (evaluation
            reads them after the step that ended it).
    """

    def __init__(self, env, cfg):
        self.env, self.term = env, mdp.resolve(env, "success", cfg.func, cfg, "task.success")
        self.hold_steps = max(1, round(cfg.hold_s / env.step_dt))
        self.held = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)  # control steps met in a row
        self.succeeded = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
        self.time_s = torch.full((env.num_envs,), math.nan, device=env.device)
        self.last_succeeded, self.last_time_s = self.succeeded.clone(), self.time_s.clone()

    # In-place updates only: the state stays usable whether the env steps in inference mode or not.
    def step(self) -> None:
        self.held.copy_(torch.where(self.term(self.env), self.held + 1, 0))
        now = (self.held >= self.hold_steps) & ~self.succeeded
        self.time_s.copy_(torch.where(now, self.env.episode_length_buf * self.env.step_dt, self.time_s))
        self.succeeded |= now

    def reset(self, mask: torch.Tensor, finished: torch.Tensor) -> dict:
        """Starts new episodes in ``mask``; returns ``Episode_Success/rate``'s sum over ``finished``."""
        self.last_succeeded.copy_(torch.where(finished, self.succeeded, self.last_succeeded))
        self.last_time_s.copy_(torch.where(finished, self.time_s, self.last_time_s))
        successes = (self.succeeded & finished).sum()
        self.held.masked_fill_(mask, 0)
        self.succeeded.masked_fill_(mask, False)
        self.time_s.masked_fill_(mask, math.nan)
        return {"Episode_Success/rate": successes}


class CapturedStep:
    """The env's control step recorded once as a CUDA graph and replayed for every later step
    (``sim.capture_step``; CUDA only).

    On a GPU an eager step is dozens of small launches (action, commands, contact timers, terms,
    resets by mask, observations) around the physics' one Warp graph, each costing the host more
    time than the device spends on it at thousands of envs; a replay launches them all at once.
    A replay repeats the captured kernels on the same memory, so the step keeps every piece of
    state in place, on the device, and reads nothing back to the host (tests/test_env.py holds
    it to both). The physics is captured inside the same graph: Warp joins torch's capture
    (``wp.capture_begin(external=True)``) and NewtonSim launches its kernels into it.

    The Python-side choices that shape a step (noise on or off, commands held, physical
    parameters waiting to be handed to the solver) are part of the capture: when one changes,
    the next steps run eagerly again and then capture anew. After-physics hooks (a recorder)
    read the state on the host, so with any registered the step runs eagerly.
    """

    WARMUP = 2  # eager steps before each capture: every kernel compiled and loaded, the allocator warm

    def __init__(self, env: "LegionEnv"):
        if not str(env.device).startswith("cuda"):
            raise ValueError(f"sim.capture_step=true records the control step as a CUDA graph; device is "
                             f"'{env.device}'. Use device=cuda:N, or sim.capture_step=false (on the CPU the "
                             f"physics is already one Warp graph, sim.use_graph).")
        self.env = env
        self.actions = torch.zeros(env.num_envs, env.num_actions, device=env.device)  # the graph's input
        self.graph = self.warp_graph = self.outputs = self.shape = None
        self.eager_steps = 0

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        env = self.env
        shape = (env.noise_enabled, getattr(env.command, "held", None), env.sim.pending_params)
        if shape != self.shape:
            self.graph = self.warp_graph = None
            self.shape, self.eager_steps = shape, 0
        self.actions.copy_(actions)
        if env.after_physics or self.graph is None and self.eager_steps < self.WARMUP:
            self.eager_steps += 1
            return env._step(self.actions)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        obs, rewards, dones, extras = self.outputs
        # Copies: the next replay overwrites the graph's outputs, and a rollout keeps a step's
        # observations (also those get_observations() gives) until after the next step.
        env._observations = obs.clone()
        env.extras = {**extras, "time_outs": extras["time_outs"].clone()}
        return env._observations, rewards.clone(), dones.clone(), env.extras

    def _capture(self) -> None:
        import warp as wp

        env = self.env
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(env.generator)  # resets, commands and noise draw from it
        stream = torch.cuda.Stream(device=env.device)
        warp_stream = wp.stream_from_torch(stream)  # before the capture: it creates a CUDA event
        try:
            # thread_local: the async runner's learner thread allocates and launches while the actor captures.
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                with wp.ScopedStream(warp_stream, sync_enter=False):
                    wp.capture_begin(stream=warp_stream, external=True)
                    try:
                        obs, rewards, dones, extras = env._step(self.actions)
                    finally:
                        # Kept with the torch graph: it holds the Warp modules whose kernels it calls.
                        self.warp_graph = wp.capture_end(stream=warp_stream)
        except Exception as e:
            raise RuntimeError(f"Capturing the control step as a CUDA graph failed ({type(e).__name__}: {e}). "
                               "Train with sim.capture_step=false (the eager step) and report this.") from e
        # The dicts are the env's own, which an eager reset writes into: the graph's outputs get their own.
        extras = {key: dict(value) if isinstance(value, dict) else value for key, value in extras.items()}
        self.outputs, self.graph = (obs, rewards, dones, extras), graph


class LegionEnv(VecEnv):
    """A task on ``num_envs`` Newton worlds, behind rsl-rl's VecEnv.

    Args:
        task: the ``task`` config (:class:`legion.configs.schema.Task`).
        sim: the ``sim`` config (:class:`legion.configs.schema.Sim`).
        device: torch/Warp device of the simulation and of every tensor it returns.
        seed: seeds the env's generator (resets, commands, noise, randomization).

    Attributes:
        sim: the :class:`~legion.tasks.sim.NewtonSim`; ``scene`` its entities by name, ``robot`` the robot.
        action, command: the task's action term and command (``None`` if it has none).
        contacts: the robot's :class:`ContactTimers` (``None`` without contact sensing).
        after_physics: callables ``f(env)`` run in every step right after the physics, before
            rewards, resets and events (e.g. a recorder reading the state each episode ends in).
        reward_values: each reward term's value of the latest step (weight and control dt
            included), (num_envs,) by term name.
        success: the task's :class:`SuccessTracker` (``None`` if it defines no success).
        observation_terms, reward_terms, termination_terms: the resolved :class:`~legion.tasks.mdp.Term`\\ s.
        events: the :class:`~legion.tasks.mdp.events.Events`.
    """

    def __init__(self, task: Task, sim: Sim, device: str = "cpu", seed: int = 0):
        mdp.check(task)  # every term's function and params, before the simulation is built
        self.cfg = task
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.num_envs = sim.num_envs
        self.sim = NewtonSim(task.scene, num_envs=sim.num_envs, dt=sim.dt, decimation=sim.decimation, device=device,
                             solver=sim.solver, solver_options=sim.solver_options, use_graph=sim.use_graph)
        self.scene, self.robot = self.sim.scene, self.sim.robot
        self.step_dt = self.sim.control_dt
        self.max_episode_length = math.ceil(task.episode_length_s / self.step_dt)
        self.episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long, device=device)
        self.noise_enabled = True
        # Default state: the model's, with the task's pose (by joint-name regex) and base height.
        robot = self.robot
        for pattern, value in task.scene.robot.joint_pos.items():
            robot.default_joint_pos[:, robot.find_joints(pattern)] = value
        robot.joint_pos_target[:] = robot.default_joint_pos  # joints no action drives hold the default pose
        if robot.floating_base:
            if task.scene.robot.root_height is not None:
                robot.default_root_pose[:, 2] = task.scene.robot.root_height
            robot.default_root_pose[:, 3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0], device=device)

        action = task.action
        if action.type not in mdp.ACTIONS:
            raise ValueError(f"task.action.type: unknown '{action.type}'. Available: {sorted(mdp.ACTIONS)}")
        self.action = mdp.ACTIONS[action.type](self, joints=action.joints, scale=action.scale, clip=action.clip,
                                                  clamp_to_limits=action.clamp_to_limits)
        self.num_actions = self.action.dim
        self.command = None
        if task.command is not None:
            if task.command.type not in mdp.COMMANDS:
                raise ValueError(f"task.command.type: unknown '{task.command.type}'. Available: {sorted(mdp.COMMANDS)}")
            self.command = mdp.COMMANDS[task.command.type](self, task.command)
        self.contacts = ContactTimers(self) if self.sim.senses_contacts else None
        self.success = SuccessTracker(self, task.success) if task.success is not None else None
        # On a generated terrain: each env's tile (level, type) and the origin its episodes start from.
        self.terrain_levels = (mdp.curriculum.TerrainLevels(self, task.scene.ground.terrain)
                               if self.sim.terrain is not None else None)
        self.observation_terms = {
            group: [mdp.resolve(self, "observations", name, term, f"task.observations.{group}.{name}")
                    for name, term in terms.items()]
            for group, terms in task.observations.items()
        }
        self.reward_terms = [mdp.resolve(self, "rewards", name, term)
                             for name, term in task.rewards.items() if term.weight != 0.0]
        self.termination_terms = [mdp.resolve(self, "terminations", name, term)
                                  for name, term in task.terminations.items()]
        self.events = mdp.events.Events(self, task.events)
        self.episode_sums = {t.name: torch.zeros(self.num_envs, device=device) for t in self.reward_terms}
        self.reward_values: dict[str, torch.Tensor] = {}
        self.after_physics: list = []
        self.terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=device)
        self.time_outs = torch.zeros_like(self.terminated)
        self.extras: dict = {"log": {}}
        self.events.apply("startup", torch.ones(self.num_envs, dtype=torch.bool, device=device))
        self.reset()
        self._layout = self._measure_layout()
        self.captured = CapturedStep(self) if sim.capture_step else None

    # --- helpers for terms ----------------------------------------------------------------
    def uniform(self, low: float, high: float, shape: tuple) -> torch.Tensor:
        """Uniform samples from the env's seeded generator."""
        u = torch.rand(shape, generator=self.generator, device=self.device)
        return low + (high - low) * u

    # --- VecEnv contract ------------------------------------------------------------------
    def get_observations(self) -> TensorDict:
        """Observation groups as a TensorDict of (num_envs, D_group) tensors."""
        return self._observations

    def reset(self) -> TensorDict:
        """Resets every world (at construction; training then resets worlds as they finish)."""
        self._reset(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self.refresh_observations()

    def refresh_observations(self) -> TensorDict:
        """Recomputes the observations from the current state, e.g. after a caller wrote the
        state or held the commands."""
        self._observations = self._compute_observations()
        return self._observations

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        """One control step. Returns (observations, rewards (N,), dones (N,), extras).

        ``extras["time_outs"]`` (N,) bool marks episodes cut by the time limit (bootstrapped by
        PPO); ``extras["log"]`` holds this step's scalars (termination shares, randomization
        ranges, the share of worlds whose solver hit each limit: ``Solver/<limit>_fraction``, see
        :data:`legion.tasks.sim.SOLVER_LIMITS`); ``extras["episodes"]`` sums over the episodes that
        ended this step: ``count`` and per reward term ``Episode_Reward/<term>`` (each episode's
        reward per second), and with a ``task.success``, ``Episode_Success/rate`` (how many
        succeeded). All are device tensors (or Python numbers), never read back here.

        With ``sim.capture_step`` (CUDA) the step is a replay of a recorded one (:class:`CapturedStep`).
        """
        if self.captured is not None:
            return self.captured.step(actions)
        return self._step(actions)

    def _step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        self.action.apply(actions.to(self.device))
        self.sim.step()
        for hook in self.after_physics:
            hook(self)
        self.episode_length_buf += 1
        if self.contacts is not None:
            self.contacts.step(self.step_dt)
        if self.success is not None:
            self.success.step()
        # The share of worlds whose solver stopped at a limit this step (device tensors: no sync).
        limits = self.sim.solver_limits / self.num_envs
        self.extras = {"log": {f"Solver/{name}_fraction": value for name, value in zip(SOLVER_LIMITS, limits)}}
        self._compute_terminations()
        rewards = self._compute_rewards()
        # New commands only now: success and rewards above judged the command the policy saw.
        if self.command is not None:
            self.command.step()
        dones = self.terminated | self.time_outs
        self._reset(dones)
        self.events.step(self.step_dt)
        self.extras["log"].update(self.events.log())
        if self.terrain_levels is not None:
            self.extras["log"]["Curriculum/terrain_level"] = self.terrain_levels.levels.float().mean()
        self._observations = self._compute_observations()
        self.extras["time_outs"] = self.time_outs.clone()
        return self._observations, rewards, dones, self.extras

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the env: ``{"randomization": {term: {"range": [low, high],
        "distribution": ..., "mode": ...}}, "step_count": control steps so far}`` (enabled terms),
        and on a terrain ``"terrain": {"levels": (num_envs,)}``."""
        state = self.events.state_dict()
        if self.terrain_levels is not None:
            state["terrain"] = self.terrain_levels.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restores the current randomization ranges, the curriculum's step count and terrain levels."""
        self.events.load_state_dict(state)
        if self.terrain_levels is not None and "terrain" in state:
            self.terrain_levels.load_state_dict(state["terrain"])

    def observation_layout(self) -> dict[str, list[dict]]:
        """Per group, the terms in order: name, function, start, size, scale, clip, params (for
        export metadata; index tensors as lists)."""
        return self._layout

    def close(self) -> None:
        pass

    # --- internals ------------------------------------------------------------------------
    def _compute_terminations(self) -> None:
        self.time_outs = self.episode_length_buf >= self.max_episode_length
        self.terminated = torch.zeros_like(self.time_outs)
        # A world whose physics went non-finite is ended and counted, never propagated.
        sim = self.sim
        nonfinite = ~torch.isfinite(sim.joint_q).all(1) | ~torch.isfinite(sim.joint_qd).all(1)
        for term in self.termination_terms:
            hit = term(self) & ~nonfinite
            if term.time_out:
                self.time_outs |= hit
            else:
                self.terminated |= hit
            self.extras["log"][f"Episode_Termination/{term.name}"] = hit.float().mean()
        self.terminated |= nonfinite
        self.extras["log"]["Episode_Termination/nonfinite"] = nonfinite.float().mean()
        # Keep the bad numbers out of rewards and observations of this step (the reset follows).
        sim.joint_q.nan_to_num_(0.0, 0.0, 0.0)
        sim.joint_qd.nan_to_num_(0.0, 0.0, 0.0)

    def _compute_rewards(self) -> torch.Tensor:
        total = torch.zeros(self.num_envs, device=self.device)
        for term in self.reward_terms:
            value = self.reward_values[term.name] = term(self) * (term.weight * self.step_dt)
            self.episode_sums[term.name] += value
            total += value
        if self.cfg.only_positive_rewards:
            # legged_gym's remedy for early training: with a negative total per step, ending the
            # episode (falling on purpose) would be the best policy.
            total.clamp_(min=0.0)
        return total

    def _compute_observations(self) -> TensorDict:
        groups = {}
        for group, terms in self.observation_terms.items():
            parts = []
            for term in terms:
                value = term(self)
                if term.noise and self.noise_enabled:
                    value = value + self.uniform(-term.noise, term.noise, value.shape) * term.noise_scale
                if term.clip is not None:
                    value = value.clamp(-term.clip, term.clip)
                parts.append(value * term.scale)
            groups[group] = torch.cat(parts, dim=-1)
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    def _measure_layout(self) -> dict[str, list[dict]]:
        layout = {}
        for group, terms in self.observation_terms.items():
            entries, start = [], 0
            for term in terms:
                size = term(self).shape[-1]
                scale = term.scale.tolist() if isinstance(term.scale, torch.Tensor) else term.scale
                params = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in term.params.items()}
                entries.append({"name": term.name, "func": term.func.__name__, "start": start, "size": size,
                                "scale": scale, "clip": term.clip, "params": params})
                start += size
            layout[group] = entries
        return layout

    def _reset(self, mask: torch.Tensor) -> None:
        """Starts a new episode in the worlds of ``mask`` (num_envs,) bool; the others are untouched."""
        finished = mask & (self.episode_length_buf > 0)  # not the resets at construction
        seconds = self.max_episode_length * self.step_dt
        self.extras["episodes"] = {"count": finished.sum(), **{
            f"Episode_Reward/{name}": (sums * finished).sum() / seconds for name, sums in self.episode_sums.items()}}
        if self.success is not None:
            self.extras["episodes"].update(self.success.reset(mask, finished))
        for sums in self.episode_sums.values():
            sums.masked_fill_(mask, 0.0)
        if self.terrain_levels is not None:  # levels move by the distance walked; origins follow
            self.terrain_levels.update(mask)
        # The default state of every entity, the reset events' perturbations, then body poses (FK).
        robot, rows = self.robot, mask[:, None]
        robot.joint_pos[:] = torch.where(rows, robot.default_joint_pos, robot.joint_pos)
        robot.joint_vel.masked_fill_(rows, 0.0)
        for entity in self.scene.values():
            if getattr(entity, "floating_base", False):
                entity.root_pose_w[:] = torch.where(rows, entity.default_root_pose, entity.root_pose_w)
                entity.root_vel_w.masked_fill_(rows, 0.0)
        self.events.apply("reset", mask)
        self.sim.reset(mask)
        self.action.reset(mask)
        if self.command is not None:
            self.command.resample(mask)
        if self.contacts is not None:
            self.contacts.reset(mask)
        self.episode_length_buf.masked_fill_(mask, 0)
