"""The simulation seam: independent worlds, graph == eager, zero-copy views, contacts, errors."""

import threading

import pytest
import torch
import warp as wp

from legion.tasks.sim import NewtonSim

QUAD = dict(robot="quadruped.xml", dt=0.005, decimation=4)
STAND_POSE = torch.tensor([0.1, 0.8, -1.5, -0.1, 0.8, -1.5, 0.1, 1.0, -1.5, -0.1, 1.0, -1.5])


def drive(sim: NewtonSim, targets: torch.Tensor) -> None:
    """One control step per row of ``targets`` (steps, num_envs, 12)."""
    for target in targets:
        sim.joint_target_pos[:] = target
        sim.step()


def stand(sim: NewtonSim, height: float = 0.33) -> None:
    """Every world to the standing pose, targets at that pose."""
    ids = torch.arange(sim.num_envs)
    root = torch.tensor([0.0, 0.0, height, 0.0, 0.0, 0.0, 1.0]).repeat(sim.num_envs, 1)
    sim.reset(ids, STAND_POSE.repeat(sim.num_envs, 1), torch.zeros(sim.num_envs, 12), root, torch.zeros(sim.num_envs, 6))
    sim.joint_target_pos[:] = STAND_POSE


@pytest.fixture(scope="module")
def quad_pair():
    """Two identical 4-world quadruped sims: one stepped with the captured graph, one eagerly."""
    return NewtonSim(num_envs=4, use_graph=True, **QUAD), NewtonSim(num_envs=4, use_graph=False, **QUAD)


def test_layout_comes_from_the_model(quad_pair):
    sim = quad_pair[0]
    assert sim.floating_base and sim.num_joints == 12
    assert sim.joint_names[:3] == ["FL_hip_joint", "FL_thigh_joint", "FL_calf_joint"]
    assert sim.joint_pos.shape == (4, 12) and sim.root_quat.shape == (4, 4)
    assert sim.body_pos.shape == (4, len(sim.body_names), 3)
    assert torch.allclose(sim.body_mass[0].sum(), torch.tensor(22.472), atol=1e-3)
    assert sim.effort_limits.tolist() == pytest.approx([23.7, 23.7, 45.43] * 4)


def test_graph_step_equals_eager_step_bit_for_bit(quad_pair):
    graph, eager = quad_pair
    assert graph.graph is not None and eager.graph is None
    torch.manual_seed(0)
    for sim in quad_pair:
        stand(sim)
    for _ in range(25):
        targets = graph.default_joint_pos * 0 + torch.randn(4, 12) * 0.3 + STAND_POSE
        for sim in quad_pair:
            sim.joint_target_pos[:] = targets
            sim.step()
    assert torch.equal(graph._joint_q, eager._joint_q)
    assert torch.equal(graph._joint_qd, eager._joint_qd)
    assert torch.equal(graph.contact_forces, eager.contact_forces)
    assert graph._joint_qd.abs().max() > 0.1  # it really moved


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
    assert torch.equal(graph._joint_q, eager._joint_q) and torch.equal(graph._joint_qd, eager._joint_qd)
    assert graph._joint_qd.abs().max() > 0.1  # it really moved


def test_views_share_memory_with_newton_state(quad_pair):
    sim = quad_pair[0]
    assert sim.joint_pos.data_ptr() == wp.to_torch(sim.state.joint_q).data_ptr() + 7 * 4
    stand(sim, height=1.0)  # written through the views only: 1 m up in the air
    assert sim.state.joint_q.numpy()[2] == pytest.approx(1.0)
    sim.step()
    # The simulator saw the write: the base is falling from 1 m, not standing at 0.33 m.
    assert 0.95 < sim.root_pos[0, 2] < 1.0 and sim.root_lin_vel[0, 2] < -0.1


def test_a_force_in_env_0_moves_nothing_in_env_1():
    pushed, reference = (NewtonSim(num_envs=2, **QUAD) for _ in range(2))
    for sim in (pushed, reference):
        stand(sim)
    push = torch.zeros(2, 6)
    push[0, 0] = 300.0  # 300 N forward on env 0's base
    pushed.apply_root_force(push)
    for _ in range(20):
        pushed.step()
        reference.step()
    assert pushed.root_pos[0, 0] > reference.root_pos[0, 0] + 0.05  # env 0 was shoved
    assert torch.equal(pushed._joint_q[1], reference._joint_q[1])  # env 1: bit-identical
    assert torch.equal(pushed._joint_qd[1], reference._joint_qd[1])


def test_resetting_env_3_leaves_the_others_untouched(quad_pair):
    sim = quad_pair[0]
    stand(sim)
    for _ in range(5):
        sim.step()
    before_q, before_qd, before_body = sim._joint_q.clone(), sim._joint_qd.clone(), sim.body_pos.clone()
    ids = torch.tensor([3])
    sim.reset(ids, torch.zeros(1, 12), torch.zeros(1, 12), torch.tensor([[1.0, 2.0, 0.5, 0, 0, 0, 1.0]]), torch.zeros(1, 6))
    others = [0, 1, 2]
    assert torch.equal(sim._joint_q[others], before_q[others])
    assert torch.equal(sim._joint_qd[others], before_qd[others])
    assert torch.equal(sim.body_pos[others], before_body[others])
    assert sim.root_pos[3].tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert sim.body_pos[3, 0].tolist() == pytest.approx([1.0, 2.0, 0.5])  # body poses follow (FK)


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
        futures.append((sim._joint_q.clone(), sim._joint_qd.clone()))
    assert torch.equal(futures[0][0], futures[1][0]) and torch.equal(futures[0][1], futures[1][1])


def test_contact_forces_carry_the_robot_weight(quad_pair):
    sim = quad_pair[0]
    stand(sim)
    for _ in range(50):
        sim.step()
    feet = sim.find_bodies(".*_foot")
    weight = float(sim.body_mass[0].sum()) * 9.81
    total_z = sim.contact_forces[:, :, 2].sum(dim=1)
    assert torch.allclose(total_z, torch.full((4,), weight), rtol=0.1)
    assert (sim.contact_forces[:, feet, 2] > 10.0).all()  # all four feet carry load
    assert sim.contact_forces[:, sim.find_bodies("base"), :].abs().max() == 0.0


def test_bad_model_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        NewtonSim("no_such_robot.xml", num_envs=1, dt=0.01, decimation=1)
    broken = tmp_path / "broken.xml"
    broken.write_text("<mujoco><worldbody><body name='a'><geom type='sphere' size='0.1'/></worldbody>")
    with pytest.raises(ValueError, match="Could not load robot model"):
        NewtonSim(str(broken), num_envs=1, dt=0.01, decimation=1)
    with pytest.raises(ValueError, match="No joint name matches"):
        NewtonSim("cartpole.xml", num_envs=1, dt=0.01, decimation=1, ground=False).find_joints("elbow")
