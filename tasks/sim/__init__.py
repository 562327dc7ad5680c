"""The simulation seam: everything tasks know about physics goes through :class:`NewtonSim`.

A :class:`NewtonSim` loads one robot file (MJCF, URDF or USD), replicates it into
``num_envs`` independent Newton worlds sharing one ground plane, and steps them together.
Tasks read and write state only through the torch views it exposes; they never touch a
Newton object, so a second backend can serve the same tasks by providing the same views.

Conventions (all views are float32 torch tensors on ``device``, sharing memory with Newton):

- ``joint_pos`` / ``joint_vel``: (num_envs, num_joints) [rad or m, rad/s or m/s], actuated
  joints only, in the model's joint order (``joint_names``).
- ``root_pos`` (num_envs, 3) [m] and ``root_quat`` (num_envs, 4) in (x, y, z, w) order, the
  floating base pose in the world frame; ``root_lin_vel`` / ``root_ang_vel`` (num_envs, 3)
  [m/s, rad/s] in the world frame (linear velocity of the base's centre of mass). Absent
  (``None``) for fixed-base robots.
- ``body_pos`` (num_envs, num_bodies, 3) [m], ``body_quat`` (num_envs, num_bodies, 4).
- ``joint_target_pos`` (num_envs, num_joints): position-PD targets; ``joint_effort``
  (num_envs, num_joints) [N or N*m]: feed-forward generalized forces.
- ``contact_forces`` (num_envs, num_bodies, 3) [N]: net contact force on every body, world
  frame, at the last physics substep of the control step (MuJoCo solver only).

Per-env physical parameters (``PARAMS``; views of the per-world slices of Newton's model arrays,
writable; the values at construction are kept in ``defaults[name]``):

- ``shape_friction`` / ``shape_restitution`` (num_envs, num_shapes): sliding friction coefficient
  and coefficient of restitution [0, 1) of every shape of the robot (``shape_body`` maps a shape
  to its body). Robot shapes take MuJoCo contact priority over the ground, so a robot contact
  uses the robot shape's own friction and contact softness (MuJoCo otherwise combines two geoms'
  friction with the maximum, which hides any value below the ground's). MuJoCo has no
  restitution coefficient: a value e > 0 sets the contact's damping ratio to
  -ln(e) / sqrt(pi^2 + ln(e)^2), the one at which a linear spring-damper rebounds with e.
- ``body_mass`` (num_envs, num_bodies) [kg], ``body_com`` (num_envs, num_bodies, 3) [m] in the
  body frame, ``body_inertia`` (num_envs, num_bodies, 3, 3) [kg m^2] about the COM, body frame.
- ``joint_stiffness`` / ``joint_damping`` (num_envs, num_joints) [N m/rad, N m s/rad]: PD gains;
  ``joint_effort_limit`` [N m] (clamps the PD torque; ``effort_limits`` (num_joints,) keeps the
  model's); ``joint_friction`` [N m] (dry friction loss: MuJoCo adds a constraint row per
  joint, ~15% slower stepping); ``joint_armature`` [kg m^2] (rotor inertia).
- ``gravity`` (num_envs, 3) [m/s^2], world frame.

After writing parameters, name them with :meth:`NewtonSim.params_changed`; the next
:meth:`NewtonSim.step` hands them to the solver (no rebuild, no recompile; the captured graph
replays with the new values).
"""

from __future__ import annotations

import functools
import math
import re
import threading
from pathlib import Path

import numpy as np
import torch
import warp as wp

# The contact-force decoding is MuJoCo Warp's own, so pyramidal and elliptic cones both work.
from mujoco_warp._src.support import contact_force_fn as mjw_contact_force_fn
from mujoco_warp._src.types import vec5

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets"
SOLVERS = ("mujoco", "xpbd")
# The per-env physical parameter views, and the newton.ModelFlags the solver needs for each.
PARAMS = {
    "shape_friction": "SHAPE_PROPERTIES",
    "shape_restitution": "SHAPE_PROPERTIES",
    "body_mass": "BODY_INERTIAL_PROPERTIES",
    "body_com": "BODY_INERTIAL_PROPERTIES",
    "body_inertia": "BODY_INERTIAL_PROPERTIES",
    "joint_stiffness": "JOINT_DOF_FORCE_PROPERTIES",
    "joint_damping": "JOINT_DOF_FORCE_PROPERTIES",
    "joint_effort_limit": "JOINT_DOF_FORCE_PROPERTIES",
    "joint_friction": "JOINT_DOF_FORCE_PROPERTIES",
    "joint_armature": "JOINT_DOF_INERTIAL_PROPERTIES",  # MuJoCo recomputes constants: costlier
    "gravity": "MODEL_PROPERTIES",
}


# Warp's CPU kernels point a static of their module at the calling thread's tile arena (LLVM's
# JIT has no thread-local storage), so two threads running them at once corrupt each other's
# tiles: "Warp CPU tile shared-memory allocation exceeds the 256 KiB arena", then an abort or a
# segfault (seen with two quadruped sims stepped from two threads; the static is the one of
# NVIDIA/warp#1413, thread safety is NVIDIA/warp#1491). Every NewtonSim method that
# launches kernels holds this lock, so sims used from several threads take turns instead.
# Uncontended (one thread steps the sims, as in agent.mode=async) it costs nothing measurable.
_WARP_LOCK = threading.Lock()


def _one_thread_at_a_time(method):
    @functools.wraps(method)
    def locked(*args, **kwargs):
        with _WARP_LOCK:
            return method(*args, **kwargs)

    return locked


def resolve_asset(path: str) -> Path:
    """Find a robot file: an absolute/relative path, or a file name in ``tasks/assets``."""
    for candidate in (Path(path), ASSET_DIR / path):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Robot model '{path}' not found (looked in the working directory and {ASSET_DIR}). "
        "Give a path to an .xml (MJCF), .urdf or .usd/.usda file."
    )


@wp.kernel
def _contact_forces_kernel(
    nacon: wp.array[int],
    contact_geom: wp.array[wp.vec2i],
    contact_worldid: wp.array[int],
    opt_cone: int,
    contact_frame: wp.array[wp.mat33],
    contact_friction: wp.array[vec5],
    contact_dim: wp.array[int],
    contact_efc_address: wp.array2d[int],
    contact_adhesion: wp.array[float],
    efc_force: wp.array2d[float],
    njmax: int,
    geom_slot: wp.array[int],
    out: wp.array2d[wp.vec3],
):
    """Adds each active MuJoCo contact's world-frame force to the sensed bodies it touches."""
    cid = wp.tid()
    if cid >= nacon[0]:
        return
    geoms = contact_geom[cid]
    slot0 = geom_slot[geoms[0]]
    slot1 = geom_slot[geoms[1]]
    if slot0 < 0 and slot1 < 0:
        return
    world = contact_worldid[cid]
    f = mjw_contact_force_fn(
        opt_cone, contact_frame, contact_friction, contact_dim, contact_efc_address,
        contact_adhesion, efc_force, njmax, nacon, world, cid, True,
    )
    force = wp.spatial_top(f)
    # MuJoCo's contact normal points from geom 0 to geom 1: the force acts on geom 1.
    if slot1 >= 0:
        wp.atomic_add(out, world, slot1, force)
    if slot0 >= 0:
        wp.atomic_sub(out, world, slot0, force)


class NewtonSim:
    """``num_envs`` copies of one robot in Newton, advanced ``decimation`` substeps at a time.

    Args:
        robot: robot file (MJCF ``.xml``, ``.urdf``, ``.usd``/``.usda``), a path or a name in
            ``tasks/assets``.
        num_envs: number of independent worlds.
        dt: physics time step [s].
        decimation: physics substeps per :meth:`step` (one control step).
        device: Warp/torch device string, e.g. ``"cpu"`` or ``"cuda:0"``.
        solver: ``"mujoco"`` (SolverMuJoCo on MuJoCo Warp) or ``"xpbd"`` (no contact sensing).
        solver_options: keyword arguments for the solver's constructor.
        ground: add a ground plane shared by all worlds.
        ground_friction: friction coefficient of the ground plane.
        contact_gap: collision detection gap [m]; PLATFORM.md: Newton's 0.1 m default makes ~30x
            more contacts than needed.
        sense_contacts: fill ``contact_forces`` after each control step (MuJoCo solver only).
        use_graph: capture the decimated step as one Warp graph (CPU and CUDA).
    """

    @_one_thread_at_a_time
    def __init__(
        self,
        robot: str,
        num_envs: int,
        dt: float,
        decimation: int,
        device: str = "cpu",
        solver: str = "mujoco",
        solver_options: dict | None = None,
        ground: bool = True,
        ground_friction: float = 1.0,
        contact_gap: float = 0.0,
        sense_contacts: bool = True,
        use_graph: bool = True,
    ):
        import newton  # imported here so that `import legion.tasks.sim` stays cheap

        if solver not in SOLVERS:
            raise ValueError(f"Unknown solver '{solver}'; choose one of {SOLVERS} (configs/sim/).")
        if num_envs < 1 or decimation < 1 or dt <= 0:
            raise ValueError(f"Need num_envs >= 1, decimation >= 1, dt > 0; got {num_envs}, {decimation}, {dt}.")
        self.num_envs, self.dt, self.decimation, self.device = num_envs, dt, decimation, device
        self.physics_dt = dt
        self.control_dt = dt * decimation
        self.solver_name = solver

        robot_builder = newton.ModelBuilder()
        newton.solvers.SolverMuJoCo.register_custom_attributes(robot_builder)
        robot_builder.rigid_gap = contact_gap
        path = resolve_asset(robot)
        try:
            if path.suffix == ".xml":
                robot_builder.add_mjcf(str(path), enable_self_collisions=False)
            elif path.suffix == ".urdf":
                robot_builder.add_urdf(str(path), enable_self_collisions=False)
            elif path.suffix in (".usd", ".usda", ".usdc"):
                robot_builder.add_usd(str(path), enable_self_collisions=False)
            else:
                raise ValueError(f"unsupported file type '{path.suffix}' (use .xml, .urdf, .usd, .usda)")
        except Exception as e:
            raise ValueError(f"Could not load robot model {path}: {e}") from e
        if robot_builder.body_count == 0:
            raise ValueError(f"Robot model {path} has no bodies.")

        builder = newton.ModelBuilder()
        builder.rigid_gap = contact_gap
        builder.replicate(robot_builder, num_envs)
        if ground:
            cfg = newton.ModelBuilder.ShapeConfig(mu=ground_friction, gap=contact_gap)
            builder.add_ground_plane(cfg=cfg)
        self.model = model = builder.finalize(device=device)
        shapes = model.shape_count // num_envs  # per world; the shared ground comes last
        if solver == "mujoco":
            # The robot's contacts use the robot's own material (see the module docstring).
            wp.to_torch(model.mujoco.geom_priority)[: num_envs * shapes] = 1

        self.state = model.state()
        self.control = model.control()
        newton.eval_fk(model, model.joint_q, model.joint_qd, self.state)
        if solver == "mujoco":
            self.solver = newton.solvers.SolverMuJoCo(model, **(solver_options or {}))
        else:
            if sense_contacts:
                raise ValueError("Contact-force sensing needs sim=mujoco. For sim=xpbd set task.sense_contacts=false "
                                 "and remove the task's contact terms (feet_air_time, undesired_contacts, illegal_contact).")
            self.solver = newton.solvers.SolverXPBD(model, **(solver_options or {}))
            self.collision = newton.CollisionPipeline(model)
            self.contacts = self.collision.contacts()
            self._state_next = model.state()
        self._newton = newton

        # --- layout of one world -------------------------------------------------------
        n = num_envs
        coords = model.joint_coord_count // n
        dofs = model.joint_dof_count // n
        bodies = model.body_count // n
        joint_type = model.joint_type.numpy()[: model.joint_count // n]
        self.floating_base = bool(joint_type[0] == newton.JointType.FREE)
        q0, v0 = (7, 6) if self.floating_base else (0, 0)
        self.body_names = [_short(label) for label in model.body_label[:bodies]]
        dof_labels = []
        for j, label in enumerate(model.joint_label[: model.joint_count // n]):
            dof_count = int(model.joint_qd_start.numpy()[j + 1] - model.joint_qd_start.numpy()[j])
            dof_labels += [_short(label)] * dof_count
        self.joint_names = dof_labels[v0:]
        self.num_joints = dofs - v0
        if coords - q0 != self.num_joints:
            raise ValueError(
                f"{path.name}: only 1-DoF joints (hinge, slide) are supported below the root; "
                f"found {coords - q0} coordinates for {self.num_joints} DoFs."
            )

        # --- zero-copy torch views --------------------------------------------------------
        joint_q = wp.to_torch(self.state.joint_q).view(n, coords)
        joint_qd = wp.to_torch(self.state.joint_qd).view(n, dofs)
        self._joint_q, self._joint_qd = joint_q, joint_qd
        self.joint_pos = joint_q[:, q0:]
        self.joint_vel = joint_qd[:, v0:]
        self.joint_target_pos = wp.to_torch(self.control.joint_target_q).view(n, coords)[:, q0:]
        self.joint_effort = wp.to_torch(self.control.joint_f).view(n, dofs)[:, v0:]
        self._root_force = wp.to_torch(self.control.joint_f).view(n, dofs)[:, :v0]
        if self.floating_base:
            self.root_pos, self.root_quat = joint_q[:, 0:3], joint_q[:, 3:7]
            self.root_lin_vel, self.root_ang_vel = joint_qd[:, 0:3], joint_qd[:, 3:6]
        else:
            self.root_pos = self.root_quat = self.root_lin_vel = self.root_ang_vel = None
        body_q = wp.to_torch(self.state.body_q).view(n, bodies, 7)
        self.body_pos, self.body_quat = body_q[..., 0:3], body_q[..., 3:7]

        # Per-env physical parameters (the per-world slices of Newton's flat model arrays).
        self.shape_body = wp.to_torch(model.shape_body)[:shapes].clone()  # (num_shapes,) body index, -1: none
        self.shape_friction = wp.to_torch(model.shape_material_mu)[: n * shapes].view(n, shapes)
        self.shape_restitution = wp.to_torch(model.shape_material_restitution)[: n * shapes].view(n, shapes)
        self.body_mass = wp.to_torch(model.body_mass).view(n, bodies)
        self.body_com = wp.to_torch(model.body_com).view(n, bodies, 3)
        self.body_inertia = wp.to_torch(model.body_inertia).view(n, bodies, 3, 3)
        self.joint_stiffness = wp.to_torch(model.joint_target_ke).view(n, dofs)[:, v0:]
        self.joint_damping = wp.to_torch(model.joint_target_kd).view(n, dofs)[:, v0:]
        self.joint_effort_limit = wp.to_torch(model.joint_effort_limit).view(n, dofs)[:, v0:]
        self.joint_friction = wp.to_torch(model.joint_friction).view(n, dofs)[:, v0:]
        self.joint_armature = wp.to_torch(model.joint_armature).view(n, dofs)[:, v0:]
        self.gravity = wp.to_torch(model.gravity)[:n]
        self.defaults = {name: getattr(self, name).clone() for name in PARAMS}
        self._body_inv_mass = wp.to_torch(model.body_inv_mass).view(n, bodies)
        self._body_inv_inertia = wp.to_torch(model.body_inv_inertia).view(n, bodies, 3, 3)
        self._changed: set[str] = set()
        if solver == "mujoco":
            from newton._src.solvers.mujoco.constants import SOLREF_MODE_RAW  # (time constant, damping ratio)

            self._solref_raw = SOLREF_MODE_RAW
            self._solref = wp.to_torch(model.mujoco.solref)[: n * shapes].view(n, shapes, 2)
            self._solref_mode = wp.to_torch(model.mujoco.solref_mode)[: n * shapes].view(n, shapes)
            self._default_solref, self._default_solref_mode = self._solref.clone(), self._solref_mode.clone()
            # Position actuators clamp their force to their own force range too: it follows
            # joint_effort_limit (actuator -> joint index, and the range at scale 1).
            self._actuator_joint = torch.zeros(0, dtype=torch.long, device=device)
            source, target = self.solver.mjc_actuator_ctrl_source, self.solver.mjc_actuator_to_newton_idx
            if source is not None and target is not None:
                source, target = wp.to_torch(source).long(), wp.to_torch(target).long() - v0
                joint_target = (source == int(self.solver.CtrlSource.JOINT_TARGET)) & (target >= 0)
                self._actuator_ids = joint_target.nonzero().squeeze(-1)
                self._actuator_joint = target[self._actuator_ids]
                self._actuator_forcerange = wp.to_torch(self.solver.mjw_model.actuator_forcerange)
                self._default_actuator_forcerange = self._actuator_forcerange[:, self._actuator_ids].clone()
        lower = wp.to_torch(model.joint_limit_lower).view(n, dofs)[0, v0:]
        upper = wp.to_torch(model.joint_limit_upper).view(n, dofs)[0, v0:]
        self.joint_limits = torch.stack([lower, upper], dim=-1).clone()
        self.effort_limits = wp.to_torch(model.joint_effort_limit).view(n, dofs)[0, v0:].clone()
        self.default_joint_pos = joint_q[:, q0:].clone()
        self.default_root_pose = joint_q[:, :q0].clone()

        # --- contact sensor: every body of a world is one slot -----------------------------
        self.contact_forces = torch.zeros(n, bodies, 3, device=device)
        self._contact_out = wp.from_torch(self.contact_forces, dtype=wp.vec3)
        self._geom_slot = self._mujoco_geom_slots() if sense_contacts else None

        # Reset bookkeeping: Newton's per-world reset mask (the last entry is the shared ground,
        # never reset); eval_fk takes one entry per world, the first n.
        self._reset_mask = wp.zeros(n + 1, dtype=wp.bool, device=device)
        self._reset_mask_t = wp.to_torch(self._reset_mask)
        self._fk_mask = self._reset_mask[:n]

        self.graph = None
        if use_graph:
            with wp.ScopedCapture(device=device) as capture:
                self._simulate()
            self.graph = capture.graph

    # ------------------------------------------------------------------------------------
    def find_bodies(self, pattern: str | list[str]) -> list[int]:
        """Indices of the bodies whose names fully match a regular expression (or any of a list)."""
        return _match(pattern, self.body_names, "body")

    def find_joints(self, pattern: str | list[str]) -> list[int]:
        """Indices of the actuated joints whose names fully match a regular expression (or list)."""
        return _match(pattern, self.joint_names, "joint")

    def _mujoco_geom_slots(self) -> wp.array:
        """Maps each MuJoCo geom of the template world to its Newton body index (-1: world)."""
        geom_body = self.solver.mjw_model.geom_bodyid.numpy()
        mjc_body_to_newton = self.solver.mjc_body_to_newton.numpy()[0]
        slots = np.where(geom_body > 0, mjc_body_to_newton[geom_body], -1).astype(np.int32)
        return wp.array(slots, dtype=int, device=self.device)

    def _sense_contacts(self):
        self._contact_out.zero_()
        d, m = self.solver.mjw_data, self.solver.mjw_model
        wp.launch(
            _contact_forces_kernel,
            dim=d.naconmax,
            inputs=[
                d.nacon, d.contact.geom, d.contact.worldid, m.opt.cone, d.contact.frame,
                d.contact.friction, d.contact.dim, d.contact.efc_address, d.contact.adhesion,
                d.efc.force, d.njmax, self._geom_slot,
            ],
            outputs=[self._contact_out],
            device=self.device,
        )

    def _simulate(self):
        # Stepping one State in place keeps every torch view valid (MuJoCo reads state_in
        # before it writes state_out).
        for _ in range(self.decimation):
            if self.solver_name == "mujoco":
                self.solver.step(self.state, self.state, self.control, None, self.dt)
            else:
                # XPBD integrates body poses (maximal coordinates) and needs distinct in/out
                # states; the joint coordinates the views read are recovered by inverse kinematics.
                self.collision.collide(self.state, self.contacts)
                self.solver.step(self.state, self._state_next, self.control, self.contacts, self.dt)
                self.state.assign(self._state_next)
        if self.solver_name == "xpbd":
            self._newton.eval_ik(self.model, self.state, self.state.joint_q, self.state.joint_qd)
        if self._geom_slot is not None:
            self._sense_contacts()

    @_one_thread_at_a_time
    def step(self) -> None:
        """Advance every world by one control step (``decimation`` physics steps)."""
        if self._changed:
            self._publish_params()
        if self.graph is not None:
            wp.capture_launch(self.graph)
        else:
            self._simulate()

    def apply_root_force(self, force: torch.Tensor) -> None:
        """Sets an external wrench (num_envs, 6) [N, N*m] on the floating base, world frame."""
        self._root_force.copy_(force)

    @_one_thread_at_a_time
    def reset(
        self,
        env_ids: torch.Tensor,
        joint_pos: torch.Tensor | None = None,
        joint_vel: torch.Tensor | None = None,
        root_pose: torch.Tensor | None = None,
        root_vel: torch.Tensor | None = None,
    ) -> None:
        """Writes the state of the worlds ``env_ids`` only, leaving the others untouched, and
        recomputes their body poses. ``None`` keeps what the views already hold. The solver
        forgets what it carried over for these worlds (MuJoCo's warm start), so a reset world's
        future depends on its new state only, not on its previous episode.

        Args:
            env_ids: (k,) long indices of the worlds to reset.
            joint_pos, joint_vel: (k, num_joints).
            root_pose: (k, 7) position and (x, y, z, w) quaternion; floating base only.
            root_vel: (k, 6) linear and angular velocity, world frame; floating base only.
        """
        if env_ids.numel() == 0:
            return
        if joint_pos is not None:
            self.joint_pos[env_ids] = joint_pos
        if joint_vel is not None:
            self.joint_vel[env_ids] = joint_vel
        if root_pose is not None:
            self._joint_q[env_ids, :7] = root_pose
        if root_vel is not None:
            self._joint_qd[env_ids, :6] = root_vel
        # Body poses follow from the joint coordinates; refresh them for these worlds only.
        self._reset_mask_t.zero_()
        self._reset_mask_t[env_ids] = True
        self._newton.eval_fk(self.model, self.state.joint_q, self.state.joint_qd, self.state, mask=self._fk_mask)
        self.solver.reset(self.state, self._reset_mask, flags=0)  # flags=0: solver buffers only

    def params_changed(self, *names: str) -> None:
        """Marks per-env parameter views (names from ``PARAMS``) as edited; the next :meth:`step`
        hands them to the solver, once, however many edits came before it."""
        unknown = [name for name in names if name not in PARAMS]
        if unknown:
            raise ValueError(f"Unknown physical parameter(s) {unknown}; NewtonSim has {sorted(PARAMS)}.")
        self._changed.update(names)

    def _publish_params(self) -> None:
        """Derived quantities, then one ``solver.notify_model_changed`` for everything edited."""
        changed, self._changed = self._changed, set()
        if changed & {"body_mass", "body_inertia"}:
            mass = self.body_mass
            self._body_inv_mass.copy_(torch.where(mass > 0, 1.0 / mass.clamp(min=1e-12), 0.0))
            inertia = self.body_inertia
            invertible = torch.linalg.det(inertia).abs() > 1e-18
            eye = torch.eye(3, device=inertia.device).expand_as(inertia)
            inverse = torch.linalg.inv(torch.where(invertible[..., None, None], inertia, eye))
            self._body_inv_inertia.copy_(torch.where(invertible[..., None, None], inverse, 0.0))
        if self.solver_name == "mujoco":
            if "shape_restitution" in changed:
                e = self.shape_restitution.clamp(0.0, 0.99)
                log_e = torch.log(e.clamp(min=1e-6))
                damping_ratio = torch.where(e > 0, -log_e / torch.sqrt(math.pi**2 + log_e**2), 1.0)
                edited = self.shape_restitution != self.defaults["shape_restitution"]
                raw = self._default_solref_mode == self._solref_raw
                time_constant = torch.where(raw, self._default_solref[..., 0], 0.02)
                solref = torch.stack([time_constant, damping_ratio], dim=-1)
                self._solref.copy_(torch.where(edited[..., None], solref, self._default_solref))
                self._solref_mode.copy_(torch.where(edited, self._solref_raw, self._default_solref_mode))
            if "joint_effort_limit" in changed and self._actuator_joint.numel():
                scale = self.joint_effort_limit / self.defaults["joint_effort_limit"].clamp(min=1e-9)
                self._actuator_forcerange[:, self._actuator_ids] = (
                    self._default_actuator_forcerange * scale[:, self._actuator_joint, None])
        flags = 0
        for name in changed:
            flags |= int(getattr(self._newton.ModelFlags, PARAMS[name]))
        self.solver.notify_model_changed(flags)


def _match(pattern: str | list[str], names: list[str], kind: str) -> list[int]:
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    hits = [i for i, name in enumerate(names) if any(re.fullmatch(p, name) for p in patterns)]
    if not hits:
        raise ValueError(f"No {kind} name matches {patterns}. The model's {kind} names: {names}")
    return hits


def _short(label: str) -> str:
    """Newton labels are paths like 'quadruped/FL_calf'; keep the last component."""
    return label.rsplit("/", 1)[-1]
