"""Asynchronous PPO (agent.mode=async): equals sync PPO at lag 0, bounds the policy lag under a
slow learner or a slow actor, V-trace targets, errors and Ctrl-C stop both threads, and a
killed run resumes at the next iteration with its learning rate and normalizer statistics."""

import _thread
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

import pytest
import torch

from conftest import ROOT, compose, ctrl_c_inside_a_finalizer, make_env, make_runner
from legion.agents.async_runner import AsyncRunner
from legion.agents.checkpoints import latest_checkpoint, load_checkpoint
from legion.agents.ppo import RolloutBuffer, build_behaviour_ppo, build_ppo, compute_returns_off_policy, vtrace
from legion.agents.runner import TrainingDiverged

SMALL = ("task=cartpole", "sim.num_envs=32", "agent.num_steps_per_env=8")
STEPS, ENVS = 8, 32


def _runner(*overrides, env=None, log_dir=None):
    return make_runner(*SMALL, *overrides, env=env, log_dir=log_dir)


@pytest.fixture(scope="module")
def env():
    """One small cart-pole env for the tests that only need an env to run on."""
    return make_env(*SMALL)


def _no_worker_threads() -> bool:
    return not [t for t in threading.enumerate() if t.name.startswith("legion-")]


def _normalizers(runner):
    return [runner.ppo.actor.obs_normalizer, runner.ppo.critic.obs_normalizer]


@pytest.mark.bit_exact
@pytest.mark.parametrize("networks", [(), ("agent.actor.rnn.type=lstm", "agent.critic.rnn.type=gru")],
                         ids=["mlp", "recurrent"])
def test_async_with_lag_0_equals_sync_bit_for_bit(networks):
    sync = _runner("agent.mode=sync", *networks)
    sync.learn(3)
    lag0 = _runner("agent.mode=async", "agent.max_policy_lag=0", *networks)
    assert isinstance(lag0, AsyncRunner)
    lag0.learn(3)
    assert lag0.iteration == sync.iteration == 3
    assert [h["lag_max"] for h in lag0.history] == [0, 0, 0]
    for model in ("actor", "critic"):  # weights and the normalizers' running statistics
        a, b = getattr(sync.ppo, model).state_dict(), getattr(lag0.ppo, model).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), model
    opt_a, opt_b = sync.ppo.optimizer.state_dict()["state"], lag0.ppo.optimizer.state_dict()["state"]
    assert all(torch.equal(opt_a[i]["exp_avg_sq"], opt_b[i]["exp_avg_sq"]) for i in opt_a)
    assert sync.ppo.learning_rate == lag0.ppo.learning_rate
    assert list(sync.log.recent) == list(lag0.log.recent) and sync.log.episodes > 0  # the same episodes
    assert _no_worker_threads()


@pytest.mark.bit_exact
def test_an_update_with_the_machine_to_itself_takes_every_core_and_learns_the_same():
    """agent.update_threads: sync's update, and async's while the actor waits for it, runs with that
    many torch threads; the env steps with the process's (1 under the tests); the weights come out
    bit for bit those of one thread. Big enough mini-batches (512 x 512) that MKL splits them."""
    sizes = ("sim.num_envs=256", "agent.actor.hidden_dims=[512,512]", "agent.critic.hidden_dims=[512,512]")
    runners, seen = {}, {}
    for name, overrides in (("sync, 1 thread", ("agent.mode=sync",)),
                            ("sync, 2 threads", ("agent.mode=sync", "agent.update_threads=2")),
                            ("async lag 0, 2 threads",
                             ("agent.mode=async", "agent.max_policy_lag=0", "agent.update_threads=2"))):
        runner = runners[name] = _runner(*sizes, *overrides)  # seeded: built and trained before the next
        threads = seen[name] = {"update": set(), "batches": set(), "env": set()}
        update, step = runner.ppo.update, runner.env.step
        runner.ppo.update = lambda update=update, threads=threads: (threads["update"].add(torch.get_num_threads()),
                                                                     update())[1]
        runner.env.step = lambda actions, step=step, threads=threads: (threads["env"].add(torch.get_num_threads()),
                                                                        step(actions))[1]
        buffers = getattr(runner, "buffers", [runner.ppo.storage])
        for buffer in buffers:
            before = buffer.before_batch or (lambda: None)
            buffer.before_batch = lambda before=before, threads=threads: (
                before(), threads["batches"].add(torch.get_num_threads()))
        runner.learn(3)
        assert torch.get_num_threads() == 1, f"{name}: the main thread's torch threads came back changed"
    assert seen["sync, 1 thread"] == {"update": {1}, "batches": {1}, "env": {1}}
    assert seen["sync, 2 threads"] == {"update": {2}, "batches": {2}, "env": {1}}
    # async: the learner's first mini-batch may begin before the actor waits (1 thread), then 2
    assert 2 in seen["async lag 0, 2 threads"]["batches"] and seen["async lag 0, 2 threads"]["env"] == {1}
    reference = runners["sync, 1 thread"].ppo
    for name in ("sync, 2 threads", "async lag 0, 2 threads"):
        for model in ("actor", "critic"):
            a, b = getattr(reference, model).state_dict(), getattr(runners[name].ppo, model).state_dict()
            assert all(torch.equal(a[k], b[k]) for k in a), f"{name}: {model}"


def test_a_negative_update_thread_count_is_refused_by_name(env):
    with pytest.raises(ValueError, match=r"agent.update_threads=-1: give a thread count >= 1"):
        _runner("agent.update_threads=-1", env=env)


@pytest.mark.parametrize("slow", ["learner", "actor"])
def test_policy_lag_stays_bounded_with_a_slow_side(env, slow, capsys):
    runner = _runner("agent.mode=async", "agent.max_policy_lag=1", env=env)
    if slow == "learner":
        update = runner.ppo.update
        runner.ppo.update = lambda: (time.sleep(0.15), update())[1]
    else:
        step = env.step
        env.step = lambda actions: (time.sleep(0.03), step(actions))[1]
    try:
        runner.learn(6)
    finally:
        env.__dict__.pop("step", None)
    history = list(runner.history)[1:]  # the first iteration has nothing to overlap with
    assert max(h["lag_max"] for h in history) <= 1
    assert all(h["rollouts_ahead"] <= 2 for h in history)  # two buffers; nothing queues beyond them
    if slow == "learner":
        # Backpressure: the actor waits for each update (a rollout takes ~10 ms, an update 150+ ms)
        # and then collects with the previous policy, so every sample lags by exactly 1.
        assert all(h["actor_wait_s"] > 0.05 for h in history)
        assert all(h["lag_mean"] == 1 for h in history)
        assert "warning: the learner is behind" in capsys.readouterr().out
    else:
        # The learner waits for data, and the actor swaps in each new policy mid-rollout.
        assert all(h["learner_wait_s"] > 0.05 for h in history)
        assert all(h["lag_mean"] < 1 for h in history)
        assert "learner is behind" not in capsys.readouterr().out


def test_lag_bound_2_is_reached_and_held(env):
    runner = _runner("agent.mode=async", "agent.max_policy_lag=2", env=env)
    update = runner.ppo.update
    runner.ppo.update = lambda: (time.sleep(0.1), update())[1]
    runner.learn(6)
    lags = [h["lag_max"] for h in runner.history]
    assert max(lags) == 2 and lags[-1] == 2
    assert all(h["rollouts_ahead"] <= 3 for h in runner.history)


def test_vtrace_matches_a_hand_computed_example():
    # T = 3 steps of one env, gamma 0.9, lambda 0.5, clips 1.0; the episode ends after step 1.
    values = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
    rewards = torch.tensor([1.0, 0.5, 2.0]).view(3, 1, 1)
    dones = torch.tensor([0, 1, 0]).view(3, 1, 1)
    last_values = torch.tensor([[4.0]])
    log_rhos = torch.log(torch.tensor([0.5, 2.0, 0.8])).view(3, 1, 1)  # pi/mu; 2.0 is clipped to 1
    # step 2: delta = 2 + 0.9*4 - 3 = 2.6.     A = 2.6;  v - V = 0.8*2.6 = 2.08;  v = 5.08
    # step 1: done, delta = 0.5 - 2 = -1.5.    A = -1.5; v - V = 1*(-1.5) (no bootstrap past the end); v = 0.5
    # step 0: delta = 1 + 0.9*2 - 1 = 1.8.     A = 1.8 + 0.9*0.5*(-1.5) = 1.125
    #         v - V = 0.5*1.8 + 0.9*0.5*0.5*(-1.5) = 0.5625;  v = 1.5625
    targets, advantages = vtrace(values, rewards, dones, last_values, log_rhos, gamma=0.9, lam=0.5)
    assert torch.allclose(targets.view(-1), torch.tensor([1.5625, 0.5, 5.08]), atol=1e-6)
    assert torch.allclose(advantages.view(-1), torch.tensor([1.125, -1.5, 2.6]), atol=1e-6)

    # rho and c clipped at 2 instead: step 1's correction doubles to -3 and step 0 sees it.
    targets, advantages = vtrace(values, rewards, dones, last_values, log_rhos, gamma=0.9, lam=0.5,
                                 rho_clip=2.0, c_clip=2.0)
    assert torch.allclose(targets.view(-1), torch.tensor([1.0 + 0.9 + 0.9 * 0.5 * 0.5 * -3.0, -1.0, 5.08]), atol=1e-6)
    assert torch.allclose(advantages.view(-1), torch.tensor([1.8 + 0.9 * 0.5 * -3.0, -1.5, 2.6]), atol=1e-6)


def test_vtrace_on_policy_is_rsl_rl_gae(env):
    """Ratios of 1 (the policy that acted is the learner's): V-trace is GAE, the same bits."""
    cfg = compose(*SMALL).agent
    ppo = build_ppo(env, cfg, "cpu")
    obs = env.get_observations()
    with torch.inference_mode():
        for _ in range(STEPS):
            obs, rewards, dones, extras = env.step(ppo.act(obs))
            ppo.process_env_step(obs, rewards, dones, extras)
        st = ppo.storage
        targets, advantages = vtrace(st.values, st.rewards, st.dones, ppo.critic(obs), torch.zeros_like(st.values),
                                     ppo.gamma, ppo.lam)
        ppo.normalize_advantage_per_mini_batch = True  # keep rsl-rl's advantages unnormalized to compare
        ppo.compute_returns(obs)
    assert st.dones.any()  # the example covers episode ends
    assert torch.equal(targets, st.returns)
    # rsl-rl takes advantages as returns - values: one rounding away from the recursion's own value.
    assert torch.allclose(advantages, st.advantages, atol=1e-6, rtol=0)


def test_stale_rollout_is_learned_from_the_learners_policy_with_truncated_weights(env):
    """Decoupled PPO: after compute_returns_off_policy, the rollout's log-probs and distribution are
    the learner's own (the update's first ratio is 1 and its KL 0, as in sync PPO) and each
    advantage is weighted by min(1, pi_learner / pi_behaviour)."""
    cfg = compose(*SMALL).agent
    learner = build_ppo(env, cfg, "cpu", storage=RolloutBuffer(env, STEPS, "cpu"))
    behaviour = build_behaviour_ppo(env, cfg, "cpu", critic=False)  # other initial weights: a stale policy
    behaviour.storage = rollout = learner.storage
    obs = env.get_observations()
    with torch.inference_mode():
        for step in range(STEPS):
            obs, rewards, dones, extras = env.step(behaviour.act(obs))
            behaviour.process_env_step(obs, rewards, dones, extras)
            rollout.time_outs[step].copy_(extras["time_outs"].view(-1, 1))
        rollout.last_obs.copy_(obs)
        behaviour_log_prob = rollout.actions_log_prob.clone()
        compute_returns_off_policy(learner, rollout, rho_clip=1.0, c_clip=1.0)

        flat_obs = rollout.observations.flatten(0, 1)
        learner.actor(flat_obs, stochastic_output=True)
        learner_log_prob = learner.actor.get_output_log_prob(rollout.actions.flatten(0, 1)).view(STEPS, ENVS, 1)
        kl = learner.actor.get_kl_divergence(tuple(p.flatten(0, 1) for p in rollout.distribution_params),
                                             learner.actor.output_distribution_params)
        values = learner.critic(flat_obs).view(STEPS, ENVS, 1)
        _, advantages = vtrace(values, rollout.rewards, rollout.dones, learner.critic(obs),
                               learner_log_prob - behaviour_log_prob, learner.gamma, learner.lam)
    assert torch.allclose(rollout.actions_log_prob, learner_log_prob, atol=1e-5)
    assert kl.abs().max() < 1e-5
    weights = torch.exp(learner_log_prob - behaviour_log_prob).clamp(max=1.0)
    assert 0.01 < weights.min() < 0.9 and weights.max() == 1.0  # both sides of the clip occur
    normalized = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    assert torch.allclose(rollout.advantages, normalized * weights, atol=1e-5)


def test_actor_exception_surfaces_in_the_main_thread_within_a_second(env):
    runner = _runner("agent.mode=async", env=env)
    step, calls, raised_at = env.step, [0], []

    def step_that_breaks(actions):
        calls[0] += 1
        if calls[0] == 20:  # during the third rollout, while the learner updates
            raised_at.append(time.perf_counter())
            raise RuntimeError("physics exploded")
        return step(actions)

    env.step = step_that_breaks
    try:
        with pytest.raises(RuntimeError, match="physics exploded") as error:
            runner.learn(1000)
        caught_after = time.perf_counter() - raised_at[0]
    finally:
        del env.step
    assert caught_after < 1.0
    frames = "".join(traceback.format_tb(error.value.__traceback__))
    assert "step_that_breaks" in frames and "_actor_loop" in frames  # the original traceback
    assert _no_worker_threads()


def test_learner_exception_stops_the_actor(env):
    runner = _runner("agent.mode=async", env=env)
    runner.ppo.update = lambda: 1 / 0
    with pytest.raises(ZeroDivisionError):
        runner.learn(1000)
    assert _no_worker_threads()


def test_timed_snapshots_and_ctrl_c_snapshot_are_consistent(env, tmp_path):
    """Snapshots every 0.3 s while both workers run, then Ctrl-C: every file is a version boundary."""
    runner = _runner("agent.mode=async", "agent.save_interval=1000", "agent.save_every_minutes=0.005",
                     env=env, log_dir=tmp_path)
    update = runner.ppo.update
    runner.ppo.update = lambda: (time.sleep(0.05), update())[1]
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        runner.learn(None)  # until stopped
    assert _no_worker_threads()
    k = runner.iteration
    assert k > 0 and latest_checkpoint(tmp_path).name == f"model_{k}.pt"
    snapshots = sorted(tmp_path.glob("model_*.pt"))
    assert len(snapshots) >= 3  # timed ones, plus the one Ctrl-C wrote
    for path in snapshots:
        checkpoint = load_checkpoint(path)
        # The normalizer has seen exactly `iteration` rollouts: never a half-done update.
        it = checkpoint["iteration"]
        assert path.name == f"model_{it}.pt"
        assert checkpoint["policy"]["actor_state_dict"]["obs_normalizer.count"] == it * STEPS * ENVS
        assert ("env" in checkpoint) == hasattr(env, "state_dict")  # randomization ranges, curriculum


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_ctrl_c_handled_inside_a_finalizer_still_stops_training_within_a_second(env, tmp_path, mode):
    """Python drops a KeyboardInterrupt raised inside a finalizer ("Exception ignored"): that is
    how a Ctrl-C went missing while the garbage collector ran in the main thread, and a
    continuous run went on writing snapshots. The runners turn the signal into a flag instead:
    the envs stop stepping within a second, then the checkpoint is written."""
    runner = _runner(f"agent.mode={mode}", env=env, log_dir=tmp_path)
    record, step, stepped_at, handled = runner.log.record, env.step, [], []

    def record_then_collect(report):
        record(report)
        if report["iteration"] == 2:
            handled.append(ctrl_c_inside_a_finalizer())

    def timed_step(actions):
        stepped_at.append(time.perf_counter())
        return step(actions)

    runner.log.record, env.step = record_then_collect, timed_step
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.learn(None)  # until stopped
    finally:
        del env.step
    handled_at = handled[0]
    assert stepped_at[-1] - handled_at < 1.0 and time.perf_counter() - handled_at < 10.0
    assert _no_worker_threads()
    assert latest_checkpoint(tmp_path).name == f"model_{runner.iteration}.pt" and runner.iteration >= 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_nan_update_is_skipped_for_the_last_good_weights_and_repeated_ones_stop_with_a_checkpoint(
        env, tmp_path, mode, capsys):
    """NaN weights part-way through update 2 (once: its first mini-batch makes the action std NaN and
    the next one's sampling raises inside torch), then after every update from 4 on."""
    runner = _runner(f"agent.mode={mode}", "agent.save_interval=1", "agent.max_nonfinite_updates=2",
                     env=env, log_dir=tmp_path)
    update, updates = runner.ppo.update, []

    def poison():
        with torch.no_grad():
            runner.ppo.actor.mlp[0].weight[0, 0] = float("nan")

    def update_then_poison():
        updates.append(1)
        if len(updates) == 2:
            # Async saves the published copy as the main thread books each iteration: let it book 1
            # before this update (cut short by the NaN) publishes 2, so that model_1.pt is iteration 1's.
            deadline = time.monotonic() + 60
            while not (tmp_path / "model_1.pt").is_file() and time.monotonic() < deadline:
                time.sleep(0.01)
            poison()
        losses = update()
        if len(updates) >= 4:
            poison()
        return losses

    runner.ppo.update = update_then_poison
    with pytest.raises(TrainingDiverged) as diverged:
        runner.learn(100)
    out = capsys.readouterr().out
    message = str(diverged.value)
    assert "made actor NaN/Inf in 2 iterations in a row (4-5); stopped. The last good weights are saved in" in message
    for cause in ("agent.algorithm.learning_rate=0.001", "task.rewards", "task.observations scale",
                  "obs_normalization"):
        assert cause in message
    assert ("iteration 2: the PPO update made value loss, surrogate loss, entropy loss, actor NaN/Inf; it was skipped "
            "and the weights from before it restored (1 in a row; 2 stop training") in out
    assert "iteration 3: the PPO" not in out and "iteration 4: the PPO" in out and "iteration 5: the PPO" in out
    assert _no_worker_threads()

    def actor(it):
        return load_checkpoint(tmp_path / f"model_{it}.pt")["policy"]["actor_state_dict"]["mlp.0.weight"]

    assert torch.equal(actor(2), actor(1))  # update 2 skipped: iteration 1's weights
    assert not torch.equal(actor(3), actor(2)) and torch.isfinite(actor(3)).all()  # update 3 learned
    newest = load_checkpoint(latest_checkpoint(tmp_path))
    assert torch.equal(newest["policy"]["actor_state_dict"]["mlp.0.weight"], actor(3))  # the last good weights
    assert all(torch.isfinite(t).all() for t in newest["policy"]["actor_state_dict"].values())


def test_sigterm_writes_a_final_checkpoint_and_exits_cleanly(tmp_path):
    """Preemption: SIGTERM stops a continuous run as Ctrl-C does, exit code 0."""
    args = [*SMALL, "agent.mode=async", "agent.max_iterations=null", "agent.save_interval=1000"]
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([sys.executable, "-m", "legion", "train", *args], cwd=tmp_path, env=environ,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in run.stdout:  # until training runs
            if line.startswith("[it 3]"):
                break
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 0, out[-3000:]
    assert "stopped by SIGTERM" in out and "Traceback" not in out
    run_dir = next(tmp_path.glob("runs/cartpole/*"))
    assert load_checkpoint(latest_checkpoint(run_dir))["iteration"] >= 3


def test_killed_run_resumes_at_the_next_iteration_with_its_learning_rate_and_normalizer(tmp_path):
    """SIGKILL a continuous async run after its second snapshot, then `legion train resume=`."""
    args = [*SMALL, "agent.mode=async", "agent.max_iterations=null", "agent.save_interval=2",
            "agent.algorithm.schedule=adaptive"]
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen([sys.executable, "-m", "legion", "train", *args], cwd=tmp_path, env=environ,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(tmp_path.glob("runs/cartpole/*/model_4.pt")):
            assert run.poll() is None, run.stdout.read()[-3000:]
            time.sleep(0.2)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    run_dir = next(tmp_path.glob("runs/cartpole/*"))
    snapshot_path = latest_checkpoint(run_dir)
    snapshot = load_checkpoint(snapshot_path)
    k = snapshot["iteration"]
    assert k >= 4 and k % 2 == 0
    actor = snapshot["policy"]["actor_state_dict"]
    assert actor["obs_normalizer.count"] == k * STEPS * ENVS  # taken between updates, never mid-update

    resumed = subprocess.run([sys.executable, "-m", "legion", "train", f"resume={run_dir}",
                              f"agent.max_iterations={k + 1}"], cwd=tmp_path, env=environ,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout
    assert f"at iteration {k} (learning rate {snapshot['policy']['learning_rate']:.3g})" in out
    assert f"[it {k + 1}/{k + 1}]" in out and f"[it {k}/" not in out and "async PPO" in out
    after = load_checkpoint(run_dir / f"model_{k + 1}.pt")["policy"]["actor_state_dict"]
    # One more rollout folded into the snapshot's running statistics (not a fresh normalizer).
    assert after["obs_normalizer.count"] == (k + 1) * STEPS * ENVS
