"""A :class:`~legion.sim2real.deploy.loop.RobotInterface` on the plain ``mujoco`` C engine: one robot, on a floor.

Needs ``pip install mujoco`` besides the deploy extra. It loads the robot's own MJCF (the file
Newton trained on) and adds a floor plane, then mirrors the training setup from the policy
metadata: physics dt, decimation, PD gains (written into the MJCF position actuators), the
default pose and base height. Newton ignores MJCF keyframes; so does this class. The solver
options stay the MJCF's own (MuJoCo's defaults where it sets none) unless ``options`` names them.
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np


class MuJoCoRobot:
    """One floating-base robot in MuJoCo, driven through position actuators.

    Args:
        model_path: the robot MJCF (e.g. ``tasks/assets/quadruped.xml``); every policy joint
            needs a ``<position>`` actuator.
        metadata: the exported policy's metadata (``PolicyRunner.metadata``).
        floor_friction: sliding friction of the floor (MuJoCo takes the max of the two geoms).
        options: MuJoCo ``<option>`` values to set, e.g. ``{"integrator": "implicitfast",
            "iterations": 10, "ls_iterations": 10}`` (Newton SolverMuJoCo's defaults are
            implicitfast, pyramidal cone, Newton solver).
    """

    def __init__(self, model_path: str | Path, metadata: dict, floor_friction: float = 1.0,
                 options: dict | None = None):
        spec = mujoco.MjSpec.from_file(str(model_path))
        floor = spec.worldbody.add_geom()
        floor.name, floor.type, floor.size = "legion_floor", mujoco.mjtGeom.mjGEOM_PLANE, [0.0, 0.0, 1.0]
        # The robot's geoms have conaffinity 0 (no self-collision): the floor must have 1 to touch them.
        floor.contype, floor.conaffinity = 1, 1
        floor.friction = [floor_friction, 0.005, 0.0001]  # Newton's ground: mu, torsional, rolling
        spec.option.timestep = metadata["physics_dt"]
        enums = {"integrator": (mujoco.mjtIntegrator, "mjINT_"), "cone": (mujoco.mjtCone, "mjCONE_"),
                 "solver": (mujoco.mjtSolver, "mjSOL_")}
        for key, given in (options or {}).items():
            value = given
            if key in enums:
                enum, prefix = enums[key]
                value = getattr(enum, prefix + str(given).upper(), None)
                if value is None:
                    raise ValueError(f"Unknown MuJoCo {key} '{given}'.")
            if not hasattr(spec.option, key):
                raise ValueError(f"MuJoCo has no option '{key}' (see mujoco.MjOption).")
            setattr(spec.option, key, value)
        self.model = model = spec.compile()
        self.data = mujoco.MjData(model)
        self.decimation = int(metadata["decimation"])
        self.metadata = metadata

        names = metadata["joint_names"]
        if model.jnt_type[0] != mujoco.mjtJoint.mjJNT_FREE:
            raise ValueError(f"{model_path}: MuJoCoRobot needs a floating base (a free joint first).")
        joint_ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in names]
        unknown = [n for n, j in zip(names, joint_ids) if j < 0]
        if unknown:
            raise ValueError(f"{model_path} has no joints {unknown}; the policy was trained on another model.")
        self.qpos_ids = model.jnt_qposadr[joint_ids]
        self.qvel_ids = model.jnt_dofadr[joint_ids]
        actuator_of = {int(model.actuator_trnid[a, 0]): a for a in range(model.nu)}
        missing = [n for n, j in zip(names, joint_ids) if j not in actuator_of]
        if missing:
            raise ValueError(f"{model_path}: joints {missing} have no actuator; add <position> actuators.")
        self.actuator_ids = np.array([actuator_of[j] for j in joint_ids])
        # PD gains from the policy metadata (what Newton trained with): force = kp (q* - q) - kd q'.
        kp = np.asarray(metadata["joint_stiffness"], np.float64)
        kd = np.asarray(metadata["joint_damping"], np.float64)
        model.actuator_gainprm[self.actuator_ids, 0] = kp
        model.actuator_biasprm[self.actuator_ids, 1] = -kp
        model.actuator_biasprm[self.actuator_ids, 2] = -kd
        self.reset()

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

    def reset(self, base_height: float | None = None) -> None:
        """Base level at ``base_height`` (default: the metadata's), joints at the default pose, at rest."""
        d = self.data
        mujoco.mj_resetData(self.model, d)
        d.qpos[0:3] = [0.0, 0.0, base_height or self.metadata.get("default_root_height") or d.qpos[2]]
        d.qpos[3:7] = [1.0, 0.0, 0.0, 0.0]
        d.qpos[self.qpos_ids] = self.metadata["default_joint_pos"]
        d.ctrl[self.actuator_ids] = self.metadata["default_joint_pos"]
        mujoco.mj_forward(self.model, d)

    def read_state(self) -> dict:
        """The robot state the edge runtime reads; a policy that scans the terrain gets the flat
        floor's heights (``height_scan``: -base height at every point)."""
        d = self.data
        quat_wxyz = d.qpos[3:7]
        base_quat = np.array([quat_wxyz[1], quat_wxyz[2], quat_wxyz[3], quat_wxyz[0]], np.float32)
        rot = np.empty(9)
        mujoco.mju_quat2Mat(rot, quat_wxyz)
        state = {
            "joint_pos": d.qpos[self.qpos_ids].astype(np.float32),
            "joint_vel": d.qvel[self.qvel_ids].astype(np.float32),
            "base_pos": d.qpos[0:3].astype(np.float32),
            "base_quat": base_quat,
            # Free joint: qvel[0:3] is the world-frame linear velocity, qvel[3:6] the angular
            # velocity already in the body frame.
            "base_lin_vel": (rot.reshape(3, 3).T @ d.qvel[0:3]).astype(np.float32),
            "base_ang_vel": d.qvel[3:6].astype(np.float32),
            "timestamp": float(d.time),
        }
        if self.metadata.get("height_scan"):
            state["height_scan"] = np.full(len(self.metadata["height_scan"]["points"]), -d.qpos[2], np.float32)
        return state

    def write_targets(self, joint_pos_targets: np.ndarray) -> None:
        """Sets the position targets and advances one control step (``decimation`` physics steps)."""
        self.data.ctrl[self.actuator_ids] = joint_pos_targets
        for _ in range(self.decimation):
            mujoco.mj_step(self.model, self.data)
