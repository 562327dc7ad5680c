"""Real robots from installed packages (configs/robot/: go2, g1, panda from example-robot-data,
the `robots` extra): they load offline with the base, joints and drives their config gives, a robot
without drives is refused, the DC motor model bends torque with speed as specified, and each new
robot's task learns."""

import math

import pytest
import torch

from conftest import compose, make_env, make_runner, short_training
from legion.configs.schema import Actuator, Robot, Scene
from legion.tasks.mdp.actions import per_joint_scale
from legion.tasks.sim import NewtonSim
from legion.tasks.sim.scene import joint_actuators, resolve_asset

try:
    resolve_asset("package://example-robot-data/robots/go2_description/urdf/go2.urdf")
    HAVE_ROBOTS = True
except FileNotFoundError:
    HAVE_ROBOTS = False
needs_robots = pytest.mark.skipif(not HAVE_ROBOTS, reason="example-robot-data is not installed: "
                                  "pip install -e '.[robots]'")

# robot -> (a task of its kind, actuated joints, free base)
ROBOTS = {"go2": ("quadruped_flat", 12, True), "g1": ("biped_flat", 29, True), "panda": ("arm_reach", 9, False)}


@needs_robots
@pytest.mark.parametrize("robot", ROBOTS)
def test_each_robot_loads_offline_with_its_base_joints_and_the_gains_of_its_config(robot):
    task, num_joints, floating = ROBOTS[robot]
    cfg = compose(f"task={task}", f"robot={robot}")
    sim = NewtonSim(cfg.task.scene, num_envs=2, dt=cfg.sim.dt, decimation=1)
    articulation = sim.robot
    assert articulation.num_joints == num_joints and articulation.floating_base == floating
    drives = joint_actuators(cfg.task.scene.robot, articulation.joint_names)
    assert all(drive is not None for drive in drives), "every joint has a drive from the robot's config"
    for name, param in (("stiffness", "joint_stiffness"), ("damping", "joint_damping"),
                        ("effort_limit", "joint_effort_limit"), ("armature", "joint_armature")):
        expected = [getattr(d, name) for d in drives]
        actual = getattr(articulation, param)
        for j, value in enumerate(expected):
            if value is not None:
                assert actual[:, j].tolist() == pytest.approx([value] * 2, rel=1e-6), articulation.joint_names[j]
    # every joint is driven, except the Panda's finger 2: its URDF mimic couples it to finger 1
    assert (articulation.joint_stiffness > 0).sum(1).tolist() == [num_joints - (robot == "panda")] * 2
    if robot == "g1":  # mjlab's action scale: an action of 1 asks every joint for a quarter of its motor's torque
        scale = per_joint_scale(articulation, list(range(num_joints)), cfg.task.scene.robot.action_scale)
        torque = scale * articulation.joint_stiffness[0]
        assert torque.tolist() == pytest.approx((0.25 * articulation.joint_effort_limit[0]).tolist(), rel=2e-3)
        with pytest.raises(ValueError, match=r"gives no value to the driven joints \['left_hip_pitch_joint'\]"):
            per_joint_scale(articulation, [0], {"right_.*": 0.3})
    if robot == "go2":  # the URDF's limits (Unitree's figures) and its DC motors
        assert sim.motor_joint_ids.tolist() == list(range(12))
        knees = articulation.find_joints(".*_calf_joint")
        assert articulation.joint_effort_limit[0, knees].tolist() == pytest.approx([45.43] * 4)


@needs_robots
def test_the_pandas_controller_holds_its_pose_against_gravity_and_without_it_the_arm_sags():
    """Franka's controller compensates the arm's gravity (configs/robot/panda.yaml): the tool centre
    point stays put for a second at the default pose; with task.scene.robot.gravity_compensation=false
    the same servos let it sag by centimetres."""
    moved = {}
    for compensated in (True, False):
        env = make_env("task=arm_reach", "robot=panda", "sim.num_envs=1",
                       f"task.scene.robot.gravity_compensation={str(compensated).lower()}")
        robot, tcp = env.robot, env.robot.find_bodies("panda_hand_tcp")
        robot.joint_pos[:], robot.joint_vel[:] = robot.default_joint_pos, 0.0  # at rest on its targets
        env.sim.reset(torch.arange(1))
        start = robot.body_pos_w[:, tcp].clone()
        for _ in range(50):  # 1 s of control steps, every target at the default pose
            env.sim.step()
        moved[compensated] = (robot.body_pos_w[:, tcp] - start).norm().item()
    assert moved[True] < 1e-3 and moved[False] > 0.02, moved


@needs_robots
def test_a_robot_whose_model_has_no_drives_is_refused_with_a_message_naming_the_actuator_config():
    """The Panda's URDF has no gains: without configs/robot/panda.yaml's actuators the arm would
    collapse and its worlds go NaN within a second."""
    with pytest.raises(ValueError, match=r"stiffness \(the PD gain kp\) is 0.*task\.scene\.robot\.actuators"):
        make_env("task=arm_reach", "robot=panda", *(f"~task.scene.robot.actuators.{group}" for group in
                                                    ("shoulder", "forearm", "hand")), "sim.num_envs=2")


def test_a_package_path_of_a_package_not_installed_says_what_to_install():
    with pytest.raises(FileNotFoundError, match="package 'no-such-robots' is not installed"):
        resolve_asset("package://no-such-robots/robots/x.urdf")


# A flywheel on a hinge about z (no gravity torque), 0.1 kg m^2 about its axis.
FLYWHEEL = """<mujoco>
  <worldbody>
    <body name="wheel">
      <joint name="spin" type="hinge" axis="0 0 1" damping="0"/>
      <inertial pos="0 0 0" mass="1" diaginertia="0.1 0.1 0.1"/>
      <geom type="cylinder" size="0.1 0.02" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
</mujoco>"""


def test_the_dc_motor_gives_its_torque_limit_at_stall_and_less_as_it_speeds_up(tmp_path):
    """A step command far ahead of a flywheel: the PD asks for far more than the motor has. At rest
    the motor gives min(saturation_effort, effort_limit) = 8 N m; at speed v, saturation_effort
    (1 - v / velocity_limit) = 10 (1 - v/5) once that is below 8, so the wheel approaches 5 rad/s
    and never passes it. An implicit PD with the same limit keeps giving 8 N m and goes faster."""
    (tmp_path / "flywheel.xml").write_text(FLYWHEEL)
    motor = Actuator(joints="spin", model="dc_motor", stiffness=1000.0, damping=0.0, effort_limit=8.0,
                     saturation_effort=10.0, velocity_limit=5.0)
    scene = Scene(robot=Robot(file=str(tmp_path / "flywheel.xml"), actuators={"wheel": motor}), ground=None,
                  contact_sensing=False)
    sim = NewtonSim(scene, num_envs=2, dt=0.002, decimation=5)
    sim.robot.joint_pos_target[:] = 1.0e4  # rad: far ahead
    sim.step()
    assert sim.motor_torque[:, 0].tolist() == pytest.approx([8.0, 8.0], rel=1e-3)  # stall, capped by effort_limit
    for _ in range(300):  # 3 s
        sim.step()
        speed = sim.robot.joint_vel[:, 0]
        assert (speed <= 5.0 + 1e-3).all()
    torque = sim.motor_torque[:, 0]
    assert 4.0 < speed[0] < 5.0  # near the speed at zero torque
    # the torque of the last physics step, from the speed at its start (within one step's change)
    assert torque.tolist() == pytest.approx((10.0 * (1 - speed / 5.0)).tolist(), abs=0.05)
    assert torque[0] < 2.0

    implicit = Actuator(joints="spin", stiffness=1000.0, damping=0.0, effort_limit=8.0)
    scene.robot.actuators = {"wheel": implicit}
    pd = NewtonSim(scene, num_envs=1, dt=0.002, decimation=5)
    pd.robot.joint_pos_target[:] = 1.0e4
    for _ in range(301):
        pd.step()
    assert pd.robot.joint_vel[0, 0] == pytest.approx(8.0 / 0.1 * 3.01, rel=0.02)  # 8 N m all along: 241 rad/s
    assert math.isclose(float(pd.robot.joint_stiffness[0, 0]), 1000.0)


@pytest.mark.parametrize("backend", ["c", "warp"])
def test_a_motor_delay_holds_the_old_target_for_its_physics_steps_and_a_reset_forgets_it(tmp_path, backend):
    """delay=5: a new target reaches the motor 5 physics steps late, across control steps of 3
    physics steps (an odd count: the captured graph must end on the history it began with, else
    each control step loses a step of history); a reset world drops its history and acts on the
    target of now."""
    (tmp_path / "flywheel.xml").write_text(FLYWHEEL)
    motor = Actuator(joints="spin", model="dc_motor", stiffness=1000.0, damping=0.0, effort_limit=8.0,
                     saturation_effort=10.0, velocity_limit=5.0, delay=5)
    scene = Scene(robot=Robot(file=str(tmp_path / "flywheel.xml"), actuators={"wheel": motor}), ground=None,
                  contact_sensing=False)
    sim = NewtonSim(scene, num_envs=2, dt=0.002, decimation=3, backend=backend)
    for _ in range(3):
        sim.step()
    assert sim.motor_torque.abs().max() == 0.0  # at rest on target 0
    sim.robot.joint_pos_target[:] = 1.0e4
    sim.step()  # physics steps k..k+2 act on the targets of k-5..k-3: zero
    assert sim.motor_torque.abs().max() == 0.0
    sim.step()  # k+5 acts on k's: the new target, at stall
    assert sim.motor_torque[:, 0].tolist() == pytest.approx([8.0, 8.0], rel=1e-3)
    for _ in range(5):
        sim.step()
    sim.robot.joint_pos_target[:] = 0.0
    sim.reset(torch.tensor([True, False]))
    sim.step()
    torque = sim.motor_torque[:, 0]
    assert torque[0] < -5.0 and torque[1] > 0.0  # world 0 brakes towards 0 now; world 1 still pushes on


@pytest.mark.parametrize("backend", ["c", "c-python", "warp"])
def test_gear_play_is_a_dead_zone_of_the_motor_per_world(tmp_path, backend):
    """backlash=0.2 rad: a target within half the play of the wheel drives nothing, one beyond it
    drives kp times the error less 0.1; world 1, its play set to 0, is driven by the whole error.
    The same on Newton's actuators (warp), in step_worlds.c (c) and in its Python fallback."""
    (tmp_path / "flywheel.xml").write_text(FLYWHEEL)
    motor = Actuator(joints="spin", model="dc_motor", stiffness=100.0, damping=0.0, effort_limit=50.0,
                     saturation_effort=50.0, velocity_limit=1.0e3, backlash=0.2)
    scene = Scene(robot=Robot(file=str(tmp_path / "flywheel.xml"), actuators={"wheel": motor}), ground=None,
                  contact_sensing=False)
    sim = NewtonSim(scene, num_envs=2, dt=0.002, decimation=1, backend=backend.removesuffix("-python"))
    if backend == "c-python":
        sim.solver._loop = None
    assert sim.motor_backlash[:, 0].tolist() == pytest.approx([0.2, 0.2])
    sim.motor_backlash[1] = 0.0
    sim.robot.joint_pos_target[:] = 0.08  # within the play's half
    for _ in range(20):
        sim.step()
    assert sim.motor_torque[0, 0] == 0.0 and sim.robot.joint_pos[0, 0] == 0.0  # no torque: the wheel stays
    assert sim.robot.joint_pos[1, 0] > 0.01  # driven by 100 x 0.08 at first
    sim.robot.joint_pos[:], sim.robot.joint_vel[:] = 0.0, 0.0
    sim.reset(torch.tensor([True, True]))
    sim.robot.joint_pos_target[:] = 0.15
    sim.step()  # one physics step: the torque of the wheel at rest
    assert sim.motor_torque[:, 0].tolist() == pytest.approx([5.0, 15.0], rel=1e-5)
    with pytest.raises(ValueError, match=r"backlash=-0.1: gear play is >= 0 \[rad\] and needs model: dc_motor"):
        scene.robot.actuators = {"wheel": Actuator(joints="spin", backlash=-0.1)}
        NewtonSim(scene, num_envs=1, dt=0.002, decimation=1)


@needs_robots
def test_a_short_training_of_the_panda_moves_its_gripper_to_the_cube(seed, learned):
    """arm_lift on the Panda, 40 iterations of 128 envs: the deterministic policy's 2 s return rises
    above both the untrained policy's and holding the home pose's by more than 0.5. Over training
    seeds 0-19 it rose 0.71-2.00 (mean 1.37, sd 0.29): the bound is 2.9 sd below the mean."""
    before, after = short_training(make_runner("task=arm_lift", "robot=panda", "sim.num_envs=128", f"seed={seed}"), 40)
    learned(return_rise=(after["return"] - before["return"], 0.5))
