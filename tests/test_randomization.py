"""Domain randomization takes physical effect, per env: friction, mass, gains, latency, pushes,
restitution; draws stay in range and follow the seed; nothing goes NaN at the range edges."""

import re
import warnings

import pytest
import torch

from conftest import compose, make_env
from legion.configs.schema import Robot, Scene
from legion.tasks.sim import NewtonSim

QUAD = "task=quadruped_flat"
ZERO = torch.zeros(2, 12)


def only(events: str, *overrides: str, num_envs: int = 2):
    """A quadruped env whose only event terms are ``events`` (a YAML mapping), no base-contact
    termination (robots may lie on the ground) and, by default, a 2-world sim."""
    drop = [f"~task.events.{name}" for name in compose(QUAD).task.events]
    return make_env(QUAD, f"sim.num_envs={num_envs}", "~task.terminations.base_contact", *drop,
                    f"++task.events={events}", *overrides)


def place(env, root_pose: torch.Tensor) -> None:
    """Every robot at ``root_pose`` (num_envs, 7), in the default pose, at rest."""
    robot = env.robot
    robot.root_pose_w[:] = root_pose
    robot.root_vel_w[:] = 0.0
    robot.joint_pos[:] = robot.default_joint_pos
    robot.joint_vel[:] = 0.0
    env.sim.reset(torch.arange(env.num_envs))


def set_per_env(env, name: str, values: list[float]) -> None:
    """Env i gets exactly values[i] from term ``name`` (through the term, as training applies it)."""
    term = env.events.terms[name]
    for i, value in enumerate(values):
        term.set_range(value, value)
        term.apply(torch.arange(env.num_envs) == i)


def all_terms_on(*overrides: str) -> list[str]:
    names = compose(QUAD, *overrides).task.events.keys()
    return [*overrides, *(f"++task.events.{name}.enabled=true" for name in names)]


@pytest.mark.parametrize("backend", ["c", "warp"])
def test_friction_drawn_per_env_is_the_friction_in_effect(backend):
    # The ground keeps its own friction 1.0: under MuJoCo's max rule both robots would slide
    # as if on 1.0. The robots lie on their backs (base box on the ground) and slide at 1 m/s.
    env = only("{friction: {mode: startup, range: [0.2, 1.2]}}", "task.scene.ground.friction=1.0",
               f"sim.backend={backend}")
    set_per_env(env, "friction", [0.2, 1.2])
    assert env.robot.shape_friction[:, 0].tolist() == pytest.approx([0.2, 1.2])
    pose = env.robot.default_root_pose.clone()
    pose[:, 2], pose[:, 3:] = 0.06, torch.tensor([1.0, 0.0, 0.0, 0.0])  # upside down
    place(env, pose)
    for _ in range(25):
        env.step(ZERO)
    start = env.robot.root_pos_w[:, 0].clone()
    env.robot.root_lin_vel_w[:, 0] = 1.0
    for _ in range(40):
        env.step(ZERO)
    distance = env.robot.root_pos_w[:, 0] - start
    # Coulomb sliding stops after v^2 / (2 mu g): 0.255 m at mu 0.2, 0.042 m at 1.2.
    assert distance.tolist() == pytest.approx([1 / (2 * 0.2 * 9.81), 1 / (2 * 1.2 * 9.81)], rel=0.15)
    assert env.robot.root_lin_vel_w[:, 0].abs().max() < 0.01  # both have stopped


def test_a_heavier_base_sits_lower():
    env = only("{added_base_mass: {func: added_mass, mode: startup, range: [-1.0, 3.0], params: {bodies: base}}}")
    set_per_env(env, "added_base_mass", [-1.0, 3.0])
    assert env.robot.body_mass[:, 0].tolist() == pytest.approx([14.0, 18.0])
    assert env.robot.body_inertia[1, 0, 0, 0] / env.robot.body_inertia[0, 0, 0, 0] == pytest.approx(18.0 / 14.0)
    for _ in range(75):  # 1.5 s under the same PD targets (the default pose)
        env.step(ZERO)
    light, heavy = env.robot.root_pos_w[:, 2].tolist()
    assert light - heavy > 0.005, (light, heavy)  # kp 80: ~2.5 mm per kg
    assert env.robot.root_lin_vel_w.abs().max() < 0.02  # settled, not still falling


def test_a_stiffer_joint_tracks_a_step_target_faster():
    env = only("{stiffness: {func: stiffness_scale, mode: startup, range: [0.5, 2.0]}}")
    set_per_env(env, "stiffness", [0.5, 2.0])  # kp 40 and 160
    assert env.robot.joint_stiffness[:, 0].tolist() == pytest.approx([40.0, 160.0])
    pose = env.robot.default_root_pose.clone()
    pose[:, 2] = 2.0  # in free fall: no load on the legs
    place(env, pose)
    step = torch.zeros(2, 12)
    step[:, 1] = 0.4  # FL thigh target +0.1 rad (action scale 0.25): 16 N m at kp 160, below the limit
    start = env.robot.joint_pos[:, 1].clone()
    progress = []
    for _ in range(3):
        env.step(step)
        progress.append(((env.robot.joint_pos[:, 1] - start) / 0.1).tolist())
    soft, stiff = zip(*progress)  # fraction of the step covered after 20, 40, 60 ms
    assert stiff[0] > 2 * soft[0], progress  # (measured: 0.67 vs 0.19)
    assert stiff[1] > 0.9 and soft[1] < 0.6, progress  # the stiff one is there after 40 ms, the soft not


def test_latency_applies_the_action_from_k_steps_earlier():
    env = only("{action_delay: {mode: reset, range: [0, 3]}}", num_envs=4)
    set_per_env(env, "action_delay", [0, 1, 2, 3])
    assert env.action.delay.tolist() == [0, 1, 2, 3]
    actions = torch.randn(8, 4, 12, generator=torch.Generator().manual_seed(0))
    scale, default = env.action.scale, env.robot.default_joint_pos
    for t in range(8):
        env.step(actions[t])
        for k in range(4):
            expected = default[k] + scale * actions[t - k, k] if t >= k else default[k]  # zeros before
            assert torch.equal(env.robot.joint_pos_target[k], expected), (t, k)
        assert torch.equal(env.action.actions, actions[t])  # the policy's own, for observations


def test_a_push_changes_the_base_velocity_by_the_drawn_amount_at_the_drawn_time():
    # Pushes 0.8-1.2 s into the episode, when the robots stand still after the drop from reset.
    env = only("{push: {func: push_base, mode: interval, interval_s: [0.8, 1.2], range: [-1.0, 1.0]}}", num_envs=4)
    term = env.events.terms["push"]
    due = torch.ceil(term.time_left / env.step_dt - 1e-4).long()  # control step of each env's push
    assert due.min() >= 40 and due.max() <= 60 and len(set(due.tolist())) > 1
    velocities = [env.robot.root_lin_vel_w[:, :2].clone()]
    for _ in range(int(due.max())):
        env.step(torch.zeros(4, 12))
        velocities.append(env.robot.root_lin_vel_w[:, :2].clone())
    jumps = torch.stack(velocities).diff(dim=0)  # (steps, envs, 2)
    pushes = term.values.view(4, 2)
    assert pushes.abs().max() <= 1.0 and pushes.abs().min() > 0.0
    for k in range(4):
        at = int(due[k]) - 1
        assert torch.allclose(jumps[at, k], pushes[k], atol=0.01), (k, jumps[at, k], pushes[k])
        assert jumps[30:at, k].abs().max() < 0.01  # standing still until then
    # The pushed robots then move the way they were pushed (where the push is more than the few
    # millimetres of drift from settling after the drop: 0.07 m/s moved one -1 mm).
    moved = env.robot.root_pos_w[:, :2] - env.robot.default_root_pose[:, :2]
    strong = (due < due.max() - 3)[:, None] & (pushes.abs() > 0.3)
    assert strong.any() and (torch.sign(moved[strong]) == torch.sign(pushes[strong])).all()


@pytest.mark.bit_exact
def test_draws_differ_across_envs_stay_in_range_reproduce_with_the_seed_and_reach_the_graph():
    overrides = all_terms_on(QUAD, "sim.num_envs=8", "task.events.push.interval_s=[0.2,0.4]")
    graph = make_env(*overrides)
    eager = make_env(*overrides, "sim.use_graph=false")
    other_seed = make_env(*overrides, "seed=7")
    for term in graph.events.terms.values():
        if term.mode == "interval":
            continue
        values = term.values
        assert values.isfinite().all(), term.name
        assert ((values >= term.low) & (values <= term.high)).all(), term.name
        assert (values != values[0]).any(dim=1).any(), f"{term.name}: every env drew the same"
        assert torch.equal(values, eager.events.terms[term.name].values), term.name
    for name in graph.sim.defaults:
        assert torch.equal(getattr(graph.sim, name), getattr(eager.sim, name)), name
    for name in ("shape_friction", "body_mass", "joint_stiffness", "joint_armature", "gravity"):
        assert not torch.equal(getattr(graph.sim, name), getattr(other_seed.sim, name)), name
    # What was drawn is what the simulation holds.
    robot, terms = graph.robot, graph.events.terms
    assert torch.equal(robot.shape_friction[:, 0], terms["friction"].values[:, 0])
    assert torch.allclose(robot.joint_stiffness, robot.defaults["joint_stiffness"] * terms["stiffness"].values)
    assert torch.allclose(robot.joint_effort_limit,
                          robot.defaults["joint_effort_limit"] * terms["motor_strength"].values)
    assert torch.equal(robot.joint_armature, terms["joint_armature"].values)
    base_scale, base_added = terms["link_mass"].values[:, 0], terms["added_base_mass"].values[:, 0]
    assert torch.allclose(robot.body_mass[:, 0], robot.defaults["body_mass"][:, 0] * base_scale + base_added)
    # Every randomized parameter reaches MuJoCo Warp through the captured graph exactly as it
    # does eagerly: identical actions give bit-identical trajectories, pushes included.
    actions = torch.randn(30, 8, 12, generator=torch.Generator().manual_seed(1)) * 0.5
    for a in actions:
        graph.step(a)
        eager.step(a)
    assert torch.equal(graph.sim.joint_q, eager.sim.joint_q)
    assert torch.isfinite(graph.sim.joint_q).all()
    assert graph.events.terms["push"].values.isfinite().all()  # pushes happened


def test_no_nan_over_2000_steps_with_every_term_at_the_edges_of_its_range():
    overrides = all_terms_on(QUAD, "sim.num_envs=4", "task.events.push.interval_s=[0.5,1.0]")
    env = make_env(*overrides)
    edges = {name: (t.low, t.high) for name, t in env.events.terms.items()}
    for name, term in env.events.terms.items():
        if term.mode == "startup":  # envs 0, 1 at the low edge, 2, 3 at the high edge
            set_per_env(env, name, [edges[name][0]] * 2 + [edges[name][1]] * 2)
    generator = torch.Generator().manual_seed(0)
    episodes = 0
    for step in range(2000):
        for name, term in env.events.terms.items():
            if term.mode != "startup":  # alternate edges, so resets and pushes see both
                term.set_range(*(2 * [edges[name][step % 2]]))
        obs, rewards, dones, extras = env.step(torch.randn(4, 12, generator=generator))
        episodes += int(dones.sum())
        assert extras["log"]["Episode_Termination/nonfinite"] == 0.0, step
        assert torch.isfinite(obs["policy"]).all() and torch.isfinite(rewards).all(), step
    assert torch.isfinite(env.sim.joint_q).all() and torch.isfinite(env.sim.joint_qd).all()
    assert episodes > 20  # random actions topple the robots: many resets at the edges too


def test_restitution_makes_contacts_bounce(tmp_path):
    ball = tmp_path / "ball.xml"
    ball.write_text("<mujoco><worldbody><body name='ball' pos='0 0 1'><freejoint/>"
                    "<geom type='sphere' size='0.05' mass='1' solref='0.02 1'/></body></worldbody></mujoco>")
    sim = NewtonSim(Scene(robot=Robot(file=str(ball)), contact_sensing=False), num_envs=3, dt=0.005, decimation=1)
    sim.robot.shape_restitution[:, 0] = torch.tensor([0.0, 0.3, 0.6])
    sim.params_changed("shape_restitution")
    impact, rebound = torch.zeros(3), torch.zeros(3)
    for _ in range(120):  # 0.6 s: fall 1 m, one bounce
        sim.step()
        v = sim.robot.root_lin_vel_w[:, 2]
        impact = torch.minimum(impact, v)
        rebound = torch.where(impact < -4.0, torch.maximum(rebound, v), rebound)
    ratio = rebound / -impact  # measured 0.11, 0.37, 0.67: MuJoCo's soft contact adds ~0.1
    assert ratio[0] < 0.15 and abs(ratio[1] - 0.3) < 0.1 and abs(ratio[2] - 0.6) < 0.1, ratio


def test_curriculum_widens_ranges_logs_them_and_state_dict_restores_them():
    env = only("{root_vel: {mode: reset, range: [-1.0, 1.0], curriculum: {start: [0.0, 0.0], steps: 10}}}")
    assert (env.events.terms["root_vel"].low, env.events.terms["root_vel"].high) == (0.0, 0.0)
    for _ in range(5):
        _, _, _, extras = env.step(ZERO)
    assert extras["log"]["Randomization/root_vel_low"] == pytest.approx(-0.5)
    assert extras["log"]["Randomization/root_vel_high"] == pytest.approx(0.5)
    saved = env.state_dict()
    assert saved == {"randomization": {"root_vel": {"range": [-0.5, 0.5], "distribution": "uniform", "mode": "reset"}},
                     "step_count": 5}
    env.events.set_range("root_vel", -0.1, 0.1)  # the hook for other schedules
    assert env.events.ranges()["root_vel"] == (-0.1, 0.1)
    env.load_state_dict(saved)
    assert env.events.ranges()["root_vel"] == (-0.5, 0.5) and env.events.step_count == 5
    for _ in range(10):
        env.step(ZERO)
    assert env.events.ranges()["root_vel"] == (-1.0, 1.0)  # fully widened, and no further
    # a saved range for a term that is gone warns; one for a term this config turns off is skipped quietly
    with pytest.warns(UserWarning, match=r"ranges of \['gone'\] not restored: no such event term"):
        env.load_state_dict({"randomization": {"gone": saved["randomization"]["root_vel"]}})
    env.events.terms["root_vel"].enabled = False  # as ++task.events.root_vel.enabled=false builds it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.load_state_dict(saved)
    term = env.events.terms["root_vel"]
    assert (term.low, term.high) == (-1.0, 1.0)  # not restored into the disabled term


def test_an_interval_curriculum_makes_pushes_stronger_and_more_frequent():
    """A curriculum's ``interval_s`` moves an interval term's interval as its ``start`` moves the
    range: pushes every 10 s and of nothing at step 0, every 1 s and up to 0.5 m/s after 50 steps."""
    env = only("{push: {func: push_base, mode: interval, interval_s: [1.0, 1.0], range: [-0.5, 0.5], "
               "curriculum: {start: [0.0, 0.0], steps: 50, interval_s: [10.0, 10.0]}}}")
    term = env.events.terms["push"]
    assert term.interval_now.tolist() == [10.0, 10.0] and (term.time_left > 9.9).all()
    for _ in range(25):
        env.step(ZERO)
    assert term.interval_now.tolist() == pytest.approx([5.5, 5.5]) and term.high == pytest.approx(0.25)
    for _ in range(25):
        env.step(ZERO)
    assert term.interval_now.tolist() == pytest.approx([1.0, 1.0]) and term.high == pytest.approx(0.5)
    env.events.apply("reset", torch.ones(2, dtype=torch.bool))  # the next draws: 1 s away
    assert torch.allclose(term.time_left, torch.ones(2))


@pytest.mark.parametrize("override, message", [
    ("+task.events.wobble={mode: reset, range: [0, 1]}", "Unknown events term 'wobble'"),
    ("+task.events.friction.distribution=gauss", "task.events.friction: unknown distribution 'gauss'"),
    ("task.events.friction.distribution=gauss",
     r"friction.distribution: not set in task.events.friction; add it with \+"),
    ("task.events.friction.range=[1.2,0.5]", r"task.events.friction.range: \[1.2, 0.5\] has low > high"),
    ("task.events.friction.range=[0.0,1.0]", r"task.events.friction.range: \[0.0, 1.0\] leaves the domain"),
    ("task.events.push.mode=startup", "task.events.push: mode 'startup' is not one of"),
    ("task.events.push.interval_s=null", "task.events.push: an interval term needs interval_s"),
    ("+task.events.friction.rnage=[0,1]", r"task.events.friction.rnage: no such key. Valid keys .* range"),
    ("+task.events.friction.params.body=base", "task.events.friction: bad params"),
    ("task.events.friction.params.bodies=hoof", "task.events.friction: No body name of robot matches"),
    ("+task.events.friction.curriculum={start: [1, 1], steps: 10}", "curriculum on a startup term"),
    ("+task.events.root_vel.curriculum={start: [0, 0], steps: 10, interval_s: [5, 5]}",
     r"task.events.root_vel.curriculum.interval_s: for an interval term \(this term's mode is reset\)"),
    ("+task.reset_events={}", r"task.reset_events: no such key. Valid keys of task: .*events"),
    ("+task.events.com={func: com_offset, mode: startup, range: [0, 0.01], params: {axes: xw}}",
     r"com_offset: axes='xw'; name some of x, y, z once each"),
])
def test_bad_event_config_is_named(override, message):
    with pytest.raises(ValueError, match=message):
        make_env(QUAD, "sim.num_envs=2", override)


def test_legion_randomization_prints_ranges_and_what_the_envs_hold():
    from legion.tasks.randomization import report

    out = report(make_env(QUAD, "sim.num_envs=6", "task.events.stiffness.enabled=true",
                          "+task.events.latency={func: command_latency, mode: reset, range: [0, 20]}"))
    assert re.search(r"command latency \[physics steps of 5 ms\]: min [0-4], mean [\d.]+, max [0-4]", out), out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line and not line.startswith(("-", " "))}
    assert rows["friction"][3:5] == ["[0.5,", "1.25]"]
    low, mean, high = (float(x) for x in rows["friction"][-3:])
    assert 0.5 <= low < mean < high <= 1.25
    assert rows["robot.shape_friction"][1:4] == ["18", "of", "18"] and rows["robot.joint_stiffness"][1] == "12"
    assert rows["damping"][1] == "(off)" and rows["stiffness"][1] == "startup"
