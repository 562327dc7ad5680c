"""The observation manager: what the policy (and any other group, e.g. the critic) sees.

``task.observations`` names the groups and, in each, its terms in order (schema:
:class:`legion.configs.schema.ObservationTerm`; functions in :mod:`legion.tasks.mdp.observations`).
A group's observation is the concatenation of its terms' values, (num_envs, D_group) float32
(a group of images: their channels, (num_envs, C, H, W); images and vectors go in separate groups),
each value ``clip(f(env) + noise) * scale``: ``noise`` uniform in [-noise, noise] per element, in
the term's own units, times the term's per-env ``noise_scale`` (the ``obs_noise_scale`` event),
while ``env.noise_enabled``; ``clip`` before ``scale``. The layout (where each term sits in its
group, its size and modifiers) is measured once, for export metadata: the one definition of what
the policy sees, from the training env to the robot.

A term is a function of the state: one in several groups with the same params (the policy's and
the critic's ``base_lin_vel``) is computed once per step, each group adding its own noise, clip
and scale.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from legion.tasks import mdp


class ObservationManager:
    """The task's observation groups (``task.observations``).

    Attributes:
        terms: per group, its resolved :class:`~legion.tasks.mdp.Term`\\ s in order.
    """

    def __init__(self, env, cfg: dict[str, dict]):
        self.env = env
        self.terms = {
            group: [mdp.resolve(env, "observations", name, term, f"task.observations.{group}.{name}")
                    for name, term in terms.items() if term.enabled]
            for group, terms in cfg.items()
        }
        # Per group, each term's slot in one step's values: a term in several groups with the same
        # params (the policy's and the critic's) shares one, so it is computed once per step
        keys = list(dict.fromkeys(_same_value(term) for terms in self.terms.values() for term in terms))
        self._slots = {group: [keys.index(_same_value(term)) for term in terms] for group, terms in self.terms.items()}

    def compute(self) -> TensorDict:
        """Every group's observation from the current state: a TensorDict of (num_envs, D_group) tensors."""
        env = self.env
        groups, values = {}, {}
        for group, terms in self.terms.items():
            parts = []
            for term, slot in zip(terms, self._slots[group]):
                if slot not in values:
                    values[slot] = term(env)
                value = values[slot]
                if term.noise and env.noise_enabled:
                    assert term.noise_scale is not None  # mdp.resolve gives every noisy term one
                    value = torch.addcmul(value, env.uniform(-term.noise, term.noise, value.shape), term.noise_scale)
                if term.clip is not None:
                    value = value.clamp(-term.clip, term.clip)
                parts.append(value if isinstance(term.scale, float) and term.scale == 1.0 else value * term.scale)
            try:
                groups[group] = torch.cat(parts, dim=1)  # a vector's elements, an image's channels
            except RuntimeError:
                shapes = {term.name: tuple(part.shape[1:]) for term, part in zip(terms, parts)}
                raise ValueError(f"task.observations.{group}: its terms' values {shapes} do not concatenate; put "
                                 "images (C, H, W) in a group of their own, of one height and width.") from None
        return TensorDict(groups, batch_size=[env.num_envs], device=env.device)

    def layout(self) -> dict[str, list[dict]]:
        """Per group, the terms in order: name, function, start, size (an image's: its channels),
        scale, clip, params (index tensors as lists). Measures each term's size by calling it on the
        current state."""
        layout = {}
        for group, terms in self.terms.items():
            entries, start = [], 0
            for term in terms:
                size = term(self.env).shape[1]
                scale = term.scale.tolist() if isinstance(term.scale, torch.Tensor) else term.scale
                params = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in term.params.items()}
                entries.append({"name": term.name, "func": term.func.__name__, "start": start, "size": size,
                                "scale": scale, "clip": term.clip, "params": params})
                start += size
            layout[group] = entries
        return layout


def _same_value(term) -> tuple:
    """What makes two terms' values the same (observation terms are functions of the state): the
    function and its bound params, index tensors by their values."""
    params = tuple((name, (tuple(value.shape), tuple(value.flatten().tolist())) if isinstance(value, torch.Tensor)
                    else repr(value)) for name, value in sorted(term.params.items()))
    return term.func, params
