"""The terrain curriculum: each env's tile on the shared terrain, moved by how far the env walked.

Only the tile is per env: its level (row of the terrain, difficulty) and its column (terrain
type), and so the origin its episodes start from. Columns are dealt out round-robin (env i gets
column i mod num_cols), so any group of consecutive envs sees every type.

The rule (legged_gym's, Isaac Lab's ``terrain_levels_vel``), applied when an episode ends, on
the device: an env that walked farther than half a tile from its origin moves up a level; one
that walked less than half of what its commands asked for (|v_xy,cmd| x episode length) moves
down; an env that solves the highest level goes to a random level, so the top never empties.
At construction envs start at random levels 0..``max_init_level``. With ``curriculum: false``
levels are random over all levels and never move (what ``legion eval`` uses, after restoring
the levels a checkpoint reached).
"""

from __future__ import annotations

import torch


class TerrainLevels:
    """Per env: ``levels``, ``columns`` (num_envs,) long and ``origins`` (num_envs, 3) [m], world frame.

    Args:
        env: the :class:`legion.tasks.env.LegionEnv` (its sim has a terrain).
        cfg: the :class:`legion.configs.schema.Terrain` config.
    """

    def __init__(self, env, cfg):
        self.env, self.terrain = env, env.sim.terrain
        self.curriculum = cfg.curriculum
        n, device = env.num_envs, env.device
        top = self.terrain.num_levels - 1
        first = min(cfg.max_init_level, top) if self.curriculum else top
        self.levels = torch.randint(0, first + 1, (n,), generator=env.generator, device=device)
        self.columns = torch.arange(n, device=device) % self.terrain.num_cols
        self.origins = self.terrain.origins[self.levels, self.columns]
        # Each floating entity's default root position relative to its env's origin.
        self._offsets = {name: entity.default_root_pose[:, :3].clone() for name, entity in env.scene.items()
                         if getattr(entity, "floating_base", False)}
        self._place(torch.ones(n, dtype=torch.bool, device=device))

    def update(self, mask: torch.Tensor) -> None:
        """At the end of the episodes of ``mask`` (num_envs,) bool, before the env writes their
        default state: move their levels by the rule, and their default root poses to the new origins."""
        env = self.env
        if self.curriculum:
            ended = mask & (env.episode_length_buf > 0)  # not the resets at construction
            walked = (env.robot.root_pos_w[:, :2] - self.origins[:, :2]).norm(dim=1)
            seconds = env.max_episode_length * env.step_dt
            asked = (env.command.value[:, :2].norm(dim=1) * seconds if env.command is not None
                     else torch.zeros_like(walked))
            up = walked > self.terrain.tile_size / 2
            down = (walked < 0.5 * asked) & ~up
            levels = self.levels + up.long() - down.long()
            beyond = torch.randint(0, self.terrain.num_levels, levels.shape, generator=env.generator, device=env.device)
            levels = torch.where(levels >= self.terrain.num_levels, beyond, levels.clamp(min=0))
            self.levels.copy_(torch.where(ended, levels, self.levels))  # in place: a captured step replays
        self._place(mask)

    def _place(self, mask: torch.Tensor) -> None:
        self.origins.copy_(torch.where(mask[:, None], self.terrain.origins[self.levels, self.columns], self.origins))
        for name, offset in self._offsets.items():
            pose = self.env.scene[name].default_root_pose
            pose[:, :3] = torch.where(mask[:, None], self.origins + offset, pose[:, :3])

    def state_dict(self) -> dict:
        return {"levels": self.levels.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restores saved levels. From a run with another number of envs, the same distribution
        of levels: the saved ones at evenly spaced ranks, dealt out in random order."""
        saved = state["levels"].to(self.levels.device).clamp(0, self.terrain.num_levels - 1)
        n = self.levels.numel()
        if saved.numel() != n:
            ranks = torch.linspace(0, saved.numel() - 1, n, device=saved.device).round().long()
            order = torch.randperm(n, generator=self.env.generator, device=self.levels.device)
            saved = saved.sort().values[ranks][order]
        self.levels.copy_(saved)
        self._place(torch.ones(n, dtype=torch.bool, device=self.levels.device))
