"""The curriculum manager: the task's difficulty, moved by how well each env does.

On a generated terrain (``task.scene.ground.terrain``) that is the terrain curriculum,
:class:`legion.tasks.mdp.curriculum.TerrainLevels`: each env's tile, moved up or down a level
when an episode ends. Its levels are saved with a checkpoint (``"terrain"`` in the env's
state dict) and logged as ``Curriculum/terrain_level``, the mean level. The event terms' range
schedules (``task.events.<term>.curriculum``) advance with the event manager's step count
(:mod:`legion.tasks.managers.event`).
"""

from __future__ import annotations

import torch

from legion.configs.schema import Ground
from legion.tasks import mdp


class CurriculumManager:
    """The task's curricula that move with the episodes' outcomes (the terrain's).

    Attributes:
        terrain_levels: the :class:`~legion.tasks.mdp.curriculum.TerrainLevels` (``env.terrain_levels``),
            or ``None`` without a generated terrain.
    """

    def __init__(self, env, ground: Ground | None):
        # On a generated terrain: each env's tile (level, type) and the origin its episodes start from.
        terrain = ground.terrain if ground is not None else None
        self.terrain_levels = mdp.curriculum.TerrainLevels(env, terrain) if terrain is not None else None

    def reset(self, mask: torch.Tensor) -> None:
        """At the end of the episodes of ``mask`` (num_envs,) bool, before the env writes their
        default state: levels move by the distance walked; default root poses follow the origins."""
        if self.terrain_levels is not None:
            self.terrain_levels.update(mask)

    def log(self) -> dict[str, torch.Tensor]:
        if self.terrain_levels is None:
            return {}
        return {"Curriculum/terrain_level": self.terrain_levels.levels.float().mean()}

    def state_dict(self) -> dict:
        return {"terrain": self.terrain_levels.state_dict()} if self.terrain_levels is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.terrain_levels is not None and "terrain" in state:
            self.terrain_levels.load_state_dict(state["terrain"])
