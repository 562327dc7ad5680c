"""Quaternion helpers on (..., 4) tensors in Newton's (x, y, z, w) order."""

import functools

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
    # Bilinear: the 16 products a_j b_k times a constant (16, 4) table. Three tensor operations
    # instead of the component form's dozen: on a CPU the env's step costs what its operations number.
    pick_a, pick_b, table, _ = _hamilton(a.device, a.dtype)
    return (a.index_select(-1, pick_a) * b.index_select(-1, pick_b)) @ table


def quat_rotate(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotates vectors ``v`` (..., 3) given in the frame of orientation ``q`` (..., 4) into the world frame."""
    xyz, w = q[..., :3], q[..., 3:4]
    t = 2.0 * torch.cross(xyz, v, dim=-1)
    return v + w * t + torch.cross(xyz, t, dim=-1)


def quat_from_euler_xyz(angles: torch.Tensor, near: torch.Tensor | None = None) -> torch.Tensor:
    """(..., 4) quaternions of the rotation R = Rz(yaw) Ry(pitch) Rx(roll), ``angles`` (..., 3) the
    roll, pitch and yaw [rad] (about the fixed x, then y, then z axes), each the one of q and -q
    nearer ``near`` (:func:`quat_near`), so that one rotation has one quaternion."""
    # Product to sum: each component (a sum of two products of three half-angle cosines and sines)
    # is a quarter of a signed sum of the cosines and sines of four sums of the half angles.
    combine, to_quat = _euler(angles.device, angles.dtype)
    sums = angles @ combine
    return quat_near(torch.cat([sums.cos(), sums.sin()], -1) @ to_quat, near)


def quat_near(q: torch.Tensor, near: torch.Tensor | None = None) -> torch.Tensor:
    """``q`` (..., 4) or ``-q`` (the same rotation), whichever is nearer the orientation ``near``
    (4,); without one, the one with w >= 0 (nearer the identity)."""
    dot = q[..., 3:4] if near is None else (q * near).sum(-1, keepdim=True)
    return torch.where(dot < 0, -q, q)


def quat_error_magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(...,) angle [rad] of the rotation between orientations ``a`` and ``b`` (..., 4), in [0, pi]
    whichever sign either quaternion has."""
    pick_a, pick_b, _, conjugate_table = _hamilton(a.device, a.dtype)
    difference = (a.index_select(-1, pick_a) * b.index_select(-1, pick_b)) @ conjugate_table  # conj(a) * b
    return 2.0 * torch.atan2(torch.linalg.vector_norm(difference[..., :3], dim=-1), difference[..., 3].abs())


def _left_product(a) -> list[list[float]]:
    """The matrix L(a) with ``a * b = L(a) b``, (x, y, z, w) order."""
    x, y, z, w = a
    return [[w, -z, y, x], [z, w, -x, y], [-y, x, w, z], [-x, -y, -z, w]]


# The constant tensors of the helpers above, made once per device (a step captured on a GPU cannot
# copy them from the host) and outside inference mode (usable by autograd too).
@functools.cache
def _hamilton(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Which of a's and b's components make the 16 products a_j b_k, and the (16, 4) tables that
    turn them into a * b and into conj(a) * b: (a * b)_i = sum over j, k of a_j b_k L(e_j)_ik."""
    with torch.inference_mode(False):
        table = torch.tensor([_left_product(e) for e in torch.eye(4).tolist()]).transpose(1, 2).reshape(16, 4)
        conjugate_table = table * torch.tensor([-1.0, -1.0, -1.0, 1.0]).repeat_interleave(4)[:, None]
        pick_a, pick_b = torch.arange(4).repeat_interleave(4), torch.arange(4).repeat(4)
        return pick_a.to(device), pick_b.to(device), table.to(device, dtype), conjugate_table.to(device, dtype)


@functools.cache
def _euler(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums +-roll/2 +-pitch/2 +-yaw/2 (3, 4), and (8, 4): their cosines and sines to (x, y, z, w)."""
    with torch.inference_mode(False):
        combine = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1]]) / 2
        to_quat = torch.tensor([[1, -1, 1, 1], [-1, 1, 1, 1], [-1, -1, -1, 1], [1, 1, -1, 1],
                                [1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]]) / 4
        return combine.to(device, dtype), to_quat.to(device, dtype)
