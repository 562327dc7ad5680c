"""The locomotion tasks beyond flat quadrupeds: each builds, steps, exports and runs in the edge
runtime; the biped model stands where its geometry says and its task ends a fall."""

import math

import pytest
import torch

from conftest import SMALL_TERRAIN, export_untrained_run, lockstep_errors, make_env
from legion.sim2real.deploy.contract import PolicyContract

TASKS = {"quadruped_rough": ("task=quadruped_rough", *SMALL_TERRAIN), "biped_flat": ("task=biped_flat",),
         "quadruped_flat_deployable": ("task=quadruped_flat_deployable",)}


@pytest.fixture(scope="module", params=list(TASKS))
def exported(request, tmp_path_factory):
    """A run folder of the task (4 envs) with a non-trivial normalizer, exported."""
    return {"task": request.param,
            **export_untrained_run(tmp_path_factory.mktemp(request.param), *TASKS[request.param], action_std=0.3)}


def robot_state(env, i: int, metadata: PolicyContract) -> dict:
    """What world ``i``'s sensors, state estimator and (if the policy scans) elevation map report."""
    robot = env.robot
    state = {
        "joint_pos": robot.joint_pos[i].numpy().copy(), "joint_vel": robot.joint_vel[i].numpy().copy(),
        "base_quat": robot.root_quat_w[i].numpy().copy(), "base_pos": robot.root_pos_w[i].numpy().copy(),
        "base_lin_vel": robot.root_link_lin_vel_b[i].numpy(), "base_ang_vel": robot.root_ang_vel_b[i].numpy(),
        "timestamp": 0.0,
    }
    if metadata.height_scan is not None:  # the terrain around the robot at the exported points, relative to the base
        x, y, z, w = state["base_quat"]
        yaw = math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        points = torch.tensor(metadata.height_scan.points)
        c, s = math.cos(yaw), math.sin(yaw)
        world = robot.root_pos_w[i, :2] + torch.stack([c * points[:, 0] - s * points[:, 1],
                                                        s * points[:, 0] + c * points[:, 1]], dim=1)
        state["height_scan"] = (env.sim.ground_height(world) - robot.root_pos_w[i, 2]).numpy()
    return state


def test_each_task_builds_steps_exports_and_runs_in_the_edge_runtime(exported):
    """The ONNX policy through the numpy runtime, in lock-step with world 0: same observation
    (height scan included), same action, same joint targets."""
    from legion.sim2real.deploy import PolicyRunner

    env, actor = exported["env"], exported["actor"]
    assert exported["report"]["policy.onnx"]["max_abs_diff"] <= 1e-5
    runtime = PolicyRunner(exported["out"] / "policy.onnx")
    meta = runtime.metadata
    scans = exported["task"] == "quadruped_rough"
    assert (meta.height_scan is not None) == scans
    if meta.height_scan is not None:
        assert len(meta.height_scan.points) == 17 * 11 and meta.height_scan.offset == 0.5
        assert meta.observation.size == 48 + 187
    if exported["task"] == "quadruped_flat_deployable":  # what a robot measures; the critic keeps the rest
        assert "base_lin_vel" not in runtime.state_keys and meta.observation.size == 48 - 3
        assert "base_lin_vel" in [t.name for t in env.observation_manager.terms["critic"]]
        assert exported["cfg"].task.events["action_delay"].enabled
    errors = lockstep_errors(env, actor, runtime, lambda env: robot_state(env, 0, meta), steps=10)
    assert max(errors.values()) <= 1e-5, errors
    if scans:
        state = robot_state(env, 0, meta)
        state["height_scan"] = state["height_scan"][:10]
        with pytest.raises(ValueError, match=r"'height_scan' has shape \(10,\).*expects shape \(187,\) numbers, "
                                             r"one per point in the order of policy.json's height_scan.points"):
            runtime.act(state)
        del state["height_scan"]
        with pytest.raises(ValueError, match="robot state lacks \\['height_scan'\\]"):
            runtime.act(state)


def test_a_stiff_biped_stands_at_its_default_height_on_its_feet_and_a_limp_one_falls_onto_its_torso():
    """Its geometry and its task: held by stiff joints (8x the PD gains) the biped (31.9 kg) stands
    with its soles on the ground, pelvis at 0.7248 m, its weight on its two feet, and earns more
    reward than a limp one, which collapses until its torso or pelvis touches and ends its episode."""
    env = make_env("task=biped_flat", "sim.num_envs=2", "~task.events.root_vel", "~task.events.push",
                   "~task.events.added_base_mass", "~task.events.root_yaw")
    env.noise_enabled = False
    env.command.hold([0.0, 0.0, 0.0])
    robot = env.robot
    assert len(robot.joint_names) == 12 and robot.body_mass[0].sum() == pytest.approx(31.888, abs=1e-3)
    robot.joint_stiffness[0] *= 8.0
    robot.joint_damping[0] *= 4.0
    robot.joint_stiffness[1] = 0.0
    env.sim.params_changed("joint_stiffness", "joint_damping")
    rewards, fell_at = torch.zeros(2), None
    for step in range(150):  # 3 s
        _, reward, dones, extras = env.step(torch.zeros(2, 12))
        assert not dones[0]
        if fell_at is None:
            rewards += reward
            if dones[1]:
                fell_at = step
                assert extras["log"]["Episode_Termination/torso_contact"] == 0.5
    assert fell_at is not None and fell_at < 100
    assert rewards[0] > rewards[1] + 1.0  # the fall's termination penalty alone is 200 x 0.02
    assert robot.root_pos_w[0, 2] == pytest.approx(0.7248, abs=0.005)
    force = robot.contact_forces_w[0].norm(dim=-1)
    feet = robot.find_bodies(".*_ankle_roll_link")
    others = [b for b in range(robot.num_bodies) if b not in feet]
    assert force[others].max() == 0.0 and (force[feet] > 100.0).all()
    assert force[feet].sum() == pytest.approx(31.888 * 9.81, rel=0.02)
