"""Manipulation: the authored arm against its published kinematics, a gripper that holds, reach
rewards and success, cube randomization, short training, export to the edge runtime."""

import copy
import json
import math

import numpy as np
import pytest
import torch

from conftest import compose, export_untrained_run, lockstep_errors, make_env, make_runner, short_training

# Franka Emika's modified (Craig) DH parameters (a, d, alpha) of joints 1-7, then the flange; the
# hand turns -pi/4 about z and the tool centre point is 0.1034 m further (tasks/assets/arm.xml).
DH = [(0.0, 0.333, 0.0), (0.0, 0.0, -math.pi / 2), (0.0, 0.316, math.pi / 2), (0.0825, 0.0, math.pi / 2),
      (-0.0825, 0.384, -math.pi / 2), (0.0, 0.0, math.pi / 2), (0.088, 0.0, math.pi / 2)]
HOME = [0.0, -0.7853982, 0.0, -2.3561945, 0.0, 1.5707963, 0.7853982, 0.04, 0.04]


def dh_tcp(q: np.ndarray) -> np.ndarray:
    """4x4 pose of the tool centre point in the base frame for joint angles q (7,), from the DH table."""
    def link(a, d, alpha, theta):
        ca, sa, ct, st = np.cos(alpha), np.sin(alpha), np.cos(theta), np.sin(theta)
        return np.array([[ct, -st, 0, a],
                         [st * ca, ct * ca, -sa, -d * sa],
                         [st * sa, ct * sa, ca, d * ca],
                         [0, 0, 0, 1]])

    pose = np.eye(4)
    for (a, d, alpha), theta in zip(DH, q):
        pose = pose @ link(a, d, alpha, theta)
    return pose @ link(0.0, 0.107, 0.0, -math.pi / 4) @ link(0.0, 0.1034, 0.0, 0.0)


def rotation(q: torch.Tensor) -> np.ndarray:
    """3x3 rotation matrix of a quaternion (x, y, z, w)."""
    x, y, z, w = q.tolist()
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def test_the_arm_matches_frankas_dh_parameters_within_1_mm_at_random_configurations():
    from legion.configs.schema import Robot, Scene
    from legion.tasks.sim import NewtonSim

    sim = NewtonSim(Scene(robot=Robot(file="arm.xml"), ground=None, contact_sensing=False), num_envs=32, dt=0.005,
                    decimation=1)
    robot = sim.robot
    assert robot.joint_names == [f"joint{i}" for i in range(1, 8)] + ["finger_joint1", "finger_joint2"]
    limits = robot.joint_limits
    generator = torch.Generator().manual_seed(0)
    q = limits[:, 0] + (limits[:, 1] - limits[:, 0]) * torch.rand(32, 9, generator=generator)
    robot.joint_pos[:] = q
    sim.reset(torch.ones(32, dtype=torch.bool))
    tcp = robot.find_bodies("tcp")[0]
    for i in range(32):
        expected = dh_tcp(q[i, :7].double().numpy())
        assert np.abs(robot.body_pos_w[i, tcp].numpy() - expected[:3, 3]).max() < 1e-3
        assert np.abs(rotation(robot.body_quat_w[i, tcp]) - expected[:3, :3]).max() < 1e-3
    # The published limits, in the model's joint order.
    published = torch.tensor([[-2.8973, 2.8973], [-1.7628, 1.7628], [-2.8973, 2.8973], [-3.0718, -0.0698],
                              [-2.8973, 2.8973], [-0.0175, 3.7525], [-2.8973, 2.8973]])
    assert torch.allclose(limits[:7], published, atol=1e-4)
    assert robot.effort_limits.tolist() == pytest.approx([87] * 4 + [12] * 3 + [70] * 2)


def test_the_closed_gripper_holds_a_cube_5_s_with_under_5_mm_slip_and_released_it_falls():
    """arm_lift's physics (timestep, friction cone): a 5 cm, 0.2 kg cube put between the open
    fingers at the home pose, the fingers closed by the one actuator (the other finger follows by
    the coupling), held in the air for 5 s, then released."""
    from legion.tasks.sim import NewtonSim

    cfg = compose("task=arm_lift")
    scene = cfg.task.scene
    tcp_home = dh_tcp(np.array(HOME[:7]))[:3, 3].tolist()
    scene.objects["cube"].pos, scene.objects["cube"].mass = tcp_home, 0.2
    sim = NewtonSim(scene, num_envs=2, dt=cfg.sim.dt, decimation=cfg.sim.decimation,
                    solver_options=cfg.sim.solver_options)
    robot, cube = sim.robot, sim.scene["cube"]
    robot.joint_pos[:] = robot.joint_pos_target[:] = torch.tensor(HOME)
    sim.reset(torch.ones(2, dtype=torch.bool))
    tcp = robot.find_bodies("tcp")[0]
    steps_per_s = round(1 / sim.control_dt)

    def offset():  # the cube's centre relative to the tool centre point [m]
        return cube.root_pos_w[0] - robot.body_pos_w[0, tcp]

    robot.joint_pos_target[:, robot.find_joints("finger_joint1")] = 0.0  # closed: the stroke's end, ~12 N on the cube
    for _ in range(steps_per_s // 5):
        sim.step()
    grasped = offset().clone()
    fingers = robot.joint_pos[0, 7:]
    assert fingers.tolist() == pytest.approx([0.025, 0.025], abs=1.5e-3)  # both on the cube's faces
    assert grasped.norm() < 0.01  # it barely dropped while the fingers closed
    for _ in range(5 * steps_per_s):
        sim.step()
    assert (offset() - grasped).norm() < 0.005
    assert cube.root_lin_vel_w[0].norm() < 1e-3
    robot.joint_pos_target[:, robot.find_joints("finger_joint1")] = 0.04  # open
    for _ in range(steps_per_s // 2):
        sim.step()
    assert offset()[2] < -0.3  # fell towards the table
    assert robot.joint_pos[0, 7:].tolist() == pytest.approx([0.04, 0.04], abs=1e-3)


def test_lift_terms_pay_a_cube_squeezed_in_the_hand_not_one_dropped_knocked_away_or_pressed_on():
    """arm_lift with 3 worlds at the home pose, the cube put between the open fingers. The finger
    action asks for targets far past the 0-0.04 m stroke (0.04 -/+ 0.5 m); the targets stop at
    the stroke's ends. Closed fingers squeeze the cube, open ones drop it."""
    from legion.tasks.manipulation.terms import object_grasped, object_lifted

    tcp = dh_tcp(np.array(HOME[:7]))[:3, 3].tolist()
    env = make_env("task=arm_lift", "sim.num_envs=3", "~task.events.cube_position", "~task.events.joint_pos_offset",
                   f"task.scene.objects.cube.pos=[{tcp[0]},{tcp[1]},{tcp[2]}]")
    fingers = torch.tensor(env.robot.find_bodies(".*_finger"))
    actions = torch.zeros(3, 8)
    actions[:, 7] = torch.tensor([-1.0, 1.0, -1.0])  # close, open, close
    for _ in range(50):  # 1 s: the dropped cube lands on the table
        env.step(actions)
    assert env.robot.joint_pos_target[:, 7].tolist() == pytest.approx([0.0, 0.04, 0.0], abs=1e-7)
    assert object_grasped(env, fingers).tolist() == [1.0, 0.0, 1.0]
    assert object_lifted(env, 0.05, fingers).tolist() == [1.0, 0.0, 1.0]
    squeeze = env.robot.contact_forces_w[0, fingers].clone()
    # A cube knocked into the air, 20 cm beside the hand, is lifted but not held: no lift reward.
    env.scene["cube"].root_pos_w[2, 1] += 0.2
    assert object_lifted(env, 0.05, fingers).tolist() == [1.0, 0.0, 0.0]
    # The same force along the fingers (world z: fingertips pressed on a table) is no squeeze.
    env.robot.contact_forces_w[0, fingers] = torch.tensor([0.0, 0.0, 1.0]) * squeeze.norm(dim=-1, keepdim=True)
    assert object_grasped(env, fingers)[0] == 0.0
    env.robot.contact_forces_w[0, fingers] = squeeze
    assert object_grasped(env, fingers)[0] == 1.0


@pytest.fixture(scope="module")
def still_reach():
    """arm_reach with 4 worlds starting exactly at the home pose (no start randomization)."""
    return make_env("task=arm_reach", "sim.num_envs=4", "~task.events.joint_pos_offset")


def tcp_pose(env) -> torch.Tensor:
    tcp = env.robot.find_bodies("tcp")[0]
    return torch.cat([env.robot.body_pos_w[:, tcp], env.robot.body_quat_w[:, tcp]], dim=-1)


def test_reach_reward_is_maximal_at_the_target_and_falls_off_along_a_line(still_reach):
    env = still_reach
    env.reset()
    pose = tcp_pose(env)
    direction = torch.nn.functional.normalize(torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 1.0], [-1.0, 0.0, 0.0],
                                                            [0.3, 0.3, -1.0]]), dim=-1)
    totals = []
    for distance in torch.linspace(0.0, 0.4, 21):
        env.command.hold(torch.cat([pose[:, :3] + distance * direction, pose[:, 3:]], dim=-1))
        totals.append(sum(term.weight * term(env) for term in env.reward_terms if "error" in term.func.__name__))
    totals = torch.stack(totals)  # (distances, envs)
    tanh_weight = sum(term.weight for term in env.reward_terms if term.func.__name__.endswith("tanh"))
    assert totals[0].tolist() == pytest.approx([tanh_weight] * 4, abs=1e-5)  # the most there is: no error, tanh terms 1
    assert (totals[1:] < totals[:-1]).all()  # strictly falling off along each line
    env.command.release()


def test_success_triggers_exactly_at_the_thresholds_after_holding_half_a_second(still_reach):
    """Thresholds 2 cm and 0.1 rad, held 0.5 s (25 control steps at 50 Hz). Worlds 0 and 2 sit just
    inside one threshold, worlds 1 and 3 just outside."""
    from legion.tasks.math import quat_from_yaw, quat_mul

    env = still_reach
    env.reset()
    pose = tcp_pose(env)
    target = pose.clone()
    target[0, 0] += 0.0199
    target[1, 0] += 0.0201
    target[2:, 3:] = quat_mul(pose[2:, 3:], quat_from_yaw(torch.tensor([0.0999, 0.1001])))
    env.command.hold(target)
    assert env.command.position_error()[:2].tolist() == pytest.approx([0.0199, 0.0201], abs=1e-5)
    assert env.command.orientation_error()[2:].tolist() == pytest.approx([0.0999, 0.1001], abs=1e-5)
    env.reset()
    zero = torch.zeros(4, 7)
    for _ in range(24):
        env.step(zero)
    assert not env.success.succeeded.any()  # 24 steps held: 0.48 s
    env.step(zero)
    assert env.success.succeeded.tolist() == [True, False, True, False]
    assert env.success.time_s[[0, 2]].tolist() == pytest.approx([0.5, 0.5])
    extras = {}
    while "time_outs" not in extras or not extras["time_outs"].all():  # to the end of the episode
        _, _, _, extras = env.step(zero)
    assert extras["episodes"]["Episode_Success/rate"] == 2 and extras["episodes"]["count"] == 4
    assert env.success.last_succeeded.tolist() == [True, False, True, False] and not env.success.succeeded.any()
    env.command.release()


def test_a_break_in_the_condition_restarts_the_hold(still_reach):
    env = still_reach
    env.reset()
    env.command.hold(tcp_pose(env))
    env.reset()
    zero = torch.zeros(4, 7)
    for _ in range(20):
        env.step(zero)
    env.command.hold(tcp_pose(env) + torch.tensor([0.1, 0, 0, 0, 0, 0, 0]))  # one step away
    env.step(zero)
    env.command.hold(tcp_pose(env))
    for _ in range(24):
        env.step(zero)
    assert not env.success.succeeded.any()
    env.step(zero)
    assert env.success.succeeded.all() and env.success.time_s.tolist() == pytest.approx([46 * 0.02] * 4)
    env.command.release()


def test_pose_commands_lie_in_their_box_in_the_base_frame_and_point_down():
    from legion.tasks.math import quat_rotate

    env = make_env("task=arm_reach", "sim.num_envs=256")
    value = env.command.value
    ranges = env.cfg.command.ranges
    for i, key in enumerate(("pos_x", "pos_y", "pos_z")):
        assert ranges[key][0] <= value[:, i].min() and value[:, i].max() <= ranges[key][1]
    down = quat_rotate(value[:, 3:], torch.tensor([0.0, 0.0, 1.0]).expand(256, 3))  # the tcp's z axis
    assert torch.allclose(down, torch.tensor([0.0, 0.0, -1.0]).expand(256, 3), atol=1e-5)
    assert torch.allclose(value[:, 3:].norm(dim=-1), torch.ones(256))
    # One sign for every draw, the reference's (the middle of the ranges, the home pose here): the
    # observed quaternion is continuous across the yaw range (with "w >= 0" x jumped from 1 to -1 at
    # the home yaw, where w ~ 0).
    assert env.command.reference.abs().tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-6)  # +-Rx(pi)
    assert (value[:, 3:] @ env.command.reference > 0.7).all()  # within a quarter turn of it: cos(pi / 4)
    # (x, y) = +-(-sin, cos)(yaw / 2), one sign
    yaw = torch.remainder(2 * torch.atan2(-value[:, 3], value[:, 4]), 2 * math.pi)
    assert ranges["yaw"][0] - 1e-4 <= yaw.min() and yaw.max() <= ranges["yaw"][1] + 1e-4
    assert yaw.max() - yaw.min() > 0.9 * (ranges["yaw"][1] - ranges["yaw"][0])


def test_a_step_is_judged_on_the_command_its_action_saw_and_redraws_it_after():
    """Commands redrawn every 2 control steps here. Each step's reward (and success) judges the
    command the observation held when the action was chosen; the new one is drawn after, for the
    next observation (before, a reach episode's last step was judged against a fresh target)."""
    from legion.tasks.math import quat_rotate

    env = make_env("task=arm_reach", "sim.num_envs=4", "task.command.resampling_time_s=0.04")
    env.reset()
    robot, tcp = env.robot, env.robot.find_bodies("tcp")[0]
    weight = next(term.weight for term in env.reward_terms if term.name == "position_error")
    redrawn = 0
    for _ in range(6):
        seen = env.command.value.clone()
        env.step(torch.zeros(4, env.num_actions))
        target = robot.body_pos_w[:, 0] + quat_rotate(robot.body_quat_w[:, 0], seen[:, :3])
        error = torch.norm(robot.body_pos_w[:, tcp] - target, dim=-1)
        assert torch.allclose(env.reward_values["position_error"], weight * env.step_dt * error, atol=1e-7)
        redrawn += int((env.command.value != seen).any(dim=-1).sum())
    assert redrawn == 3 * 4  # at steps 2, 4 and 6, in every env


def test_the_quaternion_helpers_agree_with_mujoco():
    """The product, the Euler angles' quaternion and the angle between two orientations (tables
    and matrix products, for their CPU cost) against MuJoCo's C functions, on random inputs;
    batched, and differentiable."""
    import mujoco

    from legion.tasks.math import quat_error_magnitude, quat_from_euler_xyz, quat_mul

    generator = torch.Generator().manual_seed(0)
    a, b = torch.nn.functional.normalize(torch.randn(2, 50, 4, generator=generator), dim=-1)
    angles = (torch.rand(50, 3, generator=generator) * 2 - 1) * 4  # past +-pi: every branch of the halves
    product, euler, error = quat_mul(a, b), quat_from_euler_xyz(angles), quat_error_magnitude(a, b)
    assert euler[:, 3].min() >= 0  # the sign nearer the identity

    def wxyz(q: torch.Tensor) -> np.ndarray:
        return q.double().numpy()[[3, 0, 1, 2]]

    for i in range(50):
        expected = np.zeros(4)
        mujoco.mju_mulQuat(expected, wxyz(a[i]), wxyz(b[i]))
        np.testing.assert_allclose(wxyz(product[i]), expected, atol=1e-6)
        mujoco.mju_euler2Quat(expected, angles[i].double().numpy(), "XYZ")  # extrinsic x, y, z: Rz Ry Rx
        np.testing.assert_allclose(wxyz(euler[i]) * np.sign(expected[0]), expected, atol=1e-6)
        rotation = np.zeros(3)
        mujoco.mju_subQuat(rotation, wxyz(b[i]), wxyz(a[i]))
        assert error[i].item() == pytest.approx(np.linalg.norm(rotation), abs=1e-5)
    assert quat_mul(a.view(5, 10, 4), b.view(5, 10, 4)).view(50, 4).equal(product)
    a.requires_grad_(True)
    quat_error_magnitude(a, b).sum().backward()
    assert a.grad is not None and a.grad.isfinite().all()


def test_the_pose_errors_are_computed_once_per_state_and_follow_every_write(still_reach):
    """Success and the rewards read one computation of each error per state (a cache keyed on the
    torch version counters of the bodies' state and of the command), and every write of either is
    seen: a step and a reset (Warp and MuJoCo write behind torch's back), a body pose written
    through a view, a new command."""
    from legion.tasks.math import quat_error_magnitude, quat_mul, quat_rotate

    env = still_reach
    env.reset()
    command, robot, tcp = env.command, env.robot, env.robot.find_bodies("tcp")[0]

    def computed_now() -> tuple[torch.Tensor, torch.Tensor]:
        base_pos, base_quat = robot.body_pos_w[:, 0], robot.body_quat_w[:, 0]
        target_pos = base_pos + quat_rotate(base_quat, command.value[:, :3])
        target_quat = quat_mul(base_quat, command.value[:, 3:])
        return (torch.norm(robot.body_pos_w[:, tcp] - target_pos, dim=-1),
                quat_error_magnitude(robot.body_quat_w[:, tcp], target_quat))

    def assert_current() -> None:
        position, orientation = computed_now()
        assert torch.allclose(command.position_error(), position, atol=1e-6)
        assert torch.allclose(command.orientation_error(), orientation, atol=1e-6)

    errors = command.position_error(), command.orientation_error()
    assert command.position_error() is errors[0] and command.orientation_error() is errors[1]  # computed once
    assert_current()
    env.action.apply(torch.ones(4, env.num_actions) * 0.5)
    env.sim.step()  # the arm moves (MuJoCo and Warp write the state): the errors change
    assert not torch.allclose(command.position_error(), errors[0])
    assert_current()
    robot.body_pos_w[:, tcp] += torch.tensor([0.05, 0.0, 0.0])  # a torch write through a view
    assert_current()
    env.command.hold(tcp_pose(env))  # a new command, where the tcp is (the base frame is the world's)
    assert command.position_error().abs().max() < 1e-6 and command.orientation_error().abs().max() < 1e-3
    robot.joint_pos[:] = robot.default_joint_pos
    env.sim.reset(torch.ones(4, dtype=torch.bool))  # forward kinematics (Warp) puts the tcp back at home
    assert_current()
    env.command.release()


def test_bad_command_configs_name_the_fix():
    with pytest.raises(ValueError, match=r"task.command.ranges: a pose command takes .*missing: \['pos_z'\]"):
        make_env("task=arm_reach", "sim.num_envs=1", "~task.command.ranges.pos_z")
    with pytest.raises(ValueError, match=r"task.command.body: No body name of robot matches \['hnd'\]"):
        make_env("task=arm_reach", "sim.num_envs=1", "task.command.body=hnd")
    with pytest.raises(ValueError, match=r"task.command.body: '.*_finger' matches \['left_finger', 'right_finger'\]"):
        make_env("task=arm_reach", "sim.num_envs=1", "task.command.body='.*_finger'")
    with pytest.raises(ValueError, match="task.success.hold_s: -1.0 must be >= 0"):
        make_env("task=arm_reach", "sim.num_envs=1", "task.success.hold_s=-1")


def test_the_cubes_size_mass_and_friction_are_drawn_per_env_and_a_resized_cube_rests_on_its_new_faces():
    env = make_env("task=arm_lift", "sim.num_envs=6")  # sizes x0.8-1.2, masses 0.05-0.2 kg, friction 0.6-1.2
    cube = env.scene["cube"]
    half = cube.shape_size[:, 0]  # (6, 3) half-extents
    assert torch.allclose(half, half[:, :1].expand(6, 3))  # still cubes
    assert 0.02 <= half.min() and half.max() <= 0.03 and half[:, 0].std() > 1e-3
    mass = cube.body_mass[:, 0]
    assert 0.05 <= mass.min() and mass.max() <= 0.2
    inertia = cube.body_inertia[:, 0].diagonal(dim1=-2, dim2=-1)
    assert torch.allclose(inertia, (mass * (2 * half[:, 0]) ** 2 / 6)[:, None].expand(6, 3), rtol=1e-4)
    assert 0.6 <= cube.shape_friction[:, 0].min() and cube.shape_friction[:, 0].max() <= 1.2
    for _ in range(25):  # 0.5 s: the cubes drop from 3 cm and settle
        env.step(torch.zeros(6, 8))
    assert cube.root_pos_w[:, 2].tolist() == pytest.approx(half[:, 2].tolist(), abs=1e-3)


def test_a_short_training_of_arm_lift_moves_the_gripper_to_the_cube(seed, learned):
    """40 iterations of 128 envs (123k steps): the reach stage comes first; the deterministic
    policy's 2 s return (the two reach terms: up to 2 per second at the cube) rises above both the
    untrained policy's and holding the home pose's (about 0.13) by more than 0.5. Over training seeds
    0-19 it rose 0.86-1.61 (mean 1.21, sd 0.19): the bound is 3.7 sd below the mean."""
    before, after = short_training(make_runner("task=arm_lift", "sim.num_envs=128", f"seed={seed}"), 40)
    learned(return_rise=(after["return"] - before["return"], 0.5))


# --- export and the edge runtime ----------------------------------------------------------------
@pytest.fixture(scope="module", params=["arm_reach", "arm_reach_delta", "arm_lift", "arm_lift_ik"])
def exported(request, tmp_path_factory):
    """A run folder with a (briefly normalized, untrained) policy of the task, exported."""
    overrides = {"arm_reach": ["task=arm_reach"], "arm_lift": ["task=arm_lift"], "arm_lift_ik": ["task=arm_lift_ik"],
                 "arm_reach_delta": ["task=arm_reach", "task.action.type=joint_position_delta",
                                     "task.action.scale=0.05"]}
    return {"name": request.param,
            **export_untrained_run(tmp_path_factory.mktemp(request.param), *overrides[request.param])}


def arm_state(env, i: int) -> dict:
    """What the robot and a calibrated camera report for world i: joints, and the cube in the base frame."""
    state = {"joint_pos": env.robot.joint_pos[i].numpy().copy(), "joint_vel": env.robot.joint_vel[i].numpy().copy(),
             "timestamp": 0.0}
    if "cube" in env.scene:
        from legion.tasks.manipulation.terms import object_position

        state["object_pos"] = object_position(env)[i].numpy().copy()
    return state


def test_arm_policies_export_and_the_edge_runtime_acts_as_the_env(exported):
    from legion.sim2real.deploy import PolicyRunner

    env, actor = exported["env"], exported["actor"]
    assert exported["report"]["policy.onnx"]["max_abs_diff"] <= 1e-5
    runtime = PolicyRunner(exported["out"] / "policy.onnx")
    meta = runtime.metadata
    assert meta.joint_names == env.robot.joint_names and len(meta.joint_names) == 9
    terms = {t.func: t.size for t in meta.observation.terms}
    assert meta.command is not None
    if exported["name"].startswith("arm_lift"):
        assert meta.action.joint_ids == [0, 1, 2, 3, 4, 5, 6, 7]  # the arm and the coupled fingers' actuator
        assert meta.command.type == "position" and meta.command.entity == "cube"
        assert terms["object_position"] == 3 and terms["position_command"] == 3
        assert runtime.state_keys == ["joint_pos", "joint_vel", "object_pos"]
        if exported["name"] == "arm_lift_ik":  # the IK's chain travels with it; the TCP is observed by FK
            task_space = meta.action.task_space
            assert task_space is not None and task_space.body == "tcp" and len(task_space.chain.axes) == 7
            assert terms["body_position"] == 3 and runtime.policy.num_actions == 7
            # FK runs on the action's chain only: a body_position of another body is refused by name.
            from legion.sim2real.deploy.policy import ObservationTerms, PolicyLoadError

            other = copy.deepcopy(meta)
            next(t for t in other.observation.terms if t.func == "body_position").params["bodies"] = [0]
            with pytest.raises(PolicyLoadError, match="this policy's action moves no such body"):
                ObservationTerms.of(other)
    else:
        assert meta.action.joint_ids == list(range(7))
        assert meta.command.type == "pose" and meta.command.body == "tcp" and terms["pose_command"] == 7
        assert runtime.state_keys == ["joint_pos", "joint_vel"]
        # A target's quaternion with either sign (one orientation) is observed with the sign training drew.
        command = env.command.value[0].numpy()
        flipped = np.concatenate([command[:3], -command[3:]])
        assert np.array_equal(runtime.observation(arm_state(env, 0), flipped),
                              runtime.observation(arm_state(env, 0), command))
    errors = lockstep_errors(env, actor, runtime, lambda env: arm_state(env, 0))
    assert max(errors.values()) <= 1e-5, errors
    assert np.abs(runtime.last_action).max() > 0.05
    if exported["name"] != "arm_lift":
        return
    # arm_lift clamps targets to the joint limits (the fingers' stroke): asked past them (the
    # action scale made 100x), the targets stop at them, in both.
    assert runtime.metadata.action.clamp_to_limits is True
    scale = env.action.scale
    env.action.scale, runtime.action_scale = 100 * scale, 100 * runtime.action_scale
    try:
        errors = lockstep_errors(env, actor, runtime, lambda env: arm_state(env, 0), steps=3)
    finally:
        env.action.scale = scale
    limits = env.robot.joint_limits[env.action.joint_ids].numpy()
    targets = env.robot.joint_pos_target[0, env.action.joint_ids].numpy()
    # (the targets within 100x the float rounding of an action, ~2e-7, times the 100x scale)
    assert errors["obs"] <= 1e-5 and errors["action"] <= 1e-5 and errors["target"] <= 1e-4, errors
    assert np.isclose(targets[:, None], limits).any(axis=1).sum() >= 3  # most actions ask for more than the range


def test_per_axis_following_is_the_slope_of_where_the_body_ends_on_the_goal():
    from legion.evaluation import axes

    goals = [[0.4 + 0.05 * k, -0.2 + 0.1 * k, 0.3] for k in range(5)]
    records = [{"goal_b_m": g, "final_b_m": [g[0], 0.5 * g[1] + 0.1, 0.32]} for g in goals]
    result = axes(records)
    assert result["x"] == {"mean_abs_error_m": pytest.approx(0.0), "follows_goal": pytest.approx(1.0)}
    assert result["y"]["follows_goal"] == pytest.approx(0.5)  # half the way: a partly learned axis
    assert result["z"] == {"mean_abs_error_m": pytest.approx(0.02), "follows_goal": None}  # one goal height


@pytest.mark.parametrize("exported", ["arm_reach"], indirect=True)
def test_eval_reports_success_time_and_final_errors(exported, tmp_path):
    """A policy that outputs zero holds the home pose; with the command fixed at the home pose it
    succeeds in every episode as soon as the hold is complete, 5 cm away in none."""
    from legion.evaluation import Options, measure, table, write
    from legion.tasks.mdp.terms import Term

    def manipulation_metrics(loaded, episodes):
        report = measure(loaded, Options(episodes=episodes))
        return {**report["rows"][0], **report["summary"], "report": report}

    loaded, env = exported["loaded"], exported["env"]
    last = [m for m in loaded.runner.ppo.get_policy().modules() if isinstance(m, torch.nn.Linear)][-1]
    weights = [p.detach().clone() for p in last.parameters()]
    start = env.events.terms["joint_pos_offset"]
    try:
        with torch.no_grad():
            for p in last.parameters():
                p.zero_()
        start.enabled = False
        env.reset()
        env.command.hold(tcp_pose(env))
        metrics = manipulation_metrics(loaded, episodes=6)
        assert metrics["episodes"] == 6 and metrics["success_rate"] == 1.0
        assert metrics["time_to_success_s"]["max"] == pytest.approx(0.5)
        assert metrics["final_position_error_m"]["max"] < 1e-3 and metrics["final_orientation_error_rad"]["max"] < 1e-3
        assert "success_rate" in table(metrics["report"]) and "100%" in table(metrics["report"])
        # Each reward term per second of episode, as training logs it: on target the tanh term pays its weight.
        rewards = metrics["report"]["rewards"]
        assert rewards["position_tanh"] == pytest.approx(0.5, abs=0.01)
        assert rewards["position_error"] == pytest.approx(0.0, abs=1e-3)
        assert "reward per second of episode: position_error" in table(metrics["report"])
        axes = metrics["report"]["axes"]  # goals held in one place: no slope to measure
        assert all(a["mean_abs_error_m"] < 1e-3 and a["follows_goal"] is None for a in axes.values())
        json_path, png_path = write(metrics["report"], tmp_path)
        assert json.loads(json_path.read_text())["rows"][0]["episodes"] == 6 and png_path.stat().st_size > 5000
        env.command.hold(tcp_pose(env) + torch.tensor([0.05, 0, 0, 0, 0, 0, 0]))
        metrics = manipulation_metrics(loaded, episodes=4)
        assert metrics["success_rate"] == 0.0 and metrics["time_to_success_s"] is None
        assert metrics["final_position_error_m"]["mean"] == pytest.approx(0.05, abs=1e-3)
        rewards = metrics["report"]["rewards"]  # 5 cm off: 0.5 (1 - tanh(0.05 / 0.1)) and -0.2 * 0.05
        assert rewards["position_tanh"] == pytest.approx(0.269, abs=0.005)
        assert rewards["position_error"] == pytest.approx(-0.01, abs=5e-4)
        axes = metrics["report"]["axes"]  # the miss is along x only
        assert axes["x"]["mean_abs_error_m"] == pytest.approx(0.05, abs=1e-3)
        assert axes["y"]["mean_abs_error_m"] < 1e-3 and axes["z"]["mean_abs_error_m"] < 1e-3
        # The task's own goals, and a policy that ignores them: the tool ends at home whatever the goal.
        env.command.release()
        metrics = manipulation_metrics(loaded, episodes=8)
        axes = metrics["report"]["axes"]
        assert all(abs(a["follows_goal"]) < 1e-3 for a in axes.values()), axes
        assert "follows the goal 0.00" in table(metrics["report"])
        # Worlds 1 and 3 fail at once in every episode (a termination): they count as many episodes
        # as worlds 0 and 2, which succeed, not more for ending sooner.
        env.command.hold(tcp_pose(env))
        failing = torch.tensor([False, True, False, True])
        env.termination_terms.append(Term("odd_worlds_fail", lambda env: failing))
        metrics = manipulation_metrics(loaded, episodes=8)
        assert sorted(r["env"] for r in metrics["report"]["series"]["episodes"]) == [0, 0, 1, 1, 2, 2, 3, 3]
        assert metrics["success_rate"] == 0.5
    finally:
        env.termination_terms = [t for t in env.termination_terms if t.name != "odd_worlds_fail"]
        with torch.no_grad():
            for p, w in zip(last.parameters(), weights):
                p.copy_(w)
        start.enabled = True
        env.command.release()
