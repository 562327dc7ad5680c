"""Event terms: episode starts and domain randomization, drawn per environment.

A task configures them under ``task.events`` (one entry per term: function, mode startup / reset /
interval, range, distribution, interval, curriculum); :mod:`legion.tasks.managers.event` binds
them, runs them in their modes and draws their values.

A term function is ``f(env, mask, draw, **params)``, marked with :func:`event`: it acts on the
envs where ``mask`` (num_envs,) bool is set and leaves the others exactly as they are (write with
:func:`where`). Masks, not index lists: finding which envs are due would read data back to the
host on a GPU at every step. ``draw(*shape, integer=False)`` returns (num_envs, *shape) samples of
the term's current range from the env's seeded generator (``integer=True``: whole numbers, every
one in [low, high] equally likely under ``uniform``); ``draw.max`` is the highest value the range
may reach (for what is sized by it). ``entity`` names the scene entity a term acts on (default
the robot); ``joints`` / ``bodies`` arrive as index tensors (see :mod:`legion.tasks.mdp`).
Physical parameters are written through the entity's per-env views relative to
``entity.defaults`` (so applying a term again never compounds) and named with
``env.sim.params_changed``; the next physics step hands them to the solver. A term keeps what it
carries over in place, on the device, and reads nothing back to the host: a captured step
(``sim.capture_step``) replays its kernels on the memory they saw.
"""

from __future__ import annotations

import math
import re

import torch

from legion.tasks.math import quat_from_euler_xyz, quat_from_yaw, quat_mul
from legion.tasks.mdp.terms import Selection
from legion.tasks.sim.camera import scene_camera

MODES = ("startup", "reset", "interval")


def event(modes: tuple[str, ...] = MODES, domain: tuple[float, float] = (-math.inf, math.inf)):
    """Marks a function as an event term: the modes it may run in and the values its range may
    take (checked when the term is configured and whenever its range changes)."""

    def mark(func):
        func.event_modes, func.event_domain = modes, domain
        return func

    return mark


def where(mask: torch.Tensor, value: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """``value`` in the envs of ``mask`` (num_envs,), ``current`` elsewhere (broadcast over the
    trailing dimensions)."""
    return torch.where(mask.view(-1, *([1] * (current.dim() - 1))), value, current)


# --- episode start (mode reset): perturb the default state the env has just written ------------
@event(modes=("reset",))
def joint_pos_scale(env, mask, draw, joints: Selection = ".*"):
    """Positions of the selected robot joints times U(range), per joint, clamped to the joint limits."""
    robot = env.robot
    pos = robot.joint_pos.index_select(1, joints)
    scaled = (pos * draw(len(joints))).clamp(*robot.joint_limits.index_select(0, joints).unbind(-1))
    robot.joint_pos.index_copy_(1, joints, where(mask, scaled, pos))


@event(modes=("reset",))
def joint_pos_offset(env, mask, draw, joints: Selection = ".*"):
    """Positions of the selected robot joints plus U(range) [rad or m], per joint, clamped to the limits."""
    robot = env.robot
    pos = robot.joint_pos.index_select(1, joints)
    moved = (pos + draw(len(joints))).clamp(*robot.joint_limits.index_select(0, joints).unbind(-1))
    robot.joint_pos.index_copy_(1, joints, where(mask, moved, pos))


@event(modes=("reset",))
def joint_vel(env, mask, draw, joints: Selection = ".*"):
    """Velocities of the selected robot joints U(range) [rad/s or m/s], per joint."""
    robot = env.robot
    robot.joint_vel.index_copy_(1, joints, where(mask, draw(len(joints)), robot.joint_vel.index_select(1, joints)))


@event(modes=("reset",))
def root_yaw(env, mask, draw, entity: str = "robot"):
    """The entity's root turned about the world z axis by U(range) [rad]."""
    root = _floating(env, entity, "root_yaw")
    root.root_quat_w[:] = where(mask, quat_mul(quat_from_yaw(draw()), root.root_quat_w), root.root_quat_w)


@event(modes=("reset",))
def root_xy(env, mask, draw, entity: str = "robot"):
    """The entity's root moved by U(range) [m] along world x and y."""
    root = _floating(env, entity, "root_xy")
    root.root_pos_w[:, :2] = where(mask, root.root_pos_w[:, :2] + draw(2), root.root_pos_w[:, :2])


@event(modes=("reset",))
def root_vel(env, mask, draw, entity: str = "robot"):
    """The entity's root linear and angular velocity, each component U(range) [m/s, rad/s], world frame."""
    root = _floating(env, entity, "root_vel")
    root.root_vel_w[:] = where(mask, draw(6), root.root_vel_w)


@event(modes=("reset", "interval"))
def push_base(env, mask, draw, entity: str = "robot"):
    """A push: the root's world-frame x and y velocity change by U(range) [m/s] each."""
    root = _floating(env, entity, "push_base")
    velocity = root.root_lin_vel_w[:, :2]
    root.root_lin_vel_w[:, :2] = where(mask, velocity + draw(2), velocity)


def _floating(env, entity: str, name: str):
    root = env.scene[entity]
    if not getattr(root, "floating_base", False):
        raise ValueError(f"Event function {name} needs a free root; {entity} has none.")
    return root


# --- contact material ------------------------------------------------------------------------
@event(domain=(0.01, math.inf))
def friction(env, mask, draw, entity: str = "robot", bodies: Selection = ".*"):
    """Friction coefficient U(range) of every shape of the selected bodies, one value per env.
    The entity's own value is the one in effect against the ground (see :mod:`legion.tasks.sim`)."""
    target = env.scene[entity]
    chosen = mask[:, None] & torch.isin(target.shape_body, bodies)  # (num_envs, num_shapes)
    target.shape_friction[:] = torch.where(chosen, draw(1), target.shape_friction)
    env.sim.params_changed("shape_friction")


@event(domain=(0.0, 0.6))
def restitution(env, mask, draw, entity: str = "robot", bodies: Selection = ".*"):
    """Coefficient of restitution U(range) of the selected bodies' shapes, one value per env.
    Above ~0.6 MuJoCo's soft contacts gain energy at 5 ms steps, hence the domain."""
    target = env.scene[entity]
    chosen = mask[:, None] & torch.isin(target.shape_body, bodies)
    target.shape_restitution[:] = torch.where(chosen, draw(1), target.shape_restitution)
    env.sim.params_changed("shape_restitution")


# --- mass properties -------------------------------------------------------------------------
@event()
def added_mass(env, mask, draw, entity: str = "robot", bodies: Selection = "base"):
    """Mass of each selected body plus U(range) [kg] (inertia scaled with it)."""
    target = env.scene[entity]
    part = env.events.part(f"{entity}.body_mass_added", target.body_mass, 0.0)
    part[:, bodies] = where(mask, draw(len(bodies)), part[:, bodies])
    _write_mass(env, target)


@event(domain=(0.0, math.inf))
def mass_scale(env, mask, draw, entity: str = "robot", bodies: Selection = ".*"):
    """Mass of each selected body times U(range), per body (inertia scaled with it)."""
    target = env.scene[entity]
    part = env.events.part(f"{entity}.body_mass_scale", target.body_mass, 1.0)
    part[:, bodies] = where(mask, draw(len(bodies)), part[:, bodies])
    _write_mass(env, target)


@event(domain=(0.1, 10.0))
def size_scale(env, mask, draw, entity: str = "robot", bodies: Selection = ".*"):
    """Every shape of each selected body scaled by U(range), one factor per body (the shapes keep
    their proportions and their place on the body). The mass stays (``mass_scale`` changes it);
    the inertia follows the size (x factor^2)."""
    target = env.scene[entity]
    part = env.events.part(f"{entity}.body_size_scale", target.body_mass, 1.0)
    part[:, bodies] = where(mask, draw(len(bodies)), part[:, bodies])
    on_body = target.shape_body >= 0
    factor = torch.where(on_body, part[:, target.shape_body.clamp(min=0)], 1.0)  # (num_envs, num_shapes)
    target.shape_size[:] = target.defaults["shape_size"] * factor[..., None]
    env.sim.params_changed("shape_size")
    _write_mass(env, target)


def _write_mass(env, target):
    """mass = default * scale + added, at least 10% of the default; the inertia tensor follows
    the mass (same shape, same density distribution) and the size (x size factor^2). Envs whose
    parts did not change get the values they already hold."""
    events, name = env.events, target.name
    default = target.defaults["body_mass"]
    scale = events.part(f"{name}.body_mass_scale", target.body_mass, 1.0)
    added = events.part(f"{name}.body_mass_added", target.body_mass, 0.0)
    size = events.part(f"{name}.body_size_scale", target.body_mass, 1.0)
    mass = torch.maximum(default * scale + added, 0.1 * default)
    target.body_mass[:] = mass
    factor = mass / default.clamp(min=1e-9) * size**2
    target.body_inertia[:] = target.defaults["body_inertia"] * factor[..., None, None]
    env.sim.params_changed("body_mass", "body_inertia")


@event()
def com_offset(env, mask, draw, entity: str = "robot", bodies: Selection = "base", axes: str = "xyz"):
    """Centre of mass of each selected body moved by U(range) [m] along each body axis named in
    ``axes`` (the others left as they are: two terms may move x and y over ranges of their own)."""
    if not axes or any(a not in "xyz" for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"com_offset: axes={axes!r}; name some of x, y, z once each, e.g. xy")
    target, ids = env.scene[entity], ["xyz".index(a) for a in axes]
    current = target.body_com[:, bodies]
    moved = current.clone()
    moved[..., ids] = target.defaults["body_com"][:, bodies][..., ids] + draw(len(bodies), len(ids))
    target.body_com[:, bodies] = where(mask, moved, current)
    env.sim.params_changed("body_com")


# --- actuators and joints --------------------------------------------------------------------
def _scale_joint_param(env, mask, draw, name: str, joints: torch.Tensor):
    robot = env.robot
    view = getattr(robot, name)
    view[:, joints] = where(mask, robot.defaults[name][:, joints] * draw(len(joints)), view[:, joints])
    env.sim.params_changed(name)


@event(domain=(0.0, math.inf))
def stiffness_scale(env, mask, draw, joints: Selection = ".*"):
    """PD stiffness of each selected joint times U(range), per joint."""
    _scale_joint_param(env, mask, draw, "joint_stiffness", joints)


@event(domain=(0.0, math.inf))
def damping_scale(env, mask, draw, joints: Selection = ".*"):
    """PD damping of each selected joint times U(range), per joint."""
    _scale_joint_param(env, mask, draw, "joint_damping", joints)


@event(domain=(0.01, math.inf))
def effort_limit_scale(env, mask, draw, joints: Selection = ".*"):
    """Motor strength: the torque limit of each selected joint times U(range), per joint (it
    clamps the PD torque of position actuators; feed-forward efforts are not clamped)."""
    _scale_joint_param(env, mask, draw, "joint_effort_limit", joints)


@event(domain=(0.0, math.inf))
def joint_friction(env, mask, draw, joints: Selection = ".*"):
    """Dry friction loss U(range) [N m] of each selected joint, per joint."""
    robot = env.robot
    robot.joint_friction[:, joints] = where(mask, draw(len(joints)), robot.joint_friction[:, joints])
    env.sim.params_changed("joint_friction")


@event(domain=(0.0, math.inf))
def joint_armature(env, mask, draw, joints: Selection = ".*"):
    """Armature (reflected rotor inertia) U(range) [kg m^2] of each selected joint, per joint."""
    robot = env.robot
    robot.joint_armature[:, joints] = where(mask, draw(len(joints)), robot.joint_armature[:, joints])
    env.sim.params_changed("joint_armature")


@event(modes=("startup",), domain=(0.0, math.inf))
def joint_backlash(env, mask, draw, joints: Selection = ".*"):
    """Gear play U(range) [rad] of each selected joint's DC motor, per joint: its PD acts on the
    position error less half the play either side. The joints must be driven by ``dc_motor``
    actuators (the implicit PD runs inside the solver, with no dead zone). At startup only: it
    reads the selection back to the host."""
    sim = env.sim
    motor_joints = sim.motor_joint_ids.tolist()
    chosen = joints.tolist()
    if not set(chosen) <= set(motor_joints):
        names = [env.robot.joint_names[j] for j in chosen if j not in motor_joints]
        raise ValueError(f"joint_backlash: joints {names} have no dc_motor actuator (gear play is a DC motor's); "
                         "select dc_motor joints (task.scene.robot.actuators) or give them model: dc_motor.")
    columns = torch.tensor([motor_joints.index(j) for j in chosen], device=sim.device)
    current = sim.motor_backlash[:, columns]
    sim.motor_backlash[:, columns] = where(mask, draw(len(chosen)), current)


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def action_delay(env, mask, draw):
    """Actuator latency: actions reach the joints U{range} whole control steps late, per env."""
    env.action.set_delay(mask, draw(integer=True).long(), max_delay=int(draw.max))


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def command_latency(env, mask, draw):
    """Command latency: the joint targets reach the joints U(range) [ms] late, in whole physics
    steps (the nearest), per env: the targets of a control step act from that physics step of it
    on, the previous ones until then. Finer than ``action_delay``'s whole control steps: what
    ``legion calibrate`` estimates and a robot's DDS link jitters by."""
    step_ms = env.sim.physics_dt * 1000
    env.sim.set_command_latency(mask, torch.round(draw() / step_ms).long(), max_steps=round(draw.max / step_ms))


# --- world and sensing -----------------------------------------------------------------------
@event(domain=(-0.5, 0.5))
def gravity_tilt(env, mask, draw):
    """Gravity turned by U(range) [rad] about the world x axis, then about the world y axis."""
    sim = env.sim
    angle = draw(2)
    cx, sx, cy, sy = torch.cos(angle[:, 0]), torch.sin(angle[:, 0]), torch.cos(angle[:, 1]), torch.sin(angle[:, 1])
    direction = torch.stack([-cx * sy, sx, -cx * cy], dim=-1)
    sim.gravity[:] = where(mask, direction * sim.defaults["gravity"].norm(dim=-1, keepdim=True), sim.gravity)
    sim.params_changed("gravity")


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def obs_noise_scale(env, mask, draw, terms: str = ".*", group: str | None = None):
    """Observation noise of the matching noisy terms (regex over term names; ``group``: one
    observation group or all) times U(range), one factor per env and term."""
    for group_name, group_terms in env.observation_terms.items():
        for term in group_terms:
            if term.noise_scale is not None and group in (None, group_name) and re.fullmatch(terms, term.name):
                term.noise_scale[:] = where(mask, draw(1), term.noise_scale)


# --- cameras (task.scene.cameras) ---------------------------------------------------------------
@event()
def camera_position(env, mask, draw, camera: str):
    """The camera's mount moved by U(range) [m] along each axis of its body's (or the env's) frame."""
    cameras = scene_camera(env, camera)
    pos = cameras.mount_pos[camera]
    pos[:] = where(mask, cameras.mount_defaults[camera][0] + draw(3), pos)


@event(domain=(-0.5, 0.5))
def camera_rotation(env, mask, draw, camera: str):
    """The camera turned on its mount by U(range) [rad] about its own x, y and z axes (roll,
    pitch, yaw: R = Rz Ry Rx)."""
    cameras = scene_camera(env, camera)
    quat = cameras.mount_quat[camera]
    quat[:] = where(mask, quat_mul(cameras.mount_defaults[camera][1], quat_from_euler_xyz(draw(3))), quat)


@event(domain=(-30.0, 30.0))
def camera_fov(env, mask, draw, camera: str):
    """The camera's vertical field of view plus U(range) [deg], per world (the intrinsics' error of
    a camera calibrated roughly, or of another unit of the model). Rendered at the widest, each
    world's image enlarged from its centre (:meth:`~legion.tasks.sim.camera.Cameras.set_fov`)."""
    cameras = scene_camera(env, camera)
    fov = cameras.cfgs[camera].fov
    cameras.set_fov(camera, mask, fov + draw(), max_fov=fov + float(draw.max))


@event(domain=(0.0, math.inf))
def depth_noise(env, mask, draw, camera: str):
    """Depth error: each pixel's depth d [m] plus N(0, (k d^2)^2), k U(range) [1/m] per world (a
    stereo camera's error grows with the square of the distance; a RealSense D435's, under 2% at
    2 m, is k up to 0.01)."""
    noise = scene_camera(env, camera).noise[camera]["depth_noise"]
    noise[:] = where(mask, draw(), noise)


@event(domain=(0.0, 1.0))
def depth_holes(env, mask, draw, camera: str):
    """A share U(range) of the world's pixels reads no return (0, then the observation's far),
    drawn anew at every read: the holes of stereo matching on dark, shiny or thin things."""
    holes = scene_camera(env, camera).noise[camera]["holes"]
    holes[:] = where(mask, draw(), holes)


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def image_latency(env, mask, draw, camera: str):
    """The camera's images reach the policy U{range} whole control steps late, per world: a depth
    camera's pipeline (exposure, stereo matching, transport) takes 30-60 ms, 2-3 steps at 50 Hz."""
    scene_camera(env, camera).set_latency(camera, mask, draw(integer=True).long(), int(draw.max))


@event(domain=(0.0, math.inf))
def rgb_gain(env, mask, draw, camera: str):
    """Each colour channel times U(range), per world and channel: lighting and white balance."""
    gain = scene_camera(env, camera).noise[camera]["gain"]
    gain[:] = where(mask, draw(3), gain)
