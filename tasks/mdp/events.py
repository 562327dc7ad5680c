"""Reset events: ``f(env, env_ids, **params)`` writes the state of the worlds ``env_ids`` only.

Ranges are ``[low, high]`` pairs; values are drawn uniformly per environment from the env's
seeded generator, so a seed reproduces every episode start.
"""

import torch

from tasks.mdp.math import quat_from_yaw


def reset_joints(env, env_ids: torch.Tensor, position_range=(0.0, 0.0), velocity_range=(0.0, 0.0),
                 position_scale=(1.0, 1.0)):
    """Joints to default * U(position_scale) + U(position_range), velocities U(velocity_range),
    clamped to the joint limits."""
    n, j = len(env_ids), env.sim.num_joints
    pos = env.default_joint_pos[env_ids] * env.uniform(*position_scale, (n, j)) + env.uniform(*position_range, (n, j))
    limits = env.sim.joint_limits
    pos = pos.clamp(limits[:, 0], limits[:, 1])
    vel = env.uniform(*velocity_range, (n, j))
    env.sim.reset(env_ids, pos, vel)


def reset_root(env, env_ids: torch.Tensor, xy_range=(0.0, 0.0), yaw_range=(-3.1416, 3.1416),
               velocity_range=(0.0, 0.0), position_scale=(1.0, 1.0)):
    """Floating base at the default height, offset U(xy_range) in x and y, yaw U(yaw_range),
    every velocity component U(velocity_range); joints to the default pose scaled by
    U(position_scale)."""
    n = len(env_ids)
    pose = env.default_root_pose[env_ids].clone()
    pose[:, :2] += env.uniform(*xy_range, (n, 2))
    pose[:, 3:7] = quat_from_yaw(env.uniform(*yaw_range, (n,)))
    vel = env.uniform(*velocity_range, (n, 6))
    joint_pos = env.default_joint_pos[env_ids] * env.uniform(*position_scale, (n, env.sim.num_joints))
    joint_pos = joint_pos.clamp(env.sim.joint_limits[:, 0], env.sim.joint_limits[:, 1])
    env.sim.reset(env_ids, joint_pos, torch.zeros_like(joint_pos), pose, vel)

