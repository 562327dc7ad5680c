"""`legion robot inspect`: what Newton makes of a robot file, before a training run finds out.

A user bringing their own robot (MJCF, URDF or USD) gets, from one call of :func:`inspect_robot`:
the joints, drives, bodies and colliders as Newton loaded them (the same loading path as training:
:func:`~legion.tasks.sim.scene.add_robot`), a picture of the default pose, one line per problem
that keeps a policy from training (with the fix), and a starting robot YAML in the format of
``configs/robot/*.yaml`` with every guess marked.

The picture is MuJoCo's offscreen renderer drawing the ``mj_model`` Newton's SolverMuJoCo builds
from the model (its native-MuJoCo mode: no MuJoCo Warp, no GPU), so what is drawn is what the
solver simulates. The ground is drawn under the lowest point of the robot: a floating base
stands on it, a fixed one (an arm, or a legged robot not yet given a floating base) is held there.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings as python_warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import imageio.v3 as iio
import numpy as np

from legion.configs.schema import Actuator as ActuatorCfg
from legion.configs.schema import Robot as RobotCfg
from legion.tasks.sim.scene import ASSET_DIR, add_robot, joint_actuators, resolve_asset, short_label

# Bodies named like the parts of a leg: a robot with them walks, so its base must be free.
LEGGED = re.compile(r"foot|feet|ankle|calf|shin|toe|knee", re.IGNORECASE)
FEET = (r"foot|feet", r"ankle_roll", r"ankle|toe")  # tried in order: the first that names any body
TCP = (r"tcp", r"(^|_)ee(_|$)|end_?effector", r"hand", r"gripper|flange")  # likewise, for an arm
FINGERS = re.compile(r"finger", re.IGNORECASE)
# A leading side token (FL_hip, left_knee): stripped to make one regex for a joint of every leg.
SIDE = re.compile(r"^(left|right|l|r|fl|fr|rl|rr|hl|hr|lf|rf|lh|rh)(?=[_-])", re.IGNORECASE)
MESH_VERTICES = 1000  # a mesh collider this large is a sign of a visual mesh used for collision
UNLIMITED = 1e5  # Newton's "no limit" is 1e6; shown as "-"
MODES = {0: "none", 1: "position", 2: "velocity", 3: "position_velocity", 4: "effort"}
JOINT_TYPES = {0: "prismatic", 1: "revolute", 2: "ball", 3: "fixed", 4: "free", 5: "distance", 6: "d6", 7: "rod"}
SHAPE_TYPES = {1: "plane", 2: "heightfield", 3: "sphere", 4: "capsule", 5: "ellipsoid", 6: "cylinder", 7: "box",
               8: "mesh", 9: "cone", 10: "convex_mesh", 11: "gaussian"}
IMAGE_SIZE = (480, 640)  # height, width [pixels]


@dataclass
class Joint:
    """One DoF below the root, as Newton loaded it (and the robot config changed it)."""

    name: str
    type: str
    lower: float
    upper: float
    effort_limit: float
    velocity_limit: float
    stiffness: float  # joint_target_ke
    damping: float  # joint_target_kd
    armature: float
    friction: float
    mode: str  # joint_target_mode
    drive: str  # "file", or the robot config's actuator group that set it
    default: float  # the default pose: 0 clamped into the limits, then the config's joint_pos


@dataclass
class Body:
    name: str
    mass: float
    inertia: tuple[float, ...]  # Ixx, Iyy, Izz: the diagonal about the COM [kg m^2]


@dataclass
class Shape:
    """A collision shape."""

    body: str
    type: str
    size: str  # primitive dimensions, or a mesh's vertex count
    vertices: int  # 0 for primitives


@dataclass
class Inspection:
    """What :func:`inspect_robot` found and wrote."""

    name: str
    file: str  # as given (a package:// URI stays one)
    path: Path
    floating_base: bool
    joints: list[Joint]
    bodies: list[Body]
    shapes: list[Shape]
    visual_shapes: int
    fixed_joints: int
    mujoco_actuators: list[tuple[str, ...]]  # the MJCF's own: name, joint, kind, kp, kv, gear, force range
    root_height: float | None  # base height with the lowest collider on the ground [m]
    warnings: list[str] = field(default_factory=list)
    image: Path | None = None
    yaml: Path | None = None

    @property
    def total_mass(self) -> float:
        return sum(b.mass for b in self.bodies)

    @property
    def legged(self) -> bool:
        return any(LEGGED.search(b.name) for b in self.bodies)

    def text(self) -> str:
        """The tables, the warnings and the files written, for a terminal."""
        kind = {".xml": "MJCF", ".urdf": "URDF"}.get(self.path.suffix, "USD")
        base = "floating base (free joint)" if self.floating_base else "fixed base"
        lines = [f"{self.name}: {kind} {self.path}",
                 f"  {base}, {len(self.joints)} DoF, {len(self.bodies)} bodies, total mass {self.total_mass:.3f} kg"
                 + (f", standing root height {self.root_height:.3f} m"
                    if self.root_height is not None and (self.floating_base or self.legged) else ""), ""]
        lines += [f"joints ({len(self.joints)} DoF; {self.fixed_joints} fixed joints not listed): [rad or m], "
                  "[N m or N], [rad/s or m/s]; stiffness, damping: the PD gains (joint_target_ke, kd)"]
        lines += _table(("name", "type", "lower", "upper", "effort", "velocity", "stiffness", "damping", "armature",
                         "friction", "default"),
                        [(j.name, j.type, _num(j.lower), _num(j.upper), _num(j.effort_limit), _num(j.velocity_limit),
                          _num(j.stiffness), _num(j.damping), _num(j.armature), _num(j.friction), _num(j.default))
                         for j in self.joints])
        drives: dict[tuple, list[str]] = {}
        for j in self.joints:
            drives.setdefault((j.mode, j.stiffness, j.damping, j.drive), []).append(j.name)
        lines += ["", "actuators (Newton's drive of each DoF: target mode and gains, from the file or the config)"]
        lines += _table(("mode", "stiffness", "damping", "set by", "joints"),
                        [(mode, _num(kp), _num(kd), drive, _names(names, 6))
                         for (mode, kp, kd, drive), names in drives.items()])
        if self.mujoco_actuators:
            lines += ["", "MuJoCo actuators of the MJCF (what Newton read its gains from)"]
            lines += _table(("name", "joint", "kind", "kp", "kv", "gear", "force range"), self.mujoco_actuators)
        lines += ["", f"bodies ({len(self.bodies)})"]
        lines += _table(("name", "mass [kg]", "Ixx", "Iyy", "Izz [kg m^2]"),
                        [(b.name, _num(b.mass), *(_num(i) for i in b.inertia)) for b in self.bodies])
        lines += ["", f"collision shapes ({len(self.shapes)}; {self.visual_shapes} visual-only shapes not listed)"]
        lines += _table(("body", "type", "size [m] / vertices"), [(s.body, s.type, s.size) for s in self.shapes])
        lines += ["", f"warnings ({len(self.warnings)})" if self.warnings else "warnings: none"]
        lines += [f"  {w}" for w in self.warnings]
        written = [str(p) for p in (self.image, self.yaml) if p is not None]
        if written:
            lines += ["", f"wrote {', '.join(written)}"]
        return "\n".join(lines)


def inspect_robot(file: str | None, out: Path | str | None = None, robot: RobotCfg | None = None,
                  overwrite: bool = False) -> Inspection:
    """Loads a robot file as training does and reports on it.

    Args:
        file: the model (a path, a file name in tasks/assets, or package://<package>/<path>);
            None: ``robot.file``.
        out: folder for ``<name>.png`` (the default pose) and, for a raw file, ``<name>.yaml``
            (a starting robot config); None writes nothing.
        robot: a robot config applied as training applies it (floating base, collision,
            actuators, default pose); None: the file as it is.
        overwrite: replace an existing ``<name>.yaml`` (it may hold the user's edits).

    Raises:
        ValueError: the file is missing or does not load (the message names it and the problem).
    """
    os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco: offscreen rendering
    import newton

    cfg = RobotCfg(file=file or "") if robot is None else replace(robot, file=file) if file else robot
    try:
        path = resolve_asset(cfg.file)
    except FileNotFoundError as e:  # bad input, reported as one line like any other
        raise ValueError(str(e)) from None
    name = path.stem
    out = Path(out) if out is not None else None
    yaml_path = out / f"{name}.yaml" if out is not None and robot is None else None
    if yaml_path is not None and yaml_path.exists() and not overwrite:
        raise ValueError(f"{yaml_path} exists (it may hold your edits): give another out= or overwrite=true.")

    builder = newton.ModelBuilder()
    newton.solvers.SolverMuJoCo.register_custom_attributes(builder)  # the MJCF attributes the solver reads
    with python_warnings.catch_warnings(record=True) as caught:  # Newton warns of each mesh file it cannot find
        python_warnings.simplefilter("always")
        add_robot(builder, cfg, newton)
    missing = [str(w.message) for w in caught if "does not exist" in str(w.message)]
    for w in caught:
        if str(w.message) not in missing:
            python_warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    joints, fixed, unsupported = _joints(builder, cfg, newton)
    collides = int(newton.ShapeFlags.COLLIDE_SHAPES)
    bodies = [Body(short_label(builder.body_label[b]), float(builder.body_mass[b]),
                   tuple(float(x) for x in np.diag(np.array(builder.body_inertia[b]).reshape(3, 3))))
              for b in range(builder.body_count)]
    shapes = [_shape(builder, s, bodies) for s in range(builder.shape_count) if builder.shape_flags[s] & collides]
    floating = any(t == int(newton.JointType.FREE) for t in builder.joint_type)
    result = Inspection(name, cfg.file, path, floating, joints, bodies, shapes,
                        visual_shapes=builder.shape_count - len(shapes), fixed_joints=fixed,
                        mujoco_actuators=_mujoco_actuators(path) if path.suffix == ".xml" else [], root_height=None)

    _set_default_pose(builder, joints, cfg, newton)
    image = out / f"{name}.png" if out is not None else None
    try:
        result.root_height = _pose_and_render(builder, newton, image)
        result.image = image
    except Exception as e:  # the tables and the YAML are still worth having: say what is missing and why
        result.warnings.append(f"no picture and no root height: {type(e).__name__}: {_one_line(e)}")
    result.warnings += _warnings(result, unsupported, cfg.root_height, missing)
    if yaml_path is not None:
        assert out is not None
        out.mkdir(parents=True, exist_ok=True)
        yaml_path.write_text(robot_yaml(result))
        result.yaml = yaml_path
    return result


def load_robot_config(name: str) -> RobotCfg:
    """A robot config: a YAML file, or ``robot/<name>.yaml`` of configs/ or a LEGION_CONFIG_PATH
    folder (as ``legion train robot=`` finds it), checked against the schema."""
    from omegaconf import OmegaConf

    from legion.configs import config_file, robot_problems

    path = config_file("robot", name)
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RobotCfg), OmegaConf.load(path)))
        assert isinstance(cfg, RobotCfg)
        # Named entries are plain dicts to OmegaConf (see configs/schema.py): type each actuator.
        cfg.actuators = {group: OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ActuatorCfg), entry))
                         for group, entry in cfg.actuators.items()}
    except Exception as e:
        raise ValueError(f"{path}: {_one_line(e)}") from None
    problems = robot_problems(cfg, key="")
    if problems:
        raise ValueError("\n".join(f"{path}: {problem}" for problem in problems))
    return cfg


# --- what Newton loaded ----------------------------------------------------------------------------
def _joints(builder, cfg: RobotCfg, newton) -> tuple[list[Joint], int, list[str]]:
    """The DoFs below the root, the number of fixed joints, and the joints legion cannot drive
    (ball, D6, ...: an Articulation takes 1-DoF joints only)."""
    joints, fixed, unsupported = [], 0, []
    free, revolute, prismatic = (int(t) for t in (newton.JointType.FREE, newton.JointType.REVOLUTE,
                                                  newton.JointType.PRISMATIC))
    for j in range(builder.joint_count):
        kind = int(builder.joint_type[j])
        if kind == free:
            continue
        lin, ang = builder.joint_dof_dim[j]
        if lin + ang == 0:
            fixed += 1
            continue
        name = short_label(builder.joint_label[j])
        if kind not in (revolute, prismatic):
            unsupported.append(f"{name} ({JOINT_TYPES.get(kind, kind)})")
        start = builder.joint_qd_start[j]
        for d in range(start, start + lin + ang):
            joints.append(Joint(name if lin + ang == 1 else f"{name}[{d - start}]", JOINT_TYPES.get(kind, str(kind)),
                                float(builder.joint_limit_lower[d]), float(builder.joint_limit_upper[d]),
                                float(builder.joint_effort_limit[d]), float(builder.joint_velocity_limit[d]),
                                float(builder.joint_target_ke[d]), float(builder.joint_target_kd[d]),
                                float(builder.joint_armature[d]), float(builder.joint_friction[d]),
                                MODES.get(int(builder.joint_target_mode[d]), "?"), "file", 0.0))
    # Which config group set each drive (add_robot applied them; this names them in the table).
    groups = {id(actuator): group for group, actuator in cfg.actuators.items()}
    for joint, actuator in zip(joints, joint_actuators(cfg, [j.name for j in joints]) if cfg.actuators else []):
        if actuator is not None:
            joint.drive = f"config: {groups[id(actuator)]} ({actuator.model})"
    return joints, fixed, unsupported


def _shape(builder, s: int, bodies: list[Body]) -> Shape:
    kind = SHAPE_TYPES.get(int(builder.shape_type[s]), str(builder.shape_type[s]))
    body = bodies[builder.shape_body[s]].name if builder.shape_body[s] >= 0 else "(world)"
    source = builder.shape_source[s]
    if source is not None and hasattr(source, "vertices"):
        vertices = len(source.vertices)
        return Shape(body, kind, f"{vertices} vertices", vertices)
    # Newton keeps half extents (box), radius (sphere), radius and half height (capsule, cylinder).
    scale = [float(x) for x in builder.shape_scale[s]]
    count = {"sphere": 1, "capsule": 2, "cylinder": 2, "cone": 2}.get(kind, 3)
    return Shape(body, kind, " ".join(f"{x:.4g}" for x in scale[:count]), 0)


def _mujoco_actuators(path: Path) -> list[tuple[str, ...]]:
    """The MJCF's <actuator>s as MuJoCo compiles them (Newton turns position servos into joint
    gains, so a difference between the two tables is Newton's reading of the file)."""
    import mujoco

    try:
        m = mujoco.MjModel.from_xml_path(str(path))
    except Exception as e:
        return [("(MuJoCo could not compile the file)", "", _one_line(e), "", "", "", "")]
    rows = []
    for a in range(m.nu):
        target = m.actuator_trnid[a, 0]
        joint = m.joint(target).name if m.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT and target >= 0 else "-"
        gain, bias = m.actuator_gainprm[a], m.actuator_biasprm[a]
        if m.actuator_biastype[a] == mujoco.mjtBias.mjBIAS_AFFINE and bias[1] != 0:
            kind, kp, kv = "position", gain[0], -bias[2]
        elif m.actuator_biastype[a] == mujoco.mjtBias.mjBIAS_AFFINE:
            kind, kp, kv = "velocity", 0.0, gain[0]
        else:
            kind, kp, kv = "motor", 0.0, 0.0
        force = m.actuator_forcerange[a] if m.actuator_forcelimited[a] else None
        rows.append((m.actuator(a).name or f"#{a}", joint, kind, _num(kp), _num(kv), _num(m.actuator_gear[a, 0]),
                     f"[{force[0]:g}, {force[1]:g}]" if force is not None else "-"))
    return rows


# --- the default pose and the picture ------------------------------------------------------------
def _set_default_pose(builder, joints: list[Joint], cfg: RobotCfg, newton) -> None:
    """0 clamped into each joint's limits (a knee whose range excludes 0 bends), then the config's
    ``joint_pos`` (regex -> value, later wins, as the env applies it) and ``root_height``."""
    for joint in joints:
        joint.default = min(max(0.0, joint.lower), joint.upper)
        for pattern, value in cfg.joint_pos.items():
            if re.fullmatch(pattern, joint.name):
                joint.default = float(value)
    q = 0
    for j in range(builder.joint_count):
        start = builder.joint_q_start[j]
        if int(builder.joint_type[j]) == int(newton.JointType.FREE):
            if cfg.root_height is not None:
                builder.joint_q[start + 2] = cfg.root_height
            continue
        lin, ang = builder.joint_dof_dim[j]
        if int(builder.joint_type[j]) in (int(newton.JointType.REVOLUTE), int(newton.JointType.PRISMATIC)):
            builder.joint_q[start] = joints[q].default
        q += lin + ang


def _pose_and_render(builder, newton, image: Path | None) -> float:
    """Poses the robot in MuJoCo (SolverMuJoCo's model of it), renders it to ``image`` (unless None)
    and returns the root's height above its lowest collider (the root height that stands it on
    the ground)."""
    import mujoco

    model = builder.finalize(device="cpu")
    solver = newton.solvers.SolverMuJoCo(model, use_mujoco_cpu=True, skip_visual_only_geoms=False)
    m, d = solver.mj_model, solver.mj_data
    # Newton's coordinates into MuJoCo's qpos, joint by joint (the solver copies them only when it steps).
    q, q_start = model.joint_q.numpy(), model.joint_q_start.numpy()
    newton_joint = solver.mjc_jnt_to_newton_jnt.numpy()[0]  # pyright: ignore[reportOptionalMemberAccess]
    for j in range(m.njnt):
        source, address = newton_joint[j], m.jnt_qposadr[j]
        if source < 0:
            continue
        values = q[q_start[source]:q_start[source + 1]]
        if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:  # (x, y, z, qx, qy, qz, qw) -> MuJoCo's w first
            values = np.concatenate([values[:3], values[6:7], values[3:6]])
        elif m.jnt_type[j] == mujoco.mjtJoint.mjJNT_BALL:
            values = np.concatenate([values[3:4], values[:3]])
        d.qpos[address:address + len(values)] = values
    mujoco.mj_forward(m, d)

    collides = int(newton.ShapeFlags.COLLIDE_SHAPES)
    shape_flags = model.shape_flags.numpy()
    geom_shape = solver.mjc_geom_to_newton_shape.numpy()[0]  # pyright: ignore[reportOptionalMemberAccess]
    robot = np.flatnonzero(geom_shape >= 0)
    colliders = np.array([g for g in robot if shape_flags[geom_shape[g]] & collides], dtype=int)
    lowest = _bounds(m, d, colliders if colliders.size else robot)[0][2]
    root_body = 1  # MuJoCo's body 0 is the world; the robot's root comes next
    root_height = float(d.xpos[root_body][2] - lowest)
    if image is not None:
        # Draw what a person recognizes: the visual shapes, and the colliders of each body without a
        # visual mesh (a URDF's collision meshes would only hide its visual ones; an MJCF's geoms do both).
        visual = np.setdiff1d(robot, colliders)
        dressed = {m.geom_bodyid[g] for g in visual if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH}
        drawn = np.concatenate([visual, [g for g in colliders if m.geom_bodyid[g] not in dressed]]).astype(int)
        m.geom_rgba[np.setdiff1d(np.arange(m.ngeom), drawn), 3] = 0.0
        palette = np.array([[0.85, 0.5, 0.2, 1], [0.95, 0.7, 0.35, 1], [0.7, 0.35, 0.15, 1]])
        m.geom_rgba[drawn] = palette[m.geom_bodyid[drawn] % len(palette)]  # neighbouring links apart
        image.parent.mkdir(parents=True, exist_ok=True)
        iio.imwrite(image, _render(m, d, drawn))
    return root_height


def _render(m, d, geoms: np.ndarray) -> np.ndarray:
    """(height, width, 3) uint8: the robot from the front left and above, framed whole, on a floor
    under its lowest point."""
    import mujoco

    lo, hi = _bounds(m, d, geoms)
    m.vis.headlight.ambient[:] = 0.35
    m.vis.headlight.diffuse[:] = 0.6
    m.vis.global_.offheight, m.vis.global_.offwidth = IMAGE_SIZE  # the offscreen buffer must hold the image
    camera = mujoco.MjvCamera()
    camera.type = mujoco.mjtCamera.mjCAMERA_FREE
    camera.lookat[:] = (lo + hi) / 2
    # Far enough that the bounding sphere fits the vertical field of view (the narrower one).
    radius = max(float(np.linalg.norm(hi - lo)) / 2, 0.05)
    camera.distance = 1.1 * radius / math.sin(math.radians(m.vis.global_.fovy) / 2)
    camera.azimuth, camera.elevation = 135.0, -20.0
    with mujoco.Renderer(m, *IMAGE_SIZE) as renderer:
        renderer.update_scene(d, camera)
        scene = renderer.scene
        if scene.ngeom < scene.maxgeom:  # the floor: drawn only, so it changes nothing of the model
            mujoco.mjv_initGeom(scene.geoms[scene.ngeom], mujoco.mjtGeom.mjGEOM_PLANE,
                                np.array([4 * radius, 4 * radius, radius / 4]), np.array([*(lo + hi)[:2] / 2, lo[2]]),
                                np.eye(3).ravel(), np.array([0.3, 0.34, 0.4, 1.0], dtype=np.float32))
            scene.ngeom += 1
        return renderer.render()


def _bounds(m, d, geoms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The world-frame box around the geoms: meshes by their vertices, spheres and capsules
    exactly, other primitives by their rotated bounding boxes."""
    import mujoco

    points = []
    for g in geoms:
        centre, rotation, size = d.geom_xpos[g], d.geom_xmat[g].reshape(3, 3), m.geom_size[g]
        kind = int(m.geom_type[g])  # (a numpy integer is not `in` a tuple of MuJoCo's enums)
        if kind == mujoco.mjtGeom.mjGEOM_MESH:
            start, count = m.mesh_vertadr[m.geom_dataid[g]], m.mesh_vertnum[m.geom_dataid[g]]
            points.append(centre + m.mesh_vert[start:start + count] @ rotation.T)
        elif kind in (mujoco.mjtGeom.mjGEOM_SPHERE, mujoco.mjtGeom.mjGEOM_CAPSULE):
            ends = [centre] if kind == mujoco.mjtGeom.mjGEOM_SPHERE else \
                [centre + s * size[1] * rotation[:, 2] for s in (-1, 1)]
            points += [e + s * size[0] * np.eye(3) for e in ends for s in (-1, 1)]
        else:  # the geom's local bounding box (centre, half extents), rotated: exact for a box
            box_centre, half = m.geom_aabb[g, :3], m.geom_aabb[g, 3:]
            corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]) * half + box_centre
            points.append(centre + corners @ rotation.T)
    if not points:
        return np.zeros(3), np.zeros(3)
    stacked = np.concatenate([np.atleast_2d(p) for p in points])
    return stacked.min(0), stacked.max(0)


# --- what will not train -------------------------------------------------------------------------
def _warnings(result: Inspection, unsupported: list[str], root_height: float | None,
              missing_files: list[str]) -> list[str]:
    """One line per problem: what, and what to put in the robot YAML (``root_height``: the config's;
    ``missing_files``: Newton's warnings of mesh files it did not find)."""
    warnings = []
    if missing_files:
        warnings.append(f"{len(missing_files)} mesh files not found, their shapes left out ({_names(missing_files)}): "
                        "fix the paths in the file.")
    if not result.shapes and result.floating_base:
        warnings.append("no collision shapes: the robot falls through the ground; give its links collision "
                        "geometry in the file.")
    touching = result.root_height
    if result.floating_base and root_height is not None and touching is not None and root_height < touching - 0.005:
        depth = 100 * (touching - root_height)
        warnings.append(f"root_height {root_height:g} m starts the robot {depth:.1f} cm inside the ground (its "
                        f"lowest collider touches it at {touching:.3f} m in the joint_pos pose); set root_height: "
                        f"{math.ceil(touching * 100) / 100:g} in the robot YAML.")
    legs = [b.name for b in result.bodies if LEGGED.search(b.name)]
    if legs and not result.floating_base:
        warnings.append(f"fixed base for a legged robot (bodies {_names(legs)}): the robot is bolted to the world; "
                        "set floating_base: true in the robot YAML.")
    if unsupported:
        warnings.append(f"joints of more than one DoF ({_names(unsupported)}): legion drives hinge and slide joints "
                        "only; make them revolute or prismatic joints in the file.")
    driven = [j for j in result.joints if j.mode != "none"]
    if not driven:
        warnings.append("no actuators: no joint of the file has a drive, so joint_position actions (the robot tasks') "
                        "move nothing; add actuators: {<group>: {joints: <regex>, stiffness: ..., damping: ..., "
                        "effort_limit: ...}} in the robot YAML (a joint_effort action needs none).")
    limp = [j.name for j in driven if (j.damping if j.mode == "velocity" else j.stiffness) == 0]
    if limp:
        warnings.append(f"zero PD gains on {len(limp)} actuated joints ({_names(limp)}): joint_position targets "
                        "move nothing; set actuators: {<group>: {joints: <regex>, stiffness: ..., damping: ...}} "
                        "in the robot YAML.")
    large: dict[str, int] = {}
    for s in result.shapes:
        if s.vertices >= MESH_VERTICES:
            large[s.body] = max(large.get(s.body, 0), s.vertices)
    if large:
        method = dict(_approximations(result))
        example = ", ".join(f"{body}: {method.get(body, 'bounding_box')}" for body in list(large)[:3])
        warnings.append(f"mesh colliders with thousands of vertices on {len(large)} bodies "
                        f"({_names([f'{b} {v}' for b, v in large.items()])}): slow, many contacts; set "
                        f"collision.approximate: {{{example}, ...}} (bounding_box|bounding_sphere|convex_hull).")
    return warnings


# --- the starting robot YAML ---------------------------------------------------------------------
def robot_yaml(result: Inspection) -> str:
    """A robot config (configs/robot/*.yaml's format) guessed from what was loaded; every guess
    says so, every value the file lacks is marked TODO."""
    from legion import __version__

    bodies = [b.name for b in result.bodies]
    joint_names = [j.name for j in result.joints]
    legs = [b for b in bodies if LEGGED.search(b)]
    floating = result.floating_base or bool(legs)
    lines = ["# @package task.scene.robot",
             f"# {result.name}, written by legion-rl {__version__}'s",
             f"#   legion robot inspect {result.file}",
             "# as a starting point: values marked TODO are placeholders, the rest is the file's or a guess from",
             "# its names. Check it with `legion robot inspect robot=<this file>`, train with it where it is",
             "# (legion train task=... robot=<this file>), or keep it as robot/<name>.yaml in a folder of",
             "# LEGION_CONFIG_PATH (then robot=<name>).",
             f"file: {json.dumps(_portable(result))}"]
    why = "the file has a free joint" if result.floating_base else \
        f"the file's base is fixed, but it has legs ({_names(legs, 2)})" if floating else \
        "no free joint and no legs: bolted to the world (an arm)"
    lines.append(f"floating_base: {str(floating).lower():<9}# {why}")
    if floating and result.root_height is not None:
        height = math.ceil(result.root_height * 100) / 100  # to the cm above: it starts just clear of the ground
        lines.append(f"root_height: {height:<11g}# the lowest collider touches the ground in joint_pos's pose [m]")
    if result.joints:
        lines.append("joint_pos:              # default pose [rad or m]: 0 clamped into the limits; TODO a standing "
                     "or ready pose")
        width = max(len(json.dumps(n)) for n in joint_names) + 1
        lines += [f"  {json.dumps(j.name) + ':':<{width}} {_round(j.default):<8g} # [{_num(j.lower)}, {_num(j.upper)}]"
                  for j in result.joints]
    # Contacts happen on bodies with colliders: the contact groups name those (not a leg's rotor link).
    touching = list(dict.fromkeys(s.body for s in result.shapes)) or bodies
    groups = _body_groups(bodies, touching, floating, result.bodies[0].name if bodies else "")
    if groups:
        lines.append("bodies:                 # the groups tasks name (guessed from the body names)")
        lines += [f"  {key}: {json.dumps(value)}{'  # ' + note if note else ''}" for key, value, note in groups]
    fingers = [n for n in joint_names if FINGERS.search(n)]
    if not floating and fingers and len(fingers) < len(joint_names):
        lines += ["joints:                 # the arm tasks' groups",
                  f"  arm: {json.dumps(_pattern([n for n in joint_names if n not in fingers], joint_names))}",
                  f"  gripper: {json.dumps(_pattern(fingers, joint_names))}"]
    approximate = _approximations(result)
    if approximate:
        lines += ["collision:", "  approximate:          # mesh colliders -> primitives: fewer, cheaper contacts "
                  "(feet: spheres)"]
        by_method: dict[str, list[str]] = {}
        for body, method in approximate:
            by_method.setdefault(method, []).append(body)
        lines += [f"    {json.dumps(_pattern(names, bodies))}: {method}" for method, names in by_method.items()]
    lines += _actuators_yaml(result)
    return "\n".join(lines) + "\n"


def _actuators_yaml(result: Inspection) -> list[str]:
    """One actuator group per set of joints with the same limits and gains in the file."""
    joints = [j for j in result.joints if j.mode != "none"] or result.joints  # none driven: all need a drive
    if not joints:
        return []
    names = [j.name for j in result.joints]
    groups: dict[tuple, list[Joint]] = {}
    for j in joints:
        groups.setdefault((j.effort_limit, j.velocity_limit, j.stiffness, j.damping, j.armature), []).append(j)
    lines = ["actuators:              # per group of joints with the same limits and gains in the file"]
    used: set[str] = set()
    for (effort, velocity, kp, kd, armature), members in groups.items():
        member_names = [j.name for j in members]
        pattern = _pattern(member_names, names)
        group = _group_name(member_names, effort, used)
        limits = f"effort {_num(effort)}, velocity {_num(velocity)}"
        lines += [f"  {group}:{' ' * max(1, 21 - len(group))}# {len(members)} joint{'s' * (len(members) > 1)}; the "
                  f"file's limits: {limits}",
                  f"    joints: {json.dumps(pattern)}"]
        if kp == 0 and kd == 0:  # the file has no gains: placeholders of the usual size
            guess = effort if 0 < effort < UNLIMITED else 20.0
            lines += [f"    stiffness: {_round(guess):<10g}# TODO placeholder, the file has none: kp = effort limit "
                      "/ 1 rad; tune",
                      f"    damping: {_round(guess / 20):<12g}# TODO placeholder: kd = kp / 20; tune"]
        else:
            lines += [f"    stiffness: {_round(kp):g}", f"    damping: {_round(kd):g}"]
        if 0 < effort < UNLIMITED:
            lines.append(f"    effort_limit: {_round(effort):g}")
        else:
            lines.append("    # effort_limit: TODO the motors' peak torque [N m] (the file has none)")
        if armature == 0:
            lines.append("    # armature: TODO the motors' reflected rotor inertia [kg m^2] (none in the file)")
    return lines


def _body_groups(bodies: list[str], touching: list[str], floating: bool, root: str) -> list[tuple[str, str, str]]:
    """(group, regex, comment): base and contacts (of ``touching``, the bodies with colliders)
    for a legged robot, tcp and fingers for an arm."""
    groups = [("base", re.escape(root), "the root body")] if root else []
    if floating:
        for candidates in FEET:
            feet = [b for b in touching if re.search(candidates, b, re.IGNORECASE)]
            if feet:
                groups.append(("feet", _pattern(feet, bodies), ""))
                break
        groups.append(("illegal_contacts", re.escape(root), "an episode ends when these touch the ground"))
        shins = [b for b in touching if re.search(r"thigh|calf|shin|knee", b, re.IGNORECASE)]
        if shins:
            groups.append(("undesired_contacts", _pattern(shins, bodies), "penalized when they touch"))
    else:
        for candidates in TCP:
            tcp = [b for b in bodies if re.search(candidates, b, re.IGNORECASE)]
            if tcp:
                groups.append(("tcp", re.escape(tcp[-1]), "the tool centre point: TODO check"))
                break
        fingers = [b for b in bodies if FINGERS.search(b)]
        if fingers:
            groups.append(("fingers", _pattern(fingers, bodies), ""))
    return groups


def _approximations(result: Inspection) -> list[tuple[str, str]]:
    """(body, method) for each body with a mesh collider: feet become spheres, a legged robot's
    other links boxes, an arm's links convex hulls (a box is too coarse for reaching and grasping)."""
    floating = result.floating_base or result.legged
    bodies = list(dict.fromkeys(s.body for s in result.shapes if s.type == "mesh"))
    touching = {s.body for s in result.shapes}  # the feet as _body_groups finds them: of all colliding bodies
    feet = next((pattern for pattern in FEET if any(re.search(pattern, b, re.IGNORECASE) for b in touching)), None)
    return [(b, "bounding_sphere" if floating and feet and re.search(feet, b, re.IGNORECASE)
             else "bounding_box" if floating else "convex_hull") for b in bodies]


# --- helpers -------------------------------------------------------------------------------------
def _pattern(names: list[str], universe: list[str]) -> str:
    """A regex matching exactly ``names`` among ``universe``: one alternative per joint of every
    side (".*_hip_joint" for FL_hip_joint ... RR_hip_joint) where that matches nothing else."""
    parts = []
    for name in names:
        stem = SIDE.sub("", name)
        part = ".*" + re.escape(stem) if stem != name else re.escape(name)
        if not {n for n in universe if re.fullmatch(part, n)} <= set(names):
            part = re.escape(name)
        if part not in parts:
            parts.append(part)
    return "|".join(parts)


def _group_name(names: list[str], effort: float, used: set[str]) -> str:
    """The joints' common stems ("hip_thigh"), or the effort limit where there are many ("effort_88")."""
    stems = list(dict.fromkeys(re.sub(r"_?joint$", "", SIDE.sub("", n)).strip("_-") for n in names))
    name = "_".join(stems) if len(stems) <= 2 and len("_".join(stems)) <= 24 else \
        f"effort_{_num(effort)}".replace(".", "_").replace("-", "none")
    name = re.sub(r"\W", "_", name) or "joints"
    candidate, k = name, 2
    while candidate in used:
        candidate, k = f"{name}_{k}", k + 1
    used.add(candidate)
    return candidate


def _portable(result: Inspection) -> str:
    """The file as the YAML should name it: a package:// URI or a file name in tasks/assets as
    given, any other path absolute (the YAML then works from any folder)."""
    if result.file.startswith("package://"):
        return result.file
    if result.path.parent.resolve() == ASSET_DIR.resolve():
        return result.path.name
    return str(result.path.resolve())


def _table(headers: tuple[str, ...], rows: list[tuple]) -> list[str]:
    if not rows:
        return ["  (none)"]
    cells = [tuple(str(c) for c in headers)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x) or abs(x) >= UNLIMITED:
        return "-"
    return f"{x:.4g}"


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _names(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f", ... ({len(names) - shown} more)" if len(names) > shown else "")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
