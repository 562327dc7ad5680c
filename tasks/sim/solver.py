"""The solver adapter: what differs between Newton's solvers, behind one small interface.

:class:`~legion.tasks.sim.NewtonSim` asks its solver to step the state one physics step, finish a
control step, forget the history of reset worlds, sense contact forces, and take edited
per-env parameters; it reads the solver's ``limits`` counters (:data:`SOLVER_LIMITS`).
:class:`MuJoCo` (SolverMuJoCo on MuJoCo Warp, the default on CUDA) and :class:`XPBD` answer. This is the
only module that uses private names of Newton and MuJoCo Warp, or reaches into MuJoCo Warp's
model and data behind SolverMuJoCo; each use says why.

:class:`MuJoCoC` is the same SolverMuJoCo with its physics stepped by MuJoCo's C library on every
CPU core (``sim.backend=c``; on a CPU the default, :func:`adapter`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import ctypes
import dataclasses
import functools
import hashlib
import math
import os
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Literal

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
    backend = "warp"
    capturable = True  # its step is Warp kernels only: NewtonSim records it as one graph
    steps_motors = False  # the robot's dc_motor joints are NewtonSim's (newton.actuators), not the solver's

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

    def mujoco_model(self):
        """The model's nominal parameters as a plain ``mujoco.MjModel`` of one world (a copy): the
        robot and its scene as this solver simulates them, for plain MuJoCo (``legion sim2sim``,
        the DDS bridge, ``robot.mjb`` of an export), e.g. of a URDF robot that has no MJCF."""
        model = copy.copy(self.solver.mj_model)  # built before any randomization, which edits MuJoCo Warp's copies
        _inertial_frames_in_use(model)
        model.opt.timestep = self.sim.dt
        return model

    def step(self, state, control, dt: float, steps: int = 1, before_each_step=None) -> None:
        """``steps`` physics steps of ``dt``; ``before_each_step()``, if given, may write the
        control from the state before each (an actuator model)."""
        for _ in range(steps):
            if before_each_step is not None:
                before_each_step()
            # Stepping one State in place keeps every torch view valid (MuJoCo reads state_in
            # before it writes state_out).
            self.solver.step(state, state, control, None, dt)
            # MuJoCo Warp only ever ORs bits into Data.overflow: taking and clearing them after
            # every physics step counts each step's once, whether or not Newton clears them too.
            overflow = self.solver.mjw_data.overflow
            wp.launch(_gather_overflow_kernel, dim=self.sim.num_envs, inputs=[overflow, self._overflow_hit],
                      device=self.sim.device)

    def finish_control_step(self, state) -> None:
        self.limits.zero_()
        wp.launch(_count_limits_kernel, dim=self.sim.num_envs, inputs=[self._overflow_hit, self.limits],
                  device=self.sim.device)

    def reset(self, state, world_mask) -> None:
        self.solver.reset(state, world_mask, flags=0)  # flags=0: the solver's own buffers only

    def state_views(self) -> dict[str, torch.Tensor]:
        """What the solver carries from step to step besides Newton's state, as live views (a
        checkpoint's: :meth:`NewtonSim.state_dict`): MuJoCo's warm start."""
        return {"solver.qacc_warmstart": wp.to_torch(self.solver.mjw_data.qacc_warmstart)}

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
    backend = "warp"
    capturable = True
    steps_motors = False

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

    def step(self, state, control, dt: float, steps: int = 1, before_each_step=None) -> None:
        for _ in range(steps):
            if before_each_step is not None:
                before_each_step()
            # XPBD needs distinct in/out states; the result is copied back so the views stay valid.
            self.collision.collide(state, self.contacts)
            self.solver.step(state, self._state_next, control, self.contacts, dt)
            state.assign(self._state_next)

    def finish_control_step(self, state) -> None:
        self._newton.eval_ik(self.sim.model, state, state.joint_q, state.joint_qd)

    def reset(self, state, world_mask) -> None:
        self.solver.reset(state, world_mask, flags=0)

    def state_views(self) -> dict[str, torch.Tensor]:
        return {}

    def sense_contacts(self, out) -> None:
        raise ValueError("Contact-force sensing needs sim=mujoco.")

    def publish(self, changed: set[str]) -> None:
        self.solver.notify_model_changed(_flags(self._newton, changed))


class MuJoCoC(MuJoCo):
    """SolverMuJoCo with its physics stepped by MuJoCo's C library on every CPU core.

    On a CPU, Warp runs each kernel on one thread, so MuJoCo Warp steps the worlds on one core,
    where MuJoCo's C library steps one world in ~10 us on each core (BENCHMARKS.md: backends).
    Everything but the integration stays :class:`MuJoCo`'s: the same SolverMuJoCo builds the
    model, and MuJoCo Warp's per-world model and data stay the interface to Newton. Its own
    conversions push Newton's state and control into MuJoCo's coordinates and pull them back
    (forward kinematics included), and its ``notify_model_changed`` turns edited per-env
    parameters into per-world MuJoCo fields, as on the Warp path; only the MuJoCo Warp step in
    between is replaced.

    That step: each world's whole integration state (``mjSTATE_INTEGRATION``: time, positions,
    velocities, controls, applied forces and the solver's warm start) is a row of one float64
    array. One thread per core takes a contiguous share of the worlds and, with one MjData of its
    own, sets a world's row, calls ``mj_step`` ``steps`` times and reads the row back, all in one
    call of a loop in C (step_worlds.c, compiled at first use; ctypes releases the GIL for the
    call, so the threads run in parallel and never wait for each other between worlds). Where no
    C compiler builds it, the thread makes the same calls from Python (the states bit for bit the
    same, ~10% slower physics: each world's calls take the GIL in turn). This is
    ``mujoco.rollout``'s loop (the compiled one faster than rollout, measured), with one thing
    rollout cannot do: give back the warm start, so a world's next control step starts from its
    own last solution exactly as one MjData stepping alone would (plain MuJoCo, `legion sim2sim`,
    a robot log replayed). A world's result depends on its own row only: the thread schedule
    cannot change it (exact replay holds).

    - Per-world parameters: each thread steps its worlds with one MjModel of its own. A field
      MuJoCo Warp holds per world (masses, inertias, friction, gains, gravity, ...) that
      randomization has given some world a value of its own is kept as one row per world, and
      the thread writes a world's rows into its model before stepping that world (numpy copies
      of a few bytes each). A copy of the model per world would hold the whole model 1,024 times:
      10 MB of rough terrain's height field each, 14 GB for the Go2 on rough terrain.
    - DC motors (``steps_motors``): a robot's ``dc_motor`` joints are MuJoCo actuators of its
      model, so a control step stays in C from its first physics step to its last (NewtonSim's
      newton.actuators would need the worlds back in Python before each physics step). Newton's
      law, ``clip(kp (q* - q) - kd qd, sat (-1 - qd / v_lim), sat (1 - qd / v_lim))`` within the
      effort limit, is two affine actuators per joint: ``clip(kp (q* - q) + (s - kd) qd, -sat,
      sat)`` (its force range) and ``-s qd``, with ``s = sat / v_lim``; their sum, clipped to the
      joint's actuator force range (the effort limit), is that law exactly (to 1e-14 over states
      past the corner speed, tests/test_backends.py). The model then integrates with Euler: the
      motors' forces explicit, as Newton's, where implicitfast would take their damping
      implicitly. Only where Newton gave MuJoCo no actuators of its own (every actuated joint a
      dc_motor) and the motors have no delay; otherwise NewtonSim steps them.
    - Contact forces: a MuJoCo contact sensor per body (``reduce="netforce"``: the net force
      of the body's contacts, world frame) where the scene senses contacts. Sensors are read
      once per control step, so the threads step with them off and evaluate them
      (``mj_sensorAcc``: contact forces and actuator torques are acceleration-stage sensors)
      after a world's last physics step, from that step's contacts, as ``mj_step`` would have.
    - Solver limits: MuJoCo's C library grows its arena rather than dropping contacts and keeps
      no per-world iteration counts; ``overflow`` counts its warnings that the arena was full
      (contacts or constraints dropped), the iteration limits are not counted (zeros).
    """

    backend = "c"
    capturable = False  # host code: no Warp graph records it

    def __init__(self, sim, options: dict):
        import mujoco

        with _compiled_specs(mujoco) as compiled:
            super().__init__(sim, options)
        template = self.solver.mj_model
        spec = next(spec for spec, model in compiled if model is template)
        motors = self._motors(sim, template)
        self.steps_motors = bool(motors)
        self.mj_model = m = _compiled_for_c(mujoco, spec, template, motors, contacts=sim.senses_contacts)
        m.opt.timestep = sim.dt
        if self.steps_motors:
            m.opt.integrator = int(mujoco.mjtIntegrator.mjINT_EULER)  # the motors explicit, as Newton's
        # A world whose physics diverges keeps its NaN, as on MuJoCo Warp, for the env to see and
        # reset it; MuJoCo would silently put it back at the model's reference pose (qpos0).
        m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_AUTORESET)
        n = sim.num_envs
        self._per_world = self._per_world_fields()
        self._rows: dict[tuple[bool, str], np.ndarray] = {}  # (an opt field?, name) -> (num_envs, size) values
        self._copy_parameters(initial=True)

        # One row per world: its integration state, laid out as MuJoCo's mjtState bits in order.
        self._spec = int(mujoco.mjtState.mjSTATE_INTEGRATION)
        self.states = np.zeros((n, mujoco.mj_stateSize(m, self._spec)))
        self.columns, start = {}, 0
        for part in mujoco.mjtState.__members__.values():
            bit = int(part)
            if bit & (bit - 1) == 0 and bit & self._spec and part is not mujoco.mjtState.mjNSTATE:
                size = mujoco.mj_stateSize(m, bit)
                self.columns[part.name.removeprefix("mjSTATE_").lower()] = slice(start, start + size)
                start += size
        assert start == self.states.shape[1]
        data = mujoco.MjData(m)
        mujoco.mj_getState(m, data, self.states[0], self._spec)  # the model's reference state
        self.states[:] = self.states[0]
        self.sensors = np.zeros((n, m.nsensordata))
        contacts = 3 * (m.nbody - 1) if sim.senses_contacts else 0  # a sensor per body, then one per motor
        self._contact_readings = self.sensors[:, :contacts]
        self._motor_readings = torch.from_numpy(self.sensors[:, contacts:])
        self._targets = sim.control.joint_target_q.numpy().reshape(n, -1)  # the motors' ctrl
        # The motors' gear play (step_worlds.c: dead_zone): their joints' qpos addresses, and the
        # sim's (num_envs, motors) play, passed to the loop at a step where any world has some.
        self._motor_qpos = m.jnt_qposadr[m.actuator_trnid[: len(motors), 0]].astype(np.int64)
        self._backlash = sim.motor_backlash.numpy()
        self._play = None
        d = self.solver.mjw_data
        # MuJoCo Warp's data on the CPU: numpy views of its (num_envs, ...) arrays, no copies.
        self._d = {name: getattr(d, name).numpy().reshape(n, -1)
                   for name in ("qpos", "qvel", "act", "ctrl", "qfrc_applied", "xfrc_applied")}
        self._graphs = None

        threads = sim.threads
        self._datas = [mujoco.MjData(m) for _ in range(threads)]
        self._thread_models = [copy.copy(m) for _ in range(threads)]
        for model in self._thread_models:  # the sensors: evaluated once, after the last step (_step_worlds)
            model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_SENSOR)
        bounds = np.linspace(0, n, threads + 1).astype(int)
        self._shares = [(t, range(bounds[t], bounds[t + 1])) for t in range(threads)]
        self._plan_writes()
        self._pool = _started_pool(threads)
        self._lib = _mujoco_library()
        self._loop = _world_loop(self._lib)
        self._mj_step = mujoco.mj_step  # its nstep loop in C: one release of the GIL per world and control step
        self._overflows = 0
        self._late = None  # a late command's (ctrl, split) for this step's threads (step)
        self._late_arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # made at the first late step
        self._full = (int(mujoco.mjtWarning.mjWARN_CNSTRFULL), int(mujoco.mjtWarning.mjWARN_CONTACTFULL))
        if sim.senses_contacts:  # the sensors' bodies -> Newton body slots of a world
            assert self.solver.mjc_body_to_newton is not None
            mjc_body_to_newton = self.solver.mjc_body_to_newton.numpy()[0]  # pyright: ignore[reportAttributeAccessIssue]
            self._sensor_slot = mjc_body_to_newton[m.sensor_objid[: m.nbody - 1]].astype(np.int64)

    @property
    def motor_torque(self) -> torch.Tensor:
        """(num_envs, motors) [N m]: each motor's torque in the last physics step (NewtonSim.motor_torque)."""
        return self._motor_readings.float()  # float32, as the sim's other tensors

    def _motors(self, sim, template) -> list[tuple[str, float]]:
        """(MuJoCo joint, saturation effort) of the robot's dc_motor joints, in their order, where
        this backend can step the motors in C (see the class docstring), else []; keeps their
        columns and torque-speed slopes."""
        import mujoco

        cfgs = sim.motor_cfgs
        integrators = (int(mujoco.mjtIntegrator.mjINT_EULER), int(mujoco.mjtIntegrator.mjINT_IMPLICITFAST))
        if not cfgs or template.nu or any(c.delay for c in cfgs.values()) or template.opt.integrator not in integrators:
            return []
        ids = list(cfgs)
        self._motor_dofs = [sim.robot.joint_dofs.start + i for i in ids]  # columns of the sim's (num_envs, dofs)
        self._motor_coords = [sim.robot.joint_coords.start + i for i in ids]  # of its joint targets
        self._motor_slope = np.array([cfgs[i].saturation_effort / cfgs[i].velocity_limit for i in ids])
        assert self.solver.mjc_jnt_to_newton_dof is not None  # built by SolverMuJoCo by now
        dof_of_joint = list(self.solver.mjc_jnt_to_newton_dof.numpy()[0])  # pyright: ignore[reportAttributeAccessIssue]
        joint = mujoco.mjtObj.mjOBJ_JOINT
        return [(mujoco.mj_id2name(template, joint, dof_of_joint.index(d)), cfgs[i].saturation_effort)
                for i, d in zip(ids, self._motor_dofs)]

    def _motor_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Per world, the motors' ``actuator_gainprm`` and ``actuator_biasprm`` from the robot's per-env
        gains (the two actuators per motor of the class docstring: the PD's first, the slope's after)."""
        import mujoco

        n, k = self.sim.num_envs, len(self._motor_dofs)
        kp = self.sim.joint_stiffness[:, self._motor_dofs].double().numpy()
        kd = self.sim.joint_damping[:, self._motor_dofs].double().numpy()
        gain, bias = np.zeros((n, 2 * k, mujoco.mjNGAIN)), np.zeros((n, 2 * k, mujoco.mjNBIAS))
        gain[:, :k, 0] = kp
        bias[:, :k, 1], bias[:, :k, 2], bias[:, k:, 2] = -kp, self._motor_slope - kd, -self._motor_slope
        return gain.reshape(n, -1), bias.reshape(n, -1)

    # --- per-world parameters --------------------------------------------------------------
    def _per_world_fields(self) -> list:
        """(MuJoCo Warp owner, an opt field?, name): every MuJoCo Warp model field held per world
        that the C model has under the same name."""
        n, found = self.sim.num_envs, []
        mw = self.solver.mjw_model
        for owner, opt in ((mw, False), (mw.opt, True)):
            for field in dataclasses.fields(owner):
                value = getattr(owner, field.name)
                if not isinstance(value, wp.array) or value.shape[0] != n or field.name == "timestep":
                    continue  # (the timestep is the sim's: one world's timestep array has the shape of a field)
                target = getattr(self.mj_model.opt if opt else self.mj_model, field.name, None)
                if target is None or np.size(target) != value.numpy().reshape(n, -1).shape[1]:
                    continue  # MuJoCo Warp's own (impratio_invsqrt) or not a per-world field
                found.append((owner, opt, field.name))
        return found

    def _copy_parameters(self, initial: bool = False) -> None:
        """The per-world fields some world holds a value of its own for, as rows (:attr:`_rows`;
        once per world, always per world). At construction the shared model takes world 0's
        values (Newton's inertia axes, joint ranges and plane sizes differ in form from the
        compiled model's, not in physics)."""
        n = self.sim.num_envs
        for owner, opt, name in self._per_world:
            rows = getattr(owner, name).numpy().reshape(n, -1)  # Newton may have replaced the array
            if initial:
                _assign(self.mj_model.opt if opt else self.mj_model, name, rows[0])
            shared = getattr(self.mj_model.opt if opt else self.mj_model, name)
            if (opt, name) in self._rows or (rows != np.reshape(shared, -1)).any():
                self._rows[opt, name] = np.ascontiguousarray(rows, dtype=np.asarray(shared).dtype)
        if self.steps_motors:  # always per world: their gains come from the sim's per-env views, not MuJoCo Warp's
            self._rows[False, "actuator_gainprm"], self._rows[False, "actuator_biasprm"] = self._motor_rows()
            if initial:
                for name in ("actuator_gainprm", "actuator_biasprm"):
                    _assign(self.mj_model, name, self._rows[False, name][0])
        # The bodies whose inertial frame is their own in every world
        m, nbody = self.mj_model, self.mj_model.nbody
        ipos = self._rows.get((False, "body_ipos"), np.reshape(m.body_ipos, (1, -1))).reshape(-1, nbody, 3)
        iquat = self._rows.get((False, "body_iquat"), np.reshape(m.body_iquat, (1, -1))).reshape(-1, nbody, 4)
        self._same_frames = ((ipos == 0).all(axis=2) & (iquat == (1.0, 0.0, 0.0, 0.0)).all(axis=2)).all(axis=0)
        for model in [m, *getattr(self, "_thread_models", [])]:
            _inertial_frames_in_use(model, self._same_frames)

    def _plan_writes(self) -> None:
        """How :meth:`_step_worlds` writes a world's per-world values into its thread's model: one
        numpy scatter per world (a copy per field costs ~0.3 us, most of the Python per world).
        :attr:`_world_values` holds each world's values of every per-world field, concatenated;
        :attr:`_writes` holds per thread a float64 view of its model's memory from the first of
        those fields to the end of the last (they lie in the model's one buffer) and where each
        value goes in it."""
        self._world_values = np.concatenate([np.zeros((self.sim.num_envs, 0)), *self._rows.values()], axis=1)
        self._writes = []
        for model in self._thread_models:
            fields = [getattr(model.opt if opt else model, name) for opt, name in self._rows]
            for field, (_, name) in zip(fields, self._rows):
                if not isinstance(field, np.ndarray) or field.dtype != np.float64:
                    raise NotImplementedError(f"sim.backend=c: {name} differs between worlds and MuJoCo holds it as "
                                              f"{type(field).__name__}, not float64 values; use sim.backend=warp for "
                                              "that randomization.")
            start = min((field.ctypes.data for field in fields), default=0)
            end = max((field.ctypes.data + field.nbytes for field in fields), default=0)
            memory = np.ctypeslib.as_array((ctypes.c_double * ((end - start) // 8)).from_address(start)) \
                if fields else np.zeros(0)
            slots = [(field.ctypes.data - start) // 8 + np.arange(field.size) for field in fields]
            self._writes.append((memory, np.concatenate([np.zeros(0, dtype=np.int64), *slots])))

    def world_model(self, world: int):
        """A copy of the MjModel world ``world`` is stepped with (its per-world values written, its
        sensors on: the threads' models evaluate them once per control step instead)."""
        model = copy.copy(self.mj_model)
        for (opt, name), rows in self._rows.items():
            _assign(model.opt if opt else model, name, rows[world])
        _inertial_frames_in_use(model, self._same_frames)
        return model

    def mujoco_model(self):
        if self.steps_motors:  # plain MuJoCo drives a dc_motor itself (pd_torque), with no actuator of the model
            return super().mujoco_model()
        return copy.copy(self.mj_model)  # the shared model: nominal (its contact sensors only add sensor data)

    def publish(self, changed: set[str]) -> None:
        super().publish(changed)  # MuJoCo Warp's per-world fields from Newton's
        self._copy_parameters()
        self._plan_writes()

    # --- stepping ----------------------------------------------------------------------------
    def _push(self, state, control) -> None:
        """Newton's state and control -> MuJoCo Warp's data (SolverMuJoCo.step's own conversions,
        private names)."""
        s = self.solver
        s._apply_mjc_control(self.sim.model, state, control, s.mjw_data)
        s._update_mjc_data(s.mjw_data, self.sim.model, state)

    def _push_control(self, state, control) -> None:
        self.solver._apply_mjc_control(self.sim.model, state, control, self.solver.mjw_data)

    def _pull(self, state) -> None:
        """MuJoCo Warp's data -> Newton's state, body poses and velocities included."""
        self.solver._update_newton_state(self.sim.model, state, self.solver.mjw_data, state_prev=state)

    def _pull_coordinates(self, state) -> None:
        """MuJoCo Warp's data -> Newton's joint coordinates and velocities only: what an actuator
        model reads between the physics steps of a control step (:meth:`_pull` less its forward
        kinematics; the launch is SolverMuJoCo._update_newton_state's)."""
        from newton._src.solvers.mujoco.kernels import convert_mj_coords_to_warp_kernel

        s, model, d = self.solver, self.sim.model, self.solver.mjw_data
        mujoco_attrs = getattr(model, "mujoco", None)
        wp.launch(convert_mj_coords_to_warp_kernel, dim=(d.nworld, model.joint_count // d.nworld),
                  inputs=[d.qpos, d.qvel, model.joint_count // d.nworld, model.joint_type, model.joint_q_start,
                          model.joint_qd_start, model.joint_dof_dim, model.joint_child, model.joint_X_p,
                          model.joint_X_c, model.body_com, getattr(mujoco_attrs, "dof_ref", None),
                          model.body_flags, state.joint_q, state.joint_qd, s.mj_q_start, s.mj_qd_start],
                  outputs=[state.joint_q, state.joint_qd], device=model.device)

    def step(self, state, control, dt: float, steps: int = 1, before_each_step=None, late=None) -> None:
        """``steps`` physics steps in C. With ``before_each_step`` (an actuator model writing the
        control from the state), the worlds come back from C after every physics step for it, their
        joint coordinates (no forward kinematics) in Newton's state before it runs. ``late``: (older
        joint targets (num_envs, coords), split (num_envs,)): each world steps its first ``split``
        physics steps on the older targets' ctrl, the rest on ``control``'s, all in C (NewtonSim's
        command latency)."""
        if self._graphs is None:  # the conversions' launches recorded once: replays skip Warp's Python
            # Recording runs each conversion, and a pull turns the state into MuJoCo's coordinates and
            # back (rounded): keep the state as given, so that the first step of a sim, fresh or
            # restored from a checkpoint, starts from it exactly.
            kept = [(array, wp.clone(array)) for array in (state.joint_q, state.joint_qd, state.body_q, state.body_qd)]
            record = functools.partial(record_graph, self.sim.device)
            self._graphs = {"push": record(self._push, state, control), "pull": record(self._pull, state),
                            "push_control": record(self._push_control, state, control),
                            "pull_coordinates": record(self._pull_coordinates, state)}
            for array, copy_ in kept:
                array.assign(copy_)
        graphs = self._graphs
        if before_each_step is not None:
            before_each_step()
        self._play = self._backlash if self.steps_motors and self._backlash.any() else None
        self._late = None
        if late is not None:
            assert before_each_step is None, "a late command is stepped in C, not by an actuator model"
            if self._late_arrays is None:  # numpy arrays torch writes into: the step reads nothing back
                n, ctrl = self.sim.num_envs, self.columns["ctrl"]
                self._late_arrays = (np.zeros(self.sim.joint_target_q.shape, np.float32), np.zeros(n, np.int32),
                                     np.zeros((n, ctrl.stop - ctrl.start)))
                self._late_views = [torch.from_numpy(a) for a in self._late_arrays[:2]]
            older, split, late_ctrl = self._late_arrays
            for view, value in zip(self._late_views, late):
                view.copy_(value)
            if self.steps_motors:  # (the ctrl of the slopes' actuators is not read: a gain of 0)
                late_ctrl[:] = self.states[:, self.columns["ctrl"]]
                late_ctrl[:, : len(self._motor_coords)] = older[:, self._motor_coords]
            else:  # MuJoCo's ctrl of the older targets: Newton's conversion, from them
                newer = self.sim.joint_target_q.clone()
                self.sim.joint_target_q.copy_(late[0])
                wp.capture_launch(graphs["push_control"])
                late_ctrl[:] = self._d["ctrl"]
                self.sim.joint_target_q.copy_(newer)
            self._late = (late_ctrl, split)
        wp.capture_launch(graphs["push"])
        self._to_rows("qpos", "qvel", "act", "qfrc_applied", "xfrc_applied")
        self._ctrl_to_rows()
        if before_each_step is None:
            self._run(steps)
        else:
            self._run(1)
            for _ in range(steps - 1):
                self._from_rows("qpos", "qvel", "act")
                wp.capture_launch(graphs["pull_coordinates"])
                before_each_step()
                wp.capture_launch(graphs["push_control"])
                self._ctrl_to_rows()
                self._to_rows("qfrc_applied", "xfrc_applied")
                self._run(1)
        self._from_rows("qpos", "qvel", "act")
        wp.capture_launch(graphs["pull"])

    def _ctrl_to_rows(self) -> None:
        if self.steps_motors:  # the PD actuators' ctrl: the joint targets (the slopes' have a gain of 0)
            ctrl = self.columns["ctrl"].start
            self.states[:, ctrl: ctrl + len(self._motor_coords)] = self._targets[:, self._motor_coords]
        else:
            self._to_rows("ctrl")

    def _run(self, steps: int) -> None:
        """Every world ``steps`` physics steps in C, one thread per core."""
        warnings = self._warning_count()
        for _ in self._pool.map(self._step_worlds, self._shares, [steps] * len(self._shares)):
            pass  # re-raises a thread's exception
        self._overflows += self._warning_count() - warnings

    def _to_rows(self, *names: str) -> None:
        for name in names:
            self.states[:, self.columns[name]] = self._d[name]

    def _from_rows(self, *names: str) -> None:
        for name in names:
            self._d[name][:] = self.states[:, self.columns[name]]

    def _step_worlds(self, share, steps: int) -> None:
        """One thread's worlds, each ``steps`` physics steps from its row of :attr:`states`, with
        its per-world parameters written into the thread's model first: step_worlds.c's loop, or
        where no C compiler built it, the same calls from Python."""
        thread, worlds = share
        model, data = self._thread_models[thread], self._datas[thread]
        memory, slots = self._writes[thread]
        late_ctrl, split = self._late or (None, None)
        play, motor_qpos, ctrl = self._play, self._motor_qpos, self.columns["ctrl"]
        if self._loop is not None:
            _step_in_c(self._loop, self._lib, model, data, self.mj_model, self.states, self._spec, memory, slots,
                       self._world_values, self.sensors, worlds, steps, ctrl.start, late_ctrl, split,
                       motor_qpos, play)
            return
        set_state, get_state, sensor_acc = self._lib.mj_setState, self._lib.mj_getState, self._lib.mj_sensorAcc
        copy_bytes, mj_step, spec, values = ctypes.memmove, self._mj_step, self._spec, self._world_values
        m, d = model._address, data._address
        sensing = self.mj_model._address  # sensors on; they read the data only, not per-world fields
        row, row_bytes = self.states.ctypes.data, self.states.strides[0]
        out, out_bytes = self.sensors.ctypes.data, self.sensors.strides[0]
        sensordata, nbytes = data.sensordata.ctypes.data, self.sensors.shape[1] * 8
        for world in worlds:
            if slots.size:
                memory[slots] = values[world]
            state = row + world * row_bytes
            set_state(m, d, state, spec)
            first = int(split[world]) if split is not None else 0
            if play is not None:  # step_worlds.c's dead_zone before each physics step
                targets, motors = self.states[world, ctrl], slice(0, len(motor_qpos))
                half = 0.5 * play[world].astype(np.float64)
                for k in range(steps):
                    commanded = late_ctrl[world] if k < first else targets  # pyright: ignore[reportOptionalSubscript]
                    data.ctrl[:] = commanded
                    q = data.qpos[motor_qpos]
                    error = commanded[motors] - q
                    data.ctrl[motors] = q + np.sign(error) * np.maximum(np.abs(error) - half, 0.0)
                    mj_step(model, data, 1)
                data.ctrl[:] = targets  # the row keeps its targets
            else:
                if first:  # the first physics steps on the older ctrl, the rest on the row's (step_worlds.c's order)
                    assert late_ctrl is not None
                    data.ctrl[:] = late_ctrl[world]
                    mj_step(model, data, first)
                    data.ctrl[:] = self.states[world, ctrl]
                mj_step(model, data, steps - first)
            get_state(m, d, state, spec)
            if nbytes:
                sensor_acc(sensing, d)
                copy_bytes(out + world * out_bytes, sensordata, nbytes)

    def depth_images(self, state, control, positions: np.ndarray, quats: np.ndarray, directions: np.ndarray,
                     worlds: np.ndarray, out: np.ndarray, far: float) -> None:
        """One camera's planar depth in ``worlds`` by MuJoCo's ``mj_multiRay``, on every core (the
        threads that step the worlds; the GIL is released for each world's rays).

        Args:
            state, control: Newton's, the worlds' poses of now (a world just reset included).
            positions: (num_envs, 3) [m] the camera in each world; quats: (num_envs, 4) (x, y, z, w)
                its orientation, its x forward.
            directions: (R, 3) unit rays in the camera's frame; the depth is along its x.
            worlds: the worlds to render (indices). out: (num_envs, R) float32, written in them:
                planar depth [m], 0 where no surface is within ``far`` along the ray.
        """
        self._push(state, control)  # Newton's state of now -> the worlds' qpos (reset worlds too)
        qpos = self._d["qpos"]
        w, xyz = quats[:, 3:4], quats[:, :3]  # rotate the rays into each world: v + 2 w (u x v) + 2 u x (u x v)
        lib, values = self._lib, self._world_values

        def render(thread: int, share: np.ndarray) -> None:
            model, data = self._thread_models[thread], self._datas[thread]
            memory, slots = self._writes[thread]
            geomid, dist = np.zeros(len(directions), np.int32), np.zeros(len(directions))
            for world in share:
                if slots.size:
                    memory[slots] = values[world]  # its own sizes (a randomized cube's)
                data.qpos[:] = qpos[world]
                lib.mj_kinematics(model._address, data._address)
                cross = np.cross(xyz[world], directions)
                rays = directions + 2 * w[world] * cross + 2 * np.cross(xyz[world], cross)
                lib.mj_multiRay(model._address, data._address, positions[world].ctypes.data,
                                np.ascontiguousarray(rays).ctypes.data, None, 1, -1, geomid.ctypes.data,
                                dist.ctypes.data, None, len(directions), far)
                out[world] = np.where(dist >= 0, dist * directions[:, 0], 0.0)

        shares = np.array_split(worlds, len(self._shares))
        for _ in self._pool.map(render, range(len(shares)), shares):
            pass  # re-raises a thread's exception

    def _warning_count(self) -> int:
        return sum(int(data.warning[w].number) for data in self._datas for w in self._full)

    def finish_control_step(self, state) -> None:
        self.limits.zero_()
        self.limits.numpy()[3] = self._overflows
        self._overflows = 0

    def reset(self, state, world_mask) -> None:
        """The reset worlds' warm start forgotten: their next step starts from MuJoCo's own guess."""
        self.states[world_mask.numpy()[: self.sim.num_envs], self.columns["warmstart"]] = 0.0

    def state_views(self) -> dict[str, torch.Tensor]:
        """Each world's integration state (its warm start included) and its contact sensors' last
        readings: torch views of the rows the C library reads and writes."""
        return {"solver.states": torch.from_numpy(self.states), "solver.sensors": torch.from_numpy(self.sensors)}

    def sense_contacts(self, out: wp.array) -> None:
        forces = out.numpy().reshape(self.sim.num_envs, -1, 3)
        forces[:] = 0.0
        # The sensor reports the force its body exerts on the others: the body feels the opposite.
        forces[:, self._sensor_slot] = -self._contact_readings.reshape(self.sim.num_envs, -1, 3)


def _step_in_c(loop, lib, model, data, sensing, states: np.ndarray, spec: int, memory: np.ndarray,
               slots: np.ndarray, values: np.ndarray, sensors: np.ndarray, worlds: range, steps: int,
               ctrl_column: int = 0, late_ctrl: np.ndarray | None = None, split: np.ndarray | None = None,
               motor_qpos: np.ndarray | None = None, backlash: np.ndarray | None = None) -> None:
    """The worlds ``worlds`` stepped by step_worlds.c (:func:`_world_loop`) with ``model`` and
    ``data``: each world's ``values`` scattered into ``memory`` at ``slots``, its row of ``states``
    (``spec``) set, ``steps`` physics steps (the first ``split`` of them, where given, on its row of
    ``late_ctrl``, the rest on the row's ctrl at ``ctrl_column``; with ``backlash``, (num_envs,
    motors) float32 gear play, the first motors' ctrl through its dead zone before each, their
    joints' positions at ``motor_qpos``), the row read back, and where
    ``sensors`` has columns, the sensors of ``sensing`` evaluated into the world's row. Raises
    ``mujoco.FatalError`` naming the world where MuJoCo reported an error (the thread's data then
    reset)."""
    import mujoco

    functions = [ctypes.cast(f, ctypes.c_void_p).value for f in (lib.mj_setState, lib.mj_getState, lib.mj_step,
                                                                  lib.mj_sensorAcc)]
    failed = loop.step_worlds(
        model._address, data._address, sensing._address, states.ctypes.data, states.shape[1], spec,
        memory.ctypes.data, slots.ctypes.data, slots.size, values.ctypes.data,
        sensors.ctypes.data, sensors.shape[1], data.sensordata.ctypes.data, *functions,
        worlds.start, worlds.stop, steps, data.ctrl.ctypes.data, model.nu, ctrl_column,
        None if late_ctrl is None else late_ctrl.ctypes.data, None if split is None else split.ctypes.data,
        data.qpos.ctypes.data, None if motor_qpos is None else motor_qpos.ctypes.data,
        0 if motor_qpos is None else len(motor_qpos), None if backlash is None else backlash.ctypes.data)
    if failed >= 0:
        mujoco.mj_resetData(model, data)  # MuJoCo left it mid-step
        raise mujoco.FatalError(f"world {failed}: {loop.last_error().decode()}")


def _started_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """A pool of ``threads`` workers, every one of them started before this returns.

    ThreadPoolExecutor starts a worker inside ``submit``, at the first step that finds the others
    busy. A Ctrl-C that lands while one starts leaves that thread known neither to its pool nor to
    the interpreter's exit, which then waits for it forever (``legion play viewer=web`` hung so).
    Started here, no step starts a thread; a Ctrl-C during this start shuts the pool down."""
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="mujoco")
    everyone = threading.Barrier(threads)  # each work item holds its worker until all have one
    try:
        for _ in pool.map(lambda _: everyone.wait(), range(threads)):
            pass
    except BaseException:
        everyone.abort()
        pool.shutdown(wait=False, cancel_futures=True)  # wakes every worker, known to the pool or not
        raise
    return pool


@functools.cache
def _mujoco_library() -> ctypes.CDLL:
    """The C library the ``mujoco`` package wraps, with ``mj_setState``, ``mj_getState``,
    ``mj_sensorAcc``, ``mj_step``, ``mj_kinematics`` and ``mj_multiRay`` typed as ctypes functions
    taking raw addresses (``MjModel._address``)."""
    import mujoco

    folder = Path(mujoco.__file__).parent
    lib = ctypes.CDLL(str(next(path for pattern in ("libmujoco.so*", "libmujoco*.dylib", "mujoco.dll")
                               for path in folder.glob(pattern))))
    pointer, spec = ctypes.c_void_p, ctypes.c_int
    lib.mj_setState.argtypes = lib.mj_getState.argtypes = [pointer, pointer, pointer, spec]
    lib.mj_sensorAcc.argtypes = lib.mj_step.argtypes = lib.mj_kinematics.argtypes = [pointer, pointer]
    lib.mj_multiRay.argtypes = [pointer, pointer, pointer, pointer, pointer, ctypes.c_ubyte, ctypes.c_int, pointer,
                                pointer, pointer, ctypes.c_int, ctypes.c_double]
    for function in (lib.mj_setState, lib.mj_getState, lib.mj_sensorAcc, lib.mj_step, lib.mj_kinematics,
                     lib.mj_multiRay):
        function.restype = None
    return lib


# step_worlds.c's library once loaded (False: it would not compile). One copy per process: MuJoCo's
# error handler is a function of it, which finds the loop to return to in that copy's variables.
_WORLD_LOOP: ctypes.CDLL | Literal[False] | None = None


def _world_loop(mujoco_library: ctypes.CDLL) -> ctypes.CDLL | None:
    """step_worlds.c as a ctypes library, compiled once per source with the system's C compiler
    (``$CC``, else ``cc``) into Warp's kernel cache and loaded once per process; None, with a
    warning, where none compiles it (the threads then run the same loop in Python, ~10% slower
    physics). Its ``on_error`` becomes MuJoCo's error handler where the process has none, so that
    an error inside MuJoCo (an arena too small, ...) raises in Python as with the bindings, not exits."""
    global _WORLD_LOOP
    if _WORLD_LOOP is None:
        _WORLD_LOOP = _load_world_loop(mujoco_library) or False
    return _WORLD_LOOP or None


def _load_world_loop(mujoco_library: ctypes.CDLL) -> ctypes.CDLL | None:
    source = Path(__file__).with_name("step_worlds.c")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    assert wp.config.kernel_cache_dir is not None  # set by wp.init, before any Warp array exists
    library = Path(wp.config.kernel_cache_dir) / "legion" / f"step_worlds_{digest}.so"
    if not library.exists():
        compiler = os.environ.get("CC") or "cc"
        building = library.with_suffix(f".{os.getpid()}.tmp")  # processes compiling at once: each its own file
        try:
            library.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(building), str(source)], check=True,
                           capture_output=True, text=True)
            os.replace(building, library)
        except (OSError, subprocess.CalledProcessError) as e:
            reason = getattr(e, "stderr", None) or str(e)
            warnings.warn(f"sim.backend=c: {compiler} could not compile {source.name} ({reason.strip()[:300]}); the "
                          "threads step the worlds in Python, ~10% slower physics. Install a C compiler (Debian: "
                          "apt install gcc libc6-dev) or name one in $CC.", stacklevel=3)
            return None
    loop = ctypes.CDLL(str(library))
    pointer, size = ctypes.c_void_p, ctypes.c_longlong
    loop.step_worlds.argtypes = [pointer, pointer, pointer, pointer, size, ctypes.c_int, pointer, pointer, size,
                                 pointer, pointer, size, pointer, pointer, pointer, pointer, pointer, size, size,
                                 ctypes.c_int, pointer, size, size, pointer, pointer, pointer, pointer, size, pointer]
    loop.step_worlds.restype = size
    loop.last_error.restype = ctypes.c_char_p
    handler = ctypes.c_void_p.in_dll(mujoco_library, "mju_user_error")
    if handler.value is None:
        handler.value = ctypes.cast(loop.on_error, ctypes.c_void_p).value
    return loop


def record_graph(device: str, function, *args) -> wp.Graph:
    """``function(*args)`` run once (Warp loads its kernels), then recorded as a Warp graph."""
    function(*args)
    with wp.ScopedCapture(device=device) as capture:
        function(*args)
    assert capture.graph is not None  # ScopedCapture has recorded it on leaving
    return capture.graph


@contextlib.contextmanager
def _compiled_specs(mujoco):
    """Every (MjSpec, MjModel) compiled inside: SolverMuJoCo keeps the MjModel, not the MjSpec it
    built, and the C backend recompiles that spec with contact sensors."""
    compiled, compile_ = [], mujoco.MjSpec.compile

    def keep(spec, *args, **kwargs):
        model = compile_(spec, *args, **kwargs)
        compiled.append((spec, model))
        return model

    mujoco.MjSpec.compile = keep
    try:
        yield compiled
    finally:
        mujoco.MjSpec.compile = compile_


def _compiled_for_c(mujoco, spec, template, motors, contacts: bool):
    """``spec`` compiled again with a contact sensor on every body if ``contacts`` (net force of the
    body's contacts, world frame) and the DC motors of ``motors``, (joint, saturation effort) pairs
    (:class:`MuJoCoC`: two affine actuators each, the PD's clipped to the saturation, their gains
    written per world later, and a sensor of the joint's actuator torque), then given every field
    of ``template`` (what SolverMuJoCo set after compiling) except the sensors' and the motors'."""
    for body in spec.bodies[1:] if contacts else []:  # [0] is the world
        spec.add_sensor(type=mujoco.mjtSensor.mjSENS_CONTACT, objtype=mujoco.mjtObj.mjOBJ_BODY, objname=body.name,
                        intprm=[2, 3, 1])  # data="force", reduce="netforce", num=1
    affine = {"trntype": mujoco.mjtTrn.mjTRN_JOINT, "gaintype": mujoco.mjtGain.mjGAIN_FIXED,
              "biastype": mujoco.mjtBias.mjBIAS_AFFINE}
    for joint, sat in motors:
        spec.add_actuator(name=f"{joint}_motor", target=joint, forcelimited=True, forcerange=[-sat, sat], **affine)
    for joint, _ in motors:
        spec.add_actuator(name=f"{joint}_motor_slope", target=joint, **affine)
    for joint, _ in motors:
        spec.add_sensor(type=mujoco.mjtSensor.mjSENS_JOINTACTFRC, objtype=mujoco.mjtObj.mjOBJ_JOINT, objname=joint)
    model = spec.compile()
    for name in dir(template):
        if name.startswith(("_", "sensor", "name")):
            continue
        value = getattr(template, name)
        if isinstance(value, np.ndarray) and value.shape == getattr(model, name).shape:
            getattr(model, name)[...] = value
    for name in dir(template.opt):
        if not name.startswith("_"):
            value = getattr(template.opt, name)
            if isinstance(value, np.ndarray):
                getattr(model.opt, name)[...] = value
            elif isinstance(value, (int, float)):
                setattr(model.opt, name, value)
    return model


def _inertial_frames_in_use(model, same: np.ndarray | None = None) -> None:
    """MuJoCo's compiler marks a body whose centre of mass and principal axes coincide with its own
    frame (``body_sameframe``), and from then on ignores its ``body_ipos`` and ``body_iquat``.
    Newton's values (its principal axes, a randomized centre of mass) make them differ: such a
    body's inertial frame is computed in full (mjSAMEFRAME_NONE). ``same``: (nbody,) where they
    coincide in every world (default: in ``model``)."""
    own = (model.body_ipos == 0).all(axis=1) & (model.body_iquat == (1.0, 0.0, 0.0, 0.0)).all(axis=1)
    model.body_sameframe[~(own if same is None else same)] = 0


def _assign(owner, name: str, values: np.ndarray) -> None:
    current = getattr(owner, name)
    if isinstance(current, np.ndarray):
        current.reshape(-1)[:] = values
    else:
        setattr(owner, name, type(current)(values[0]))


SOLVERS = {"mujoco": MuJoCo, "xpbd": XPBD}
BACKENDS = ("auto", "warp", "c")


def adapter(solver: str, backend: str, device: str):
    """The solver adapter for ``sim.solver`` and ``sim.backend``: ``auto`` is MuJoCo's C library on
    a CPU (several times MuJoCo Warp's speed there, BENCHMARKS.md) and MuJoCo Warp elsewhere."""
    if solver not in SOLVERS:
        raise ValueError(f"Unknown solver '{solver}'; choose one of {sorted(SOLVERS)} (configs/sim/).")
    if backend not in BACKENDS:
        raise ValueError(f"Unknown sim.backend '{backend}'; choose one of {list(BACKENDS)}.")
    if backend == "auto":
        backend = "c" if solver == "mujoco" and str(device).startswith("cpu") else "warp"
    if backend == "c" and solver != "mujoco":
        raise ValueError(f"sim.backend=c is MuJoCo's C library: it steps sim=mujoco only (got sim={solver}); "
                         "use sim.backend=warp or auto.")
    if backend == "c" and not str(device).startswith("cpu"):
        raise ValueError(f"sim.backend=c steps MuJoCo's C library on the CPU; on {device} use sim.backend=warp "
                         "(or auto).")
    return MuJoCoC if backend == "c" else SOLVERS[solver]


def _flags(newton, changed: set[str]) -> int:
    flags = 0
    for name in changed:
        flags |= int(getattr(newton.ModelFlags, PARAM_FLAGS[name]))
    return flags
