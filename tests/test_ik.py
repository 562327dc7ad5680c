"""Task-space control (issue 30): the arm's kinematic chain from the simulator's model, damped
least squares, the task_space action reaching poses, the scripted lift expert, and its
demonstrations recorded and replayed."""

import pytest
import torch

from conftest import make_env
from legion.sim2real.trajectories.file import TrajectoryFile
from legion.sim2real.trajectories.record import record_scripted, scripted_policy
from legion.sim2real.trajectories.replay import replay
from legion.tasks.manipulation.ik import axis_angle_matrix, dls, rotation_error
from legion.tasks.math import quat_rotate_inverse


@pytest.fixture(scope="module")
def arm():
    return make_env("task=arm_lift_ik", "sim.num_envs=4")


def drive(env, position, rotation, steps: int) -> None:
    """Relative task-space actions that bring the desired pose to ``position`` (n, 3) and
    ``rotation`` (n, 3, 3), base frame, as fast as the action's clip allows."""
    action = env.action
    for _ in range(steps):
        move = ((position - action.desired_pos) / action.scale).clamp(-1, 1)
        turn = (rotation_error(rotation, action.desired_rot) / action.rotation_scale).clamp(-1, 1)
        env.step(torch.cat([move, turn, torch.ones(env.num_envs, 1)], -1))


@pytest.mark.parametrize("robot", ["arm", "panda"])
def test_the_chain_is_the_simulated_arm_and_its_jacobian_its_derivative(robot):
    env = make_env("task=arm_lift_ik", f"robot={robot}", "sim.num_envs=4")
    torch.manual_seed(0)
    for _ in range(5):
        env.step(torch.rand(4, env.num_actions) * 2 - 1)
    chain, r = env.action.chain, env.robot
    position, rotation, jacobian = chain(r.joint_pos)
    tcp = r.find_bodies(env.cfg.scene.robot.bodies["tcp"])[0]
    simulated = quat_rotate_inverse(r.body_quat_w[:, 0], r.body_pos_w[:, tcp] - r.body_pos_w[:, 0])
    assert (position - simulated).abs().max() < 1e-5
    assert len(chain.joint_ids) == 7 and jacobian.shape == (4, 6, 7)
    eps = 1e-3
    for column, joint in enumerate(chain.joint_ids):  # central differences of the pose, joint by joint
        step = torch.zeros_like(r.joint_pos)
        step[:, joint] = eps
        (p1, r1, _), (p0, r0, _) = chain(r.joint_pos + step), chain(r.joint_pos - step)
        assert (jacobian[:, :3, column] - (p1 - p0) / (2 * eps)).abs().max() < 1e-3
        assert (jacobian[:, 3:, column] - rotation_error(r1, r0) / (2 * eps)).abs().max() < 1e-3


def test_dls_solves_the_damped_system():
    torch.manual_seed(0)
    jacobian, error = torch.randn(16, 6, 7), torch.randn(16, 6)
    exact = jacobian.transpose(1, 2) @ torch.linalg.solve(
        jacobian @ jacobian.transpose(1, 2) + 0.05 ** 2 * torch.eye(6), error[..., None])
    assert torch.allclose(dls(jacobian, error, 0.05), exact.squeeze(-1), atol=1e-4, rtol=1e-4)
    singular = jacobian.clone()
    singular[:, :, 1:] = 0  # one joint left: the step stays bounded, not NaN
    assert torch.isfinite(dls(singular, error, 0.05)).all()


def test_task_space_actions_reach_a_pose_and_approach_one_out_of_reach(arm):
    arm.reset()
    action = arm.action
    start, start_rot, _ = action.chain(arm.robot.joint_pos)
    goal = start + torch.tensor([0.08, -0.1, 0.05])
    turn = torch.tensor([0.0, 0.0, 0.3])  # 0.3 rad about the base's z
    goal_rot = axis_angle_matrix(turn.expand(4, 3)) @ start_rot
    drive(arm, goal, goal_rot, 60)
    position, rotation, _ = action.chain(arm.robot.joint_pos)
    assert (position - goal).norm(dim=-1).max() < 1e-3
    assert rotation_error(goal_rot, rotation).norm(dim=-1).max() < 0.01

    far = start + torch.tensor([2.0, 0.0, 0.0])
    before = (position - far).norm(dim=-1)
    drive(arm, far, goal_rot, 40)
    q = arm.robot.joint_pos
    position = action.chain(q)[0]
    limits = arm.robot.joint_limits
    assert torch.isfinite(q).all() and (position - far).norm(dim=-1).lt(before - 0.2).all()
    assert ((q >= limits[:, 0] - 1e-3) & (q <= limits[:, 1] + 1e-3)).all()


@pytest.mark.parametrize("task, expert, robot", [
    ("arm_lift_ik", "lift", "arm"), ("arm_lift", "lift_joint_space", "arm"), ("arm_lift_ik", "lift", "panda")])
def test_the_scripted_expert_lifts_the_cube_to_its_goal(task, expert, robot):
    """In task space, and through its own IK as the joint targets of arm_lift's joint action; on
    the Franka Panda as well (its controller's gravity compensation and coupled fingers modelled)."""
    env = make_env(f"task={task}", f"robot={robot}", "sim.num_envs=8")
    policy = scripted_policy(f"scripted:legion.tasks.manipulation.expert:{expert}", env)
    obs = env.reset()
    with torch.inference_mode():
        for _ in range(env.max_episode_length):
            obs, _, dones, _ = env.step(policy(obs))
            if hasattr(policy, "reset"):
                policy.reset(dones)
    # every episode has ended once (time-outs at 5 s), each with the cube held at its goal for 1 s
    assert env.success.last_succeeded.all(), env.success.last_succeeded


@pytest.mark.bit_exact
def test_expert_demonstrations_are_recorded_and_replay_bit_for_bit(tmp_path):
    out = tmp_path / "demos.h5"
    record_scripted("scripted:legion.tasks.manipulation.expert:lift", 2, out,
                    overrides=("task=arm_lift_ik", "task.episode_length_s=1.0"))
    with TrajectoryFile(out) as f:
        assert f.attrs["policy"] == "scripted:legion.tasks.manipulation.expert:lift"
        # a 1 s episode cannot hold the cube at its goal for the 1 s success needs
        assert [f.episode(name).attrs["success"] for name in f.episodes] == [False, False]
    result = replay(out, "actions")
    assert result.bit_exact, result.report()
    assert result.replayed["robot/joint_pos"].shape[:2] == (2, 50)


def test_bad_task_space_settings_and_policies_are_named():
    with pytest.raises(ValueError, match=r"task.action.params: \['speed'\] not taken by type task_space"):
        make_env("task=arm_lift_ik", "sim.num_envs=1", "+task.action.params.speed=1")
    with pytest.raises(ValueError, match=r"task.action.params.body: No body name of robot matches \['nose'\]"):
        make_env("task=arm_lift_ik", "sim.num_envs=1", "task.action.params.body=nose")
    env = make_env("task=arm_lift", "sim.num_envs=1")
    with pytest.raises(ValueError, match="the lift expert acts in task space: use task=arm_lift_ik"):
        scripted_policy("scripted:legion.tasks.manipulation.expert:lift", env)
    with pytest.raises(ValueError, match="expert:lift_joint_space labels joint position actions"):
        scripted_policy("scripted:legion.tasks.manipulation.expert:lift_joint_space",
                        make_env("task=arm_lift_ik", "sim.num_envs=1"))
    with pytest.raises(ValueError, match="expected scripted:<module>:<function>"):
        scripted_policy("legion.tasks.manipulation.expert:lift", env)
