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


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product ``a * b`` of (..., 4) quaternions: rotation ``b`` first, then ``a``."""
    # In vector form (a_w b + b_w a + a x b, a_w b_w - a . b): a third of the per-component form's
    # tensor operations, which is what the env's step costs on a CPU at a few hundred envs.
    av, aw, bv, bw = a[..., :3], a[..., 3:], b[..., :3], b[..., 3:]
    return torch.cat([aw * bv + bw * av + torch.cross(av, bv, dim=-1),
                      aw * bw - (av * bv).sum(-1, keepdim=True)], dim=-1)


def quat_rotate(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotates vectors ``v`` (..., 3) given in the frame of orientation ``q`` (..., 4) into the world frame."""
    xyz, w = q[..., :3], q[..., 3:4]
    t = 2.0 * torch.cross(xyz, v, dim=-1)
    return v + w * t + torch.cross(xyz, t, dim=-1)


def quat_from_euler_xyz(roll: torch.Tensor, pitch: torch.Tensor, yaw: torch.Tensor) -> torch.Tensor:
    """(..., 4) quaternions of the rotation R = Rz(yaw) Ry(pitch) Rx(roll) (angles [rad] about the
    fixed x, then y, then z axes), with w >= 0 so that one rotation has one quaternion."""
    cr, sr = torch.cos(roll / 2), torch.sin(roll / 2)
    cp, sp = torch.cos(pitch / 2), torch.sin(pitch / 2)
    cy, sy = torch.cos(yaw / 2), torch.sin(yaw / 2)
    q = torch.stack([sr * cp * cy - cr * sp * sy,
                     cr * sp * cy + sr * cp * sy,
                     cr * cp * sy - sr * sp * cy,
                     cr * cp * cy + sr * sp * sy], dim=-1)
    return torch.where(q[..., 3:4] < 0, -q, q)


def quat_error_magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(...,) angle [rad] of the rotation between orientations ``a`` and ``b`` (..., 4), in [0, pi]
    whichever sign either quaternion has."""
    # The rotation conj(a) * b, in vector form: its axis part and (a . b) its scalar part
    av, aw, bv, bw = a[..., :3], a[..., 3:], b[..., :3], b[..., 3:]
    axis = aw * bv - bw * av - torch.cross(av, bv, dim=-1)
    return 2.0 * torch.atan2(torch.linalg.vector_norm(axis, dim=-1), (a * b).sum(-1).abs())
