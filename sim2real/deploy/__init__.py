"""The edge runtime: runs an exported legion policy on a robot computer.

Imports numpy and onnxruntime only (no torch, no warp, no training code), so it installs on a
Jetson next to the robot's drivers. The MuJoCo robot (``legion.sim2real.deploy.mujoco_robot``) also
needs ``mujoco`` and is imported only when used.

    from legion.sim2real.deploy import ControlLoop, PolicyRunner
    runner = PolicyRunner("exported/policy.onnx")
    loop = ControlLoop(my_robot, runner)          # my_robot implements RobotInterface
    print(loop.run(steps=500, command=[0.5, 0.0, 0.0]))

To log what the robot did (one .npz per episode, see :mod:`legion.sim2real.deploy.log`)::

    with TrajectoryLog("robot_logs", runner) as log:
        ControlLoop(my_robot, runner, logger=log).run(steps=500)
"""

from legion.sim2real.deploy.log import TrajectoryLog
from legion.sim2real.deploy.loop import ControlLoop, LoopStats, RobotInterface, SafetyConfig
from legion.sim2real.deploy.policy import (
    NonFiniteError,
    ObservationTerms,
    OnnxPolicy,
    PolicyLoadError,
    PolicyRunner,
    StateError,
    quat_rotate_inverse,
)

__all__ = ["ControlLoop", "LoopStats", "NonFiniteError", "ObservationTerms", "OnnxPolicy", "PolicyLoadError",
           "PolicyRunner", "RobotInterface", "SafetyConfig", "StateError", "TrajectoryLog", "quat_rotate_inverse"]
