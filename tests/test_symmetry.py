"""Left-right symmetry (robot.mirror, agent.symmetry; legion/tasks/symmetry.py): a robot started in
the mirror image of another's state and driven by the mirror images of its actions moves as its
mirror image in the simulator, and its observations are the mirror images the maps compute; a
wrong map fails that; PPO trains with rsl-rl's symmetry extension on the maps."""

import pytest
import torch

from conftest import make_env, make_runner
from legion.tasks.mdp.observations import scan_points
from legion.tasks.symmetry import TERM_RULES, Mirror, MirrorError, joint_map, mirror_root

# Two identical worlds: no randomization that would make them differ, no observation noise.
STILL = ("sim.num_envs=2", "~task.events.friction", "~task.events.added_base_mass", "~task.events.push")


def mirrored_run(env, joint_perm, joint_sign, steps: int = 25, seed: int = 0) -> dict:
    """World 1 starts as the mirror image of world 0 under the joint map (``joint_perm``,
    ``joint_sign``) and the root's (:func:`mirror_root`), with the mirror image of world 0's command,
    and each step gets the mirror image of world 0's random action. Returns the largest
    differences of world 1 from the mirror image of world 0 over the steps: root position [m],
    joint positions [rad] and policy observations (mirrored by ``env.mirror``); ``moved``: how far
    world 0's root went [m] (so the comparison is of a real motion)."""
    g = torch.Generator().manual_seed(seed)
    robot, mirror = env.robot, env.mirror
    assert torch.equal(torch.as_tensor(env.action.joint_ids), torch.arange(len(joint_perm)))  # actions: all joints
    env.noise_enabled = False
    env.reset()
    with torch.inference_mode():
        q = robot.default_joint_pos[0] + 0.15 * torch.randn(len(joint_perm), generator=g)
        robot.joint_pos[:] = torch.stack([q, q[joint_perm] * joint_sign])
        qd = 0.5 * torch.randn(len(joint_perm), generator=g)
        robot.joint_vel[:] = torch.stack([qd, qd[joint_perm] * joint_sign])
        yaw = 0.4
        pose = torch.tensor([0.05, 0.1, float(robot.default_root_pose[0, 2]) + 0.02, 0.0, 0.0, yaw / 2, 1.0])
        pose[3:] /= pose[3:].norm()
        vel = 0.3 * torch.randn(6, generator=g)
        robot.root_pose_w[:] = torch.stack([pose, mirror_root(pose, vel)[0]])
        robot.root_vel_w[:] = torch.stack([vel, mirror_root(pose, vel)[1]])
        env.sim.reset(torch.ones(2, dtype=torch.bool))
        command = env.command.value[0].clone()
        env.command.hold(torch.stack([command, command * torch.tensor([1.0, -1.0, -1.0])]))
        obs = env.refresh_observations()
        start = robot.root_pos_w[0].clone()
        worst = {"root": 0.0, "joints": 0.0, "obs": 0.0}
        for _ in range(steps):
            action = 0.5 * torch.randn(len(joint_perm), generator=g)
            obs, _, dones, _ = env.step(torch.stack([action, action[joint_perm] * joint_sign]))
            assert not dones.any(), "an episode ended: the comparison needs one episode per world"
            root_mirror = mirror_root(robot.root_pose_w[0], robot.root_vel_w[0])[0]
            worst["root"] = max(worst["root"], float((robot.root_pos_w[1] - root_mirror[:3]).abs().max()))
            joints_mirror = robot.joint_pos[0][joint_perm] * joint_sign
            worst["joints"] = max(worst["joints"], float((robot.joint_pos[1] - joints_mirror).abs().max()))
            mirrored = mirror.observations(obs[0:1])["policy"][0]
            worst["obs"] = max(worst["obs"], float((obs["policy"][1] - mirrored).abs().max()))
        worst["moved"] = float((robot.root_pos_w[0] - start).norm())
    return worst


@pytest.mark.parametrize("task, robot, steps, tolerance", [
    ("quadruped_flat", "quadruped", 25, 1e-5),  # the authored models are exact mirror images
    ("biped_flat", "biped", 25, 1e-5),
    # The makers' models are mirror images to about 1e-4 (meshes, inertias); contacts then amplify
    # it (the G1's joints: 8e-5 rad after 10 steps, 0.01 after 25; wrong maps: 0.2-1.5 rad).
    ("quadruped_flat", "go2", 10, 1e-3),
    ("biped_flat", "g1", 10, 1e-3),
])
def test_a_mirrored_start_driven_by_mirrored_actions_moves_as_the_mirror_image(task, robot, steps, tolerance):
    env = make_env(f"task={task}", f"robot={robot}", *STILL)
    mirror = env.mirror
    run = mirrored_run(env, mirror.joint_perm, mirror.joint_sign, steps=steps)
    print(robot, run)
    assert run["moved"] > 0.02  # the robots moved (and fell about): not a comparison of two still poses
    assert run["root"] < tolerance and run["joints"] < tolerance and run["obs"] < 10 * tolerance, run


def test_a_wrong_mirror_map_fails_the_mirrored_trajectory():
    """Front and rear legs swapped (a map that is its own inverse but not the robot's mirror): the
    mirrored start then diverges from the mirror image."""
    env = make_env("task=quadruped_flat", *STILL)
    names = list(env.robot.joint_names)
    perm, sign = joint_map(names, {"FL_": "RR_", "FR_": "RL_"}, ".*_hip_joint")
    run = mirrored_run(env, perm, sign)
    print(run)
    assert run["root"] > 1e-2 or run["joints"] > 0.1, run


def test_the_height_scan_mirror_takes_each_point_to_its_mirror_point():
    perm, sign = TERM_RULES["height_scan"](None, {"params": {"size": [1.6, 1.0]}})
    points = scan_points((1.6, 1.0), 0.1)
    assert torch.allclose(points[perm], points * torch.tensor([1.0, -1.0]), atol=1e-6) and torch.all(sign == 1)
    assert not torch.equal(perm, torch.arange(len(points)))


def test_mirror_maps_that_cannot_be_right_are_refused_by_name():
    names = ["FL_hip_joint", "FR_hip_joint", "RL_hip_joint"]
    with pytest.raises(MirrorError, match="maps joint RL_hip_joint to RR_hip_joint, which the robot does not have"):
        joint_map(names, {"FL_": "FR_", "RL_": "RR_"}, ".*_hip_joint")
    with pytest.raises(MirrorError, match="negate matches one of FL_hip_joint and FR_hip_joint, not both"):
        joint_map(names[:2], {"FL_": "FR_"}, "FL_hip_joint")
    env = make_env("task=quadruped_flat", "sim.num_envs=1")
    env.robot.default_joint_pos[:, 0] += 0.2  # FL_hip_joint
    with pytest.raises(MirrorError, match=r"the default pose is not its own mirror at joints \['FL_hip_joint', "
                                          r"'FR_hip_joint'\]"):
        Mirror(env)
    with pytest.raises(MirrorError, match="declares no mirror map"):
        Mirror(make_env("task=arm_reach", "sim.num_envs=1"))


def test_ppo_with_the_mirror_loss_makes_the_policy_its_own_mirror_image(seed, learned):
    """10 iterations of 16 envs: the mirror loss the update minimizes falls, and so does the policy's
    asymmetry on the envs' observations. Over training seeds 0-19 the loss fell by 0.0004-0.0029 of
    about 0.003 (mean 0.0017, sd 0.0007) and the asymmetry by 9-93% (mean 73%, sd 18%; one seed
    started nearly symmetric, 0.0020 -> 0.0019): both bounds are 0, 2.5 and 4.0 sd below the means."""
    runner = make_runner("task=quadruped_flat", "sim.num_envs=16", "agent.num_steps_per_env=8", f"seed={seed}",
                         "agent.symmetry.augmentation=true", "agent.symmetry.mirror_loss=true",
                         "agent.symmetry.mirror_loss_coeff=10")
    env, policy = runner.env, runner.ppo.get_policy()

    def asymmetry() -> float:  # mean |pi(mirror(o)) - mirror(pi(o))|^2 on the current observations
        with torch.inference_mode():
            obs = env.get_observations()
            return float((policy(env.mirror.observations(obs)) - env.mirror.actions(policy(obs))).pow(2).mean())

    losses, update = [], runner.ppo.update
    runner.ppo.update = lambda: losses.append(update()) or losses[-1]
    before = asymmetry()
    runner.learn(10)
    after = asymmetry()
    print(f"asymmetry {before:.4f} -> {after:.4f}, mirror loss {[round(x['symmetry'], 4) for x in losses]}")
    learned(asymmetry_cut=(1 - after / before, 0.0),
            mirror_loss_drop=(losses[0]["symmetry"] - losses[-1]["symmetry"], 0.0))
