"""Recurrent actor-critic (agent.actor.rnn / agent.critic.rnn: rsl-rl's RNNModel): the state ends
exactly with the episodes that ended, the asynchronous learner re-evaluates the actor on the
actor's own sequences, a recurrent policy learns, and it exports with its state carried by the
edge runtime."""

import numpy as np
import pytest
import torch

from conftest import compose, export_untrained_run, make_env, make_runner
from legion.agents.ppo import (
    RolloutBuffer,
    build_behaviour_ppo,
    build_ppo,
    compute_returns_off_policy,
    load_weights,
    policy_state,
)

SMALL = ("task=cartpole", "sim.num_envs=32", "agent.num_steps_per_env=8")
LSTM = ("agent.actor.rnn.type=lstm", "agent.actor.rnn.hidden_size=32")


def _states(model) -> list[torch.Tensor]:
    state = model.get_hidden_state()
    return [t.clone() for t in (state if isinstance(state, tuple) else (state,))]


def test_the_recurrent_state_ends_exactly_with_the_episodes_that_ended():
    runner = make_runner(*SMALL, *LSTM, "agent.critic.rnn.type=gru")
    ppo, env = runner.ppo, runner.env
    obs, checked = env.get_observations(), 0
    with torch.inference_mode():
        while checked < 3:
            if ppo.storage.step == ppo.storage.num_transitions_per_env:
                ppo.storage.clear()
            actions = ppo.act(obs)
            before = _states(ppo.actor) + _states(ppo.critic)  # LSTM: h and c; GRU: h
            obs, rewards, dones, extras = env.step(actions)
            ppo.process_env_step(obs, rewards, dones, extras)
            ended = dones.bool()
            if not 0 < ended.sum() < len(ended):
                continue
            for old, new in zip(before, _states(ppo.actor) + _states(ppo.critic), strict=True):
                assert old[:, ended].abs().max() > 0  # there was a state to end
                assert torch.equal(new[:, ended], torch.zeros_like(new[:, ended]))
                assert torch.equal(new[:, ~ended], old[:, ~ended])  # the others' untouched
            checked += 1


def test_the_async_learner_reevaluates_a_recurrent_actor_on_the_actors_own_sequences():
    """With the behaviour's weights equal to the learner's, re-evaluation gives back the
    behaviour's log-probs (ratios of 1) only if each trajectory starts from the state the actor
    carried into it: a rollout that starts mid-episode needs the state from the rollout before."""
    env = make_env(*SMALL)
    cfg = compose(*SMALL, *LSTM).agent
    rollout = RolloutBuffer(env, 8, "cpu")
    learner = build_ppo(env, cfg, "cpu", storage=rollout)
    behaviour = build_behaviour_ppo(env, cfg, "cpu", critic=False)
    load_weights(behaviour, policy_state(learner), critic=False)
    behaviour.storage = rollout
    obs = env.get_observations()
    with torch.inference_mode():
        for step in range(16):
            if step == 8:
                rollout.clear()  # the second rollout starts from the state the first one left
            obs, rewards, dones, extras = env.step(behaviour.act(obs))
            behaviour.process_env_step(obs, rewards, dones, extras)
            rollout.time_outs[step % 8].copy_(extras["time_outs"].view(-1, 1))
        rollout.last_obs.copy_(obs)
        behaviour_log_prob = rollout.actions_log_prob.clone()
        saved = rollout.saved_hidden_state_a  # LSTM: [h, c], each (steps, layers, envs, hidden)
        assert saved is not None and rollout.dones.any() and saved[0][0].abs().max() > 0
        compute_returns_off_policy(learner, rollout, rho_clip=1.0, c_clip=1.0)
        assert torch.allclose(rollout.actions_log_prob, behaviour_log_prob, atol=1e-5)
        for state in saved:  # forget the carried state: the ratios are no longer 1
            state.zero_()
        compute_returns_off_policy(learner, rollout, rho_clip=1.0, c_clip=1.0)
        assert not torch.allclose(rollout.actions_log_prob, behaviour_log_prob, atol=1e-3)


def test_an_lstm_policy_learns_cartpole_with_async_ppo(seed, learned):
    """Over training seeds 0-19 the episode length grew 4.3-10.8 times (mean 7.3, sd 1.5): the
    bound, 3, is below every seed and 3.0 sd below the mean. (Async with a lag of 1: which policy
    acts at which step depends on timing, so a seed's figure varies from run to run as well.)"""
    runner = make_runner("task=cartpole", *LSTM, "agent.mode=async", "agent.max_policy_lag=1", f"seed={seed}")
    runner.learn(2)
    start_length = runner.mean_episode_length
    runner.learn(12)
    print(f"episode length {start_length:.1f} -> {runner.mean_episode_length:.1f} after {runner.iteration} iterations")
    learned(length_ratio=(runner.mean_episode_length / start_length, 3.0))


@pytest.mark.parametrize("overrides, message", [
    (("agent.mode=async", "agent.max_policy_lag=1", "agent.critic.rnn.type=gru"),
     "agent.critic.rnn.type=gru needs agent.max_policy_lag=0 or agent.mode=sync"),
    (("agent.actor.rnn.type=rnn",), r"agent.actor.rnn.type='rnn': expected lstm, gru or null"),
    (("agent.actor.rnn.type=gru", "agent.symmetry.mirror_loss=true"),
     r"agent.symmetry \(augmentation or mirror_loss\) needs a feed-forward actor and critic"),
])
def test_recurrent_configs_that_cannot_work_are_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_runner(*SMALL, *overrides)


def test_a_recurrent_run_exports_and_the_runtime_carries_and_resets_its_state(tmp_path):
    """`legion export` of a GRU run; onnxruntime equals torch over 200 steps of 4 robots with
    episodes restarting in between (state carried, zeroed where an episode restarts); a new
    ControlLoop starts the runtime's policy afresh."""
    from legion.sim2real.deploy import ControlLoop, OnnxPolicy, PolicyRunner
    from legion.sim2real.deploy.contract import Recurrent

    made = export_untrained_run(tmp_path, "task=quadruped_flat", "agent.actor.rnn.type=gru",
                                "agent.actor.rnn.hidden_size=32", "agent.actor.rnn.num_layers=2")
    assert made["report"]["policy.onnx"]["max_abs_diff"] <= 1e-5
    env, actor = made["env"], made["runner"].ppo.get_policy()
    policy = OnnxPolicy(made["out"] / "policy.onnx")
    assert policy.recurrent == Recurrent(type="gru", hidden_size=32, num_layers=2)
    state, error, restarts = policy.initial_state(env.num_envs), 0.0, 0
    with torch.inference_mode():
        actor.reset()
        obs = env.get_observations()
        for step in range(200):
            actions = actor(obs)
            onnx_actions, state = policy(obs["policy"].numpy(), state)
            error = max(error, float(np.abs(onnx_actions - actions.numpy()).max()))
            obs, _, _, _ = env.step(actions + 0.3 * torch.randn_like(actions))
            if step % 40 == 39:  # robots 0 and 2 start new episodes
                restart = torch.tensor([True, False, True, False])
                actor.reset(restart.float())
                for s in state:
                    s[:, restart.numpy()] = 0.0
                restarts += 1
    assert restarts == 5 and error <= 1e-5, error

    runner = PolicyRunner(made["out"] / "policy.onnx")
    runner.hidden = [np.ones_like(s) for s in runner.hidden]
    runner.last_action[:] = 1.0
    ControlLoop(object(), runner)  # type: ignore[arg-type]  (the loop reads the robot only when it ticks)
    assert all(not s.any() for s in runner.hidden) and not runner.last_action.any()


@pytest.mark.bit_exact
def test_a_recurrent_run_resumes_bit_identically_on_the_cpu_in_sync_mode(tmp_path, capsys):
    """Four iterations in one go, and two, a checkpoint, and two more in a new runner from it: the
    same weights, physics and recurrent states bit for bit. The quadruped has what a resume must
    carry over: episodes in progress with their commands, timers and pushes, action and
    observation noise from the env's generator, contacts and MuJoCo's warm start (C backend)."""
    overrides = ("task=quadruped_flat", "sim.num_envs=8", "agent.num_steps_per_env=8", "agent.save_interval=2",
                 "agent.actor.rnn.type=lstm", "agent.actor.rnn.hidden_size=32", "agent.critic.rnn.type=gru",
                 "agent.critic.rnn.hidden_size=32")
    straight = make_runner(*overrides)
    straight.learn(4)
    make_runner(*overrides, log_dir=tmp_path).learn(2)
    resumed = make_runner(*overrides)
    resumed.load(tmp_path / "model_2.pt")
    resumed.learn(4)
    assert resumed.env.sim.backend == "c"  # the CPU default
    for model in ("actor", "critic"):
        a, b = getattr(straight.ppo, model).state_dict(), getattr(resumed.ppo, model).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
        for x, y in zip(_states(getattr(straight.ppo, model)), _states(getattr(resumed.ppo, model)), strict=True):
            assert torch.equal(x, y)
    assert torch.equal(straight.env.sim.joint_q, resumed.env.sim.joint_q)
    assert straight.history[-1]["mean_reward"] == resumed.history[-1]["mean_reward"]

    # Another number of envs: the weights resume, the episodes start afresh, and the note says so.
    other = make_runner(*overrides[:1], "sim.num_envs=4", *overrides[2:])
    other.load(tmp_path / "model_2.pt")
    assert "its episodes in progress are not restored (it ran 8 envs, this run 4)" in capsys.readouterr().out
    other.learn(3)
    assert other.iteration == 3
