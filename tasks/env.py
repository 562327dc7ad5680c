"""The batched env: rsl-rl's VecEnv over a :class:`legion.tasks.sim.NewtonSim`, composed from terms.

One control step is: apply the action, run ``decimation`` physics substeps (one Warp graph),
advance commands and contact timers, evaluate terminations and rewards, reset the finished
worlds, fire the interval events (pushes, ...), and compute the observations of every group.
Everything is a batched tensor operation over all environments; nothing loops over
environments in Python.

The task config (``configs/task/*.yaml``, key ``task``) names the terms; see
:mod:`legion.tasks.mdp` for the term signatures and :mod:`legion.tasks.mdp.events` for the event terms
(episode starts and domain randomization, ``task.events``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from legion.tasks import mdp
from legion.tasks.sim import NewtonSim


@dataclass
class Term:
    """One configured term: the function, its keyword parameters and its modifiers."""

    name: str
    func: Callable
    params: dict = field(default_factory=dict)
    weight: float = 1.0  # rewards
    scale: float | list[float] = 1.0  # observations: one factor, or one per element
    noise: float = 0.0  # observations: uniform noise half-width, in the term's own units
    noise_scale: torch.Tensor | None = None  # observations: (num_envs, 1) per-env noise factor
    clip: float | None = None  # observations
    time_out: bool = False  # terminations


def resolve_term(name: str, spec: dict | None, module) -> Term:
    """Builds a :class:`Term` from its config entry; ``func`` defaults to the entry's name."""
    spec = dict(spec or {})
    func_name = spec.pop("func", name)
    func = getattr(module, func_name, None)
    if not callable(func):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ValueError(f"Unknown {module.__name__.split('.')[-1]} term '{func_name}'. Available: {available}")
    params = dict(spec.pop("params", None) or {})
    try:
        return Term(name=name, func=func, params=params, **spec)
    except TypeError as e:
        raise ValueError(f"Bad settings for term '{name}': {e}") from e


class ContactTimers:
    """Per-body air and contact time, for gait rewards. Shapes (num_envs, num_bodies) [s]."""

    def __init__(self, env, threshold: float = 1.0):
        n, b = env.num_envs, len(env.sim.body_names)
        self.env, self.threshold = env, threshold
        self.air_time = torch.zeros(n, b, device=env.device)
        self.last_air_time = torch.zeros_like(self.air_time)
        self.first_contact = torch.zeros(n, b, dtype=torch.bool, device=env.device)

    def step(self, dt: float) -> None:
        in_contact = torch.norm(self.env.sim.contact_forces, dim=-1) > self.threshold
        self.first_contact = in_contact & (self.air_time > 0.0)
        self.last_air_time = torch.where(self.first_contact, self.air_time + dt, self.last_air_time)
        self.air_time = torch.where(in_contact, 0.0, self.air_time + dt)

    def reset(self, env_ids: torch.Tensor) -> None:
        self.air_time[env_ids] = 0.0
        self.last_air_time[env_ids] = 0.0


class LegionEnv(VecEnv):
    """A task from ``configs/task`` on ``num_envs`` Newton worlds, behind rsl-rl's VecEnv.

    Args:
        task_cfg: the ``task`` config node (a dict).
        sim_cfg: the ``sim`` config node (a dict): num_envs, dt, decimation, solver, ...
        device: torch/Warp device of the simulation and of every tensor it returns.
        seed: seeds the env's generator (resets, commands, noise).
    """

    def __init__(self, task_cfg: dict, sim_cfg: dict, device: str = "cpu", seed: int = 0):
        self.cfg = task_cfg
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.num_envs = sim_cfg["num_envs"]
        if "reset_events" in task_cfg:
            raise ValueError("task.reset_events is now part of task.events: give each entry `mode: reset` "
                             "(see tasks/mdp/events.py and configs/task/quadruped_flat.yaml).")
        self.events = mdp.events.Events(self, task_cfg.get("events"))  # checks the config first
        self.sim = NewtonSim(
            robot=task_cfg["robot"],
            num_envs=sim_cfg["num_envs"],
            dt=sim_cfg["dt"],
            decimation=sim_cfg["decimation"],
            device=device,
            solver=sim_cfg.get("solver", "mujoco"),
            solver_options=sim_cfg.get("solver_options"),
            ground=task_cfg.get("ground", True),
            ground_friction=task_cfg.get("ground_friction", 1.0),
            sense_contacts=task_cfg.get("sense_contacts", True),
            use_graph=sim_cfg.get("use_graph", True),
        )
        self.step_dt = self.sim.control_dt
        self.max_episode_length = math.ceil(task_cfg["episode_length_s"] / self.step_dt)
        self.episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long, device=device)
        self.noise_enabled = True

        # Default pose: the model's, overridden per joint-name regex by the task.
        for pattern, value in (task_cfg.get("default_joint_pos") or {}).items():
            self.sim.default_joint_pos[:, self.sim.find_joints(pattern)] = value
        self.default_joint_pos = self.sim.default_joint_pos
        self.default_root_pose = self.sim.default_root_pose
        if self.sim.floating_base:
            self.default_root_pose[:, 2] = task_cfg.get("default_root_height", self.default_root_pose[0, 2])
            self.default_root_pose[:, 3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0], device=device)

        action_cfg = dict(task_cfg["action"])
        action_type = action_cfg.pop("type")
        if action_type not in mdp.ACTIONS:
            raise ValueError(f"Unknown action type '{action_type}'. Available: {sorted(mdp.ACTIONS)}")
        self.action = mdp.ACTIONS[action_type](self, **action_cfg)
        self.num_actions = self.action.dim
        self.command = mdp.VelocityCommand(self, **task_cfg["commands"]) if task_cfg.get("commands") else None
        self.contacts = ContactTimers(self) if self.sim._geom_slot is not None else None

        self.observation_terms = {
            group: [resolve_term(name, spec, mdp.observations) for name, spec in terms.items()]
            for group, terms in task_cfg["observations"].items()
        }
        for term in (t for terms in self.observation_terms.values() for t in terms):
            if isinstance(term.scale, (list, tuple)):
                term.scale = torch.tensor(term.scale, dtype=torch.float32, device=device)
            if term.noise:
                term.noise_scale = torch.ones(self.num_envs, 1, device=device)
        self.reward_terms = [
            resolve_term(name, spec, mdp.rewards)
            for name, spec in task_cfg["rewards"].items()
            if (spec or {}).get("weight", 1.0) != 0.0
        ]
        self.termination_terms = [
            resolve_term(name, spec, mdp.terminations) for name, spec in (task_cfg.get("terminations") or {}).items()
        ]

        self.episode_sums = {t.name: torch.zeros(self.num_envs, device=device) for t in self.reward_terms}
        self.terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=device)
        self.time_outs = torch.zeros_like(self.terminated)
        self.extras: dict = {"log": {}}
        self.events.apply("startup", torch.arange(self.num_envs, device=device))
        self.reset()

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
        self._reset_idx(torch.arange(self.num_envs, device=self.device))
        return self.refresh_observations()

    def refresh_observations(self) -> TensorDict:
        """Recomputes the observations from the current state, e.g. after a caller wrote the
        state or the commands directly."""
        self._observations = self._compute_observations()
        return self._observations

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        """One control step. Returns (observations, rewards (N,), dones (N,), extras).

        ``extras["time_outs"]`` (N,) bool marks episodes cut by the time limit (bootstrapped by
        PPO), ``extras["log"]`` holds per-term episode sums of the worlds that finished.
        """
        self.action.apply(actions.to(self.device))
        self.sim.step()
        self.episode_length_buf += 1
        if self.command is not None:
            self.command.step()
        if self.contacts is not None:
            self.contacts.step(self.step_dt)

        self.extras = {"log": {}}
        self._compute_terminations()
        rewards = self._compute_rewards()
        dones = self.terminated | self.time_outs
        reset_ids = dones.nonzero().squeeze(-1)
        if reset_ids.numel():
            self._reset_idx(reset_ids)
        self.events.step(self.step_dt)
        self.extras["log"].update(self.events.log())
        self._observations = self._compute_observations()
        self.extras["time_outs"] = self.time_outs.clone()
        return self._observations, rewards, dones, self.extras

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the env: ``{"randomization": {term: {"range": [low, high],
        "distribution": ..., "mode": ...}}, "step_count": control steps so far}`` (enabled terms)."""
        return self.events.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restores the current randomization ranges and the curriculum's step count."""
        self.events.load_state_dict(state)

    # --- internals ------------------------------------------------------------------------
    def _compute_terminations(self) -> None:
        self.time_outs = self.episode_length_buf >= self.max_episode_length
        self.terminated = torch.zeros_like(self.time_outs)
        # A world whose physics went non-finite is ended and counted, never propagated.
        nonfinite = ~torch.isfinite(self.sim.joint_pos).all(1) | ~torch.isfinite(self.sim.joint_vel).all(1)
        if self.sim.floating_base:
            nonfinite |= ~torch.isfinite(self.sim.root_pos).all(1)
        for term in self.termination_terms:
            hit = term.func(self, **term.params) & ~nonfinite
            if term.time_out:
                self.time_outs |= hit
            else:
                self.terminated |= hit
            self.extras["log"][f"Episode_Termination/{term.name}"] = hit.float().mean()
        self.terminated |= nonfinite
        self.extras["log"]["Episode_Termination/nonfinite"] = nonfinite.float().mean()
        if nonfinite.any():
            # Keep the bad numbers out of rewards and observations of this step.
            self.sim.joint_pos.nan_to_num_(0.0, 0.0, 0.0)
            self.sim.joint_vel.nan_to_num_(0.0, 0.0, 0.0)

    def _compute_rewards(self) -> torch.Tensor:
        total = torch.zeros(self.num_envs, device=self.device)
        for term in self.reward_terms:
            value = term.func(self, **term.params) * (term.weight * self.step_dt)
            self.episode_sums[term.name] += value
            total += value
        if self.cfg.get("only_positive_rewards", False):
            # legged_gym's remedy for early training: with a negative total per step, ending the
            # episode (falling on purpose) would be the best policy.
            total.clamp_(min=0.0)
        return total

    def _compute_observations(self) -> TensorDict:
        groups = {}
        for group, terms in self.observation_terms.items():
            parts = []
            for term in terms:
                value = term.func(self, **term.params)
                if term.noise and self.noise_enabled:
                    value = value + self.uniform(-term.noise, term.noise, value.shape) * term.noise_scale
                if term.clip is not None:
                    value = value.clamp(-term.clip, term.clip)
                parts.append(value * term.scale)
            groups[group] = torch.cat(parts, dim=-1)
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        if self.episode_length_buf[env_ids].any():  # not at construction
            seconds = self.max_episode_length * self.step_dt
            for name, sums in self.episode_sums.items():
                self.extras["log"][f"Episode_Reward/{name}"] = sums[env_ids].mean() / seconds
        for sums in self.episode_sums.values():
            sums[env_ids] = 0.0
        # The default state, the reset events' perturbations, then body poses from it (FK).
        sim = self.sim
        sim.joint_pos[env_ids] = self.default_joint_pos[env_ids]
        sim.joint_vel[env_ids] = 0.0
        if sim.floating_base:
            sim.root_pos[env_ids] = self.default_root_pose[env_ids, :3]
            sim.root_quat[env_ids] = self.default_root_pose[env_ids, 3:]
            sim.root_lin_vel[env_ids] = 0.0
            sim.root_ang_vel[env_ids] = 0.0
        self.events.apply("reset", env_ids)
        sim.reset(env_ids)
        self.action.reset(env_ids)
        if self.command is not None:
            self.command.resample(env_ids)
        if self.contacts is not None:
            self.contacts.reset(env_ids)
        self.episode_length_buf[env_ids] = 0

    def observation_layout(self) -> dict[str, list[dict]]:
        """Per group, the terms in order with their sizes and modifiers (for export metadata)."""
        obs = self._observations
        layout = {}
        for group, terms in self.observation_terms.items():
            entries, start = [], 0
            for term in terms:
                size = term.func(self, **term.params).shape[-1]
                scale = term.scale.tolist() if isinstance(term.scale, torch.Tensor) else term.scale
                entries.append({"name": term.name, "start": start, "size": size, "scale": scale, "clip": term.clip})
                start += size
            assert start == obs[group].shape[-1]
            layout[group] = entries
        return layout

    def close(self) -> None:
        pass
