"""The one place that touches rsl-rl's API: PPO, its models, normalizers and storage.

rsl-rl 5.5 is the PPO core (GAE, clipped surrogate and value losses, adaptive learning rate,
empirical observation normalization). Everything here maps legion's ``agent`` config onto it,
so an rsl-rl upgrade changes this module only.
"""

from __future__ import annotations

from rsl_rl.algorithms import PPO
from rsl_rl.env import VecEnv
from rsl_rl.models import MLPModel
from rsl_rl.storage import RolloutStorage


def obs_groups_for(obs) -> dict[str, list[str]]:
    """The actor sees the ``policy`` group; the critic ``critic`` if the task has one."""
    return {"actor": ["policy"], "critic": ["critic"] if "critic" in obs.keys() else ["policy"]}


def build_ppo(env: VecEnv, agent_cfg: dict, device: str) -> PPO:
    """rsl-rl's PPO with MLP actor (Gaussian) and critic, sized from the env's observations."""
    obs = env.get_observations()
    groups = obs_groups_for(obs)
    actor_cfg, critic_cfg = dict(agent_cfg["actor"]), dict(agent_cfg["critic"])
    init_std = actor_cfg.pop("init_noise_std", 1.0)
    actor = MLPModel(
        obs, groups, "actor", env.num_actions,
        distribution_cfg={"class_name": "GaussianDistribution", "init_std": init_std},
        **actor_cfg,
    )
    critic = MLPModel(obs, groups, "critic", 1, **critic_cfg)
    storage = RolloutStorage("rl", env.num_envs, agent_cfg["num_steps_per_env"], obs, [env.num_actions], device)
    return PPO(actor, critic, storage, device=device, **agent_cfg["algorithm"])


def policy_state(ppo: PPO) -> dict:
    """Everything learned: networks with their normalizers, optimizer, learning rate."""
    return {**ppo.save(), "learning_rate": ppo.learning_rate}


def load_policy_state(ppo: PPO, state: dict) -> None:
    ppo.load(state, load_cfg=None, strict=True)
    ppo.learning_rate = state["learning_rate"]
    for group in ppo.optimizer.param_groups:
        group["lr"] = ppo.learning_rate
