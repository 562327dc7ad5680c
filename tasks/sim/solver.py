"""The solver adapter: what differs between Newton's solvers, behind one small interface.

:class:`~legion.tasks.sim.NewtonSim` asks its solver to step the state one physics step, finish a
control step, forget the history of reset worlds, sense contact forces, and take edited
per-env parameters; it reads the solver's ``limits`` counters (:data:`SOLVER_LIMITS`).
:class:`MuJoCo` (SolverMuJoCo on MuJoCo Warp, the default) and :class:`XPBD` answer. This is the
only module that uses private names of Newton and MuJoCo Warp, or reaches into MuJoCo Warp's
model and data behind SolverMuJoCo; each use says why.
"""

from __future__ import annotations

import math

import mujoco_warp as mjw
import numpy as np
import torch
import warp as wp

# The contact-force decoding is MuJoCo Warp's own (private: no public per-contact force API), so
# pyramidal and elliptic friction cones both work.
from mujoco_warp._src.support import contact_force_fn as mjw_contact_force_fn
from mujoco_warp._src.types import vec5

# What the solver counts per control step, in the order of ``limits``: how many worlds stopped
# at a limit (either of the next two), at the linesearch iteration limit (``ls_iterations``), at
# the solver iteration limit (``iterations``), and how many overflowed a capacity (contacts or
# constraint rows beyond nconmax / njmax: MuJoCo dropped some).
SOLVER_LIMITS = ("limit", "linesearch_limit", "iteration_limit", "overflow")

# The newton.ModelFlags each per-env parameter needs the solver to re-read.
PARAM_FLAGS = {
    "shape_friction": "SHAPE_PROPERTIES",
    "shape_restitution": "SHAPE_PROPERTIES",
    "shape_size": "SHAPE_PROPERTIES",  # MuJoCo's geom size, bounding box and radius follow it
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


# The kernels below are Warp's language, not Python: there ``a[i]`` of an array is an element. Warp's
# type stubs describe arrays in Python scope (indexing gives an array; atomic_add takes another
# Array class), so pyright misreads element reads and atomics: the kernels' ignores are for those stubs.
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
    """Adds each active MuJoCo contact's world-frame force to the bodies it touches."""
    cid = wp.tid()
    if cid >= nacon[0]:  # pyright: ignore[reportOperatorIssue]
        return
    geoms = contact_geom[cid]
    slot0 = geom_slot[geoms[0]]  # pyright: ignore[reportIndexIssue]
    slot1 = geom_slot[geoms[1]]  # pyright: ignore[reportIndexIssue]
    if slot0 < 0 and slot1 < 0:  # pyright: ignore[reportOperatorIssue]
        return
    world = contact_worldid[cid]
    f = mjw_contact_force_fn(
        opt_cone, contact_frame, contact_friction, contact_dim, contact_efc_address,
        contact_adhesion, efc_force, njmax, nacon, world, cid, True,  # pyright: ignore[reportArgumentType]
    )
    force = wp.spatial_top(f)
    # MuJoCo's contact normal points from geom 0 to geom 1: the force acts on geom 1.
    if slot1 >= 0:  # pyright: ignore[reportOperatorIssue]
        wp.atomic_add(out, world, slot1, force)  # pyright: ignore[reportArgumentType]
    if slot0 >= 0:  # pyright: ignore[reportOperatorIssue]
        wp.atomic_sub(out, world, slot0, force)  # pyright: ignore[reportArgumentType]


_LS_ITERATIONS = int(mjw.OverflowType.LS_ITERATIONS)
_ITERATIONS = int(mjw.OverflowType.ITERATIONS)


@wp.kernel
def _gather_overflow_kernel(overflow: wp.array[int], hit: wp.array[int]):
    """ORs each world's overflow bits of one physics step into ``hit`` (num_worlds,), then clears them."""
    world = wp.tid()
    hit[world] = hit[world] | overflow[world]  # pyright: ignore[reportIndexIssue, reportOperatorIssue]
    overflow[world] = 0  # pyright: ignore[reportIndexIssue]


@wp.kernel
def _count_limits_kernel(hit: wp.array[int], limits: wp.array[int]):
    """Counts the worlds of each kind of :data:`SOLVER_LIMITS` in ``hit``, then clears ``hit``."""
    world = wp.tid()
    bits = hit[world]
    if bits == 0:
        return
    hit[world] = 0  # pyright: ignore[reportIndexIssue]
    linesearch = (bits & _LS_ITERATIONS) != 0  # pyright: ignore[reportOperatorIssue]
    iterations = (bits & _ITERATIONS) != 0  # pyright: ignore[reportOperatorIssue]
    if linesearch or iterations:
        wp.atomic_add(limits, 0, 1)  # pyright: ignore[reportArgumentType]
    if linesearch:
        wp.atomic_add(limits, 1, 1)  # pyright: ignore[reportArgumentType]
    if iterations:
        wp.atomic_add(limits, 2, 1)  # pyright: ignore[reportArgumentType]
    if (bits & ~(_LS_ITERATIONS | _ITERATIONS)) != 0:  # pyright: ignore[reportOperatorIssue]
        wp.atomic_add(limits, 3, 1)  # pyright: ignore[reportArgumentType]


class MuJoCo:
    """Newton's SolverMuJoCo (MuJoCo Warp). Senses contact forces per body.

    Contact material: every shape of a world takes MuJoCo contact priority over the shared ground,
    so a contact uses the robot's (or object's) own friction and softness; MuJoCo would otherwise
    combine the two geoms' friction with the maximum, hiding any value below the ground's.
    Restitution: MuJoCo has none; a value e > 0 sets the contact's damping ratio to
    -ln(e) / sqrt(pi^2 + ln(e)^2), the one at which a linear spring-damper rebounds with e.

    Solver limits: MuJoCo Warp would print a line ("linesearch iterations limit reached ...")
    from inside its kernels each time a world stops at ``ls_iterations`` or ``iterations``,
    hundreds of times per training run. Its prints are off; instead the per-world overflow
    bitmask it sets (``Data.overflow``, :class:`mujoco_warp.OverflowType`) is gathered after each
    physics step and counted per control step into ``limits`` (:data:`SOLVER_LIMITS`), on the
    device and inside the captured graph.
    """

    name = "mujoco"
    senses_contacts = True

    @staticmethod
    def prepare_builder(builder) -> None:
        """Registers the MJCF attributes SolverMuJoCo reads (before a model file is loaded)."""
        import newton

        newton.solvers.SolverMuJoCo.register_custom_attributes(builder)

    def __init__(self, sim, options: dict):
        import newton
        from newton._src.solvers.mujoco.constants import SOLREF_MODE_RAW  # (time constant, damping ratio)

        self.sim, self._newton = sim, newton
        model, n, shapes = sim.model, sim.num_envs, sim.shapes_per_world
        wp.to_torch(model.mujoco.geom_priority)[: n * shapes] = 1  # see the class docstring
        self.solver = newton.solvers.SolverMuJoCo(model, **options)
        # MuJoCo Warp compiles its overflow prints in or out by this mask (a wp.static of the kernels
        # it builds at their first launch, NewtonSim's graph capture): set it before any step.
        self.solver.mjw_model.opt.warn_overflow = 0
        self.limits = wp.zeros(len(SOLVER_LIMITS), dtype=int, device=sim.device)
        self._overflow_hit = wp.zeros(n, dtype=int, device=sim.device)
        self._solref_raw = SOLREF_MODE_RAW
        self._solref = wp.to_torch(model.mujoco.solref)[: n * shapes].view(n, shapes, 2)
        self._solref_mode = wp.to_torch(model.mujoco.solref_mode)[: n * shapes].view(n, shapes)
        self._default_solref, self._default_solref_mode = self._solref.clone(), self._solref_mode.clone()
        # Position actuators clamp their force to their own force range too: it follows
        # joint_effort_limit (actuator -> world DoF index, and the range at scale 1).
        self._actuator_dof = torch.zeros(0, dtype=torch.long, device=sim.device)
        source, target = self.solver.mjc_actuator_ctrl_source, self.solver.mjc_actuator_to_newton_idx
        if source is not None and target is not None:
            source, target = wp.to_torch(source).long(), wp.to_torch(target).long()
            joint_target = (source == int(self.solver.CtrlSource.JOINT_TARGET)) & (target >= 0)
            self._actuator_ids = joint_target.nonzero().squeeze(-1)
            self._actuator_dof = target[self._actuator_ids]
            self._actuator_forcerange = wp.to_torch(self.solver.mjw_model.actuator_forcerange)
            self._default_actuator_forcerange = self._actuator_forcerange[:, self._actuator_ids].clone()
        # Contact sensing: each MuJoCo geom of the template world -> its Newton body within a world.
        geom_body = self.solver.mjw_model.geom_bodyid.numpy()
        # Newton types mjc_body_to_newton Optional (SolverMuJoCo has built it by now); warp's stub
        # of array2d lacks the numpy() its arrays have.
        assert self.solver.mjc_body_to_newton is not None
        mjc_body_to_newton = self.solver.mjc_body_to_newton.numpy()[0]  # pyright: ignore[reportAttributeAccessIssue]
        slots = np.where(geom_body > 0, mjc_body_to_newton[geom_body], -1).astype(np.int32)
        self._geom_slot = wp.array(slots, dtype=int, device=sim.device)

    def step(self, state, control, dt: float) -> None:
        # Stepping one State in place keeps every torch view valid (MuJoCo reads state_in before
        # it writes state_out).
        self.solver.step(state, state, control, None, dt)
        # MuJoCo Warp only ever ORs bits into Data.overflow: taking and clearing them after every
        # physics step counts each step's once, whether or not Newton clears them too.
        overflow = self.solver.mjw_data.overflow
        wp.launch(_gather_overflow_kernel, dim=self.sim.num_envs, inputs=[overflow, self._overflow_hit],
                  device=self.sim.device)

    def finish_control_step(self, state) -> None:
        self.limits.zero_()
        wp.launch(_count_limits_kernel, dim=self.sim.num_envs, inputs=[self._overflow_hit, self.limits],
                  device=self.sim.device)

    def reset(self, state, world_mask) -> None:
        self.solver.reset(state, world_mask, flags=0)  # flags=0: the solver's own buffers only

    def sense_contacts(self, out: wp.array) -> None:
        """Net contact force on every body [N], world frame: ``out`` (num_envs, bodies_per_world) vec3."""
        out.zero_()
        d, m = self.solver.mjw_data, self.solver.mjw_model
        wp.launch(
            _contact_forces_kernel,
            dim=d.naconmax,
            inputs=[
                d.nacon, d.contact.geom, d.contact.worldid, m.opt.cone, d.contact.frame,
                d.contact.friction, d.contact.dim, d.contact.efc_address, d.contact.adhesion,
                d.efc.force, d.njmax, self._geom_slot,
            ],
            outputs=[out],
            device=self.sim.device,
        )

    def publish(self, changed: set[str]) -> None:
        """What MuJoCo derives from edited parameters, then one ``notify_model_changed``."""
        sim = self.sim
        if "shape_restitution" in changed:
            e = sim.shape_restitution.clamp(0.0, 0.99)
            log_e = torch.log(e.clamp(min=1e-6))
            damping_ratio = torch.where(e > 0, -log_e / torch.sqrt(math.pi**2 + log_e**2), 1.0)
            edited = sim.shape_restitution != sim.defaults["shape_restitution"]
            raw = self._default_solref_mode == self._solref_raw
            time_constant = torch.where(raw, self._default_solref[..., 0], 0.02)
            solref = torch.stack([time_constant, damping_ratio], dim=-1)
            self._solref.copy_(torch.where(edited[..., None], solref, self._default_solref))
            self._solref_mode.copy_(torch.where(edited, self._solref_raw, self._default_solref_mode))
        if "joint_effort_limit" in changed and self._actuator_dof.numel():
            scale = sim.joint_effort_limit / sim.defaults["joint_effort_limit"].clamp(min=1e-9)
            self._actuator_forcerange[:, self._actuator_ids] = (
                self._default_actuator_forcerange * scale[:, self._actuator_dof, None])
        self.solver.notify_model_changed(_flags(self._newton, changed))


class XPBD:
    """Newton's SolverXPBD with Newton's own collision pipeline. Steps maximal coordinates and
    recovers joint coordinates by inverse kinematics after each control step; senses no contacts."""

    name = "xpbd"
    senses_contacts = False

    @staticmethod
    def prepare_builder(builder) -> None:
        pass

    def __init__(self, sim, options: dict):
        import newton

        self.sim, self._newton = sim, newton
        self.solver = newton.solvers.SolverXPBD(sim.model, **options)
        self.collision = newton.CollisionPipeline(sim.model)
        self.contacts = self.collision.contacts()
        self._state_next = sim.model.state()
        self.limits = wp.zeros(len(SOLVER_LIMITS), dtype=int, device=sim.device)  # XPBD has none: zeros

    def step(self, state, control, dt: float) -> None:
        # XPBD needs distinct in/out states; the result is copied back so the views stay valid.
        self.collision.collide(state, self.contacts)
        self.solver.step(state, self._state_next, control, self.contacts, dt)
        state.assign(self._state_next)

    def finish_control_step(self, state) -> None:
        self._newton.eval_ik(self.sim.model, state, state.joint_q, state.joint_qd)

    def reset(self, state, world_mask) -> None:
        self.solver.reset(state, world_mask, flags=0)

    def sense_contacts(self, out) -> None:
        raise ValueError("Contact-force sensing needs sim=mujoco.")

    def publish(self, changed: set[str]) -> None:
        self.solver.notify_model_changed(_flags(self._newton, changed))


SOLVERS = {"mujoco": MuJoCo, "xpbd": XPBD}


def _flags(newton, changed: set[str]) -> int:
    flags = 0
    for name in changed:
        flags |= int(getattr(newton.ModelFlags, PARAM_FLAGS[name]))
    return flags
