"""Off-policy learners, ``agent.learner=sac | td3``: SAC and TD3 from a replay buffer, in the style
of FastTD3 and FastSAC (Seo et al. 2025): thousands of parallel envs fill the buffer
(:mod:`legion.agents.replay`), large batches, clipped double-Q (the smaller of two critics' values
in every target), n-step returns, observations normalized by running statistics, and optionally a
distributional critic (C51) and prioritized replay.

The actor is rsl-rl's ``MLPModel`` whose output distribution is :class:`SquashedGaussian`: its
deterministic action is ``action_bound * tanh(.)``, so the exported ONNX graph (rsl-rl's export
wrapper, as for PPO) carries the squashing and the scale, and the edge runtime runs it unchanged.
With ``agent.actor.rnn`` it is rsl-rl's ``RNNModel`` (an LSTM or GRU before the MLP), learned as
R2D2 learns (Kapturowski et al. 2019): from sequences replayed from the memory the actor had at
their first step, after a burn-in that refreshes it (:meth:`OffPolicyLearner.update`). The critics
stay feed-forward, on the ``critic`` observation group where the task has one. With
``agent.symmetry.augmentation`` half of every sampled batch is replaced by its mirror image
(:mod:`legion.tasks.symmetry`): as many gradient samples, twice the distinct transitions.

:class:`OffPolicyRunner` is the training loop: every env step goes into the buffer (with the state
an episode ended in as its next observation: the env's ``final_observations``), then
``update_to_data`` gradient steps on sampled batches. It shares :class:`~legion.agents.runner.Runner`'s
checkpoints, stop handling, telemetry and progress line; an iteration is ``num_steps_per_env``
env steps.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time
from typing import Any

import torch
from rsl_rl.models import MLPModel, RNNModel
from rsl_rl.modules import MLP, EmpiricalNormalization
from rsl_rl.modules.distribution import Distribution
from rsl_rl.utils.utils import reduce_gradients_in_buckets
from tensordict import TensorDict

from legion.agents.ppo import BFloat16Linear, Stopped, clone_tree, obs_groups_for, update_precision
from legion.agents.replay import Batch, ReplayBuffer, Sequences
from legion.agents.runner import Runner
from legion.configs.schema import Agent

LEARNERS = ("sac", "td3")


class SquashedGaussian(Distribution):
    """Actions ``bound * tanh(u)``: SAC's ``u ~ N(mean, std)`` with a state-dependent std (the MLP
    outputs mean and log-std, ``learned_std``), or TD3's deterministic ``u = mean`` plus exploration
    noise of std ``noise_std`` (in units of ``bound``, after the squashing). The deterministic
    action, the one exported and evaluated, is ``bound * tanh(mean)``."""

    LOG_STD_RANGE = (-5.0, 2.0)

    def __init__(self, output_dim: int, bound: float = 1.0, learned_std: bool = True):
        super().__init__(output_dim)
        self.bound, self.learned_std = bound, learned_std
        self.noise_std: torch.Tensor | float = 0.0  # TD3's exploration, (num_envs, 1) or a number
        self._mean = self._log_std = torch.zeros(0)

    @property
    def input_dim(self) -> int:
        return 2 * self.output_dim if self.learned_std else self.output_dim

    def update(self, mlp_output: torch.Tensor) -> None:
        self._mean = mlp_output[..., :self.output_dim]
        if self.learned_std:
            low, high = self.LOG_STD_RANGE
            self._log_std = low + 0.5 * (high - low) * (torch.tanh(mlp_output[..., self.output_dim:]) + 1)

    def rsample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC: a reparameterized action and its log-probability (with tanh's change of variables)."""
        u = self._mean + self._log_std.exp() * torch.randn_like(self._mean)
        log_prob = torch.distributions.Normal(self._mean, self._log_std.exp()).log_prob(u)
        # log |d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), stable for large |u|
        log_prob = log_prob - 2 * (math.log(2.0) - u - torch.nn.functional.softplus(-2 * u))
        return self.bound * torch.tanh(u), log_prob.sum(-1)

    def sample(self) -> torch.Tensor:
        if self.learned_std:
            return self.rsample()[0]
        noise = torch.randn_like(self._mean) * self.noise_std * self.bound
        return (self.bound * torch.tanh(self._mean) + noise).clamp(-self.bound, self.bound)

    def deterministic_output(self, mlp_output: torch.Tensor) -> torch.Tensor:
        return self.bound * torch.tanh(mlp_output[..., :self.output_dim])

    def as_deterministic_output_module(self) -> torch.nn.Module:
        return _Squash(self.bound, self.output_dim)

    @property
    def mean(self) -> torch.Tensor:
        return self.bound * torch.tanh(self._mean)

    @property
    def std(self) -> torch.Tensor:
        """SAC: the Gaussian's std before the squashing; TD3: the exploration noise's, after it."""
        if self.learned_std:
            return self._log_std.exp()
        return torch.as_tensor(self.noise_std * self.bound)


class _Squash(torch.nn.Module):
    """The exported deterministic action: ``bound * tanh`` of the MLP's first ``dim`` outputs."""

    def __init__(self, bound: float, dim: int):
        super().__init__()
        self.bound, self.dim = bound, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound * torch.tanh(x[..., :self.dim])


class _Float32Linear(torch.nn.Linear):
    """A network's output layer, in fp32 even under the update's bfloat16 autocast."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(input.device.type):
            return super().forward(input)
        with torch.autocast(input.device.type, enabled=False):
            return super().forward(input.float())


def _head(mlp: MLP, layer_norm: bool) -> torch.nn.Sequential:
    """A critic's MLP, with a LayerNorm after each hidden layer's linear map where ``layer_norm``."""
    if not layer_norm:
        return mlp
    layers = list(mlp)
    last = max(i for i, layer in enumerate(layers) if isinstance(layer, torch.nn.Linear))
    normed = []
    for i, layer in enumerate(layers):
        normed.append(layer)
        if isinstance(layer, torch.nn.Linear) and i < last:
            normed.append(torch.nn.LayerNorm(layer.out_features))
    return torch.nn.Sequential(*normed)


class Critics(torch.nn.Module):
    """Two Q-functions of (critic observation, action) on one normalizer, each an MLP with one output,
    or ``num_atoms`` logits of a return distribution (distributional). ``heads`` lets the target
    networks (copies of the MLPs) share the online normalizer."""

    def __init__(self, obs: TensorDict, num_actions: int, cfg: Agent, outputs: int):
        super().__init__()
        self.obs_groups = obs_groups_for(obs)["critic"]
        dim = sum(obs[group].shape[-1] for group in self.obs_groups)
        network = cfg.critic
        self.obs_normalizer = EmpiricalNormalization(dim) if network.obs_normalization else torch.nn.Identity()
        self.heads = torch.nn.ModuleList(_head(MLP(dim + num_actions, outputs, network.hidden_dims, network.activation),
                                               cfg.off_policy.layer_norm) for _ in range(2))

    def forward(self, obs: TensorDict, actions: torch.Tensor, heads=None) -> torch.Tensor:
        """(2, B, outputs)."""
        x = torch.cat([self.obs_normalizer(torch.cat([obs[g] for g in self.obs_groups], dim=-1)), actions], dim=-1)
        return torch.stack([head(x) for head in (heads if heads is not None else self.heads)])

    def update_normalization(self, obs: TensorDict) -> None:
        if isinstance(self.obs_normalizer, EmpiricalNormalization):
            self.obs_normalizer.update(torch.cat([obs[g] for g in self.obs_groups], dim=-1))


class OffPolicyLearner:
    """SAC or TD3 (``cfg.learner``) on an env's observations: actor, critics, their targets and
    optimizers, and the gradient step (:meth:`update`).

    Args:
        obs: one step's observations (sizes the networks).
        num_actions: the action's size.
        num_envs: the envs acting (TD3: each has its own exploration noise).
        cfg: the ``agent`` config.
        device: where the networks live.
        group: this rank's :class:`~legion.agents.distributed.Group` in a multi-process run: every
            rank starts from rank 0's networks and averages its gradients with the others' (as PPO's
            ranks do); rsl-rl's normalizers combine every rank's statistics.
        mirror: the env's :class:`~legion.tasks.symmetry.Mirror`: the second half of every sampled
            batch is learned from as its mirror image (``agent.symmetry.augmentation``).
    """

    def __init__(self, obs: TensorDict, num_actions: int, num_envs: int, cfg: Agent, device: str, group=None,
                 mirror=None):
        if cfg.learner not in LEARNERS:
            raise ValueError(f"agent.learner={cfg.learner}: an off-policy learner is one of {LEARNERS}")
        self.mirror = mirror
        self.cfg, self.kind, self.device = cfg.off_policy, cfg.learner, device
        off = cfg.off_policy
        sac = self.kind == "sac"
        network, rnn = cfg.actor, cfg.actor.rnn
        model: dict[str, Any] = dict(hidden_dims=network.hidden_dims, activation=network.activation,
                     obs_normalization=network.obs_normalization,
                     distribution_cfg={"class_name": SquashedGaussian, "bound": off.action_bound, "learned_std": sac})
        if rnn.type:
            model.update(rnn_type=rnn.type, rnn_hidden_dim=rnn.hidden_size, rnn_num_layers=rnn.num_layers)
        self.actor = (RNNModel if rnn.type else MLPModel)(obs, obs_groups_for(obs), "actor", num_actions,
                                                          **model).to(device)
        self.recurrent = self.actor.is_recurrent
        # The memory's floats per env: (h, c) of an LSTM, h of a GRU, in every layer
        self.memory_size = (2 if rnn.type == "lstm" else 1) * rnn.num_layers * rnn.hidden_size if rnn.type else 0
        self.num_envs = num_envs
        # the steps per env the buffer holds before a first update: a recurrent actor's window
        self.window = off.burn_in + off.sequence_length + off.n_step - 1 if self.recurrent else 1
        self.distribution: SquashedGaussian = self.actor.distribution  # pyright: ignore[reportAttributeAccessIssue]
        outputs = off.num_atoms if off.distributional else 1
        self.critic = Critics(obs, num_actions, cfg, outputs).to(device)
        # agent.precision (auto: bf16 on a CPU with AMX or AVX512-BF16): the products in bfloat16, each
        # network's output layer in fp32 (a Q-value rounded to 8 bits would lose a step's reward)
        self.bfloat16 = update_precision(cfg, device) == "bf16"
        if self.bfloat16:
            for mlp in (self.actor.mlp, *self.critic.heads):
                linears = [m for m in mlp.modules() if isinstance(m, torch.nn.Linear)]
                for layer in linears[:-1]:
                    layer.__class__ = BFloat16Linear
                linears[-1].__class__ = _Float32Linear
        self.target_heads = copy.deepcopy(self.critic.heads).requires_grad_(False)
        # TD3's target actor: a copy of the MLP (a recurrent one's reads the online actor's memory)
        self.target_actor = None if sac else copy.deepcopy(self.actor.mlp).requires_grad_(False)
        # The policy evaluated and exported, where agent.off_policy.policy_average averages it
        self.averaged = copy.deepcopy(self.actor).requires_grad_(False) if off.policy_average else None
        self.atoms = torch.linspace(off.v_min, off.v_max, off.num_atoms, device=device)
        self.actor_optimizer = torch.optim.AdamW(self.actor.parameters(), lr=off.actor_learning_rate,
                                                 weight_decay=off.weight_decay)
        self.critic_optimizer = torch.optim.AdamW(self.critic.heads.parameters(), lr=off.critic_learning_rate,
                                                  weight_decay=off.weight_decay)
        self.log_alpha = torch.tensor(float(torch.tensor(off.init_alpha).log()), device=device, requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=off.critic_learning_rate)
        self.target_entropy = off.target_entropy if off.target_entropy is not None else -float(num_actions)
        self.noise_std = torch.empty(num_envs, 1, device=device).uniform_(*off.exploration_noise)
        self.updates = 0  # critic steps so far
        self.normalized = 0  # the buffer's steps the normalizers have learned from
        # The actor that acts: this one (acting and learning in turn), or a copy the learner's
        # weights are handed to (agent.mode=async: OffPolicyRunner)
        self.acting = self.actor
        self.world_size = group.world_size if group is not None else 1
        if self.world_size > 1:
            for tensor in self._weights():
                torch.distributed.broadcast(tensor.data, src=0)

    def _weights(self) -> list[torch.Tensor]:
        """Every learned tensor and normalizer statistic, in one order on every rank."""
        modules = (self.actor, self.critic, self.target_heads, self.target_actor, self.averaged)
        return [t for m in modules if m is not None for t in m.state_dict().values()] + [self.log_alpha]

    # --- acting --------------------------------------------------------------------------------
    def act(self, obs: TensorDict) -> torch.Tensor:
        """Exploring actions for the envs' observations."""
        self.acting.distribution.noise_std = self.noise_std  # pyright: ignore[reportOptionalMemberAccess]
        return self.acting(obs, stochastic_output=True)

    def memory(self) -> torch.Tensor | None:
        """The acting actor's memory, (num_envs, memory_size) (what the buffer keeps with each step);
        None for a feed-forward actor."""
        if not self.recurrent:
            return None
        state = self.acting.get_hidden_state()
        if state is None:  # before its first step
            return torch.zeros(self.num_envs, self.memory_size, device=self.device)
        return _flat(state)

    @property
    def _rnn(self) -> torch.nn.LSTM | torch.nn.GRU:
        """A recurrent actor's torch LSTM or GRU."""
        return self.actor.rnn.rnn  # pyright: ignore[reportAttributeAccessIssue,reportReturnType]

    def _memory_state(self, memory: torch.Tensor):
        """:meth:`memory`'s rows (B, memory_size) as the RNN's state: (h, c) or h, (layers, B, hidden)."""
        rnn = self._rnn
        parts = [part.reshape(len(memory), rnn.num_layers, rnn.hidden_size).transpose(0, 1).contiguous()
                 for part in memory.chunk(2 if isinstance(rnn, torch.nn.LSTM) else 1, dim=-1)]
        return tuple(parts) if len(parts) == 2 else parts[0]

    def episodes_ended(self, dones: torch.Tensor) -> None:
        """The envs whose episode ended: a recurrent actor's memory restarts; TD3: a new exploration
        noise std."""
        self.acting.reset(dones)
        fresh = torch.empty_like(self.noise_std).uniform_(*self.cfg.exploration_noise)
        self.noise_std = torch.where(dones[:, None], fresh, self.noise_std)

    # --- learning ------------------------------------------------------------------------------
    def _inputs(self, obs: TensorDict) -> torch.Tensor:
        """The actor's normalized observation (a recurrent actor's RNN input), (..., D)."""
        return MLPModel.get_latent(self.actor, obs)

    def _policy(self, latent: torch.Tensor, mlp=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Actions for a batch of the actor's latents (its MLP's input) and, SAC, their
        log-probabilities (reparameterized: gradients flow)."""
        mlp_output = (mlp or self.actor.mlp)(latent)
        if self.kind == "sac":
            self.distribution.update(mlp_output)
            return self.distribution.rsample()
        return self.distribution.deterministic_output(mlp_output), None

    def _value(self, q: torch.Tensor) -> torch.Tensor:
        """Expected values (..., ) of critic outputs (..., outputs)."""
        if not self.cfg.distributional:
            return q[..., 0]
        return (q.softmax(-1) * self.atoms).sum(-1)

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def update(self, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        """One critic step on a sampled batch, and every ``policy_delay`` steps an actor step (SAC:
        and the temperature's); the targets follow by Polyak averaging. Returns the losses (device
        tensors, unread). First the observation normalizers learn from the steps the buffer
        gained since the last update (so they are the learner's alone, whichever thread acts)."""
        with torch.autocast(torch.device(self.device).type, torch.bfloat16, enabled=self.bfloat16):
            return self._gradient_step(buffer)

    def _gradient_step(self, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        if buffer.steps > self.normalized:
            recent = buffer.recent(buffer.steps - self.normalized)
            self.actor.update_normalization(recent)
            self.critic.update_normalization(recent)
            self.normalized = buffer.steps
        off = self.cfg
        actor_step = (self.updates + 1) % off.policy_delay == 0
        if self.recurrent:
            batch, latent, next_latent = self._replay_sequences(buffer, grad=actor_step)
        else:
            batch = buffer.sample(off.batch_size)
            if self.mirror is not None:
                batch = self._mirror_half(batch)
            latent = self._inputs(batch.obs)
            with torch.no_grad():
                next_latent = self._inputs(batch.next_obs)
        losses = self._critic_step(batch, next_latent, buffer)
        self.updates += 1
        if actor_step:
            losses.update(self._actor_step(batch, latent))
        with torch.no_grad():
            for target, online in ((self.target_heads, self.critic.heads), (self.target_actor, self.actor.mlp)):
                if target is not None:
                    for t, o in zip(target.parameters(), online.parameters()):
                        t.lerp_(o, off.tau)
            if actor_step and self.averaged is not None:
                for a, o in zip(self.averaged.parameters(), self.actor.parameters()):
                    a.lerp_(o, off.policy_average)
        return losses

    def _mirror_half(self, batch: Batch) -> Batch:
        """``batch`` with its second half (a random draw like the first) replaced by its mirror image:
        the same rewards and discounts, observations and actions mirrored (a transition's mirror is
        one the robot could have made; its priority is updated from the mirror's error)."""
        half, mirror = len(batch.actions) // 2, self.mirror
        assert mirror is not None

        def mirrored(obs: TensorDict) -> TensorDict:
            return torch.cat([obs[:half], mirror.observations(obs[half:])])  # pyright: ignore[reportReturnType]

        actions = torch.cat([batch.actions[:half], mirror.actions(batch.actions[half:])])
        return dataclasses.replace(batch, obs=mirrored(batch.obs), next_obs=mirrored(batch.next_obs),
                                   actions=actions)

    @property
    def policy(self):
        """The policy play, eval and export run: the actor, or its average
        (``agent.off_policy.policy_average``) with the actor's observation normalizer."""
        if self.averaged is None:
            return self.actor
        with torch.no_grad():
            for mine, actors in zip(self.averaged.buffers(), self.actor.buffers()):
                mine.copy_(actors)
        return self.averaged

    def _replay_sequences(self, buffer: ReplayBuffer, grad: bool) -> tuple[Batch, torch.Tensor, torch.Tensor]:
        """A recurrent actor's batch (R2D2): ``batch_size / sequence_length`` windows of ``burn_in +
        sequence_length + n_step - 1`` steps, each unrolled from the memory stored with its first
        step (restarted where an episode begins inside it); the burn-in refreshes the stale stored
        memory without gradients, the next ``sequence_length`` steps are learned from (gradients
        through the memory when ``grad``), the last ``n_step - 1`` only carry the memory on to the
        steps the n-step targets bootstrap from. Returns their transitions (time-major), the
        actor's latents for them and for their next observations."""
        off = self.cfg
        length, learned = self.window, off.sequence_length
        windows = max(1, off.batch_size // learned)
        sequences: Sequences = buffer.sample_sequences(windows, length, range(off.burn_in, off.burn_in + learned))
        rnn = self._rnn
        inputs = self._inputs(sequences.obs)  # (length, windows, D)
        state, outputs, memories = self._memory_state(sequences.memory), [], []
        for j in range(length):
            keep = (~sequences.begins[j]).float()[None, :, None]
            state = tuple(s * keep for s in state) if isinstance(state, tuple) else state * keep
            with torch.set_grad_enabled(grad and off.burn_in <= j < off.burn_in + learned):
                output, state = rnn(inputs[j:j + 1], state)
            outputs.append(output[0])
            memories.append(_flat(state).detach())
        batch = sequences.batch
        latent = torch.cat(outputs[off.burn_in:off.burn_in + learned])
        # the step each target bootstraps from, in its window: the next observation meets the memory after it
        step = (batch.last - sequences.start.repeat(learned)) % buffer.capacity
        window = torch.arange(windows, device=self.device).repeat(learned)
        with torch.no_grad():
            next_latent = rnn(self._inputs(batch.next_obs)[None],
                              self._memory_state(torch.stack(memories)[step, window]))[0][0]
        return batch, latent, next_latent

    def _critic_step(self, batch: Batch, next_latent: torch.Tensor, buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
        off = self.cfg
        with torch.no_grad():
            if self.kind == "sac":
                next_actions, log_prob = self._policy(next_latent)
                assert log_prob is not None
                entropy_bonus = -self.alpha * log_prob
            else:
                next_actions, _ = self._policy(next_latent, mlp=self.target_actor)
                noise = (torch.randn_like(next_actions) * off.target_noise).clamp(-off.target_noise_clip,
                                                                                  off.target_noise_clip)
                next_actions = (next_actions + noise * off.action_bound).clamp(-off.action_bound, off.action_bound)
                entropy_bonus = torch.zeros_like(batch.returns)
            next_q = self.critic(batch.next_obs, next_actions, heads=self.target_heads)
        q = self.critic(batch.obs, batch.actions)
        if off.distributional:
            with torch.no_grad():
                support = batch.returns[:, None] + batch.discounts[:, None] * (self.atoms + entropy_bonus[:, None])
                projected = torch.stack([self._project(logits.softmax(-1), support) for logits in next_q])
                values = (projected * self.atoms).sum(-1)  # (2, B)
                target = torch.where((values[0] < values[1])[:, None], projected[0], projected[1])
            per_sample = -(target * q.log_softmax(-1)).sum(-1)  # (2, B) cross-entropies
            errors = per_sample.mean(0)
        else:
            with torch.no_grad():
                target = batch.returns + batch.discounts * (next_q[..., 0].min(0).values + entropy_bonus)
            per_sample = (q[..., 0] - target).square()
            errors = (q[..., 0] - target).abs().mean(0)
        loss = (per_sample.mean(0) * batch.weights).mean()
        self._step(self.critic_optimizer, loss, self.critic.heads)
        buffer.update_priorities(batch, errors)
        return {"critic": loss.detach(), "q": self._value(q.detach()).mean()}

    def _project(self, probabilities: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        """C51's projection of ``probabilities`` (B, atoms) on shifted atoms ``support`` (B, atoms)
        back onto the fixed atoms."""
        off = self.cfg
        delta = (off.v_max - off.v_min) / (off.num_atoms - 1)
        position = (support.clamp(off.v_min, off.v_max) - off.v_min) / delta
        lower, upper = position.floor().long(), position.ceil().long()
        # an atom landing exactly on a point gets all of its probability there
        lower = torch.where((upper > 0) & (lower == upper), lower - 1, lower)
        upper = torch.where((lower < off.num_atoms - 1) & (lower == upper), upper + 1, upper)
        projected = torch.zeros_like(probabilities)
        projected.scatter_add_(-1, lower, probabilities * (upper.float() - position))
        projected.scatter_add_(-1, upper, probabilities * (position - lower.float()))
        return projected

    def _actor_step(self, batch: Batch, latent: torch.Tensor) -> dict[str, torch.Tensor]:
        actions, log_prob = self._policy(latent)
        self.critic.requires_grad_(False)
        q = self._value(self.critic(batch.obs, actions)).min(0).values
        self.critic.requires_grad_(True)
        losses = {}
        if log_prob is None:
            loss = -q.mean()
        else:
            loss = (self.alpha * log_prob - q).mean()
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self._average_gradients([self.log_alpha])
            self.alpha_optimizer.step()
            losses.update(alpha=self.alpha, entropy=-log_prob.detach().mean())
        self._step(self.actor_optimizer, loss, self.actor)
        return {"actor": loss.detach(), **losses}

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, module: torch.nn.Module) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self._average_gradients(module.parameters())
        if self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), self.cfg.max_grad_norm)
        optimizer.step()

    def _average_gradients(self, params) -> None:
        if self.world_size > 1:
            reduce_gradients_in_buckets(params, self.world_size, bucket_mb=25)

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything learned (live tensors; :func:`~legion.agents.ppo.clone_tree` for a copy)."""
        state = {"learner": self.kind, "actor_state_dict": self.actor.state_dict(),
                 "critic_state_dict": self.critic.state_dict(), "target_heads": self.target_heads.state_dict(),
                 "actor_optimizer": self.actor_optimizer.state_dict(),
                 "critic_optimizer": self.critic_optimizer.state_dict(), "log_alpha": self.log_alpha.detach(),
                 "alpha_optimizer": self.alpha_optimizer.state_dict(), "noise_std": self.noise_std,
                 "updates": self.updates, "normalized": self.normalized}
        if self.target_actor is not None:
            state["target_actor"] = self.target_actor.state_dict()
        if self.averaged is not None:
            state["averaged_actor"] = self.averaged.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("learner") != self.kind:
            raise KeyError(f"it was trained by agent.learner={state.get('learner', 'ppo')}, this run is "
                           f"agent.learner={self.kind}")
        self.actor.load_state_dict(state["actor_state_dict"])
        self.critic.load_state_dict(state["critic_state_dict"])
        self.target_heads.load_state_dict(state["target_heads"])
        if self.target_actor is not None:
            self.target_actor.load_state_dict(state["target_actor"])
        if self.averaged is not None:  # (a checkpoint trained without: the average starts at its actor)
            self.averaged.load_state_dict(state.get("averaged_actor", state["actor_state_dict"]))
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if state["noise_std"].shape == self.noise_std.shape:
            self.noise_std = state["noise_std"].to(self.device).clone()
        self.updates, self.normalized = state["updates"], state["normalized"]


def _flat(state) -> torch.Tensor:
    """An RNN state, (h, c) of an LSTM or h of a GRU, each (layers, B, hidden), as rows (B, memory_size):
    the layout :meth:`OffPolicyLearner._memory_state` reads."""
    parts = state if isinstance(state, tuple) else (state,)
    return torch.cat([part.transpose(0, 1).reshape(part.shape[1], -1) for part in parts], dim=-1)


def nonfinite_learner(learner: OffPolicyLearner, losses: dict[str, float]) -> list[str]:
    """What an update made NaN/Inf: losses by name, then the networks' weights."""
    bad = [f"the {name} loss" for name, value in losses.items() if not math.isfinite(value)]
    for name, module in (("actor", learner.actor), ("critics", learner.critic)):
        if not all(bool(torch.isfinite(p).all()) for p in module.parameters()):
            bad.append(f"the {name}' weights" if name == "critics" else f"the {name}'s weights")
    return bad


class OffPolicyRunner(Runner):
    """SAC or TD3 training on a VecEnv: every env step goes into the replay buffer, and the learner
    runs ``agent.off_policy.update_to_data`` gradient steps per env step (after ``learning_starts``).

    ``agent.mode=sync``: acting and learning in turn, on one thread (reproducible bit for bit).
    ``agent.mode=async``: the actor-learner split. The calling thread acts (with a copy of the
    actor, refreshed from the learner's at every env step where a newer one is published) while a
    learner thread samples and updates. The update-to-data ratio holds as in sync: the learner never
    runs an update the env steps so far do not allow, and the actor waits (backpressure) when the
    learner is more than ``agent.off_policy.max_lag_steps`` env steps' worth of updates behind. The
    buffer is shared under a lock; which policy acted at which step depends on timing.

    Over torch.distributed (sync only) each rank steps its own envs into its own buffer and the
    ranks average their gradients (:class:`OffPolicyLearner`'s ``group``).

    Args as :class:`~legion.agents.runner.Runner`'s.
    """

    def __init__(self, env, cfg: Agent, log_dir=None, device: str = "cpu", group=None):
        if group is not None and cfg.mode == "async":
            raise ValueError(f"agent.learner={cfg.learner} over several ranks trains with agent.mode=sync (each "
                             "rank's updates average gradients with the others', in step)")
        super().__init__(env, cfg, log_dir, device, group)

    def _build_learner(self) -> None:
        env = self.env
        mirror = env.mirror if self.cfg.symmetry.augmentation else None
        self.learner = OffPolicyLearner(env.get_observations().to(self.device), env.num_actions, env.num_envs,
                                        self.cfg, self.device, self.group, mirror)
        self.buffer: ReplayBuffer | None = None  # made by the first learn() (a loaded policy to run needs none)
        self._saved_buffer: dict | None = None  # from a checkpoint, until the buffer is made
        self.env_steps = 0  # control steps of all envs so far (learning starts after learning_starts)
        self._update_lock = threading.Lock()  # held by every update: a snapshot or a restore waits for one
        self._cond = threading.Condition()  # the learner's progress, for the actor's and the learner's waits
        self._losses: dict[str, list] = {}  # name -> [sum, count] since the iteration began
        self._waits = {"actor_wait_s": 0.0, "learner_wait_s": 0.0, "learn_s": 0.0}
        self._error: BaseException | None = None
        self._published: dict | None = None  # async: the learner's newest actor weights, not yet acting
        self._actor_waiting = False  # async: the actor waits for the learner (its core is the learner's)

    @property
    def policy(self) -> MLPModel:
        return self.learner.policy

    def _memory_models(self) -> dict:
        return {"actor": self.learner.acting}

    def _policy_state(self) -> dict:
        return {**self.learner.state_dict(), "env_steps": self.env_steps}

    def _load_policy_state(self, state: dict) -> None:
        self.learner.load_state_dict(state)
        self.env_steps = state["env_steps"]

    def _snapshot(self) -> dict:
        with self._update_lock:  # between two updates of a learner thread
            snapshot = clone_tree(super()._snapshot())
        if self.cfg.off_policy.checkpoint_buffer and self.buffer is not None:
            snapshot["replay"] = self.buffer.state_dict()
        return snapshot

    def load(self, path, checkpoint: dict | None = None, episodes: bool = True) -> None:
        from legion.agents.checkpoints import load_checkpoint

        checkpoint = checkpoint if checkpoint is not None else load_checkpoint(path)
        super().load(path, checkpoint, episodes)
        self._saved_buffer = checkpoint.get("replay")
        self.buffer = None

    def init_from(self, path) -> None:
        raise ValueError(f"agent.init_from starts PPO from a checkpoint; agent.learner={self.cfg.learner} "
                         "starts from scratch (or resume=<run folder> continues one of its own runs).")

    def _make_buffer(self) -> ReplayBuffer:
        off = self.cfg.off_policy
        buffer = ReplayBuffer(self.env.get_observations(), self.env.num_actions, off.buffer_size, self.device,
                              gamma=off.gamma, n_step=off.n_step, prioritized=off.prioritized,
                              alpha=off.priority_alpha, beta=off.priority_beta,
                              memory_size=self.learner.memory_size, max_bytes=off.max_buffer_gb * 1e9)
        print(f"[legion] replay buffer: {off.buffer_size} steps x {self.env.num_envs} envs, "
              f"{buffer.bytes_per_transition} bytes per transition, {buffer.bytes / 1e9:.2f} GB", flush=True)
        restored = False
        if self._saved_buffer is not None:
            try:
                buffer.load_state_dict(self._saved_buffer)
                restored = True
            except ValueError as e:
                print(f"[legion] note: the checkpoint's replay buffer is not restored ({e}); it starts empty.",
                      flush=True)
            self._saved_buffer = None
        if not restored:
            self.learner.normalized = 0
        return buffer

    # --- the update-to-data ratio ------------------------------------------------------------------
    def _allowed_updates(self) -> int:
        """The updates the env steps so far allow: ``update_to_data`` per step from ``learning_starts`` on
        (a recurrent actor's: from its first whole window on, if later)."""
        off = self.cfg.off_policy
        if self.buffer is None or self.buffer.size < self.learner.window:
            return self.learner.updates  # none owed before a whole window is stored (e.g. resumed without a buffer)
        return off.update_to_data * max(0, self.env_steps - max(off.learning_starts, self.learner.window) + 1)

    def _update(self) -> None:
        """One gradient step, its losses added to the iteration's."""
        with self._update_lock:
            assert self.buffer is not None
            losses = self.learner.update(self.buffer)
        with self._cond:
            for name, value in losses.items():
                total = self._losses.setdefault(name, [0, 0])
                total[0] += value
                total[1] += 1

    def _learner_loop(self, done: threading.Event) -> None:
        """agent.mode=async: updates as the env steps allow them, publishing the actor after each."""
        try:
            while True:
                t = time.perf_counter()
                with self._cond:
                    while self.learner.updates >= self._allowed_updates() and not done.is_set():
                        self._cond.wait(0.05)
                    if self.learner.updates >= self._allowed_updates():  # done, and caught up
                        return
                t1 = time.perf_counter()
                # An actor waiting for the learner cannot act before this update: its core is the learner's.
                self.update_threads.use(alone=self._actor_waiting)
                self._update()
                with self._cond:
                    self._published = clone_tree(self.learner.actor.state_dict())
                    self._waits["learner_wait_s"] += t1 - t
                    self._waits["learn_s"] += time.perf_counter() - t1
                    self._cond.notify_all()
        except BaseException as e:
            self._error = e
            with self._cond:
                self._cond.notify_all()

    def _await_learner(self, behind: int) -> None:
        """agent.mode=async: waits until the learner is at most ``behind`` env steps' worth of updates
        behind, then hands the actor the newest published weights."""
        t = time.perf_counter()
        limit = behind * self.cfg.off_policy.update_to_data
        with self._cond:
            while self._allowed_updates() - self.learner.updates > limit and self._error is None:
                if self._stop.is_set():
                    raise Stopped
                self._actor_waiting = True
                self._cond.wait(0.05)
            self._actor_waiting = False
            published, self._published = self._published, None
            self._waits["actor_wait_s"] += time.perf_counter() - t
        if self._error is not None:
            raise self._error
        if published is not None:
            self.learner.acting.load_state_dict(published)

    def learn(self, max_iterations: int | None = None) -> None:
        """Trains until ``max_iterations`` iterations are complete (``None``: until stopped); Ctrl-C
        or SIGTERM stops at the next env step with a checkpoint of the last complete iteration."""
        env, learner, stats, off = self.env, self.learner, self.stats, self.cfg.off_policy
        if self.buffer is None:
            self.buffer = self._make_buffer()
        buffer, asynchronous = self.buffer, self.cfg.mode == "async"
        env.keep_final_observations = True
        learner.actor.train()
        learner.critic.train()
        done = threading.Event()
        worker = threading.Thread(target=self._learner_loop, args=(done,), name="legion-learner", daemon=True)
        if asynchronous:  # the actor's own copy, given the learner's weights as they are published
            learner.acting = copy.deepcopy(learner.actor)
            self._published = None
        self._begin(max_iterations)
        stats.last_action_time = None
        obs = env.get_observations().to(self.device)
        start_iteration = self.iteration
        with self.stop_requests as requests:
            try:
                if asynchronous:
                    worker.start()
                while max_iterations is None or self.iteration < max_iterations:
                    t0 = time.perf_counter()
                    stats.begin()
                    with self._update_lock:
                        before = clone_tree(self._policy_state())  # an update gone NaN restores it
                    with self._cond:
                        self._losses, updates = {}, learner.updates
                        self._waits = dict.fromkeys(self._waits, 0.0)
                    for _ in range(self.cfg.num_steps_per_env):
                        requests.raise_if_requested()
                        if asynchronous:
                            self._await_learner(off.max_lag_steps)
                        stats.action()
                        with torch.no_grad():
                            memory = learner.memory()  # a recurrent actor's, before it acts
                            actions = learner.act(obs)
                            next_obs, rewards, dones, extras = env.step(actions)
                            time_outs = extras["time_outs"]
                            final = extras.get("final_observations")
                            ended = next_obs if final is None else _where(dones, final, next_obs)
                            buffer.add(obs, actions, rewards, ended, dones & ~time_outs, time_outs, memory)
                            learner.episodes_ended(dones)
                            stats.step(rewards, dones, extras)
                        obs = next_obs.to(self.device)
                        with self._cond:
                            self.env_steps += 1
                            self._cond.notify_all()
                        if not asynchronous and learner.updates < self._allowed_updates():
                            t = time.perf_counter()
                            with self.update_threads.alone():
                                while learner.updates < self._allowed_updates():
                                    self._update()
                            self._waits["learn_s"] += time.perf_counter() - t
                    self._book_iteration(t0, before, learner.updates - updates)
                if asynchronous:  # the learner catches up: as many updates as sync's
                    self._await_learner(0)
            except Stopped:
                requests.raise_if_requested()
                raise
            finally:
                if asynchronous:
                    done.set()
                    with self._cond:
                        self._cond.notify_all()
                    if worker.ident is not None:
                        worker.join()
                    learner.actor.reset(hidden_state=learner.acting.get_hidden_state())  # episodes go on
                    learner.acting = learner.actor
                self._end(start_iteration)

    def _book_iteration(self, t0: float, before: dict, updates: int) -> None:
        """An iteration's report, booked (Runner._book); an update gone NaN is undone."""
        learner, off = self.learner, self.cfg.off_policy
        with self._cond:
            losses = {name: float(total) / count for name, (total, count) in self._losses.items()}
            waits = dict(self._waits)
        bad = nonfinite_learner(learner, losses)
        if bad:
            with self._update_lock:
                self._load_policy_state(before)
        self.iteration += 1
        wall = time.perf_counter() - t0
        progress = (f"critic loss {losses['critic']:.3g} | Q {losses['q']:.3g}" if "critic" in losses else
                    f"filling the buffer ({self.env_steps}/{max(off.learning_starts, learner.window)} steps)")
        if self.cfg.mode == "async":
            progress += f" | actor waited {waits['actor_wait_s'] / wall:.0%}"
        assert self.buffer is not None
        report = {**self.stats.end(), "iteration": self.iteration, "losses": losses,
                  "learning_rate": off.critic_learning_rate,
                  "action_std": float(learner.distribution.std.detach().mean()),
                  "collect_s": wall - waits["learn_s"] if self.cfg.mode == "sync" else wall,
                  "learn_s": waits["learn_s"],
                  "wall_s": wall, "nonfinite_update": bad, "progress": progress,
                  "perf": {"replay_transitions": len(self.buffer), "updates": updates,
                           "actor_wait_s": waits["actor_wait_s"], "learner_wait_s": waits["learner_wait_s"]}}
        self._book(report)


def _where(mask: torch.Tensor, a: TensorDict, b: TensorDict) -> TensorDict:
    """Per group, ``a``'s rows where ``mask`` (N,), else ``b``'s."""
    return TensorDict({key: torch.where(mask[:, None], a[key], b[key]) for key in b.keys()},
                      batch_size=b.batch_size, device=b.device)
