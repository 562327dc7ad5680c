"""The solver is a config choice (configs/sim/): XPBD steps the same task through the same seam."""

import pytest
import torch

from legion.configs.schema import Robot, Scene
from legion.tasks.sim import NewtonSim

POLE = Scene(robot=Robot(file="cartpole.xml"), ground=None, contact_sensing=False)


def test_xpbd_and_mujoco_agree_on_a_falling_pole():
    angles = {}
    for solver, options in (("xpbd", {"iterations": 4}), ("mujoco", None)):
        sim = NewtonSim(POLE, num_envs=2, dt=0.005, decimation=4, solver=solver, solver_options=options)
        sim.robot.joint_pos[:] = torch.tensor([[0.0, 0.05], [0.0, -0.05]])
        sim.reset(torch.arange(2))
        for _ in range(25):  # 0.5 s
            sim.step()
        angles[solver] = sim.robot.joint_pos[:, 1].clone()
        assert sim.solver_limits.tolist() == [0, 0, 0, 0]  # XPBD counts none; MuJoCo met no limit here
    # A pole tipped 0.05 rad falls the way it leans (inverted pendulum: ~0.05 cosh(3.8 t)), the
    # two worlds mirror each other, and both solvers agree.
    xpbd, mujoco = angles["xpbd"], angles["mujoco"]
    assert xpbd[0] > 0.1 and torch.allclose(xpbd[0], -xpbd[1], atol=1e-4)
    assert torch.allclose(xpbd, mujoco, rtol=0.15)


def test_xpbd_refuses_contact_sensing_with_advice():
    with pytest.raises(ValueError, match="contact_sensing=false"):
        NewtonSim(Scene(robot=Robot(file="cartpole.xml"), ground=None), num_envs=1, dt=0.005, decimation=1,
                  solver="xpbd")


@pytest.mark.parametrize("asset, joints", [("quadruped.urdf", 12), ("cartpole.usda", 3)])
def test_urdf_and_usd_models_load_through_the_same_seam(asset, joints):
    """Newton's shipped URDF quadruped and USD cart-pole: joint layout read from the file."""
    import newton.examples

    if asset.endswith(".usda"):
        pytest.importorskip("pxr", reason="USD import needs usd-core (pip install -e '.[test]')")
    scene = Scene(robot=Robot(file=newton.examples.get_asset(asset)), contact_sensing=False)
    sim = NewtonSim(scene, num_envs=2, dt=0.005, decimation=2)
    robot = sim.robot
    assert robot.num_joints == joints and len(robot.joint_names) == joints
    robot.joint_pos[:] = 0.2
    sim.reset(torch.arange(2))
    before = robot.body_pos_w.clone()
    for _ in range(10):
        sim.step()
    assert torch.isfinite(robot.body_pos_w).all()
    assert (before - robot.body_pos_w).abs().max() > 1e-3  # gravity moved the tilted links
    assert torch.equal(robot.joint_pos[0], robot.joint_pos[1])  # identical worlds stay identical
