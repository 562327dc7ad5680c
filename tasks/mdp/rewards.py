"""Reward terms: ``f(env, **params) -> (num_envs,)``; the env multiplies by weight and control dt."""

import torch


def is_alive(env) -> torch.Tensor:
    """1 for every step that does not end in a failure."""
    return (~env.terminated).float()


def is_terminated(env) -> torch.Tensor:
    """1 on the step an episode fails (time-outs excluded)."""
    return env.terminated.float()


def joint_pos_target_l2(env, joints, target: float = 0.0) -> torch.Tensor:
    """Squared distance of the selected joints from ``target`` [rad^2]."""
    return torch.sum(torch.square(env.robot.joint_pos.index_select(1, joints) - target), dim=1)


def joint_vel_l1(env, joints=".*") -> torch.Tensor:
    """Sum of |joint velocity| of the selected joints [rad/s]."""
    return torch.sum(torch.abs(env.robot.joint_vel.index_select(1, joints)), dim=1)


def joint_vel_l2(env, joints=".*") -> torch.Tensor:
    """Sum of squared joint velocities of the selected joints [rad^2/s^2]."""
    return torch.sum(torch.square(env.robot.joint_vel.index_select(1, joints)), dim=1)


def position_command_error(env) -> torch.Tensor:
    """Distance of the commanded body from its commanded position [m] (command type pose or position)."""
    return env.command.position_error()


def position_command_error_tanh(env, std: float) -> torch.Tensor:
    """1 - tanh(distance / std): 1 at the commanded position, falling off within a few ``std`` [m]."""
    return 1.0 - torch.tanh(env.command.position_error() / std)


def orientation_command_error(env) -> torch.Tensor:
    """Angle between the commanded body's orientation and the commanded one [rad] (command type pose)."""
    return env.command.orientation_error()


def orientation_command_error_tanh(env, std: float) -> torch.Tensor:
    """1 - tanh(angle / std): 1 at the commanded orientation, falling off within a few ``std`` [rad]."""
    return 1.0 - torch.tanh(env.command.orientation_error() / std)


def track_lin_vel_xy_exp(env, std: float) -> torch.Tensor:
    """exp(-|v_xy,cmd - v_xy|^2 / std^2), base frame."""
    error = torch.sum(torch.square(env.command.value[:, :2] - env.robot.root_lin_vel_b[:, :2]), dim=1)
    return torch.exp(-error / std**2)


def track_ang_vel_z_exp(env, std: float) -> torch.Tensor:
    """exp(-(yaw_rate_cmd - yaw_rate)^2 / std^2)."""
    error = torch.square(env.command.value[:, 2] - env.robot.root_ang_vel_b[:, 2])
    return torch.exp(-error / std**2)


def lin_vel_z_l2(env) -> torch.Tensor:
    """Squared vertical base velocity, base frame [m^2/s^2]."""
    return torch.square(env.robot.root_lin_vel_b[:, 2])


def ang_vel_xy_l2(env) -> torch.Tensor:
    """Squared roll and pitch rates, base frame [rad^2/s^2]."""
    return torch.sum(torch.square(env.robot.root_ang_vel_b[:, :2]), dim=1)


def flat_orientation_l2(env) -> torch.Tensor:
    """Squared distance of the base-frame gravity from straight down, (0, 0, -1).

    For small tilts this is Isaac Lab's term (the horizontal part of gravity squared); unlike
    that term it does not vanish for a robot lying on its back (there it is 4).
    """
    gravity = env.robot.projected_gravity_b
    return gravity[:, 0] ** 2 + gravity[:, 1] ** 2 + (gravity[:, 2] + 1.0) ** 2


def joint_torques_l2(env) -> torch.Tensor:
    """Squared torques the actuators apply [N^2 m^2]."""
    return torch.sum(torch.square(env.action.applied_torque()), dim=1)


def action_rate_l2(env) -> torch.Tensor:
    """Squared change of the policy's action since the previous step."""
    return torch.sum(torch.square(env.action.actions - env.action.prev_actions), dim=1)


def feet_air_time(env, bodies, threshold: float = 0.5, min_command: float = 0.1) -> torch.Tensor:
    """legged_gym's reward for long steps: sum over feet of (air time - threshold) at touchdown.

    Zero while the command is (nearly) stand still, so standing robots are not pushed to step.
    """
    contacts = env.contacts
    reward = torch.sum((contacts.last_air_time[:, bodies] - threshold) * contacts.first_contact[:, bodies], dim=1)
    return reward * (torch.norm(env.command.value[:, :2], dim=1) > min_command)


def feet_air_time_positive_biped(env, bodies, threshold: float = 0.4, min_command: float = 0.1) -> torch.Tensor:
    """Isaac Lab's biped gait reward: in single stance (exactly one selected foot on the ground),
    the shorter of the two feet's current phase durations (the stance foot's contact time, the
    swing foot's air time), capped at ``threshold`` [s]; zero in double stance or flight, and while
    the command is (nearly) stand still. Pays for alternating steps of up to ``threshold``."""
    contacts = env.contacts
    in_contact = contacts.contact_time[:, bodies] > 0.0
    phase = torch.where(in_contact, contacts.contact_time[:, bodies], contacts.air_time[:, bodies])
    single_stance = in_contact.sum(dim=1) == 1
    reward = torch.where(single_stance[:, None], phase, 0.0).min(dim=1).values.clamp(max=threshold)
    return reward * (torch.norm(env.command.value[:, :2], dim=1) > min_command)


def feet_slide(env, bodies, threshold: float = 1.0) -> torch.Tensor:
    """Foot slip: sum over the selected bodies touching the ground (> ``threshold`` N) of their
    horizontal speed [m/s]."""
    robot = env.robot
    touching = torch.norm(robot.contact_forces_w[:, bodies], dim=-1) > threshold
    return torch.sum(torch.norm(robot.body_lin_vel_w[:, bodies, :2], dim=-1) * touching, dim=1)


def joint_deviation_l1(env, joints) -> torch.Tensor:
    """Sum of |joint position - default| over the selected joints [rad] (e.g. hip yaw and roll,
    which a biped should hold near their default)."""
    robot = env.robot
    return torch.sum(torch.abs((robot.joint_pos - robot.default_joint_pos).index_select(1, joints)), dim=1)


def undesired_contacts(env, bodies, threshold: float = 1.0) -> torch.Tensor:
    """Number of the selected bodies touching something with more than ``threshold`` newtons."""
    return torch.sum(torch.norm(env.robot.contact_forces_w[:, bodies], dim=-1) > threshold, dim=1).float()
