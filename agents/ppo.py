"""Where PPO touches rsl-rl's API: PPO, its models, normalizers and storage.

rsl-rl 5.5 is the PPO core (GAE, clipped surrogate and value losses, adaptive learning rate,
empirical observation normalization). Everything here maps legion's ``agent`` config onto it,
so an rsl-rl upgrade changes this module (and :mod:`legion.agents.off_policy`, which builds SAC
and TD3 on rsl-rl's models, MLPs, normalizer and output distributions).

What rsl-rl lacks for asynchronous PPO is here too: a second "behaviour" PPO that the actor
thread acts with, a rollout buffer that remembers which policy version made each step, and
V-trace targets and the decoupled PPO objective for rollouts collected by an older policy.
"""

from __future__ import annotations

import copy
import math
import os
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import TypeVar, cast

import torch
from rsl_rl.algorithms import PPO
from rsl_rl.env import VecEnv
from rsl_rl.models import CNNModel, MLPModel, RNNModel
from rsl_rl.modules import MLP, RNN, EmpiricalNormalization
from rsl_rl.storage import RolloutStorage
from tensordict import TensorDict

from legion.configs.schema import Agent, Network

_Tree = TypeVar("_Tree")  # a tensor, or nested dicts/lists/tuples holding tensors


def obs_groups_for(obs) -> dict[str, list[str]]:
    """The actor sees the ``policy`` group and every ``policy_<name>`` one (e.g. an image group,
    ``policy_depth``); the critic ``critic`` and every ``critic_<name>`` if the task has a
    ``critic`` group, else what the actor sees."""
    names = sorted(obs.keys())
    actor = ["policy"] + [name for name in names if name.startswith("policy_")]
    critic = ["critic"] + [name for name in names if name.startswith("critic_")] if "critic" in names else actor
    return {"actor": actor, "critic": critic}


def _build_model(obs: TensorDict, obs_set: str, output_dim: int, network: Network, **kwargs) -> MLPModel:
    """rsl-rl's MLPModel, or its RNNModel (a GRU or LSTM before the MLP) where ``network.rnn.type``
    is set, or an :class:`EstimatorModel` where an actor's ``estimator.target`` is, or its
    CNNModel where the model reads an image group (``network.cnn`` encodes each)."""
    cfg = {k: v for k, v in asdict(network).items() if k not in ("rnn", "init_noise_std", "estimator", "cnn")}
    rnn, estimator = network.rnn, getattr(network, "estimator", None)
    images = [group for group in obs_groups_for(obs)[obs_set] if obs[group].dim() == 4]
    if rnn.type not in (None, "lstm", "gru"):
        raise ValueError(f"agent.{obs_set}.rnn.type={rnn.type!r}: expected lstm, gru or null (a feed-forward MLP)")
    if images:
        if estimator is not None and estimator.target is not None:
            raise ValueError(f"agent.{obs_set}: it reads images ({', '.join(images)}), which a network without an "
                             f"estimator takes (agent.{obs_set}.estimator.target=null).")
        if rnn.type is not None:
            return RecurrentImageModel(obs, obs_groups_for(obs), obs_set, output_dim, **cfg, **kwargs,
                                       cnn_cfg=asdict(network.cnn), rnn_type=rnn.type, rnn_hidden_dim=rnn.hidden_size,
                                       rnn_num_layers=rnn.num_layers)
        return ImageModel(obs, obs_groups_for(obs), obs_set, output_dim, **cfg, **kwargs, cnn_cfg=asdict(network.cnn))
    if estimator is not None and estimator.target is not None:
        if estimator.target not in obs.keys():
            groups = ", ".join(map(str, obs.keys()))
            raise ValueError(f"agent.{obs_set}.estimator.target={estimator.target}: the task has no observation group "
                             f"of that name (groups: {groups}); add one to task.observations, e.g. base_velocity: "
                             "{base_lin_vel: {}}")
        if rnn.type is not None:
            raise ValueError(f"agent.{obs_set}.estimator needs a feed-forward {obs_set} (agent.{obs_set}.rnn.type "
                             "null): a recurrent one carries its own estimate in its state.")
        return EstimatorModel(obs, obs_groups_for(obs), obs_set, output_dim, **cfg, **kwargs, target=estimator.target,
                              estimator_dims=list(estimator.hidden_dims), loss_coef=estimator.loss_coef)
    if rnn.type is None:
        return MLPModel(obs, obs_groups_for(obs), obs_set, output_dim, **cfg, **kwargs)
    return RNNModel(obs, obs_groups_for(obs), obs_set, output_dim, **cfg, **kwargs, rnn_type=rnn.type,
                    rnn_hidden_dim=rnn.hidden_size, rnn_num_layers=rnn.num_layers)


def _build_actor(obs: TensorDict, num_actions: int, cfg: Agent) -> MLPModel:
    """The actor (Gaussian), sized from the observations."""
    return _build_model(obs, "actor", num_actions, cfg.actor,
                        distribution_cfg={"class_name": "GaussianDistribution", "init_std": cfg.actor.init_noise_std})


def _build_critic(obs: TensorDict, cfg: Agent) -> MLPModel:
    """The critic, sized from the observations (built after the actor: the RNG draws its weights in that order)."""
    return _build_model(obs, "critic", 1, cfg.critic)


def stored(obs: TensorDict) -> TensorDict:
    """A copy of observations to keep (rollouts, imitation samples): images (N, C, H, W) in float16,
    half the memory (4,096 envs x 24 steps of 128x128 RGB: 9.7 GB, not 19; depth in metres keeps
    ~1 mm at 2 m), vectors as they are. Models read them through :class:`ImageNormalizer`, in float32."""
    return TensorDict({k: v.half() if v.dim() == 4 else v.clone() for k, v in obs.items()}, batch_size=obs.batch_size)


class ImageModel(CNNModel):
    """rsl-rl's CNNModel whose image groups are normalized as its vectors are: each CNN reads its
    image through an :class:`ImageNormalizer` (with ``obs_normalization``). Without it a depth
    image, ~1.2 m everywhere with a 5 cm cube on it, taught a CNN nothing in 2,000 steps (the cube's
    position regressed to 12 cm, its spread); normalized, 1.7 cm."""

    def __init__(self, obs: TensorDict, obs_groups: dict, obs_set: str, output_dim: int, **kwargs):
        super().__init__(obs, obs_groups, obs_set, output_dim, **kwargs)
        for group, channels in zip(self.obs_groups_2d, self.obs_channels_2d):
            # Channels-last filters: oneDNN then convolves in NHWC, 1.3-2.1x faster forward and backward
            # on a CPU for the same values (bench/update.py --cnn-layouts); a 1-channel image is
            # already laid out so, and load_state_dict and Adam's state keep the layout.
            cnn = self.cnns[group].to(memory_format=torch.channels_last)  # pyright: ignore[reportCallIssue]
            self.cnns[group] = _NormalizedCNN(ImageNormalizer(channels), cnn)

    def update_normalization(self, obs: TensorDict) -> None:
        super().update_normalization(obs)
        if self.obs_normalization:
            for group in self.obs_groups_2d:
                cast(_NormalizedCNN, self.cnns[group]).normalizer.update(obs[group])


class RecurrentImageModel(ImageModel):
    """An :class:`ImageModel` with memory: the CNNs' codes and the vector groups pass through an
    LSTM or GRU (rsl-rl's ``RNN``, as its RNNModel) before the MLP: a pixel policy that remembers
    what it saw (a forward camera never sees under the hind feet). rsl-rl has no recurrent CNN
    model; this is its CNNModel and RNNModel joined, trained by its PPO as either (recurrent
    rollouts: padded trajectories of (T, B, ...) observations, the CNNs fed every image of them at
    once), exported with the images and the recurrent state as ONNX inputs."""

    is_recurrent = True

    def __init__(self, obs: TensorDict, obs_groups: dict, obs_set: str, output_dim: int, *, rnn_type: str,
                 rnn_hidden_dim: int, rnn_num_layers: int, **kwargs):
        self.latent_dim = rnn_hidden_dim  # the MLP's input (MLPModel's __init__ asks _get_latent_dim)
        super().__init__(obs, obs_groups, obs_set, output_dim, **kwargs)
        self.rnn = RNN(self.obs_dim + self.cnn_latent_dim, rnn_hidden_dim, rnn_num_layers, rnn_type)

    def _get_latent_dim(self) -> int:
        return self.latent_dim

    def get_latent(self, obs: TensorDict, masks=None, hidden_state=None) -> torch.Tensor:
        codes = []
        for group in self.obs_groups_2d:  # (B, C, H, W), or (T, B, C, H, W) for a recurrent batch
            images = obs[group]
            codes.append(self.cnns[group](images.flatten(0, -4)).unflatten(0, images.shape[:-3]))
        if self.obs_groups:
            codes.insert(0, MLPModel.get_latent(self, obs))  # the vector groups, concatenated and normalized
        return self.rnn(torch.cat(codes, dim=-1), masks, hidden_state).squeeze(0)

    def reset(self, dones=None, hidden_state=None) -> None:
        self.rnn.reset(dones, hidden_state)

    def get_hidden_state(self):
        return self.rnn.hidden_state

    def detach_hidden_state(self, dones=None) -> None:
        self.rnn.detach_hidden_state(dones)

    def as_onnx(self, verbose: bool = False) -> torch.nn.Module:
        return _OnnxRecurrentImageModel(self)


class _OnnxRecurrentImageModel(torch.nn.Module):
    """A :class:`RecurrentImageModel` for ONNX export, in rsl-rl's export wrappers' form: obs,
    each image group, h_in (and c_in, an LSTM's) -> actions, h_out (and c_out)."""

    is_recurrent = True

    def __init__(self, model: RecurrentImageModel):
        super().__init__()
        self.obs_normalizer = copy.deepcopy(model.obs_normalizer)
        self.cnns = torch.nn.ModuleList([copy.deepcopy(model.cnns[g]) for g in model.obs_groups_2d])
        self.rnn = copy.deepcopy(model.rnn.rnn)  # the torch module, without rsl-rl's wrapper's state
        self.mlp = copy.deepcopy(model.mlp)
        self.deterministic_output = model.distribution.as_deterministic_output_module() \
            if model.distribution is not None else torch.nn.Identity()
        self.lstm = isinstance(self.rnn, torch.nn.LSTM)
        self.groups, self.shapes = list(model.obs_groups_2d), [
            (c, *hw) for c, hw in zip(model.obs_channels_2d, model.obs_dims_2d)]
        self.obs_dim = model.obs_dim

    def forward(self, obs: torch.Tensor, *inputs: torch.Tensor):
        images, state = inputs[: len(self.cnns)], inputs[len(self.cnns):]
        latent = torch.cat([self.obs_normalizer(obs), *(cnn(x) for cnn, x in zip(self.cnns, images))], dim=-1)
        if self.lstm:
            out, (h, c) = self.rnn(latent.unsqueeze(0), (state[0], state[1]))
            return self.deterministic_output(self.mlp(out.squeeze(0))), h, c
        out, h = self.rnn(latent.unsqueeze(0), state[0])
        return self.deterministic_output(self.mlp(out.squeeze(0))), h

    def get_dummy_inputs(self) -> tuple[torch.Tensor, ...]:
        h = torch.zeros(self.rnn.num_layers, 1, self.rnn.hidden_size)
        images = [torch.zeros(1, *shape) for shape in self.shapes]
        return (torch.zeros(1, self.obs_dim), *images, h, *([torch.zeros_like(h)] if self.lstm else []))

    @property
    def input_names(self) -> list[str]:
        return ["obs", *self.groups, "h_in", *(["c_in"] if self.lstm else [])]

    @property
    def output_names(self) -> list[str]:
        return ["actions", "h_out", *(["c_out"] if self.lstm else [])]


class ImageNormalizer(torch.nn.Module):
    """Per channel, the running mean and standard deviation of an image group's pixels (rsl-rl's
    EmpiricalNormalization over every pixel of every image): (x - mean) / (std + eps)."""

    def __init__(self, channels: int):
        super().__init__()
        self.stats = EmpiricalNormalization([channels])

    def update(self, images: torch.Tensor) -> None:
        self.stats.update(images.float().movedim(1, -1).reshape(-1, images.shape[1]))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        mean, std = (v.view(1, -1, 1, 1) for v in (self.stats._mean, self.stats._std))
        return (images.float() - mean) / (std + self.stats.eps)


class _NormalizedCNN(torch.nn.Module):
    """A CNN behind its :class:`ImageNormalizer` (exported with it: rsl-rl's ONNX wrapper copies it)."""

    def __init__(self, normalizer: ImageNormalizer, cnn: torch.nn.Module):
        super().__init__()
        self.normalizer, self.cnn = normalizer, cnn
        self.output_dim, self.output_channels = cnn.output_dim, cnn.output_channels

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.cnn(self.normalizer(images))


class EstimatorModel(MLPModel):
    """rsl-rl's MLP actor with a state estimator in front: ``estimator``, an MLP, reads the
    normalized policy observation and estimates the ``target`` observation group (e.g. the base's
    linear velocity); the policy's MLP reads the observation and the estimate. Exported whole
    (:meth:`as_onnx`), so the robot feeds it the policy observation only.

    The estimator learns by regression, concurrently with PPO (Ji et al., "Concurrent Training of
    a Control Policy and a State Estimator for Dynamic and Robust Legged Locomotion", RA-L 2022):
    where the actor runs with gradients and the target group in its input (PPO's update), the
    estimate passes through :class:`_Regressed`, whose backward hands the estimator the gradient
    of ``loss_coef`` times its mean squared error instead of PPO's. So rsl-rl's update runs as it
    is, and PPO's losses do not shape the estimate the policy learns to read.
    """

    def __init__(self, obs: TensorDict, obs_groups: dict, obs_set: str, output_dim: int, *, target: str,
                 estimator_dims: list[int], loss_coef: float, **kwargs):
        self.target_dim = obs[target].shape[-1]  # read by _get_latent_dim in MLPModel's __init__
        super().__init__(obs, obs_groups, obs_set, output_dim, **kwargs)
        self.target, self.loss_coef = target, loss_coef
        self.estimator = MLP(self.obs_dim, self.target_dim, estimator_dims, kwargs.get("activation", "elu"))
        self.loss_sum, self.loss_count = torch.zeros(()), 0  # the regression losses since update() read them

    def _get_latent_dim(self) -> int:
        return self.obs_dim + self.target_dim

    def get_latent(self, obs: TensorDict, masks=None, hidden_state=None) -> torch.Tensor:
        observation = super().get_latent(obs, masks, hidden_state)  # concatenated and normalized
        estimate = self.estimator(observation)
        if torch.is_grad_enabled() and self.target in obs.keys():
            target = obs[self.target]
            self.loss_sum = self.loss_sum.to(target.device) + torch.nn.functional.mse_loss(estimate.detach().float(),
                                                                                          target)
            self.loss_count += 1
            estimate = _Regressed.apply(estimate, target, self.loss_coef)
        return torch.cat([observation, estimate.to(observation.dtype)], dim=-1)

    def estimate(self, obs: TensorDict) -> torch.Tensor:
        """The estimator's output for ``obs`` (its policy group)."""
        return self.estimator(super().get_latent(obs))

    def as_onnx(self, verbose: bool) -> torch.nn.Module:
        return _OnnxEstimatorModel(self)


class _Regressed(torch.autograd.Function):
    """``estimate`` unchanged forward; backward: ``coef`` times the gradient of the mean squared
    error to ``target`` in place of the gradient that arrived (see :class:`EstimatorModel`)."""

    @staticmethod
    def forward(ctx, estimate: torch.Tensor, target: torch.Tensor, coef: float) -> torch.Tensor:
        ctx.save_for_backward(estimate, target)
        ctx.coef = coef
        return estimate.clone()

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        estimate, target = ctx.saved_tensors
        grad = ctx.coef * 2.0 * (estimate.float() - target) / estimate.numel()
        return grad.to(estimate.dtype), None, None


class _OnnxEstimatorModel(torch.nn.Module):
    """An :class:`EstimatorModel` for ONNX export, as rsl-rl's MLP export wrapper: observation ->
    normalizer -> [observation, estimator] -> MLP -> the action's mean."""

    is_recurrent = False
    input_names, output_names = ["obs"], ["actions"]

    def __init__(self, model: EstimatorModel):
        super().__init__()
        self.obs_normalizer = copy.deepcopy(model.obs_normalizer)
        self.estimator, self.mlp = copy.deepcopy(model.estimator), copy.deepcopy(model.mlp)
        assert model.distribution is not None
        self.deterministic_output = model.distribution.as_deterministic_output_module()
        self.input_size = model.obs_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.obs_normalizer(x)
        return self.deterministic_output(self.mlp(torch.cat([x, self.estimator(x)], dim=-1)))

    def get_dummy_inputs(self) -> tuple[torch.Tensor]:
        return (torch.zeros(1, self.input_size),)


def update(ppo: PPO) -> dict[str, float]:
    """rsl-rl's ``PPO.update``, and the actor's estimator's regression loss (the mean over the
    update's mini-batches) among its losses as ``estimator``.

    An update whose weights went NaN part-way does not finish in rsl-rl: the next mini-batch's
    sampling raises inside torch ("normal expects all elements of std >= 0.0"). That update returns
    NaN losses instead (its rollout cleared, as a finished update leaves it), so that
    :func:`restore_if_nonfinite` skips it as it skips one that finished NaN."""
    actor = ppo.actor
    try:
        losses = ppo.update()
    except RuntimeError as error:
        if "normal expects all elements of std" not in str(error):
            raise
        ppo.storage.clear()
        if isinstance(actor, EstimatorModel):
            actor.loss_sum, actor.loss_count = torch.zeros(()), 0
        return dict.fromkeys(("value", "surrogate", "entropy"), math.nan)
    if isinstance(actor, EstimatorModel) and actor.loss_count:
        losses["estimator"] = actor.loss_sum.item() / actor.loss_count
        actor.loss_sum, actor.loss_count = torch.zeros(()), 0
    return losses


class BFloat16Linear(torch.nn.Linear):
    """``nn.Linear`` whose products run in bfloat16 under autocast (PPO's ``use_mixed_precision``)
    with results that do not depend on the thread count; outside autocast, ``nn.Linear``.

    Plain autocast leaves the weight gradient (a sum over the mini-batch) to oneDNN, which on a
    CPU with AMX splits a long sum over threads, so that the weights after an update on 2 threads
    are not those of 1 thread. Here that sum is cut into fixed chunks of the batch
    (``WEIGHT_GRAD_CHUNK`` rows), each a bfloat16 product too short to be split (checked on 1-16
    threads: ``bench/update.py``), and the chunks' products are added in fp32 in a fixed order; the
    bias gradient is a plain column sum (accumulated in fp32, rounded to bfloat16). Parameters,
    state dict and export are ``nn.Linear``'s.
    """

    WEIGHT_GRAD_CHUNK = 512

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() != 2 or not torch.is_autocast_enabled(input.device.type):
            return super().forward(input)
        with torch.autocast(input.device.type, enabled=False):
            return _BFloat16LinearFunction.apply(input, self.weight, self.bias)


class _BFloat16LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x16, weight16 = x.to(torch.bfloat16), weight.to(torch.bfloat16)
        ctx.save_for_backward(x16, weight16)
        ctx.x_dtype = x.dtype
        return torch.nn.functional.linear(x16, weight16, bias.to(torch.bfloat16))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        x16, weight16 = ctx.saved_tensors
        grad = grads[0]
        grad16 = grad.to(torch.bfloat16)
        rows, chunk = grad.shape[0], BFloat16Linear.WEIGHT_GRAD_CHUNK
        full = rows // chunk * chunk
        grad_weight = torch.bmm(grad16[:full].view(-1, chunk, grad.shape[1]).transpose(1, 2),
                                x16[:full].view(-1, chunk, x16.shape[1])).sum(0, dtype=torch.float32)
        if full < rows:
            grad_weight += (grad16[full:].t() @ x16[full:]).float()
        return (grad16 @ weight16).to(ctx.x_dtype), grad_weight, grad16.sum(0).float()


def _bfloat16_linears(model: torch.nn.Module) -> None:
    """Makes every ``nn.Linear`` of ``model`` a :class:`BFloat16Linear` (same parameters)."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = BFloat16Linear


def update_precision(cfg: Agent, device: str) -> str:
    """``agent.precision`` resolved for ``device``: "bf16" or "fp32".

    auto: bf16 on a CPU with bfloat16 products in hardware, AMX tiles (Intel Xeon 4th gen and later)
    or AVX512-BF16 (AMD Zen 4 and later): PPO's update 1.5-2.2x faster there,
    TD3's 1.6x (``bench/update.py``); fp32 elsewhere: on a CPU without them (AVX2, AVX-512 alone)
    bfloat16 products are several times slower, and on a GPU these networks are too small for it
    to pay. Recurrent networks stay fp32 (their products are not :class:`BFloat16Linear`'s)."""
    recurrent = cfg.actor.rnn.type is not None or cfg.critic.rnn.type is not None
    if cfg.precision == "auto":
        return "bf16" if torch.device(device).type == "cpu" and cpu_has_bfloat16() and not recurrent else "fp32"
    if cfg.precision not in ("bf16", "fp32"):
        raise ValueError(f"agent.precision={cfg.precision!r}: expected auto, bf16 or fp32")
    if cfg.precision == "bf16" and recurrent:
        raise ValueError("agent.precision=bf16 needs a feed-forward actor and critic (agent.actor.rnn.type and "
                         "agent.critic.rnn.type null); use agent.precision=fp32 or auto with a recurrent network")
    return cfg.precision


# oneDNN's instruction sets without bfloat16 products. ``ONEDNN_MAX_CPU_ISA`` set to one of them runs
# this CPU as an older one (CI's second pass: an AVX2 machine), whose bfloat16 products would be
# emulated, several times slower than fp32.
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpu_has_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX tiles or AVX512-BF16) and oneDNN may
    use it (``ONEDNN_MAX_CPU_ISA``, or its older name ``DNNL_MAX_CPU_ISA``, does not cap it below)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    if cap.upper() in ONEDNN_ISAS_WITHOUT_BF16:
        return False
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_amx_tile_supported",
                                                                      "_is_avx512_bf16_supported"))


def load_actor(obs: TensorDict, num_actions: int, cfg: Agent, policy: dict, device: str) -> MLPModel:
    """A trained actor alone, with its observation normalizer, from a checkpoint's ``policy``
    (:func:`policy_state`), sized from ``obs`` (its ``policy`` group), in evaluation mode."""
    actor = _build_actor(obs, num_actions, cfg)
    actor.load_state_dict(policy["actor_state_dict"])
    return actor.to(device).eval()


def build_ppo(env: VecEnv, cfg: Agent, device: str, storage: RolloutStorage | None = None,
              group=None) -> PPO:
    """rsl-rl's PPO with an actor (Gaussian) and a critic, MLP or recurrent (``agent.actor.rnn``,
    ``agent.critic.rnn``), sized from the env's observations; with ``agent.symmetry``, rsl-rl's
    symmetry extension on the env's mirror maps (``env.mirror``: :mod:`legion.tasks.symmetry`).

    ``group``: the :class:`legion.agents.distributed.Group` of a multi-process run; its PPO averages
    gradients and the adaptive learning rate's KL over the ranks and starts from rank 0's weights."""
    obs = env.get_observations()
    actor = _build_actor(obs, env.num_actions, cfg)
    critic = _build_critic(obs, cfg)
    if storage is None:
        storage = RolloutStorage("rl", env.num_envs, cfg.num_steps_per_env, stored(obs), [env.num_actions], device)
    symmetry = cfg.symmetry
    symmetry_cfg = None
    if symmetry.augmentation or symmetry.mirror_loss:  # the env's mirror maps (legion.tasks.symmetry)
        if actor.is_recurrent or critic.is_recurrent:  # rsl-rl's own message names augmentation only
            raise ValueError("agent.symmetry (augmentation or mirror_loss) needs a feed-forward actor and critic: "
                             "rsl-rl's symmetry extension takes no recurrent policy. Drop agent.actor.rnn / "
                             "agent.critic.rnn, or agent.symmetry.")
        symmetry_cfg = {"env": env, "data_augmentation_func": env.mirror.augment,  # pyright: ignore[reportAttributeAccessIssue]
                        "use_data_augmentation": symmetry.augmentation, "use_mirror_loss": symmetry.mirror_loss,
                        "mirror_loss_coeff": symmetry.mirror_loss_coeff}
    bfloat16 = update_precision(cfg, device) == "bf16"
    if bfloat16:
        _bfloat16_linears(actor)
        _bfloat16_linears(critic)
    ppo = PPO(actor, critic, storage, device=device, multi_gpu_cfg=group.ppo_cfg if group else None,
              symmetry_cfg=symmetry_cfg, use_mixed_precision=bfloat16, **asdict(cfg.algorithm))
    if group is not None:
        ppo.broadcast_parameters()
    return ppo


class NoCritic(torch.nn.Module):
    """The critic of the asynchronous actor's policy when samples may lag (lag >= 1): values of
    zero. The learner re-evaluates every state with its own, newer critic anyway (see
    :func:`compute_returns_off_policy`), so the actor skips that forward pass, and rsl-rl's
    ``PPO.process_env_step`` adds no time-out bootstrap (the learner adds it with its values)."""

    is_recurrent = False

    def forward(self, obs: TensorDict, **kwargs) -> torch.Tensor:
        return torch.zeros(obs.batch_size[0], 1, device=obs.device)

    def get_hidden_state(self):
        return None

    def reset(self, dones=None, hidden_state=None) -> None:
        pass

    def update_normalization(self, obs) -> None:
        pass


def build_behaviour_ppo(env: VecEnv, cfg: Agent, device: str, critic: bool = True) -> PPO:
    """A second PPO for the actor thread: its own copies of the networks, loaded from the
    learner's published weights with :func:`load_weights`, so acting never reads a network
    the learner is changing. Its optimizer is never stepped. ``critic=False``: a :class:`NoCritic`."""
    # Fresh networks draw initial weights from the global RNG; fork it so a seeded run draws
    # the same numbers as sync mode (the weights are overwritten at the first swap anyway).
    with torch.random.fork_rng(devices=[]):
        obs = env.get_observations()
        actor = _build_actor(obs, env.num_actions, cfg)
        critic_model = _build_critic(obs, cfg) if critic else NoCritic()
    # rsl-rl annotates critic: MLPModel and storage: RolloutStorage. This PPO only acts: a NoCritic
    # (duck-typed: what PPO calls on a critic) will do, and the actor thread sets each rollout's storage.
    return PPO(actor, critic_model, storage=None,  # pyright: ignore[reportArgumentType]
               device=device, **asdict(cfg.algorithm))


def action_std(ppo: PPO) -> torch.Tensor:
    """The actor's action std, the parameter itself (rsl-rl's GaussianDistribution, scalar std)."""
    distribution = ppo.actor.distribution
    if distribution is None or not hasattr(distribution, "std_param"):
        raise TypeError("the actor has no Gaussian action distribution with a scalar std parameter")
    return cast(torch.Tensor, distribution.std_param)


def policy_state(ppo: PPO) -> dict:
    """Everything learned: networks with their normalizers, optimizer, learning rate.

    The tensors are the live ones (no copy); see :func:`clone_tree` for a snapshot."""
    return {**ppo.save(), "learning_rate": ppo.learning_rate}


def load_policy_state(ppo: PPO, state: dict) -> None:
    ppo.load(state, load_cfg=None, strict=True)
    ppo.learning_rate = state["learning_rate"]
    for group in ppo.optimizer.param_groups:
        group["lr"] = ppo.learning_rate


def load_weights(ppo: PPO, state: dict, critic: bool = True) -> None:
    """Copies the networks (and their observation normalizers) of a :func:`policy_state` in place."""
    ppo.load(state, load_cfg={"actor": True, "critic": critic}, strict=True)


def restore_if_nonfinite(ppo: PPO, losses: dict, last_good: dict) -> list[str]:
    """Call after ``ppo.update()``: what came out NaN or Inf (``"<name> loss"``, ``"actor"``,
    ``"critic"``: weights or observation-normalizer statistics), after restoring ``last_good`` (a
    :func:`policy_state` copy from before the update: networks, normalizers, optimizer, learning
    rate) if anything did. An empty list: the update stands. One host sync per call."""
    bad = [f"{name} loss" for name, value in losses.items() if not math.isfinite(value)]
    models = {"actor": ppo.actor, "critic": ppo.critic}
    finite = torch.stack([torch.stack([torch.isfinite(t).all() for t in model.state_dict().values()
                                       if t.is_floating_point()]).all() for model in models.values()]).tolist()
    bad += [name for name, ok in zip(models, finite) if not ok]
    if bad:
        load_policy_state(ppo, last_good)
    return bad


def nonfinite_rollout(storage: RolloutStorage) -> list[str]:
    """Call before ``ppo.update()``: what in a collected rollout is NaN or Inf (``"rewards"``,
    ``"observations 'policy'"``, ...). An empty list: the rollout is fit to learn from. rsl-rl's
    update cannot take NaN: it makes the weights NaN at the first mini-batch and the next one
    raises inside torch ("normal expects all elements of std >= 0.0"). One host sync per call."""
    obs = storage.observations
    named = {"rewards": storage.rewards, **{f"observations '{group}'": obs[group] for group in obs.keys()}}
    finite = torch.stack([torch.isfinite(t).all() for t in named.values()]).tolist()
    return [name for name, ok in zip(named, finite) if not ok]


def map_tensors(obj: _Tree, fn: Callable[[torch.Tensor], torch.Tensor]) -> _Tree:
    """A copy of nested dicts/lists/tuples with ``fn`` applied to every tensor in it (same
    structure, so the same type)."""
    return cast(_Tree, _map_tensors(obj, fn))


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def clone_tree(obj: _Tree) -> _Tree:
    """A copy of nested dicts/lists/tuples in which every tensor is cloned (detached)."""
    return map_tensors(obj, lambda t: t.detach().clone())


class Stopped(Exception):
    """Raised inside ``PPO.update`` when a stop was requested (between mini-batches)."""


class RolloutBuffer(RolloutStorage):
    """rsl-rl's rollout storage plus what an asynchronous learner needs to know about a rollout.

    Attributes (T = steps per env, N = envs):
        versions: the policy version that chose the actions of each step, length T.
        time_outs: (T, N, 1) episodes cut by the time limit (bootstrapped by the learner).
        last_obs: observations after the last step (for the bootstrap value).
        stop: when set, the next mini-batch of an update raises :class:`Stopped`.
        before_batch: called before each mini-batch of an update (the async learner sets its
            torch threads there: :class:`legion.agents.runner.UpdateThreads`).
    """

    def __init__(self, env: VecEnv, num_steps: int, device: str, stop: threading.Event | None = None):
        obs = env.get_observations()
        super().__init__("rl", env.num_envs, num_steps, stored(obs), [env.num_actions], device)
        self.versions: list[int] = []
        self.time_outs = torch.zeros(num_steps, env.num_envs, 1, device=device)
        self.last_obs = obs.clone()
        self.last_critic_state = None  # a recurrent critic's state after the last step (lag 0's bootstrap)
        self.stop = stop
        self.before_batch: Callable[[], None] | None = None

    def _stoppable(self, batches):
        for batch in batches:
            if self.stop is not None and self.stop.is_set():
                raise Stopped
            if self.before_batch is not None:
                self.before_batch()
            yield batch

    def mini_batch_generator(self, num_mini_batches: int, num_epochs: int = 8):
        return self._stoppable(super().mini_batch_generator(num_mini_batches, num_epochs))

    def recurrent_mini_batch_generator(self, num_mini_batches: int, num_epochs: int = 8):
        return self._stoppable(super().recurrent_mini_batch_generator(num_mini_batches, num_epochs))


def vtrace(values, rewards, dones, last_values, log_rhos, gamma: float, lam: float,
           rho_clip: float = 1.0, c_clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace(lambda) value targets and advantages (Espeholt et al. 2018, eq. 1 with
    c_t = lambda * min(c, ratio)) for actions taken by a behaviour policy mu, evaluated for the
    learner's policy pi.

    All inputs (T, N, 1) except ``last_values`` (N, 1); ``log_rhos`` = log pi(a|s) - log mu(a|s).
    With rho_t = min(rho_clip, pi/mu), c_t = min(c_clip, pi/mu), not_done_t = 1 - done_t:

        delta_t   = r_t + gamma * not_done_t * V_{t+1} - V_t
        v_t - V_t = rho_t * delta_t + gamma * lam * c_t * not_done_t * (v_{t+1} - V_{t+1})   (targets)
        A_t       = delta_t + gamma * lam * not_done_t * (v_{t+1} - V_{t+1})                 (advantages)

    A_t is IMPALA's policy-gradient advantage r_t + gamma v_{t+1} - V_t in lambda form, without
    IMPALA's factor rho_t: :func:`compute_returns_off_policy` weights it (after normalizing).
    With pi = mu (log_rhos = 0) both are rsl-rl's GAE(gamma, lambda), in its order of operations.

    Returns:
        (targets, advantages), each (T, N, 1).
    """
    ratios = torch.exp(log_rhos)
    rhos, cs = ratios.clamp(max=rho_clip), ratios.clamp(max=c_clip)
    targets, advantages = torch.zeros_like(values), torch.zeros_like(values)
    correction = 0  # v_{t+1} - V_{t+1}
    for step in reversed(range(values.shape[0])):
        next_values = last_values if step == values.shape[0] - 1 else values[step + 1]
        next_is_not_terminal = 1.0 - dones[step].float()
        delta = rewards[step] + next_is_not_terminal * gamma * next_values - values[step]
        advantages[step] = delta + next_is_not_terminal * gamma * lam * correction
        correction = rhos[step] * delta + next_is_not_terminal * gamma * lam * cs[step] * correction
        targets[step] = correction + values[step]
    return targets, advantages


def compute_returns_off_policy(ppo: PPO, rollout: RolloutBuffer, rho_clip: float, c_clip: float) -> None:
    """Prepares a rollout collected by an older policy mu (async PPO) so that rsl-rl's unchanged
    ``PPO.update`` optimizes the decoupled PPO objective (Hilton et al. 2021, "Batch size-invariance
    for policy optimization"; IMPACT, Luo et al. 2020, truncates its weight the same way):

        E_mu[ w_t * min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t) ],
        r_t = pi_theta / pi_prox,   w_t = min(rho_clip, pi_prox / mu)

    pi_prox is the learner's policy as the update starts (version k). The learner re-evaluates
    every state with its current critic and the taken actions with its current actor, then
    computes V-trace targets and advantages (:func:`vtrace`). The rollout's stored log-probs and
    distribution become pi_prox's, and its advantages (normalized, as rsl-rl does) are weighted
    by w_t: the behaviour policy's log-probabilities enter through w_t, while PPO's clip and the
    adaptive learning rate's KL measure the update's own step from pi_prox, as in sync PPO.

    Why: clipping and measuring the KL against mu instead centres the trust region on a policy
    one update old. The KL then starts each update near the previous update's own step, the
    adaptive rate shrank 3-25x below sync's, and quadruped_flat reached a mean reward of 0.9
    after 100 iterations where sync reached 3.8-4.6 (BENCHMARKS.md).
    (With ``normalize_advantage_per_mini_batch`` rsl-rl re-normalizes the weighted advantages.)

    A recurrent actor is re-evaluated on the actor's sequences as the update will see them: each
    trajectory from the recurrent state the behaviour policy stored at its start (zero after a
    reset). The critic is feed-forward here (the actor thread runs none at lag >= 1).
    """
    st, T, N = rollout, rollout.num_transitions_per_env, rollout.num_envs
    obs = st.observations.flatten(0, 1)
    values = ppo.critic(obs).view(T, N, 1)
    last_values = ppo.critic(st.last_obs)
    actor = ppo.actor
    assert actor.distribution is not None, "the actor is built with a distribution (_build_actor)"
    if actor.is_recurrent:  # one batch of every trajectory (RolloutStorage's: no stop check here)
        batch = next(RolloutStorage.recurrent_mini_batch_generator(st, 1, 1))
        latent, actions = actor.get_latent(batch.observations, batch.masks, batch.hidden_states[0]), st.actions
    else:
        latent, actions = actor.get_latent(obs), st.actions.flatten(0, 1)
    actor.distribution.update(actor.mlp(latent))  # the distribution, without sampling
    log_prob = actor.get_output_log_prob(actions).view(T, N, 1)
    # The actor had no critic: bootstrap time-outs here, as rsl-rl's process_env_step does.
    st.rewards += ppo.gamma * values * st.time_outs
    log_rhos = log_prob - st.actions_log_prob
    targets, advantages = vtrace(values, st.rewards, st.dones, last_values, log_rhos, ppo.gamma, ppo.lam,
                                 rho_clip, c_clip)
    st.returns.copy_(targets)
    st.values.copy_(values)
    if not ppo.normalize_advantage_per_mini_batch:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    st.advantages = advantages * torch.exp(log_rhos).clamp(max=rho_clip)
    st.actions_log_prob.copy_(log_prob)
    assert st.distribution_params is not None, "set by the rollout's first transition"
    for stored, prox in zip(st.distribution_params, actor.output_distribution_params):
        stored.copy_(prox.view_as(stored))
