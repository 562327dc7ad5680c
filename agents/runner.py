"""The training loop: collect a rollout, update PPO, log, checkpoint. Reads top to bottom.

Sees only rsl-rl's VecEnv contract, never the simulator. A run folder holds ``config.yaml``
(the resolved config), ``model_<it>.pt`` checkpoints (:mod:`legion.agents.checkpoints`) and
TensorBoard events. :class:`Runner` is ``agent.mode=sync``;
:class:`legion.agents.async_runner.AsyncRunner` (``agent.mode=async``) shares its checkpoints,
stop handling and telemetry.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import torch

from legion import StopRequests
from legion.agents.checkpoints import (
    CheckpointError,
    load_checkpoint,
    prune,
    rng_states,
    save_checkpoint,
    set_rng_states,
)
from legion.agents.ppo import (
    RolloutBuffer,
    Stopped,
    action_std,
    build_ppo,
    clone_tree,
    load_policy_state,
    load_weights,
    nonfinite_rollout,
    policy_state,
    restore_if_nonfinite,
    update,
)
from legion.agents.telemetry import RolloutStats, TrainingLog
from legion.configs.schema import Agent


class TrainingDiverged(RuntimeError):
    """Training stopped because it cannot go on (non-finite physics or losses beyond the
    configured limits), after writing a checkpoint of the last good state. The message names the
    likely causes."""


# Why physics goes NaN, for the messages that stop training on it.
PHYSICS_CAUSES = ("Likely causes: a time step too large for the contacts and gains (sim.dt), PD gains or the action "
                  "scale too high, or no gains at all (check the robot's actuators: task.scene.robot.actuators; a "
                  "URDF carries none, so its joints go limp and the robot collapses), masses or inertias too small "
                  "(a randomization range at an extreme), an unstable robot model.")


class UpdateThreads:
    """torch's threads for PPO's update on a CPU. The env steps with the process's torch threads,
    one fewer than the cores (a core simulates, `legion.api.setup_process`); an update with the
    machine to itself (sync's; async's while the actor waits for it) takes ``agent.update_threads``,
    0: ``OMP_NUM_THREADS`` where set (torchrun sets 1 per rank, the tests 1 per pytest worker),
    else the cores this process may use over the ranks torchrun started on this machine
    (BENCHMARKS.md: the update 1.6-1.9x faster on 2 cores). torch's setting is the calling
    thread's (OpenMP), so the async learner's never reaches the actor's. The update's results do
    not depend on it where MKL computes in its strict reproducible mode (``MKL_CBWR=AUTO,STRICT``,
    which :func:`legion.set_process_env` sets: tests/test_async.py); in MKL's default mode some CPUs
    split a product's sums over the threads and round differently. On a GPU it changes nothing."""

    def __init__(self, cfg: Agent, device: str):
        if cfg.update_threads < 0:
            raise ValueError(f"agent.update_threads={cfg.update_threads}: give a thread count >= 1, or 0 for "
                             "OMP_NUM_THREADS or else this machine's cores")
        omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # "4" or a nested "4,2"
        cores = int(omp) if omp.isdigit() else len(os.sched_getaffinity(0)) // int(
            os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.count = None if torch.device(device).type != "cpu" else cfg.update_threads or max(1, cores)
        self._shared: int | None = None  # the process's torch threads, read on the first use

    def use(self, alone: bool) -> None:
        """This thread's torch threads: :attr:`count` if the update has the machine to itself, else
        the process's."""
        if self.count is None:
            return
        if self._shared is None:
            self._shared = torch.get_num_threads()
        count = self.count if alone else self._shared
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)

    @contextlib.contextmanager
    def alone(self):
        """An update with the machine to itself inside the block."""
        self.use(alone=True)
        try:
            yield
        finally:
            self.use(alone=False)


class Runner:
    """Synchronous PPO training on a VecEnv: collect a rollout, then update on it.

    Args:
        env: the VecEnv (rsl-rl contract).
        cfg: the ``agent`` config (:class:`legion.configs.schema.Agent`).
        log_dir: run folder for checkpoints and TensorBoard; ``None`` writes nothing.
        device: where the policy and learner live (the env's device).
        group: this rank's :class:`~legion.agents.distributed.Group` in a multi-process run (only
            rank 0 should get a ``log_dir``; every other rank prints nothing).
    """

    def __init__(self, env, cfg: Agent, log_dir: str | Path | None = None, device: str = "cpu", group=None):
        self.env, self.cfg, self.device, self.group = env, cfg, device, group
        self.log_dir = Path(log_dir) if log_dir else None
        self._stop = threading.Event()  # set by a stop request (and, async, by a worker's error)
        self.stop_requests = StopRequests(self._stop)
        self._build_learner()
        self.update_threads = UpdateThreads(cfg, device)
        self.iteration = 0  # number of completed iterations (= policy version)
        world = group.world_size if group else 1
        self.log = TrainingLog(cfg.num_steps_per_env * env.num_envs * world, self.log_dir, cfg.log_interval, device,
                               verbose=group is None or group.is_main, logger=cfg.logger,
                               wandb_project=cfg.wandb_project)
        self.stats = RolloutStats(env.num_envs, device)  # running episodes carry over between learn() calls
        self._last_save_time = time.monotonic()
        self._purge_step: int | None = None  # set by load(): TensorBoard forgets steps after it
        self._nonfinite_updates = 0  # skipped (non-finite) updates in a row
        self._episodes_under_way = False  # spread by the first learn(), or restored by load()
        # f(runner, iteration), called on the main thread after each iteration (e.g. task.record).
        self.on_iteration: list = []

    def _build_learner(self) -> None:
        self.ppo = build_ppo(self.env, self.cfg, self.device,
                             RolloutBuffer(self.env, self.cfg.num_steps_per_env, self.device, self._stop), self.group)

    @property
    def policy(self):
        """The actor that acts (an rsl-rl model: ``policy(obs)`` is its deterministic action), as
        play, eval and export run it."""
        return self.ppo.get_policy()

    @property
    def mean_episode_return(self) -> float:
        return self.log.mean_return

    @property
    def mean_episode_length(self) -> float:
        return self.log.mean_length

    @property
    def history(self):
        return self.log.history

    # --- checkpoints ----------------------------------------------------------------------
    def _env_state(self) -> dict:
        """The env's RNG states, its ``state_dict`` (randomization ranges, curriculum) and its
        episodes in progress with the acting policy's memory (a recurrent policy's hidden states),
        where the env has them: from a checkpoint between iterations, a sync run on the CPU resumes
        bit for bit."""
        env = self.env
        episode = None
        if hasattr(env, "episode_state"):
            memory = {name: clone_tree(model.get_hidden_state()) for name, model in self._memory_models().items()}
            episode = {"num_envs": env.num_envs, "env": env.episode_state(), "memory": memory}
        return {"rng": rng_states(env), "state": clone_tree(env.state_dict()) if hasattr(env, "state_dict") else None,
                "episode": episode}

    @property
    def _acting_ppo(self):
        """The PPO whose policy steps the env (async: the actor thread's)."""
        return self.ppo

    def _memory_models(self) -> dict:
        """The acting models whose memory (a recurrent hidden state) an episode carries, by name."""
        return {"actor": self._acting_ppo.actor, "critic": self._acting_ppo.critic}

    def _policy_state(self) -> dict:
        """Everything learned, live (a checkpoint's ``policy``)."""
        return policy_state(self.ppo)

    def _load_policy_state(self, state: dict) -> None:
        load_policy_state(self.ppo, state)

    def _snapshot(self) -> dict:
        """What a checkpoint holds, taken from the live learner (between updates)."""
        return self._checkpoint(self._policy_state(), self.iteration, self._env_state())

    @staticmethod
    def _checkpoint(policy: dict, iteration: int, env_state: dict, torch_rng: torch.Tensor | None = None) -> dict:
        rng = dict(env_state["rng"])
        if torch_rng is not None:
            rng["torch"] = torch_rng
        checkpoint = {"policy": policy, "iteration": iteration, "rng": rng}
        if env_state["state"] is not None:
            checkpoint["env"] = env_state["state"]
        if env_state.get("episode") is not None:
            checkpoint["episode"] = env_state["episode"]
        return checkpoint

    def save(self, path: str | Path | None = None) -> Path:
        """Writes a checkpoint, by default ``<log_dir>/model_<iteration>.pt`` (then keeps the newest
        ``agent.keep_last`` plus every ``agent.keep_every``-th), and returns its path."""
        snapshot = self._snapshot()
        if path:
            path = Path(path)
        elif self.log_dir is not None:
            path = self.log_dir / f"model_{snapshot['iteration']}.pt"
        else:
            raise ValueError("Runner.save() needs a path: this runner has no log_dir")
        save_checkpoint(snapshot, path)
        self._last_save_time = time.monotonic()
        if self.log_dir is not None and path.parent == self.log_dir:
            prune(self.log_dir, self.cfg.keep_last, self.cfg.keep_every)
        return path

    def load(self, path: str | Path, checkpoint: dict | None = None, episodes: bool = True) -> None:
        """Restores networks, normalizers, optimizer, learning rate, iteration, RNG and env states
        from a checkpoint written on any device (``checkpoint``: its already loaded contents), and
        with ``episodes`` the episodes in progress (to train on; a policy loaded to be run starts
        its own)."""
        checkpoint = checkpoint if checkpoint is not None else load_checkpoint(path)
        try:
            self._load_policy_state(checkpoint["policy"])
        except (RuntimeError, KeyError) as e:
            raise CheckpointError(f"{path} does not fit this task/agent config: {e}") from e
        self.iteration = checkpoint["iteration"]
        self._purge_step = self.iteration + 1
        skipped = set_rng_states(checkpoint.get("rng"), self.env)
        if skipped and "rng" in checkpoint:
            print(f"[legion] note: {path} restores no state for the random generators {skipped} here "
                  "(another device count, or an older checkpoint); they keep their current state.", flush=True)
        if "env" in checkpoint and hasattr(self.env, "load_state_dict"):
            self.env.load_state_dict(checkpoint["env"])
        self._episodes_under_way = False
        if episodes:
            self._restore_episodes(path, checkpoint.get("episode"))

    def _restore_episodes(self, path, episode: dict | None) -> None:
        """The episodes in progress and the policy's memory, where the checkpoint holds them and they
        fit (same task and ``num_envs``); otherwise every world starts a fresh episode, as before."""
        if episode is None or not hasattr(self.env, "load_episode_state"):
            return
        try:
            if episode["num_envs"] != self.env.num_envs:
                raise ValueError(f"it ran {episode['num_envs']} envs, this run {self.env.num_envs}")
            self.env.load_episode_state(episode["env"])
        except ValueError as e:
            print(f"[legion] note: {path}: its episodes in progress are not restored ({e}); every env starts a "
                  "new episode.", flush=True)
            return
        for name, model in self._memory_models().items():
            hidden = episode["memory"][name]
            if hidden is not None:
                model.reset(hidden_state=clone_tree(hidden))
        self._episodes_under_way = True

    def init_from(self, path: str | Path) -> None:
        """Starts from the networks and observation normalizers of another run's checkpoint
        (``agent.init_from``, e.g. behaviour cloning's), not its iteration, optimizer or RNG; the
        action std restarts at ``agent.actor.init_noise_std`` (cloning never trains it)."""
        checkpoint = load_checkpoint(path)
        try:
            load_weights(self.ppo, checkpoint["policy"])
        except (RuntimeError, KeyError) as e:
            raise CheckpointError(f"agent.init_from={path} does not fit this task/agent config: {e}") from e
        with torch.no_grad():
            action_std(self.ppo).fill_(self.cfg.actor.init_noise_std)

    def _save_due(self, iteration: int) -> bool:
        """Every ``save_interval`` iterations, and every ``save_every_minutes`` minutes."""
        minutes = self.cfg.save_every_minutes
        return (iteration % self.cfg.save_interval == 0
                or bool(minutes) and time.monotonic() - self._last_save_time >= 60 * minutes)

    def _check_physics(self, report: dict) -> None:
        """Envs whose physics went non-finite are reset and counted by the env; past the configured
        share in one step, training stops (the caller's ``finally`` writes the checkpoint)."""
        share, limit = report["nonfinite_max"], self.cfg.max_nonfinite_fraction
        if share > limit:
            raise TrainingDiverged(
                f"the physics went non-finite (NaN/Inf) in {share:.0%} of the envs in one step of iteration "
                f"{report['iteration']} (agent.max_nonfinite_fraction={limit:g}). {PHYSICS_CAUSES} The policy "
                "of the last complete iteration is saved.")

    def _check_rollout(self, storage, nonfinite_share) -> None:
        """Call before the update: the env resets the worlds whose physics went non-finite and keeps
        their numbers out of its rewards and observations; a NaN or Inf that still reached the
        rollout would crash the update inside torch or make the weights NaN. Training stops before
        the update, so the policy is the last complete iteration's (the caller's ``finally`` writes
        the checkpoint). ``nonfinite_share``: the largest share of envs whose physics went
        non-finite in one step of this rollout (a float or a device tensor). One host sync."""
        bad = nonfinite_rollout(storage)
        if bad:
            raise TrainingDiverged(
                f"the {' and '.join(bad)} of iteration {self.iteration + 1}'s rollout went non-finite (NaN/Inf); "
                f"the physics went non-finite in up to {float(nonfinite_share):.0%} of the envs in one step. Stopped "
                f"before the update. {PHYSICS_CAUSES} Or a reward or observation term that divides by zero. The "
                "policy of the last complete iteration is saved.")

    def _check_update(self, report: dict) -> None:
        """An update that came out NaN or Inf was skipped, its weights restored (``report["nonfinite_update"]``
        names what): warn; ``agent.max_nonfinite_updates`` in a row stop training with a checkpoint
        of the last good weights and :class:`TrainingDiverged`."""
        bad = report["nonfinite_update"]
        if not bad:
            self._nonfinite_updates = 0
            return
        self._nonfinite_updates += 1
        count, limit, it = self._nonfinite_updates, self.cfg.max_nonfinite_updates, report["iteration"]
        print(f"[legion] warning: iteration {it}: the {self.cfg.learner.upper()} update made {', '.join(bad)} NaN/Inf; "
              "it was skipped and the "
              f"weights from before it restored ({count} in a row; {limit} stop training: "
              "agent.max_nonfinite_updates).", flush=True)
        if count < limit:
            return
        saved = f"saved in {self.save()}" if self.log_dir is not None else "kept in memory (no run folder)"
        algorithm, off = self.cfg.algorithm, self.cfg.off_policy
        rates = (f"agent.algorithm.learning_rate={algorithm.learning_rate:g}, schedule={algorithm.schedule}, "
                 f"max_grad_norm={algorithm.max_grad_norm:g}" if self.cfg.learner == "ppo" else
                 f"agent.off_policy.actor_learning_rate={off.actor_learning_rate:g}, critic_learning_rate="
                 f"{off.critic_learning_rate:g}, max_grad_norm={off.max_grad_norm:g}")
        raise TrainingDiverged(
            f"training diverged: the {self.cfg.learner.upper()} update made {', '.join(bad)} NaN/Inf in {count} "
            f"iterations in a row ({it - count + 1}-{it}); stopped. The last good weights are {saved}. Likely causes: "
            f"a learning rate too high ({rates}); rewards too large (task.rewards weights: returns of "
            "thousands make the value loss explode); observations too large or unscaled (task.observations scale "
            "and clip, agent.actor.obs_normalization / agent.critic.obs_normalization); or NaN in the physics "
            "state feeding the rollout.")

    def _rewind(self, boundary: dict) -> None:
        """Back to ``boundary``, a copy of :meth:`_snapshot` taken as the iteration that a stop or an
        error cut short began: networks, normalizers, optimizer, env, episodes and random generators
        as the last complete iteration left them, which the stop's checkpoint then holds."""
        self.load("the start of the interrupted iteration", checkpoint=boundary)

    def _begin(self, max_iterations: int | None) -> None:
        self.log.start(self.iteration, max_iterations, purge_step=self._purge_step)
        self._purge_step = None
        self._stop.clear()
        if self.cfg.random_episode_start and not self._episodes_under_way:
            # Episodes that only time out end together forever: every rollout would then hold one
            # phase of the episode (all starts, or all ends). Spread the phases once (rsl-rl's
            # init_at_random_ep_len); the first episodes end early. Not again in a later learn() of
            # this runner, nor after episodes restored from a checkpoint: they are spread already.
            buf = self.env.episode_length_buf
            buf.copy_(torch.randint_like(buf, high=int(self.env.max_episode_length)))
        self._episodes_under_way = True

    def _end(self, start_iteration: int) -> None:
        if self.log_dir is not None and self.iteration > start_iteration:
            self.save()
        self.log.flush()

    # --- training -------------------------------------------------------------------------
    def learn(self, max_iterations: int | None = None) -> None:
        """Trains until ``max_iterations`` iterations are complete (``None``: until stopped).

        Ctrl-C or SIGTERM stops at the next env step or mini-batch, writes a checkpoint of the
        last complete iteration and raises :class:`legion.Interrupted`.
        """
        env, ppo, stats = self.env, self.ppo, self.stats
        self._begin(max_iterations)
        stats.last_action_time = None
        obs = env.get_observations().to(self.device)
        ppo.train_mode()
        start_iteration = self.iteration
        with self.stop_requests as requests:
            try:
                while max_iterations is None or self.iteration < max_iterations:
                    t0 = time.perf_counter()
                    # Where a stop goes back to (~3 ms for 1,024 quadrupeds): one part way through
                    # this iteration leaves the env, its generators and the normalizers in the next
                    # rollout, and a checkpoint of that would not resume as if never stopped.
                    boundary = clone_tree(self._snapshot())
                    stats.begin()
                    with torch.inference_mode():
                        try:
                            for _ in range(self.cfg.num_steps_per_env):
                                requests.raise_if_requested()
                                stats.action()
                                actions = ppo.act(obs)
                                obs, rewards, dones, extras = env.step(actions)
                                ppo.process_env_step(obs, rewards, dones, extras)
                                stats.step(rewards, dones, extras)
                            self._check_rollout(ppo.storage, stats.nonfinite_max)
                        except BaseException:
                            ppo.storage.clear()  # a next learn() starts a fresh rollout
                            ppo.transition.clear()
                            with torch.inference_mode(False):
                                self._rewind(boundary)
                            raise
                        ppo.compute_returns(obs)
                    t1 = time.perf_counter()
                    # A non-finite update is undone to the weights from before it (one copy).
                    before_update = clone_tree(policy_state(ppo))
                    try:
                        with self.update_threads.alone():  # nothing else computes meanwhile
                            losses = update(ppo)
                    except BaseException as e:
                        ppo.storage.clear()
                        self._rewind(boundary)
                        if isinstance(e, Stopped):
                            requests.raise_if_requested()
                        raise
                    t2 = time.perf_counter()
                    nonfinite = restore_if_nonfinite(ppo, losses, before_update)
                    self.iteration += 1
                    report = {**stats.end(), "iteration": self.iteration, "losses": losses,
                              "learning_rate": ppo.learning_rate,
                              "action_std": ppo.get_policy().output_std.mean().item(),
                              "collect_s": t1 - t0, "learn_s": t2 - t1, "wall_s": t2 - t0,
                              "nonfinite_update": nonfinite}
                    self._book(report)
            finally:
                self._end(start_iteration)

    def _book(self, report: dict) -> None:
        """A completed iteration: logged, checked (the physics, and the update's finiteness where it
        reports one), checkpointed when due and handed to the ``on_iteration`` callbacks."""
        self.log.record(report)
        self._check_physics(report)
        if "nonfinite_update" in report:
            self._check_update(report)
        if self.log_dir is not None and self._save_due(report["iteration"]):
            self.save()
        for callback in self.on_iteration:
            callback(self, report["iteration"])
