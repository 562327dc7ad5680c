"""A :class:`~legion.sim2real.deploy.loop.RobotInterface` on the plain ``mujoco`` C engine: one robot, on a floor.

Needs ``pip install mujoco`` besides the deploy extra. It loads the robot either from its own
MJCF (the file Newton trained on; a floor plane is added) or as Newton simulated it: the
``robot.mjb`` that ``legion export`` writes, or an ``MjModel`` from the training env
(``env.sim.solver.mujoco_model()``), which a URDF robot needs (it has no MJCF). It then mirrors
the training setup from the policy metadata: physics dt, decimation, PD gains, the default pose
and base height. Newton ignores MJCF keyframes; so does this class. The solver options stay the
model's own (MuJoCo's defaults where an MJCF sets none) unless ``options`` names them.

Drives: a policy joint with a ``<position>`` actuator is driven through it (the metadata's gains
written into it). A model whose policy joints have no actuators (Newton's model of a URDF robot:
its PD law runs outside MuJoCo) gets the PD law explicitly before every physics step,
:func:`pd_torque`, clipped as the metadata's actuators clip it (effort limit, a DC motor's
torque-speed line), written into ``qfrc_applied``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import mujoco
import numpy as np
from numpy.typing import ArrayLike

from legion.sim2real.deploy.actuator_network import ActuatorNetwork
from legion.sim2real.deploy.contract import PolicyContract


def pd_torque(q_target, q, dq, kp, kd, effort_limit, saturation=None, velocity_limit=None,
              dq_target: ArrayLike = 0.0, tau_ff: ArrayLike = 0.0) -> np.ndarray:
    """Per joint: the torque [N m] of ``kp (q* - q) + kd (dq* - dq) + tau_ff``, clipped as
    :class:`MotorClip` clips it."""
    tau = np.asarray(kp) * (np.asarray(q_target) - q) + np.asarray(kd) * (dq_target - np.asarray(dq)) + tau_ff
    return MotorClip(effort_limit, saturation, velocity_limit)(tau, dq)


class MotorClip:
    """The motors' clip of a torque: to ``effort_limit`` and, where ``saturation`` [N m] and
    ``velocity_limit`` [rad/s] are given (not NaN), to a DC motor's torque-speed line: Newton's
    ``ClampingDCMotor`` (what training used), ``max = min(sat (1 - v / v_lim), effort_limit)``,
    ``min = max(sat (-1 - v / v_lim), -effort_limit)`` with v clamped to the line's corner speed.

    Its constants are worked out once: a replay calls it at every physics step, where NumPy's
    per-call overhead, not the arithmetic, is the cost. A joint without a line gets an infinite one
    (saturation, velocity limit and corner speed), which leaves its effort limit as the bound."""

    def __init__(self, effort_limit, saturation=None, velocity_limit=None):
        self.high = np.array(effort_limit, np.float64)
        sat = np.broadcast_to(np.inf if saturation is None else np.asarray(saturation, np.float64), self.high.shape)
        v_lim = np.broadcast_to(np.inf if velocity_limit is None else np.asarray(velocity_limit, np.float64),
                                self.high.shape)
        motor = np.isfinite(sat) & np.isfinite(v_lim)
        self.sat, self.v_lim = np.where(motor, sat, np.inf), np.where(motor, v_lim, np.inf)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.corner = np.where(motor, np.where(sat > 0, v_lim * (1.0 + self.high / sat), v_lim), np.inf)

    def __call__(self, tau: np.ndarray, dq) -> np.ndarray:
        """``tau`` [N m] clipped at joint speeds ``dq`` [rad/s]."""
        speed = np.minimum(np.maximum(dq, -self.corner), self.corner) / self.v_lim
        high = np.minimum(self.sat * (1.0 - speed), self.high)
        low = np.maximum(self.sat * (-1.0 - speed), -self.high)
        return np.minimum(np.maximum(tau, low), high)


def motor_gains(metadata: PolicyContract) -> tuple[np.ndarray, ...]:
    """Per policy joint, the PD law and the motors' clip training ran (:func:`pd_torque`'s): kp,
    kd, effort limit, saturation and velocity limit (NaN where a motor has no torque-speed line)."""
    motors = metadata.actuators
    return (np.asarray(metadata.joint_stiffness, np.float64), np.asarray(metadata.joint_damping, np.float64),
            np.asarray(metadata.effort_limits, np.float64),
            np.array([a.saturation_effort or np.nan for a in motors], np.float64),
            np.array([a.velocity_limit or np.nan for a in motors], np.float64))


HUNG_BASE_ARMATURE = 1e6  # [kg, kg m^2] on a hung base's DOFs (hang)


def find_id(model, objtype, name: str, others=()) -> int:
    """The id of ``name``, or of the one object whose name ends with ``_name`` or ``/name``
    (Newton prefixes the names it imports with the model's, e.g. ``go2_description_FL_hip_joint``,
    or with the body path, ``..._link1_joint1``), not counting those that end with one of
    ``others``, longer names of the same set (``..._finger_joint1`` is not ``joint1``); -1 if none
    or several."""
    exact = mujoco.mj_name2id(model, objtype, name)
    if exact >= 0:
        return exact
    count = {mujoco.mjtObj.mjOBJ_JOINT: model.njnt, mujoco.mjtObj.mjOBJ_BODY: model.nbody}[objtype]
    longer = tuple(end for o in others if o != name and o.endswith(name) for end in (f"_{o}", f"/{o}"))
    found = [i for i in range(count) if (n := mujoco.mj_id2name(model, objtype, i) or "").endswith(
        (f"_{name}", f"/{name}")) and not (longer and n.endswith(longer))]
    return found[0] if len(found) == 1 else -1


class MuJoCoRobot:
    """One robot in MuJoCo, floating-base (a free joint at its root) or bolted to the world (an
    arm), driven by joint position targets. A manipulated object in the model (the body the
    policy's ``object_position`` term names, e.g. Newton's model of an arm_lift world holds its
    cube) is reported as ``object_pos`` in the robot's base frame.

    Args:
        source: the robot's MJCF (path; every policy joint needs a ``<position>`` actuator), an
            ``.mjb`` written by ``legion export`` or a ``mujoco.MjModel`` (Newton's, see the module
            docstring; these bring their own ground).
        metadata: the exported policy's contract (``PolicyRunner.metadata``, or ``PolicyContract.load`` of
            its policy.json).
        floor_friction: sliding friction of every contact with the ground (:meth:`set_floor_friction`);
            None: the model's own contacts (an MJCF's added floor has 1.0, and MuJoCo takes the
            larger of a contact's two; Newton's model gives the robot's friction, as in training).
        object_body: the body that :meth:`reset` places and ``object_pos`` reports (default: the
            one the policy's ``object_position`` term observes; name it for a policy that finds
            the object by camera, so that its episodes can start and be judged alike).
        options: MuJoCo ``<option>`` values to set, e.g. ``{"integrator": "implicitfast",
            "iterations": 10, "ls_iterations": 10}`` (Newton SolverMuJoCo's defaults are
            implicitfast, pyramidal cone, Newton solver).
    """

    def __init__(self, source, metadata: PolicyContract, floor_friction: float | None = None,
                 options: dict | None = None, object_body: str | None = None):
        where = source if isinstance(source, (str, Path)) else "the training model"
        if isinstance(source, mujoco.MjModel):
            compiled = copy.copy(source)  # (options and perturbations edit it)
        elif Path(source).suffix == ".mjb":
            compiled = mujoco.MjModel.from_binary_path(str(source))
        else:
            spec = mujoco.MjSpec.from_file(str(source))
            floor = spec.worldbody.add_geom()
            floor.name, floor.type, floor.size = "legion_floor", mujoco.mjtGeom.mjGEOM_PLANE, [0.0, 0.0, 1.0]
            # The robot's geoms have conaffinity 0 (no self-collision): the floor must have 1 to touch them.
            floor.contype, floor.conaffinity = 1, 1
            floor.friction = [1.0, 0.005, 0.0001]  # Newton's ground: mu, torsional, rolling
            compiled = spec.compile()
        self.model = model = _with_options(compiled, options)
        model.opt.timestep = metadata.physics_dt
        self.data = mujoco.MjData(model)
        self.decimation = int(metadata.decimation)
        self.metadata = metadata

        names = metadata.joint_names
        joint_ids = [find_id(model, mujoco.mjtObj.mjOBJ_JOINT, n, names) for n in names]
        unknown = [n for n, j in zip(names, joint_ids) if j < 0]
        if unknown:
            raise ValueError(f"{where} has no joints {unknown}; the policy was trained on another model.")
        self.qpos_ids = model.jnt_qposadr[joint_ids]
        self.qvel_ids = model.jnt_dofadr[joint_ids]
        # The robot's root: the body below the world that its joints hang from.
        root = model.jnt_bodyid[joint_ids[0]]
        while model.body_parentid[root] != 0:
            root = model.body_parentid[root]
        self.root_body = int(root)
        first = model.body_jntadr[root]
        self.floating = bool(first >= 0 and model.jnt_type[first] == mujoco.mjtJoint.mjJNT_FREE)
        if self.floating and model.jnt_qposadr[first] != 0:
            raise ValueError(f"{where}: the robot's free joint must come first in the model.")
        object_term = next((t for t in metadata.observation.terms if t.func == "object_position"), None)
        self.object_body = None
        if object_body is None and object_term is not None:
            object_body = object_term.params.get("object", "cube")
        if object_body is not None:
            name = object_body
            self.object_body = find_id(model, mujoco.mjtObj.mjOBJ_BODY, name)
            if self.object_body < 0:
                raise ValueError(f"{where} has no body '{name}', the object of the task: use the model "
                                 "Newton trained with (robot.mjb of `legion export`, which holds the whole scene).")
        kp = np.asarray(metadata.joint_stiffness, np.float64)
        kd = np.asarray(metadata.joint_damping, np.float64)
        actuator_of = {int(model.actuator_trnid[a, 0]): a for a in range(model.nu)}
        driven = np.array([j in actuator_of for j in joint_ids])
        self.explicit_pd = not driven.any()
        action_joints = metadata.action.joint_ids
        if self.explicit_pd:  # the PD law (and the motors' clip) as training ran it, before every step
            self.gains = motor_gains(metadata)
            self.motor_clip = MotorClip(*self.gains[2:])
        elif not driven[action_joints].all():
            missing = [names[j] for j in action_joints if not driven[j]]
            raise ValueError(f"{where}: joints {missing} have no actuator; add <position> actuators.")
        else:
            # Joints without an actuator follow others (e.g. a gripper's second finger, coupled by
            # an equality constraint as the URDF's mimic).
            self.driven = driven
            self.actuator_ids = np.array([actuator_of[j] for j, d in zip(joint_ids, driven) if d])
            # PD gains from the policy metadata (what Newton trained with): force = kp (q* - q) - kd q'.
            model.actuator_gainprm[self.actuator_ids, 0] = kp[driven]
            model.actuator_biasprm[self.actuator_ids, 1] = -kp[driven]
            model.actuator_biasprm[self.actuator_ids, 2] = -kd[driven]
        # Actuator networks (model: network) in place of the PD law on their joints (use_networks)
        networks = []
        for index, entry in enumerate(metadata.actuator_networks):
            joints = np.array([j for j, a in enumerate(metadata.actuators) if a.network == index])
            if not self.explicit_pd:
                raise ValueError(f"{where}: joints {[names[j] for j in joints]} are driven by an actuator network "
                                 "and the model by position actuators: use the export's robot.mjb")
            networks.append((joints, ActuatorNetwork.from_contract(entry)))
        self.use_networks(networks)
        channels: dict[str, set[str]] = {}  # per camera, what the policy's image terms read of it
        for image in metadata.observation.images:
            for term in image.terms:
                channels.setdefault(term.params["camera"], set()).add("rgb" if term.func == "rgb_image" else "depth")
        self.cameras = {name: MuJoCoCamera(model, name, metadata.cameras[name], sorted(kinds), where)
                        for name, kinds in channels.items()}
        self.targets = np.asarray(metadata.default_joint_pos, np.float64)
        self.held_base: np.ndarray | None = None  # hang()
        if floor_friction is not None:
            self.set_floor_friction(floor_friction)
        self.reset()

    def set_floor_friction(self, mu: float) -> None:
        """Sliding friction ``mu`` for every contact with a ground plane: the planes get a contact
        priority above every other geom, so their friction is the contact's (MuJoCo otherwise takes
        the larger of the two geoms', and a floor could not be slipperier than the feet)."""
        m = self.model
        planes = m.geom_type == mujoco.mjtGeom.mjGEOM_PLANE
        m.geom_friction[planes, 0] = mu
        m.geom_priority[planes] = m.geom_priority.max() + 1

    def scale_stiffness(self, scale: float) -> None:
        """Every joint's PD stiffness (kp) times ``scale``, as motors weaker or stronger than modelled."""
        if self.explicit_pd:
            self.gains = (self.gains[0] * scale, *self.gains[1:])
        else:
            self.model.actuator_gainprm[self.actuator_ids, 0] *= scale
            self.model.actuator_biasprm[self.actuator_ids, 1] *= scale

    def scale_base_mass(self, scale: float) -> None:
        """The floating base's mass and inertia times ``scale`` (a payload, or a lighter build)."""
        base = self.root_body
        self.model.body_mass[base] *= scale
        self.model.body_inertia[base] *= scale

    def body_contact_force(self, body_ids: list[int]) -> float:
        """Largest contact force norm [N] on any of the given bodies."""
        d, m = self.data, self.model
        force, largest = np.zeros(6), 0.0
        for c in range(d.ncon):
            contact = d.contact[c]
            if m.geom_bodyid[contact.geom1] in body_ids or m.geom_bodyid[contact.geom2] in body_ids:
                mujoco.mj_contactForce(m, d, c, force)
                largest = max(largest, float(np.linalg.norm(force[:3])))
        return largest

    def time(self) -> float:
        """Simulated time [s] (the clock of the state timestamps)."""
        return float(self.data.time)

    def reset(self, base_height: float | None = None, joint_pos=None, object_pose=None) -> None:
        """At rest: a floating base level at ``base_height`` (default: the metadata's), the joints
        at ``joint_pos`` (policy order; default: the default pose), an object at ``object_pose``
        (position [m] and quaternion x y z w, world frame; default: the model's). The targets are
        the default pose."""
        d = self.data
        mujoco.mj_resetData(self.model, d)
        if self.floating:
            d.qpos[0:3] = [0.0, 0.0, base_height or self.metadata.default_root_height or d.qpos[2]]
            d.qpos[3:7] = [1.0, 0.0, 0.0, 0.0]
        d.qpos[self.qpos_ids] = self.metadata.default_joint_pos if joint_pos is None else joint_pos
        if object_pose is not None:
            if self.object_body is None:
                raise ValueError("reset(object_pose=...): the robot has no object; name it (object_body=...)")
            joint = self.model.body_jntadr[self.object_body]
            if joint < 0 or self.model.jnt_type[joint] != mujoco.mjtJoint.mjJNT_FREE:
                raise ValueError("the object has no free joint: its pose cannot be set")
            x, y, z, qx, qy, qz, qw = (float(v) for v in object_pose)
            adr = self.model.jnt_qposadr[joint]
            d.qpos[adr:adr + 7] = [x, y, z, qw, qx, qy, qz]
        self.targets = np.asarray(self.metadata.default_joint_pos, np.float64)
        if not self.explicit_pd:
            d.ctrl[self.actuator_ids] = self.targets[self.driven]
        self._networks_fresh = True  # an actuator network's history starts from the present
        mujoco.mj_forward(self.model, d)

    def read_state(self) -> dict:
        """The robot state the edge runtime reads; a policy that scans the terrain gets the flat
        floor's heights (``height_scan``: -base height at every point)."""
        d = self.data
        # The free joints' coordinates, not xpos/xquat: after mj_step those hold the poses the
        # step started from. A base bolted to the world stays where the model puts it.
        if self.floating:
            base_pos, quat_wxyz = d.qpos[0:3], d.qpos[3:7]
            rot = np.empty(9)
            mujoco.mju_quat2Mat(rot, quat_wxyz)
            rot = rot.reshape(3, 3)
        else:
            root = self.root_body
            base_pos, quat_wxyz, rot = d.xpos[root], d.xquat[root], d.xmat[root].reshape(3, 3)
        base_quat = np.array([quat_wxyz[1], quat_wxyz[2], quat_wxyz[3], quat_wxyz[0]], np.float32)
        state = {
            "joint_pos": d.qpos[self.qpos_ids].astype(np.float32),
            "joint_vel": d.qvel[self.qvel_ids].astype(np.float32),
            "base_pos": base_pos.astype(np.float32),
            "base_quat": base_quat,
            # Free joint: qvel[0:3] is the world-frame linear velocity, qvel[3:6] the angular
            # velocity already in the body frame. A base bolted to the world does not move.
            "base_lin_vel": (rot.T @ d.qvel[0:3] if self.floating else np.zeros(3)).astype(np.float32),
            "base_ang_vel": (d.qvel[3:6] if self.floating else np.zeros(3)).astype(np.float32),
            "timestamp": float(d.time),
        }
        if self.metadata.height_scan is not None:
            state["height_scan"] = np.full(len(self.metadata.height_scan.points), -d.qpos[2], np.float32)
        if self.object_body is not None:  # in the base frame, as a camera calibrated to the robot reports it
            state["object_pos"] = (rot.T @ (self._object_position() - base_pos)).astype(np.float32)
        if self.cameras:
            mujoco.mj_kinematics(self.model, d)  # the bodies' poses of now (mj_step leaves the step's start's)
            for camera in self.cameras.values():
                state.update(camera.render(d))
        return state

    def close(self) -> None:
        """Frees the cameras' renderers (OpenGL contexts)."""
        for camera in self.cameras.values():
            camera.close()

    def _object_position(self) -> np.ndarray:
        joint = self.model.body_jntadr[self.object_body]
        if joint >= 0 and self.model.jnt_type[joint] == mujoco.mjtJoint.mjJNT_FREE:
            adr = self.model.jnt_qposadr[joint]
            return self.data.qpos[adr:adr + 3]
        return self.data.xpos[self.object_body]

    def physics_step(self, q_target=None, kp=None, kd=None, dq_target: ArrayLike = 0.0,
                     tau_ff: ArrayLike = 0.0) -> None:
        """One physics step toward joint targets (policy order; default: the last written), the PD
        gains ``kp``/``kd`` given here (a robot's motor command) or the metadata's."""
        if q_target is not None:
            self.targets = np.asarray(q_target, np.float64)
        d = self.data
        if self.explicit_pd:
            p, v = self.gains[:2]
            q, dq = d.qpos[self.qpos_ids], d.qvel[self.qvel_ids]
            tau = (np.asarray(p if kp is None else kp) * (self.targets - q)
                   + np.asarray(v if kd is None else kd) * (dq_target - dq) + tau_ff)
            tau = self.motor_clip(tau, dq)
            self.network_torques(self.targets, q, dq, tau, self.motor_clip.high, tau_ff)
            d.qfrc_applied[self.qvel_ids] = tau
        else:
            if kp is not None or kd is not None:
                raise ValueError("gains per step need a model driven by explicit PD (no position actuators)")
            d.ctrl[self.actuator_ids] = self.targets[self.driven]
        self.mj_step()

    def use_networks(self, networks: list[tuple[np.ndarray, ActuatorNetwork]]) -> None:
        """From the next physics step on, each actuator network drives its joints (policy indices) in
        place of the PD law (the contract's networks from the start), its history at this model's
        physics rate."""
        step = self.model.opt.timestep
        self.networks = [(joints, network, network.steps(step),
                          np.zeros((2, network.steps(step) * (network.history - 1) + 1, len(joints))))
                         for joints, network in networks]
        self._networks_fresh = True

    def network_torques(self, targets, q, dq, tau: np.ndarray, effort, tau_ff: ArrayLike = 0.0) -> None:
        """Before a physics step: each network's joints' entries of ``tau`` become its torque, from the
        errors ``targets - q`` and velocities of now and its history (as training's
        ``NewtonSim._network_step``), clipped to ``effort``, plus ``tau_ff``."""
        for joints, network, stride, history in self.networks:
            now = np.stack([targets[joints] - q[joints], dq[joints]])[:, None]
            history[:] = now if self._networks_fresh else np.concatenate([now, history[:, :-1]], axis=1)
            torque = network(*history[:, ::stride].transpose(0, 2, 1))
            feedforward = np.broadcast_to(tau_ff, np.shape(q))[joints]
            tau[joints] = np.clip(torque, -effort[joints], effort[joints]) + feedforward
        self._networks_fresh = False

    def hang(self, clearance: float = 0.3) -> None:
        """Holds the floating base still and level ``clearance`` [m] above its standing height (its
        legs in the air: a robot hung from a gantry, as motors are identified), from the next
        physics step on."""
        height = (self.metadata.default_root_height or 0.0) + clearance
        self.held_base = np.array([0.0, 0.0, height, 1.0, 0.0, 0.0, 0.0])
        if self.floating:
            # Held in place at each step, the base would still move within one, and the legs swing
            # against its own inertia, which a payload changes (a payload's Go2 then fitted 1.11x
            # calf kp); on a gantry they swing against the world's: immense on its six DOFs.
            self.model.dof_armature[0:6] = HUNG_BASE_ARMATURE

    def mj_step(self) -> None:
        """One MuJoCo step (the base held where :meth:`hang` put it)."""
        if self.held_base is not None and self.floating:
            self.data.qpos[0:7], self.data.qvel[0:6] = self.held_base, 0.0
        mujoco.mj_step(self.model, self.data)

    def write_targets(self, joint_pos_targets: np.ndarray) -> None:
        """Sets the position targets and advances one control step (``decimation`` physics steps)."""
        self.physics_step(joint_pos_targets)
        for _ in range(self.decimation - 1):
            self.physics_step()


class MuJoCoCamera:
    """A camera of the policy's contract (:class:`~legion.sim2real.deploy.contract.Camera`) drawn by
    MuJoCo's OpenGL renderer: its pose from its body's, its pinhole frustum from the contract's
    field of view, planar depth [m] (0 outside [near, far]) and sRGB colour, as a robot's driver
    reports them (state keys ``<camera>/depth``, ``<camera>/rgb``). Needs an OpenGL that works
    offscreen (``MUJOCO_GL=egl`` or ``osmesa``)."""

    def __init__(self, model: mujoco.MjModel, name: str, camera, channels: list[str], where):
        self.name, self.camera, self.model, self.channels = name, camera, model, channels
        self.body = 0
        if camera.body is not None:
            self.body = find_id(model, mujoco.mjtObj.mjOBJ_BODY, camera.body)
            if self.body < 0:
                raise ValueError(f"{where} has no body '{camera.body}', which camera '{name}' is mounted on.")
        self.mount = np.empty(9)
        x, y, z, w = camera.quat
        mujoco.mju_quat2Mat(self.mount, np.array([w, x, y, z], np.float64))
        self.mount = self.mount.reshape(3, 3)
        self.renderer = mujoco.Renderer(model, camera.height, camera.width)
        self.view = mujoco.MjvCamera()
        self.view.type = mujoco.mjtCamera.mjCAMERA_FREE

    def render(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        """The camera's images in ``data``'s state (its bodies' poses up to date: mj_kinematics)."""
        rot = data.xmat[self.body].reshape(3, 3)
        position = data.xpos[self.body] + rot @ np.asarray(self.camera.pos)
        axes = rot @ self.mount  # the camera's x (forward) and z (up) in the world
        images, renderer = {}, self.renderer
        for channel in self.channels:
            if channel == "depth":
                renderer.enable_depth_rendering()
            renderer.update_scene(data, self.view)
            extent = self.model.stat.extent  # what the renderer's depth conversion assumes
            near, far = self.model.vis.map.znear * extent, self.model.vis.map.zfar * extent
            half = near * np.tan(np.radians(self.camera.fov) / 2)
            for eye in renderer.scene.camera:  # (the two of a stereo pair: both at the one camera)
                eye.pos, eye.forward, eye.up = position, axes[:, 0], axes[:, 2]
                eye.frustum_near, eye.frustum_far, eye.frustum_center = near, far, 0.0
                eye.frustum_bottom, eye.frustum_top = -half, half
                eye.frustum_width = half * self.camera.width / self.camera.height
            image = renderer.render()
            if channel == "depth":
                renderer.disable_depth_rendering()
                image = np.where((image >= self.camera.near) & (image <= self.camera.far), image, 0.0)
                images[f"{self.name}/depth"] = image.astype(np.float32)
            else:
                images[f"{self.name}/rgb"] = image
        return images

    def close(self) -> None:
        self.renderer.close()


def _with_options(model: mujoco.MjModel, options: dict | None) -> mujoco.MjModel:
    """``model`` with MuJoCo ``<option>`` values set by name (enums by their short names)."""
    enums = {"integrator": (mujoco.mjtIntegrator, "mjINT_"), "cone": (mujoco.mjtCone, "mjCONE_"),
             "solver": (mujoco.mjtSolver, "mjSOL_")}
    for key, given in (options or {}).items():
        value = given
        if key in enums:
            enum, prefix = enums[key]
            value = getattr(enum, prefix + str(given).upper(), None)
            if value is None:
                raise ValueError(f"Unknown MuJoCo {key} '{given}'.")
            value = int(value)
        if not hasattr(model.opt, key):
            raise ValueError(f"MuJoCo has no option '{key}' (see mujoco.MjOption).")
        setattr(model.opt, key, value)
    return model
