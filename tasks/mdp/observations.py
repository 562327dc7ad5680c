"""Observation terms: ``f(env, **params) -> (num_envs, D)`` float32."""

import torch

from legion.tasks.mdp.math import quat_rotate_inverse


def joint_pos_rel(env) -> torch.Tensor:
    """Joint positions relative to the default pose [rad or m]."""
    return env.sim.joint_pos - env.default_joint_pos


def joint_vel(env) -> torch.Tensor:
    """Joint velocities [rad/s or m/s]."""
    return env.sim.joint_vel


def base_lin_vel(env) -> torch.Tensor:
    """Base linear velocity in the base frame [m/s]."""
    return quat_rotate_inverse(env.sim.root_quat, env.sim.root_lin_vel)


def base_ang_vel(env) -> torch.Tensor:
    """Base angular velocity in the base frame [rad/s]."""
    return quat_rotate_inverse(env.sim.root_quat, env.sim.root_ang_vel)


def projected_gravity(env) -> torch.Tensor:
    """Unit gravity direction in the base frame: (0, 0, -1) when level under vertical gravity
    (each env's own gravity, which the ``gravity_tilt`` event may tilt)."""
    gravity = env.sim.gravity
    return quat_rotate_inverse(env.sim.root_quat, gravity / gravity.norm(dim=-1, keepdim=True))


def base_height(env) -> torch.Tensor:
    """Base height above the ground [m] (a privileged, critic-only term on rough terrain)."""
    return env.sim.root_pos[:, 2:3]


def velocity_commands(env) -> torch.Tensor:
    """Commanded (v_x, v_y, yaw rate) in the base frame [m/s, m/s, rad/s]."""
    return env.command.value


def last_action(env) -> torch.Tensor:
    """The policy's previous action, as it left the policy (before scaling)."""
    return env.action.actions
