"""NewtonSim: the scene replicated into ``num_envs`` Newton worlds, stepped as one Warp graph."""

from __future__ import annotations

import dataclasses
import functools
import os
import threading

import torch
import warp as wp
from torch.autograd.graph import increment_version

from legion.configs.schema import Robot, Scene
from legion.tasks.sim.camera import Cameras, check_cameras
from legion.tasks.sim.scene import (
    JOINT_PARAMS,
    Articulation,
    Fixture,
    RigidObject,
    build_world,
    joint_actuators,
    resolve_asset,
    short_label,
)
from legion.tasks.sim.solver import PARAM_FLAGS, adapter, record_graph
from legion.tasks.sim.terrain import Terrain, generate

# Warp's CPU kernels point a static of their module at the calling thread's tile arena (LLVM's
# JIT has no thread-local storage), so two threads running them at once corrupt each other's
# tiles: "Warp CPU tile shared-memory allocation exceeds the 256 KiB arena", then an abort or a
# segfault (seen with two quadruped sims stepped from two threads; the static is the one of
# NVIDIA/warp#1413, thread safety is NVIDIA/warp#1491). Every NewtonSim method that
# launches kernels holds this lock, so sims used from several threads take turns instead.
# Uncontended (one thread steps the sims, as in agent.mode=async) it costs nothing measurable.
_WARP_LOCK = threading.Lock()

# The views of the worlds' state and control that a checkpoint keeps (NewtonSim.state_dict).
_STATE_VIEWS = ("joint_q", "joint_qd", "body_q", "body_qd", "joint_target_q", "joint_f", "contact_forces")
# The views a step or a reset writes through Warp or MuJoCo, behind torch's back (NewtonSim.wrote_state).
_SIMULATED = ("joint_q", "joint_qd", "body_q", "body_qd", "contact_forces")


def _one_thread_at_a_time(method):
    @functools.wraps(method)
    def locked(*args, **kwargs):
        with _WARP_LOCK:
            return method(*args, **kwargs)

    return locked


class NewtonSim:
    """``num_envs`` copies of a scene in Newton, advanced ``decimation`` physics steps at a time.

    Args:
        scene: the entities of each world (:class:`~legion.configs.schema.Scene`), or a robot
            file name for a scene of that robot on a ground plane.
        num_envs: number of independent worlds.
        dt: physics time step [s].
        decimation: physics steps per :meth:`step` (one control step).
        device: Warp/torch device string, e.g. ``"cpu"`` or ``"cuda:0"``.
        solver: ``"mujoco"`` (Newton's SolverMuJoCo) or ``"xpbd"`` (no contact sensing).
        solver_options: keyword arguments of the solver's constructor.
        backend: where MuJoCo's physics runs: ``"warp"`` (MuJoCo Warp, any device), ``"c"``
            (MuJoCo's C library on every CPU core; CPU only) or ``"auto"`` (``c`` on a CPU).
        threads: the C backend's physics threads (0: one per core).
        contact_gap: collision detection gap [m]; Newton's 0.1 m default made ~30x more contacts
            than needed (~96 per quadruped instead of ~3).
        use_graph: capture the decimated step as one Warp graph (CPU and CUDA; the C backend's
            step is host code, never captured).

    Attributes:
        scene: the entities by name (``"robot"``, then objects and fixtures in config order).
        robot: ``scene["robot"]``, an :class:`Articulation`.
        cameras: the scene's :class:`~legion.tasks.sim.camera.Cameras` (``scene.cameras``), or ``None``.
        command_latency: (num_envs,) long, each world's :meth:`set_command_latency` [physics
            steps], or ``None`` before one is set.
        terrain: the generated :class:`~legion.tasks.sim.terrain.Terrain` all worlds share
            (``scene.ground.terrain``), or ``None`` (a plane at z = 0, or no ground).
        solver_limits: (len(SOLVER_LIMITS),) int32, the number of worlds that hit each of
            :data:`~legion.tasks.sim.SOLVER_LIMITS` during the last :meth:`step` (zeros for XPBD).
    """

    # (num_envs, dofs) per-env joint parameters, views of the model's (set in _make_views: JOINT_PARAMS)
    joint_stiffness: torch.Tensor
    joint_damping: torch.Tensor
    joint_effort_limit: torch.Tensor
    joint_friction: torch.Tensor
    joint_armature: torch.Tensor

    @_one_thread_at_a_time
    def __init__(self, scene: Scene | str, num_envs: int, dt: float, decimation: int, device: str = "cpu",
                 solver: str = "mujoco", solver_options: dict | None = None, contact_gap: float = 0.0,
                 use_graph: bool = True, backend: str = "auto", threads: int = 0):
        import newton  # imported here so that `import legion.tasks.sim` stays cheap

        if isinstance(scene, str):
            scene = Scene(robot=Robot(file=scene))
        solver_adapter = adapter(solver, backend, device)
        if num_envs < 1 or decimation < 1 or dt <= 0:
            raise ValueError(f"Need num_envs >= 1, decimation >= 1, dt > 0; got {num_envs}, {decimation}, {dt}.")
        check_cameras(scene, num_envs, device)
        if scene.contact_sensing and not solver_adapter.senses_contacts:
            raise ValueError("Contact-force sensing needs sim=mujoco. For sim=xpbd set "
                             "task.scene.contact_sensing=false and remove the task's contact terms "
                             "(feet_air_time, undesired_contacts, illegal_contact).")
        self.num_envs, self.dt, self.decimation, self.device = num_envs, dt, decimation, device
        self.threads = threads or len(os.sched_getaffinity(0))
        self.physics_dt, self.control_dt = dt, dt * decimation
        self.solver_name, self.backend = solver, solver_adapter.backend
        self.senses_contacts = scene.contact_sensing
        self._newton = newton

        world, layout = self._build_model(scene, solver_adapter, contact_gap)
        self._make_views(world)
        self._make_entities(world, layout, scene.robot.file)
        self.cameras = Cameras(self, scene, _WARP_LOCK) if scene.cameras else None
        self.motor_cfgs = {i: a for i, a in enumerate(joint_actuators(scene.robot, self.robot.joint_names))
                           if a is not None and a.model == "dc_motor"}  # robot joint index -> its dc_motor
        # (num_envs, motors) [rad] each dc_motor's gear play: its config's, drawn per env by the event joint_backlash
        self.motor_backlash = torch.tensor([[a.backlash for a in self.motor_cfgs.values()]] * num_envs,
                                           dtype=torch.float32, device=device).view(num_envs, -1)
        # After the views (it reads shapes_per_world) and the motors (the C backend may step them itself)
        self.solver = solver_adapter(self, dict(solver_options or {}))
        self.solver_limits = wp.to_torch(self.solver.limits)  # overwritten by every step
        self._make_motors()
        self._make_networks(scene)
        self._make_reset_masks()
        self._sent = None  # the targets of the last control steps, made by set_command_latency
        self.command_latency: torch.Tensor | None = None  # (num_envs,) [physics steps], once set
        # Not with actuator networks: their torch is not in Warp's graph of the step (sim.capture_step
        # records it with the rest of the env step on CUDA)
        self.graph = self._capture() if use_graph and solver_adapter.capturable and not self.networks else None
        # The reset's forward kinematics as a graph too (recorded at the first reset): one launch
        # from Python costs ~0.4 ms on a CPU, most of it packing its arguments; a replay ~0.02 ms.
        self._fk_graph, self._record_fk = None, use_graph

    # --- construction, in order ---------------------------------------------------------------
    def _build_model(self, scene: Scene, adapter, contact_gap: float) -> tuple:
        """One world from the scene, replicated ``num_envs`` times, the shared ground after them;
        the finalized model, its state (body poses from the joint coordinates) and control.
        Returns the one world's builder and its layout (:func:`~.scene.build_world`)."""
        newton = self._newton
        world = newton.ModelBuilder()
        adapter.prepare_builder(world)
        world.rigid_gap = contact_gap
        layout = build_world(scene, newton, world, contact_gap)
        builder = newton.ModelBuilder()
        builder.rigid_gap = contact_gap
        builder.replicate(world, self.num_envs)
        self._add_ground(builder, scene, contact_gap)
        self.model = model = builder.finalize(device=self.device)
        self.state, self.control = model.state(), model.control()
        newton.eval_fk(model, _allocated(model.joint_q), _allocated(model.joint_qd), self.state)
        return world, layout

    def _add_ground(self, builder, scene: Scene, contact_gap: float) -> None:
        """The ground all worlds share (shape_world -1, so it comes after them): a plane at z = 0,
        or the generated terrain's heightfield (:attr:`terrain`); none without ``scene.ground``."""
        self.terrain = None
        if scene.ground is None:
            return
        newton = self._newton
        ground = newton.ModelBuilder.ShapeConfig(mu=scene.ground.friction, gap=contact_gap)
        if scene.ground.terrain is None:
            builder.add_ground_plane(cfg=ground)
            return
        self.terrain = Terrain(generate(scene.ground.terrain), self.device)
        heights, r, (x0, y0) = self.terrain.map.heights, self.terrain.map.resolution, self.terrain.map.corner
        rows, cols = heights.shape
        hx, hy = (cols - 1) * r / 2, (rows - 1) * r / 2
        builder.add_shape_heightfield(
            xform=wp.transform((x0 + hx, y0 + hy, 0.0), wp.quat_identity()), cfg=ground, label="terrain",
            heightfield=newton.Heightfield(data=heights, nrow=rows, ncol=cols, hx=hx, hy=hy))

    def _make_views(self, world) -> None:
        """Zero-copy torch views of every world's state, control and per-env parameters (one
        world's layout from its builder ``world``), the parameters' defaults, the joint limits
        and the contact-force buffer."""
        model, n = self.model, self.num_envs
        coords, dofs = world.joint_coord_count, world.joint_dof_count
        self.bodies_per_world, self.shapes_per_world = bodies, shapes = world.body_count, world.shape_count
        self.joint_q = _torch(self.state.joint_q).view(n, coords)  # generalized coordinates
        self.joint_qd = _torch(self.state.joint_qd).view(n, dofs)  # generalized velocities
        self.body_q = _torch(self.state.body_q).view(n, bodies, 7)  # body poses, world frame
        self.body_qd = _torch(self.state.body_qd).view(n, bodies, 6)  # COM linear, angular velocity, world frame
        self.joint_target_q = _torch(self.control.joint_target_q).view(n, coords)
        self.joint_f = _torch(self.control.joint_f).view(n, dofs)
        self.shape_body = _torch(model.shape_body)[:shapes].clone()  # body of each shape (-1: static)
        self.shape_friction = _torch(model.shape_material_mu)[: n * shapes].view(n, shapes)
        self.shape_restitution = _torch(model.shape_material_restitution)[: n * shapes].view(n, shapes)
        self.shape_size = _torch(model.shape_scale)[: n * shapes].view(n, shapes, 3)
        self.body_mass = _torch(model.body_mass).view(n, bodies)
        self.body_com = _torch(model.body_com).view(n, bodies, 3)
        self.body_inertia = _torch(model.body_inertia).view(n, bodies, 3, 3)
        for param, array in zip(JOINT_PARAMS, (model.joint_target_ke, model.joint_target_kd, model.joint_effort_limit,
                                               model.joint_friction, model.joint_armature)):
            setattr(self, param, _torch(array).view(n, dofs))
        self.gravity = _torch(model.gravity)[:n]  # (num_envs, 3) [m/s^2], world frame
        self.defaults = {name: getattr(self, name).clone() for name in PARAM_FLAGS}
        self._body_inv_mass = _torch(model.body_inv_mass).view(n, bodies)
        self._body_inv_inertia = _torch(model.body_inv_inertia).view(n, bodies, 3, 3)
        self._changed: set[str] = set()
        lower = _torch(model.joint_limit_lower).view(n, dofs)[0]
        upper = _torch(model.joint_limit_upper).view(n, dofs)[0]
        self.joint_limits = torch.stack([lower, upper], dim=-1).clone()  # (dofs, 2), the model's
        self.contact_forces = torch.zeros(n, bodies, 3, device=self.device)  # [N], world frame
        self._contact_out = wp.from_torch(self.contact_forces, dtype=wp.vec3)

    def _make_entities(self, world, layout: dict, robot_file: str) -> None:
        """The scene's entities (:attr:`scene`, :attr:`robot`), named by Newton's labels of one world."""
        model = self.model
        bodies, shapes = self.bodies_per_world, self.shapes_per_world
        joint_type = _allocated(model.joint_type).numpy()[: world.joint_count]
        self.is_free_joint = [bool(t == self._newton.JointType.FREE) for t in joint_type]
        qd_start = _allocated(model.joint_qd_start).numpy()
        dof_labels = []
        for j, label in enumerate(model.joint_label[: world.joint_count]):
            dof_labels += [short_label(label)] * int(qd_start[j + 1] - qd_start[j])
        body_labels = [short_label(label) for label in model.body_label[:bodies]]
        shape_labels = [short_label(label) for label in model.shape_label[:shapes]]
        self.scene = {}
        for name, (kind, s) in layout.items():
            common = (self, name, s, shape_labels[s.shapes])
            if kind == "robot":
                entity = Articulation(*common, body_labels[s.bodies], dof_labels[s.dofs], resolve_asset(robot_file))
            elif kind == "object":
                entity = RigidObject(*common, body_labels[s.bodies])
            else:
                entity = Fixture(*common)
            self.scene[name] = entity
        self.robot: Articulation = self.scene["robot"]

    def _make_motors(self) -> None:
        """The robot's ``dc_motor`` joints as one Newton actuator (``newton.actuators``): a PD law
        evaluated before every physics step, clipped by each motor's torque-speed line, added to
        the env's feed-forward efforts. Its gains and effort limit are the robot's per-env
        ``joint_stiffness``, ``joint_damping`` and ``joint_effort_limit`` (events scale them).
        None where the solver steps the same motors itself (``solver.steps_motors``: the C backend)."""
        motor_cfgs = self.motor_cfgs
        ids = list(motor_cfgs)
        self.motors, self._motor_states = None, None
        self.motor_joint_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        if not ids or self.solver.steps_motors:
            return
        from newton.actuators import Actuator, ClampingDCMotor, Delay

        n, k, device = self.num_envs, len(ids), self.device
        dofs, coords = self.joint_qd.shape[1], self.joint_q.shape[1]
        d0, q0 = self.robot.joint_dofs.start, self.robot.joint_coords.start

        def per_world(values) -> wp.array:
            return wp.array([v for _ in range(n) for v in values], dtype=wp.float32, device=device)

        # Explicit mode reads these arrays at every step (they are not repacked): the views below write into them.
        kp, kd, max_effort = (wp.zeros(n * k, device=device) for _ in range(3))
        clamp = ClampingDCMotor(saturation_effort=per_world([motor_cfgs[i].saturation_effort for i in ids]),
                                velocity_limit=per_world([motor_cfgs[i].velocity_limit for i in ids]),
                                max_motor_effort=max_effort)
        delays = [motor_cfgs[i].delay for i in ids]
        delay = None
        if max(delays) > 0:  # each motor acts on the targets of `delay` physics steps before
            delay = Delay(wp.array([d for _ in range(n) for d in delays], dtype=wp.int32, device=device), max(delays))
        self.motors = Actuator(
            indices=wp.array([w * dofs + d0 + i for w in range(n) for i in ids], dtype=wp.uint32, device=device),
            pos_indices=wp.array([w * coords + q0 + i for w in range(n) for i in ids], dtype=wp.uint32, device=device),
            drive=_drive_with_backlash(kp, kd, wp.from_torch(self.motor_backlash.view(-1))), clamping=[clamp],
            delay=delay, control_feedforward_attr=None)
        # The delay's history: read from one state, written to the other, swapped every physics step.
        self._motor_states = [s for s in (self.motors.state(), self.motors.state()) if s is not None] or None
        self._motor_reset = torch.zeros(n, k, dtype=torch.bool, device=device)  # per motor: its world's reset
        self._motor_reset_wp = wp.from_torch(self._motor_reset.view(-1), dtype=wp.bool)
        self._motor_params = [(wp.to_torch(array).view(n, k), name) for array, name in (
            (kp, "joint_stiffness"), (kd, "joint_damping"), (max_effort, "joint_effort_limit"))]
        self._sync_motor_params()
        state, control = self.state, self.control
        self._motor_inputs = ({"joint_q": state.joint_q, "joint_qd": state.joint_qd},
                              {"joint_target_q": control.joint_target_q, "joint_target_qd": control.joint_target_qd,
                               "joint_f": control.joint_f})
        self._feedforward = wp.clone(_allocated(control.joint_f))  # the env's joint_f, put back after the step
        self._motor_f = wp.clone(_allocated(control.joint_f))  # joint_f of the last physics step, motors included

    def _make_networks(self, scene: Scene) -> None:
        """The robot's ``network`` joints: per actuator network file, the joints it drives and the
        ring of their position errors and velocities over the physics steps its history spans
        (:meth:`_network_step` evaluates it before every physics step, in torch, for all worlds)."""
        from legion.sim2real.deploy.actuator_network import ACTIVATIONS, load

        files: dict[str, list[int]] = {}
        for i, a in enumerate(joint_actuators(scene.robot, self.robot.joint_names)):
            if a is not None and a.network is not None:  # (scene.py: model network, and only it, names one)
                files.setdefault(a.network, []).append(i)
        self.networks: list[dict] = []
        activation = {"softsign": torch.nn.Softsign, "tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}
        assert set(activation) == set(ACTIVATIONS)
        for file, ids in files.items():
            path = resolve_asset(file) if file.startswith("package://") else file
            net = load(path)
            layers: list[torch.nn.Module] = []
            for w, b in zip(net.weights, net.biases):
                linear = torch.nn.Linear(w.shape[1], w.shape[0], device=self.device)
                linear.weight.data.copy_(torch.as_tensor(w))
                linear.bias.data.copy_(torch.as_tensor(b))
                layers += [linear, activation[net.activation]()]
            stride = net.steps(self.dt)
            ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
            self.networks.append({
                "file": file, "path": path, "stride": stride,
                "mlp": torch.nn.Sequential(*layers[:-1]).requires_grad_(False),
                "scale": net.output_scale, "coords": self.robot.joint_coords.start + ids_t,
                "dofs": self.robot.joint_dofs.start + ids_t,
                "mean": torch.as_tensor(net.input_mean, dtype=torch.float32, device=self.device),
                "std": torch.as_tensor(net.input_std, dtype=torch.float32, device=self.device),
                # (num_envs, joints, error | velocity, physics steps back): now first
                "history": torch.zeros(self.num_envs, len(ids), 2, stride * (net.history - 1) + 1,
                                       device=self.device),
                "torque": torch.zeros(self.num_envs, len(ids), device=self.device)})
        self._network_fresh = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        if self.networks and self.motors is None:  # the env's joint_f, put back after the step
            self._feedforward = wp.clone(_allocated(self.control.joint_f))

    def _network_step(self) -> None:
        """Before each physics step: each actuator network's torques from the state of now and its
        history (a world just reset fills its history with its present), clipped to the joints'
        per-env effort limits and added to the efforts already there (the env's feed-forward, the
        dc motors')."""
        fresh = self._network_fresh[:, None, None, None]
        for net in self.networks:
            coords, dofs, history = net["coords"], net["dofs"], net["history"]
            now = torch.stack([self.joint_target_q[:, coords] - self.joint_q[:, coords], self.joint_qd[:, dofs]], -1)
            history.copy_(torch.where(fresh, now[..., None], torch.cat([now[..., None], history[..., :-1]], -1)))
            x = history[..., ::net["stride"]].flatten(2)  # (num_envs, joints, 2 history): errors, then velocities
            torque = net["mlp"]((x - net["mean"]) / net["std"])[..., 0] * net["scale"]
            limit = self.joint_effort_limit[:, dofs]
            net["torque"].copy_(torch.minimum(torch.maximum(torque, -limit), limit))
            self.joint_f[:, dofs] += net["torque"]
        self._network_fresh.fill_(False)

    def _sync_motor_params(self) -> None:
        for view, name in self._motor_params:
            view.copy_(getattr(self.robot, name)[:, self.motor_joint_ids])

    @property
    def motor_torque(self) -> torch.Tensor:
        """(num_envs, len(motor_joint_ids)) [N m or N]: the torque the dc_motor joints' motors
        applied in the last physics step (their PD law after the torque-speed clip)."""
        if self.solver.steps_motors:
            return self.solver.motor_torque
        ids = self.robot.joint_dofs.start + self.motor_joint_ids
        return (wp.to_torch(self._motor_f) - wp.to_torch(self._feedforward)).view(self.num_envs, -1)[:, ids]

    def _make_reset_masks(self) -> None:
        """Newton's per-world reset mask (its last entry stands for the shared shapes, never
        reset), and eval_fk's, one entry per articulation (a robot and each free object are one
        each): its world's entry (world -1, shared: the last)."""
        self._reset_mask = wp.zeros(self.num_envs + 1, dtype=wp.bool, device=self.device)
        self._reset_mask_t = wp.to_torch(self._reset_mask)
        self._articulation_world = _torch(self.model.articulation_world).long().clone()
        self._fk_mask_t = torch.zeros(len(self._articulation_world), dtype=torch.bool, device=self.device)
        self._fk_mask = wp.from_torch(self._fk_mask_t, dtype=wp.bool)

    def _capture(self):
        """The decimated step (:meth:`_simulate`) recorded as one Warp graph."""
        with wp.ScopedCapture(device=self.device) as capture:
            self._simulate()
        return capture.graph

    # ------------------------------------------------------------------------------------
    def _simulate(self) -> None:
        motors, joint_f = self.motors, _allocated(self.control.joint_f)
        late = self._late_targets() if self._sent is not None else None
        networks = self.networks
        if motors is None and not networks and (late is None or self.solver.backend == "c"):
            # one call for the control step: the C backend steps it in one go, a late command included
            self.solver.step(self.state, self.control, self.dt, self.decimation,
                             **({} if late is None else {"late": (late[0], late[2])}))
        else:
            substeps = iter(range(self.decimation))

            def before_each_step():
                if late is not None:  # the first `split` physics steps act on the older targets
                    older, newer, split = late
                    self.joint_target_q.copy_(torch.where((split > next(substeps)).unsqueeze(1), older, newer))
                if motors is not None:
                    self._motor_step()
                elif networks:
                    wp.copy(joint_f, self._feedforward)
                if networks:
                    self._network_step()

            if motors is not None or networks:
                wp.copy(self._feedforward, joint_f)
            if motors is not None:
                self._motor_history = tuple(self._motor_states or (None, None))
            self.solver.step(self.state, self.control, self.dt, self.decimation, before_each_step=before_each_step)
            if motors is not None or networks:
                wp.copy(joint_f, self._feedforward)
            if self._motor_states is not None and self.decimation % 2:  # a graph replays the same buffers:
                self._motor_states[0].assign(self._motor_states[1])   # end where it began
        if late is not None:
            self.joint_target_q.copy_(self._commanded)  # the env's targets, as it wrote them
        self.solver.finish_control_step(self.state)
        if self.senses_contacts:
            self.solver.sense_contacts(self._contact_out)

    def _motor_step(self) -> None:
        """Before each physics step: the motors' torques from the state of now, added to the env's
        feed-forward efforts."""
        joint_f = _allocated(self.control.joint_f)
        wp.copy(joint_f, self._feedforward)
        current, following = self._motor_history
        assert self.motors is not None
        self.motors.step(*self._motor_inputs, current, following, dt=self.dt)
        self._motor_history = (following, current)
        wp.copy(self._motor_f, joint_f)

    # --- command latency (the event command_latency) -------------------------------------------
    @_one_thread_at_a_time
    def set_command_latency(self, worlds: torch.Tensor, steps: torch.Tensor, max_steps: int) -> None:
        """The joint targets of ``worlds`` (num_envs,) bool reach the joints ``steps`` (num_envs,)
        physics steps late, each <= ``max_steps``: the targets written for control step t act from
        physics step ``t * decimation + steps`` on, the ones before them until then (a world just
        reset acts on its first targets at once). Finer than whole control steps (the action's
        delay): the resolution at which ``legion calibrate`` identifies a robot's latency.

        The first call makes a ring of the last control steps' targets; the decimated step then
        runs eagerly (its torch indexing is not in Warp's graph of it; ``sim.capture_step`` records
        it with the rest of the env step)."""
        depth = max_steps // self.decimation + 2  # the control steps a world's physics steps may act on
        if self._sent is None or depth > len(self._sent):
            if wp.get_device(self.device).is_capturing:
                raise RuntimeError("a command latency set for the first time (or longer) inside a captured step")
            n, coords = self.joint_target_q.shape
            self._sent = torch.zeros(depth, n, coords, device=self.device)
            self._sent_step = torch.zeros((), dtype=torch.long, device=self.device)
            self._sent_fresh = torch.ones(n, dtype=torch.bool, device=self.device)  # no targets of theirs yet
            self._commanded = torch.zeros_like(self.joint_target_q)
            if self.command_latency is None:
                self.command_latency = torch.zeros(n, dtype=torch.long, device=self.device)
            self._worlds = torch.arange(n, device=self.device)
            self.graph = None
        latency = self.command_latency
        assert latency is not None
        latency.copy_(torch.where(worlds, steps, latency))

    def _late_targets(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This control step's targets join the ring; per world (older, newer, split): the targets
        of ``latency // decimation + 1`` and ``latency // decimation`` control steps ago, and the
        physics step of this control step where the newer take over (``latency % decimation``)."""
        ring, targets, latency = self._sent, self.joint_target_q, self.command_latency
        assert ring is not None and latency is not None  # (set_command_latency made them)
        self._commanded.copy_(targets)
        ring.index_copy_(0, (self._sent_step % len(ring)).view(1), targets.unsqueeze(0))
        ring.copy_(torch.where(self._sent_fresh.view(1, -1, 1), targets.unsqueeze(0), ring))  # a reset world's
        self._sent_fresh.zero_()
        whole = latency // self.decimation
        newer = ring[(self._sent_step - whole) % len(ring), self._worlds]
        older = ring[(self._sent_step - whole - 1) % len(ring), self._worlds]
        self._sent_step += 1
        targets.copy_(newer)
        return older, newer, latency % self.decimation

    @_one_thread_at_a_time
    def step(self) -> None:
        """Advance every world by one control step (``decimation`` physics steps)."""
        if self._changed:
            self._publish_params()
        # Inside a capture of the whole control step (LegionEnv's sim.capture_step) the kernels
        # join that graph directly.
        if self.graph is not None and not wp.get_device(self.device).is_capturing:
            wp.capture_launch(self.graph)
        else:
            self._simulate()
        self.wrote_state()
        if self.cameras is not None:
            self.cameras.tick()

    @_one_thread_at_a_time
    def reset(self, worlds: torch.Tensor) -> None:
        """After writing the state of some worlds through the views: recompute their body poses
        from the joint coordinates and make the solver forget what it carried over for them
        (MuJoCo's warm start), so a reset world's future depends on its new state only. The other
        worlds are left untouched. Nothing is read back to the host.

        Args:
            worlds: (num_envs,) bool mask of the worlds whose state was written, or (k,) long indices.
        """
        if worlds.dtype == torch.bool:
            self._reset_mask_t[: self.num_envs].copy_(worlds)
        else:
            self._reset_mask_t.zero_()
            self._reset_mask_t[worlds] = True
        torch.index_select(self._reset_mask_t, 0, self._articulation_world, out=self._fk_mask_t)
        if self._record_fk and not wp.get_device(self.device).is_capturing:
            if self._fk_graph is None:
                self._fk_graph = record_graph(self.device, self._eval_fk)
            wp.capture_launch(self._fk_graph)
        else:  # inside a capture of the whole control step (LegionEnv's sim.capture_step): joins it
            self._eval_fk()
        self.solver.reset(self.state, self._reset_mask)
        if self._motor_states is not None:  # forget the reset worlds' delayed targets (no allocation: capturable)
            self._motor_reset.copy_(self._reset_mask_t[: self.num_envs, None].expand_as(self._motor_reset))
            for history in self._motor_states:
                history.reset(self._motor_reset_wp)
        if self.networks:  # a reset world's actuator networks start from its present, not its past
            self._network_fresh |= self._reset_mask_t[: self.num_envs]
        if self._sent is not None:  # a reset world's first targets act at once (nothing sent before them)
            self._sent_fresh |= self._reset_mask_t[: self.num_envs]
        if self.cameras is not None:
            self.cameras.reset(self._reset_mask_t[: self.num_envs])
        self.wrote_state()

    def wrote_state(self) -> None:
        """Bumps the torch version counters of the state views that Warp and MuJoCo write (joint and
        body state, contact forces), as a torch write would: what is cached on them is then
        recomputed (a command's pose errors, :mod:`legion.tasks.mdp.commands`). :meth:`step` and
        :meth:`reset` call it; so does whatever else writes them outside torch (a graph replay)."""
        for name in _SIMULATED:
            increment_version(getattr(self, name))

    def _eval_fk(self) -> None:
        """Body poses and velocities from the joint coordinates, in the worlds of the reset mask."""
        self._newton.eval_fk(self.model, _allocated(self.state.joint_q), _allocated(self.state.joint_qd), self.state,
                             mask=self._fk_mask)

    # --- what the worlds carry from step to step (checkpoints) -------------------------------
    def state_dict(self) -> dict:
        """What a step reads that earlier steps wrote, as copies: every world's joint and body state,
        controls and contact forces, per-env physical parameters and default root poses (events
        and the curriculum write them), the solver's own carried state (MuJoCo's warm start), the
        motors' delay histories, a command latency's last targets and the cameras' state
        (:meth:`Cameras.state_views`). Restored by :meth:`load_state_dict`, the worlds go on
        exactly as they would have (a run resumed bit for bit)."""
        return {name: view.clone() for name, view in self._state_views().items()}

    @_one_thread_at_a_time
    def load_state_dict(self, state: dict) -> None:
        """Restores :meth:`state_dict` (same scene and ``num_envs``); raises ValueError naming what
        does not fit, restoring nothing."""
        views = self._state_views()
        state = {"motor_backlash": views["motor_backlash"], **state}  # (a checkpoint from before it existed)
        if set(state) != set(views) or any(state[k].shape != views[k].shape for k in views):
            raise ValueError(f"the saved simulation state does not fit this scene: it holds "
                             f"{sorted((k, tuple(v.shape)) for k, v in state.items())}, this sim "
                             f"{sorted((k, tuple(v.shape)) for k, v in views.items())}")
        for name, view in views.items():
            view.copy_(state[name])
        self._changed.update(PARAM_FLAGS)  # the next step hands them all to the solver (the same values: exact)

    def _state_views(self) -> dict[str, torch.Tensor]:
        """:meth:`state_dict`'s entries as live views (writing one writes the simulation)."""
        views = {name: getattr(self, name) for name in (*_STATE_VIEWS, *PARAM_FLAGS, "motor_backlash")}
        views |= {f"{name}.default_root_pose": e.default_root_pose for name, e in self.scene.items()
                  if getattr(e, "default_root_pose", None) is not None}
        views |= {f"motors.{i}": wp.to_torch(a) for i, a in enumerate(self._motor_arrays())}
        views |= {f"networks.{i}.{key}": net[key] for i, net in enumerate(self.networks)
                  for key in ("history", "torque")}
        if self.networks:
            views["networks.fresh"] = self._network_fresh
        if self._sent is not None:
            views |= {"command_latency": self.command_latency, "command_latency.sent": self._sent,
                      "command_latency.step": self._sent_step, "command_latency.fresh": self._sent_fresh}
        if self.cameras is not None:
            views |= self.cameras.state_views()
        return views | self.solver.state_views()

    def _motor_arrays(self) -> list[wp.array]:
        """The Warp arrays of the motors' state (the delay's history buffers), in a fixed order."""
        arrays = []
        for state in self._motor_states or ():
            for part in (state.delay_state, state.drive_state):
                if part is not None:
                    arrays += [getattr(part, f.name) for f in dataclasses.fields(part)
                               if isinstance(getattr(part, f.name), wp.array)]
        return arrays

    def ground_height(self, xy: torch.Tensor) -> torch.Tensor:
        """Height [m] of the ground under world points ``xy`` (..., 2) [m]: the terrain's, else 0."""
        if self.terrain is None:
            return torch.zeros(xy.shape[:-1], device=xy.device)
        return self.terrain.height_at(xy)

    @property
    def pending_params(self) -> frozenset[str]:
        """The parameters marked changed that the next :meth:`step` hands to the solver."""
        return frozenset(self._changed)

    def params_changed(self, *names: str) -> None:
        """Marks per-env parameters (names as in ``PARAM_FLAGS``) as edited; the next :meth:`step`
        hands them to the solver, once, however many edits came before it."""
        unknown = [name for name in names if name not in PARAM_FLAGS]
        if unknown:
            raise ValueError(f"Unknown physical parameter(s) {unknown}; NewtonSim has {sorted(PARAM_FLAGS)}.")
        self._changed.update(names)

    def _publish_params(self) -> None:
        """Derived quantities (inverse mass and inertia), then the solver's own."""
        changed, self._changed = self._changed, set()
        if self.motors is not None and changed & {"joint_stiffness", "joint_damping", "joint_effort_limit"}:
            self._sync_motor_params()
        if changed & {"body_mass", "body_inertia"}:
            mass = self.body_mass
            self._body_inv_mass.copy_(torch.where(mass > 0, 1.0 / mass.clamp(min=1e-12), 0.0))
            inertia = self.body_inertia
            invertible = torch.linalg.det(inertia).abs() > 1e-18
            eye = torch.eye(3, device=inertia.device).expand_as(inertia)
            # inv_ex: no check of the result read back to the host (capturable, no stall on a GPU)
            inverse = torch.linalg.inv_ex(torch.where(invertible[..., None, None], inertia, eye)).inverse
            self._body_inv_inertia.copy_(torch.where(invertible[..., None, None], inverse, 0.0))
        self.solver.publish(changed)


@wp.kernel
def _pd_with_backlash(current_pos: wp.array[float], current_vel: wp.array[float], target_pos: wp.array[float],
                      target_vel: wp.array[float], feedforward: wp.array[float], pos_indices: wp.array[wp.uint32],
                      vel_indices: wp.array[wp.uint32], target_pos_indices: wp.array[wp.uint32],
                      target_vel_indices: wp.array[wp.uint32], kp: wp.array[float], kd: wp.array[float],
                      backlash: wp.array[float], efforts: wp.array[float]):
    i = wp.tid()
    error = target_pos[target_pos_indices[i]] - current_pos[pos_indices[i]]
    # the error less half the play either side (exactly the error without play)
    error = wp.sign(error) * wp.max(wp.abs(error) - 0.5 * backlash[i], 0.0)  # pyright: ignore[reportCallIssue, reportArgumentType]
    ff = float(0.0)  # noqa: UP018 (a Warp variable, not a constant: assigned below)
    if feedforward:  # (a delay's, zeros)
        ff = feedforward[target_vel_indices[i]]
    velocity_error = target_vel[target_vel_indices[i]] - current_vel[vel_indices[i]]
    efforts[i] = ff + kp[i] * error + kd[i] * velocity_error  # pyright: ignore[reportIndexIssue]


def _drive_with_backlash(kp: wp.array, kd: wp.array, backlash: wp.array):
    """Newton's DrivePD (explicit mode) on the position error less half each motor's gear play
    ``backlash`` [rad] either side (the C backend's motors: step_worlds.c's dead zone)."""
    from newton.actuators import DrivePD

    class DrivePDWithBacklash(DrivePD):
        evaluate_force = None  # no implicit mode: the dead zone is not in Newton's implicit solve

        def compute(self, positions, velocities, target_pos, target_vel, feedforward, pos_indices, vel_indices,
                    target_pos_indices, target_vel_indices, forces, state, dt, device=None, *, custom_inputs=None):
            wp.launch(_pd_with_backlash, dim=len(forces), device=device,
                      inputs=[positions, velocities, target_pos, target_vel, feedforward, pos_indices, vel_indices,
                              target_pos_indices, target_vel_indices, self.kp, self.kd, backlash], outputs=[forces])

    return DrivePDWithBacklash(kp=kp, kd=kd)


def _allocated(array: wp.array | None) -> wp.array:
    """An array of a finalized Newton model, state or control: Newton types them Optional (None
    until ``finalize`` allocates them)."""
    assert array is not None, "a Newton model array read before the model was finalized"
    return array


def _torch(array: wp.array | None) -> torch.Tensor:
    """A zero-copy torch view of an array of a finalized Newton model, state or control."""
    return wp.to_torch(_allocated(array))
