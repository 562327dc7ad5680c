"""Observation terms: ``f(env, **params) -> (num_envs, D)`` float32.

``joints`` / ``bodies`` arrive as index tensors (see :mod:`legion.tasks.mdp`). The edge runtime
(``legion.sim2real.deploy.policy``) computes each term again in numpy from a robot state, by these
function names (``OBSERVATION_TERMS``). tests/test_observations_match.py holds the two together: a
term here without an edge version fails it, and so does any term of any task whose runtime value,
from the sim's robot state, differs from the env's by more than 1e-5.
"""

import functools

import torch

from legion.tasks.sim.camera import scene_camera


def joint_pos_rel(env, joints=".*") -> torch.Tensor:
    """Joint positions relative to the default pose [rad or m]."""
    robot = env.robot
    return robot.joint_pos.index_select(1, joints) - robot.default_joint_pos.index_select(1, joints)


def joint_vel(env, joints=".*") -> torch.Tensor:
    """Joint velocities [rad/s or m/s]."""
    return env.robot.joint_vel.index_select(1, joints)


def base_lin_vel(env) -> torch.Tensor:
    """Base linear velocity in the base frame [m/s]."""
    return env.robot.root_lin_vel_b


def base_ang_vel(env) -> torch.Tensor:
    """Base angular velocity in the base frame [rad/s]."""
    return env.robot.root_ang_vel_b


def projected_gravity(env) -> torch.Tensor:
    """Unit gravity direction in the base frame: (0, 0, -1) when level under vertical gravity
    (each env's own gravity, which the ``gravity_tilt`` event may tilt)."""
    return env.robot.projected_gravity_b


def base_height(env) -> torch.Tensor:
    """Base height above the ground under it [m] (a privileged, critic-only term on rough terrain)."""
    root = env.robot.root_pos_w
    return root[:, 2:3] - env.sim.ground_height(root[:, :2])[:, None]


@functools.lru_cache(maxsize=16)
def scan_points(size: tuple = (1.6, 1.0), resolution: float = 0.1, device: str = "cpu") -> torch.Tensor:
    """(P, 2) [m] the points of a height scan in the base's heading frame (x forward, y left):
    a grid over ``size`` (length along x, width along y) centred on the base, every
    ``resolution``; x varies fastest (point k = iy * nx + ix). Cached: do not modify the result."""
    nx, ny = (int(round(s / resolution)) + 1 for s in size)
    x = torch.linspace(-size[0] / 2, size[0] / 2, nx, device=device)
    y = torch.linspace(-size[1] / 2, size[1] / 2, ny, device=device)
    gy, gx = torch.meshgrid(y, x, indexing="ij")
    return torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=-1)


def height_scan(env, size=(1.6, 1.0), resolution: float = 0.1, offset: float = 0.5) -> torch.Tensor:
    """(num_envs, P) [m]: at each point of :func:`scan_points`, turned with the base's heading (yaw
    only: the scan stays level when the base rolls or pitches), the base's height above the ground
    there, minus ``offset`` (about 0 for a standing robot; Isaac Lab's convention). On a plane it
    reads base height - offset everywhere."""
    robot = env.robot
    points = scan_points(tuple(size), float(resolution), str(env.device))  # (P, 2), heading frame
    q = robot.root_quat_w
    yaw = torch.atan2(2 * (q[:, 3] * q[:, 2] + q[:, 0] * q[:, 1]), 1 - 2 * (q[:, 1] ** 2 + q[:, 2] ** 2))
    c, s = torch.cos(yaw)[:, None], torch.sin(yaw)[:, None]
    x, y = points[:, 0], points[:, 1]
    world = torch.stack([robot.root_pos_w[:, 0:1] + c * x - s * y, robot.root_pos_w[:, 1:2] + s * x + c * y], dim=-1)
    return robot.root_pos_w[:, 2:3] - env.sim.ground_height(world) - offset


def velocity_commands(env) -> torch.Tensor:
    """Commanded (v_x, v_y, yaw rate) in the base frame [m/s, m/s, rad/s]."""
    return env.command.value


def pose_command(env) -> torch.Tensor:
    """(num_envs, 7) the commanded pose in the robot's base frame: position [m] and orientation
    quaternion (x, y, z, w; w >= 0) (command type pose)."""
    return env.command.value


def position_command(env) -> torch.Tensor:
    """(num_envs, 3) [m] the commanded position in the robot's base frame (command type position)."""
    return env.command.value[:, :3]


def last_action(env) -> torch.Tensor:
    """The policy's previous action, as it left the policy (before scaling)."""
    return env.action.actions



def depth_image(env, camera: str) -> torch.Tensor:
    """(num_envs, 1, height, width) [m] the camera's planar depth (task.scene.cameras), with the
    world's randomized sensor error (events ``depth_noise``, ``depth_holes``: fresh at every read,
    while the env's observation noise is on), a pixel with no return (nothing within [near, far],
    or a hole) read as ``far``."""
    cameras = scene_camera(env, camera)
    depth, noise = cameras.depth(camera), cameras.noise[camera]
    noisy = env.noise_enabled
    if noisy and env.any_world(noise["depth_noise"] > 0):  # a stereo camera's error: proportional to depth^2
        sigma = noise["depth_noise"][:, None, None] * depth.square()
        depth = torch.where(depth > 0, depth + sigma * torch.randn(depth.shape, device=depth.device,
                                                                   generator=env.generator), 0.0)
    if noisy and env.any_world(noise["holes"] > 0):
        holes = torch.rand(depth.shape, device=depth.device, generator=env.generator) < noise["holes"][:, None, None]
        depth = depth.masked_fill(holes, 0.0)
    return torch.where(depth > 0, depth, cameras.cfgs[camera].far).unsqueeze(1)


def rgb_image(env, camera: str) -> torch.Tensor:
    """(num_envs, 3, height, width) the camera's colour image, each channel in [0, 1], times the
    world's randomized gain per channel (event ``rgb_gain``)."""
    cameras = scene_camera(env, camera)
    rgb = cameras.rgb(camera).permute(0, 3, 1, 2).float() / 255.0
    return (rgb * cameras.noise[camera]["gain"][:, :, None, None]).clamp(0.0, 1.0)


# Terms of what only the simulator knows, which no robot reports: for critics and teachers
# (`legion export` refuses an actor that reads one; the edge runtime has no version of them).
SIMULATOR_ONLY = ("segmentation_mask",)


def segmentation_mask(env, camera: str, entities: list[str] | str = "robot") -> torch.Tensor:
    """(num_envs, len(entities), height, width) 1 where the camera sees each entity (``robot``, an
    object or fixture by name, or ``ground``), else 0: its segmentation channel. A simulator's
    privilege, no robot camera's: for a critic or a teacher (``legion export`` refuses an actor
    that reads it)."""
    cameras = scene_camera(env, camera)
    names = [entities] if isinstance(entities, str) else list(entities)
    unknown = [n for n in names if n not in cameras.labels or n == "none"]
    if unknown:
        raise ValueError(f"segmentation_mask: entities {unknown} are not in the scene; its labels: "
                         f"{[n for n in cameras.labels if n != 'none']}")
    labels = cameras.segmentation(camera)
    return torch.stack([labels == cameras.labels[n] for n in names], dim=1).float()
