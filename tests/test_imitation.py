"""Learning from demonstrations (issue 30): behaviour cloning and DAgger on the PPO's actor,
PPO started from their checkpoint, and demonstrations of another task or robot refused; and
teacher-student distillation (issue 28): DAgger with a trained run as the expert."""

import pytest
import torch
from tensordict import TensorDict

from conftest import compose, make_runner
from legion import api
from legion.agents.ppo import action_std
from legion.commands.train import train
from legion.sim2real.trajectories.record import record_scripted

EXPERT = "scripted:legion.tasks.manipulation.expert:lift"
SMALL = ("task=arm_lift_ik", "sim.num_envs=8", "agent.num_steps_per_env=8", "agent.imitation.batch_size=256",
         "agent.imitation.updates_per_iteration=20")


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos") / "lift.h5"
    record_scripted(EXPERT, 4, out, overrides=("task=arm_lift_ik", "task.episode_length_s=2.0"))
    return out


def cloning_error(runner) -> float:
    """The actor's mean-squared error on the runner's labelled samples."""
    with torch.no_grad():
        predicted = runner.ppo.actor(runner.obs)  # the samples: every group the actor reads
    return torch.nn.functional.mse_loss(predicted, runner.labels).item()


def test_behaviour_cloning_fits_the_demonstrations(demos, seed, learned):
    """Over training seeds 0-19 the cloning error fell by 96.4-97.4% (bound 80%) and the gripper's
    sign agreed on 99% of the samples in every seed (bound 95%)."""
    runner = make_runner(*SMALL, "agent=bc", f"agent.imitation.demos=[{demos}]", f"seed={seed}")
    assert runner.obs["policy"].shape == (4 * 100, runner.env.get_observations()["policy"].shape[1])
    before = cloning_error(runner)
    runner.learn(15)
    after = cloning_error(runner)
    # the gripper's open/close, the demonstrations' sharpest decision, is reproduced
    with torch.no_grad():
        grip = runner.ppo.actor(runner.obs)[:, 6]
    learned(error_cut=(1 - after / before, 0.8),
            grip_agreement=((grip.sign() == runner.labels[:, 6].sign()).float().mean().item(), 0.95))


def test_dagger_acts_with_the_student_and_labels_with_the_expert():
    runner = make_runner(*SMALL, "agent=dagger", f"agent.imitation.expert={EXPERT}")
    runner.learn(2)
    steps, n = 8, 8
    assert runner.obs.shape[0] == 2 * steps * n  # every visited state labelled, nothing else
    layout = {t["name"]: t for t in runner.env.observation_layout()["policy"]}
    last = layout["last_action"]
    executed = runner.obs["policy"][:, last["start"]:last["start"] + last["size"]].view(2, steps, n, -1)
    labels = runner.labels.view(2, steps, n, -1)
    # the first iteration acts with the expert's labels, the second with the student's actions
    assert torch.allclose(executed[0, 1:], labels[0, :-1], atol=1e-6)
    assert not torch.allclose(executed[1, 1:], labels[1, :-1], atol=1e-2)


def test_a_resumed_dagger_student_gathers_an_episode_of_samples_before_it_learns_again(tmp_path):
    """Its samples are not in the checkpoint: one rollout of freshly reset envs (one phase of the
    task) must not be all it trains on."""
    short = (*SMALL, "agent=dagger", f"agent.imitation.expert={EXPERT}", "task.episode_length_s=1.0")
    first = make_runner(*short)
    first.learn(2)
    checkpoint = first.save(tmp_path / "model_2.pt")
    resumed = make_runner(*short, env=first.env)
    resumed.load(checkpoint)
    moments = [state["exp_avg"] for state in resumed.optimizer.state_dict()["state"].values()]
    saved = [state["exp_avg"] for state in first.optimizer.state_dict()["state"].values()]
    assert len(moments) == len(saved) > 0 and all(torch.equal(a, b) for a, b in zip(moments, saved))  # Adam's too
    weights = [p.detach().clone() for p in resumed.ppo.actor.parameters()]
    per_iteration, episode = 8 * 8, 8 * 50  # envs x steps; envs x steps of an episode
    resumed.learn(2 + episode // per_iteration)  # 6 iterations: 384 samples, fewer than an episode's
    assert len(resumed.obs) == 6 * per_iteration
    assert all(torch.equal(a, b) for a, b in zip(weights, resumed.ppo.actor.parameters()))
    resumed.learn(resumed.iteration + 1)  # 448: it learns again
    assert not all(torch.equal(a, b) for a, b in zip(weights, resumed.ppo.actor.parameters()))


def test_dagger_lowers_its_learning_rate_over_the_run_to_the_final_one():
    """Over the run's agent.max_iterations, however many iterations each learn() call runs (a
    benchmark's chunks of minutes, a resumed run)."""
    schedule = ("agent=dagger", f"agent.imitation.expert={EXPERT}", "agent.imitation.learning_rate=1e-3",
                "agent.imitation.learning_rate_final=1e-4")
    runner = make_runner(*SMALL, *schedule, "agent.max_iterations=4")
    rates = []
    runner.on_iteration.append(lambda r, iteration: rates.append(r.optimizer.param_groups[0]["lr"]))
    runner.learn(2)
    runner.learn(4)
    assert rates == pytest.approx([1e-3, 7e-4, 4e-4, 1e-4])  # the last iteration's steps at the final rate
    endless = make_runner(*SMALL, *schedule, "agent.max_iterations=null", env=runner.env)
    with pytest.raises(ValueError, match=r"learning_rate_final=0.0001 falls over the run's iterations: set "
                                         r"agent.max_iterations"):
        endless.learn(1)


def test_ppo_starts_from_a_cloned_policy(demos, tmp_path):
    bc = train(compose(*SMALL, "agent=bc", f"agent.imitation.demos=[{demos}]", "agent.max_iterations=5"),
                        tmp_path / "bc")
    ppo = make_runner(*SMALL, "agent.actor.init_noise_std=0.2", env=bc.env)
    obs = bc.obs[:64]
    with torch.no_grad():
        assert not torch.allclose(ppo.ppo.actor(obs), bc.ppo.actor(obs), atol=1e-2)  # from scratch: another policy
        ppo.init_from(tmp_path / "bc" / "model_5.pt")
        assert torch.equal(ppo.ppo.actor(obs), bc.ppo.actor(obs))  # the cloned actor and its normalizer
    assert torch.equal(action_std(ppo.ppo), torch.full_like(action_std(ppo.ppo), 0.2))


def test_lerobot_datasets_converted_from_demonstrations_load_back_the_same(demos, tmp_path):
    from legion.sim2real.trajectories.demos import load_demos
    from legion.sim2real.trajectories.lerobot import to_lerobot

    dataset = to_lerobot(demos, tmp_path / "lift_lerobot")
    env = api.make_env(compose("task=arm_lift_ik", "sim.num_envs=2"))
    (obs, actions), (obs_back, actions_back) = load_demos([str(demos)], env), load_demos([str(dataset)], env)
    assert obs.shape == (400, obs.shape[1]) and torch.equal(obs, obs_back) and torch.equal(actions, actions_back)
    with pytest.raises(ValueError, match=r"was recorded with joints \['joint1'.*this run's robot has \['panda_joint1'"):
        load_demos([str(dataset)], api.make_env(compose("task=arm_lift_ik", "robot=panda", "sim.num_envs=2")))


def test_demonstrations_of_another_task_robot_or_observation_layout_are_refused(demos):
    with pytest.raises(ValueError, match="holds episodes of task arm_lift_ik, not arm_lift"):
        make_runner("task=arm_lift", "sim.num_envs=2", "agent=bc", f"agent.imitation.demos=[{demos}]")
    with pytest.raises(ValueError, match="was recorded with the robot model .*arm.xml; this run's is .*panda"):
        make_runner("task=arm_lift_ik", "robot=panda", "sim.num_envs=2", "agent=bc", f"agent.imitation.demos=[{demos}]")
    with pytest.raises(ValueError, match=r"its policy observations are .*'tcp_position': 3.*this task's are"):
        make_runner("task=arm_lift_ik", "sim.num_envs=2", "agent=bc", f"agent.imitation.demos=[{demos}]",
                    "~task.observations.policy.tcp_position")
    with pytest.raises(api.ConfigError, match=r"agent.mode=bc: name the demonstrations, agent.imitation.demos"):
        api.validate(compose("task=arm_lift_ik", "agent=bc"))


# --- distillation: a trained run labels, on its own (privileged) observations ----------------------
@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A quadruped_flat run of one PPO iteration: its policy observes the base's linear velocity."""
    run = tmp_path_factory.mktemp("teacher") / "run"
    train(compose("task=quadruped_flat", "sim.num_envs=8", "agent.max_iterations=1",
                           "agent.num_steps_per_env=8"), run)
    return run


def test_a_student_that_measures_less_learns_the_teachers_actions(teacher, seed, learned):
    """Over training seeds 0-19 the student explained 90.4-94.6% of the teacher's action variance
    (mean 93.0%, sd 1.1): the bound, 75%, is 16 sd below the mean."""
    runner = make_runner("task=quadruped_flat_deployable", "sim.num_envs=8", "agent=distillation", f"seed={seed}",
                         f"agent.imitation.expert=run:{teacher}", "agent.num_steps_per_env=8",
                         "agent.imitation.batch_size=256", "agent.imitation.updates_per_iteration=20")
    layout = runner.env.observation_layout()
    assert "base_lin_vel" in [t["name"] for t in layout["teacher"]]  # privileged: the teacher's alone
    assert "base_lin_vel" not in [t["name"] for t in layout["policy"]]
    obs = runner.env.get_observations()
    played = api.load_run(teacher, num_envs=8).runner.ppo.actor  # the teacher as legion play runs it
    with torch.no_grad():
        assert torch.allclose(runner.expert(obs), played(TensorDict({"policy": obs["teacher"]}, batch_size=[8])))
    runner.learn(10)
    # the share of the teacher's actions (their variance over the visited states) the student explains
    explained = 1 - cloning_error(runner) / runner.labels.var(0).mean().item()
    learned(explained=(explained, 0.75))  # none learned: <= 0 (the labels have a mean too)


def test_a_teacher_of_another_robot_or_action_is_refused_by_name(teacher):
    from legion.sim2real.trajectories.demos import with_teacher_observations

    student = ("task=quadruped_flat_deployable", "agent=distillation", f"agent.imitation.expert=run:{teacher}")
    with pytest.raises(api.ConfigError, match=r"the teacher drives .*quadruped.xml; this task's robot is .*go2.urdf"):
        with_teacher_observations(compose(*student, "robot=go2"))
    with pytest.raises(api.ConfigError, match=r"the teacher acts through .*scale=0.25.*; this task through "
                                              r".*scale=0.5"):
        with_teacher_observations(compose(*student, "task.action.scale=0.5"))
    with pytest.raises(api.ConfigError, match="run:/no/such/run: no such run folder or checkpoint"):
        with_teacher_observations(compose(*student[:-1], "agent.imitation.expert=run:/no/such/run"))


# --- a recurrent student: what it does not see, it infers from what it saw -------------------------
CARTPOLE_STUDENT = ("task=cartpole_positions_only", "sim.num_envs=64", "agent=distillation",
                    "agent.num_steps_per_env=16", "agent.imitation.batch_size=512",
                    "agent.imitation.updates_per_iteration=20")
LSTM = ("agent.actor.rnn.type=lstm", "agent.actor.rnn.hidden_size=32")


@pytest.fixture(scope="module")
def cartpole_teacher(tmp_path_factory):
    """A cart-pole run of 40 PPO iterations on 256 envs: it balances, seeing the velocities (no
    episode fell in 500 steps under either CPU dispatch; one of 64 envs, 30 iterations, balanced
    under AVX-512's and fell every time under the default's)."""
    run = tmp_path_factory.mktemp("cartpole_teacher") / "run"
    train(compose("task=cartpole", "sim.num_envs=256", "agent.max_iterations=40"), run)
    return run


def share_fallen(runner, steps: int = 500) -> float:
    """The share of the episodes that ended in ``steps`` steps of the student's actions that ended by
    a fall (not a time-out); 0 where none ended."""
    env, actor = runner.env, runner.ppo.actor
    obs, fell, ended = env.get_observations(), 0, 0
    with torch.inference_mode():
        for _ in range(steps):
            obs, _, dones, extras = env.step(actor(obs))
            actor.reset(dones)
            fell += int((dones.bool() & ~extras["time_outs"].bool()).sum())
            ended += int(dones.sum())
    return fell / max(ended, 1)


def test_a_recurrent_student_infers_the_velocities_its_teacher_sees(cartpole_teacher, seed, learned):
    """The cart-pole seen through positions only: distilled from a teacher that sees the velocities,
    an LSTM student keeps the pole up, where a feed-forward one, given the same samples, cannot.
    Over training seeds 0-9, 40 iterations: no LSTM student's pole fell in 500 steps, under the
    AVX-512, AVX2 (one thread) and default CPU dispatch alike (with a weaker teacher, at 30
    iterations 0-19% of the episodes that ended, at 20 up to 52%); every feed-forward one's fell."""
    students = {}
    for name, actor in (("lstm", LSTM), ("feed_forward", ())):
        students[name] = make_runner(*CARTPOLE_STUDENT, *actor, f"seed={seed}",
                                     f"agent.imitation.expert=run:{cartpole_teacher}")
        students[name].learn(40)
    fell = {name: share_fallen(runner) for name, runner in students.items()}
    learned(lstm_kept_up=(1 - fell["lstm"], 0.8))
    assert fell["feed_forward"] > 0.9, fell  # every episode of the one without memory falls


def test_a_recurrent_students_rollout_replays_to_the_actions_it_took(cartpole_teacher):
    """Each gradient step replays a stored rollout from the memory the student entered it with,
    restarting it where an episode ended: with the same weights that gives back the actions taken."""
    from legion.agents.imitation import Rollout
    from legion.agents.ppo import map_tensors

    runner = make_runner(*CARTPOLE_STUDENT, *LSTM, f"agent.imitation.expert=run:{cartpole_teacher}",
                         "task.episode_length_s=1.0")  # (episodes of 50 steps: some end inside each rollout)
    runner.learn(2)  # (the first iteration acts with the teacher's labels)
    actor = runner.ppo.actor
    actor.obs_normalizer.until = 0  # frozen, as the weights below: the rollout's acting and replay alike
    runner.imitation.learning_rate = 0.0  # (each iteration's steps take the configured rate)
    taken, step = [], runner.env.step
    runner.env.step = lambda actions: (taken.append(actions.clone()), step(actions))[1]
    runner.learn(12)  # ten rollouts on the same weights
    rollouts, taken = runner.rollouts[-10:], torch.stack(taken).view(10, 16, 64, -1)
    assert sum(bool(rollout.dones.any()) for rollout in rollouts) >= 3  # episodes restart inside them
    with torch.no_grad():
        for rollout, actions in zip(rollouts, taken):
            assert torch.allclose(runner.replay(rollout), actions, atol=1e-5)
        rollout, actions = rollouts[-1], taken[-1]
        forgotten = Rollout(rollout.obs, rollout.labels, rollout.dones, map_tensors(rollout.memory, torch.zeros_like))
        assert not torch.allclose(runner.replay(forgotten)[0], actions[0], atol=1e-3)  # the memory it entered with
        chosen = torch.tensor([5, 1, 40])
        assert torch.allclose(runner.replay(rollout, chosen), actions[:, chosen], atol=1e-5)


def test_behaviour_cloning_of_a_recurrent_actor_is_refused_by_name(demos):
    with pytest.raises(ValueError, match="agent.mode=bc trains a feed-forward actor .* learns from an expert"):
        make_runner(*SMALL, "agent=bc", f"agent.imitation.demos=[{demos}]", *LSTM)
