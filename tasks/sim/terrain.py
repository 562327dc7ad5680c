"""Generated terrain: one heightfield all worlds share, a grid of tiles of rising difficulty.

Layout, world frame [m]: with tile size T, tile (level l, column c) covers x in [l T, (l+1) T] and
y in [c T, (c+1) T]; a flat border of width B surrounds the grid. Heights are sampled every r
metres (``resolution``): vertex (i, j) of ``heights`` sits at (x, y) = (-B + j r, -B + i r), so
rows run along y and columns along x, as in MuJoCo's heightfields. Between vertices the surface
is the one MuJoCo collides with: each cell is two triangles split along its diagonal from
vertex (i, j) to (i+1, j+1) (:meth:`Terrain.height_at` interpolates the same way).

Tile types (:data:`TYPES`), seen from the tile's centre, where envs start on a flat platform:

- ``rough``: random bumps of +-``rough_height`` every 0.2 m, linearly interpolated;
- ``slope_up`` / ``slope_down``: a pyramid pit / hill of gradient ``slope`` from the edges to
  the platform;
- ``stairs_up`` / ``stairs_down``: the same with steps of ``step_height`` and depth ``step_width``;
- ``obstacles``: ``num_obstacles`` random boxes of 1-2 m, +-``obstacle_height`` or half that.

Slopes and stairs meet their neighbours at height 0 along the tile edges. A parameter's value
at level l is linear in l between its range's ends ``[level 0, highest level]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

TYPES = ("rough", "slope_up", "slope_down", "stairs_up", "stairs_down", "obstacles")
ROUGH_SPACING = 0.2  # [m] between the random heights of rough tiles (legged_gym's downsampling)


@dataclass
class TerrainMap:
    """A generated terrain, on the host (numpy).

    Attributes:
        heights: (rows, cols) float32 [m] vertex heights, rows along y, columns along x.
        resolution: vertex spacing [m]; corner: world (x, y) of vertex (0, 0) [m].
        tile_size: [m]; column_types: the type of each column of tiles.
        origins: (num_levels, num_cols, 3) [m] where a tile's envs start: its centre, at the
            highest point of its platform.
        levels: per difficulty parameter (``slope``, ``step_height``, ``rough_height``,
            ``obstacle_height``), its value at each level, (num_levels,).
    """

    heights: np.ndarray
    resolution: float
    corner: tuple[float, float]
    tile_size: float
    column_types: list[str]
    origins: np.ndarray
    levels: dict[str, np.ndarray]


def generate(cfg) -> TerrainMap:
    """The terrain a :class:`legion.configs.schema.Terrain` describes, from its own ``seed``."""
    where = "task.scene.ground.terrain"
    unknown = sorted(set(cfg.types) - set(TYPES))
    if unknown:
        raise ValueError(f"{where}.types: unknown {unknown}; the generator makes {list(TYPES)}.")
    shares = np.array([float(v) for v in cfg.types.values()])
    checks = {"tile_size": cfg.tile_size > 0, "num_levels": cfg.num_levels >= 1, "num_cols": cfg.num_cols >= 1,
              "resolution": 0 < cfg.resolution <= cfg.tile_size / 4, "border": cfg.border >= 0,
              "platform": 0 < cfg.platform < cfg.tile_size, "step_width": cfg.step_width > 0,
              "types": (shares >= 0).all() and shares.sum() > 0, "num_obstacles": cfg.num_obstacles >= 0,
              "max_init_level": 0 <= cfg.max_init_level}
    bad = [key for key, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"{where}: invalid {', '.join(f'{k}={getattr(cfg, k)}' for k in bad)} (tile_size > 0, "
                         "num_levels and num_cols >= 1, 0 < resolution <= tile_size / 4, border >= 0, "
                         "0 < platform < tile_size, step_width > 0, type shares >= 0 with a positive sum, "
                         "num_obstacles >= 0, max_init_level >= 0).")
    ranges = {}
    for key in ("slope", "step_height", "rough_height", "obstacle_height"):
        value = list(getattr(cfg, key))
        if len(value) != 2 or min(value) < 0:
            raise ValueError(f"{where}.{key}: {value}; expected [level 0, highest level], both >= 0.")
        ranges[key] = value

    r, size = float(cfg.resolution), float(cfg.tile_size)
    n = int(round(size / r))  # vertices per tile along each axis (its far edge is the next tile's)
    border = int(round(cfg.border / r))
    levels, cols = cfg.num_levels, cfg.num_cols
    heights = np.zeros((cols * n + 2 * border + 1, levels * n + 2 * border + 1), np.float32)
    fraction = np.arange(levels) / max(1, levels - 1)
    values = {key: lo + (hi - lo) * fraction for key, (lo, hi) in ranges.items()}
    cumulative = np.cumsum(shares / shares.sum())
    names = list(cfg.types)
    column_types = [names[int(np.searchsorted(cumulative, (c + 0.5) / cols))] for c in range(cols)]

    local = (np.arange(n) * r) - size / 2  # vertex offsets from the tile centre [m]
    x, y = np.meshgrid(local, local)  # (n, n): rows along y, as the heights
    ring = np.maximum(np.abs(x), np.abs(y))  # distance from the centre in the max norm
    platform = ring <= cfg.platform / 2 + 1e-6
    climb = np.minimum(size / 2 - ring, size / 2 - cfg.platform / 2)  # from the edge inwards, stops at the platform
    rng = np.random.default_rng(cfg.seed)
    origins = np.zeros((levels, cols, 3), np.float32)
    for c, kind in enumerate(column_types):
        for level in range(levels):
            tile = _tile(kind, {k: v[level] for k, v in values.items()}, cfg, x, y, climb, platform, rng)
            i0, j0 = border + c * n, border + level * n
            heights[i0:i0 + n, j0:j0 + n] = tile
            origins[level, c] = ((level + 0.5) * size, (c + 0.5) * size, tile[platform].max())
    return TerrainMap(heights, r, (-border * r, -border * r), size, column_types, origins, values)


def _tile(kind: str, value: dict, cfg, x, y, climb, platform, rng) -> np.ndarray:
    """One tile's heights (n, n) [m] at difficulty ``value`` (a parameter -> its value at this level)."""
    if kind in ("slope_up", "slope_down"):
        hill = value["slope"] * climb
        return (hill if kind == "slope_down" else -hill).astype(np.float32)
    if kind in ("stairs_up", "stairs_down"):
        hill = value["step_height"] * np.floor(climb / cfg.step_width + 1e-6)
        return (hill if kind == "stairs_down" else -hill).astype(np.float32)
    if kind == "rough":
        a, size = value["rough_height"], cfg.tile_size
        m = int(np.ceil(size / ROUGH_SPACING)) + 2
        coarse = rng.uniform(-a, a, (m, m))
        u, v = (x + size / 2) / ROUGH_SPACING, (y + size / 2) / ROUGH_SPACING
        j, i = np.floor(u).astype(int), np.floor(v).astype(int)
        fu, fv = u - j, v - i
        return ((1 - fv) * ((1 - fu) * coarse[i, j] + fu * coarse[i, j + 1])
                + fv * ((1 - fu) * coarse[i + 1, j] + fu * coarse[i + 1, j + 1])).astype(np.float32)
    # obstacles: boxes of random size and height on flat ground, the platform kept clear
    h, size = value["obstacle_height"], cfg.tile_size
    tile = np.zeros_like(x, dtype=np.float32)
    for _ in range(cfg.num_obstacles):
        w, d = rng.uniform(1.0, 2.0, 2)
        cx, cy = rng.uniform(-size / 2, size / 2, 2)
        tile[(np.abs(x - cx) <= w / 2) & (np.abs(y - cy) <= d / 2)] = rng.choice([-h, -h / 2, h / 2, h])
    tile[platform] = 0.0
    return tile


class Terrain:
    """A generated terrain on the simulation's device: heights for height scans, tile origins for
    the envs (:class:`legion.tasks.mdp.curriculum.TerrainLevels`).

    Attributes:
        map: the :class:`TerrainMap` (host).
        heights: (rows, cols) [m] on the device.
        origins: (num_levels, num_cols, 3) [m] on the device: where each tile's envs start.
        num_levels, num_cols, tile_size [m].
    """

    def __init__(self, terrain: TerrainMap, device: str):
        self.map = terrain
        self.heights = torch.as_tensor(terrain.heights, device=device)
        self.origins = torch.as_tensor(terrain.origins, device=device)
        self.num_levels, self.num_cols = terrain.origins.shape[:2]
        self.tile_size = terrain.tile_size
        self._flat = self.heights.reshape(-1)

    def height_at(self, xy: torch.Tensor) -> torch.Tensor:
        """The terrain's height [m] under world points ``xy`` (..., 2) [m], as MuJoCo's heightfield
        collision sees it (two triangles per cell); points beyond the grid take its edge's height
        (the border is flat)."""
        rows, cols = self.heights.shape
        r, (x0, y0) = self.map.resolution, self.map.corner
        u = ((xy[..., 0] - x0) / r).clamp(0.0, cols - 1.0)
        v = ((xy[..., 1] - y0) / r).clamp(0.0, rows - 1.0)
        j = u.floor().long().clamp(max=cols - 2)
        i = v.floor().long().clamp(max=rows - 2)
        fu, fv = u - j, v - i
        at = i * cols + j
        h00, h10 = self._flat[at], self._flat[at + 1]  # (i, j), (i, j+1)
        h01, h11 = self._flat[at + cols], self._flat[at + cols + 1]  # (i+1, j), (i+1, j+1)
        return torch.where(fu >= fv, h00 + fu * (h10 - h00) + fv * (h11 - h10),
                           h00 + fv * (h01 - h00) + fu * (h11 - h01))
