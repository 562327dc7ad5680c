"""Reusable MDP terms. A task's YAML names them; :mod:`legion.tasks.env` resolves the names here.

Every term is a plain function of the env (plus keyword parameters from the config):

- observations ``f(env, **params) -> (num_envs, D)``
- rewards ``f(env, **params) -> (num_envs,)``, before weight and control dt
- terminations ``f(env, **params) -> (num_envs,)`` bool
- events ``f(env, env_ids, draw, **params)``, writing state or physical parameters of the worlds
  ``env_ids`` only (:mod:`legion.tasks.mdp.events`: modes startup / reset / interval, ranges, curriculum)
"""

from legion.tasks.mdp import events, observations, rewards, terminations
from legion.tasks.mdp.actions import ACTIONS
from legion.tasks.mdp.commands import VelocityCommand

__all__ = ["ACTIONS", "VelocityCommand", "events", "observations", "rewards", "terminations"]
