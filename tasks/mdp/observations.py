"""Observation terms: ``f(env, **params) -> (num_envs, D)`` float32.

``joints`` / ``bodies`` arrive as index tensors (see :mod:`legion.tasks.mdp`). The edge runtime
(``legion.sim2real.deploy.policy``) computes the robot-state terms again from sensor data, by
these function names: a term added here that a policy on a robot needs is added there too.
"""

import torch


def joint_pos_rel(env, joints=".*") -> torch.Tensor:
    """Joint positions relative to the default pose [rad or m]."""
    robot = env.robot
    return robot.joint_pos[:, joints] - robot.default_joint_pos[:, joints]


def joint_vel(env, joints=".*") -> torch.Tensor:
    """Joint velocities [rad/s or m/s]."""
    return env.robot.joint_vel[:, joints]


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
    """Base height above the ground [m] (a privileged, critic-only term on rough terrain)."""
    return env.robot.root_pos_w[:, 2:3]


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
