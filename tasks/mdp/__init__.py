"""Reusable MDP terms. A task's YAML names them; :func:`resolve` turns each entry into a :class:`Term`.

Every term is a plain function of the env (plus keyword parameters from the config's ``params``):

- observations ``f(env, **params) -> (num_envs, D)``
- rewards ``f(env, **params) -> (num_envs,)``, before weight and control dt
- terminations ``f(env, **params) -> (num_envs,)`` bool; a task's success condition (``task.success``)
  is a function of the same kind
- events ``f(env, env_ids, draw, **params)``, writing state or physical parameters of the worlds
  ``env_ids`` only (:mod:`.events`: modes startup / reset / interval, ranges, curriculum)

``func`` names a function of this package's module for the kind (``observations``, ...), or a
task's own as ``"package.module:function"``. Parameters are checked against the function's
signature when the env is built. Two parameter names are special: ``joints`` and ``bodies`` take
name patterns (a regex, or a list of them) over the joints / bodies of the scene entity named by
the function's ``entity`` parameter (default ``"robot"``), and the function receives them resolved,
once, as long index tensors: nothing is looked up by name while the env steps.
"""

from __future__ import annotations

import torch

from legion.tasks.mdp import curriculum, events, observations, rewards, terminations
from legion.tasks.mdp.actions import ACTIONS
from legion.tasks.mdp.commands import COMMANDS
from legion.tasks.mdp.terms import Term, bind_params, find_function

KINDS = {"observations": observations, "rewards": rewards, "terminations": terminations, "events": events,
         "success": terminations}


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
        events.EventTerm(None, name, cfg)
    if task.success is not None:
        bind_params(find_function(task.success.func, terminations, "success"), task.success.params, "task.success")
        if task.success.hold_s < 0:
            raise ValueError(f"task.success.hold_s: {task.success.hold_s} must be >= 0 seconds.")


def resolve(env, kind: str, name: str, cfg, where: str | None = None) -> Term:
    """A :class:`Term` from a config entry (``ObservationTerm``, ``RewardTerm``, ``TerminationTerm``)."""
    func = find_function(cfg.func or name, KINDS[kind], kind)
    params = bind_params(func, cfg.params, where or f"task.{kind}.{name}", env=env)
    modifiers = {key: getattr(cfg, key) for key in ("weight", "noise", "clip", "time_out") if hasattr(cfg, key)}
    term = Term(name=name, func=func, params=params, **modifiers)
    if hasattr(cfg, "scale"):
        scale = cfg.scale
        term.scale = torch.tensor(scale, dtype=torch.float32, device=env.device) \
            if isinstance(scale, (list, tuple)) else float(scale)
    if term.noise:
        term.noise_scale = torch.ones(env.num_envs, 1, device=env.device)
    return term


__all__ = ["ACTIONS", "COMMANDS", "Term", "check", "curriculum", "events", "observations", "resolve", "rewards", "terminations"]
