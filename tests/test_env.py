"""The env contract (rsl-rl VecEnv) and reward sanity on the quadruped."""

import math

import pytest
import torch

from conftest import SMALL_TERRAIN, make_env
from legion.tasks.sim import SOLVER_LIMITS


def test_vecenv_contract(quadruped_env):
    env = quadruped_env
    obs = env.get_observations()
    assert set(obs.keys()) == {"policy", "critic"}
    assert obs["policy"].shape == (4, 48) and obs["critic"].shape == (4, 49)
    assert env.num_actions == 12 and env.max_episode_length == math.ceil(20.0 / 0.02)
    obs, rewards, dones, extras = env.step(torch.zeros(4, 12))
    for value in (obs["policy"], obs["critic"], rewards):
        assert value.dtype == torch.float32 and value.device.type == "cpu"
    assert rewards.shape == (4,) and dones.shape == (4,) and dones.dtype == torch.bool
    assert extras["time_outs"].shape == (4,) and extras["time_outs"].dtype == torch.bool
    assert all(key.startswith(("Episode_", "Randomization/", "Solver/")) for key in extras["log"])
    solver = [extras["log"][f"Solver/{name}_fraction"] for name in SOLVER_LIMITS]  # on the device, never .item()'d
    assert torch.equal(torch.stack(solver), env.sim.solver_limits / 4)


def test_time_outs_only_on_time_outs():
    env = make_env("task=cartpole", "sim.num_envs=8", "task.episode_length_s=0.2")  # 10 steps
    env.noise_enabled = False
    policy_free_steps = []
    for step in range(1, 31):
        _, _, dones, extras = env.step(torch.zeros(8, 1))
        timed_out = extras["time_outs"]
        assert not (timed_out & env.terminated).any()
        if timed_out.any():
            policy_free_steps.append(step)
            assert dones[timed_out].all()
    # Zero force from near-upright starts keeps every pole up for 10 steps: all time out together.
    assert policy_free_steps == [10, 20, 30]

    env = make_env("task=cartpole", "sim.num_envs=8", "task.episode_length_s=100")
    for _ in range(60):  # a pole pushed hard falls long before the 100 s limit
        _, _, dones, extras = env.step(torch.full((8, 1), 3.0))
        assert not extras["time_outs"].any()
    assert env.extras["log"]["Episode_Termination/pole_fell"] >= 0.0


def test_observation_terms_and_layout(quadruped_env):
    env = quadruped_env
    layout = env.observation_layout()
    names = [t["name"] for t in layout["policy"]]
    assert names[:4] == ["base_lin_vel", "base_ang_vel", "projected_gravity", "velocity_commands"]
    assert sum(t["size"] for t in layout["policy"]) == 48
    env.noise_enabled = False
    obs = env.refresh_observations()["policy"]
    gravity = obs[:, 6:9]
    assert torch.allclose(gravity.norm(dim=1), torch.ones(4), atol=1e-5)
    commands = obs[:, 9:12]
    assert torch.allclose(commands, env.command.value * torch.tensor([2.0, 2.0, 0.25]))  # per-element scale
    env.noise_enabled = True
    joint_vel = next(t for t in layout["policy"] if t["name"] == "joint_vel")
    assert joint_vel["func"] == "joint_vel" and joint_vel["params"]["joints"] == list(range(12))  # resolved once


def test_a_term_in_both_groups_is_computed_once_and_each_group_adds_its_own_noise(quadruped_env):
    """The policy's and the critic's base_lin_vel are one call per step; the policy's noise stays its own."""
    env, calls = quadruped_env, []
    terms = [next(t for t in env.observation_manager.terms[group] if t.name == "base_lin_vel")
             for group in ("policy", "critic")]
    for term in terms:
        term.func = lambda env, func=term.func: calls.append(func) or func(env)
    try:
        obs = env.refresh_observations()
        assert len(calls) == 1
        truth = 2.0 * env.robot.root_lin_vel_b  # the scale of both
        assert torch.equal(obs["critic"][:, :3], truth)
        assert 0.0 < (obs["policy"][:, :3] - truth).abs().max() <= 2.0 * 0.1  # noise 0.1, scaled
        env.noise_enabled = False
        assert torch.equal(env.refresh_observations()["policy"][:, :3], truth)
    finally:
        env.noise_enabled = True
        for term in terms:
            term.func = term.func.__defaults__[0]


def _settle(env, steps=75):
    for _ in range(steps):
        env.step(torch.zeros(env.num_envs, 12))


def test_a_standing_quadruped_earns_more_than_a_fallen_one():
    env = make_env("task=quadruped_flat", "sim.num_envs=2", "~task.terminations.base_contact")
    env.noise_enabled = False
    env.command.hold([0.0, 0.0, 0.0])
    robot = env.robot
    # env 1 has fallen: limp (zero PD gains), dropped on its side.
    robot.joint_stiffness[1] = 0.0
    env.sim.params_changed("joint_stiffness")
    robot.root_pos_w[1, 2] = 0.15
    robot.root_quat_w[1] = torch.tensor([math.sin(math.pi / 4), 0.0, 0.0, math.cos(math.pi / 4)])
    env.sim.reset(torch.tensor([1]))
    _settle(env, 50)
    total = torch.zeros(2)
    for _ in range(25):
        _, rewards, _, _ = env.step(torch.zeros(2, 12))
        total += rewards
    assert robot.root_pos_w[0, 2] > 0.25 and robot.root_pos_w[1, 2] < 0.15
    assert total[0] > total[1] + 0.1


def test_tracking_reward_is_higher_at_the_commanded_velocity(quadruped_env):
    from legion.tasks.mdp import rewards

    env, robot = quadruped_env, quadruped_env.robot
    command = env.command.value.clone()
    env.command.value[:] = torch.tensor([0.8, 0.0, 0.5])
    root_vel = robot.root_vel_w.clone()
    robot.root_quat_w[:] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    robot.root_lin_vel_w[:] = torch.tensor([0.8, 0.0, 0.0])  # moving as commanded
    robot.root_ang_vel_w[:] = torch.tensor([0.0, 0.0, 0.5])
    on_command = rewards.track_lin_vel_xy_exp(env, std=0.5), rewards.track_ang_vel_z_exp(env, std=0.5)
    robot.root_vel_w[:] = 0.0  # standing still
    off_command = rewards.track_lin_vel_xy_exp(env, std=0.5), rewards.track_ang_vel_z_exp(env, std=0.5)
    robot.root_vel_w[:], env.command.value[:] = root_vel, command
    assert torch.allclose(on_command[0], torch.ones(4)) and torch.allclose(on_command[1], torch.ones(4))
    assert (off_command[0] < 0.1).all() and (off_command[1] < 0.4).all()


def test_a_share_of_velocity_commands_stands_still_and_a_share_only_turns():
    env = make_env("task=quadruped_flat", "sim.num_envs=4", "task.command.standing_fraction=0.2",
                   "task.command.turning_fraction=0.3")
    draws = torch.cat([env.command.sample() for _ in range(500)])
    standing = (draws == 0).all(1)
    turning = (draws[:, :2] == 0).all(1) & (draws[:, 2] != 0)
    # 2,000 draws: a share's standard error is 0.01
    assert abs(standing.float().mean() - 0.2) < 0.05 and abs(turning.float().mean() - 0.3) < 0.05
    assert draws[turning, 2].abs().max() > 0.95  # turns up to the range's edge
    assert (draws[~standing & ~turning, :2] != 0).all()
    with pytest.raises(ValueError, match="together at most 1"):
        make_env("task=quadruped_flat", "sim.num_envs=4", "task.command.standing_fraction=0.5",
                 "task.command.turning_fraction=0.6")


PUSHES = "task.events.push.interval_s=[0.02,0.06]"


@pytest.mark.parametrize("task", [
    ("task=quadruped_flat", PUSHES),
    ("task=quadruped_rough", PUSHES, *SMALL_TERRAIN),  # terrain curriculum and height scans too
    ("task=arm_lift",),  # gripper and object terms
], ids=["flat", "rough", "lift"])
def test_the_env_step_reads_nothing_back_to_the_host(monkeypatch, task):
    """On a GPU every read-back (.item(), .nonzero(), bool(tensor), ...) stalls the step until the
    device catches up, and so does a tensor made from Python values (a host-to-device copy). Steps
    with resets, command resampling, pushes and every randomization term on do none of them
    (here, on the CPU, caught by name, the env taking a GPU's path: env.any_world reads nothing)."""
    from conftest import compose

    names = compose(*task).task.events.keys()
    env = make_env(*task, "sim.num_envs=8", "task.episode_length_s=0.1", "task.command.resampling_time_s=0.06",
                   *(f"++task.events.{name}.enabled=true" for name in names))
    env._masks_read_free = False
    env.step(torch.zeros(8, env.num_actions))

    def read_back(*args, **kwargs):
        raise AssertionError("a host read-back (or a host-to-device copy) in the env step")

    for name in ("item", "tolist", "nonzero", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, read_back)
    for name in ("tensor", "as_tensor"):
        monkeypatch.setattr(torch, name, read_back)
    resets = torch.zeros(8, dtype=torch.long)
    for _ in range(12):  # episodes of 5 steps: every world resets twice, commands and pushes fire
        _, _, dones, _ = env.step(torch.randn(8, env.num_actions) * 0.3)
        resets += dones
    monkeypatch.undo()
    assert (resets >= 2).all()


def test_the_work_a_cpu_skips_is_work_for_no_world():
    """On a CPU the step reads its masks (env.any_world) and skips the reset, the command draw and
    the zeroing of diverged worlds when no world needs them; on a GPU that work runs by mask for
    every world. While nothing starts, the two paths step alike, bit for bit."""
    envs = [make_env("task=arm_reach", "sim.num_envs=4") for _ in range(2)]
    envs[1]._masks_read_free = False  # a GPU's path
    for env in envs:
        env.noise_enabled = False  # (the skipped draws advance the generator that noise draws from)
        env.reset()
    actions = torch.randn(30, 4, envs[0].num_actions, generator=torch.Generator().manual_seed(0)) * 0.5
    steps = [[env.step(a) for a in actions] for env in envs]
    for (obs, rewards, dones, _), (gpu_obs, gpu_rewards, gpu_dones, _) in zip(*steps):
        assert torch.equal(obs["policy"], gpu_obs["policy"]) and torch.equal(rewards, gpu_rewards)
        assert not dones.any() and not gpu_dones.any()
    cpu, gpu = envs
    assert cpu.sim.body_q.equal(gpu.sim.body_q) and cpu.command.value.equal(gpu.command.value)
    assert cpu.success.held.equal(gpu.success.held)


@pytest.mark.bit_exact
@pytest.mark.parametrize("breakage", [float("nan"), 2.0e4])
def test_a_world_whose_physics_diverges_is_reset_and_counted_and_the_others_go_on_bit_for_bit(breakage):
    """World 2's physics breaks: NaN, or a finite but absurd speed (2e4 rad/s: after the control
    step its joints spin at ~3e14 rad/s, still finite, on their way to NaN). It is ended and
    restarted before its numbers reach rewards or observations."""
    env, twin = (make_env("task=quadruped_flat", "sim.num_envs=4") for _ in range(2))
    for _ in range(3):
        for e in (env, twin):
            e.step(torch.zeros(4, 12))
    env.robot.joint_vel[2, 0] = breakage
    _, rewards, dones, extras = env.step(torch.zeros(4, 12))
    twin.step(torch.zeros(4, 12))
    assert dones.tolist() == [False, False, True, False] and env.episode_length_buf[2] == 0
    assert extras["log"]["Episode_Termination/nonfinite"] == 0.25
    assert torch.isfinite(env.sim.joint_q).all() and torch.isfinite(rewards).all()
    assert rewards.abs().max() < 10.0 and env.get_observations()["policy"].abs().max() < 100.0
    assert torch.allclose(env.robot.root_pos_w[2], env.robot.default_root_pose[2, :3], atol=0.02)  # restarted
    others = [0, 1, 3]
    assert torch.equal(env.sim.joint_q[others], twin.sim.joint_q[others])
    assert torch.equal(env.sim.joint_qd[others], twin.sim.joint_qd[others])


def test_unknown_terms_are_named_with_the_alternatives():
    with pytest.raises(ValueError, match="Unknown rewards term 'flyy'.*track_lin_vel_xy_exp"):
        make_env("task=cartpole", "sim.num_envs=2", "+task.rewards.flyy={weight: 1.0}")


@pytest.mark.parametrize("task", ["cartpole", "quadruped_flat", "quadruped_rough", "biped_flat", "arm_reach",
                                  "arm_lift"])
def test_an_env_stepped_in_inference_mode_resets_and_steps_outside_it(task):
    """Rollouts step in inference mode, evaluation and user code may not: state that a step
    replaced instead of updating in place became an inference tensor, and the next step or reset
    outside the mode failed ("Inplace update to inference tensor outside InferenceMode")."""
    env = make_env(f"task={task}", "sim.num_envs=2", *(SMALL_TERRAIN if task == "quadruped_rough" else ()))
    with torch.inference_mode():
        for _ in range(3):
            env.step(torch.zeros(2, env.num_actions))
    env.step(torch.zeros(2, env.num_actions))  # the episode goes on outside the mode
    env.reset()
    obs, rewards, dones, _ = env.step(torch.zeros(2, env.num_actions))
    assert torch.isfinite(obs["policy"]).all() and torch.isfinite(rewards).all() and not dones.any()


# What a step returns or recomputes from scratch every time: outputs, not state carried over.
STEP_OUTPUTS = {"time_outs", "terminated", "_observations", "extras", "reward_values"}


def carried_state(env) -> dict[str, object]:
    """Everything the env and its parts (action, command, events, success, contacts, terrain
    levels, term buffers, the sim's views) hold between steps, by attribute path: for a tensor its
    storage address, for a Python number its value."""
    found, seen = {}, set()

    def visit(obj, path):
        if id(obj) in seen:
            return
        if isinstance(obj, torch.Tensor):
            found[path] = ("tensor", obj.data_ptr(), tuple(obj.shape))
        elif isinstance(obj, (bool, int, float)):
            found[path] = obj
        elif isinstance(obj, dict):
            seen.add(id(obj))
            for key, value in obj.items():
                visit(value, f"{path}[{key!r}]")
        elif isinstance(obj, (list, tuple)):
            seen.add(id(obj))
            for i, value in enumerate(obj):
                visit(value, f"{path}[{i}]")
        elif type(obj).__module__.startswith("legion."):
            seen.add(id(obj))
            for key, value in vars(obj).items():
                # (a _cache holds values computed from the state, recomputed when it changes: not carried)
                if not (obj is env and key in STEP_OUTPUTS) and key != "_cache":
                    visit(value, f"{path}.{key}")

    visit(env, "env")
    return found


@pytest.mark.parametrize("task", [
    ("task=quadruped_rough", PUSHES, *SMALL_TERRAIN),  # terrain curriculum, pushes, every event term
    ("task=arm_lift",),  # success tracker, position commands, object events
], ids=["rough", "lift"])
def test_the_env_step_keeps_its_state_in_place_as_a_captured_graph_needs(task):
    """``sim.capture_step`` records one control step as a CUDA graph and replays it: a replay
    writes to the memory the capture saw and repeats its Python-side values. So a step may carry
    nothing over in a tensor it replaced (the replay would read the old one) nor in a Python
    number it changed (the replay would repeat the captured one). Over steps with resets, command
    resampling, pushes, action delays and every randomization term on, every carried tensor keeps
    its storage and every carried number its value (the env taking a GPU's path: work by mask for
    every world, as env.any_world has it there)."""
    from conftest import compose

    names = compose(*task).task.events.keys()
    env = make_env(*task, "sim.num_envs=8", "task.episode_length_s=0.1", "task.command.resampling_time_s=0.06",
                   *(f"++task.events.{name}.enabled=true" for name in names))
    env._masks_read_free = False
    env.step(torch.zeros(8, env.num_actions))
    before = carried_state(env)
    resets = torch.zeros(8, dtype=torch.long)
    for _ in range(13):  # not a multiple of the action-delay ring's 3 slots
        _, _, dones, _ = env.step(torch.randn(8, env.num_actions) * 0.3)
        resets += dones
    after = carried_state(env)
    assert (resets >= 2).all()
    changed = {path: (before.get(path), value) for path, value in after.items() if before.get(path) != value}
    assert not changed, f"state replaced or changed on the host by a step: {changed}"


def test_capturing_the_step_needs_cuda_and_the_error_says_what_to_do():
    with pytest.raises(ValueError, match=r"sim.capture_step=true records the control step as a CUDA graph; "
                                         r"device is 'cpu'. Use device=cuda:N, or sim.capture_step=false"):
        make_env("task=cartpole", "sim.num_envs=2", "sim.capture_step=true")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("task", [
    ("task=quadruped_rough", PUSHES, *SMALL_TERRAIN),
    ("task=arm_lift",),
    ("task=arm_lift_ik",),
], ids=["rough", "lift", "lift_ik"])
def test_a_captured_step_gives_the_eager_steps_observations_rewards_and_dones(task):
    """The replayed graph against the eager step on the same seed and actions, over resets,
    command resampling and pushes, after a full reset between two replays, then with noise off
    (a new capture). MuJoCo Warp on CUDA is not bit for bit: its atomics gather contacts and sum
    forces in any order, so two eager envs of one seed already drift apart on many contacts
    (rough terrain). The captured env is held to that drift, measured here by an eager twin,
    plus the tolerance a single reordered sum needs."""
    overrides = (*task, "device=cuda:0", "sim.num_envs=64", "task.episode_length_s=0.3",
                 "task.command.resampling_time_s=0.2")
    eager, twin, captured = make_env(*overrides), make_env(*overrides), make_env(*overrides, "sim.capture_step=true")
    actions = torch.randn(60, 64, eager.num_actions, generator=torch.Generator().manual_seed(0)).cuda() * 0.3
    resets, drift, gap = 0, {}, {}  # drift: eager vs twin; gap: eager vs captured (running maxima)
    for i in range(60):
        if i == 30:
            for env in (eager, twin, captured):
                env.reset()
        if i == 45:
            eager.noise_enabled = twin.noise_enabled = captured.noise_enabled = False
        (obs_e, rew_e, done_e, extras_e), (obs_t, rew_t, done_t, _), (obs_c, rew_c, done_c, extras_c) = (
            env.step(actions[i]) for env in (eager, twin, captured))
        for name, (twin_value, captured_value, value) in {
                **{group: (obs_t[group], obs_c[group], obs_e[group]) for group in obs_e.keys()},
                "reward": (rew_t, rew_c, rew_e), "dones": (done_t.sum(), done_c.sum(), done_e.sum())}.items():
            drift[name] = max(drift.get(name, 0.0), float((value.float() - twin_value.float()).abs().max()))
            gap[name] = max(gap.get(name, 0.0), float((value.float() - captured_value.float()).abs().max()))
        resets += int(done_e.sum())
        if drift["dones"] == 0:  # the same episodes so far: the bookkeeping must match exactly
            assert torch.equal(done_e, done_c) and torch.equal(extras_e["time_outs"], extras_c["time_outs"]), i
            assert extras_e["episodes"]["count"] == extras_c["episodes"]["count"], i
    print(f"\n{task[0]}: max |eager - eager twin| {drift}\n{' ' * len(task[0])}  max |eager - captured| {gap}")
    for name in drift:
        assert gap[name] <= 2 * drift[name] + 1e-4, (name, gap[name], drift[name])
    assert captured.captured.graph is not None and resets >= 64
