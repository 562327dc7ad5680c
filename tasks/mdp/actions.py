"""Action terms: turn the policy's (num_envs, num_actions) output into joint commands.

Both terms can delay actions per env (actuator latency, set by the ``action_delay`` event):
with delay k the command applied at control step t is the one built from the action of step t-k.
``actions`` / ``prev_actions`` stay the policy's own latest outputs (for observations and rewards).
"""

import torch


class JointPositionAction:
    """Position-PD targets: ``target = default + scale * action``; the PD gains are the model's
    (``joint_target_ke`` / ``joint_target_kd``), applied by the solver at every physics step."""

    def __init__(self, env, scale: float = 0.25, clip: float | None = None):
        self.env, self.scale, self.clip = env, scale, clip
        self._init_buffers(env.sim.num_joints)

    def _init_buffers(self, dim: int) -> None:
        env = self.env
        self.actions = torch.zeros(env.num_envs, dim, device=env.device)
        self.prev_actions = torch.zeros_like(self.actions)
        self.delay = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)  # control steps
        self._history = self.actions[None].clone()  # (max_delay + 1, num_envs, dim) ring buffer
        self._head = 0  # the slot of the newest action
        self._env_index = torch.arange(env.num_envs, device=env.device)

    @property
    def dim(self) -> int:
        return self.actions.shape[1]

    def set_delay(self, env_ids: torch.Tensor, delay: torch.Tensor, max_delay: int) -> None:
        """Delays the actions of ``env_ids`` by ``delay`` (k,) whole control steps, all <= ``max_delay``."""
        size = max_delay + 1
        if size > self._history.shape[0]:  # grow the ring, oldest slots first in line
            old = torch.roll(self._history, -(self._head + 1), dims=0)  # oldest ... newest
            pad = old[:1].expand(size - old.shape[0], -1, -1)
            self._history = torch.cat([pad, old]).contiguous()
            self._head = size - 1
        self.delay[env_ids] = delay

    def _delayed(self, actions: torch.Tensor) -> torch.Tensor:
        """Records this step's actions and returns, per env, the one ``delay`` steps old."""
        self.prev_actions.copy_(self.actions)
        self.actions.copy_(actions.clamp(-self.clip, self.clip) if self.clip else actions)
        size = self._history.shape[0]
        if size == 1:
            return self.actions
        self._head = (self._head + 1) % size
        self._history[self._head] = self.actions
        return self._history[(self._head - self.delay) % size, self._env_index]

    def apply(self, actions: torch.Tensor) -> None:
        applied = self._delayed(actions)
        self.env.sim.joint_target_pos.copy_(self.env.default_joint_pos + self.scale * applied)

    def applied_torque(self) -> torch.Tensor:
        """(num_envs, num_joints) [N*m]: the PD torque, clipped to the (per-env) effort limits."""
        sim = self.env.sim
        torque = sim.joint_stiffness * (sim.joint_target_pos - sim.joint_pos) - sim.joint_damping * sim.joint_vel
        return torch.clamp(torque, -sim.joint_effort_limit, sim.joint_effort_limit)

    def reset(self, env_ids: torch.Tensor) -> None:
        self.actions[env_ids] = 0.0
        self.prev_actions[env_ids] = 0.0
        self._history[:, env_ids] = 0.0


class JointEffortAction(JointPositionAction):
    """Generalized forces on the selected joints: ``effort = scale * action`` [N or N*m]."""

    def __init__(self, env, joints: str = ".*", scale: float = 1.0, clip: float | None = None):
        self.env, self.scale, self.clip = env, scale, clip
        self.joint_ids = env.sim.find_joints(joints)
        self._init_buffers(len(self.joint_ids))

    def apply(self, actions: torch.Tensor) -> None:
        self.env.sim.joint_effort[:, self.joint_ids] = self.scale * self._delayed(actions)

    def applied_torque(self) -> torch.Tensor:
        return self.env.sim.joint_effort


ACTIONS = {"joint_position": JointPositionAction, "joint_effort": JointEffortAction}
