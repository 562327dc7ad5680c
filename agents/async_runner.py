"""Asynchronous PPO: the actor collects rollout k+1 while the learner updates on rollout k.

    main thread     starts both workers, books telemetry, writes snapshots, re-raises errors,
                    stops both on Ctrl-C or SIGTERM (legion.StopRequests)
    actor thread    steps the env with a copy of the policy into rollout buffer k % (L + 1)
    learner thread  takes finished rollouts in order, corrects for their lag, runs rsl-rl's
                    PPO update, publishes the new policy version

Policy versions. The learner's version is its number of updates (= ``iteration``); every step
in a rollout buffer records the version that chose its action. Rollout k may only start once
version k - L is published (L = ``agent.max_policy_lag``), so no transition is more than L
updates older than the learner that uses it, at most L + 1 buffers exist, and a learner slower
than the actor makes the actor wait (backpressure) instead of letting a queue grow. The actor
picks up a newer version at any step boundary (one copy of weights and normalizers), so the
lag is often below L.

Lag 0 is sync PPO run by two threads: the actor starts rollout k only after update k - 1, acts
with rsl-rl's ``PPO.act`` (values included) and the learner uses rsl-rl's GAE; same seed, same
weights, bit for bit. Lag >= 1: the actor has no critic (:class:`legion.agents.ppo.NoCritic`)
and the learner re-evaluates the
rollout with its current networks, V-trace targets and the decoupled PPO objective
(:func:`legion.agents.ppo.compute_returns_off_policy`).
Which version acts at which step then depends on timing, so lag >= 1 runs are not
bit-reproducible.

Threads, not processes. On CPU the two threads run in parallel where the time goes: Warp
kernels, Warp graph replay and torch kernels release the GIL. ``bench/overlap.py`` measured two
processes against two threads (BENCHMARKS.md): equal for the quadruped (1.96 vs 1.98 cores'
worth of work on 2 cores), 6% better for cart-pole, whose small-tensor Python loops contend for
the GIL; not worth rollouts and weights in shared memory. Only the actor thread touches the env:
Warp's CPU kernels must not run in two threads at once (see ``legion.tasks.sim``).

CUDA. The actor keeps torch's legacy default stream, which Warp's own (blocking) stream
synchronizes with implicitly; the learner gets a torch stream of its own (non-blocking), and
CUDA events order every handover (rollout -> learner, weights -> actor). On CPU those events
are ``None``: CPU ops complete before the call returns. (This path has not yet run on a GPU:
no GPU was lent to the project's sessions so far.)
"""

from __future__ import annotations

import contextlib
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from typing import cast

import torch

from legion.agents.ppo import (
    RolloutBuffer,
    Stopped,
    build_behaviour_ppo,
    clone_tree,
    compute_returns_off_policy,
    load_policy_state,
    load_weights,
    policy_state,
    restore_if_nonfinite,
    update,
)
from legion.agents.runner import Runner
from legion.configs.schema import Agent

# Warn when the actor waited for the learner more than this share of an iteration ...
BEHIND_FRACTION = 0.1
# ... this many iterations in a row.
BEHIND_ITERATIONS = 3


def _record_event(device: torch.device) -> torch.cuda.Event | None:
    """CUDA: an event after the work queued so far on this thread's stream; CPU: None."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _wait_event(event: torch.cuda.Event | None, device: torch.device) -> None:
    """CUDA: this thread's stream waits (on the GPU, not the host) until ``event`` has passed."""
    if event is not None:
        torch.cuda.current_stream(device).wait_event(event)


def _used_on_this_stream(tree, device: torch.device) -> None:
    """CUDA: tensors made on another stream and read on this one must not be recycled by the
    caching allocator before this stream has read them."""
    if isinstance(tree, torch.Tensor):
        if tree.is_cuda:
            tree.record_stream(torch.cuda.current_stream(device))
    elif isinstance(tree, dict):
        for value in tree.values():
            _used_on_this_stream(value, device)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            _used_on_this_stream(value, device)


class WaitClock:
    """Total time one thread spent waiting, readable by another thread (a wait in progress included)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._total, self._since = 0.0, None

    @contextlib.contextmanager
    def waiting(self):
        with self._lock:
            self._since = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._total += time.perf_counter() - self._since
                self._since = None

    @property
    def is_waiting(self) -> bool:
        return self._since is not None

    def read(self, now: float) -> float:
        with self._lock:
            return self._total + (now - self._since if self._since is not None else 0.0)


@dataclass
class Published:
    """One policy version, as the learner hands it out: never modified after publishing."""

    version: int
    state: dict  # a copy of policy_state(): networks + normalizers, optimizer, learning rate
    torch_rng: torch.Tensor
    ready: torch.cuda.Event | None  # CUDA event after the copy (None on CPU)


class AsyncRunner(Runner):
    """Asynchronous actor-learner PPO on one device. Same arguments, checkpoints, stop handling
    and telemetry as :class:`legion.agents.runner.Runner`, plus the ``agent`` keys
    ``max_policy_lag`` and ``vtrace.rho_clip`` / ``vtrace.c_clip``."""

    def __init__(self, env, cfg: Agent, log_dir=None, device: str = "cpu", group=None):
        super().__init__(env, cfg, log_dir, device, group)
        self.max_lag = cfg.max_policy_lag
        if self.max_lag < 0:
            raise ValueError(f"agent.max_policy_lag must be >= 0, got {self.max_lag}")
        if self.max_lag > 0 and cfg.critic.rnn.type is not None:
            raise ValueError(f"agent.critic.rnn.type={cfg.critic.rnn.type} needs agent.max_policy_lag=0 or agent.mode="
                             "sync: at lag >= 1 the actor thread runs no critic, so no critic state exists for the "
                             "learner's sequences. A recurrent actor (agent.actor.rnn) with a feed-forward critic "
                             "works at any lag.")
        self.rho_clip, self.c_clip = cfg.vtrace.rho_clip, cfg.vtrace.c_clip
        self._device = torch.device(device)
        self._cuda = self._device.type == "cuda"
        self.buffers = [cast(RolloutBuffer, self.ppo.storage)] + [
            RolloutBuffer(env, cfg.num_steps_per_env, device, self._stop) for _ in range(self.max_lag)]
        for buffer in self.buffers:
            buffer.before_batch = self._threads_for_batch
        # The actor's copy of the policy; at lag >= 1 without a critic (the learner re-evaluates).
        self.behaviour = build_behaviour_ppo(env, cfg, device, critic=self.max_lag == 0)
        self._cond = threading.Condition()  # guards _published; wakes an actor waiting for a version
        self._published: Published | None = None
        self._running = False
        self._error: BaseException | None = None

    # --- main thread ----------------------------------------------------------------------
    def learn(self, max_iterations: int | None = None) -> None:
        """Trains until ``max_iterations`` iterations are complete (``None``: until stopped).

        Returns when the learner is done; re-raises the first error of either worker with its
        own traceback; on Ctrl-C or SIGTERM stops both within an env step or a mini-batch, writes
        a snapshot of the last published version and raises
        :class:`~legion.Interrupted`.
        """
        self._begin(max_iterations)
        self.ppo.train_mode()
        self.behaviour.train_mode()
        for buffer in self.buffers:  # a previous learn() may have stopped mid-rollout
            buffer.clear()
        self.behaviour.transition.clear()
        self._error = None
        self._ready: queue.Queue = queue.Queue(maxsize=len(self.buffers))  # finished rollouts, in order
        self._reports: queue.Queue = queue.Queue()  # learner -> main: one small dict per iteration
        self._actor_clock, self._learner_clock = WaitClock(), WaitClock()
        self._rollouts_started = self.iteration
        self._actor_env_state = self._env_state()
        self._publish()
        start_iteration, behind = self.iteration, 0
        workers = [
            threading.Thread(target=self._guarded, args=(self._actor_loop,), name="legion-actor", daemon=True),
            threading.Thread(target=self._guarded, args=(self._learner_loop, max_iterations),
                             name="legion-learner", daemon=True),
        ]
        self._running = True
        with self.stop_requests as requests:
            try:
                for worker in workers:
                    worker.start()
                while True:
                    learner_alive = workers[1].is_alive()
                    try:
                        report = self._reports.get(timeout=0.05)
                    except queue.Empty:
                        report = None
                    requests.raise_if_requested()
                    if self._error is not None:
                        raise self._error
                    if report is None:
                        if not learner_alive:
                            break  # done: every report is booked
                        continue
                    self.log.record(report)
                    self._check_physics(report)
                    self._check_update(report)
                    behind = behind + 1 if report["perf"]["actor_wait_s"] > BEHIND_FRACTION * report["wall_s"] else 0
                    if behind == BEHIND_ITERATIONS and self.max_lag > 0:
                        print(f"[legion] warning: the learner is behind: the actor waited for a policy update in each "
                              f"of the last {behind} iterations ({report['perf']['actor_wait_s']:.2f}s of "
                              f"{report['wall_s']:.2f}s; update {report['learn_s']:.2f}s vs rollout "
                              f"{report['collect_s']:.2f}s), so the envs idle. Fewer "
                              "agent.algorithm.num_learning_epochs or num_mini_batches shorten the update.", flush=True)
                    if self.log_dir is not None and self._save_due(report["iteration"]):
                        self.save()  # from the published copy: neither worker pauses
                    for callback in self.on_iteration:
                        callback(self, report["iteration"])
            finally:
                self._stop_workers(workers)
                self._running = False
                self._end(start_iteration)

    def _guarded(self, loop, *args) -> None:
        """Runs a worker; its first error stops both workers and is re-raised by the main thread."""
        try:
            loop(*args)
        except BaseException as e:
            if self._error is None:
                self._error = e
            self._stop_all()

    def _stop_all(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def _stop_workers(self, workers) -> None:
        """Stops and joins both workers: the actor within one env step, the learner within one
        mini-batch (an interrupted update is rolled back to the last published version)."""
        self._stop_all()
        for worker in workers:
            if worker.ident is not None:  # started
                worker.join()

    @property
    def _acting_ppo(self):
        return self.behaviour

    def _snapshot(self) -> dict:
        """While the workers run: the last published version (a copy nobody modifies) and the
        env state the actor captured at its last rollout boundary."""
        if not self._running:
            return super()._snapshot()
        published = self._latest()
        if published.ready is not None:
            published.ready.synchronize()
        return self._checkpoint(published.state, published.version, self._actor_env_state, published.torch_rng)

    # --- learner thread -------------------------------------------------------------------
    def _publish(self) -> None:
        """Makes the learner's current state the newest version: one copy, swapped in by reference."""
        published = Published(self.iteration, clone_tree(policy_state(self.ppo)), torch.get_rng_state(),
                              _record_event(self._device))
        with self._cond:
            self._published = published
            self._cond.notify_all()

    def _latest(self) -> Published:
        """The newest published version (any thread, while the workers run)."""
        published = self._published
        assert published is not None, "learn() publishes a version before it starts the workers"
        return published

    def _learner_loop(self, max_iterations: int | None) -> None:
        ppo = self.ppo
        context = contextlib.ExitStack()
        if self._cuda:  # its own stream, so updates overlap the actor's kernels on the GPU
            context.enter_context(torch.cuda.device(self.device))
            context.enter_context(torch.cuda.stream(torch.cuda.Stream(self.device)))
        last = (time.perf_counter(), 0.0, 0.0)  # time, actor and learner wait so far
        with context:
            while max_iterations is None or self.iteration < max_iterations:
                with self._learner_clock.waiting():
                    item = self._next_rollout()
                if item is None:
                    return  # stopped
                rollout, info, ready = item
                t0 = time.perf_counter()
                _wait_event(ready, self._device)
                lags = [self.iteration - version for version in rollout.versions]
                ppo.storage = rollout
                self._check_rollout(rollout, info["nonfinite_max"])  # stops the run (the main thread re-raises)
                with torch.inference_mode():
                    if self.max_lag == 0:  # on-policy: exactly sync PPO
                        ppo.critic.reset(hidden_state=rollout.last_critic_state)  # a recurrent critic's
                        ppo.compute_returns(rollout.last_obs)
                    else:
                        compute_returns_off_policy(ppo, rollout, self.rho_clip, self.c_clip)
                try:
                    losses = update(ppo)  # clears the buffer for the actor
                except BaseException as e:
                    # Undo the half-done update, so the runner holds version `iteration` exactly.
                    last_good = self._latest()
                    _wait_event(last_good.ready, self._device)
                    load_policy_state(ppo, last_good.state)
                    if isinstance(e, Stopped):
                        return
                    raise
                finally:
                    self.update_threads.use(alone=False)  # before the actor can act again
                # Never publish NaN weights: the actor would act with them. (The published copy was
                # made by this thread, on this stream: no event to wait for.)
                nonfinite = restore_if_nonfinite(ppo, losses, self._latest().state)
                self.iteration += 1
                action_std = ppo.get_policy().output_std.mean().item()
                self._publish()
                now = time.perf_counter()
                clocks = (now, self._actor_clock.read(now), self._learner_clock.read(now))
                wall, actor_wait, learner_wait = (new - old for old, new in zip(last, clocks))
                last = clocks
                lag_mean, lag_max = statistics.fmean(lags), max(lags)
                # Share of the wall time in which both were working (at every moment one of them is).
                overlap = max(0.0, 1.0 - (actor_wait + learner_wait) / wall)
                self._reports.put({
                    **info, "iteration": self.iteration, "losses": losses, "learning_rate": ppo.learning_rate,
                    "action_std": action_std, "learn_s": now - t0, "wall_s": wall, "nonfinite_update": nonfinite,
                    "perf": {"actor_wait_s": actor_wait, "learner_wait_s": learner_wait, "overlap_fraction": overlap,
                             "rollouts_ahead": self._rollouts_started - self.iteration},
                    "policy": {"lag_mean": lag_mean, "lag_max": lag_max},
                    "progress": (f"learner {self.log.samples / (now - t0):,.0f} samples/s | lag {lag_mean:.2f} "
                                 f"(max {lag_max}) | wait actor {actor_wait:.2f}s learner {learner_wait:.2f}s | "
                                 f"overlap {overlap:.0%} | latency {info['latency_mean_ms']:.1f} ms"),
                })

    def _threads_for_batch(self) -> None:
        """Before each mini-batch: an actor waiting for this update cannot act before it is
        published, so its core is the learner's until then (:class:`~legion.agents.runner.UpdateThreads`)."""
        self.update_threads.use(alone=self._actor_clock.is_waiting)

    def _next_rollout(self):
        while not self._stop.is_set():
            try:
                return self._ready.get(timeout=0.05)
            except queue.Empty:
                pass
        return None

    # --- actor thread ---------------------------------------------------------------------
    def _wait_for_version(self, min_version: int) -> Published | None:
        """Backpressure: blocks until a policy of at least ``min_version`` is published."""
        with self._cond:
            while self._latest().version < min_version:
                if self._stop.is_set():
                    return None
                self._cond.wait(timeout=0.1)
            return self._latest()

    def _swap_in(self, published: Published) -> int:
        """The swap point: copies a published version's weights and normalizers into the actor's networks."""
        _wait_event(published.ready, self._device)
        load_weights(self.behaviour, published.state, critic=self.max_lag == 0)
        _used_on_this_stream(published.state, self._device)
        return published.version

    def _actor_loop(self) -> None:
        env, behaviour, stats = self.env, self.behaviour, self.stats
        num_steps = self.cfg.num_steps_per_env
        context = torch.cuda.device(self.device) if self._cuda else contextlib.nullcontext()
        stats.last_action_time = None
        version = -1
        with context, torch.inference_mode():
            obs = env.get_observations().to(self.device)
            k = self._rollouts_started  # the rollout that update k will learn from
            while True:
                with self._actor_clock.waiting():
                    published = self._wait_for_version(k - self.max_lag)
                if published is None:
                    return  # stopped
                _wait_event(published.ready, self._device)  # CUDA: the learner is done with this buffer
                rollout = self.buffers[k % len(self.buffers)]
                rollout.versions = []
                behaviour.storage = rollout
                self._rollouts_started = k + 1
                stats.begin()
                t0 = time.perf_counter()
                for step in range(num_steps):
                    if self._stop.is_set():
                        return
                    newest = self._latest()
                    if newest.version != version:
                        version = self._swap_in(newest)
                    stats.action()
                    actions = behaviour.act(obs)
                    obs, rewards, dones, extras = env.step(actions)
                    behaviour.process_env_step(obs, rewards, dones, extras)
                    rollout.time_outs[step].copy_(extras["time_outs"].view(-1, 1))
                    rollout.versions.append(version)
                    stats.step(rewards, dones, extras)
                rollout.last_obs.copy_(obs)
                rollout.last_critic_state = clone_tree(behaviour.critic.get_hidden_state())
                self._actor_env_state = self._env_state()
                info = {**stats.end(), "collect_s": time.perf_counter() - t0}
                # Never full: see _wait_for_version.
                self._ready.put_nowait((rollout, info, _record_event(self._device)))
                k += 1
