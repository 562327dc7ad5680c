"""The command manager: the task's command (``task.command``), what the policy is asked to do.

The command is one of :data:`legion.tasks.mdp.commands.COMMANDS`, by ``task.command.type``
(velocity, position, pose; how each samples and what it measures is in
:mod:`legion.tasks.mdp.commands`). The manager builds it and advances it with the episodes: a
new command at each episode start, and on the command's own timer (``resampling_time_s``),
unless the command is held. A task without a command has none, and the manager does nothing.
"""

from __future__ import annotations

import torch

from legion.configs.schema import Command
from legion.tasks import mdp
from legion.tasks.mdp.commands import UniformCommand


class CommandManager:
    """The task's command (``task.command``), built and advanced with the episodes.

    Attributes:
        command: the task's :class:`~legion.tasks.mdp.commands.UniformCommand` (``env.command``),
            or ``None``.
    """

    def __init__(self, env, cfg: Command | None):
        self.command: UniformCommand | None = None
        if cfg is not None:
            if cfg.type not in mdp.COMMANDS:
                raise ValueError(f"task.command.type: unknown '{cfg.type}'. Available: {sorted(mdp.COMMANDS)}")
            self.command = mdp.COMMANDS[cfg.type](env, cfg)

    def reset(self, mask: torch.Tensor) -> None:
        """New commands for the envs starting an episode, ``mask`` (num_envs,) bool, and for those
        whose timer ran out."""
        if self.command is not None:
            self.command.resample(mask)

    def step(self) -> None:
        """One control step on the command's timer (the envs whose time is up draw a new command
        at the :meth:`reset` that follows in the env's step)."""
        if self.command is not None:
            self.command.step()
