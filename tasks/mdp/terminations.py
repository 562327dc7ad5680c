"""Termination terms: ``f(env, **params) -> (num_envs,)`` bool. Time-outs are the env's own."""

import torch


def illegal_contact(env, bodies: str, threshold: float = 1.0) -> torch.Tensor:
    """Any of the selected bodies (e.g. the base) touches something with > ``threshold`` N."""
    ids = env.sim.find_bodies(bodies)
    return torch.any(torch.norm(env.sim.contact_forces[:, ids], dim=-1) > threshold, dim=1)


def joint_pos_out_of_bounds(env, joints: str, limit: float) -> torch.Tensor:
    """|q| of any selected joint exceeds ``limit`` (e.g. the pole fell, the cart left the rail)."""
    ids = env.sim.find_joints(joints)
    return torch.any(torch.abs(env.sim.joint_pos[:, ids]) > limit, dim=1)


def base_height_below(env, height: float) -> torch.Tensor:
    return env.sim.root_pos[:, 2] < height
