"""Scripted experts: policies written by hand that act in a task's own action space, for
demonstrations (``legion record policy=scripted:<module>:<name>``) and as a reference.

An expert is made by ``make(env)`` and called like a trained policy, ``expert(observations) ->
actions`` (and ``reset(dones)`` when episodes end, if it keeps a memory). It reads the
simulator's state (it is privileged, as a teacher is); what it writes are the same actions a
policy would.
"""

from __future__ import annotations

import torch

from legion.tasks.manipulation.ik import rotation_error
from legion.tasks.manipulation.terms import object_position

APPROACH, DESCEND, CLOSE, CARRY = range(4)


class LiftExpert:
    """arm_lift in task space (``task=arm_lift_ik``): over the cube, down around it, close, then
    carry it to the goal and hold it there, the gripper kept at its starting orientation.

    Its action is a function of the current state alone (no memory of its own): the phase is read
    from where the tool centre point is against the cube and whether the fingers have closed on
    it. DAgger needs that: the expert labels the states a student reaches on its own, and one
    state must get one label (an expert with a phase in memory would label a state by how it got
    there). A cube that leaves the fingers is approached again.

    Args:
        env: a :class:`~legion.tasks.env.LegionEnv` whose command is the cube's goal position.
        action: the ``task_space`` action (relative, with a gripper) it acts through: the env's own
            (default) or one that :class:`JointSpaceLift` turns into joint targets.
        above: height over the cube's centre to approach from [m].
        speed: the fastest the tool centre point is moved [m/s] (descending at half of it).
    """

    def __init__(self, env, action=None, above: float = 0.1, speed: float = 0.6):
        action = action or env.action
        if type(action).__name__ != "TaskSpaceAction" or action.mode != "relative" or action.dim != 7:
            raise ValueError("the lift expert acts in task space: use task=arm_lift_ik (task.action.type=task_space, "
                             "mode relative, with a gripper), or expert:lift_joint_space for task=arm_lift.")
        self.env, self.action = env, action
        self.above = torch.tensor([0.0, 0.0, above], device=env.device)
        self.step_limit = speed * env.step_dt / action.scale  # action units per control step
        self.open = env.robot.joint_limits[action.gripper_ids, 1]  # the fingers' open position
        self.phase = torch.full((env.num_envs,), APPROACH, dtype=torch.long, device=env.device)  # for inspection

    def __call__(self, observations) -> torch.Tensor:
        env, action = self.env, self.action
        cube = object_position(env)
        reached = action.chain(env.robot.joint_pos)[0]
        fingers = action.gripper_ids
        # Closed on the cube: the fingers stopped short of closing (the cube between them), at rest.
        gripped = ((env.robot.joint_pos[:, fingers] < self.open - 0.004).all(-1)
                   & (env.robot.joint_vel[:, fingers].abs() < 0.01).all(-1))
        distance = (reached - cube).norm(dim=-1)
        above_cube = (reached[:, :2] - cube[:, :2]).norm(dim=-1) < 0.01
        phase = torch.where(above_cube, DESCEND, APPROACH)
        phase = torch.where(distance < 0.012, CLOSE, phase)
        self.phase = phase = torch.where(gripped & (distance < 0.03), CARRY, phase)  # slipping a little is fine
        target = torch.where((phase == APPROACH)[:, None], cube + self.above,
                             torch.where((phase == CARRY)[:, None], env.command.value[:, :3], cube))
        limit = torch.where(phase == DESCEND, 0.5, 1.0)[:, None] * self.step_limit
        move = ((target - action.desired_pos) / action.scale).clamp(-1, 1)
        move = move * (limit / move.norm(dim=-1, keepdim=True).clamp_min(1e-9)).clamp(max=1.0)
        turn = (rotation_error(action.default_rot, action.desired_rot) / action.rotation_scale).clamp(-1, 1)
        grip = torch.where(phase >= CLOSE, -1.0, 1.0)[:, None]
        return torch.cat([move, turn, grip], -1)


class JointSpaceLift:
    """The lift expert for a joint-space arm_lift (``task=arm_lift``): :class:`LiftExpert` acting
    through a task-space action of its own, whose joint targets it returns as the env's joint
    position action (``(target - default) / scale`` per driven joint), so a joint-space student
    learns a policy that exports to the edge runtime as any other. Its desired pose is its one
    memory, as the task-space env's is (restarted at the reached pose when an episode starts, and
    never more than ``max_error`` from it): a position servo needs the lead to move at speed.
    """

    def __init__(self, env):
        from legion.tasks.mdp.actions import JointPositionAction, TaskSpaceAction

        if type(env.action) is not JointPositionAction:
            raise ValueError("expert:lift_joint_space labels joint position actions (task=arm_lift); for "
                             "task=arm_lift_ik use expert:lift.")
        robot = env.cfg.scene.robot
        self.ik = TaskSpaceAction(env, joints=robot.joints["arm"], body=robot.bodies["tcp"],
                                  gripper=robot.joints["gripper"])
        self.expert = LiftExpert(env, self.ik)
        self.env = env
        driven = env.action.joint_ids.tolist()
        self.columns = torch.tensor([driven.index(j) for j in self.ik.joint_ids.tolist()], device=env.device)

    def __call__(self, observations) -> torch.Tensor:
        env, ik = self.env, self.ik
        arm, gripper = ik.joint_targets(self.expert(observations))
        targets = torch.cat([arm, gripper], 1) if gripper is not None else arm
        actions = torch.zeros_like(env.action.offset)  # a driven joint the IK does not move holds its default
        actions[:, self.columns] = (targets - env.action.offset[:, self.columns]) / env.action.scale
        return actions

    def reset(self, dones: torch.Tensor) -> None:
        self.ik.reset(dones)


def lift(env) -> LiftExpert:
    """The arm_lift expert in task space (``policy=scripted:legion.tasks.manipulation.expert:lift``)."""
    return LiftExpert(env)


def lift_joint_space(env) -> JointSpaceLift:
    """The arm_lift expert in joint space (``scripted:legion.tasks.manipulation.expert:lift_joint_space``)."""
    return JointSpaceLift(env)
