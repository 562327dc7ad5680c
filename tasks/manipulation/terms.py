"""Terms for a gripper and an object: where the object is, whether it is reached, grasped, lifted
and brought to the commanded goal (``task.command`` of type position on the object).

The object is a scene entity named by ``object`` (default ``cube``); ``bodies`` are the robot's
(the end effector, the fingers). Positions are in the robot's base frame (its first body).
"""

import torch

from legion.tasks.math import quat_rotate, quat_rotate_inverse


# --- observations ----------------------------------------------------------------------------
def object_position(env, object: str = "cube") -> torch.Tensor:
    """(num_envs, 3) [m] the object's position in the robot's base frame."""
    base_pos, base_quat = env.robot.body_pos_w[:, 0], env.robot.body_quat_w[:, 0]
    return quat_rotate_inverse(base_quat, env.scene[object].root_pos_w - base_pos)


def body_position(env, bodies="tcp") -> torch.Tensor:
    """(num_envs, 3) [m] the mean position of the robot's ``bodies`` (e.g. the tool centre point)
    in its base frame: on a robot, forward kinematics of the joint encoders."""
    robot = env.robot
    base_pos, base_quat = robot.body_pos_w[:, 0], robot.body_quat_w[:, 0]
    return quat_rotate_inverse(base_quat, robot.body_pos_w[:, bodies].mean(dim=1) - base_pos)


# --- rewards -----------------------------------------------------------------------------------
def reach_object(env, std: float, bodies="tcp", object: str = "cube") -> torch.Tensor:
    """1 - tanh(distance / std) between the end effector (``bodies``: the mean position of the
    matching bodies, e.g. one tool centre point) and the object [m]."""
    # Indexed by the index tensor, not by one element of it: a 0-d CUDA index is read to the host.
    distance = torch.norm(env.robot.body_pos_w[:, bodies].mean(dim=1) - env.scene[object].root_pos_w, dim=-1)
    return 1.0 - torch.tanh(distance / std)


def _grasp_point_distance(env, bodies, pad, object: str) -> torch.Tensor:
    """(num_envs,) [m] from the object's centre to the mean of the fingers' grasp points (``pad``:
    a point in each finger's frame [m], e.g. the middle of its pad)."""
    robot = env.robot
    quat = robot.body_quat_w[:, bodies]
    offset = torch.empty_like(quat[..., :3])
    for axis, value in enumerate(pad):  # filled on the device: a tensor made from `pad` would be a host copy per step
        offset[..., axis] = value
    points = robot.body_pos_w[:, bodies] + quat_rotate(quat, offset)
    return torch.norm(points.mean(dim=1) - env.scene[object].root_pos_w, dim=-1)


def object_grasped(env, bodies, pad=(0.0, 0.0, 0.0275), opening_axis: int = 1, object: str = "cube",
                   max_distance: float = 0.03, threshold: float = 1.0) -> torch.Tensor:
    """1 while the fingers (``bodies``) squeeze the object: each finger is pushed open (along its
    frame's ``opening_axis``, 0 x, 1 y, 2 z) by more than ``threshold`` [N], and the object's centre
    is within ``max_distance`` [m] of the mean of the fingers' grasp points (``pad``, in each
    finger's frame [m]). A finger pressed on the table beside the object is pushed along its
    length, not open, and does not count."""
    robot = env.robot
    force = quat_rotate_inverse(robot.body_quat_w[:, bodies], robot.contact_forces_w[:, bodies])
    squeezed = torch.all(force[..., opening_axis] > threshold, dim=1)
    return (squeezed & (_grasp_point_distance(env, bodies, pad, object) < max_distance)).float()


def object_lifted(env, height: float, bodies, pad=(0.0, 0.0, 0.0275), max_distance: float = 0.03,
                  object: str = "cube") -> torch.Tensor:
    """1 while the object is in the hand (its centre within ``max_distance`` [m] of the fingers'
    grasp points, as in :func:`object_grasped`) and more than ``height`` [m] above the robot's
    base. An object knocked into the air is not in the hand and earns nothing."""
    lifted = object_position(env, object)[:, 2] > height
    return (lifted & (_grasp_point_distance(env, bodies, pad, object) < max_distance)).float()


def object_goal_tanh(env, std: float, height: float, bodies, pad=(0.0, 0.0, 0.0275), max_distance: float = 0.03,
                     object: str = "cube") -> torch.Tensor:
    """(1 - tanh(distance to the commanded position / std)) while the object is lifted in the hand
    (:func:`object_lifted`); 0 otherwise (the stage after lifting)."""
    held = object_lifted(env, height, bodies, pad, max_distance, object)
    return held * (1.0 - torch.tanh(env.command.position_error() / std))


# --- terminations ------------------------------------------------------------------------------
def object_out_of_reach(env, distance: float, object: str = "cube") -> torch.Tensor:
    """The object is more than ``distance`` [m] from the robot's base (knocked off the table)."""
    return torch.norm(object_position(env, object), dim=-1) > distance
