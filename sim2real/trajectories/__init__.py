"""Trajectories: record a policy's episodes, replay them exactly, render them, make datasets of them.

One HDF5 format, robomimic's layout, for simulator recordings (``legion record``, ``legion play
record=``) and for robot logs (the edge runtime's ``.npz`` episodes, converted). Arrays are
float32 unless noted, first axis time (T steps of the control dt):

    /data                         attrs: total (samples), env_args (JSON), source ("sim" | "robot"),
                                  config (the resolved config, YAML), task, seed, device, control_dt,
                                  robot_file, robot_sha256 (the model file's hash), joint_names,
                                  action, observation_layout, checkpoint, checkpoint_sha256,
                                  versions (legion-rl, newton, warp, mujoco-warp, torch, ...),
                                  format_version, complete
    /data/demo_<k>/               attrs: num_samples, env_index, time_out, return
        actions        (T, A)     the policy's output, as given to env.step
        targets        (T, J_a)   the joint command the action term applied (after any actuator
                                  delay): position targets [rad or m], or efforts [N or N m]
        commands       (T, 3)     the command the policy was given (tasks with a command)
        rewards        (T,)       and reward_terms/<term> (T,): each term times weight and dt
        dones          (T,) uint8 1 on the last step
        obs/<group>/<term>        (T, size) each observation term as the policy saw it
        states/<entity>/<view>    (T, ...) the state each step started from (what obs[t] saw):
                                  root_pose_w (7: position [m], quaternion x, y, z, w),
                                  root_vel_w (6: linear [m/s], angular [rad/s], world frame),
                                  joint_pos, joint_vel [rad or m, rad/s or m/s]
        next_states/<entity>/<view>  the state right after step t's physics, before a reset or an
                                  interval event (a push) wrote it: the target of an exact replay
        initial_state/<entity>/<view>  = states[0]
        params/<entity>/<name>    the per-env physical parameters the episode ran with (friction,
                                  masses, COM, inertia, PD gains, ...), params/gravity (3,),
                                  params/action_delay () [control steps], params/command_latency ()
                                  [physics steps] where the task draws one
        timing/...                robot logs: timestamp, tick_time, latency [s], mode (0 policy,
                                  1 hold, 2 stop)

Robot logs hold states, targets, actions, obs, commands and timing; no rewards, next_states or
params (the robot's physics is what it is).

Modules: :mod:`.file` (writing and checked reading), :mod:`.record` (from the simulator and from
robot logs), :mod:`.replay` (``mode=actions|states``, divergence), :mod:`.media` (MP4 through
MuJoCo's offscreen renderer, PNG plots), :mod:`.lerobot` (LeRobot v3 datasets).
"""

from legion.sim2real.trajectories.file import Episode, TrajectoryFile, TrajectoryFileError, TrajectoryWriter

__all__ = ["Episode", "TrajectoryFile", "TrajectoryFileError", "TrajectoryWriter"]
