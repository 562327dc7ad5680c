"""The simulation seam: a scene of entities, independent worlds, graph == eager, zero-copy views,
contacts, errors."""

import ctypes
import threading

import pytest
import torch
import warp as wp

from legion.configs.schema import Fixture, RigidObject, Robot, Scene
from legion.tasks.sim import SOLVER_LIMITS, NewtonSim

QUAD = dict(scene="quadruped.xml", dt=0.005, decimation=4)
STAND_POSE = torch.tensor([0.1, 0.8, -1.5, -0.1, 0.8, -1.5, 0.1, 1.0, -1.5, -0.1, 1.0, -1.5])


def drive(sim: NewtonSim, targets: torch.Tensor) -> None:
    """One control step per row of ``targets`` (steps, num_envs, 12)."""
    for target in targets:
        sim.robot.joint_pos_target[:] = target
        sim.step()


def stand(sim: NewtonSim, height: float = 0.33) -> None:
    """Every world to the standing pose, at rest, targets at that pose."""
    robot = sim.robot
    robot.root_pose_w[:] = torch.tensor([0.0, 0.0, height, 0.0, 0.0, 0.0, 1.0])
    robot.root_vel_w[:] = 0.0
    robot.joint_pos[:] = STAND_POSE
    robot.joint_vel[:] = 0.0
    sim.reset(torch.arange(sim.num_envs))
    robot.joint_pos_target[:] = STAND_POSE


@pytest.fixture(scope="module")
def quad_pair():
    """Two identical 4-world quadruped sims on MuJoCo Warp: one stepped with the captured graph, one eagerly."""
    return (NewtonSim(num_envs=4, use_graph=True, backend="warp", **QUAD),
            NewtonSim(num_envs=4, use_graph=False, backend="warp", **QUAD))


def test_layout_comes_from_the_model(quad_pair):
    robot = quad_pair[0].robot
    assert robot.floating_base and robot.num_joints == 12
    assert robot.joint_names[:3] == ["FL_hip_joint", "FL_thigh_joint", "FL_calf_joint"]
    assert robot.joint_pos.shape == (4, 12) and robot.root_quat_w.shape == (4, 4)
    assert robot.body_pos_w.shape == (4, len(robot.body_names), 3)
    assert torch.allclose(robot.body_mass[0].sum(), torch.tensor(22.472), atol=1e-3)
    assert robot.effort_limits.tolist() == pytest.approx([23.7, 23.7, 45.43] * 4)


@pytest.mark.bit_exact
def test_graph_step_equals_eager_step_bit_for_bit(quad_pair):
    graph, eager = quad_pair
    assert graph.graph is not None and eager.graph is None
    torch.manual_seed(0)
    for sim in quad_pair:
        stand(sim)
    drive_both = torch.randn(25, 4, 12) * 0.3 + STAND_POSE
    for sim in quad_pair:
        drive(sim, drive_both)
    assert torch.equal(graph.joint_q, eager.joint_q)
    assert torch.equal(graph.joint_qd, eager.joint_qd)
    assert torch.equal(graph.contact_forces, eager.contact_forces)
    assert graph.joint_qd.abs().max() > 0.1  # it really moved


def test_a_linesearch_at_its_limit_is_counted_the_same_in_graph_and_eager_and_printed_nowhere(capfd):
    """MuJoCo Warp printed two lines for every world stopping at ``ls_iterations``, hundreds per
    training run. With one linesearch iteration, quadrupeds dropped onto the ground stop there at
    impact: each control step counts those worlds, on the device, and nothing is printed."""
    counts = {}
    for use_graph in (True, False):
        sim = NewtonSim(num_envs=4, use_graph=use_graph, solver_options={"iterations": 10, "ls_iterations": 1},
                        backend="warp", **QUAD)
        stand(sim, height=0.45)
        counts[use_graph] = []
        for _ in range(12):
            sim.step()
            counts[use_graph].append(sim.solver_limits.clone())
    ctypes.CDLL(None).fflush(None)  # Warp's CPU printf writes through C's stdio buffer
    out, err = capfd.readouterr()
    assert "limit reached" not in out + err
    graph, eager = torch.stack(counts[True]), torch.stack(counts[False])
    assert torch.equal(graph, eager)
    limit, linesearch = SOLVER_LIMITS.index("limit"), SOLVER_LIMITS.index("linesearch_limit")
    assert graph[0].sum() == 0  # in the air the solver has nothing to solve
    assert graph[:, linesearch].max() == 4  # impact: every world (a step counts worlds, at most 4)
    either, iterations = graph[:, limit], graph[:, SOLVER_LIMITS.index("iteration_limit")]
    assert (either >= torch.maximum(graph[:, linesearch], iterations)).all()
    assert (either <= graph[:, linesearch] + iterations).all()
    assert graph[:, SOLVER_LIMITS.index("overflow")].sum() == 0


def test_sims_stepped_from_two_threads_take_turns(quad_pair):
    """Warp's CPU tile kernels share one static per module: two threads stepping at once used to
    abort ("tile shared-memory allocation exceeds the 256 KiB arena") or segfault. NewtonSim
    serializes its kernel launches, so both threads finish with the state a lone thread makes."""
    targets = STAND_POSE + torch.randn(50, 4, 12, generator=torch.Generator().manual_seed(1)) * 0.3
    errors = []

    def walk(sim):
        try:
            drive(sim, targets)
        except BaseException as e:  # surfaces in the main thread below
            errors.append(e)

    for sim in quad_pair:
        stand(sim)
    threads = [threading.Thread(target=walk, args=(sim,)) for sim in quad_pair]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    graph, eager = quad_pair
    assert torch.equal(graph.joint_q, eager.joint_q) and torch.equal(graph.joint_qd, eager.joint_qd)
    assert graph.joint_qd.abs().max() > 0.1  # it really moved


def test_views_share_memory_with_newton_state(quad_pair):
    sim = quad_pair[0]
    robot = sim.robot
    assert robot.joint_pos.data_ptr() == wp.to_torch(sim.state.joint_q).data_ptr() + 7 * 4
    stand(sim, height=1.0)  # written through the views only: 1 m up in the air
    assert sim.state.joint_q.numpy()[2] == pytest.approx(1.0)
    sim.step()
    # The simulator saw the write: the base is falling from 1 m, not standing at 0.33 m.
    assert 0.95 < robot.root_pos_w[0, 2] < 1.0 and robot.root_lin_vel_w[0, 2] < -0.1
    assert robot.root_lin_vel_b[0].tolist() == pytest.approx(robot.root_lin_vel_w[0].tolist(), abs=1e-6)  # level


def test_a_force_in_env_0_moves_nothing_in_env_1():
    pushed, reference = (NewtonSim(num_envs=2, **QUAD) for _ in range(2))
    for sim in (pushed, reference):
        stand(sim)
    pushed.robot.root_wrench_w[0, 0] = 300.0  # 300 N forward on env 0's base
    for _ in range(20):
        pushed.step()
        reference.step()
    assert pushed.robot.root_pos_w[0, 0] > reference.robot.root_pos_w[0, 0] + 0.05  # env 0 was shoved
    assert torch.equal(pushed.joint_q[1], reference.joint_q[1])  # env 1: bit-identical
    assert torch.equal(pushed.joint_qd[1], reference.joint_qd[1])


def test_resetting_env_3_leaves_the_others_untouched(quad_pair):
    sim = quad_pair[0]
    robot = sim.robot
    stand(sim)
    for _ in range(5):
        sim.step()
    before_q, before_qd, before_body = sim.joint_q.clone(), sim.joint_qd.clone(), robot.body_pos_w.clone()
    robot.joint_pos[3] = 0.0
    robot.joint_vel[3] = 0.0
    robot.root_pose_w[3] = torch.tensor([1.0, 2.0, 0.5, 0, 0, 0, 1.0])
    robot.root_vel_w[3] = 0.0
    sim.reset(torch.tensor([3]))
    others = [0, 1, 2]
    assert torch.equal(sim.joint_q[others], before_q[others])
    assert torch.equal(sim.joint_qd[others], before_qd[others])
    assert torch.equal(robot.body_pos_w[others], before_body[others])
    assert robot.root_pos_w[3].tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert robot.body_pos_w[3, 0].tolist() == pytest.approx([1.0, 2.0, 0.5])  # body poses follow (FK)


def test_a_reset_world_forgets_its_past(quad_pair):
    """The same reset followed by the same actions gives the same future, bit for bit, whatever
    the worlds did before: the reset clears the solver's warm start (MuJoCo's qacc_warmstart),
    which otherwise carries the previous episode into the next one."""
    sim = quad_pair[0]
    noise = torch.randn(30, 4, 12, generator=torch.Generator().manual_seed(2)) * 0.3
    past, future = STAND_POSE + noise[:20], STAND_POSE + noise[20:]
    futures = []
    for past_steps in (20, 3):
        stand(sim)
        drive(sim, past[:past_steps])
        stand(sim, height=0.31)  # feet in contact from the first substep: the solver has work
        drive(sim, future)
        futures.append((sim.joint_q.clone(), sim.joint_qd.clone()))
    assert torch.equal(futures[0][0], futures[1][0]) and torch.equal(futures[0][1], futures[1][1])


def test_contact_forces_carry_the_robot_weight(quad_pair):
    sim = quad_pair[0]
    robot = sim.robot
    stand(sim)
    for _ in range(50):
        sim.step()
    feet = robot.find_bodies(".*_foot")
    weight = float(robot.body_mass[0].sum()) * 9.81
    total_z = robot.contact_forces_w[:, :, 2].sum(dim=1)
    assert torch.allclose(total_z, torch.full((4,), weight), rtol=0.1)
    assert (robot.contact_forces_w[:, feet, 2] > 10.0).all()  # all four feet carry load
    assert robot.contact_forces_w[:, robot.find_bodies("base"), :].abs().max() == 0.0


def test_bad_model_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        NewtonSim("no_such_robot.xml", num_envs=1, dt=0.01, decimation=1)
    broken = tmp_path / "broken.xml"
    broken.write_text("<mujoco><worldbody><body name='a'><geom type='sphere' size='0.1'/></worldbody>")
    with pytest.raises(ValueError, match="Could not load robot model"):
        NewtonSim(str(broken), num_envs=1, dt=0.01, decimation=1)
    with pytest.raises(ValueError, match="No joint name of robot matches"):
        NewtonSim(Scene(robot=Robot(file="cartpole.xml"), ground=None), num_envs=1, dt=0.01,
                  decimation=1).robot.find_joints("elbow")
    with pytest.raises(ValueError, match=r"objects.ball.size.*sphere takes 1 positive"):
        NewtonSim(Scene(robot=Robot(file="cartpole.xml"), objects={"ball": RigidObject(shape="sphere", size=[0.1, 0.2],
                                                                                    mass=1.0)}),
                  num_envs=1, dt=0.01, decimation=1)


def test_a_reset_recomputes_the_body_poses_of_every_entity_in_the_reset_worlds_and_no_other():
    """Newton's forward kinematics masks articulations, not worlds: a robot and a free cube are
    two per world. The cube moved in world 0 and the robot in world 2 are where their bodies are
    after the reset; world 1 keeps its poses (before the fix, world 0's cube kept its old pose)."""
    scene = Scene(robot=Robot(file="quadruped.xml"),
                  objects={"cube": RigidObject(size=[0.1, 0.1, 0.1], mass=0.5, pos=[1.0, 0.0, 0.05])})
    sim = NewtonSim(scene, num_envs=3, dt=0.005, decimation=4)
    robot, cube = sim.robot, sim.scene["cube"]
    before = sim.body_q.clone()
    cube.root_pos_w[:, 2] = 1.03
    robot.root_pos_w[:, 2] = 0.77
    sim.reset(torch.tensor([True, False, True]))
    assert cube.body_pos_w[:, 0, 2].tolist() == pytest.approx([1.03, 0.05, 1.03])
    assert robot.body_pos_w[[0, 2], 0, 2].tolist() == pytest.approx([0.77, 0.77])
    assert torch.equal(sim.body_q[1], before[1])


def test_a_scene_of_a_robot_a_free_box_and_a_table_steps_with_views_for_each():
    """The manipulation layout: entities side by side in every world, each with its own views.
    A 0.5 kg cube dropped onto a static table comes to rest on it, its contact force is its
    weight, and the robot standing beside it is unaffected by it."""
    scene = Scene(robot=Robot(file="quadruped.xml"),
                  objects={"cube": RigidObject(size=[0.1, 0.1, 0.1], mass=0.5, pos=[1.0, 0.0, 0.6], friction=0.8)},
                  fixtures={"table": Fixture(size=[0.4, 0.4, 0.2], pos=[1.0, 0.0, 0.1])})
    sim = NewtonSim(scene, num_envs=2, dt=0.005, decimation=4)
    assert list(sim.scene) == ["robot", "cube", "table"]
    robot, cube, table = sim.robot, sim.scene["cube"], sim.scene["table"]
    assert cube.body_mass[:, 0].tolist() == pytest.approx([0.5, 0.5])
    assert cube.shape_friction[:, 0].tolist() == pytest.approx([0.8, 0.8]) and table.shape_friction.shape == (2, 1)
    assert robot.joint_pos.shape == (2, 12) and sim.joint_q.shape == (2, 7 + 12 + 7)
    cube.root_pos_w[1, 0] = 3.0  # env 1: beside the table, onto the ground
    sim.reset(torch.tensor([1]))
    stand(sim)
    for _ in range(60):  # 1.2 s
        sim.step()
    assert cube.root_pos_w[:, 2].tolist() == pytest.approx([0.2 + 0.05, 0.05], abs=2e-3)  # on the table / the ground
    assert cube.contact_forces_w[:, 0, 2].tolist() == pytest.approx([0.5 * 9.81] * 2, rel=0.02)
    assert cube.root_lin_vel_w.abs().max() < 1e-2 and cube.root_quat_w[:, 3].abs().min() > 0.999
    assert robot.root_pos_w[:, 2].min() > 0.25  # standing
