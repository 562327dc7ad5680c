"""The reward manager: the task's reward terms summed into one reward per env and control step.

``task.rewards`` names the terms (schema: :class:`legion.configs.schema.RewardTerm`; functions
in :mod:`legion.tasks.mdp.rewards`). A term contributes ``f(env) * weight * step_dt`` (so the
weights do not depend on the control rate); terms of weight 0 are not bound at all. Each term's
sum over the episode is kept per env and reported, when the episode ends, as the episode's
reward per second (``Episode_Reward/<term>``).

Also here: :class:`ContactTimers`, the robot's per-body air and contact times that the gait
rewards (``feet_air_time``, ...) read as ``env.contacts``.
"""

from __future__ import annotations

import torch

from legion.tasks import mdp


class RewardManager:
    """The task's reward terms (``task.rewards``).

    Args:
        env: the :class:`legion.tasks.env.LegionEnv`.
        cfg: name -> :class:`legion.configs.schema.RewardTerm`.
        only_positive: clip each step's total at 0 (``task.only_positive_rewards``).

    Attributes:
        terms: the resolved :class:`~legion.tasks.mdp.Term`\\ s of non-zero weight, in config order.
        sums: (terms, num_envs) each term's sum over each env's current episode.
        episode_sums: per term name, its row of ``sums``.
    """

    def __init__(self, env, cfg: dict, only_positive: bool = False):
        self.env, self.only_positive = env, only_positive
        self.terms = [mdp.resolve(env, "rewards", name, term) for name, term in cfg.items() if term.weight != 0.0]
        # One (terms, num_envs) tensor, so that a step adds to every sum, and a reset clears them, at once
        self.sums = torch.zeros(len(self.terms), env.num_envs, device=env.device)
        self.episode_sums = {t.name: sums for t, sums in zip(self.terms, self.sums)}
        self._cache: tuple = ((), None)  # of _scales (not state: LegionEnv.episode_state skips it)

    def compute(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This step's reward (num_envs,) and each term's value (num_envs,) by name (weight and
        control dt included), added to the episode sums."""
        env = self.env
        if not self.terms:
            return torch.zeros(env.num_envs, device=env.device), {}
        values = torch.stack([term(env) for term in self.terms]) * self._scales()
        self.sums += values
        total = values.sum(dim=0)
        if self.only_positive:
            # legged_gym's remedy for early training: with a negative total per step, ending the
            # episode (falling on purpose) would be the best policy.
            total.clamp_(min=0.0)
        return total, dict(zip(self.episode_sums, values.unbind()))

    def _scales(self) -> torch.Tensor:
        """(terms, 1) each term's weight times the control dt: one multiply for all terms, remade
        when a weight was changed (a curriculum may)."""
        weights = tuple(term.weight for term in self.terms)
        if self._cache[0] != weights:
            self._cache = (weights, torch.tensor(weights, device=self.env.device)[:, None] * self.env.step_dt)
        return self._cache[1]

    def reset(self, mask: torch.Tensor, finished: torch.Tensor) -> dict[str, torch.Tensor]:
        """Starts new episodes in ``mask`` (num_envs,) bool; returns ``Episode_Reward/<term>``: the
        sum over the ``finished`` episodes of each one's reward per second (of the full episode length)."""
        seconds = self.env.max_episode_length * self.env.step_dt
        ended = ((self.sums * finished).sum(dim=1) / seconds).unbind()
        self.sums.masked_fill_(mask, 0.0)
        return {f"Episode_Reward/{name}": value for name, value in zip(self.episode_sums, ended)}


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
        torch.where(self.first_contact, self.air_time + dt, self.last_air_time, out=self.last_air_time)
        self.air_time.add_(dt).masked_fill_(in_contact, 0.0)
        self.contact_time.add_(dt).masked_fill_(~in_contact, 0.0)

    def reset(self, mask: torch.Tensor) -> None:
        self.air_time.masked_fill_(mask[:, None], 0.0)
        self.contact_time.masked_fill_(mask[:, None], 0.0)
        self.last_air_time.masked_fill_(mask[:, None], 0.0)
