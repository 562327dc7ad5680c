"""Demonstrations for learning from them (``agent.mode=bc | dagger``,
:class:`legion.agents.imitation.ImitationRunner`): read from trajectory files or LeRobot datasets
and checked against the task, and the expert a DAgger run asks for labels.
"""

from __future__ import annotations

from pathlib import Path

import torch

from legion.configs.schema import Agent


def imitation_inputs(agent: Agent, env) -> dict:
    """The keyword arguments :func:`legion.api.make_runner` passes to an imitation runner: ``demos``
    (from ``agent.imitation.demos``) and ``expert`` (``agent.imitation.expert``, in dagger mode);
    none for PPO."""
    from legion.sim2real.trajectories.record import scripted_policy

    if agent.mode not in ("bc", "dagger"):
        return {}
    imitation = agent.imitation
    return {"demos": load_demos(imitation.demos, env) if imitation.demos else None,
            "expert": scripted_policy(imitation.expert, env) if agent.mode == "dagger" and imitation.expert else None}


def load_demos(paths: list[str], env) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy observations (N, D) and actions (N, A) of every step of every episode in
    ``paths`` (trajectory files, or LeRobot datasets ``legion dataset convert`` wrote), checked
    against ``env``'s task: its name, robot, action size and policy observation terms (names,
    order, sizes)."""
    from legion.sim2real.trajectories.file import TrajectoryFile, sha256_file
    from legion.sim2real.trajectories.lerobot import read_policy_demos
    from legion.tasks.sim import resolve_asset

    wanted = [(t["name"], t["size"]) for t in env.observation_layout()["policy"]]
    task, robot_file = env.cfg.name, resolve_asset(env.cfg.scene.robot.file)
    observations, actions = [], []
    for path in map(Path, paths):
        if path.is_dir():  # a LeRobot dataset: the robot is known by its joints
            demos = read_policy_demos(path)
            recorded, terms = demos["task"], demos["terms"]
            robot_differs = demos["joints"] != list(env.robot.joint_names) and \
                f"joints {demos['joints']}; this run's robot has {list(env.robot.joint_names)}"
            observations.append(torch.as_tensor(demos["observations"]))
            actions.append(torch.as_tensor(demos["actions"]))
        else:
            with TrajectoryFile(path) as f:
                recorded = f.attrs.get("task")
                terms = [(t["name"], t["size"]) for t in f.attrs["observation_layout"]["policy"]]
                robot_differs = f.attrs.get("robot_sha256") != sha256_file(robot_file) and \
                    f"the robot model {f.attrs.get('robot_file')}; this run's is {robot_file} (a different file)"
                for name in f.episodes:
                    episode = f.episode(name)
                    observations.append(torch.cat([torch.as_tensor(episode.data[f"obs/policy/{t}"]).float()
                                                   .reshape(episode.length, -1) for t, _ in terms], 1))
                    actions.append(torch.as_tensor(episode.data["actions"]).float())
        if recorded != task:
            raise ValueError(f"{path} holds episodes of task {recorded}, not {task}: record demonstrations of "
                             f"this task (legion record ... task={task}).")
        if robot_differs:
            raise ValueError(f"{path} was recorded with {robot_differs}: record demonstrations with this robot.")
        if terms != wanted:
            raise ValueError(f"{path}: its policy observations are {dict(terms)} (name: size, in order); this task's "
                             f"are {dict(wanted)}. Record the demonstrations with this task's observation config.")
    obs, act = torch.cat(observations).to(env.device), torch.cat(actions).to(env.device)
    if act.shape[1] != env.num_actions:
        raise ValueError(f"the demonstrations have {act.shape[1]} actions per step; this task has {env.num_actions}.")
    return obs, act
