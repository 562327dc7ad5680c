"""Off-policy learners (SAC, TD3) and their replay buffer: priorities, n-step targets, the state a
time-out bootstraps from, learning, checkpoints that resume exactly, export with the squashing."""

import time

import numpy as np
import pytest
import torch
from scipy import stats
from tensordict import TensorDict

from conftest import compose, legion_in_process, make_runner
from legion import api
from legion.agents.off_policy import OffPolicyLearner
from legion.agents.replay import BufferTooLarge, ReplayBuffer
from legion.configs import ConfigError

SMALL = ("task=cartpole", "sim.num_envs=16", "agent.num_steps_per_env=8", "agent.off_policy.batch_size=64",
         "agent.off_policy.learning_starts=2")
# A recurrent actor replaying windows of burn_in + sequence_length + n_step - 1 = 2 + 4 + 3 - 1 = 8 steps
LSTM = ("agent.actor.rnn.type=lstm", "agent.actor.rnn.hidden_size=16", "agent.off_policy.sequence_length=4",
        "agent.off_policy.burn_in=2")


def one_step(num_envs: int, value) -> TensorDict:
    return TensorDict({"policy": torch.full((num_envs, 1), float(value)) if np.isscalar(value) else value},
                      batch_size=[num_envs])


@pytest.mark.parametrize("draw", [0, 1, 2])
def test_prioritized_sampling_follows_the_priorities_with_their_importance_weights(draw):
    """200,000 draws over 48 stored steps with priorities spread over two decades: the counts fit
    p ** alpha (chi-square p-value above 1e-4: a correct sampler fails 1 in 10,000 seeds), and each
    weight is (N P(i)) ** -beta over the batch's largest."""
    generator = torch.Generator().manual_seed(draw)
    buffer = ReplayBuffer(one_step(4, 0.0), 1, capacity=16, device="cpu", prioritized=True, alpha=0.6, beta=0.4)
    for t in range(12):  # 12 of 16 slots filled: the empty ones are never drawn
        buffer.add(one_step(4, t), torch.zeros(4, 1), torch.zeros(4), one_step(4, t + 1),
                   torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool))
    priorities = 10 ** torch.empty(12, 4).uniform_(-1, 1, generator=generator)
    buffer.priorities[:12] = priorities
    expected = (priorities.flatten() ** 0.6) / (priorities.flatten() ** 0.6).sum()
    counts = torch.zeros(48)
    for _ in range(20):
        batch = buffer.sample(10_000, generator=generator)
        flat = batch.slot * 4 + batch.env
        counts += torch.bincount(flat, minlength=48)[:48]
        assert int(batch.slot.max()) < 12
        p = expected[flat]
        weights = (48 * p) ** -0.4
        assert torch.allclose(batch.weights, weights / weights.max(), rtol=1e-5)
    assert counts.sum() == 200_000
    chi2 = stats.chisquare(counts.numpy(), (expected * 200_000).numpy())
    assert chi2.pvalue > 1e-4, chi2


def test_new_priorities_change_what_is_sampled():
    buffer = ReplayBuffer(one_step(2, 0.0), 1, capacity=4, device="cpu", prioritized=True, alpha=1.0)
    for t in range(4):
        buffer.add(one_step(2, t), torch.zeros(2, 1), torch.zeros(2), one_step(2, t + 1),
                   torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
    batch = buffer.gather(torch.tensor([0, 1]), torch.tensor([2, 3]))
    buffer.priorities.fill_(1e-9)
    buffer.update_priorities(batch, torch.tensor([5.0, -5.0]))  # |error|
    drawn = buffer.sample(1000, generator=torch.Generator().manual_seed(0))
    assert set(zip(drawn.env.tolist(), drawn.slot.tolist())) == {(0, 2), (1, 3)}
    assert float(buffer.max_priority) == pytest.approx(5.0)


def reference_targets(rewards, terminated, time_outs, newest: int, gamma: float, n: int):
    """The n-step target's parts for every step t of one env, the slow way: (return, bootstrap
    step, discount)."""
    out = []
    for t in range(newest + 1):
        ret, k = 0.0, 0
        while True:
            ret += gamma ** k * rewards[t + k]
            if terminated[t + k] or time_outs[t + k] or k == n - 1 or t + k == newest:
                break
            k += 1
        out.append((ret, t + k, 0.0 if terminated[t + k] else gamma ** (k + 1)))
    return out


def test_n_step_targets_are_exact_on_hand_built_episodes():
    """Two envs, 7 steps: env 0 terminates at step 2 and times out at step 5, env 1 times out at
    step 1 and terminates at step 6 (the newest). Each step's return sums its episode's rewards up
    to n = 3 steps; the bootstrap comes from the next observation of the step it stops at, zero
    after a termination, gamma ** k after a time-out (its episode was cut, not over)."""
    gamma, n = 0.9, 3
    rewards = torch.tensor([[1.0, 2, 3, 4, 5, 6, 7], [10, 20, 30, 40, 50, 60, 70]])
    terminated = torch.zeros(2, 7, dtype=torch.bool)
    time_outs = torch.zeros(2, 7, dtype=torch.bool)
    terminated[0, 2] = time_outs[0, 5] = time_outs[1, 1] = terminated[1, 6] = True
    buffer = ReplayBuffer(one_step(2, 0.0), 1, capacity=8, device="cpu", gamma=gamma, n_step=n)
    for t in range(7):
        # next observations: 100 + the step (+ 1000 for env 1), whatever ended there
        next_obs = torch.tensor([[100.0 + t], [1100.0 + t]])
        buffer.add(one_step(2, t), torch.full((2, 1), float(t)), rewards[:, t], one_step(2, next_obs),
                   terminated[:, t], time_outs[:, t])
    for env in range(2):
        expected = reference_targets(rewards[env].tolist(), terminated[env].tolist(), time_outs[env].tolist(), 6,
                                     gamma, n)
        batch = buffer.gather(torch.full((7,), env), torch.arange(7))
        assert batch.actions[:, 0].tolist() == list(range(7))
        for t, (ret, last, discount) in enumerate(expected):
            assert batch.returns[t].item() == pytest.approx(ret, rel=1e-6), (env, t)
            assert batch.next_obs["policy"][t, 0].item() == 100 + last + 1000 * env, (env, t)
            assert batch.discounts[t].item() == pytest.approx(discount, rel=1e-6), (env, t)
    # a wrapped ring: 3 slots, 5 steps added: the oldest kept is step 2, and step 4's target stops at itself
    ring = ReplayBuffer(one_step(1, 0.0), 1, capacity=3, device="cpu", gamma=gamma, n_step=n)
    for t in range(5):
        ring.add(one_step(1, t), torch.zeros(1, 1), torch.tensor([float(t)]), one_step(1, 100.0 + t),
                 torch.zeros(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool))
    batch = ring.gather(torch.zeros(3, dtype=torch.long), torch.arange(3))  # slots hold steps 3, 4, 2
    assert batch.obs["policy"][:, 0].tolist() == [3.0, 4.0, 2.0]
    assert batch.returns.tolist() == pytest.approx([3 + 0.9 * 4, 4, 2 + 0.9 * 3 + 0.81 * 4])
    assert batch.next_obs["policy"][:, 0].tolist() == [104.0, 104.0, 104.0]


def test_time_outs_bootstrap_from_the_state_their_episode_ended_in_on_a_real_env():
    """Cart-pole with 0.3 s episodes, falling past 0.15 rad, trained by TD3 for 24 steps: wherever an episode ended, the
    buffer's next observation is the state it ended in (read right after the physics, before the
    reset), not the next episode's first; elsewhere it is the next step's observation. Time-outs
    bootstrap (discount gamma), terminations do not (0)."""
    runner = make_runner(*SMALL, "agent=td3", "task.episode_length_s=0.3", "agent.off_policy.n_step=1",
                         "agent.num_steps_per_env=24", "task.terminations.pole_fell.params.limit=0.15")
    env, gamma = runner.env, runner.cfg.off_policy.gamma
    before_reset = []
    env.after_physics.append(lambda env: before_reset.append(env.observation_manager.compute()["policy"].clone()))
    runner.learn(1)
    buffer = runner.buffer
    ended = buffer.terminated[:24] | buffer.time_outs[:24]
    assert buffer.time_outs[:24].sum() >= 4 and buffer.terminated[:24].sum() >= 4  # both kinds happened
    for t in range(24):
        rows = ended[t]
        assert torch.equal(buffer.next_obs["policy"][t][rows], before_reset[t][rows])
        if t < 23:
            assert torch.equal(buffer.next_obs["policy"][t][~rows], buffer.obs["policy"][t + 1][~rows])
            assert not torch.equal(buffer.obs["policy"][t + 1][rows], before_reset[t][rows]) or not rows.any()
    envs, slots = torch.meshgrid(torch.arange(16), torch.arange(24), indexing="xy")
    batch = buffer.gather(envs.flatten(), slots.flatten())
    flags = (buffer.terminated[:24].flatten(), buffer.time_outs[:24].flatten())
    assert torch.all(batch.discounts[flags[0]] == 0)
    assert torch.allclose(batch.discounts[flags[1]], torch.tensor(gamma))


def test_an_env_without_the_flag_computes_no_final_observations():
    runner = make_runner(*SMALL, "task.episode_length_s=0.1")
    env = runner.env
    for _ in range(10):
        _, _, dones, extras = env.step(torch.zeros(env.num_envs, env.num_actions))
        assert "final_observations" not in extras
    assert dones.any()


@pytest.mark.parametrize("learner", ["sac", "td3"])
def test_off_policy_learners_learn_cartpole(learner, seed, learned):
    """Cart-pole, 64 envs, 30 iterations of 16 steps (30,720 env steps): the mean episode length
    rises. Over training seeds 0-9 it grew 4.2-6.0 times with SAC (mean 5.3, sd 0.6), 3.9-7.2 with
    TD3 (mean 5.1, sd 1.2) in fp32; in bf16 (agent.precision=auto on a CPU with bfloat16 products)
    4.1-6.2 with SAC (mean 5.3, sd 0.8), 3.7-7.6 with TD3 (mean 5.1, sd 1.3). The bounds, 3 and 1.9,
    lie 2.9 and 2.4 sd below the lower of each pair of means."""
    runner = make_runner("task=cartpole", f"agent={learner}", f"seed={seed}", "sim.num_envs=64",
                         "agent.num_steps_per_env=16")
    runner.learn(2)
    start = runner.mean_episode_length
    runner.learn(30)
    print(f"{learner}: episode length {start:.1f} -> {runner.mean_episode_length:.1f}")
    learned(length_ratio=(runner.mean_episode_length / start, {"sac": 3.0, "td3": 1.9}[learner]))


def test_a_replayed_sequence_starts_from_the_memory_the_actor_had_and_reproduces_its_states():
    """TD3 with an LSTM actor, episodes of 15 steps, no update yet (the weights that acted are the
    learner's): each stored step keeps the memory the actor had before it acted (zeros at an
    episode's first step), and a replayed window unrolled from the memory stored with its first
    step, restarted where an episode begins inside it, gives back the memory stored at each next
    step. With the stored memories forgotten (zeros) it does not."""
    runner = make_runner("task=cartpole_positions_only", "agent=td3", "sim.num_envs=16", "agent.num_steps_per_env=8",
                         "task.episode_length_s=0.3", "agent.off_policy.learning_starts=1000", *LSTM,
                         "agent.off_policy.burn_in=0", "agent.off_policy.n_step=1", "agent.off_policy.batch_size=256")
    runner.learn(5)
    learner, buffer = runner.learner, runner.buffer
    assert learner.updates == 0 and buffer.memory is not None and len(buffer) == 40 * 16
    ended = buffer.terminated[:40] | buffer.time_outs[:40]
    first_steps = torch.cat([torch.ones(1, 16, dtype=torch.bool), ended[:-1]])  # a new episode's first step
    assert first_steps[1:].any() and not buffer.memory[:40][first_steps].any()
    assert (buffer.memory[:40][~first_steps].abs().amax(-1) > 0).all()

    def replay():
        torch.manual_seed(0)  # the same windows each time
        return learner._replay_sequences(buffer, grad=False)

    batch, latent, _ = replay()  # 64 windows of 4 steps, time-major
    step_in_window = torch.arange(len(batch.slot)) // 64
    following = buffer.memory[(batch.slot + 1).clamp(max=39), batch.env][:, :16]  # h of the memory after it
    checked = (batch.slot < 39) & ~ended[batch.slot, batch.env]
    restarted = (step_in_window > 0) & first_steps[batch.slot, batch.env]
    assert checked.sum() > 150 and (checked & restarted).sum() > 5
    assert torch.allclose(latent[checked], following[checked], atol=1e-5)
    buffer.memory.zero_()
    _, forgetful, _ = replay()
    assert not torch.allclose(forgetful[checked], following[checked], atol=1e-3)


def _share_balanced(runner, steps: int) -> float:
    """The share of the envs whose deterministic policy keeps the pole up for ``steps`` steps from a reset."""
    env, policy = runner.env, runner.policy
    obs, up = env.reset(), torch.ones(env.num_envs, dtype=torch.bool)
    policy.reset()
    with torch.inference_mode():
        for _ in range(steps):
            obs, _, dones, _ = env.step(policy(obs))
            policy.reset(dones)
            up &= ~dones
    return float(up.float().mean())


def test_a_recurrent_td3_balances_a_cartpole_seen_through_positions_only_where_a_feed_forward_one_cannot(seed,
                                                                                                      learned):
    """Cart-pole whose policy observes the cart's and the pole's positions, not their velocities
    (the critics see them): after the same 80 iterations (81,920 env steps), the share of 64 envs
    the deterministic policy keeps up for a whole 10 s episode. Over training seeds 0-11 the LSTM
    kept all of them up every time (after 60 iterations only 6 of 10 seeds did: hence 80); the
    feed-forward actor kept 0-41% (mean 14%, sd 16%; 44% once under ATEN_CPU_CAPABILITY=avx2 and one
    thread). Bounds: the LSTM above 90%, the feed-forward one losing more than 30% (3.5 sd below its
    mean loss of 86%)."""
    balanced = {}
    for actor, overrides in (("lstm", ("agent.actor.rnn.type=lstm", "agent.actor.rnn.hidden_size=32")), ("mlp", ())):
        runner = make_runner("task=cartpole_positions_only", "agent=td3", f"seed={seed}", "sim.num_envs=64",
                             "agent.num_steps_per_env=16", "agent.off_policy.batch_size=2048", *overrides)
        runner.learn(80)
        balanced[actor] = _share_balanced(runner, 499)
    print(f"balanced for 10 s: LSTM {balanced['lstm']:.0%}, feed-forward {balanced['mlp']:.0%}")
    learned(lstm_balanced=(balanced["lstm"], 0.9), mlp_fell=(1 - balanced["mlp"], 0.3))


def test_a_distributional_critic_projects_returns_onto_its_atoms():
    """C51's projection keeps the probability mass, moves a distribution by a whole number of atom
    spacings exactly, puts the mean where the shifted support's is (inside the range), and piles
    what falls outside the range on the end atoms."""
    cfg = compose("task=cartpole", "agent=sac", "agent.off_policy.distributional=true",
                  "agent.off_policy.num_atoms=11", "agent.off_policy.v_min=-5", "agent.off_policy.v_max=5")
    obs = one_step(3, 0.0)
    obs["policy"] = torch.zeros(3, 4)
    learner = OffPolicyLearner(obs, 1, 3, cfg.agent, "cpu")
    atoms = learner.atoms  # -5..5, spacing 1
    probabilities = torch.softmax(torch.randn(3, 11, generator=torch.Generator().manual_seed(0)), -1)
    shifted = learner._project(probabilities, atoms + torch.tensor([[2.0], [0.5], [-20.0]]))
    assert torch.allclose(shifted.sum(-1), torch.ones(3))
    assert torch.allclose(shifted[0, 2:-1], probabilities[0, :-3])  # two atoms up ...
    assert shifted[0, -1] == pytest.approx(float(probabilities[0, -3:].sum()))  # ... the top three on the last
    assert (shifted[1] * atoms).sum() == pytest.approx(float((probabilities[1] * (atoms + 0.5).clamp(-5, 5)).sum()))
    assert shifted[2, 0] == pytest.approx(1.0)


def test_a_distributional_prioritized_sac_trains_without_non_finite_numbers():
    runner = make_runner(*SMALL, "agent=sac", "agent.off_policy.distributional=true", "agent.off_policy.v_min=-2",
                         "agent.off_policy.v_max=60", "agent.off_policy.prioritized=true")
    runner.learn(4)
    report = runner.history[-1]
    assert runner.iteration == 4 and np.isfinite(report["mean_reward"])
    assert float(runner.buffer.priorities[:runner.buffer.size].std()) > 0  # the TD errors set them


def test_layer_norm_critics_keep_their_values_bounded_however_large_their_inputs():
    """agent.off_policy.layer_norm (on in agent=sac_efficient): each hidden layer's output is
    normalized, so a critic's value can never exceed what its last hidden layer's unit-variance
    features reach through the output layer (|Q| <= ||w|| sqrt(width) + |b|), where a plain
    critic's grows with its input."""
    values = {}
    for layer_norm, agent in ((False, "sac"), (True, "sac_efficient")):
        cfg = compose("task=cartpole", f"agent={agent}", "agent.critic.obs_normalization=false", "agent.precision=fp32")
        assert cfg.agent.off_policy.layer_norm == layer_norm
        torch.manual_seed(0)
        obs = one_step(8, 0.0)
        obs["policy"] = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
        critics = OffPolicyLearner(obs, 1, 8, cfg.agent, "cpu").critic
        norms = [m for head in critics.heads for m in head if isinstance(m, torch.nn.LayerNorm)]
        assert len(norms) == (2 * len(cfg.agent.critic.hidden_dims) if layer_norm else 0)
        with torch.no_grad():
            values[layer_norm] = [critics(TensorDict({"policy": obs["policy"] * scale}, batch_size=[8]),
                                          torch.zeros(8, 1)).abs().max() for scale in (1.0, 1e4)]
            if layer_norm:
                bound = max(float(head[-1].weight.norm() * head[-1].weight.shape[1] ** 0.5 + head[-1].bias.abs())
                            for head in critics.heads)
    assert values[False][1] > 100 * values[False][0]
    assert values[True][1] <= bound and values[True][1] < 10 * values[True][0]


@pytest.mark.parametrize("learner", ["sac", "td3"])
def test_a_bf16_gradient_step_moves_the_weights_as_fp32_does_with_fp32_outputs(learner):
    """agent.precision=bf16: from the same state (weights, optimizers, buffer, random generator), the
    weights' change over a few gradient steps agrees with fp32's within bfloat16's rounding; the
    critics' values and the actor's actions come out fp32 (the output layers stay fp32), and the
    checkpoint's weights are fp32."""
    from legion.agents.ppo import clone_tree

    runner = make_runner(*SMALL, f"agent={learner}", "agent.precision=bf16", "agent.off_policy.batch_size=512")
    runner.learn(2)
    learner_, buffer = runner.learner, runner.buffer
    assert learner_.bfloat16
    start, rng = clone_tree(learner_.state_dict()), torch.get_rng_state()
    steps = {}
    for bfloat16 in (False, True):
        learner_.load_state_dict(clone_tree(start))
        torch.set_rng_state(rng)
        learner_.bfloat16 = bfloat16
        for _ in range(4):
            learner_.update(buffer)
        steps[bfloat16] = torch.cat([(p - start["critic_state_dict"][k]).flatten()
                                     for k, p in learner_.critic.state_dict().items() if k.startswith("heads")])
    assert steps[False].norm() > 0
    assert (steps[True] - steps[False]).norm() < 0.1 * steps[False].norm()
    batch = buffer.sample(64)
    with torch.autocast("cpu", torch.bfloat16):
        actions, _ = learner_._policy(learner_._inputs(batch.obs))
        q = learner_.critic(batch.obs, actions)
    assert actions.dtype == q.dtype == torch.float32
    state = learner_.state_dict()
    assert all(t.dtype == torch.float32 for key in ("actor_state_dict", "critic_state_dict")
               for t in state[key].values() if t.is_floating_point())


@pytest.mark.parametrize("actor", ["mlp", "lstm"])
def test_off_policy_checkpoints_resume_bit_for_bit(tmp_path, actor):
    """TD3 with the buffer in its checkpoints: 2 iterations, a checkpoint, a new process's runner
    resuming from it for 2 more, equals 4 iterations straight (actor, critics, buffer; a recurrent
    actor's memory of the episodes under way and the memories its buffer keeps)."""
    overrides = (*SMALL, "agent=td3", "agent.off_policy.checkpoint_buffer=true", *(LSTM if actor == "lstm" else ()))
    straight = make_runner(*overrides)
    straight.learn(4)
    first = make_runner(*overrides, log_dir=tmp_path)
    first.learn(2)
    resumed = make_runner(*overrides)
    resumed.load(tmp_path / "model_2.pt")
    assert resumed.iteration == 2 and resumed.env_steps == 16
    resumed.learn(4)
    for name, a in straight.learner.state_dict()["actor_state_dict"].items():
        assert torch.equal(a, resumed.learner.state_dict()["actor_state_dict"][name]), name
    for name, a in straight.learner.critic.state_dict().items():
        assert torch.equal(a, resumed.learner.critic.state_dict()[name]), name
    assert torch.equal(straight.buffer.rewards, resumed.buffer.rewards)
    if actor == "lstm":
        assert straight.learner.updates > 0 and straight.buffer.memory is not None
        assert torch.equal(straight.buffer.memory, resumed.buffer.memory)
        assert straight.buffer.memory.abs().max() > 0
        for a, b in zip(straight.policy.get_hidden_state(), resumed.policy.get_hidden_state(), strict=True):
            assert torch.equal(a, b)


def test_a_resumed_off_policy_run_goes_on_pushing_the_robots_its_checkpoint_had_pushed(tmp_path):
    """An event's values are sized at its first draw (a push draws 2 numbers per world): resumed,
    the checkpoint's values take their place, and the off-policy rollout (no_grad, not inference
    mode) draws into them in place again. Pushes every 0.1 s: the first iteration has some."""
    overrides = ("task=quadruped_flat", "sim.num_envs=4", "agent=sac", "agent.num_steps_per_env=8",
                 "agent.off_policy.batch_size=16", "agent.off_policy.learning_starts=2",
                 "task.events.push.interval_s=[0.1,0.1]")
    first = make_runner(*overrides, log_dir=tmp_path)
    first.learn(1)
    pushed = first.env.events.terms["push"].values.clone()
    assert pushed.shape == (4, 2) and pushed.isfinite().all()
    resumed = make_runner(*overrides)
    resumed.load(tmp_path / "model_1.pt")
    assert torch.equal(resumed.env.events.terms["push"].values, pushed)
    resumed.learn(2)
    assert not torch.equal(resumed.env.events.terms["push"].values, pushed)


def test_symmetry_augmentation_learns_from_half_of_each_batch_as_its_mirror_image():
    """agent.symmetry.augmentation on an off-policy learner: the second half of every sampled batch
    is the robot's mirror image (commands' v_y and yaw rate, base y velocity, roll and yaw rates
    negated; left and right legs swapped, hips negated, in observations, next observations and
    actions), the first half and the rewards untouched; training with it stays finite."""
    runner = make_runner("task=quadruped_flat", "sim.num_envs=4", "agent=sac", "agent.num_steps_per_env=8",
                         "agent.off_policy.batch_size=16", "agent.off_policy.learning_starts=2",
                         "agent.symmetry.augmentation=true")
    runner.learn(2)
    learner = runner.learner
    assert learner.mirror is not None and learner.updates > 0
    assert all(torch.isfinite(p).all() for p in (*learner.actor.parameters(), *learner.critic.parameters()))
    assert runner.buffer is not None
    batch = runner.buffer.sample(16)
    mixed = learner._mirror_half(batch)
    assert torch.equal(mixed.returns, batch.returns) and torch.equal(mixed.discounts, batch.discounts)
    for name in ("obs", "next_obs"):
        original, mirrored = getattr(batch, name)["critic"], getattr(mixed, name)["critic"]
        assert torch.equal(mirrored[:8], original[:8])
        # base_lin_vel 0:3, base_ang_vel 3:6, velocity_commands 9:12, joint_pos_rel 12:24 (FL, FR, RL, RR x
        # hip, thigh, calf), base_height 48
        assert torch.equal(mirrored[8:, 0:3], original[8:, 0:3] * torch.tensor([1.0, -1.0, 1.0]))
        assert torch.equal(mirrored[8:, 3:6], original[8:, 3:6] * torch.tensor([-1.0, 1.0, -1.0]))
        assert torch.equal(mirrored[8:, 9:12], original[8:, 9:12] * torch.tensor([1.0, -1.0, -1.0]))
        assert torch.equal(mirrored[8:, 12], -original[8:, 15])  # FL hip is FR hip, turned the other way
        assert torch.equal(mirrored[8:, 13:15], original[8:, 16:18])  # FL thigh and calf are FR's
        assert torch.equal(mirrored[8:, 48], original[8:, 48])
        assert not torch.equal(mirrored[8:], original[8:])
    assert torch.equal(mixed.actions[:8], batch.actions[:8])
    assert torch.equal(mixed.actions[8:, 0], -batch.actions[8:, 3])
    assert torch.equal(mixed.actions[8:, 7:9], batch.actions[8:, 10:12])  # RL thigh, calf <- RR's


@pytest.mark.parametrize("learner", ["sac", "td3"])
def test_the_policy_is_the_exponential_average_of_the_actor_at_its_steps_and_resumes(tmp_path, learner):
    """agent.off_policy.policy_average=0.25: after every actor step (every policy_delay-th update) the
    policy's weights move a quarter of the way to the actor's, as computed here from the actor's
    weights after each; its normalizer is the actor's; a checkpoint restores the average."""
    overrides = (*SMALL, f"agent={learner}", "agent.off_policy.policy_average=0.25")
    runner = make_runner(*overrides, log_dir=tmp_path)
    runner.learn(2)
    learner_, buffer = runner.learner, runner.buffer
    expected = [p.detach().clone() for p in runner.policy.parameters()]
    for _ in range(2 * learner_.cfg.policy_delay):
        actor_step = (learner_.updates + 1) % learner_.cfg.policy_delay == 0
        learner_.update(buffer)
        if actor_step:
            expected = [e + 0.25 * (a.detach() - e) for e, a in zip(expected, learner_.actor.parameters())]
    policy = runner.policy
    assert policy is not learner_.actor
    for mine, wanted in zip(policy.parameters(), expected, strict=True):
        assert torch.allclose(mine, wanted, atol=1e-6)
    gap = sum(float((a.detach() - m).abs().sum()) for a, m in zip(learner_.actor.parameters(), policy.parameters()))

    assert gap > 1e-3  # (an average, not the actor)
    for mine, actors in zip(policy.buffers(), learner_.actor.buffers(), strict=True):
        assert torch.equal(mine, actors)
    runner.save(tmp_path / "averaged.pt")
    loaded = make_runner(*overrides)
    loaded.load(tmp_path / "averaged.pt")
    for mine, saved in zip(loaded.policy.parameters(), policy.parameters(), strict=True):
        assert torch.equal(mine, saved)


def test_async_holds_the_update_to_data_ratio_both_ways_and_resumes(tmp_path):
    """agent.mode=async (an actor and a learner thread), 3 updates per env step, at most 2 env
    steps' worth of updates behind: no update runs before the env steps that allow it, the actor
    never acts with the learner further behind, and at the end the learner has run exactly as
    many updates as sync would. Its checkpoint resumes in sync mode."""
    runner = make_runner(*SMALL, "agent=td3", "agent.mode=async", "agent.off_policy.update_to_data=3",
                         "agent.off_policy.max_lag_steps=2", log_dir=tmp_path)
    learner, behind, early = runner.learner, [], []
    act, update = learner.act, learner.update

    def checked_act(obs):
        behind.append(runner._allowed_updates() - learner.updates)
        return act(obs)

    def checked_update(buffer):
        early.append(learner.updates >= runner._allowed_updates())
        time.sleep(0.002)  # a slow learner: the actor has to wait for it
        return update(buffer)

    learner.act, learner.update = checked_act, checked_update
    runner.learn(3)
    assert runner.env_steps == 24 and learner.updates == 3 * (24 - 2 + 1)
    assert not any(early)
    assert max(behind) <= 3 * 2 and max(behind) > 0  # the actor ran ahead, within the bound
    assert runner.history[-1]["actor_wait_s"] > 0
    resumed = make_runner(*SMALL, "agent=td3", "agent.off_policy.update_to_data=3")
    resumed.load(tmp_path / "model_3.pt")
    assert resumed.learner.updates == learner.updates
    resumed.learn(4)
    assert resumed.learner.updates == 3 * (32 - 2 + 1)


def test_a_ppo_checkpoint_is_refused_by_an_off_policy_run_naming_both(tmp_path):
    ppo = make_runner(*SMALL, log_dir=tmp_path)
    ppo.learn(1)
    sac = make_runner(*SMALL, "agent=sac")
    with pytest.raises(Exception, match="agent.learner=ppo, this run is agent.learner=sac"):
        sac.load(tmp_path / "model_1.pt")


def test_off_policy_configs_it_cannot_run_are_refused_by_name():
    with pytest.raises(ConfigError) as e:
        api.validate(compose("task=cartpole", "agent=sac", "agent.mode=dagger", "agent.off_policy.gamma=1.5",
                             "agent.critic.rnn.type=gru", "agent.off_policy.exploration_noise=[0.5,0.1]",
                             "agent.off_policy.policy_average=2"))
    message = str(e.value)
    for expected in ("agent.mode=dagger: agent.learner=sac trains with agent.mode=sync", "agent.off_policy.gamma=1.5",
                     "takes feed-forward critics", "agent.off_policy.exploration_noise=[0.5, 0.1]",
                     "agent.off_policy.policy_average=2.0: must be in [0, 1]"):
        assert expected in message
    with pytest.raises(ConfigError) as e:
        api.validate(compose("task=cartpole", "agent=td3", *LSTM, "agent.off_policy.prioritized=true",
                             "agent.off_policy.buffer_size=7"))
    for expected in ("agent.off_policy.prioritized: a recurrent actor (agent.actor.rnn) replays sequences",
                     "agent.off_policy.buffer_size=7: a recurrent actor replays windows of burn_in + sequence_length "
                     "+ n_step - 1 = 8 steps"):
        assert expected in str(e.value)
    with pytest.raises(ConfigError) as e:
        api.validate(compose("task=quadruped_flat", "agent=sac", "agent.symmetry.mirror_loss=true",
                             "agent.symmetry.augmentation=true", *LSTM))
    for expected in ("agent.symmetry.mirror_loss is PPO's (rsl-rl's extension); agent.learner=sac takes "
                     "agent.symmetry.augmentation=true", "agent.symmetry.augmentation mirrors single transitions: "
                     "it takes a feed-forward actor"):
        assert expected in str(e.value)
    with pytest.raises(ConfigError, match="agent.learner=ddpg: choose ppo, sac or td3"):
        api.validate(compose("task=cartpole", "agent.learner=ddpg"))
    # cart-pole: 4 + 4 observations, an action, a reward (fp32), two flags: 42 bytes per transition
    with pytest.raises(BufferTooLarge, match=r"would need 67\.20 GB \(16 envs x 100000000 steps x 42 bytes per "
                       r"transition\), over agent.off_policy.max_buffer_gb=8"):
        make_runner(*SMALL, "agent=sac", "agent.off_policy.buffer_size=100000000").learn(1)


def test_legion_train_td3_then_export_carries_the_squashing_into_onnx_and_the_runtime_runs_it(tmp_path):
    """`legion train agent=td3` on the quadruped, `legion export`: the ONNX graph ends in tanh times
    the action bound; the edge runtime's actions equal the trained policy's (the actor's average,
    agent.off_policy.policy_average, not the actor) and stay in the bound; `legion eval` measures it
    as it measures PPO's."""
    import onnx

    from legion.sim2real.deploy import OnnxPolicy

    run = tmp_path / "run"
    code, out, err = legion_in_process("train", "task=quadruped_flat", "agent=td3", "sim.num_envs=8",
                                       "agent.max_iterations=2", "agent.num_steps_per_env=4",
                                       "agent.off_policy.batch_size=64", "agent.off_policy.learning_starts=2",
                                       "agent.off_policy.action_bound=2.5", "agent.off_policy.policy_average=0.5",
                                       f"hydra.run.dir={run}")
    assert code == 0, err[-2000:]
    assert "TD3 (replay 1000 steps per env, batch 64, 2 updates per step, in " in out
    assert "[it 2/2]" in out and "critic loss" in out
    code, out, err = legion_in_process("export", f"run={run}")
    assert code == 0, err[-2000:]
    model = onnx.load(run / "exported" / "policy.onnx")
    operators = [node.op_type for node in model.graph.node]
    assert "Tanh" in operators and operators[-1] == "Mul"
    loaded = api.load_run(run, num_envs=8)
    obs = loaded.env.get_observations()
    with torch.inference_mode():
        expected, actor = loaded.runner.policy(obs).numpy(), loaded.runner.learner.actor(obs).numpy()
    actions, _ = OnnxPolicy(run / "exported" / "policy.onnx")(obs["policy"].numpy())
    assert np.abs(actions - expected).max() <= 1e-5 < np.abs(actions - actor).max()
    assert np.abs(actions).max() <= 2.5
    code, out, err = legion_in_process("eval", f"run={run}", "envs=1", "duration_s=0.5", "settle_s=0.2",
                                       'commands={"forward": [0.5, 0, 0]}')
    assert code == 0, err[-2000:]
    assert "forward" in out and (run / "eval" / "model_2.json").is_file()


def test_a_recurrent_td3_run_exports_its_memory_and_squashing_and_the_runtime_carries_them(tmp_path):
    """`legion train agent=td3 agent.actor.rnn.type=lstm`, `legion export`: the ONNX graph carries the
    LSTM's state as inputs and outputs and ends in tanh times the bound; onnxruntime, carrying the
    state, equals the trained actor over 60 steps with episodes restarting."""
    import onnx

    from legion.sim2real.deploy import OnnxPolicy
    from legion.sim2real.deploy.contract import Recurrent

    run = tmp_path / "run"
    code, out, err = legion_in_process("train", "task=cartpole_positions_only", "agent=td3", *LSTM, "sim.num_envs=8",
                                       "agent.max_iterations=2", "agent.num_steps_per_env=8",
                                       "agent.off_policy.batch_size=64", "agent.off_policy.action_bound=2.5",
                                       f"hydra.run.dir={run}")
    assert code == 0, err[-2000:]
    assert "[it 2/2]" in out and "critic loss" in out
    code, out, err = legion_in_process("export", f"run={run}")
    assert code == 0, err[-2000:]
    operators = [node.op_type for node in onnx.load(run / "exported" / "policy.onnx").graph.node]
    assert "LSTM" in operators and "Tanh" in operators
    policy = OnnxPolicy(run / "exported" / "policy.onnx")
    assert policy.recurrent == Recurrent(type="lstm", hidden_size=16, num_layers=1)
    loaded = api.load_run(run, num_envs=8)
    env, actor = loaded.env, loaded.runner.policy
    state, error, restarts = policy.initial_state(8), 0.0, 0
    with torch.inference_mode():
        actor.reset()
        obs = env.get_observations()
        for _ in range(60):
            actions = actor(obs)
            onnx_actions, state = policy(obs["policy"].numpy(), state)
            error = max(error, float(np.abs(onnx_actions - actions.numpy()).max()))
            assert np.abs(onnx_actions).max() <= 2.5
            obs, _, dones, _ = env.step(actions)
            actor.reset(dones)
            for s in state:
                s[:, dones.numpy()] = 0.0
            restarts += int(dones.sum())
    assert restarts > 0 and error <= 1e-5, error
