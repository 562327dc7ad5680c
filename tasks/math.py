"""Quaternion helpers on (..., 4) tensors in Newton's (x, y, z, w) order."""

import functools
from typing import NamedTuple

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
    return _bilinear(a, b)


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
    tables = _tables(angles.device, angles.dtype)
    sums = angles @ tables.euler_sums
    return quat_near(torch.cat([sums.cos(), sums.sin()], -1) @ tables.euler_quat, near)


def quat_near(q: torch.Tensor, near: torch.Tensor | None = None) -> torch.Tensor:
    """``q`` (..., 4) or ``-q`` (the same rotation), whichever is nearer the orientation ``near``
    (4,); without one, the one with w >= 0 (nearer the identity)."""
    dot = q[..., 3:4] if near is None else (q * near).sum(-1, keepdim=True)
    return torch.where(dot < 0, -q, q)


def quat_error_magnitude(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(...,) angle [rad] of the rotation between orientations ``a`` and ``b`` (..., 4), in [0, pi]
    whichever sign either quaternion has."""
    difference = _bilinear(a, b, conjugate_a=True)
    return 2.0 * torch.atan2(torch.linalg.vector_norm(difference[..., :3], dim=-1), difference[..., 3].abs())


def _bilinear(a: torch.Tensor, b: torch.Tensor, conjugate_a: bool = False) -> torch.Tensor:
    """``a * b`` (or ``conj(a) * b``) of (..., 4) quaternions: the 16 products a_j b_k of their
    components (j major) times a (16, 4) table. Three tensor operations where the component form
    takes a dozen, and on a CPU the env's step costs what its tensor operations number."""
    tables = _tables(a.device, a.dtype)
    products = a.index_select(-1, tables.pick_a) * b.index_select(-1, tables.pick_b)
    return products @ (tables.conjugate_product if conjugate_a else tables.product)


class _Tables(NamedTuple):
    pick_a: torch.Tensor  # (16,) j of the products a_j b_k
    pick_b: torch.Tensor  # (16,) k
    product: torch.Tensor  # (16, 4): a * b
    conjugate_product: torch.Tensor  # (16, 4): conj(a) * b
    euler_sums: torch.Tensor  # (3, 4): the half-angle sums +-roll/2 +-pitch/2 +-yaw/2
    euler_quat: torch.Tensor  # (8, 4): their cosines and sines to (x, y, z, w)


@functools.cache
def _tables(device: torch.device, dtype: torch.dtype) -> _Tables:
    """The helpers' constant tensors, made once per device (a step captured on a GPU cannot copy
    them from the host) and outside inference mode (usable by autograd too). Float32 matrix
    products: exact to rounding, unless TF32 is switched on for them (torch's default is off)."""

    def left_product(a: list[float]) -> list[list[float]]:  # L(a) with a * b = L(a) b
        x, y, z, w = a
        return [[w, -z, y, x], [z, w, -x, y], [-y, x, w, z], [-x, -y, -z, w]]

    with torch.inference_mode(False):
        # (a * b)_i = sum over j, k of a_j b_k L(e_j)_ik; conj(a) negates a's x, y, z
        product = torch.tensor([left_product(e) for e in torch.eye(4).tolist()]).transpose(1, 2).reshape(16, 4)
        conjugate = torch.tensor([-1.0, -1.0, -1.0, 1.0]).repeat_interleave(4)[:, None]
        euler_sums = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1]]) / 2
        euler_quat = torch.tensor([[1, -1, 1, 1], [-1, 1, 1, 1], [-1, -1, -1, 1], [1, 1, -1, 1],
                                   [1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]]) / 4
        return _Tables(torch.arange(4).repeat_interleave(4).to(device), torch.arange(4).repeat(4).to(device),
                       *(t.to(device, dtype) for t in (product, product * conjugate, euler_sums, euler_quat)))
