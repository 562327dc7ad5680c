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


def quat_from_euler_xyz(angles: torch.Tensor, near: torch.Tensor | None = None) -> torch.Tensor:
    """(..., 4) quaternions of the rotation R = Rz(yaw) Ry(pitch) Rx(roll), ``angles`` (..., 3) the
    roll, pitch and yaw [rad] (about the fixed x, then y, then z axes), each the one of q and -q
    nearer ``near`` (:func:`quat_near`), so that one rotation has one quaternion."""
    half = angles / 2
    (cr, cp, cy), (sr, sp, sy) = torch.cos(half).unbind(-1), torch.sin(half).unbind(-1)
    cc, ss, cs, sc = cr * cp, sr * sp, cr * sp, sr * cp  # roll's and pitch's products, each used twice
    q = torch.stack([sc * cy - cs * sy, cs * cy + sc * sy, cc * sy - ss * cy, cc * cy + ss * sy], dim=-1)
    return quat_near(q, near)


def quat_near(q: torch.Tensor, near: torch.Tensor | None = None) -> torch.Tensor:
    """``q`` (..., 4) or ``-q`` (the same rotation), whichever is nearer the orientation ``near``
    (4,); without one, the one with w >= 0 (nearer the identity)."""
    dot = q[..., 3:4] if near is None else (q * near).sum(-1, keepdim=True)
    return torch.where(dot < 0, -q, q)


def quat_error_magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(...,) angle [rad] of the rotation between orientations ``a`` and ``b`` (..., 4), in [0, pi]
    whichever sign either quaternion has."""
    # The rotation conj(a) * b, in vector form: its axis part and (a . b) its scalar part
    av, aw, bv, bw = a[..., :3], a[..., 3:], b[..., :3], b[..., 3:]
    axis = aw * bv - bw * av - torch.cross(av, bv, dim=-1)
    return 2.0 * torch.atan2(torch.linalg.vector_norm(axis, dim=-1), (a * b).sum(-1).abs())
