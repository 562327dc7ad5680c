"""The scene: what one world holds, built into Newton, and the views each entity gives.

A :class:`~legion.configs.schema.Scene` names the entities of every world: the robot (an
articulation loaded from MJCF, URDF or USD), free rigid objects and static fixtures (primitive
shapes), plus the ground all worlds share. :func:`build_world` adds them to one Newton
``ModelBuilder`` and records where each lands (:class:`Slices`); after the worlds are replicated
and the model finalized, :class:`Articulation`, :class:`RigidObject` and :class:`Fixture` turn
those ranges into zero-copy views of the simulation's state and parameters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import warp as wp

from legion.configs.schema import Actuator as ActuatorCfg
from legion.configs.schema import Collision as CollisionCfg
from legion.configs.schema import Fixture as FixtureCfg
from legion.configs.schema import RigidObject as RigidObjectCfg
from legion.configs.schema import Robot as RobotCfg
from legion.configs.schema import Scene
from legion.tasks.math import quat_rotate_inverse

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets"
SHAPES = ("box", "sphere", "capsule", "cylinder")
# Per-env physical parameters (see the package docstring), by what they are per-item of.
BODY_PARAMS = ("body_mass", "body_com", "body_inertia")
SHAPE_PARAMS = ("shape_friction", "shape_restitution", "shape_size")
ACTUATOR_MODELS = ("implicit", "dc_motor", "network")
JOINT_PARAMS = ("joint_stiffness", "joint_damping", "joint_effort_limit", "joint_friction", "joint_armature")


def resolve_asset(path: str) -> Path:
    """Find a robot file: ``package://<package>/<path>`` (a file an installed package ships), an
    absolute/relative path, or a file name in ``tasks/assets``."""
    if path.startswith("package://"):
        return _package_file(path)
    for candidate in (Path(path), ASSET_DIR / path):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Robot model '{path}' not found (looked in the working directory and {ASSET_DIR}). "
        "Give a path to an .xml (MJCF), .urdf or .usd/.usda file, or package://<package>/<path>."
    )


def _package_file(uri: str) -> Path:
    """``package://<package>/<path>``, as ROS and the URDFs' own mesh paths name files: looked up
    in the package's Python module folder, in the cmeel prefix (where example-robot-data's wheel
    installs) and in the folders of ROS_PACKAGE_PATH."""
    import importlib.util
    import os
    import site
    import sys

    package, _, rest = uri[len("package://"):].partition("/")
    roots = []
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    for entry in dict.fromkeys([*site.getsitepackages(), *sys.path]):
        roots.append(Path(entry) / "cmeel.prefix" / "share" / package)
    roots += [Path(p) / package for p in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep) if p]
    for root in roots:
        if (root / rest).is_file():
            return root / rest
    hint = " (pip install 'legion-rl[robots]')" if package == "example-robot-data" else ""
    found = next((root for root in roots if root.is_dir()), None)
    where = f"package '{package}' is at {found} but has no {rest}" if found else \
        f"package '{package}' is not installed{hint}"
    raise FileNotFoundError(f"Robot model '{uri}' not found: {where}.")


@dataclass(frozen=True)
class Slices:
    """Where one entity's items sit inside each world (the same in every world)."""

    bodies: slice
    joints: slice
    coords: slice  # generalized coordinates (joint_q)
    dofs: slice  # generalized velocities (joint_qd), forces, per-DoF parameters
    shapes: slice


def build_world(scene: Scene, newton, world, contact_gap: float) -> dict[str, tuple[str, Slices]]:
    """Adds the scene's entities to ``world`` (a ``newton.ModelBuilder`` for one world), in the order
    robot, objects, fixtures. Returns ``{name: (kind, slices)}``."""
    layout = {}

    def add(name: str, kind: str, adder) -> None:
        before = _counts(world)
        adder()
        after = _counts(world)
        layout[name] = (kind, Slices(*(slice(a, b) for a, b in zip(before, after))))

    add("robot", "robot", lambda: add_robot(world, scene.robot, newton))
    for name, cfg in scene.objects.items():
        def add_object(name=name, cfg=cfg):
            body = world.add_body(xform=wp.transform(cfg.pos, cfg.quat), label=name)
            density = cfg.mass / _volume(cfg, f"task.scene.objects.{name}")
            _add_shape(world, body, cfg, newton.ModelBuilder.ShapeConfig(mu=cfg.friction, density=density,
                                                                        gap=contact_gap), name)
        add(name, "object", add_object)
    for name, cfg in scene.fixtures.items():
        def add_fixture(name=name, cfg=cfg):
            _volume(cfg, f"task.scene.fixtures.{name}")  # checks shape and size
            _add_shape(world, -1, cfg, newton.ModelBuilder.ShapeConfig(mu=cfg.friction, gap=contact_gap), name,
                       xform=wp.transform(cfg.pos, cfg.quat))
        add(name, "fixture", add_fixture)
    return layout


def add_robot(world, robot: RobotCfg, newton) -> None:
    """Loads the robot's model file into ``world`` (a ``newton.ModelBuilder``), then applies its
    config: the base, the collision simplification and the actuators (:func:`joint_actuators`)."""
    path = resolve_asset(robot.file)
    options = dict(enable_self_collisions=robot.collision.self_collisions,
                   collapse_fixed_joints=robot.collapse_fixed_joints,
                   mesh_maxhullvert=robot.collision.max_hull_vertices)
    if robot.floating_base is not None:
        options["floating"] = robot.floating_base
    loaders = {".xml": world.add_mjcf, ".urdf": world.add_urdf, ".usd": world.add_usd, ".usda": world.add_usd,
               ".usdc": world.add_usd}
    if path.suffix not in loaders:
        raise ValueError(f"Could not load robot model {path}: unsupported file type '{path.suffix}' "
                         "(use .xml, .urdf, .usd, .usda)")
    first_body, first_joint, first_shape = world.body_count, world.joint_count, world.shape_count
    try:
        loaders[path.suffix](str(path), **options)
    except Exception as e:
        raise ValueError(f"Could not load robot model {path}: {e}") from e
    if world.body_count == first_body:
        raise ValueError(f"Robot model {path} has no bodies.")
    shapes = range(first_shape, world.shape_count)
    body_names = {b: short_label(world.body_label[b]) for b in range(first_body, world.body_count)}
    if robot.gravity_compensation:
        gravcomp = world.custom_attributes.get("mujoco:gravcomp")
        if gravcomp is None:
            raise ValueError("task.scene.robot.gravity_compensation: MuJoCo's body gravcomp needs sim=mujoco.")
        gravcomp.values = gravcomp.values or {}  # a body attribute's values: body index -> value
        for body in body_names:
            gravcomp.values[body] = 1.0
    _simplify_collisions(world, robot.collision, shapes, body_names, newton, path)
    free = int(newton.JointType.FREE)
    dofs, names = [], []
    for j in range(first_joint, world.joint_count):
        if world.joint_type[j] == free:
            continue
        start = world.joint_qd_start[j]
        end = world.joint_qd_start[j + 1] if j + 1 < world.joint_count else world.joint_dof_count
        dofs += range(start, end)
        names += [short_label(world.joint_label[j])] * (end - start)
    for dof, actuator in zip(dofs, joint_actuators(robot, names)):
        if actuator is None:
            continue
        for key, array in (("stiffness", world.joint_target_ke), ("damping", world.joint_target_kd),
                           ("effort_limit", world.joint_effort_limit), ("armature", world.joint_armature),
                           ("friction", world.joint_friction)):
            value = getattr(actuator, key)
            if value is not None:
                array[dof] = float(value)
        # A dc_motor's PD and a network run outside the solver (simulation.py): MuJoCo gets no servo for them.
        mode = newton.JointTargetMode.POSITION if actuator.model == "implicit" else newton.JointTargetMode.EFFORT
        world.joint_target_mode[dof] = int(mode)


def joint_actuators(robot: RobotCfg, joint_names: list[str]) -> list[ActuatorCfg | None]:
    """The actuator config of each joint (None: the file's drive): the last group of
    ``robot.actuators`` whose pattern matches its name."""
    chosen: list[ActuatorCfg | None] = [None] * len(joint_names)
    for group, actuator in robot.actuators.items():
        if actuator.model not in ACTUATOR_MODELS:
            raise ValueError(f"task.scene.robot.actuators.{group}.model: '{actuator.model}' is not one of "
                             f"{list(ACTUATOR_MODELS)}.")
        if actuator.model != "dc_motor" and actuator.delay:
            raise ValueError(f"task.scene.robot.actuators.{group}.delay: a delay needs model: dc_motor (the implicit "
                             "PD runs inside the solver, on the current target); for the whole action use the "
                             "action_delay event.")
        if actuator.backlash < 0 or (actuator.backlash and actuator.model != "dc_motor"):
            raise ValueError(f"task.scene.robot.actuators.{group}.backlash={actuator.backlash}: gear play is >= 0 "
                             "[rad] and needs model: dc_motor (the implicit PD runs inside the solver, with no dead "
                             "zone).")
        if actuator.model == "dc_motor" and (actuator.saturation_effort is None or actuator.velocity_limit is None):
            raise ValueError(f"task.scene.robot.actuators.{group}: a dc_motor needs saturation_effort [N m] and "
                             "velocity_limit [rad/s] (the torque-speed line of the motor's datasheet).")
        if (actuator.model == "network") != (actuator.network is not None):
            raise ValueError(f"task.scene.robot.actuators.{group}: model: network goes with network: <file.npz> (the "
                             f"actuator network), and only with it; got model: {actuator.model}, network: "
                             f"{actuator.network}")
        for i in _match(actuator.joints, joint_names, "joint", f"the robot (task.scene.robot.actuators.{group})"):
            chosen[i] = actuator
    return chosen


def _simplify_collisions(world, collision: CollisionCfg, shapes: range, body_names: dict[int, str], newton,
                         path: Path) -> None:
    """Replaces mesh colliders by fitted primitives and drops the colliders of ``remove``'s bodies."""
    def shapes_of(pattern: str, what: str) -> list[int]:
        bodies = {b for b, name in body_names.items() if re.fullmatch(pattern, name)}
        if not bodies:
            raise ValueError(f"task.scene.robot.collision.{what}: '{pattern}' matches no body of {path.name}. "
                             f"Its bodies: {list(body_names.values())}")
        return [s for s in shapes if world.shape_body[s] in bodies]

    mesh = int(newton.GeoType.MESH)
    collides = int(newton.ShapeFlags.COLLIDE_SHAPES)
    for pattern, method in collision.approximate.items():
        if method not in ("bounding_sphere", "bounding_box", "convex_hull"):
            raise ValueError(f"task.scene.robot.collision.approximate.{pattern}: '{method}' is not one of "
                             "bounding_sphere, bounding_box, convex_hull.")
        meshes = [s for s in shapes_of(pattern, "approximate") if world.shape_type[s] == mesh
                  and world.shape_flags[s] & collides]
        if meshes:
            world.approximate_meshes(method, shape_indices=meshes, raise_on_failure=True)
    for pattern in collision.remove:
        for s in shapes_of(pattern, "remove"):
            world.shape_flags[s] &= ~collides


def _counts(builder) -> tuple[int, ...]:
    return (builder.body_count, builder.joint_count, builder.joint_coord_count, builder.joint_dof_count,
            builder.shape_count)


def _volume(cfg: RigidObjectCfg | FixtureCfg, where: str) -> float:
    size = list(cfg.size)
    expected = {"box": 3, "sphere": 1, "capsule": 2, "cylinder": 2}.get(cfg.shape)
    if expected is None:
        raise ValueError(f"{where}.shape: '{cfg.shape}' is not one of {list(SHAPES)}.")
    if len(size) != expected or min(size) <= 0:
        raise ValueError(f"{where}.size: {size}; a {cfg.shape} takes {expected} positive lengths [m] "
                         "(box: edges x, y, z; sphere: radius; capsule, cylinder: radius, length).")
    if cfg.shape == "box":
        return size[0] * size[1] * size[2]
    r = size[0]
    if cfg.shape == "sphere":
        return 4 / 3 * math.pi * r**3
    return math.pi * r**2 * size[1] + (4 / 3 * math.pi * r**3 if cfg.shape == "capsule" else 0.0)


def _add_shape(world, body: int, cfg, shape_cfg, label: str, xform=None) -> None:
    size = list(cfg.size)
    if cfg.shape == "box":
        world.add_shape_box(body, xform=xform, hx=size[0] / 2, hy=size[1] / 2, hz=size[2] / 2, cfg=shape_cfg,
                            label=label)
    elif cfg.shape == "sphere":
        world.add_shape_sphere(body, xform=xform, radius=size[0], cfg=shape_cfg, label=label)
    elif cfg.shape == "capsule":
        world.add_shape_capsule(body, xform=xform, radius=size[0], half_height=size[1] / 2, cfg=shape_cfg, label=label)
    else:
        world.add_shape_cylinder(body, xform=xform, radius=size[0], half_height=size[1] / 2, cfg=shape_cfg, label=label)


def short_label(label: str) -> str:
    """Newton labels are paths like 'quadruped/FL_calf'; keep the last component."""
    return label.rsplit("/", 1)[-1]


def _match(pattern: str | list[str], names: list[str], kind: str, entity: str) -> list[int]:
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    hits = [i for i, name in enumerate(names) if any(re.fullmatch(p, name) for p in patterns)]
    if not hits:
        raise ValueError(f"No {kind} name of {entity} matches {patterns}. Its {kind} names: {names}")
    return hits


class Entity:
    """One named thing in every world: views of its slice of the simulation (see the package
    docstring for shapes, units and frames). ``defaults`` holds each parameter's value at
    construction."""

    kind = "entity"

    def __init__(self, sim, name: str, slices: Slices, shape_labels: list[str]):
        self.sim, self.name, self.slices = sim, name, slices
        self.num_envs = sim.num_envs
        self.shape_names = shape_labels
        s = slices.shapes
        self.shape_friction = sim.shape_friction[:, s]
        self.shape_restitution = sim.shape_restitution[:, s]
        self.shape_size = sim.shape_size[:, s]
        self.defaults = {name: sim.defaults[name][:, s] for name in SHAPE_PARAMS}

    @property
    def params(self) -> list[str]:
        """The names of this entity's per-env physical parameters."""
        return list(self.defaults)


class _Body(Entity):
    """An entity with bodies: poses, contact forces and mass properties, and a free root if any."""

    def __init__(self, sim, name: str, slices: Slices, shape_labels: list[str], body_labels: list[str]):
        super().__init__(sim, name, slices, shape_labels)
        b, n = slices.bodies, sim.num_envs
        self.body_names = body_labels
        self.num_bodies = len(body_labels)
        self.body_pos_w = sim.body_q[:, b, 0:3]
        self.body_quat_w = sim.body_q[:, b, 3:7]
        self.body_lin_vel_w = sim.body_qd[:, b, 0:3]
        self.body_ang_vel_w = sim.body_qd[:, b, 3:6]
        self.contact_forces_w = sim.contact_forces[:, b]
        self.body_mass = sim.body_mass[:, b]
        self.body_com = sim.body_com[:, b]
        self.body_inertia = sim.body_inertia[:, b]
        self.defaults.update({name: sim.defaults[name][:, b] for name in BODY_PARAMS})
        # Shape -> body index within this entity (-1: a shape on no body of it).
        body_of_shape = sim.shape_body[slices.shapes] - b.start
        self.shape_body = torch.where((body_of_shape >= 0) & (body_of_shape < self.num_bodies), body_of_shape, -1)
        q, d = slices.coords.start, slices.dofs.start
        self.floating_base = sim.is_free_joint[slices.joints.start]
        if self.floating_base:
            self.root_pose_w, self.root_vel_w = sim.joint_q[:, q:q + 7], sim.joint_qd[:, d:d + 6]
            self.root_pos_w, self.root_quat_w = self.root_pose_w[:, :3], self.root_pose_w[:, 3:]
            self.root_lin_vel_w, self.root_ang_vel_w = self.root_vel_w[:, :3], self.root_vel_w[:, 3:]
            self.root_wrench_w = sim.joint_f[:, d:d + 6]  # external force and torque on the root [N, N m]
            self.default_root_pose = self.root_pose_w.clone()
        else:
            self.root_pose_w = self.root_vel_w = self.root_wrench_w = None
            self.root_pos_w = self.root_quat_w = self.root_lin_vel_w = self.root_ang_vel_w = None
            self.default_root_pose = torch.zeros(n, 0, device=sim.device)

    def find_bodies(self, pattern: str | list[str]) -> list[int]:
        """Indices (into this entity's bodies) of the names fully matching a regex, or any of a list."""
        return _match(pattern, self.body_names, "body", self.name)

    def _root(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The free root's ``root_quat_w``, ``root_lin_vel_w``, ``root_ang_vel_w`` (None on a fixed base)."""
        quat, lin_vel, ang_vel = self.root_quat_w, self.root_lin_vel_w, self.root_ang_vel_w
        if quat is None or lin_vel is None or ang_vel is None:
            raise ValueError(f"{self.name} has a fixed base: it has no root velocity.")
        return quat, lin_vel, ang_vel

    @property
    def root_lin_vel_b(self) -> torch.Tensor:
        """(num_envs, 3) [m/s] linear velocity of the root's centre of mass (Newton's free-joint
        convention) in the root's own frame: what ``base_lin_vel`` observes and velocity commands track."""
        quat, lin_vel, _ = self._root()
        return quat_rotate_inverse(quat, lin_vel)

    @property
    def root_link_lin_vel_b(self) -> torch.Tensor:
        """(num_envs, 3) [m/s] linear velocity of the root frame's origin in that frame (what a state
        estimator reports; :attr:`root_lin_vel_b` is the root's centre of mass's, Newton's convention)."""
        quat, lin_vel, ang_vel = self._root()
        return quat_rotate_inverse(quat, lin_vel) - torch.linalg.cross(quat_rotate_inverse(quat, ang_vel),
                                                                      self.body_com[:, 0])

    @property
    def root_ang_vel_b(self) -> torch.Tensor:
        """(num_envs, 3) [rad/s] root angular velocity in the root's own frame."""
        quat, _, ang_vel = self._root()
        return quat_rotate_inverse(quat, ang_vel)

    @property
    def projected_gravity_b(self) -> torch.Tensor:
        """(num_envs, 3) unit gravity direction in the root's frame: (0, 0, -1) when level."""
        quat = self._root()[0]
        gravity = self.sim.gravity
        return quat_rotate_inverse(quat, gravity / gravity.norm(dim=-1, keepdim=True))


class Articulation(_Body):
    """The robot: bodies linked by actuated 1-DoF joints (hinge or slide), on a free or fixed base.

    Joint views (num_envs, num_joints) cover the actuated joints only, in the model's order
    (``joint_names``): ``joint_pos`` [rad or m], ``joint_vel`` [rad/s or m/s], ``joint_pos_target``
    (position-PD targets), ``joint_effort`` [N or N m] (feed-forward generalized forces), and the
    parameters ``joint_stiffness``, ``joint_damping``, ``joint_effort_limit``, ``joint_friction``,
    ``joint_armature``.
    """

    kind = "robot"

    def __init__(self, sim, name: str, slices: Slices, shape_labels, body_labels, dof_labels: list[str], source: Path):
        super().__init__(sim, name, slices, shape_labels, body_labels)
        q0, v0 = (7, 6) if self.floating_base else (0, 0)
        # The actuated joints' coordinates and DoFs within one world's joint_q / joint_qd.
        self.joint_coords = coords = slice(slices.coords.start + q0, slices.coords.stop)
        self.joint_dofs = dofs = slice(slices.dofs.start + v0, slices.dofs.stop)
        self.joint_names = dof_labels[v0:]
        self.num_joints = dofs.stop - dofs.start
        if coords.stop - coords.start != self.num_joints:
            raise ValueError(f"{source.name}: only 1-DoF joints (hinge, slide) are supported below the root; "
                             f"found {coords.stop - coords.start} coordinates for {self.num_joints} DoFs.")
        self.joint_pos = sim.joint_q[:, coords]
        self.joint_vel = sim.joint_qd[:, dofs]
        self.joint_pos_target = sim.joint_target_q[:, coords]
        self.joint_effort = sim.joint_f[:, dofs]
        for param in JOINT_PARAMS:
            setattr(self, param, getattr(sim, param)[:, dofs])
            self.defaults[param] = sim.defaults[param][:, dofs]
        self.joint_limits = sim.joint_limits[dofs].clone()  # (num_joints, 2) [rad or m], the model's
        self.effort_limits = self.defaults["joint_effort_limit"][0].clone()  # (num_joints,), the model's
        self.default_joint_pos = self.joint_pos.clone()  # (num_envs, num_joints): the task may override

    def find_joints(self, pattern: str | list[str]) -> list[int]:
        """Indices of the actuated joints whose names fully match a regex (or any of a list)."""
        return _match(pattern, self.joint_names, "joint", self.name)


class RigidObject(_Body):
    """A free rigid body (one body, a free joint, primitive shapes)."""

    kind = "object"


class Fixture(Entity):
    """Static geometry: contact material and size only (``shape_friction``, ``shape_restitution``,
    ``shape_size``)."""

    kind = "fixture"
