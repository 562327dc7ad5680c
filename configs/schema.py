"""Typed schemas of every config node: the YAML files in this folder are checked against them.

Registered in Hydra's ConfigStore (:func:`register`) as ``legion_train``, the first entry of
``train.yaml``'s defaults, so the YAML files and the command line are merged into these
dataclasses: a misspelt key fails while the config is composed, naming the key and the valid
ones, and a value of the wrong type fails there too. Every default lives here, once; the YAML
files set only what a task, an agent or a solver changes.

Named entries (reward terms, event terms, objects, ...) are declared ``dict[str, Any]`` with the
entry's dataclass in the field's metadata (:func:`entries`), and :func:`typed` checks and
converts each entry: OmegaConf cannot assign a new entry to a dict of dataclasses, and these
are the sections users add to and remove from on the command line (``+task.rewards.x={...}``,
``~task.events.push``). Term functions take their keyword arguments from ``params``, checked
against the function's signature when the env is built.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

# OmegaConf's marker of a value that has no default ("???"), written here so that the schema
# imports without the training stack (omegaconf is imported where configs are composed).
MISSING: Any = "???"


def entries(kind: type, depth: int = 1):
    """A field of named entries of dataclass ``kind`` (``depth`` 2: groups of named entries)."""
    return field(default_factory=dict, metadata={"entries": kind, "depth": depth})


# --- the scene: what each simulated world holds --------------------------------------------------
@dataclass
class Actuator:
    """The joints one kind of drive moves (tasks/sim/scene.py applies these when the robot is built).

    ``implicit``: a PD servo inside the solver, ``kp (q* - q) - kd q'`` clipped to the effort
    limit, integrated implicitly (stable at any gain). ``dc_motor``: the same PD law evaluated
    explicitly at every physics step (Newton's ``newton.actuators``; on the C backend the same
    law as MuJoCo actuators, tasks/sim/solver.py), clipped by a DC motor's torque-speed line:
    ``saturation_effort`` at stall, falling to zero at ``velocity_limit``, never above
    ``effort_limit`` (Isaac Lab's DCMotor). ``network``: an actuator network (Hwangbo et al. 2019;
    ``legion calibrate ... actuator_network=true`` learns one from a robot's logs): a small MLP from
    each joint's recent position errors and velocities to its torque, evaluated at every physics
    step for all worlds, clipped to the effort limit (stiffness and damping then only size the
    torque penalty's estimate). A dc_motor's ``backlash`` is its gearbox's play: the PD law acts on
    the position error less half the play (a dead zone), as a robot's reality file writes it
    (``legion calibrate`` fits it). Values left None keep the model file's. The randomization
    events scale these values per env (``joint_backlash`` draws the play).
    """

    joints: Any = ".*"  # regex (or list of regexes) over the robot's actuated joint names
    model: str = "implicit"  # implicit | dc_motor | network
    network: Optional[str] = None  # model: network: its file (.npz; a path, or package://)
    stiffness: Optional[float] = None  # kp [N m/rad or N/m]
    damping: Optional[float] = None  # kd [N m s/rad or N s/m]
    effort_limit: Optional[float] = None  # [N m or N]
    saturation_effort: Optional[float] = None  # dc_motor: stall torque [N m or N]
    velocity_limit: Optional[float] = None  # dc_motor: speed at which the torque reaches zero [rad/s or m/s]
    armature: Optional[float] = None  # reflected rotor inertia [kg m^2]
    friction: Optional[float] = None  # joint friction loss [N m or N]
    delay: int = 0  # dc_motor: the motor acts on the targets of this many physics steps before (latency)
    backlash: float = 0.0  # dc_motor: gear play [rad]; a position error within half of it either side drives nothing


@dataclass
class Collision:
    """How the robot's collision shapes are simplified (fewer, cheaper contacts: the throughput of
    a robot with mesh colliders is contact-bound). Keys are body-name regexes."""

    # body regex -> bounding_sphere | bounding_box | convex_hull: each mesh collider of a matching
    # body becomes that primitive (Newton's ModelBuilder.approximate_meshes), fitted to the mesh
    approximate: dict[str, str] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)  # body regexes whose collision shapes are dropped
    self_collisions: bool = False
    max_hull_vertices: int = 64  # convex hulls of mesh colliders keep at most this many vertices


@dataclass
class MirrorMap:
    """The robot's left-right symmetry in its sagittal (x-z) plane (agent.symmetry; tasks/symmetry.py)."""

    swap: dict[str, str] = field(default_factory=dict)  # joint-name substrings that trade sides, e.g. {FL_: FR_}
    # regex over joint names: the joints that turn the other way in the mirror (axes along x or
    # z: roll and yaw); pitch joints (axis along y) keep their sign
    negate: str = ""


@dataclass
class Robot:
    """The articulated robot, entity ``robot`` of the scene (configs/robot/: one file per robot)."""

    # MJCF (.xml), URDF or USD model: a path, a file name in tasks/assets, or package://<pkg>/<path>
    # for a file an installed package ships (e.g. package://example-robot-data/robots/...)
    file: str = MISSING
    floating_base: Optional[bool] = None  # None: the file's (MJCF: a freejoint; URDF and USD: fixed)
    collapse_fixed_joints: bool = False  # merge bodies joined by fixed joints (URDF rotor links: fewer bodies)
    # the robot's own controller cancels gravity on its links, as a Franka's does under torque or
    # impedance control (MuJoCo's body gravcomp; sim=mujoco): a stiff pose hold without a sag
    gravity_compensation: bool = False
    root_height: Optional[float] = None  # floating base: initial base height [m] (None: the model's)
    joint_pos: dict[str, float] = field(default_factory=dict)  # default pose, joint-name regex -> [rad or m]
    # name -> body regex: the groups the tasks name (feet, base, the contacts that end an episode,
    # the tool centre point, ...), so one task file serves every robot of its kind
    bodies: dict[str, str] = field(default_factory=dict)
    joints: dict[str, str] = field(default_factory=dict)  # name -> joint regex (e.g. arm, gripper)
    actuators: dict[str, Any] = entries(Actuator)  # name -> Actuator, applied in order (later wins)
    collision: Collision = field(default_factory=Collision)
    mirror: MirrorMap = field(default_factory=MirrorMap)
    # joint_position actions on this robot, [rad per unit action]: one value, or joint regex ->
    # value (later patterns win); null: task.action.scale. Per joint where the gains differ by
    # joint: mjlab's 0.25 effort_limit / stiffness asks every joint for the same share of its torque.
    action_scale: Any = None


@dataclass
class Terrain:
    """A generated terrain all worlds share, one heightfield (tasks/sim/terrain.py): square
    tiles in a grid, rows along x = difficulty levels (0 easiest), columns along y = terrain types,
    inside a flat border. Every tile's edge is at height 0; each env starts on the flat platform at
    its tile's centre, and only its tile (level, column) is per env."""

    tile_size: float = 8.0  # edge of a square tile [m]
    num_levels: int = 10  # rows of tiles: difficulty levels
    num_cols: int = 20  # columns of tiles, shared out to the types by their proportions
    # type -> share of the columns (0 drops a type). Seen from the tile's centre, where the robot
    # starts: slope/stairs _up climb towards the edges, _down descend.
    types: dict[str, float] = field(default_factory=lambda: {
        "rough": 0.1, "slope_up": 0.1, "slope_down": 0.1, "stairs_up": 0.25, "stairs_down": 0.25, "obstacles": 0.2})
    resolution: float = 0.1  # horizontal grid spacing [m]
    border: float = 20.0  # flat margin around the tiles [m]: robots that leave the grid stay on ground
    platform: float = 2.0  # flat square at each tile's centre [m]
    # Difficulty: [level 0, highest level], linear in between.
    slope: list[float] = field(default_factory=lambda: [0.0, 0.4])  # slope_*: rise over run
    step_height: list[float] = field(default_factory=lambda: [0.05, 0.18])  # stairs_* [m]
    step_width: float = 0.31  # stairs: tread depth [m]
    rough_height: list[float] = field(default_factory=lambda: [0.02, 0.08])  # rough: bumps of +-this [m] every 0.2 m
    obstacle_height: list[float] = field(default_factory=lambda: [0.05, 0.2])  # obstacles: boxes of +-this [m]
    num_obstacles: int = 20  # obstacles: boxes of 1-2 m per tile
    curriculum: bool = True  # levels follow the distance walked (tasks/mdp/curriculum.py); false: random, fixed
    max_init_level: int = 4  # curriculum: envs start at levels 0..max_init_level
    seed: int = 0  # the terrain's own random pattern (not the run's seed: one terrain for all seeds)


@dataclass
class Ground:
    """The ground all worlds share: a plane at z = 0, or a generated terrain (``terrain``)."""

    friction: float = 1.0  # sliding friction coefficient (robot shapes take contact priority)
    terrain: Optional[Terrain] = None  # null: a plane


@dataclass
class RigidObject:
    """A free rigid body in every world (e.g. a cube to lift)."""

    shape: str = "box"  # box | sphere | capsule | cylinder
    # box: edge lengths [x, y, z]; sphere: [radius]; capsule, cylinder: [radius, length] [m]
    size: list[float] = MISSING
    mass: float = MISSING  # [kg]
    friction: float = 1.0
    pos: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # initial position, env frame [m]
    quat: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 1.0])  # initial orientation (x, y, z, w)


@dataclass
class Fixture:
    """Static geometry in every world (e.g. a table): collides, never moves."""

    shape: str = "box"
    size: list[float] = MISSING
    friction: float = 1.0
    pos: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    quat: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 1.0])


@dataclass
class Camera:
    """A pinhole camera in every world, rendered for all worlds at once on the env's device
    (Newton's ray tracer). Its frame looks along its +x with +z up (ROS's camera-link convention)."""

    body: Optional[str] = None  # the robot body it is mounted on; null: fixed in the env frame
    pos: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # in the body's (env's) frame [m]
    quat: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 1.0])  # (x, y, z, w) in that frame
    fov: float = 58.0  # vertical field of view [deg] (a RealSense D435's depth imager: 58)
    width: int = 64  # [pixels]
    height: int = 64
    channels: list[str] = field(default_factory=lambda: ["depth"])  # depth (planar, metres) | rgb | segmentation
    near: float = 0.1  # [m]: depth nearer than this, or farther than ``far``, reads as no return (0)
    far: float = 5.0  # [m]
    period: int = 1  # a new frame every ``period`` control steps (and at each world's reset)


@dataclass
class Scene:
    robot: Robot = field(default_factory=Robot)
    ground: Optional[Ground] = field(default_factory=Ground)  # null: no ground (e.g. cart-pole)
    objects: dict[str, Any] = entries(RigidObject)  # name -> RigidObject
    fixtures: dict[str, Any] = entries(Fixture)  # name -> Fixture
    contact_sensing: bool = True  # net contact force per body after each control step (sim=mujoco)
    cameras: dict[str, Any] = entries(Camera)  # name -> Camera


# --- MDP terms -------------------------------------------------------------------------------------
# ``func``: a function of legion.tasks.mdp.<kind>, or "package.module:function" for a task's own
# term; default: the entry's name. Parameters named ``joints`` / ``bodies`` are name patterns,
# resolved once to indices when the env is built; ``entity`` names a scene entity (default robot).
@dataclass
class ObservationTerm:
    func: Optional[str] = None
    params: dict[str, Any] = field(default_factory=dict)
    scale: Any = 1.0  # one factor, or one per element
    noise: float = 0.0  # uniform noise half-width in the term's units (training only)
    clip: Optional[float] = None  # clip to [-clip, clip] before scaling
    enabled: bool = True  # false: the group leaves it out (a variant that drops an inherited term)


@dataclass
class RewardTerm:
    func: Optional[str] = None
    params: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0  # the env multiplies by weight * control dt; 0 drops the term


@dataclass
class TerminationTerm:
    func: Optional[str] = None
    params: dict[str, Any] = field(default_factory=dict)
    time_out: bool = False  # a time-out (bootstrapped by PPO), not a failure


@dataclass
class Curriculum:
    start: list[float] = MISSING  # [low, high] at step 0 ...
    steps: int = MISSING  # ... moving linearly to the term's range over this many control steps
    interval_s: Optional[list[float]] = None  # an interval term's [low, high] at step 0, moving alike to its interval_s


@dataclass
class EventTerm:
    """Episode starts and domain randomization (functions: tasks/mdp/events.py; modes, ranges,
    distributions: tasks/managers/event.py)."""

    func: Optional[str] = None
    mode: str = "reset"  # startup (once) | reset (each episode start) | interval (every interval_s)
    range: list[float] = MISSING  # [low, high] of the drawn value, in the term's units
    distribution: str = "uniform"  # uniform | log_uniform | gaussian
    interval_s: Optional[list[float]] = None  # interval mode: [low, high] seconds between events
    params: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    curriculum: Optional[Curriculum] = None


@dataclass
class Action:
    # joint_position: targets = default + scale * action | joint_position_delta: targets = previous
    # targets + scale * action, within the joint limits | joint_effort: efforts = scale * action |
    # task_space: a body's pose (relative: moved by scale [m] and rotation_scale [rad] per unit per
    # step; absolute: default pose + scale * action) through differential IK, plus a gripper
    type: str = "joint_position"
    joints: str = ".*"  # the actuated joints this action drives (regex); task_space: the arm's
    scale: float = 1.0
    clip: Optional[float] = None  # clip the policy's output to [-clip, clip]
    # joint_position: clamp the targets to the joint limits, as a robot that rejects targets past
    # them does (a gripper's stroke); joint_position_delta always does
    clamp_to_limits: bool = False
    # joint_position: the largest change of a target per second [rad/s] (None: any), as the edge
    # runtime's safety clamp (max_target_rate, 20 rad/s) will hold it on the robot; an episode's
    # first targets are free
    max_target_rate: Optional[float] = None
    # task_space: body (the controlled body, e.g. tcp), mode (relative | absolute), rotation_scale,
    # damping (the IK's, [m]), max_error [m], gripper (joints regex; one action: > 0 open, < 0 close)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Command:
    """What the policy is asked to do, resampled per env every ``resampling_time_s``
    (tasks/mdp/commands.py)."""

    # velocity: base (v_x, v_y, yaw rate) | pose: a body's position and orientation | position: a
    # body's position (pose and position: in the robot's base frame)
    type: str = "velocity"
    ranges: dict[str, list[float]] = field(default_factory=dict)  # per component: [low, high]
    resampling_time_s: float = 10.0
    standing_fraction: float = 0.0  # velocity: share of exactly-zero commands
    turning_fraction: float = 0.0  # velocity: share of commands that only turn (zero linear velocity)
    entity: str = "robot"  # pose, position: the scene entity whose body is commanded (e.g. cube)
    body: Optional[str] = None  # pose, position: that body's name (e.g. tcp); None: the entity's first body


@dataclass
class Success:
    """When an episode counts as a success: a condition held ``hold_s`` without a break, latched per
    episode. Measured on the device every control step (never ends an episode), logged as
    ``Episode_Success/rate``, reported by evaluation."""

    # f(env, **params) -> (num_envs,) bool: legion.tasks.mdp.terminations or "package.module:function"
    func: str = MISSING
    params: dict[str, Any] = field(default_factory=dict)
    hold_s: float = 0.0  # [s], rounded to whole control steps (0: one control step)


@dataclass
class Record:
    """Recording the policy's episodes while training (``legion.sim2real.trajectories``)."""

    every: Optional[int] = None  # iterations between recordings into <run>/trajectories/iter_<k>.h5 (null: off)
    episodes: int = 4  # episodes per recording (the first to start)
    num_envs: int = 4  # worlds of the recording env, built once beside the training env
    video: bool = False  # also render each episode to <run>/trajectories/iter_<k>_videos/


@dataclass
class Task:
    name: str = MISSING
    scene: Scene = field(default_factory=Scene)
    episode_length_s: float = MISSING
    action: Action = field(default_factory=Action)
    command: Optional[Command] = None
    observations: dict[str, Any] = entries(ObservationTerm, depth=2)  # group -> name -> ObservationTerm
    rewards: dict[str, Any] = entries(RewardTerm)  # name -> RewardTerm
    only_positive_rewards: bool = False  # clip each step's total at 0 (legged_gym)
    terminations: dict[str, Any] = entries(TerminationTerm)  # name -> TerminationTerm
    events: dict[str, Any] = entries(EventTerm)  # name -> EventTerm
    success: Optional[Success] = None
    record: Record = field(default_factory=Record)  # record episodes every K iterations while training


# --- physics ---------------------------------------------------------------------------------------
@dataclass
class Sim:
    solver: str = "mujoco"  # mujoco: Newton's SolverMuJoCo | xpbd (no contact sensing)
    # Where MuJoCo's physics runs: warp (MuJoCo Warp, CPU or CUDA) | c (MuJoCo's C library on
    # every CPU core, device=cpu only: several times faster there, BENCHMARKS.md) | auto (c on a
    # CPU, warp on CUDA).
    backend: str = "auto"
    # backend=c: the physics threads (0: one per core, one fewer under agent.mode=async, whose
    # learner computes beside the physics on the core left to it: BENCHMARKS.md, physics backends).
    threads: int = 0
    num_envs: int = 4096
    dt: float = 0.005  # physics step [s]
    decimation: int = 4  # physics steps per control step
    use_graph: bool = True  # capture the decimated step as one Warp graph (backend=warp)
    # CUDA only: record the whole control step (action, physics, commands, terms, resets,
    # observations) as one CUDA graph and replay it, instead of dozens of small launches per step.
    # The CPU has no such graph: there the eager step is already within ~10% of its physics.
    capture_step: bool = False
    solver_options: dict[str, Any] = field(default_factory=dict)  # the solver constructor's keywords


# --- learning (rsl-rl's PPO; defaults as rsl-rl / legged_gym) ----------------------------------------
@dataclass
class Recurrent:
    """A recurrent layer between the observations and the MLP (rsl-rl's RNNModel): it carries a
    state across the steps of an episode (reset where an episode ends), so a policy can estimate
    what it does not observe (e.g. the base velocity from the IMU and the joints)."""

    type: Optional[str] = None  # lstm | gru; null: none (a feed-forward MLP)
    hidden_size: int = 256
    num_layers: int = 1


@dataclass
class ConvEncoder:
    """rsl-rl's CNN, one per image group a network reads (its flattened output joins the vectors)."""

    output_channels: list[int] = field(default_factory=lambda: [16, 32, 32])
    kernel_size: list[int] = field(default_factory=lambda: [5, 3, 3])
    stride: list[int] = field(default_factory=lambda: [2, 2, 2])
    padding: str = "zeros"  # each stride-2 layer halves the image, however small (none: shrinks by the kernel too)
    activation: str = "elu"


@dataclass
class Network:
    hidden_dims: list[int] = field(default_factory=lambda: [512, 256, 128])
    activation: str = "elu"
    obs_normalization: bool = True  # of the vector groups (images go to the CNN as they are)
    rnn: Recurrent = field(default_factory=Recurrent)  # e.g. agent.actor.rnn.type=lstm
    cnn: ConvEncoder = field(default_factory=ConvEncoder)  # where the network reads an image group


@dataclass
class Estimator:
    """A state estimator inside the actor (:class:`legion.agents.ppo.EstimatorModel`): a small MLP
    that reads the policy's (normalized) observation and estimates what the ``target`` group holds,
    e.g. the base's linear velocity, which no robot measures; its estimate joins the observation
    into the policy's MLP and is exported with it, so the robot needs no such sensor. It learns by
    regression on the target group (privileged: training only) during PPO's update."""

    target: Optional[str] = None  # an observation group of the task (e.g. base_velocity); null: no estimator
    hidden_dims: list[int] = field(default_factory=lambda: [128, 64])
    loss_coef: float = 1.0  # its mean squared error's weight beside PPO's losses


@dataclass
class Actor(Network):
    init_noise_std: float = 1.0
    estimator: Estimator = field(default_factory=Estimator)  # e.g. agent.actor.estimator.target=base_velocity


@dataclass
class Algorithm:
    """rsl-rl's ``PPO`` keyword arguments."""

    num_learning_epochs: int = 5
    num_mini_batches: int = 4
    learning_rate: float = 1.0e-3
    schedule: str = "adaptive"  # adaptive (KL-driven) | fixed
    desired_kl: float = 0.01
    gamma: float = 0.99
    lam: float = 0.95
    clip_param: float = 0.2
    value_loss_coef: float = 1.0
    use_clipped_value_loss: bool = True
    entropy_coef: float = 0.01
    max_grad_norm: float = 1.0


@dataclass
class VTrace:
    """Async, lag > 0: truncation of the importance weights (agents/ppo.py)."""

    rho_clip: float = 1.0
    c_clip: float = 1.0


@dataclass
class Imitation:
    """Learning from demonstrations, ``agent.mode=bc | dagger`` (agents/imitation.py)."""

    demos: list[str] = field(default_factory=list)  # trajectory files (legion record / legion dataset convert)
    # dagger: who labels the states the student visits: scripted:<module>:<function> (legion record's
    # policy=), or run:<run folder or checkpoint>, a trained teacher acting on its own policy observations
    expert: Optional[str] = None
    learning_rate: float = 1.0e-3
    # if set, the rate falls linearly from learning_rate to this at the run's last iteration
    # (agent.max_iterations): large steps while the student is far from the expert, small ones to settle
    learning_rate_final: Optional[float] = None
    batch_size: int = 4096  # samples a gradient step (a recurrent student's: envs x steps of one rollout)
    updates_per_iteration: int = 50  # gradient steps on the data after each rollout
    max_samples: int = 1_000_000  # dagger: the oldest labelled samples past this many are dropped (whole rollouts)


@dataclass
class Video:
    """``agent.video``: watch the policy learn. One episode of the current policy, in a one-world
    env beside the training's (rank 0), rendered by MuJoCo offscreen as ``legion play video=true``."""

    every: Optional[int] = None  # iterations between videos (null: off); each <run>/videos/iter_<k>.mp4
    max_seconds: float = 10.0  # episodes are cut here [s of simulated time]
    fps: float = 25.0  # frames per second of simulated time drawn (at most the control rate)
    height: int = 240  # image size [pixels] (even numbers: H.264 needs them)
    width: int = 320


@dataclass
class StopWhen:
    """``agent.stop_when``: training stops once the policy meets its task's goal, measured as
    ``legion eval`` measures it (locomotion: forward tracking error below 0.1 m/s and falls below
    5% over the evaluation commands; goal tasks: a success rate of at least ``success_rate``) at
    ``confirm`` evaluations in a row, with a checkpoint of that policy."""

    goal: bool = False  # evaluate while training and stop at the goal (else only max_iterations stops it)
    every_min: float = 2.0  # minutes of training between evaluations (evaluating does not count)
    confirm: int = 2  # evaluations in a row that must meet the goal
    success_rate: float = 0.97  # goal tasks' goal
    envs_per_command: int = 16  # evaluation envs per command (goal tasks: envs for the episodes)
    episodes: int = 100  # goal tasks: episodes per evaluation


@dataclass
class Symmetry:
    """rsl-rl's symmetry extension (Mittal et al. 2024) with the robot's mirror map (robot.mirror):
    mirrored copies of every mini-batch and/or a loss on the policy's disagreement with its own
    mirror image. Feed-forward actor and critic only (rsl-rl). SAC and TD3 take augmentation only:
    half of every replayed batch is learned from as its mirror image."""

    augmentation: bool = False  # learn from each mini-batch and its mirror image (SAC, TD3: half of each batch)
    mirror_loss: bool = False  # add mirror_loss_coeff * |pi(mirror(obs)) - mirror(pi(obs))|^2
    mirror_loss_coeff: float = 1.0


@dataclass
class OffPolicy:
    """``agent.learner=sac | td3``: off-policy learning from a replay buffer (agents/off_policy.py),
    in the style of FastTD3 / FastSAC (Seo et al. 2025): many parallel envs, large batches, clipped
    double-Q, observation normalization. ``agent.actor``/``agent.critic`` size the networks."""

    buffer_size: int = 1000  # transitions kept per env (a ring; the oldest go first)
    max_buffer_gb: float = 8.0  # the buffer's memory may not exceed this (it says what it needs)
    batch_size: int = 4096  # transitions per gradient step
    update_to_data: int = 2  # gradient steps per env step (of all envs at once)
    learning_starts: int = 10  # env steps (of all envs) before the first gradient step
    gamma: float = 0.99
    n_step: int = 3  # n-step returns (cut at episode ends and at the newest step in the buffer)
    tau: float = 0.1  # target networks: target += tau * (online - target) after each critic step
    actor_learning_rate: float = 3.0e-4
    critic_learning_rate: float = 3.0e-4
    weight_decay: float = 0.0  # AdamW's
    # LayerNorm after each of the critics' hidden layers (Ball et al. 2023, RLPD): their values stay
    # bounded however large their inputs (on in agent=sac_efficient; on quadruped_flat it learned as
    # fast without: BENCHMARKS.md, Off-policy learners)
    layer_norm: bool = False
    max_grad_norm: float = 0.0  # 0: no clipping
    action_bound: float = 1.0  # the actor's actions are action_bound * tanh(.), exported so
    policy_delay: int = 2  # the actor learns every N critic steps (TD3's delay; SAC's too)
    # td3: each env explores with Gaussian noise of its own std, drawn in this range at its resets
    # (FastTD3's mixed noise: some envs nearly greedy, some exploring) [x action_bound]
    exploration_noise: list[float] = field(default_factory=lambda: [0.01, 0.4])
    # The policy play, eval and export run: 0: the actor as it last learned; else an exponential
    # average of its weights, average += policy_average * (actor - average) at every actor step (the
    # actor's last update moves it; the average over ~1/policy_average steps is steadier)
    policy_average: float = 0.0
    target_noise: float = 0.2  # td3: target policy smoothing noise [x action_bound] ...
    target_noise_clip: float = 0.5  # ... clipped to this
    init_alpha: float = 0.1  # sac: the entropy temperature's start, then tuned to ...
    target_entropy: Optional[float] = None  # ... this entropy (null: -number of actions)
    # Prioritized replay (Schaul et al. 2016): sampling proportional to |TD error| ** priority_alpha,
    # importance weights (N P(i)) ** -priority_beta normalized by their largest
    prioritized: bool = False
    priority_alpha: float = 0.6
    priority_beta: float = 0.4
    # A distributional critic (C51, Bellemare et al. 2017, as FastTD3's): returns on num_atoms atoms
    # in [v_min, v_max] (set them to cover the task's discounted returns)
    distributional: bool = False
    num_atoms: int = 101
    v_min: float = -10.0
    v_max: float = 10.0
    checkpoint_buffer: bool = False  # checkpoints also hold the buffer (a resume continues it exactly)
    # agent.mode=async: the actor waits when the learner is more than this many env steps' worth of
    # updates behind (0: acting and learning alternate, as sync, on two threads)
    max_lag_steps: int = 2
    # A recurrent actor (agent.actor.rnn.type=lstm | gru; R2D2, Kapturowski et al. 2019): the
    # buffer keeps the acting actor's state at every step; the learner replays sequences of
    # burn_in + sequence_length steps from the state stored at their start, learning from the last
    # sequence_length (batch_size transitions: batch_size / sequence_length sequences). The critics
    # stay feed-forward: give them what the actor cannot see in a `critic` observation group.
    sequence_length: int = 16
    burn_in: int = 8


@dataclass
class Agent:
    # sync: collect, then update | async: collect rollout k+1 while updating on k | bc: behaviour
    # cloning of agent.imitation.demos | dagger: the same, plus the expert's labels of the states
    # the student visits (both train the PPO's actor: their checkpoints start PPO, agent.init_from)
    mode: str = "sync"
    # ppo (rsl-rl's, on-policy) | sac | td3 (off-policy, from a replay buffer: agent.off_policy)
    learner: str = "ppo"
    off_policy: OffPolicy = field(default_factory=OffPolicy)
    max_policy_lag: int = 1  # async: samples at most this many updates old (0: equals sync)
    vtrace: VTrace = field(default_factory=VTrace)
    max_iterations: Optional[int] = 1500  # null: until stopped
    num_steps_per_env: int = 24
    # device=cpu: torch threads of PPO's update once it has the machine to itself (sync's update;
    # async's while the actor waits for it). 0: OMP_NUM_THREADS where set, else the cores this
    # process may use over the ranks torchrun started on this machine. The env steps with the
    # process's torch threads, one fewer than the cores (a core simulates).
    update_threads: int = 0
    # The update's matrix products: fp32 | bf16 (bfloat16 products, fp32 weights, optimizer and
    # losses; independent of the thread count) | auto: bf16 on a CPU with AMX (Intel Xeon 4th gen
    # and later) or AVX512-BF16 (AMD Zen 4 and later): 1.5-2.2x faster updates; fp32 elsewhere
    # (agents/ppo.py: update_precision). PPO's update and SAC's/TD3's alike.
    precision: str = "auto"
    save_interval: int = 50  # checkpoint every N iterations (and at the end)
    save_every_minutes: Optional[float] = 10.0  # ... and every N minutes (null: off)
    keep_last: Optional[int] = 10  # checkpoints kept: the newest N (null: all) ...
    keep_every: Optional[int] = None  # ... plus every N-th iteration's
    log_interval: int = 1  # progress line every N iterations
    # where the scalars (and videos) go besides the progress line: tensorboard (<run>/events.*) or
    # wandb (Weights & Biases, through rsl-rl's writer, TensorBoard files too; WANDB_MODE=offline
    # keeps the run in <run>/wandb/ without a network: `wandb sync` uploads it later)
    logger: str = "tensorboard"
    wandb_project: str = "legion-rl"
    video: Video = field(default_factory=Video)
    stop_when: StopWhen = field(default_factory=StopWhen)
    random_episode_start: bool = False  # each learn() starts the envs at random steps of their episodes
    max_nonfinite_fraction: float = 0.1  # stop (with a checkpoint) when more envs' physics goes NaN in one step
    # An update that makes a loss or the weights NaN/Inf is skipped (the weights from before it are
    # restored, with a warning); this many in a row stop the run with a checkpoint.
    max_nonfinite_updates: int = 3
    actor: Actor = field(default_factory=Actor)
    critic: Network = field(default_factory=Network)
    algorithm: Algorithm = field(default_factory=Algorithm)
    imitation: Imitation = field(default_factory=Imitation)
    symmetry: Symmetry = field(default_factory=Symmetry)
    # a checkpoint (e.g. of a bc or dagger run) whose networks and normalizers a new run starts
    # from: not its iteration, optimizer or action std (agent.actor.init_noise_std)
    init_from: Optional[str] = None


@dataclass
class Train:
    """The root: ``legion train`` composes configs/train.yaml into this."""

    task: Task = field(default_factory=Task)
    sim: Sim = field(default_factory=Sim)
    agent: Agent = field(default_factory=Agent)
    seed: int = 42
    device: str = "cpu"  # "cpu" or "cuda:N": simulation, policy and learner share it
    run_name: str = ""  # appended to the run folder's name


def register() -> None:
    """Stores the root schema in Hydra's ConfigStore as ``legion_train``, and registers the
    ``on_device`` resolver (idempotent)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="legion_train", node=Train)
    OmegaConf.register_new_resolver("on_device", on_device, replace=True)


def on_device(choices, *, _root_):
    """``${on_device:{cpu: 1024, cuda: 4096}}``: the value for the run's ``device`` (cpu, or cuda
    for cuda:N). A task sizes itself for the machine with it (envs, iterations); a value given on
    the command line replaces it."""
    kind = str(_root_.device).split(":")[0]
    if kind not in choices:
        raise ValueError(f"device={_root_.device}: this value is given for {', '.join(choices)} only "
                         f"(on_device: {dict(choices)}); set the key on the command line")
    return choices[kind]


class SchemaError(ValueError):
    """A key the schema does not know, or a value of the wrong type; names the key and the valid ones."""


def typed(cfg) -> Train:
    """A composed config (an OmegaConf node or a plain dict) as checked :class:`Train` dataclasses."""
    from omegaconf import DictConfig, OmegaConf

    try:
        # A plain container: a DictConfig keeps keys Hydra added with `+` (under open_dict) through a merge.
        plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
        root = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Train), plain))
    except Exception as e:
        raise SchemaError(describe(e)) from None
    assert isinstance(root, Train)  # a structured config's object is its dataclass
    _type_entries(root, "")
    return root


def _type_entries(node, path: str) -> None:
    from omegaconf import OmegaConf

    for f in dataclasses.fields(node):
        value, where = getattr(node, f.name), f"{path}{f.name}"
        kind = f.metadata.get("entries")
        if kind is not None:
            groups = value.items() if f.metadata["depth"] == 2 else [(None, value)]
            for group, items in groups:
                prefix = f"{where}.{group}." if group is not None else f"{where}."
                if not isinstance(items, dict):
                    raise SchemaError(f"{prefix[:-1]}: expected a mapping of named entries, got {items!r}")
                for name, entry in list(items.items()):
                    try:
                        items[name] = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind), entry or {}))
                    except Exception as e:
                        raise SchemaError(describe(e, f"{prefix}{name}.")) from None
        elif dataclasses.is_dataclass(value):
            _type_entries(value, f"{where}.")


def describe(error: Exception, prefix: str = "") -> str:
    """One message for an OmegaConf error: the full key, what is wrong, and the valid keys where
    a key was not found. ``prefix``: the path of the entry being checked."""
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        MissingMandatoryValue,
        OmegaConfBaseException,
        ValidationError,
    )

    cause = next((c for c in _causes(error) if isinstance(c, OmegaConfBaseException) and c.full_key is not None), None)
    if cause is None:
        return str(error).strip()
    key = f"{prefix}{cause.full_key}"
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        parent, _, leaf = key.rpartition(".")
        keys = keys_at(parent)
        if keys and leaf in keys:  # a valid key this entry does not set: Hydra adds keys with +
            return f"{key}: not set in {parent}; add it with +{key}=<value>."
        return f"{key}: no such key." + (f" Valid keys of {parent or 'the root'}: {', '.join(keys)}" if keys else "")
    if isinstance(cause, MissingMandatoryValue):
        return f"{key}: missing; it has no default and must be set."
    expected = _expected_at(key)
    if expected is not None and isinstance(cause, ValidationError):  # a value of the wrong type
        value = cause.value
        if isinstance(value, typing.Mapping) and not dataclasses.is_dataclass(_type_at(key)):
            # e.g. agent.learner.learning_rate=fast, where agent.learner is one value
            return f"{key} is one value ({expected}), not a group of settings with keys under it."
        return f"{key}={_shown(value)}: expected {expected}."
    return f"{key}: {str(getattr(cause, 'msg', cause)).splitlines()[0]}"


def _causes(error: BaseException | None):
    """The error and the chain of errors that led to it, newest first."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def keys_at(path: str) -> list[str] | None:
    """The keys the schema declares at a dotted path (named entries' names are free), or None."""
    node = _type_at(path)
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else None


def _type_at(path: str):
    """The schema's type at a dotted path, or None (past a named entry's free name, or no such key)."""
    node, depth, entry_kind = Train, 0, None
    for part in [p for p in path.split(".") if p]:
        if depth:  # an entry name (or a group name) of a named-entries field
            depth -= 1
            if depth == 0:
                node = entry_kind
            continue
        if not dataclasses.is_dataclass(node):
            return None
        meta = {f.name: f.metadata for f in dataclasses.fields(node)}
        if part not in meta:
            return None
        if "entries" in meta[part]:
            entry_kind, depth = meta[part]["entries"], meta[part]["depth"]
            node = None
            continue
        node = typing.get_type_hints(node)[part]
        args = [a for a in typing.get_args(node) if a is not type(None)]
        if typing.get_origin(node) is typing.Union and len(args) == 1:  # Optional[X]
            node = args[0]
    return None if depth else node


def _expected_at(key: str) -> str | None:
    """What the schema takes at ``key``, in words with its default: 'a number (default 0.001)'."""
    hint, (parent, _, leaf) = _type_at(key), key.rpartition(".")
    owner = _type_at(parent)
    if hint is None or not dataclasses.is_dataclass(owner):
        return None
    if dataclasses.is_dataclass(hint):
        return f"a group of settings ({', '.join(f.name for f in dataclasses.fields(hint))})"
    words = {float: "a number", int: "a whole number", bool: "true or false", str: "a string"}
    origin = typing.get_origin(hint)
    text = "a list" if origin is list else "a mapping" if origin is dict else words.get(hint)
    if text is None:
        return None
    spec = next(f for f in dataclasses.fields(owner) if f.name == leaf)
    default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
    if default is None:
        return f"{text} or null"
    return text if default is dataclasses.MISSING else f"{text}, e.g. its default {_shown(default)}"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
