"""Reusable MDP terms. A task's YAML names them; :func:`resolve` turns each entry into a :class:`Term`,
which the managers (:mod:`legion.tasks.managers`) call and combine.

Every term is a plain function of the env (plus keyword parameters from the config's ``params``):

- observations ``f(env, **params) -> (num_envs, D)``
- rewards ``f(env, **params) -> (num_envs,)``, before weight and control dt
- terminations ``f(env, **params) -> (num_envs,)`` bool; a task's success condition (``task.success``)
  is a function of the same kind
- events ``f(env, mask, draw, **params)``, writing state or physical parameters of the worlds in
  ``mask`` only (:mod:`.events`)

Commands (:mod:`.commands`: what the policy is asked to do, sampled per env) and the terrain
curriculum (:mod:`.curriculum`) are classes: they carry state across steps.

``func`` names a function of this package's module for the kind (``observations``, ...), or a
task's own as ``"package.module:function"``. Parameters are checked against the function's
signature when the env is built. Two parameter names are special: ``joints`` and ``bodies`` take
name patterns (a regex, or a list of them) over the joints / bodies of the scene entity named by
the function's ``entity`` parameter (default ``"robot"``), and the function receives them resolved,
once, as long index tensors: nothing is looked up by name while the env steps. The terms that run
every step read them with ``x.index_select(1, joints)``: the copy ``x[:, joints]`` makes, at a
third of its cost on a CPU (~3 us against ~10, which at a few hundred envs is most of a term's).
"""

from __future__ import annotations

import torch

from legion.tasks.mdp import curriculum, events, observations, rewards, terminations
from legion.tasks.mdp.actions import ACTIONS
from legion.tasks.mdp.commands import COMMANDS
from legion.tasks.mdp.terms import Term, bind_params, find_function

KINDS = {"observations": observations, "rewards": rewards, "terminations": terminations, "events": events,
         "success": terminations}


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


__all__ = ["ACTIONS", "COMMANDS", "KINDS", "Term", "curriculum", "events", "observations", "resolve", "rewards",
           "terminations"]
