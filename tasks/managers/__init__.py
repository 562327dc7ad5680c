"""The managers: how a task's terms are bound from its config, called and combined, one module
per kind. :class:`legion.tasks.env.LegionEnv` builds one of each and calls them in its step.

- :mod:`.observation`: the observation groups, each term's value noised, clipped, scaled and
  concatenated into (num_envs, D_group).
- :mod:`.reward`: the reward terms, weighted, times the control dt, summed to (num_envs,), and
  their episode sums; the robot's :class:`~.reward.ContactTimers` for gait rewards.
- :mod:`.termination`: the termination terms and the time limit, (num_envs,) bool each; the
  task's :class:`~.termination.SuccessTracker`.
- :mod:`.event`: the event terms (episode starts, domain randomization) in their modes, their
  ranges, distributions and range curricula.
- :mod:`.command`: the task's command, resampled at episode starts and on its timer.
- :mod:`.curriculum`: the terrain curriculum.

The terms themselves are plain functions (and command classes) in :mod:`legion.tasks.mdp`;
managers import them, never the other way round.
"""

from __future__ import annotations

from legion.tasks.managers.command import CommandManager
from legion.tasks.managers.curriculum import CurriculumManager
from legion.tasks.managers.event import EventManager, EventTerm
from legion.tasks.managers.observation import ObservationManager
from legion.tasks.managers.reward import ContactTimers, RewardManager
from legion.tasks.managers.termination import SuccessTracker, TerminationManager
from legion.tasks.mdp import KINDS, observations, terminations
from legion.tasks.mdp.terms import bind_params, find_function


def check(task) -> None:
    """Checks every term of a task config (functions exist, params fit their signatures, event
    settings), before anything is built: a bad term fails in milliseconds, naming it."""
    for group, terms in task.observations.items():
        for name, cfg in terms.items():
            bind_params(find_function(cfg.func or name, observations, "observations"), cfg.params,
                        f"task.observations.{group}.{name}")
    for kind in ("rewards", "terminations"):
        for name, cfg in getattr(task, kind).items():
            bind_params(find_function(cfg.func or name, KINDS[kind], kind), cfg.params, f"task.{kind}.{name}")
    for name, cfg in task.events.items():
        EventTerm(None, name, cfg)
    if task.success is not None:
        bind_params(find_function(task.success.func, terminations, "success"), task.success.params, "task.success")
        if task.success.hold_s < 0:
            raise ValueError(f"task.success.hold_s: {task.success.hold_s} must be >= 0 seconds.")


__all__ = ["CommandManager", "ContactTimers", "CurriculumManager", "EventManager", "EventTerm", "ObservationManager",
           "RewardManager", "SuccessTracker", "TerminationManager", "check"]
