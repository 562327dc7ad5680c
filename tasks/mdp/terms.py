"""Term plumbing shared by every term kind: finding a term's function and binding its params."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Selection = Any
"""The type of a ``joints`` / ``bodies`` parameter: name patterns (a regex, or a list of them) in
the config and in the function's default, a (k,) long index tensor when the term is called
(:func:`bind_params` resolves it once). No one static type is both, hence ``Any``."""


@dataclass
class Term:
    """One configured term: its function with resolved keyword parameters, and its modifiers."""

    name: str
    func: Callable
    params: dict = field(default_factory=dict)
    weight: float = 1.0  # rewards
    scale: float | torch.Tensor = 1.0  # observations: one factor, or one per element
    noise: float = 0.0  # observations: uniform noise half-width, in the term's own units
    noise_scale: torch.Tensor | None = None  # observations: (num_envs, 1) per-env noise factor
    clip: float | None = None  # observations
    time_out: bool = False  # terminations

    def __call__(self, env) -> torch.Tensor:
        return self.func(env, **self.params)


def find_function(func_name: str, module, kind: str) -> Callable:
    """The term function ``func_name``: in ``module`` (the kind's own, e.g. legion.tasks.mdp.rewards),
    or ``"package.module:function"``. Event functions must carry the ``@event`` mark."""
    if ":" in func_name:
        module_name, _, attr = func_name.partition(":")
        try:
            func = getattr(importlib.import_module(module_name), attr, None)
        except ImportError as e:
            raise ValueError(f"{kind} term function '{func_name}': cannot import {module_name} ({e}).") from e
        if not callable(func) or (kind == "events" and not hasattr(func, "event_modes")):
            raise ValueError(f"{kind} term function '{func_name}': {module_name} has no "
                             f"{'@event function' if kind == 'events' else 'function'} {attr}.")
        return func
    func = getattr(module, func_name, None)
    if func is None or func_name.startswith("_") or func not in available(module, kind).values():
        raise ValueError(f"Unknown {kind} term '{func_name}'. Available: {sorted(available(module, kind))} "
                         "(or 'package.module:function' for a term of your own).")
    return func


def available(module, kind: str) -> dict[str, Callable]:
    """The term functions a module defines (events: those marked ``@event``)."""
    return {name: f for name, f in vars(module).items()
            if inspect.isfunction(f) and f.__module__ == module.__name__ and not name.startswith("_")
            and (kind != "events" or hasattr(f, "event_modes"))}


def bind_params(func: Callable, params: dict, where: str, leading: int = 1, env=None) -> dict:
    """``params`` checked against ``func``'s signature (after its ``leading`` positional arguments),
    defaults filled in, and, given the ``env``, ``joints`` / ``bodies`` patterns resolved to index
    tensors of the entity named by ``entity`` (default the robot)."""
    signature = inspect.signature(func)
    try:
        bound = signature.bind(*([None] * leading), **params)
    except TypeError as e:
        takes = ", ".join(str(p) for p in list(signature.parameters.values())[leading:])
        raise ValueError(f"{where}: bad params {dict(params)} for {func.__name__}: {e}. It takes ({takes}).") from None
    bound.apply_defaults()
    resolved = dict(list(bound.arguments.items())[leading:])
    for parameter in signature.parameters.values():
        if parameter.kind == parameter.VAR_KEYWORD:
            resolved.update(resolved.pop(parameter.name, {}))
    if env is None:
        return resolved
    entity_name = resolved.get("entity", "robot")
    if entity_name not in env.scene:
        raise ValueError(f"{where}: no scene entity '{entity_name}'; the scene has {list(env.scene)}.")
    entity = env.scene[entity_name]
    for key, finder in (("joints", "find_joints"), ("bodies", "find_bodies")):
        if key in resolved and not isinstance(resolved[key], torch.Tensor):
            if not hasattr(entity, finder):
                raise ValueError(f"{where}: {entity_name} ({entity.kind}) has no {key}.")
            try:
                ids = getattr(entity, finder)(resolved[key])
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            resolved[key] = torch.tensor(ids, dtype=torch.long, device=env.device)
    return resolved
