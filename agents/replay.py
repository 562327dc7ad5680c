"""The replay buffer of the off-policy learners (:mod:`legion.agents.off_policy`), on the env's device.

A ring of ``capacity`` steps of ``num_envs`` parallel envs: per step the raw observations of every
group (normalized when sampled, by the networks' own normalizers), the action, the reward, the
episode's end by termination and by time-out kept apart, and the next observation, which at an
episode's end is the state it ended in (the env's ``final_observations``), not the next episode's
first. Batches are drawn as index tensors on the device, with no copy to the host.

Targets are n-step (:meth:`ReplayBuffer.sample`): from step ``t`` of an env the rewards of steps
``t..t+k`` discounted, ``k`` the first of: an episode's end, ``n_step - 1``, the env's newest step;
then the bootstrap from the next observation of step ``t+k``, with discount ``gamma ** (k + 1)``,
zero where step ``t+k`` terminated (a time-out bootstraps: its episode was cut, not over).

Prioritized sampling (Schaul et al. 2016, proportional): a priority per stored step; a batch draws
steps with probability ``p_i ** alpha / sum_j p_j ** alpha`` by an inverse transform on the
cumulative sum (one ``cumsum`` and one ``searchsorted`` over the buffer per batch: the batched
equivalent of a sum-tree, with no tree to keep), and weights each by ``(N P(i)) ** -beta`` over the
batch's largest. New steps enter at the largest priority seen.

Sequences for a recurrent actor (R2D2, Kapturowski et al. 2019): with ``memory_size`` the buffer also
keeps, per step, the state the acting actor's memory was in before it acted
(:meth:`ReplayBuffer.add`'s ``memory``), so a sequence replayed from any step starts from the state
the actor had there (:meth:`ReplayBuffer.sample_sequences`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from tensordict import TensorDict


@dataclass
class Batch:
    """A sampled batch: raw observations (TensorDicts of (B, D) per group), actions (B, A), the
    n-step discounted reward sum (B,), the discount of the bootstrap (B,) (zero after a
    termination), importance weights (B,) (ones without priorities), where it came from (``env``,
    ``slot``: for :meth:`ReplayBuffer.update_priorities`) and the slot whose next observation the
    target bootstraps from (``last``)."""

    obs: TensorDict
    actions: torch.Tensor
    returns: torch.Tensor
    next_obs: TensorDict
    discounts: torch.Tensor
    weights: torch.Tensor
    env: torch.Tensor
    slot: torch.Tensor
    last: torch.Tensor


@dataclass
class Sequences:
    """Sampled windows of consecutive steps of one env each (R2D2's sequences): raw observations
    (length, W) per group, where an episode begins inside a window (length, W; never at its first
    step, whose memory is the stored one), the acting actor's memory before the first step (W,
    memory_size), where the windows are (``env``, first slot ``start``: (W,)) and the transitions
    learned from (time-major: step ``t`` of window ``w`` at ``t * W + w``)."""

    obs: TensorDict
    begins: torch.Tensor
    memory: torch.Tensor
    env: torch.Tensor
    start: torch.Tensor
    batch: Batch


class BufferTooLarge(ValueError):
    """The buffer would need more memory than ``agent.off_policy.max_buffer_gb`` allows."""


class ReplayBuffer:
    """Transitions of ``num_envs`` envs, ``capacity`` steps each, in a ring.

    Args:
        obs: one step's observations (a TensorDict of (num_envs, D) per group): sizes the storage.
        num_actions: the action's size.
        capacity: steps kept per env.
        device: where everything lives (the env's device).
        gamma, n_step: the n-step targets' discount and horizon.
        prioritized: sample in proportion to priorities (``alpha``), weighted (``beta``).
        memory_size: floats of a recurrent actor's state kept per step (0: none).
        max_bytes: refuse (:class:`BufferTooLarge`) a buffer needing more.
    """

    def __init__(self, obs: TensorDict, num_actions: int, capacity: int, device: str, gamma: float = 0.99,
                 n_step: int = 1, prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 memory_size: int = 0, max_bytes: float | None = None):
        if capacity < 1 or n_step < 1:
            raise ValueError(f"a replay buffer needs capacity >= 1 and n_step >= 1 (got {capacity}, {n_step})")
        self.num_envs, self.capacity, self.device = obs.batch_size[0], capacity, device
        self.gamma, self.n_step = gamma, n_step
        self.prioritized, self.alpha, self.beta = prioritized, alpha, beta
        dims = {key: value.shape[-1] for key, value in obs.items()}
        # fp32 observations twice (this step's and the next), the action, reward, two flags, a
        # priority, the actor's memory.
        self.bytes_per_transition = 4 * (2 * sum(dims.values()) + num_actions + 1 + prioritized + memory_size) + 2
        self.bytes = self.bytes_per_transition * self.num_envs * capacity
        if max_bytes is not None and self.bytes > max_bytes:
            raise BufferTooLarge(
                f"the replay buffer would need {self.bytes / 1e9:.2f} GB ({self.num_envs} envs x {capacity} steps x "
                f"{self.bytes_per_transition} bytes per transition), over agent.off_policy.max_buffer_gb="
                f"{max_bytes / 1e9:g}. Lower agent.off_policy.buffer_size (steps kept per env) or sim.num_envs, "
                "or raise the limit if the memory is there.")
        shape = (capacity, self.num_envs)

        def storage() -> TensorDict:
            return TensorDict({key: torch.zeros(*shape, dim, device=device) for key, dim in dims.items()},
                              batch_size=shape, device=device)

        self.obs, self.next_obs = storage(), storage()
        self.actions = torch.zeros(*shape, num_actions, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.terminated = torch.zeros(shape, dtype=torch.bool, device=device)
        self.time_outs = torch.zeros(shape, dtype=torch.bool, device=device)
        self.priorities = torch.zeros(shape, device=device) if prioritized else None
        self.memory = torch.zeros(*shape, memory_size, device=device) if memory_size else None
        self.max_priority = torch.ones((), device=device)  # a device tensor: never read back
        self.head, self.size = 0, 0  # the slot the next step goes to; the steps stored per env
        self.steps = 0  # steps added since the buffer was made
        # One thread may add while another samples (agent.mode=async): each call holds the lock.
        self.lock = threading.Lock()

    def __len__(self) -> int:
        """Transitions stored (over all envs)."""
        return self.size * self.num_envs

    def add(self, obs: TensorDict, actions: torch.Tensor, rewards: torch.Tensor, next_obs: TensorDict,
            terminated: torch.Tensor, time_outs: torch.Tensor, memory: torch.Tensor | None = None) -> None:
        """One step of every env (copied in: the caller may reuse its tensors). ``next_obs``: the
        observation after the step, the ended episode's final one where an episode ended;
        ``memory``: (num_envs, memory_size), the acting actor's state before it acted."""
        with self.lock:
            self._add(obs, actions, rewards, next_obs, terminated, time_outs, memory)

    def _add(self, obs, actions, rewards, next_obs, terminated, time_outs, memory) -> None:
        slot = self.head
        if self.memory is not None:
            if memory is None:
                raise ValueError("this buffer keeps a recurrent actor's memory: add() needs memory=")
            self.memory[slot].copy_(memory)
        for key in self.obs.keys():
            self.obs[key][slot].copy_(obs[key])
            self.next_obs[key][slot].copy_(next_obs[key])
        self.actions[slot].copy_(actions)
        self.rewards[slot].copy_(rewards)
        self.terminated[slot].copy_(terminated)
        self.time_outs[slot].copy_(time_outs & ~terminated)
        if self.priorities is not None:
            self.priorities[slot].fill_(self.max_priority)
        self.head = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.steps += 1

    def recent(self, steps: int) -> TensorDict:
        """The observations of the newest ``steps`` steps (at most those stored), (steps x num_envs, D)
        per group: what the observation normalizers have not seen yet."""
        with self.lock:
            steps = min(steps, self.size)
            slots = (self.head - steps + torch.arange(steps, device=self.device)) % self.capacity
            return self.obs[slots].reshape(-1)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Batch:
        """``batch_size`` transitions with their n-step targets (module docstring), uniformly or by
        priority."""
        with self.lock:
            return self._sample(batch_size, generator)

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        if self.size == 0:
            raise ValueError("the replay buffer is empty: add steps before sampling")
        count = self.size * self.num_envs
        if self.priorities is None:
            flat = torch.randint(count, (batch_size,), device=self.device, generator=generator)
            weights = torch.ones(batch_size, device=self.device)
        else:
            p = self.priorities[:self.size].flatten() ** self.alpha
            cumulative = p.cumsum(0)
            total = cumulative[-1]
            u = torch.rand(batch_size, device=self.device, generator=generator) * total
            flat = torch.searchsorted(cumulative, u, right=True).clamp_(max=count - 1)
            weights = (count * p[flat] / total) ** -self.beta
            weights = weights / weights.max()
        slot, env = flat // self.num_envs, flat % self.num_envs
        return self.gather(env, slot, weights)

    def sample_sequences(self, count: int, length: int, learned: range,
                         generator: torch.Generator | None = None) -> Sequences:
        """``count`` windows of ``length`` consecutive steps of one env, uniformly over the windows
        stored whole, with the transitions (n-step targets) of their steps ``learned``."""
        with self.lock:
            if self.memory is None:
                raise ValueError("this buffer keeps no recurrent memory (made without memory_size)")
            if self.size < length:
                raise ValueError(f"the replay buffer holds {self.size} steps per env, fewer than a sequence's "
                                 f"{length}: sample sequences once it holds more")
            windows = self.size - length + 1  # per env, from the oldest stored step on
            flat = torch.randint(windows * self.num_envs, (count,), device=self.device, generator=generator)
            env = flat % self.num_envs
            start = ((self.head - self.size) + flat // self.num_envs) % self.capacity
            slots = (start + torch.arange(length, device=self.device)[:, None]) % self.capacity  # (length, count)
            ended = self.terminated[slots, env] | self.time_outs[slots, env]
            begins = torch.zeros_like(ended)
            begins[1:] = ended[:-1]
            batch = self.gather(env.repeat(len(learned)), slots[learned.start:learned.stop].flatten())
            return Sequences(obs=self.obs[slots, env], begins=begins, memory=self.memory[start, env], env=env,
                             start=start, batch=batch)

    def gather(self, env: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor | None = None) -> Batch:
        """The transitions at (``env``, ``slot``) with their n-step targets."""
        newer = (self.head - 1 - slot) % self.capacity  # steps stored after it in its env
        returns = torch.zeros(len(env), device=self.device)
        discount = torch.ones(len(env), device=self.device)  # gamma ** k while the episode runs on
        last = slot.clone()  # the step whose next observation the target bootstraps from
        ended = torch.zeros(len(env), dtype=torch.bool, device=self.device)
        terminal = torch.zeros_like(ended)
        for k in range(self.n_step):
            step = (slot + k) % self.capacity
            take = ~ended & (k <= newer)
            returns += torch.where(take, discount * self.rewards[step, env], 0.0)
            last = torch.where(take, step, last)
            terminated, time_out = self.terminated[step, env], self.time_outs[step, env]
            terminal |= take & terminated
            ended |= ~take | terminated | time_out
            discount = torch.where(take, discount * self.gamma, discount)
        obs = self.obs[slot, env]
        return Batch(obs=obs, actions=self.actions[slot, env], returns=returns, next_obs=self.next_obs[last, env],
                     discounts=torch.where(terminal, 0.0, discount),
                     weights=weights if weights is not None else torch.ones(len(env), device=self.device),
                     env=env, slot=slot, last=last)

    def update_priorities(self, batch: Batch, errors: torch.Tensor, eps: float = 1e-6) -> None:
        """New priorities ``|errors| + eps`` for a sampled batch's transitions."""
        if self.priorities is None:
            return
        priority = errors.detach().abs().float() + eps
        with self.lock:  # (a slot overwritten since the batch was drawn gets it too: harmless)
            self.priorities[batch.slot, batch.env] = priority
            torch.maximum(self.max_priority, priority.max(), out=self.max_priority)

    def state_dict(self) -> dict:
        """Everything stored, for a checkpoint (``agent.off_policy.checkpoint_buffer``)."""
        state = {"obs": self.obs.to_dict(), "next_obs": self.next_obs.to_dict(), "actions": self.actions,
                 "rewards": self.rewards, "terminated": self.terminated, "time_outs": self.time_outs,
                 "head": self.head, "size": self.size, "steps": self.steps, "max_priority": self.max_priority}
        for name in ("priorities", "memory"):
            if getattr(self, name) is not None:
                state[name] = getattr(self, name)
        return {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in state.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restores :meth:`state_dict` of a buffer of the same shape; raises ValueError otherwise."""
        if tuple(state["actions"].shape) != tuple(self.actions.shape):
            raise ValueError(f"the saved replay buffer holds {tuple(state['actions'].shape[:2])} (steps, envs) "
                             f"of {state['actions'].shape[-1]} actions; this one {tuple(self.actions.shape[:2])} "
                             f"of {self.actions.shape[-1]}")
        memory = state.get("memory")
        if (memory.shape if memory is not None else None) != (self.memory.shape if self.memory is not None else None):
            raise ValueError("the saved replay buffer holds a recurrent actor's memory of another size (or none where "
                             "this one needs it)")
        for name in ("obs", "next_obs"):
            for key, value in state[name].items():
                getattr(self, name)[key].copy_(value)
        for name in ("actions", "rewards", "terminated", "time_outs"):
            getattr(self, name).copy_(state[name])
        if self.memory is not None:
            self.memory.copy_(state["memory"])
        if self.priorities is not None:
            if "priorities" in state:
                self.priorities.copy_(state["priorities"])
            else:
                self.priorities[:state["size"]] = 1.0
        self.head, self.size, self.steps = state["head"], state["size"], state["steps"]
        self.max_priority.copy_(torch.as_tensor(state["max_priority"]))
