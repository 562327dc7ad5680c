"""Termination terms: ``f(env, **params) -> (num_envs,)`` bool. Time-outs are the env's own."""

import torch


def illegal_contact(env, bodies, threshold: float = 1.0) -> torch.Tensor:
    """Any of the selected bodies (e.g. the base) touches something with > ``threshold`` N."""
    return torch.any(torch.norm(env.robot.contact_forces_w[:, bodies], dim=-1) > threshold, dim=1)


def joint_pos_out_of_bounds(env, joints, limit: float) -> torch.Tensor:
    """|q| of any selected joint exceeds ``limit`` (e.g. the pole fell, the cart left the rail)."""
    return torch.any(torch.abs(env.robot.joint_pos.index_select(1, joints)) > limit, dim=1)


def base_height_below(env, height: float) -> torch.Tensor:
    """The base is lower than ``height`` [m] above the ground under it."""
    root = env.robot.root_pos_w
    return root[:, 2] - env.sim.ground_height(root[:, :2]) < height


def command_reached(env, position_threshold: float, orientation_threshold: float | None = None) -> torch.Tensor:
    """The commanded body is within ``position_threshold`` [m] of its commanded position and, given
    ``orientation_threshold`` [rad], within that angle of its commanded orientation (thresholds
    included). A success condition (``task.success``) for pose and position commands."""
    reached = env.command.position_error() <= position_threshold
    if orientation_threshold is not None:
        reached &= env.command.orientation_error() <= orientation_threshold
    return reached
