"""The solver is a config choice (configs/sim/): XPBD steps the same task through the same seam."""

import pytest
import torch

from tasks.sim import NewtonSim


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
