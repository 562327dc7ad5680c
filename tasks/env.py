"""The batched env: rsl-rl's VecEnv over a :class:`legion.tasks.sim.NewtonSim`, composed from terms.

One control step is: apply the action, run ``decimation`` physics steps (one Warp graph),
advance the contact timers, evaluate terminations, the task's success and rewards, run down the
command's timer, reset the finished worlds (new commands for them and wherever the timer ran
out), fire the interval events (pushes, ...), and compute the observations of every group.
Everything is a batched tensor operation over all environments; nothing loops over
environments in Python, no term looks a name up, and on a GPU nothing is read back to the host
while the env steps: finished worlds are reset by mask (every reset operation leaves the other
worlds exactly as they were), and episode statistics stay on the device until the runner reads
them once per iteration. This keeps a GPU's step free of synchronizations; on a CPU, where a read
is free, the step reads its masks to skip work for no world (:meth:`LegionEnv.any_world`).

The task config (``configs/task/*.yaml``, schema :class:`legion.configs.schema.Task`) names the
terms; :mod:`legion.tasks.managers` binds, calls and combines them, one manager per kind
(observation, reward, termination, event, command, curriculum), and :mod:`legion.tasks.mdp` holds
the term functions and their signatures. This module is the step loop that calls the managers in
order; :mod:`legion.tasks.capture` records it as one CUDA graph.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from legion.configs.schema import Sim, Task
from legion.tasks import managers, mdp
from legion.tasks.capture import CapturedStep
from legion.tasks.mdp import Term
from legion.tasks.sim import SOLVER_LIMITS, NewtonSim
from legion.tasks.symmetry import Mirror


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
        observation_manager, reward_manager, termination_manager, command_manager,
            curriculum_manager: the managers (:mod:`legion.tasks.managers`).
        events: the :class:`~legion.tasks.managers.event.EventManager`.
        observation_terms, reward_terms, termination_terms: their managers' resolved
            :class:`~legion.tasks.mdp.Term`\\ s (observations: per group).
        episode_sums: per reward term, (num_envs,) its sum over each env's current episode.
        reward_values: each reward term's value of the latest step (weight and control dt
            included), (num_envs,) by term name.
        terminated, time_outs: (num_envs,) bool, the latest step's episode ends by a termination
            term and by the time limit (or a ``time_out`` term).
        contacts: the robot's :class:`~legion.tasks.managers.reward.ContactTimers` (``None``
            without contact sensing).
        success: the task's :class:`~legion.tasks.managers.termination.SuccessTracker` (``None`` if
            it defines no success).
        terrain_levels: the terrain curriculum's
            :class:`~legion.tasks.mdp.curriculum.TerrainLevels` (``None`` without a generated terrain).
        after_physics: callables ``f(env)`` run in every step right after the physics, before
            rewards, resets and events (e.g. a recorder reading the state each episode ends in).
    """

    def __init__(self, task: Task, sim: Sim, device: str = "cpu", seed: int = 0):
        managers.check(task)  # every term's function and params, before the simulation is built
        self.cfg = task
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.num_envs = sim.num_envs
        self.sim = NewtonSim(task.scene, num_envs=sim.num_envs, dt=sim.dt, decimation=sim.decimation, device=device,
                             solver=sim.solver, solver_options=sim.solver_options, use_graph=sim.use_graph,
                             backend=sim.backend, threads=sim.threads)
        self.scene, self.robot = self.sim.scene, self.sim.robot
        self.step_dt = self.sim.control_dt
        self.max_episode_length = math.ceil(task.episode_length_s / self.step_dt)
        self.episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long, device=device)
        self.noise_enabled = True
        self.keep_final_observations = False  # see step()
        self._masks_read_free = torch.device(device).type == "cpu"  # see any_world
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
        takes = set(inspect.signature(mdp.ACTIONS[action.type]).parameters) - {
            "env", "joints", "scale", "clip", "clamp_to_limits"}  # task.action's own keys
        unknown = sorted(set(action.params) - takes)
        if unknown:
            raise ValueError(f"task.action.params: {unknown} not taken by type {action.type}; "
                             f"it takes {sorted(takes)}.")
        scale = action.scale
        if action.type == "joint_position" and task.scene.robot.action_scale is not None:
            scale = task.scene.robot.action_scale  # the robot's own (robot.action_scale)
        self.action = mdp.ACTIONS[action.type](self, joints=action.joints, scale=scale, clip=action.clip,
                                                  clamp_to_limits=action.clamp_to_limits, **action.params)
        if action.max_target_rate is not None:
            if action.type != "joint_position":
                raise ValueError(f"task.action.max_target_rate: a joint_position action takes it, not {action.type}.")
            self.action.max_target_rate = action.max_target_rate
        self.num_actions = self.action.dim
        self.command_manager = managers.CommandManager(self, task.command)
        self.command = self.command_manager.command
        self.contacts = managers.ContactTimers(self) if self.sim.senses_contacts else None
        self.success = managers.SuccessTracker(self, task.success) if task.success is not None else None
        self.curriculum_manager = managers.CurriculumManager(self, task.scene.ground)
        self.terrain_levels = self.curriculum_manager.terrain_levels
        self.observation_manager = managers.ObservationManager(self, task.observations)
        self.reward_manager = managers.RewardManager(self, task.rewards, only_positive=task.only_positive_rewards)
        self.termination_manager = managers.TerminationManager(self, task.terminations)
        self.events = managers.EventManager(self, task.events)
        self.episode_sums = self.reward_manager.episode_sums
        self.reward_values: dict[str, torch.Tensor] = {}
        self.after_physics: list = []
        self.terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=device)
        self.time_outs = torch.zeros_like(self.terminated)
        self.extras: dict = {"log": {}}
        self.events.apply("startup", torch.ones(self.num_envs, dtype=torch.bool, device=device))
        self.reset()
        self._layout = self.observation_manager.layout()
        self.captured = CapturedStep(self) if sim.capture_step else None

    @property
    def observation_terms(self) -> dict[str, list[Term]]:
        return self.observation_manager.terms

    @property
    def reward_terms(self) -> list[Term]:
        return self.reward_manager.terms

    @property
    def termination_terms(self) -> list[Term]:
        return self.termination_manager.terms

    @termination_terms.setter
    def termination_terms(self, terms: list[Term]) -> None:  # a test adds a term for a while
        self.termination_manager.terms = terms

    # --- helpers for terms ----------------------------------------------------------------
    def any_world(self, mask: torch.Tensor) -> bool:
        """Whether any world is in ``mask`` (num_envs,) bool, where that is free to know: work by
        mask is skipped when it would be for no world. On a CPU the mask is read: most control steps
        start no episode at a few hundred envs, and the reset by mask was 40% of the arm's env work
        besides its physics at 256. Elsewhere it is True unread: a read would wait for the device,
        and a captured step cannot make one; the work then runs by mask, a no-op for an empty one."""
        return not self._masks_read_free or bool(mask.any())

    def uniform(self, low: float, high: float, shape: tuple) -> torch.Tensor:
        """Uniform samples from the env's seeded generator."""
        return torch.empty(shape, device=self.device).uniform_(low, high, generator=self.generator)

    @functools.cached_property
    def mirror(self) -> Mirror:
        """The left-right mirror of this task's observations and actions (:mod:`legion.tasks.symmetry`,
        from ``robot.mirror``); raises :class:`~legion.tasks.symmetry.MirrorError` naming what has none."""
        return Mirror(self)

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
        self._observations = self.observation_manager.compute()
        return self._observations

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        """One control step. Returns (observations, rewards (N,), dones (N,), extras).

        ``extras["time_outs"]`` (N,) bool marks episodes cut by the time limit (bootstrapped by
        PPO); ``extras["log"]`` holds this step's scalars (termination shares, randomization
        ranges, the share of worlds whose solver hit each limit: ``Solver/<limit>_fraction``, see
        :data:`legion.tasks.sim.SOLVER_LIMITS`); ``extras["episodes"]`` sums over the episodes that
        ended this step: ``count`` and per reward term ``Episode_Reward/<term>`` (each episode's
        reward per second), and with a ``task.success``, ``Episode_Success/rate`` (how many
        succeeded), absent on a CPU where none ended. With ``keep_final_observations`` (an off-policy
        learner sets it), ``extras["final_observations"]`` holds every group's observation of the
        state each ended episode ended in, before its reset (rows of the worlds in ``dones``; the
        others' rows hold their current state's): absent where nothing ended on a CPU, computed in
        every step elsewhere (knowing would need a read). All are device tensors (or Python numbers),
        never read back here; on a CPU the step reads its masks (:meth:`any_world`).

        With ``sim.capture_step`` (CUDA) the step is a replay of a recorded one
        (:class:`~legion.tasks.capture.CapturedStep`).
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
        # The share of worlds whose solver stopped at a limit this step (device tensors: no sync).
        limits = self.sim.solver_limits / self.num_envs
        self.extras = {"log": {f"Solver/{name}_fraction": value for name, value in zip(SOLVER_LIMITS, limits)}}
        # (A world whose physics diverged ends here, its state zeroed before success and rewards read it.)
        self.terminated, self.time_outs = self.termination_manager.compute(self.extras["log"])
        if self.success is not None:
            self.success.step()
        rewards, self.reward_values = self.reward_manager.compute()
        # The command's timer runs down only now (the new commands come with the resets below):
        # success and rewards above judged the command the policy saw.
        self.command_manager.step()
        dones = self.terminated | self.time_outs
        if self.keep_final_observations and self.any_world(dones):
            # The state each ended episode ended in, before its reset: what a time-out bootstraps from.
            self.extras["final_observations"] = self.observation_manager.compute()
        if self.any_world(dones):
            self._reset(dones)
        else:  # nothing starts: only the commands whose time is up draw
            self.command_manager.reset(dones)
        self.events.step(self.step_dt)
        self.extras["log"].update(self.events.log())
        self.extras["log"].update(self.curriculum_manager.log())
        self._observations = self.observation_manager.compute()
        self.extras["time_outs"] = self.time_outs.clone()
        return self._observations, rewards, dones, self.extras

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the env: ``{"randomization": {term: {"range": [low, high],
        "distribution": ..., "mode": ...}}, "step_count": control steps so far}`` (enabled terms),
        and on a terrain ``"terrain": {"levels": (num_envs,)}``."""
        return {**self.events.state_dict(), **self.curriculum_manager.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restores the current randomization ranges, the curriculum's step count and terrain levels."""
        self.events.load_state_dict(state)
        self.curriculum_manager.load_state_dict(state)

    def episode_state(self) -> dict:
        """The episodes in progress, as copies, for a checkpoint a run resumes from bit for bit: the
        simulation's state (:meth:`NewtonSim.state_dict`), the latest observations, and every tensor
        the action, command, managers and terms hold (step counters, commands and their timers,
        action histories, contact timers, episode sums, ...). Those are found by walking the
        objects, so a term that keeps a new buffer is saved without being listed anywhere."""
        return {"sim": self.sim.state_dict(), "observations": {k: v.clone() for k, v in self._observations.items()},
                "terms": {path: tensor.clone() for path, (tensor, _) in self._term_tensors().items()}}

    def load_episode_state(self, state: dict) -> None:
        """Restores :meth:`episode_state` of the same task and ``num_envs``; raises ValueError
        naming what does not fit (e.g. a checkpoint of another task version), restoring nothing."""
        terms, saved = self._term_tensors(), state["terms"]
        misfit = sorted((saved.keys() ^ terms.keys()) | {k for k in saved.keys() & terms.keys()
                                                         if saved[k].shape[:1] != terms[k][0].shape[:1]})
        if misfit or set(state["observations"]) != set(self._observations.keys()):
            raise ValueError(f"the saved episodes do not fit this env (task or num_envs changed): {misfit[:8]}")
        with torch.inference_mode():  # the tensors a rollout made are inference tensors
            self.sim.load_state_dict(state["sim"])
            for path, value in saved.items():
                tensor, replace = terms[path]
                if tensor.shape == value.shape:
                    tensor.copy_(value)
                else:  # a buffer sized at its first use (an event's values): the saved one in its place,
                    with torch.inference_mode(False):  # a normal tensor, as the first use makes it: an
                        replace(value.clone())  # off-policy rollout (no_grad) updates it in place
            for key, value in state["observations"].items():
                self._observations[key].copy_(value)

    def _term_tensors(self) -> dict[str, tuple[torch.Tensor, Callable[[torch.Tensor], None]]]:
        """Every tensor held by the env's own objects (action, command, managers, terms, timers), by
        attribute path, with a function that puts another tensor in its place; the simulation and
        its entities are :meth:`NewtonSim.state_dict`'s."""
        found: dict[str, tuple[torch.Tensor, Callable[[torch.Tensor], None]]] = {}
        seen = {id(self), id(self.sim), *(id(entity) for entity in self.scene.values())}

        def walk(obj, path: str, replace) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):
                found[path] = (obj, replace)
            elif isinstance(obj, (dict, list)):
                for key, value in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
                    walk(value, f"{path}[{key!r}]", functools.partial(obj.__setitem__, key))
            elif isinstance(obj, tuple):
                for i, value in enumerate(obj):
                    walk(value, f"{path}[{i}]", None)
            elif type(obj).__module__.startswith("legion.") and hasattr(obj, "__dict__"):
                for name, value in vars(obj).items():
                    if name == "_cache":  # values recomputed on demand, not state
                        continue
                    walk(value, f"{path}.{name}", functools.partial(setattr, obj, name))

        for name, value in vars(self).items():
            if name not in ("extras", "reward_values", "_observations", "captured"):  # outputs of the latest step
                walk(value, name, functools.partial(setattr, self, name))
        return found

    def observation_layout(self) -> dict[str, list[dict]]:
        """Per group, the terms in order: name, function, start, size, scale, clip, params (for
        export metadata; index tensors as lists)."""
        return self._layout

    def close(self) -> None:
        pass

    # --- internals ------------------------------------------------------------------------
    def _reset(self, mask: torch.Tensor) -> None:
        """Starts a new episode in the worlds of ``mask`` (num_envs,) bool; the others are untouched."""
        finished = mask & (self.episode_length_buf > 0)  # not the resets at construction
        self.extras["episodes"] = {"count": finished.sum(), **self.reward_manager.reset(mask, finished)}
        if self.success is not None:
            self.extras["episodes"].update(self.success.reset(mask, finished))
        self.curriculum_manager.reset(mask)  # before the default state: it moves the default root poses
        # The default state of every entity, the reset events' perturbations, then body poses (FK).
        robot, rows = self.robot, mask[:, None]
        torch.where(rows, robot.default_joint_pos, robot.joint_pos, out=robot.joint_pos)
        robot.joint_vel.masked_fill_(rows, 0.0)
        for entity in self.scene.values():
            if getattr(entity, "floating_base", False):
                torch.where(rows, entity.default_root_pose, entity.root_pose_w, out=entity.root_pose_w)
                entity.root_vel_w.masked_fill_(rows, 0.0)
        self.events.apply("reset", mask)
        self.sim.reset(mask)
        self.action.reset(mask)
        self.command_manager.reset(mask)
        if self.contacts is not None:
            self.contacts.reset(mask)
        self.episode_length_buf.masked_fill_(mask, 0)
