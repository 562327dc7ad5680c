"""Action terms: turn the policy's (num_envs, num_actions) output into joint commands."""

import torch


class JointPositionAction:
    """Position-PD targets: ``target = default + scale * action``; the PD gains are the model's
    (``joint_target_ke`` / ``joint_target_kd``), applied by the solver at every physics step."""

    def __init__(self, env, scale: float = 0.25, clip: float | None = None):
        self.env, self.scale, self.clip = env, scale, clip
        self.actions = torch.zeros(env.num_envs, env.sim.num_joints, device=env.device)
        self.prev_actions = torch.zeros_like(self.actions)

    @property
    def dim(self) -> int:
        return self.actions.shape[1]

    def apply(self, actions: torch.Tensor) -> None:
        self.prev_actions.copy_(self.actions)
        self.actions.copy_(actions.clamp(-self.clip, self.clip) if self.clip else actions)
        self.env.sim.joint_target_pos.copy_(self.env.default_joint_pos + self.scale * self.actions)

    def applied_torque(self) -> torch.Tensor:
        """(num_envs, num_joints) [N*m]: the PD torque, clipped to the effort limits."""
        sim = self.env.sim
        torque = sim.joint_stiffness * (sim.joint_target_pos - sim.joint_pos) - sim.joint_damping * sim.joint_vel
        return torch.clamp(torque, -sim.effort_limits, sim.effort_limits)

    def reset(self, env_ids: torch.Tensor) -> None:
        self.actions[env_ids] = 0.0
        self.prev_actions[env_ids] = 0.0


class JointEffortAction(JointPositionAction):
    """Generalized forces on the selected joints: ``effort = scale * action`` [N or N*m]."""

    def __init__(self, env, joints: str = ".*", scale: float = 1.0, clip: float | None = None):
        self.env, self.scale, self.clip = env, scale, clip
        self.joint_ids = env.sim.find_joints(joints)
        self.actions = torch.zeros(env.num_envs, len(self.joint_ids), device=env.device)
        self.prev_actions = torch.zeros_like(self.actions)

    def apply(self, actions: torch.Tensor) -> None:
        self.prev_actions.copy_(self.actions)
        self.actions.copy_(actions.clamp(-self.clip, self.clip) if self.clip else actions)
        self.env.sim.joint_effort[:, self.joint_ids] = self.scale * self.actions

    def applied_torque(self) -> torch.Tensor:
        return self.env.sim.joint_effort


ACTIONS = {"joint_position": JointPositionAction, "joint_effort": JointEffortAction}
