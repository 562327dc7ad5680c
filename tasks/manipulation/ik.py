"""Task-space control of an arm: one body's pose and Jacobian from the joint positions
(:class:`KinematicChain`, read from the simulator's own model) and damped-least-squares
differential IK (:func:`dls`), which :class:`legion.tasks.mdp.actions.TaskSpaceAction` drives.

Everything is in the frame of the robot's base (its first body), as the commands and the object
observations are, and is made of batched matrix products only: the same code runs in the env on
any device, inside a captured CUDA graph, and traced into an ONNX graph.
"""

from __future__ import annotations

import numpy as np
import torch

REVOLUTE, PRISMATIC, FIXED = 1, 0, 3  # newton.JointType


def _matrix(xform: np.ndarray) -> np.ndarray:
    """A Newton transform (px, py, pz, qx, qy, qz, qw) as a 4x4 homogeneous matrix."""
    x, y, z, w = xform[3:7] / np.linalg.norm(xform[3:7])
    m = np.eye(4)
    m[:3, :3] = [[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                 [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                 [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]]
    m[:3, 3] = xform[:3]
    return m


def skew(v: torch.Tensor) -> torch.Tensor:
    """(..., 3) -> (..., 3, 3): the matrix of the cross product ``v x``."""
    x, y, z = v.unbind(-1)
    zero = torch.zeros_like(x)
    return torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], -1).reshape(*v.shape[:-1], 3, 3)


def axis_angle_matrix(rotvec: torch.Tensor) -> torch.Tensor:
    """(..., 3) rotation vectors (axis times angle [rad]) -> (..., 3, 3) rotation matrices (Rodrigues)."""
    angle = rotvec.norm(dim=-1, keepdim=True)[..., None]  # (..., 1, 1)
    k = skew(rotvec / angle.squeeze(-1).clamp_min(1e-9))
    eye = torch.eye(3, dtype=rotvec.dtype, device=rotvec.device).expand_as(k)
    return eye + torch.sin(angle) * k + (1 - torch.cos(angle)) * (k @ k)


def rotation_error(desired: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """(..., 3): sin(angle) times the axis of the rotation from ``current`` to ``desired`` (both
    (..., 3, 3), base frame): the rotation vector for small errors, smooth everywhere and free of the
    log map's singularities (it fades past 90 degrees, where a controller turns the short way anyway)."""
    e = desired @ current.transpose(-1, -2)
    return 0.5 * torch.stack([e[..., 2, 1] - e[..., 1, 2], e[..., 0, 2] - e[..., 2, 0],
                              e[..., 1, 0] - e[..., 0, 1]], -1)


def dls(jacobian: torch.Tensor, error: torch.Tensor, damping: float, iterations: int = 12) -> torch.Tensor:
    """Damped least squares: the joint step ``J^T (J J^T + damping^2 I)^-1 error`` (Nakamura and
    Hanafusa; Buss, "Introduction to inverse kinematics", 2004), (n, 6, k) x (n, 6) -> (n, k).

    Near a singularity the damping trades accuracy for bounded joint steps, so the motion slows
    smoothly instead of jumping. The 6x6 system is solved by conjugate gradients unrolled for a
    fixed number of iterations (it is symmetric positive definite; 6 suffice in exact arithmetic):
    matrix products only, so ONNX exports it and a CUDA graph replays it."""
    a = jacobian @ jacobian.transpose(1, 2) + damping ** 2 * torch.eye(6, dtype=error.dtype, device=error.device)
    x = torch.zeros_like(error)
    r = error
    p = r
    rs = (r * r).sum(-1, keepdim=True)
    for _ in range(iterations):
        ap = (a @ p[..., None]).squeeze(-1)
        alpha = rs / ((p * ap).sum(-1, keepdim=True) + 1e-20)
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = (r * r).sum(-1, keepdim=True)
        p = r + rs_new / (rs + 1e-20) * p
        rs = rs_new
    return (jacobian.transpose(1, 2) @ x[..., None]).squeeze(-1)


class KinematicChain:
    """The pose and geometric Jacobian of one of the robot's bodies as functions of its joint
    positions, in the frame of the robot's base (its first body).

    The chain is read from the simulator's model (each joint's parent and child frames, axis and
    type, world 0), so it is the model that is simulated, not a second description of the robot:
    ``tests/test_ik.py`` holds the pose to the simulator's own body poses.

    Args:
        sim: the :class:`~legion.tasks.sim.NewtonSim`.
        robot: its :class:`~legion.tasks.sim.Articulation`.
        body: the body's name (e.g. ``tcp``).
    """

    def __init__(self, sim, robot, body: str):
        model = sim.model
        first_body = robot.slices.bodies.start
        try:
            ids = robot.find_bodies(body)
        except ValueError as e:
            raise ValueError(f"task.action.params.body: {e}") from None
        if len(ids) != 1:
            raise ValueError(f"task.action.params.body: '{body}' matches {len(ids)} bodies of the robot; name one of "
                             f"{robot.body_names}.")
        parent, child = model.joint_parent.numpy(), model.joint_child.numpy()
        joint_type, qd_start = model.joint_type.numpy(), model.joint_qd_start.numpy()
        x_p, x_c, axes = model.joint_X_p.numpy(), model.joint_X_c.numpy(), model.joint_axis.numpy()
        joint_of = {int(child[j]): j for j in range(robot.slices.joints.start, robot.slices.joints.stop)}
        root = first_body
        chain, b = [], first_body + ids[0]
        while b != root:
            j = joint_of[b]
            chain.append(j)
            b = int(parent[j])
            if b < 0:
                raise ValueError(f"{body} is not below the robot's base body {robot.body_names[0]}.")
        chain.reverse()
        self.body = robot.body_names[ids[0]]
        self.joint_ids: list[int] = []  # the robot's joints (columns of joint_pos) that move the body
        # Per joint: the parent-side frame in the parent body, the axis in that frame, the inverse
        # child-side frame; FIXED joints fold into the next joint's parent frame.
        parents, axes_of, kinds, inv_children = [], [], [], []
        carried = np.eye(4)
        for j in chain:
            frame = carried @ _matrix(x_p[j])
            if joint_type[j] == FIXED:
                carried = frame @ np.linalg.inv(_matrix(x_c[j]))
                continue
            if joint_type[j] not in (REVOLUTE, PRISMATIC):
                raise ValueError(f"{self.body}'s chain has a joint of type {joint_type[j]}: only hinges and slides "
                                 "are supported for task-space control.")
            self.joint_ids.append(int(qd_start[j]) - robot.joint_dofs.start)
            parents.append(frame)
            axes_of.append(axes[qd_start[j]])
            kinds.append(bool(joint_type[j] == REVOLUTE))
            inv_children.append(np.linalg.inv(_matrix(x_c[j])))
            carried = np.eye(4)
        if not self.joint_ids:
            raise ValueError(f"no joint moves {self.body}: task-space control needs a body on the arm's chain.")
        t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32, device=sim.device)  # noqa: E731
        self.parent_frames, self.inv_child_frames, self.tip = t(parents), t(inv_children), t(carried)
        self.axes = t(axes_of)
        self.revolute = kinds

    def __call__(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The body's pose and Jacobian at the robot's joint positions ``q`` (n, num_joints) [rad or
        m]: position (n, 3) [m], rotation (n, 3, 3) and Jacobian (n, 6, k) over the chain's k joints
        (``joint_ids``; linear rows first), all in the base frame."""
        n = q.shape[0]
        eye = torch.eye(3, dtype=q.dtype, device=q.device).expand(n, 3, 3)
        zero = torch.zeros(n, 3, dtype=q.dtype, device=q.device)
        frame = _homogeneous(eye, zero)
        origins, axes = [], []
        for i, (column, revolute) in enumerate(zip(self.joint_ids, self.revolute)):
            joint = frame @ self.parent_frames[i]  # the joint's frame before it moves
            motion = self.axes[i] * q[:, column:column + 1]  # (n, 3): rotation vector or translation
            origins.append(joint[:, :3, 3])
            axes.append(joint[:, :3, :3] @ self.axes[i])
            moved = _homogeneous(axis_angle_matrix(motion), zero) if revolute else _homogeneous(eye, motion)
            frame = joint @ moved @ self.inv_child_frames[i]
        frame = frame @ self.tip
        position = frame[:, :3, 3]
        columns = [torch.cat([torch.cross(axis, position - origin, dim=-1), axis], -1) if revolute
                   else torch.cat([axis, torch.zeros_like(axis)], -1)
                   for origin, axis, revolute in zip(origins, axes, self.revolute)]
        return position, frame[:, :3, :3], torch.stack(columns, -1)


def _homogeneous(rotation: torch.Tensor, translation: torch.Tensor) -> torch.Tensor:
    """(n, 3, 3), (n, 3) -> (n, 4, 4)."""
    bottom = torch.cat([torch.zeros_like(translation[:, None]), torch.ones_like(translation[:, None, :1])], 2)
    return torch.cat([torch.cat([rotation, translation[..., None]], 2), bottom], 1)
