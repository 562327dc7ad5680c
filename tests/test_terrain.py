"""Generated terrain: difficulty by level, the curriculum's rule, height scans, and MuJoCo's contacts on it."""

import math

import numpy as np
import pytest
import torch

from conftest import SMALL_TERRAIN, compose, make_env

TYPES = "{rough: 1, slope_up: 1, slope_down: 1, stairs_up: 1, stairs_down: 1, obstacles: 1}"
# One column per type (in this order), three levels of 8 m tiles.
ROUGH = ("task=quadruped_rough", *SMALL_TERRAIN, f"task.scene.ground.terrain.types={TYPES}")


def terrain_cfg(*overrides):
    return compose(*ROUGH, *overrides).task.scene.ground.terrain


def tile(terrain, level: int, column: int) -> np.ndarray:
    n = round(terrain.tile_size / terrain.resolution)
    border = round(-terrain.corner[0] / terrain.resolution)
    return terrain.heights[border + column * n:border + (column + 1) * n, border + level * n:border + (level + 1) * n]


def test_terrain_levels_increase_in_difficulty_slope_and_step_height():
    from legion.tasks.sim.terrain import generate

    cfg = terrain_cfg("task.scene.ground.terrain.num_levels=4")
    terrain = generate(cfg)
    assert terrain.column_types == ["rough", "slope_up", "slope_down", "stairs_up", "stairs_down", "obstacles"]
    r = terrain.resolution
    slopes, steps, bumps, boxes = [], [], [], []
    for level in range(4):
        up, down = tile(terrain, level, 1), tile(terrain, level, 2)
        assert np.allclose(up, -down)  # a pit and a hill of the same gradient
        gradient = max(np.abs(np.diff(down, axis=0)).max(), np.abs(np.diff(down, axis=1)).max()) / r
        slopes.append(gradient)
        stairs = tile(terrain, level, 4)
        steps.append(max(np.abs(np.diff(stairs, axis=0)).max(), np.abs(np.diff(stairs, axis=1)).max()))
        assert np.allclose(tile(terrain, level, 3), -stairs)
        bumps.append(np.abs(tile(terrain, level, 0)).max())
        boxes.append(np.abs(tile(terrain, level, 5)).max())
        # the env starts on its tile's platform: at the centre, on the highest point of the platform
        assert terrain.origins[level, 2, 2] == pytest.approx(down.max(), abs=1e-6)
        assert terrain.origins[level, 1, :2] == pytest.approx([(level + 0.5) * 8.0, 1.5 * 8.0])
    assert slopes == pytest.approx([0.0, 0.4 / 3, 0.8 / 3, 0.4], abs=1e-4)  # the configured [0, 0.4], linear
    assert steps == pytest.approx([0.05, 0.05 + 0.13 / 3, 0.05 + 0.26 / 3, 0.18], abs=1e-6)
    assert all(a < b for a, b in zip(bumps, bumps[1:])) and bumps[-1] <= 0.08 + 1e-6
    assert boxes == pytest.approx([0.05, 0.1, 0.15, 0.2], abs=1e-6)
    assert np.all(terrain.heights[:, :20] == 0.0)  # the border is flat


def test_a_bad_terrain_config_names_the_setting():
    from legion.tasks.sim.terrain import generate

    with pytest.raises(ValueError, match=r"types: unknown \['lava'\]"):
        generate(terrain_cfg("+task.scene.ground.terrain.types.lava=1"))
    with pytest.raises(ValueError, match=r"invalid resolution=3.0"):
        generate(terrain_cfg("task.scene.ground.terrain.resolution=3"))


@pytest.fixture(scope="module")
def rough_env():
    """quadruped_rough on one column per type, 3 levels; 6 envs, env i on column i."""
    return make_env(*ROUGH, "sim.num_envs=6")


def place(env, xy, z_above=0.4, yaw=0.0):
    """Puts every robot at world ``xy`` (6, 2), ``z_above`` over the ground, turned by ``yaw``, at rest."""
    robot = env.robot
    robot.root_pos_w[:, :2] = xy
    robot.root_pos_w[:, 2] = env.sim.ground_height(xy) + z_above
    robot.root_quat_w[:] = torch.tensor([0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)])
    robot.root_vel_w[:] = 0.0
    env.sim.reset(torch.ones(env.num_envs, dtype=torch.bool))


def test_the_curriculum_moves_envs_up_past_half_a_tile_and_down_below_half_their_command(rough_env):
    env, levels = rough_env, rough_env.terrain_levels
    assert levels.columns.tolist() == [0, 1, 2, 3, 4, 5]
    levels.levels = torch.tensor([1, 1, 1, 2, 0, 1])
    levels.update(torch.zeros(6, dtype=torch.bool))  # origins follow the levels (no episode ends)
    # walked [m] from the origin, and the |command| held during the 20 s episode [m/s]
    walked = torch.tensor([5.0, 1.0, 1.0, 5.0, 1.0, 3.0])
    command = torch.tensor([0.5, 0.5, 0.0, 0.5, 1.0, 0.25])
    expected = [2, 0, 1, None, 0, 1]  # up (> 4 m); down (1 < 5); stays (asked 0); top solved: any level;
    #                                   down but already at 0; stays (2.5 < 3 < 4)
    env.command.hold(torch.stack([command, torch.zeros(6), torch.zeros(6)], dim=1))
    place(env, levels.origins[:, :2] + torch.stack([walked, torch.zeros(6)], dim=1))
    env.episode_length_buf[:] = env.max_episode_length - 1  # the next step ends every episode
    _, _, dones, extras = env.step(torch.zeros(6, 12))
    env.command.release()
    assert dones.all() and extras["time_outs"].all()
    got = levels.levels.tolist()
    assert [g for g, e in zip(got, expected) if e is not None] == [e for e in expected if e is not None]
    assert 0 <= got[3] <= 2
    # the new episodes start at the new tiles' origins
    origins = env.sim.terrain.origins[levels.levels, levels.columns]
    assert torch.allclose(levels.origins, origins)
    assert torch.allclose(env.robot.root_pos_w[:, :2], origins[:, :2], atol=0.05)
    assert extras["log"]["Curriculum/terrain_level"] == pytest.approx(sum(got) / 6)


def test_terrain_levels_survive_a_checkpoint_into_an_env_of_another_size(rough_env):
    levels = rough_env.terrain_levels
    saved = {"levels": torch.tensor([0] * 4 + [1] * 4 + [2] * 4)}  # from a run with 12 envs
    rough_env.load_state_dict({**rough_env.state_dict(), "terrain": saved})
    assert sorted(levels.levels.tolist()) == [0, 0, 1, 1, 2, 2]  # the same distribution over 6 envs
    assert torch.equal(rough_env.state_dict()["terrain"]["levels"], levels.levels)
    default = rough_env.robot.default_root_pose[:, :3]
    assert torch.allclose(default[:, :2], rough_env.sim.terrain.origins[levels.levels, levels.columns][:, :2])


def test_the_height_scan_reads_known_terrain_heights_within_1_cm(rough_env):
    """On the hardest slope and stairs the scan matches the terrain's own formula (not its lookup)."""
    from legion.tasks.mdp.observations import height_scan, scan_points

    env, cfg = rough_env, terrain_cfg()
    top = 2 * 8.0 + 4.0  # x of the top level's tile centres; column c's centre is at y = 8 c + 4
    slope, step = cfg.slope[1], cfg.step_height[1]
    # robot 0 on the flat border; 1 on the east face of the slope_down hill, 2 on its north face
    # facing north; 3 on the east face of stairs_up, 4 on the west face of stairs_down; 5 on an
    # obstacle tile's platform
    centres = torch.tensor([[-100.0, 0.0], [top, 20.0], [top, 20.0], [top, 28.0], [top, 36.0], [top, 44.0]])
    xy = centres + torch.tensor([[98.5, 10.0], [2.5, 0.0], [0.0, 2.5], [2.6, 0.0], [-2.6, 0.0], [0.0, 0.0]])
    yaw = [0.0, 0.0, math.pi / 2, 0.0, 0.0, 0.0]
    scans = []
    for turn in (0.0, math.pi / 2):
        place(env, xy, z_above=0.3, yaw=turn)
        scans.append(height_scan(env, size=[1.6, 1.0], resolution=0.1, offset=0.5))
    scan = torch.stack([scans[1 if turn else 0][i] for i, turn in enumerate(yaw)])
    base_z = env.robot.root_pos_w[:, 2]
    points = scan_points((1.6, 1.0), 0.1)
    everywhere = torch.ones(len(points), dtype=torch.bool)
    for i in range(6):
        c, s = math.cos(yaw[i]), math.sin(yaw[i])
        world = xy[i] + torch.stack([c * points[:, 0] - s * points[:, 1], s * points[:, 0] + c * points[:, 1]], dim=1)
        ring = (world - centres[i]).abs().max(dim=1).values  # the generator's distance from the tile centre
        climb = torch.clamp(4.0 - ring, max=4.0 - cfg.platform / 2)
        treads = climb / cfg.step_width
        on_tread = (treads - treads.round()).abs() * cfg.step_width > 0.1  # not the one-cell ramp of a riser
        terrain, keep = {
            0: (torch.zeros(len(points)), everywhere),
            1: (slope * climb, everywhere),
            2: (slope * climb, everywhere),
            3: (-step * torch.floor(treads + 1e-6), on_tread),
            4: (step * torch.floor(treads + 1e-6), on_tread),
            5: (torch.zeros(len(points)), ring < cfg.platform / 2 - 0.1),
        }[i]
        expected = base_z[i] - terrain - 0.5
        assert keep.sum() >= 40
        assert (scan[i][keep] - expected[keep]).abs().max() < 0.01, f"robot {i}"
    assert scan[1].max() - scan[1].min() > 0.5 and scan[3].max() - scan[3].min() > 0.5  # slopes and steps seen


@pytest.mark.parametrize("backend", ["warp", "c"])
def test_mujoco_contacts_rest_on_the_heights_the_scan_reads(backend):
    """Balls dropped all over the terrain come to rest where :meth:`Terrain.height_at` says the
    ground is: the heightfield's orientation and triangulation in MuJoCo are the lookup's. Balls
    on slopes roll; after 2 s one may still be falling down a step (on MuJoCo's C library, whose
    heightfield contacts differ from MuJoCo Warp's): nearly all of them rest on the ground."""
    from legion.configs.schema import Ground, RigidObject, Robot, Scene
    from legion.tasks.sim import NewtonSim

    radius, n = 0.03, 48
    scene = Scene(robot=Robot(file="quadruped.xml"), ground=Ground(terrain=terrain_cfg()),
                  objects={"ball": RigidObject(shape="sphere", size=[radius], mass=0.2, pos=[0.0, 0.0, 1.0])})
    sim = NewtonSim(scene, num_envs=n, dt=0.005, decimation=4, backend=backend)
    ball = sim.scene["ball"]
    xy = torch.rand(n, 2, generator=torch.Generator().manual_seed(0)) * torch.tensor([24.0, 48.0])
    ball.root_pos_w[:, :2] = xy
    ball.root_pos_w[:, 2] = sim.ground_height(xy) + 0.1
    sim.reset(torch.ones(n, dtype=torch.bool))
    for _ in range(100):
        sim.step()
    error = ball.root_pos_w[:, 2] - radius - sim.ground_height(ball.root_pos_w[:, :2])
    on_ground = error.abs() < 0.01
    assert on_ground.sum() >= n - 2 and error.abs().median() < 0.002
    assert sim.ground_height(xy).std() > 0.1  # the balls really sampled uneven ground
