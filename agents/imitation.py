"""Learning from demonstrations: behaviour cloning and DAgger (``agent.mode=bc | dagger``).

Both train the actor of the run's own PPO (:func:`legion.agents.ppo.build_ppo`: the same network,
observation normalizer and checkpoint format), so what they write starts PPO
(``agent.init_from``), plays, evaluates and exports like any run. Each iteration rolls the current
policy out for ``agent.num_steps_per_env`` steps (its deterministic action, the episodes and
rewards logged as PPO's are), then takes ``agent.imitation.updates_per_iteration`` gradient steps
of the mean-squared error between the actor's mean action and the labelled one:

- ``bc``: the labels are the demonstrations' (``agent.imitation.demos``, read and checked against
  the task by :mod:`legion.sim2real.trajectories.demos`, which hands them to the runner);
- ``dagger`` (Ross, Gordon and Bagnell, 2011): the expert (``agent.imitation.expert``) labels every
  state the student visits, and the labelled states join the demonstrations, if any. The first
  iteration acts with the expert's actions, so the data starts on its states.

A recurrent student (``agent.actor.rnn``: a student that must remember what it cannot see now, a
velocity from positions, the terrain under the hind feet from a forward camera) learns by DAgger
from whole rollouts: each is kept in time order with the student's memory as it entered it, and
each gradient step replays a random share of its envs from that memory (R2D2's stored state),
every episode's memory restarting where it began, through the whole rollout (backpropagation
through time), as PPO trains a recurrent actor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from rsl_rl.utils import split_and_pad_trajectories
from tensordict import TensorDict

from legion.agents.ppo import action_std, clone_tree, map_tensors, obs_groups_for, stored
from legion.agents.runner import Runner
from legion.configs.schema import Agent


@dataclass
class Rollout:
    """A recurrent student's labelled rollout, in time order: (T, N, ...) each."""

    obs: TensorDict  # what the student read
    labels: torch.Tensor  # the expert's actions
    dones: torch.Tensor  # (T, N) bool: the episode ended after this step
    memory: object  # the student's hidden state as it entered the rollout (an LSTM's: (h, c))


class ImitationRunner(Runner):
    """``agent.mode=bc`` or ``dagger`` (module docstring): a :class:`~legion.agents.runner.Runner`
    whose update is supervised, on the same actor, checkpoints, progress line and stop handling.

    Args (beyond the :class:`~legion.agents.runner.Runner`'s):
        demos: the demonstrations' policy observations (N, D) and actions (N, A); bc needs them.
        expert: observations -> actions (and ``reset(dones)``, if it keeps a memory); dagger needs it.
    :func:`legion.sim2real.trajectories.demos.imitation_inputs` makes both from the config.
    """

    def __init__(self, env, cfg: Agent, log_dir: str | Path | None = None, device: str = "cpu", group=None,
                 demos: tuple[torch.Tensor, torch.Tensor] | None = None, expert=None):
        if group is not None:
            raise ValueError(f"agent.mode={cfg.mode} runs in one process: start it without torchrun.")
        if cfg.mode == "bc" and demos is None or cfg.mode == "dagger" and expert is None:
            raise ValueError(f"agent.mode={cfg.mode} needs {'demonstrations' if cfg.mode == 'bc' else 'an expert'}: "
                             "make the runner with legion.sim2real.trajectories.demos.imitation_inputs(cfg.agent, env)")
        if cfg.mode == "bc" and cfg.actor.rnn.type is not None:
            raise ValueError(f"agent.mode=bc trains a feed-forward actor on single states (agent.actor.rnn.type="
                             f"{cfg.actor.rnn.type}): a recurrent student learns from an expert, agent.mode=dagger.")
        super().__init__(env, cfg, log_dir, device)
        self.imitation, self.expert = cfg.imitation, expert
        observations = env.get_observations()
        self.groups = obs_groups_for(observations)["actor"]  # what the student reads: its samples keep these
        if demos is not None:
            if self.groups != ["policy"]:
                raise ValueError(f"agent.imitation.demos: recordings hold the policy group, and this actor also reads "
                                 f"{self.groups[1:]}: learn it from an expert (agent.mode=dagger) instead.")
            self.obs = TensorDict({"policy": demos[0]}, batch_size=[len(demos[0])])
            self.labels = demos[1]
        else:
            self.obs = stored(observations.select(*self.groups))[:0]
            self.labels = torch.zeros(0, env.num_actions, device=device)
        actor = self.ppo.actor
        self.rollouts: list[Rollout] = []  # a recurrent student's data (self.obs, self.labels: a feed-forward one's)
        if len(self.obs):
            actor.update_normalization(self.obs)
        self.optimizer = torch.optim.Adam(actor.parameters(), lr=self.imitation.learning_rate)
        self.generator = torch.Generator(device=device).manual_seed(0)

    def _policy_state(self) -> dict:
        """PPO's (the actor, its normalizer) and the imitation's own optimizer (Adam's moments)."""
        return {**super()._policy_state(), "imitation_optimizer": self.optimizer.state_dict()}

    def _load_policy_state(self, state: dict) -> None:
        super()._load_policy_state(state)
        if "imitation_optimizer" in state:  # (a checkpoint of PPO's, or an older one: a fresh Adam)
            self.optimizer.load_state_dict(state["imitation_optimizer"])
            for group in self.optimizer.param_groups:  # the config's rate: a resume may change it
                group["lr"] = self.imitation.learning_rate

    def _rollout(self, obs: TensorDict, requests) -> TensorDict:
        """``num_steps_per_env`` steps of the student (of the expert, in DAgger's first
        iteration); with an expert, its labels of the states join the data."""
        env, actor, expert = self.env, self.ppo.actor, self.expert
        visited, labels, ended = [], [], []
        memory = clone_tree(actor.get_hidden_state()) if actor.is_recurrent else None
        with torch.inference_mode():
            for _ in range(self.cfg.num_steps_per_env):
                requests.raise_if_requested()
                self.stats.action()
                actions = actor(obs)
                if expert is not None:
                    label = expert(obs)
                    visited.append(stored(obs.select(*self.groups)))
                    labels.append(label)
                    if self.iteration == 0:
                        actions = label
                obs, rewards, dones, extras = env.step(actions)
                if actor.is_recurrent:
                    if memory is None:  # (its first step: no memory yet, which is nought)
                        memory = map_tensors(actor.get_hidden_state(), torch.zeros_like)
                    actor.reset(dones)
                    ended.append(dones.bool())
                if expert is not None and hasattr(expert, "reset"):
                    expert.reset(dones)
                self.stats.step(rewards, dones, extras)
        if not visited:
            return obs
        if actor.is_recurrent:
            rollout = Rollout(cast(TensorDict, torch.stack(visited)), torch.stack(labels), torch.stack(ended),
                              clone_tree(memory))
            actor.update_normalization(rollout.obs.flatten(0, 1))
            keep = max(1, self.imitation.max_samples // rollout.dones.numel())
            self.rollouts = [*self.rollouts, rollout][-keep:]
            return obs
        new = cast(TensorDict, torch.cat(visited))
        actor.update_normalization(new)
        keep = self.imitation.max_samples
        self.obs = torch.cat([self.obs, new])[-keep:]
        self.labels = torch.cat([self.labels, torch.cat(labels)])[-keep:]
        return obs

    @property
    def samples(self) -> int:
        """The labelled states held."""
        return sum(r.dones.numel() for r in self.rollouts) if self.rollouts else len(self.obs)

    def replay(self, rollout: Rollout, envs: torch.Tensor | None = None) -> torch.Tensor:
        """A recurrent student's actions over ``rollout`` (its ``envs``; None: all), (T, N, A): each
        env from the memory it entered the rollout with, restarted where an episode ended."""
        obs, dones, memory = rollout.obs, rollout.dones, rollout.memory
        if envs is not None:
            obs, dones, memory = obs[:, envs], dones[:, envs], map_tensors(memory, lambda h: h[:, envs])
        padded, masks = split_and_pad_trajectories(obs.float(), dones)
        # one trajectory per episode piece, env by env: the first of each starts from the stored memory
        starts = torch.ones_like(dones)
        starts[1:] = dones[:-1]
        env, step = starts.T.nonzero(as_tuple=True)
        first = (step == 0).view(1, -1, 1)
        return self.ppo.actor(padded, masks=masks, hidden_state=map_tensors(memory, lambda h: h[:, env] * first))

    def _update(self) -> float:
        """``updates_per_iteration`` Adam steps of the MSE on random minibatches (a recurrent student's:
        a random share of one kept rollout's envs, :meth:`replay`); the mean loss."""
        actor, total = self.ppo.actor, torch.zeros((), device=self.device)
        for _ in range(self.imitation.updates_per_iteration):
            if self.rollouts:  # a recurrent student: a share of one rollout's envs, through its whole length
                pick = int(torch.randint(len(self.rollouts), (1,), generator=self.generator))
                rollout = self.rollouts[pick]
                steps, envs = rollout.dones.shape
                chosen = torch.randperm(envs, device=self.device, generator=self.generator)[
                    :max(1, self.imitation.batch_size // steps)]
                loss = torch.nn.functional.mse_loss(self.replay(rollout, chosen), rollout.labels[:, chosen])
            else:
                batch = torch.randint(len(self.obs), (min(self.imitation.batch_size, len(self.obs)),),
                                      device=self.obs.device, generator=self.generator)
                loss = torch.nn.functional.mse_loss(actor(self.obs[batch].float()), self.labels[batch])
            self.optimizer.zero_grad()
            loss.backward()
            # As PPO's max_grad_norm: one absurd sample (a diverging world's) cannot throw the weights away.
            torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
            self.optimizer.step()
            total += loss.detach()  # summed on the device: one read per iteration, not one per step
        return total.item() / self.imitation.updates_per_iteration

    def learning_rate(self) -> float:
        """The rate of this iteration's steps: ``learning_rate``, or with ``learning_rate_final`` set,
        on the line from one to the other over the run's iterations 0 to ``agent.max_iterations - 1``
        (however many each :meth:`learn` call runs: a resumed run, a benchmark's chunks)."""
        start, final = self.imitation.learning_rate, self.imitation.learning_rate_final
        max_iterations = self.cfg.max_iterations
        if final is None:
            return start
        if max_iterations is None:
            raise ValueError(f"agent.imitation.learning_rate_final={final} falls over the run's iterations: set "
                             "agent.max_iterations too, or leave learning_rate_final unset (null) for a fixed rate.")
        return start + (final - start) * min(1.0, self.iteration / max(1, max_iterations - 1))

    def learn(self, max_iterations: int | None = None) -> None:
        """Trains until ``max_iterations`` iterations (``None``: until stopped); Ctrl-C or SIGTERM
        stops after the current step with a checkpoint of the last complete iteration."""
        self.learning_rate()  # a schedule without an end is refused before anything runs
        self._begin(max_iterations)
        obs = self.env.get_observations().to(self.device)
        start_iteration = self.iteration
        # A resumed student's samples are not in its checkpoint (up to max_samples images, ~1 GB):
        # it gathers an episode's worth of its own labelled states before it learns again. Its
        # first rollout alone (every env in one phase of the task) would overwrite what it knew.
        refill = (min(self.imitation.max_samples, self.env.num_envs * self.env.max_episode_length)
                  if self.iteration > 0 and not self.samples else 0)
        with self.stop_requests as requests:
            try:
                while max_iterations is None or self.iteration < max_iterations:
                    t0 = time.perf_counter()
                    self.stats.begin()
                    obs = self._rollout(obs, requests)
                    t1 = time.perf_counter()
                    if not self.samples:
                        raise ValueError("no labelled samples to learn from: give agent.imitation.demos or an expert.")
                    if self.samples < refill:
                        losses, progress = {}, f"resumed: gathering samples, {self.samples:,} of {refill:,}"
                    else:
                        refill = 0
                        for group in self.optimizer.param_groups:
                            group["lr"] = self.learning_rate()
                        with self.update_threads.alone():  # nothing else computes meanwhile
                            loss = self._update()
                        losses = {"imitation": loss}
                        progress = f"{self.cfg.mode} loss {loss:.4f} on {self.samples:,} samples"
                    t2 = time.perf_counter()
                    self.iteration += 1
                    report = {**self.stats.end(), "iteration": self.iteration, "losses": losses,
                              "learning_rate": self.optimizer.param_groups[0]["lr"],
                              "action_std": action_std(self.ppo).mean().item(),
                              "collect_s": t1 - t0, "learn_s": t2 - t1, "wall_s": t2 - t0, "progress": progress}
                    self._book(report)
            finally:
                self._end(start_iteration)
