"""Demonstrations for learning from them (``agent.mode=bc | dagger``,
:class:`legion.agents.imitation.ImitationRunner`): read from trajectory files or LeRobot datasets
and checked against the task, and the expert a DAgger run asks for labels: a scripted policy
(``agent.imitation.expert=scripted:<module>:<function>``) or a trained run, the teacher of a
teacher-student distillation (``run:<run folder or checkpoint>``).

A teacher acts on its own policy observations, privileged ones included (a base velocity a robot
cannot measure, a height scan), while the student learns on the task's: :func:`with_teacher_observations`
adds the teacher's observations to the student's env as the group ``teacher`` before it is built.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
from tensordict import TensorDict

from legion.configs import ConfigError, load_run_config
from legion.configs.schema import Agent, Train


def imitation_inputs(agent: Agent, env) -> dict:
    """The keyword arguments :func:`legion.api.make_runner` passes to an imitation runner: ``demos``
    (from ``agent.imitation.demos``) and ``expert`` (``agent.imitation.expert``, in dagger mode);
    none for PPO."""
    from legion.sim2real.trajectories.record import scripted_policy

    if agent.mode not in ("bc", "dagger"):
        return {}
    imitation, teacher = agent.imitation, teacher_run(agent)
    expert = None
    if teacher is not None:
        expert = teacher_policy(*teacher, env)
    elif agent.mode == "dagger" and imitation.expert:
        expert = scripted_policy(imitation.expert, env)
    return {"demos": load_demos(imitation.demos, env) if imitation.demos else None, "expert": expert}


def teacher_run(agent: Agent) -> tuple[Path, Train] | None:
    """The run folder or checkpoint a distillation's teacher is (``agent.imitation.expert=run:<path>``),
    and that run's config."""
    spec = agent.imitation.expert
    if agent.mode != "dagger" or not spec or not spec.startswith("run:"):
        return None
    path = Path(spec.removeprefix("run:"))
    if not path.exists():
        raise ConfigError(f"agent.imitation.expert={spec}: no such run folder or checkpoint. A teacher is a trained "
                          "run: run:runs/<task>/<run> (its newest good checkpoint) or run:<...>/model_<N>.pt")
    return path, load_run_config(path if path.is_dir() else path.parent)


def with_teacher_observations(cfg: Train) -> Train:
    """``cfg`` with its teacher's policy observations as the observation group ``teacher``, when
    ``agent.imitation.expert`` names a trained run (otherwise ``cfg`` itself). The teacher must
    drive the same robot through the same action, or its labels would mean something else: both
    are checked, by name."""
    found = teacher_run(cfg.agent)
    if found is None:
        return cfg
    from legion.tasks.sim import resolve_asset

    teacher = found[1]
    spec = cfg.agent.imitation.expert
    robot, teacher_robot = resolve_asset(cfg.task.scene.robot.file), resolve_asset(teacher.task.scene.robot.file)
    if robot != teacher_robot:
        raise ConfigError(f"agent.imitation.expert={spec}: the teacher drives {teacher_robot}; this task's robot is "
                          f"{robot}. Distil onto the teacher's robot (robot=...), or train a teacher on this one.")
    if teacher.task.action != cfg.task.action:
        raise ConfigError(f"agent.imitation.expert={spec}: the teacher acts through {teacher.task.action}; this task "
                          f"through {cfg.task.action}. Its labels are actions of that kind: give the student the "
                          "teacher's task.action.")
    observations = {**cfg.task.observations, "teacher": copy.deepcopy(teacher.task.observations["policy"])}
    return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, observations=observations))


def teacher_policy(path: Path, teacher: Train, env):
    """The trained run's actor (its newest good checkpoint, or the one ``path`` names; ``teacher``:
    the run's config) as an expert: observations -> its deterministic actions on the ``teacher`` group."""
    from legion.agents.checkpoints import CheckpointError, latest_good_checkpoint, load_checkpoint
    from legion.agents.ppo import load_actor

    obs = env.get_observations()
    if "teacher" not in obs.keys():
        raise ValueError("this env has no 'teacher' observations: build it from with_teacher_observations(cfg)")
    try:
        checkpoint = load_checkpoint(path) if path.is_file() else latest_good_checkpoint(path)[1]
        actor = load_actor(TensorDict({"policy": obs["teacher"]}, batch_size=obs.batch_size), env.num_actions,
                           teacher.agent, checkpoint["policy"], env.device)
    except (CheckpointError, RuntimeError, KeyError) as e:
        raise ConfigError(f"agent.imitation.expert=run:{path}: its policy cannot be loaded: {e}") from None

    return TeacherPolicy(actor)


class TeacherPolicy:
    """A trained actor acting on the ``teacher`` observation group; ``reset(dones)`` ends a
    recurrent teacher's state with each episode, as in training."""

    def __init__(self, actor):
        self.actor = actor

    def __call__(self, obs: TensorDict) -> torch.Tensor:
        return self.actor(TensorDict({"policy": obs["teacher"]}, batch_size=obs.batch_size))

    def reset(self, dones: torch.Tensor) -> None:
        self.actor.reset(dones)


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
