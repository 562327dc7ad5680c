"""Quaternion helpers on (..., 4) tensors in Newton's (x, y, z, w) order."""

import torch


def quat_rotate_inverse(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotates world-frame vectors ``v`` (..., 3) into the frame of orientation ``q`` (..., 4)."""
    xyz, w = q[..., :3], q[..., 3:4]
    t = 2.0 * torch.cross(xyz, v, dim=-1)
    return v - w * t + torch.cross(xyz, t, dim=-1)


def quat_from_yaw(yaw: torch.Tensor) -> torch.Tensor:
    """(..., ) yaw angles [rad] to (..., 4) quaternions about +z."""
    zero = torch.zeros_like(yaw)
    return torch.stack([zero, zero, torch.sin(yaw / 2), torch.cos(yaw / 2)], dim=-1)
