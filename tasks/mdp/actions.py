"""Action terms: turn the policy's (num_envs, num_actions) output into joint commands.

Every term drives the actuated joints matching ``joints`` (``joint_ids``, in the model's order):
``command = offset + scale * action``, with ``offset`` the default pose for position targets, the
previous targets for position deltas (from the joint positions an episode starts at) and zero
for efforts. All can delay actions per env (actuator latency, set by the ``action_delay``
event): with delay k the command applied at control step t is the one built from the action of
step t-k. ``actions`` / ``prev_actions`` stay the policy's own latest outputs (for observations
and rewards).
"""

import math
from collections.abc import Mapping

import torch

from legion.tasks.manipulation.ik import KinematicChain, axis_angle_matrix, dls, rotation_error


def per_joint_scale(robot, joint_ids: list[int], scale: Mapping[str, float]) -> torch.Tensor:
    """(len(joint_ids),) scales from joint regex -> value (later patterns win); every driven joint
    needs one."""
    names = [robot.joint_names[i] for i in joint_ids]
    values = [math.nan] * len(names)
    for pattern, value in scale.items():
        matched = set(robot.find_joints(pattern))
        values = [float(value) if i in matched else v for i, v in zip(joint_ids, values)]
    missing = [name for name, v in zip(names, values) if math.isnan(v)]
    if missing:
        raise ValueError(f"action scale {dict(scale)} gives no value to the driven joints {missing}; add a pattern "
                         "that matches them (e.g. '.*': 0.25 first, for the rest).")
    return torch.tensor(values, device=robot.default_joint_pos.device)


class JointPositionAction:
    """Position-PD targets: ``target = default + scale * action``, clamped to the joint limits if
    ``clamp_to_limits``; the PD gains are the robot's (``joint_stiffness`` / ``joint_damping``),
    applied by the solver at every physics step. Unclamped, a target past a limit makes the PD
    push the joint through the solver's soft limit with its full effort (a gripper's fingers
    squeezed 1 cm past their stroke)."""

    position_targets = True  # drives the joints' PD targets (not their efforts)
    max_target_rate: float | None = None  # [rad/s] (task.action.max_target_rate), set by the env

    def __init__(self, env, joints: str = ".*", scale: float | Mapping[str, float] = 1.0, clip: float | None = None,
                 clamp_to_limits: bool = False):
        self.env, self.clip, self.clamp_to_limits = env, clip, clamp_to_limits
        self.joint_ids = torch.tensor(env.robot.find_joints(joints), dtype=torch.long, device=env.device)
        self.scale = per_joint_scale(env.robot, self.joint_ids.tolist(), scale) if isinstance(scale, Mapping) else scale
        if self.position_targets:
            limp = [env.robot.joint_names[i] for i in self.joint_ids.tolist() if env.robot.joint_stiffness[0, i] == 0]
            if limp:  # a URDF has no drives: the robot would collapse, and its worlds go NaN within a second
                raise ValueError(
                    f"task.action drives {limp} to position targets, but their stiffness (the PD gain kp) is 0: the "
                    "robot's model file sets no drive (a URDF has none). Give them actuators in the robot's config, "
                    "task.scene.robot.actuators (configs/robot/panda.yaml is an example), e.g. "
                    "+task.scene.robot.actuators.all='{joints: \".*\", stiffness: 80, damping: 4, effort_limit: 50}'.")
        self.actions = torch.zeros(env.num_envs, len(self.joint_ids), device=env.device)
        self.prev_actions = torch.zeros_like(self.actions)
        self.delay = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)  # control steps
        self._history = self.actions[None].clone()  # (max_delay + 1, num_envs, dim) ring buffer
        # The slot of the newest action, on the device: a Python counter would be frozen in a
        # captured step (sim.capture_step), whose replays repeat the value it had at capture.
        self._head = torch.zeros((), dtype=torch.long, device=env.device)
        self._env_index = torch.arange(env.num_envs, device=env.device)
        self._rate_free = torch.ones(env.num_envs, 1, dtype=torch.bool, device=env.device)  # an episode's first step

    @property
    def dim(self) -> int:
        return self.actions.shape[1]

    @property
    def offset(self) -> torch.Tensor:
        """(num_envs, dim): the command for a zero action (the default pose of the driven joints)."""
        return self.env.robot.default_joint_pos.index_select(1, self.joint_ids)

    def set_delay(self, mask: torch.Tensor, delay: torch.Tensor, max_delay: int) -> None:
        """Delays the actions of the envs in ``mask`` by ``delay`` (num_envs,) whole control steps,
        all <= ``max_delay``."""
        size = max_delay + 1
        if size > self._history.shape[0]:  # grow the ring (once, as the env is built), oldest slots first in line
            slots = self._history.shape[0]
            order = (self._head + 1 + torch.arange(slots, device=self._head.device)) % slots
            old = self._history[order]  # oldest ... newest
            pad = old[:1].expand(size - slots, -1, -1)
            self._history = torch.cat([pad, old]).contiguous()
            self._head.fill_(size - 1)
        self.delay.copy_(torch.where(mask, delay, self.delay))

    def _delayed(self, actions: torch.Tensor) -> torch.Tensor:
        """Records this step's actions and returns, per env, the one ``delay`` steps old."""
        self.prev_actions.copy_(self.actions)
        self.actions.copy_(actions.clamp(-self.clip, self.clip) if self.clip else actions)
        size = self._history.shape[0]
        if size == 1:
            return self.actions
        self._head.copy_((self._head + 1) % size)
        self._history.index_copy_(0, self._head[None], self.actions[None])
        return self._history[(self._head - self.delay) % size, self._env_index]

    def apply(self, actions: torch.Tensor) -> None:
        robot, ids = self.env.robot, self.joint_ids
        targets = self.offset + self.scale * self._delayed(actions)
        if self.clamp_to_limits:
            targets = targets.clamp(*robot.joint_limits.index_select(0, ids).unbind(-1))
        if self.max_target_rate is not None:  # after the limits, as the edge runtime's safety clamp
            step = self.max_target_rate * self.env.step_dt
            previous = robot.joint_pos_target.index_select(1, ids)
            targets = torch.where(self._rate_free, targets, targets.clamp(previous - step, previous + step))
            self._rate_free.fill_(False)
        robot.joint_pos_target.index_copy_(1, ids, targets)

    def applied_torque(self) -> torch.Tensor:
        """(num_envs, dim) [N m]: the PD torque on the driven joints, clipped to the (per-env) effort limits."""
        robot, ids = self.env.robot, self.joint_ids
        torque = (robot.joint_stiffness[:, ids] * (robot.joint_pos_target[:, ids] - robot.joint_pos[:, ids])
                  - robot.joint_damping[:, ids] * robot.joint_vel[:, ids])
        limit = robot.joint_effort_limit[:, ids]
        return torch.clamp(torque, -limit, limit)

    def reset(self, mask: torch.Tensor) -> None:
        """Zero action history for the envs in ``mask`` (num_envs,) bool."""
        self.actions.masked_fill_(mask[:, None], 0.0)
        self.prev_actions.masked_fill_(mask[:, None], 0.0)
        self._history.masked_fill_(mask[None, :, None], 0.0)
        self._rate_free |= mask[:, None]


class JointPositionDeltaAction(JointPositionAction):
    """Position-PD targets moved by the action: ``target = previous target + scale * action``,
    clamped to the joint limits. An episode starts from targets at the joints' reset positions."""

    def apply(self, actions: torch.Tensor) -> None:
        robot, ids = self.env.robot, self.joint_ids
        targets = robot.joint_pos_target.index_select(1, ids) + self.scale * self._delayed(actions)
        robot.joint_pos_target.index_copy_(1, ids, targets.clamp(*robot.joint_limits.index_select(0, ids).unbind(-1)))

    def reset(self, mask: torch.Tensor) -> None:
        super().reset(mask)
        robot, ids = self.env.robot, self.joint_ids
        targets = robot.joint_pos_target.index_select(1, ids)
        robot.joint_pos_target.index_copy_(1, ids, torch.where(mask[:, None], robot.joint_pos.index_select(1, ids),
                                                               targets))


class JointEffortAction(JointPositionAction):
    """Generalized forces on the driven joints: ``effort = scale * action`` [N or N m]."""

    position_targets = False

    @property
    def offset(self) -> torch.Tensor:
        return torch.zeros_like(self.actions)

    def apply(self, actions: torch.Tensor) -> None:
        self.env.robot.joint_effort.index_copy_(1, self.joint_ids, self.scale * self._delayed(actions))

    def applied_torque(self) -> torch.Tensor:
        return self.env.robot.joint_effort.index_select(1, self.joint_ids)


class TaskSpaceAction(JointPositionAction):
    """A body's pose (the tool centre point) commanded in the base frame and turned into the arm's
    joint targets by damped-least-squares differential IK on the simulated arm's Jacobian
    (:mod:`legion.tasks.manipulation.ik`), plus a gripper, as Isaac Lab's IK-relative tasks act.

    Action: 3 position and 3 rotation-vector components, then one for the gripper if
    ``gripper`` names its joints (> 0 opens: its joints' upper limits; < 0 closes: the lower).

    - ``mode=relative``: the desired pose moves by ``scale`` [m] and ``rotation_scale`` [rad] per
      unit of action per control step, from the pose an episode starts at;
    - ``mode=absolute``: desired = default pose + ``scale`` * action (position), rotated by
      ``rotation_scale`` * action (rotation vector).

    Each control step the arm's targets become ``q + dls(J, error)``, always clamped to the joint
    limits, with the error from the desired pose to the reached one. The desired pose is held, not
    reset to the reached one, so an arm that lags (or sags) is driven on; it stays within
    ``max_error`` [m] of the reached position per axis, so a pose out of reach does not wind up.
    """

    def __init__(self, env, joints: str = ".*", scale: float = 0.02, clip: float | None = 1.0,
                 clamp_to_limits: bool = True, body: str = "tcp", mode: str = "relative",
                 rotation_scale: float = 0.05, damping: float = 0.05, max_error: float = 0.05,
                 gripper: str | None = None):
        if mode not in ("relative", "absolute"):
            raise ValueError(f"task.action.params.mode: '{mode}'; use relative or absolute.")
        super().__init__(env, joints, scale, clip, clamp_to_limits=True)
        robot = env.robot
        self.chain = KinematicChain(env.sim, robot, body)
        driven = set(self.joint_ids.tolist())
        missing = [robot.joint_names[i] for i in self.chain.joint_ids if i not in driven]
        if missing:
            raise ValueError(f"task.action.joints ('{joints}') leaves out {missing}, which move {self.chain.body}: "
                             "task-space control drives every joint of the body's chain.")
        self.arm_ids = torch.tensor(self.chain.joint_ids, dtype=torch.long, device=env.device)
        self.gripper_ids = torch.tensor(robot.find_joints(gripper) if gripper else [], dtype=torch.long,
                                        device=env.device)
        self.joint_ids = torch.cat([self.arm_ids, self.gripper_ids])  # the joints whose targets it writes
        self.mode, self.rotation_scale, self.damping, self.max_error = mode, rotation_scale, damping, max_error
        dim = 6 + (len(self.gripper_ids) > 0)
        self.actions = torch.zeros(env.num_envs, dim, device=env.device)
        self.prev_actions = torch.zeros_like(self.actions)
        self._history = self.actions[None].clone()
        # The desired pose (base frame), and the one at the default joint positions (absolute mode's origin).
        self.desired_pos, self.desired_rot, _ = self.chain(robot.default_joint_pos)
        self.default_pos, self.default_rot = self.desired_pos.clone(), self.desired_rot.clone()

    @property
    def offset(self) -> torch.Tensor:
        return torch.zeros_like(self.actions)

    def apply(self, actions: torch.Tensor) -> None:
        robot = self.env.robot
        arm, gripper = self.joint_targets(self._delayed(actions))
        robot.joint_pos_target[:, self.arm_ids] = arm
        if gripper is not None:
            robot.joint_pos_target[:, self.gripper_ids] = gripper

    def joint_targets(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The desired pose moved by ``action`` (num_envs, dim), and the joint targets that drive
        the arm towards it: the arm's (num_envs, k) and the gripper's (or None), within the limits."""
        robot, arm = self.env.robot, self.arm_ids
        q = robot.joint_pos
        pos, rot, jacobian = self.chain(q)
        if self.mode == "relative":
            self.desired_pos.copy_(self.desired_pos + self.scale * action[:, :3])
            self.desired_rot.copy_(axis_angle_matrix(self.rotation_scale * action[:, 3:6]) @ self.desired_rot)
        else:
            self.desired_pos.copy_(self.default_pos + self.scale * action[:, :3])
            self.desired_rot.copy_(axis_angle_matrix(self.rotation_scale * action[:, 3:6]) @ self.default_rot)
        self.desired_pos.copy_(pos + (self.desired_pos - pos).clamp(-self.max_error, self.max_error))
        error = torch.cat([self.desired_pos - pos, rotation_error(self.desired_rot, rot)], -1)
        targets = q[:, arm] + dls(jacobian, error, self.damping)
        targets = targets.clamp(robot.joint_limits[arm, 0], robot.joint_limits[arm, 1])
        if not len(self.gripper_ids):
            return targets, None
        limits = robot.joint_limits[self.gripper_ids]
        return targets, torch.where(action[:, 6:7] > 0, limits[:, 1], limits[:, 0])

    def reset(self, mask: torch.Tensor) -> None:
        """Zero action history and, for the envs in ``mask``, the desired pose at the reached one."""
        super().reset(mask)
        pos, rot, _ = self.chain(self.env.robot.joint_pos)
        self.desired_pos.copy_(torch.where(mask[:, None], pos, self.desired_pos))
        self.desired_rot.copy_(torch.where(mask[:, None, None], rot, self.desired_rot))


ACTIONS = {"joint_position": JointPositionAction, "joint_position_delta": JointPositionDeltaAction,
           "joint_effort": JointEffortAction, "task_space": TaskSpaceAction}
