"""Scripted experts: policies written by hand that act in a task's own action space, for
demonstrations (``legion record policy=scripted:<module>:<name>``) and as a reference.

An expert is made by ``make(env)`` and called like a trained policy, ``expert(observations) ->
actions`` (with ``reset(dones)`` when episodes end). It reads the simulator's state (it is
privileged, as a teacher is); what it writes are the same actions a policy would.
"""

from __future__ import annotations

import torch

from legion.tasks.manipulation.ik import rotation_error
from legion.tasks.manipulation.terms import object_position

APPROACH, DESCEND, CLOSE, CARRY = range(4)


class LiftExpert:
    """arm_lift in task space (``task=arm_lift_ik``): over the cube, down around it, close, then
    carry it to the goal and hold it there, the gripper kept at its starting orientation. A cube
    that leaves the fingers sends that env back to the approach.

    Args:
        env: a :class:`~legion.tasks.env.LegionEnv` whose action is ``task_space`` (relative) with
            a gripper, and whose command is the cube's goal position.
        above: height over the cube's centre to approach from [m].
        speed: the fastest the tool centre point is moved [m/s] (descending at half of it).
        close_s: time to close the fingers before lifting [s].
    """

    def __init__(self, env, above: float = 0.1, speed: float = 0.6, close_s: float = 0.3):
        action = env.action
        if type(action).__name__ != "TaskSpaceAction" or action.mode != "relative" or action.dim != 7:
            raise ValueError("the lift expert acts in task space: use task=arm_lift_ik (task.action.type=task_space, "
                             "mode relative, with a gripper).")
        self.env = env
        self.above = torch.tensor([0.0, 0.0, above], device=env.device)
        self.step_limit = speed * env.step_dt / action.scale  # action units per control step
        self.close_steps = round(close_s / env.step_dt)
        self.phase = torch.full((env.num_envs,), APPROACH, dtype=torch.long, device=env.device)
        self.timer = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)

    def __call__(self, observations) -> torch.Tensor:
        env, action = self.env, self.env.action
        cube = object_position(env)
        tcp = action.desired_pos  # where the arm is being driven (the reached pose lags by the IK's error)
        reached = action.chain(env.robot.joint_pos)[0]
        over = cube + self.above
        phase = self.phase
        # Transitions, on the reached pose.
        phase = torch.where((phase == APPROACH) & ((reached - over).norm(dim=-1) < 0.01), DESCEND, phase)
        phase = torch.where((phase == DESCEND) & ((reached - cube).norm(dim=-1) < 0.008), CLOSE, phase)
        self.timer = torch.where(phase == CLOSE, self.timer + 1, 0)
        phase = torch.where((phase == CLOSE) & (self.timer >= self.close_steps), CARRY, phase)
        phase = torch.where((phase == CARRY) & ((reached - cube).norm(dim=-1) > 0.04), APPROACH, phase)  # dropped
        self.phase = phase
        target = torch.where((phase == APPROACH)[:, None], over,
                             torch.where((phase == CARRY)[:, None], env.command.value[:, :3], cube))
        limit = torch.where(phase == DESCEND, 0.5, 1.0)[:, None] * self.step_limit
        move = ((target - tcp) / action.scale).clamp(-1, 1)
        move = move * (limit / move.norm(dim=-1, keepdim=True).clamp_min(1e-9)).clamp(max=1.0)
        turn = (rotation_error(action.default_rot, action.desired_rot) / action.rotation_scale).clamp(-1, 1)
        grip = torch.where(phase >= CLOSE, -1.0, 1.0)[:, None]
        return torch.cat([move, turn, grip], -1)

    def reset(self, dones: torch.Tensor) -> None:
        self.phase = torch.where(dones, APPROACH, self.phase)
        self.timer = torch.where(dones, 0, self.timer)


def lift(env) -> LiftExpert:
    """The arm_lift expert (``policy=scripted:legion.tasks.manipulation.expert:lift``)."""
    return LiftExpert(env)
