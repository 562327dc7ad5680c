"""The simulation seam: everything tasks know about physics goes through :class:`NewtonSim`.

A :class:`NewtonSim` builds a scene (:class:`~legion.configs.schema.Scene`: a robot loaded from
MJCF, URDF or USD, free rigid objects, static fixtures, a ground all worlds share), replicates it
into ``num_envs`` independent Newton worlds and steps them together. Tasks read and write state
only through the torch views of its entities (``sim.scene[name]``, ``sim.robot``); they never
touch a Newton object, so a second backend can serve the same tasks by providing the same views.

Modules: :mod:`.scene` (building one world, the entity views), :mod:`.simulation` (the replicated
worlds, the captured step, resets, parameter publishing), :mod:`.terrain` (generated terrain:
heights, tiles, lookup), :mod:`.solver` (what differs between SolverMuJoCo and XPBD, and
between MuJoCo Warp and MuJoCo's C library stepping SolverMuJoCo (``sim.backend``); the one user
of Newton's and MuJoCo Warp's private names).

Conventions: every view is a float32 torch tensor on ``device`` sharing memory with Newton,
shaped (num_envs, ...). A name's suffix is its frame: ``_w`` world, ``_b`` the entity's root (body)
frame. Quaternions are (x, y, z, w).

- Robot joints (:class:`Articulation`): ``joint_pos`` / ``joint_vel`` (num_envs, num_joints)
  [rad or m, rad/s or m/s], actuated joints only, in the model's order (``joint_names``);
  ``joint_pos_target`` (position-PD targets), ``joint_effort`` [N or N m] (feed-forward forces).
- Roots (robot with a floating base, rigid objects): ``root_pos_w`` (num_envs, 3) [m],
  ``root_quat_w`` (num_envs, 4), ``root_lin_vel_w`` / ``root_ang_vel_w`` (num_envs, 3) [m/s, rad/s]
  (linear velocity of the root body's centre of mass), ``root_pose_w`` (7) and ``root_vel_w`` (6)
  covering both; ``root_lin_vel_b``, ``root_ang_vel_b`` and ``projected_gravity_b`` (unit gravity)
  computed in the root frame, and ``root_link_lin_vel_b``, the velocity of the root frame's origin
  (a state estimator's; the edge runtime's ``base_lin_vel``); ``root_wrench_w`` (num_envs, 6)
  [N, N m] an external force and torque.
  ``None`` for a fixed base.
- Bodies: ``body_pos_w`` (num_envs, num_bodies, 3) [m], ``body_quat_w`` (num_envs, num_bodies, 4),
  ``body_lin_vel_w`` / ``body_ang_vel_w`` (num_envs, num_bodies, 3) [m/s, rad/s] (linear velocity
  of each body's centre of mass),
  ``contact_forces_w`` (num_envs, num_bodies, 3) [N]: the net contact force on each body at the
  last physics step of the control step (``task.scene.contact_sensing``; sim=mujoco only).
- The whole world: ``sim.joint_q`` / ``sim.joint_qd`` (num_envs, coordinates / DoFs of a world),
  every entity's generalized coordinates and velocities, for recording and exact replay.

Per-env physical parameters (writable views of the per-world slices of Newton's model arrays;
each entity's values at construction are in ``entity.defaults[name]``):

- ``shape_friction`` / ``shape_restitution`` (num_envs, num_shapes): sliding friction coefficient
  and coefficient of restitution [0, 1) of each shape (``shape_body`` maps a shape to its body).
  A world's shapes take MuJoCo contact priority over the shared ground, so a contact uses the
  entity's own friction and softness (see :class:`.solver.MuJoCo`).
- ``shape_size`` (num_envs, num_shapes, 3) [m]: each primitive shape's size as Newton keeps it:
  box (half-extents x, y, z), sphere (radius, -, -), capsule and cylinder (radius, half-length, -).
  Collision follows a change; mass and inertia do not (the ``size_scale`` event scales inertia too).
- ``body_mass`` (num_envs, num_bodies) [kg], ``body_com`` (num_envs, num_bodies, 3) [m] in the
  body frame, ``body_inertia`` (num_envs, num_bodies, 3, 3) [kg m^2] about the COM, body frame.
- Robot joints: ``joint_stiffness`` / ``joint_damping`` (num_envs, num_joints) [N m/rad, N m s/rad]
  (PD gains); ``joint_effort_limit`` [N m] (clamps the PD torque; ``effort_limits`` (num_joints,)
  keeps the model's); ``joint_friction`` [N m] (dry friction loss: MuJoCo adds a constraint row
  per joint, ~15% slower stepping); ``joint_armature`` [kg m^2] (rotor inertia).
- ``sim.gravity`` (num_envs, 3) [m/s^2], world frame.

The ground (``scene.ground``): a plane at z = 0, or a generated terrain all worlds share
(``scene.ground.terrain``; :mod:`.terrain`), one heightfield in MuJoCo's collision.
``sim.terrain`` holds its heights and tile origins on the device; ``sim.ground_height(xy)`` gives
the ground's height [m] under world points (..., 2) for either.

Solver limits: ``sim.solver_limits`` (len(SOLVER_LIMITS),) int32 counts, per control step, the
worlds in which the solver stopped short: ``limit`` (either of the next two), ``linesearch_limit``
(a linesearch ran ``ls_iterations`` without converging), ``iteration_limit`` (the solver ran
``iterations``), ``overflow`` (contacts or constraint rows beyond MuJoCo's capacity were dropped).
Each :meth:`NewtonSim.step` overwrites them on the device, inside the captured graph: no host sync;
read them after a step. MuJoCo Warp's own prints of these events are off. MuJoCo's C library
(``backend="c"``) counts only ``overflow`` (its arena ran out); XPBD counts nothing (zeros).

Protocols: after writing parameters, name them with :meth:`NewtonSim.params_changed`; the next
:meth:`NewtonSim.step` hands them to the solver (no rebuild, no recompile; the captured graph
replays with the new values). After writing the state of some worlds, call
:meth:`NewtonSim.reset` with their indices.
"""

from legion.tasks.sim.scene import Articulation, Entity, Fixture, RigidObject, resolve_asset
from legion.tasks.sim.simulation import NewtonSim
from legion.tasks.sim.solver import PARAM_FLAGS, SOLVER_LIMITS

__all__ = ["Articulation", "Entity", "Fixture", "NewtonSim", "PARAM_FLAGS", "RigidObject", "SOLVER_LIMITS",
           "resolve_asset"]
