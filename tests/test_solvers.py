"""The solver is a config choice (configs/sim/): XPBD steps the same task through the same seam."""

import pytest
import torch

from legion.tasks.sim import NewtonSim


def test_xpbd_and_mujoco_agree_on_a_falling_pole():
    angles = {}
    for solver, options in (("xpbd", {"iterations": 4}), ("mujoco", None)):
        sim = NewtonSim("cartpole.xml", num_envs=2, dt=0.005, decimation=4, solver=solver,
                        solver_options=options, ground=False, sense_contacts=False)
        sim.reset(torch.arange(2), torch.tensor([[0.0, 0.05], [0.0, -0.05]]), torch.zeros(2, 2))
        for _ in range(25):  # 0.5 s
            sim.step()
        angles[solver] = sim.joint_pos[:, 1].clone()
    # A pole tipped 0.05 rad falls the way it leans (inverted pendulum: ~0.05 cosh(3.8 t)), the
    # two worlds mirror each other, and both solvers agree.
    xpbd, mujoco = angles["xpbd"], angles["mujoco"]
    assert xpbd[0] > 0.1 and torch.allclose(xpbd[0], -xpbd[1], atol=1e-4)
    assert torch.allclose(xpbd, mujoco, rtol=0.15)


def test_xpbd_refuses_contact_sensing_with_advice():
    with pytest.raises(ValueError, match="sense_contacts=false"):
        NewtonSim("cartpole.xml", num_envs=1, dt=0.005, decimation=1, solver="xpbd", ground=False)


@pytest.mark.parametrize("asset, joints", [("quadruped.urdf", 12), ("cartpole.usda", 3)])
def test_urdf_and_usd_models_load_through_the_same_seam(asset, joints):
    """Newton's shipped URDF quadruped and USD cart-pole: joint layout read from the file."""
    import newton.examples

    if asset.endswith(".usda"):
        pytest.importorskip("pxr", reason="USD import needs usd-core (pip install -e '.[test]')")
    sim = NewtonSim(newton.examples.get_asset(asset), num_envs=2, dt=0.005, decimation=2, sense_contacts=False)
    assert sim.num_joints == joints and len(sim.joint_names) == joints
    ids = torch.arange(2)
    sim.reset(ids, torch.full((2, joints), 0.2), torch.zeros(2, joints),
              *((sim.default_root_pose, torch.zeros(2, 6)) if sim.floating_base else ()))
    before = sim.body_pos.clone()
    for _ in range(10):
        sim.step()
    assert torch.isfinite(sim.body_pos).all()
    assert (before - sim.body_pos).abs().max() > 1e-3  # gravity moved the tilted links
    assert torch.equal(sim.joint_pos[0], sim.joint_pos[1])  # identical worlds stay identical
