"""One definition of what a policy sees, from the training env to the robot.

The edge runtime (``legion.sim2real.deploy.policy``) builds the observation again in numpy from a
robot state dict, by the training terms' function names. For every task (``configs/task``), from
the sim's own state after steps that move the robot (randomization as configured, observation
noise off), the runtime's observation equals the env's for every term of every observation group
(the exported policy group and the critic's, as if a policy read it), to 1e-5.
"""

import inspect

import numpy as np
import pytest
import torch

from conftest import SMALL_TERRAIN, export_untrained_run
from legion.configs import task_names
from legion.sim2real.deploy.contract import Observation, ObservationTerm, PolicyContract
from legion.sim2real.deploy.policy import (
    IMAGE_TERMS,
    OBSERVATION_TERMS,
    ObservationTerms,
    OnnxPolicy,
    PolicyLoadError,
    quat_rotate_inverse,
)
from legion.sim2real.trajectories.record import state_views
from legion.tasks.mdp import observations
from legion.tasks.mdp.observations import scan_points

OVERRIDES = {"quadruped_rough": SMALL_TERRAIN}  # a small terrain: cheap to build, every terrain type
TOLERANCE = 1e-5
STEPS = 6
ACTION_STD = 2.0  # moves every joint, tips bases over now and then (resets included), passes cartpole's clip


@pytest.fixture(scope="module", params=task_names())
def exported(request, tmp_path_factory):
    """The task (4 envs, noise off) with an untrained policy exported by ``legion export``'s code."""
    task = request.param
    return {"task": task,
            **export_untrained_run(tmp_path_factory.mktemp(task), f"task={task}", *OVERRIDES.get(task, ()))}


def robot_states(env, metadata: PolicyContract) -> list[dict]:
    """What each world's robot reports, in the edge runtime's state dict (``legion.sim2real.deploy.policy``):
    from the sim's world-frame generalized coordinates (the state trajectory recording names), turned
    into the robot's frames here, in numpy: joints, IMU orientation and base-frame velocities and the
    base's height above the ground under it (floating bases); what perception reports where the
    policy needs it: the elevation map at the exported height-scan points (else a critic's), the object's position in
    the base frame (a scene with one free object)."""
    views = {key: value.numpy() for key, value in state_views(env).items()}
    robot = env.robot
    states = [{"joint_pos": views["robot/joint_pos"][i], "joint_vel": views["robot/joint_vel"][i], "timestamp": 0.0}
              for i in range(env.num_envs)]
    if robot.floating_base:
        pose = views["robot/root_pose_w"]
    else:  # the base is the first body, fixed in the world
        pose = torch.cat([robot.body_pos_w[:, 0], robot.body_quat_w[:, 0]], dim=-1).numpy()
    position, quat = pose[:, :3], pose[:, 3:7]
    if robot.floating_base:
        velocity = views["robot/root_vel_w"]  # the base's centre of mass's (Newton's free joint)
        com = robot.body_com[:, 0].numpy()  # the centre of mass in the base frame
        height = position[:, 2] - env.sim.ground_height(torch.from_numpy(position[:, :2])).numpy()
        for i, state in enumerate(states):
            ang_vel = quat_rotate_inverse(quat[i], velocity[i, 3:])
            state.update(base_quat=quat[i], base_pos=np.array([*position[i, :2], height[i]], np.float32),
                         # an estimator's: the base frame origin's velocity
                         base_lin_vel=quat_rotate_inverse(quat[i], velocity[i, :3]) - np.cross(ang_vel, com[i]),
                         base_ang_vel=ang_vel)
    scans = [scan_points(tuple(t["params"]["size"]), float(t["params"]["resolution"]))
             for terms in env.observation_layout().values() for t in terms if t["func"] == "height_scan"]
    if metadata.height_scan is not None or scans:  # terrain heights at the points (the policy's, else a
        x, y, z, w = quat.T                        # critic's), turned with the base's yaw, minus the base's
        yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        c, s = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
        points = np.asarray(metadata.height_scan.points if metadata.height_scan is not None else scans[0], np.float32)
        px, py = points[:, 0], points[:, 1]
        world = np.stack([position[:, 0:1] + c * px - s * py, position[:, 1:2] + s * px + c * py], axis=-1)
        scan = env.sim.ground_height(torch.from_numpy(world.astype(np.float32))).numpy() - position[:, 2:3]
        for i, state in enumerate(states):
            state["height_scan"] = scan[i]
    objects = [name for name, entity in env.scene.items() if entity.kind == "object"]
    if len(objects) == 1:  # what a camera calibrated to the robot reports
        relative = views[f"{objects[0]}/root_pose_w"][:, :3] - position
        for i, state in enumerate(states):
            state["object_pos"] = quat_rotate_inverse(quat[i], relative[i])
    for name in metadata.cameras:  # what the camera's driver reports (depth: 0 for no return)
        depth = env.sim.cameras.depth(name).numpy()
        for i, state in enumerate(states):
            state[f"{name}/depth"] = depth[i]
    return states


def test_every_observation_term_of_the_training_package_has_an_edge_version():
    terms = {name for name, func in vars(observations).items()
             if inspect.isfunction(func) and func.__module__ == observations.__name__
             and next(iter(inspect.signature(func).parameters), None) == "env"}
    edge = set(OBSERVATION_TERMS) | set(IMAGE_TERMS)  # (images: tests/test_cameras.py holds them to training's)
    assert terms and not terms - edge - set(observations.SIMULATOR_ONLY), \
        f"no edge-runtime version of {sorted(terms - edge)}: add them to OBSERVATION_TERMS (images: IMAGE_TERMS)"


def test_a_policy_with_a_term_the_runtime_lacks_is_refused_at_load_naming_it():
    observation = Observation(groups=["policy"], size=2, terms=[ObservationTerm(
        name="accel", func="joint_acc", group="policy", start=0, size=2, scale=1.0, clip=None, params={})], images=[])
    with pytest.raises(PolicyLoadError, match=r"policy.onnx: observation term 'accel' \(function joint_acc\) has no "
                                              r"edge-runtime version; known: \[.*\]. Add it to .* OBSERVATION_TERMS"):
        ObservationTerms(observation, ["a", "b"], [0.0, 0.0], where="policy.onnx")


def test_the_edge_runtime_observes_what_the_env_observes_term_by_term(exported):
    env, task = exported["env"], exported["task"]
    metadata = OnnxPolicy(exported["out"] / "policy.onnx").metadata  # what the robot loads (any action type)
    # Every task's policy.json is a contract this runtime reads, the one embedded in the ONNX file.
    assert PolicyContract.load(exported["out"] / "policy.json").embedded() == metadata.embedded()
    assert not env.noise_enabled
    # The exported policy's groups as the robot reads them; every other group as if a policy read it.
    layouts = {"+".join(metadata.observation.groups): metadata.observation}
    images = {image.group for image in metadata.observation.images}  # compared as images, below
    for group, terms in env.observation_layout().items():
        if group not in metadata.observation.groups and group not in images:
            layouts[group] = Observation(groups=[group], size=sum(t["size"] for t in terms), terms=[
                ObservationTerm(**{**t, "group": group}) for t in terms], images=[])
    runtimes = {name: ObservationTerms.of(metadata, observation=layout) for name, layout in layouts.items()}
    clip = metadata.action.clip
    generator = torch.Generator().manual_seed(0)
    errors, largest, clipped = {}, {}, False
    with torch.inference_mode():
        for step in range(STEPS):
            actions = ACTION_STD * torch.randn(env.num_envs, env.num_actions, generator=generator)
            obs, _, dones, _ = env.step(actions)
            clipped |= bool(clip and (actions.abs() > clip).any())
            # The runtime's previous action: as it left the policy (after the action clip), zero after a reset.
            last_action = np.where(dones.numpy()[:, None], 0.0, np.clip(actions.numpy(), -clip, clip) if clip
                                   else actions.numpy()).astype(np.float32)
            commands = env.command.value.numpy() if env.command is not None else [None] * env.num_envs
            for i, state in enumerate(robot_states(env, metadata)):
                for group, image in runtimes["+".join(metadata.observation.groups)].images(state).items():
                    key = (group, "image", "depth_image")
                    difference = np.abs(image - obs[group][i].numpy())
                    largest[key] = max(largest.get(key, 0.0), float(np.abs(image).max()))
                    if not difference.max() <= TOLERANCE:
                        errors[key] = f"{task}: image group {group}: |runtime - env| {difference.max():.3g}"
                for name, runtime in runtimes.items():
                    got = runtime.observation(state, commands[i], last_action[i])
                    expected = torch.cat([obs[g][i] for g in layouts[name].groups]).numpy()
                    start = 0
                    for term in layouts[name].terms:
                        key = (name, term.name, term.func)
                        part = slice(start, start + term.size)
                        start += term.size
                        difference = np.abs(got[part] - expected[part])
                        largest[key] = max(largest.get(key, 0.0), float(np.abs(expected[part]).max()))
                        if not difference.max() <= TOLERANCE and key not in errors:  # (NaN fails too)
                            k = int(np.nanargmax(difference)) if not np.isnan(difference).all() else 0
                            errors[key] = (f"{task}: group {name} term '{term.name}' ({term.func}): |runtime - "
                                           f"env| {difference[k]:.3g} > {TOLERANCE:g} at step {step}, world {i}, "
                                           f"element {k} of {term.size}: runtime {got[part][k]:.6g}, "
                                           f"env {expected[part][k]:.6g}")
    assert not errors, "\n".join(errors.values())
    assert clipped or not clip, "no action exceeded the action clip: the clipped last_action went untested"
    # Every term moved away from zero somewhere: the comparison covered real values.
    assert all(v > 1e-3 for v in largest.values()), {k: v for k, v in largest.items() if v <= 1e-3}
