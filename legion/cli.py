"""`legion`: the one command line. It parses arguments and calls the commands (:mod:`legion.commands`,
:mod:`legion.evaluation`, :mod:`legion.sim2real`); nothing imports this module.

Every command takes Hydra's overrides (``key=value``, ``+key=value``, ``~key``) besides its own
``option=value``s. Bad arguments fail before anything is built, with one line per problem and
exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TypeVar

USAGE = """usage: legion <command> [key=value ...]

commands:
  train          train a policy          legion train task=quadruped_flat sim.num_envs=256
                 a Hydra multirun        legion train -m seed=0,1,2
                 resume a run            legion train resume=runs/cartpole/<date> [checkpoint=FILE]
                 K processes (torchrun)  legion train --nproc K task=quadruped_flat
  play           run a trained policy    legion play run=runs/cartpole/<date> [episodes=5] [record=FILE] [video=true]
                 watch it in a browser   legion play run=runs/quadruped_flat/<date> viewer=web
  eval           measure a policy        legion eval run=runs/quadruped_flat/<date> [commands=forward,stand]
  record         record episodes (HDF5)  legion record run=runs/cartpole/<date> episodes=10 out=demos.h5
  replay         replay a recording      legion replay demos.h5 [mode=actions|states] [video=true] [plots=true]
                                         [viewer=web] [html=true]
  dataset        convert recordings      legion dataset convert demos.h5 format=lerobot out=DIR
  randomization  what each env draws     legion randomization task=quadruped_flat
  export         export to ONNX          legion export run=runs/quadruped_flat/<date> [out=DIR]
  sim2sim        MuJoCo next to Newton   legion sim2sim run=runs/quadruped_flat/<date>
  robot          check a robot file      legion robot inspect my_robot.urdf [out=DIR] [robot=NAME]
  bridge         a simulated Unitree     legion bridge run=runs/quadruped_flat/<date> robot=go2
                 robot on its DDS topics
  deploy         a policy on a Unitree   legion deploy run=<run or exported folder> robot=go2 interface=eth0
                 robot over DDS

`legion <command> --help` explains a command. Tasks: {tasks}
"""

RESUME_HELP = """usage: legion train resume=<run folder> [checkpoint=FILE] [key=value ...]

Continues a run in its own folder from its newest good checkpoint (a damaged newer one is
skipped with a warning) or from checkpoint=FILE, with the run's saved config.yaml and any
overrides on top (e.g. agent.max_iterations=null). Networks, normalizers, optimizer, learning
rate, iteration, randomization ranges and random generators continue where they stopped.
"""

PLAY_HELP = """usage: legion play run=<run folder> [episodes=N] [checkpoint=PATH] [record=FILE]
                   [video=true] [viewer=web [host=127.0.0.1] [port=8080]] [key=value ...]

Loads the run's saved config.yaml and its newest good checkpoint (or `checkpoint=`), runs the
policy deterministically with observation noise off, and prints the return and length of each
finished episode. Any config key can be overridden, e.g. sim.num_envs=4 device=cpu (default
sim.num_envs: 16, or the run's if fewer).

  record=FILE      also record the episodes into a trajectory file (as `legion record`)
  video=true       render each episode to <run>/videos/<date>/demo_<k>.mp4 (MuJoCo offscreen,
                   camera tracking the robot; needs EGL or OSMesa, see the README)
  overwrite=true   replace an existing record= file or video folder
  viewer=web       a live 3-D view in the browser at http://<host>:<port> (printed; runs until
                   Ctrl-C): pause, step, speed; the env the camera follows; the command (sliders, a
                   draggable goal for arm tasks); observation noise, randomization at resets; reset
                   the followed env; reload the newest checkpoint of a run still training
  host=ADDR        where the viewer listens (default 127.0.0.1, this machine only; 0.0.0.0: all)
  port=N           the viewer's port (default 8080)
"""

RECORD_HELP = """usage: legion record run=<run folder> [episodes=10] [out=FILE.h5] [checkpoint=PATH]
                     [video=true] [key=value ...]
       legion record policy=scripted:<module>:<function> task=<task> [episodes=10] [out=FILE.h5] [key=value ...]

Runs the run's policy (deterministic, observation noise off) and records the first `episodes`
episodes to start (short failed episodes are not favoured) into an HDF5 trajectory file in
robomimic's layout (default out: <run>/trajectories/<date>.h5): per step the actions, the
applied joint targets, every observation term, rewards per term, dones, and the state (joint
positions and velocities, root and object poses and velocities); per episode the initial state
and the physical parameters it ran with; the resolved config, seed, robot model hash and versions.
`legion replay` reproduces it bit for bit on CPU.

  episodes=N       how many episodes (default 10); sim.num_envs defaults to min(N, 16)
  video=true       also render each episode to <out stem>_videos/demo_<k>.mp4
  overwrite=true   replace an existing file (never replaced otherwise)
  policy=scripted:<module>:<function>
                   record a scripted policy instead of a run's: <function>(env) returns it, e.g. the
                   arm_lift expert: policy=scripted:legion.tasks.manipulation.expert:lift task=arm_lift_ik
                   (default out: trajectories/<task>_<date>.h5)
Config keys can be overridden as in `legion play` (e.g. task.events.push.enabled=false).
"""

REPLAY_HELP = """usage: legion replay <file.h5> [mode=actions|states] [episodes=0,2] [video=true] [plots=true]
                     [viewer=web] [html=true] [out=DIR] [device=DEV]

Replays the episodes of a trajectory file (all, or episodes=i,j,...) in the simulator, each in its
own world, and prints how far the replay is from the file.

  mode=actions     (default) a recording: reset to its initial state and physical parameters
                   (friction, masses, gains, gravity, actuator delay), apply the recorded actions
                   (and pushes), compare every state; bit-exact on CPU with the same versions,
                   the divergence is reported otherwise (e.g. on a GPU: device=cuda:0).
                   A robot log (legion dataset convert ... format=hdf5): drive the simulator with
                   the logged joint targets from the logged initial state; error per joint.
  mode=states      set the recorded states frame by frame (viewing)
  video=true       an MP4 per episode of the replayed motion (camera tracking the robot)
  plots=true       PNGs per episode: joint positions vs targets, commanded vs actual base
                   velocity, reward terms; robot logs: simulated vs logged, error per joint
  viewer=web       watch the replay live in the browser (as legion play viewer=web; host=, port=),
                   at real time; the view stays open on the last frame until Ctrl-C
  html=true        <out>/replay.html: the first replayed episode as one self-contained HTML file
                   that opens from disk in a browser, no server (timeline, orbit, zoom)
  out=DIR          where video, plots, replay.html and replay.json go (default <file>_replay/)
  overwrite=true   write into an existing, non-empty out folder
"""

DATASET_HELP = """usage: legion dataset convert <input> format=lerobot|hdf5 [out=PATH] [run=<run folder>] [video=true]

  format=lerobot   <input> is a trajectory file (.h5): write a LeRobot v3.0 dataset folder
                   (default out: <file stem>_lerobot/): meta/info.json, meta/stats.json,
                   meta/tasks.parquet, meta/episodes/..., data/chunk-000/file-000.parquet;
                   video=true renders the episodes into videos/observation.images.tracking/...mp4
  format=hdf5      <input> is a robot log (a folder of episode_*.npz written by the edge runtime's
                   TrajectoryLog, or one file): write a trajectory file (default out:
                   <input>.h5). run= names the run the robot's policy was exported from (its
                   config hash is checked); `legion replay` then drives the simulator with it.
  overwrite=true   replace an existing output (never replaced otherwise)
"""

EVAL_HELP = """usage: legion eval run=<run folder> [checkpoint=PATH] [commands=...] [envs=16] [duration_s=10]
                   [settle_s=1] [episodes=100] [randomization=trained|off] [out=DIR] [key=value ...]

Measures the run's newest good checkpoint (or `checkpoint=`): the policy acts deterministically
(observation noise off) for duration_s seconds on `envs` envs per command, each env one episode
from a fresh reset, and the metrics are printed as a table and written to DIR (default
<run>/eval/) as <checkpoint>.json and <checkpoint>.png (commanded vs actual velocity over time).

Locomotion (velocity-command tasks), per command, over the steps after settle_s before any fall:
  vel_error_xy       mean |v_xy,cmd - v_xy| [m/s], base frame (none: every env of the command fell first)
  yaw_rate_error     mean |yaw rate_cmd - yaw rate| [rad/s]
  lateral_drift      mean v_y - v_y,cmd [m/s], signed (+: to the left): the gait's left-right bias
  fall_rate          share of envs whose episode ended in a failure (a termination term)
  survival_s         mean time to that failure (duration_s if none) [s]
  terrain_level      mean terrain level of the envs (rough terrain: the levels the training
                     curriculum reached, saved in the checkpoint; frozen while evaluating)
  power_w            mean mechanical power, sum over joints of |torque x joint velocity| [W]
  cost_of_transport  energy / (mass x g x distance walked); - for commands without linear velocity

  commands=forward,backward,lateral,yaw,stand       (the default; names from this set)
    forward (1, 0, 0)  backward (-0.5, 0, 0)  lateral (0, 0.5, 0)  yaw (0, 0, 1)  stand (0, 0, 0)
  commands='{"fast": [1.5, 0, 0], "turn": [0.5, 0, 0.5]}'   your own, as JSON: name -> [v_x, v_y, yaw rate]
  Commands outside the task's command ranges are clamped to them (marked * in the table).

Goal tasks (pose or position commands: arm_reach, arm_lift), over `episodes` whole episodes run
on `envs` envs, the task's own commands (commands= and duration_s= do not apply):
  success_rate                 share of episodes that met task.success (e.g. within 2 cm and
                               0.1 rad, held 0.5 s)
  time_to_success_s            mean episode time at which that hold was complete (successes only)
  final_position_error_m       mean distance of the commanded body from its goal at the end [m]
  final_orientation_error_rad  the same for orientation (pose commands) [rad]
  and each reward term per second of episode, as TensorBoard's Episode_Reward/<term> (for arm_lift
  the stages the policy reaches: grasp, lift, bring), and per axis of the base frame the mean final
  error and how far the final position follows the goal (the slope of one on the other: 1 ends at
  the goal, 0 ignores it). The PNG shows each episode's final error and the times to success.
  randomization=trained  every event term as the run configures it (pushes, friction, ...; default)
  randomization=off      none: default pose, level, at rest, the model's own physical parameters

Works for runs trained on any device (a run trained on a GPU runs on the CPU where there is no
CUDA). Config keys can be overridden as in `legion play`.
"""

RANDOMIZATION_HELP = """usage: legion randomization [task=NAME] [key=value ...]

Builds a fresh env of the task (sim.num_envs defaults to 64 here) and prints each event term of
task.events (mode, distribution, configured and current range, and the min / mean / max of
the values drawn across the envs), then the per-env physical parameters that differ from the
model (min / mean / max over envs). Overrides as for `legion train`, e.g.
  legion randomization task=quadruped_flat sim.num_envs=256 task.events.stiffness.enabled=true
"""

EXPORT_HELP = """usage: legion export run=<run folder> [checkpoint=PATH] [out=DIR] [steps=N] [key=value ...]

Exports the run's newest good checkpoint (or `checkpoint=`) to DIR (default <run>/exported/):
policy.onnx (fp32, opset 17, dynamic batch, normalizer folded in), policy_fp16.onnx and
policy.json (joint order, default pose, action scale/offset, PD gains, effort and joint limits,
control dt, observation layout, height-scan points, command and randomization ranges,
tracking terms, fall conditions, config hash, version).

Every export is verified and the command fails if a check fails: onnx.checker; onnxruntime
vs torch on observations from `steps` (default 50) policy steps in the task's env (max abs
difference <= 1e-5 fp32, <= 1e-2 fp16); operators TensorRT's ONNX parser supports.
Config keys can be overridden as in `legion play` (Hydra's grammar: key=value, +key=value, ~key).
"""

SIM2SIM_HELP = """usage: legion sim2sim run=<run folder> [duration_s=10] [commands=JSON] [realtime=false]
                      [key=value ...]

Exports the run's policy (as `legion export`, into <run>/exported/ unless onnx=PATH names an
existing policy.onnx), then drives the robot with it in Newton and in plain MuJoCo (the edge
runtime's control loop on the MuJoCo robot, loading the same robot MJCF plus a floor), one
episode of duration_s per velocity command, and prints the metrics side by side: tracking
error of (v_x, v_y) and yaw rate, falls, survival time, tracking return.

  commands=[[0.5,0,0],[1,0,0],[0,0.5,0],[0,0,1],[0,0,0]]   (v_x [m/s], v_y [m/s], yaw rate [rad/s])
  physics=mjcf       MuJoCo as the robot file configures it (default: Euler, 100 solver iterations)
  physics=matched    Newton SolverMuJoCo's setup of the training run (implicitfast, its iterations):
                     then the two columns agree to ~1e-6 and check the export and the runtime end to end
  realtime=true      pace the MuJoCo loop at the control rate (deadline stats then mean wall time)
  json=PATH          also write the table as JSON
  robustness=true    also run the MuJoCo robot under each condition of sim2sim.ROBUSTNESS, alone and
                     combined: floor friction 0.25 and 0.4, base mass +-20%, kp -20%, actuator
                     latency 20 and 40 ms, sensor noise (legged_gym's), pushes of 0.5 m/s every 3 s;
                     one line each: falls and tracking error

A goal task (a position command: arm_lift) compares episodes instead: episodes=50 envs with the
task's reset randomization (object place, joint offsets; its size, mass and friction nominal),
each MuJoCo episode started from its Newton env's joints and object pose, holding its goal, on
Newton's model of the scene (robot.mjb); success as the task's (the object within its threshold
of the goal for hold_s), time to success and final distance per engine.

  episodes=50        goal tasks: the number of episodes
"""

ROBOT_HELP = """usage: legion robot inspect <file> [out=DIR] [robot=NAME|FILE.yaml] [overwrite=true]

Loads a robot model (MJCF .xml, URDF, USD; a path, a file name in tasks/assets, or
package://<package>/<path>) as training loads it, and prints its joints (type, limits, effort and
velocity limits, PD gains, armature, friction), Newton's drive of each DoF (and an MJCF's own
actuators), bodies (mass, inertia), collision shapes (mesh vertex counts), total mass, DoF and base.
Then one line per problem that keeps a policy from training, with the fix: a legged robot on a
fixed base, actuated joints without PD gains, no actuators, mesh colliders of thousands of vertices,
a configured root_height that starts the robot inside the ground.

  out=DIR          where <name>.png (the robot in its default pose, MuJoCo offscreen) and
                   <name>.yaml go (default: <name>_inspect/); the YAML is a starting robot config
                   (configs/robot/*.yaml's format: floating base, root height, default pose, body
                   groups, collision simplification, actuators; placeholders marked TODO)
  robot=NAME       apply configs/robot/NAME.yaml (or a robot YAML file, e.g. the one written here)
                   as training does, and report on the result: the check that its settings fix the
                   warnings; <file> may be left out (the config's file). No YAML is written.
  overwrite=true   replace an existing <name>.yaml (never replaced otherwise: it may hold your edits)
--out DIR and --robot NAME work too.
"""

BRIDGE_HELP = """usage: legion bridge run=<run or exported folder> robot=go2|g1 [domain=0] [interface=lo]
                     [rate=500] [duration_s=SECONDS] [faults=silent,bad_crc,nan]

Simulates the robot in plain MuJoCo (the export's robot.mjb: the model the policy trained on) and
speaks the robot's own DDS topics, as Unitree's low-level interface does: publishes rt/lowstate
(IMU, motors, foot forces) and rt/sportmodestate (position and velocity, world frame), applies
rt/lowcmd (per motor: q, dq, kp, kd, tau; CRC checked, bad ones dropped) at `rate` Hz, in real
time. The robot stands still in its default pose until the first LowCmd arrives. Run `legion
deploy ... interface=lo` against it, exactly as against the robot. A status line every second.

  domain=0          DDS domain (Unitree's robots use 0; unitree_mujoco uses 1)
  interface=lo      network interface: lo keeps everything on this computer
  rate=500          robot rate [Hz]: LowState publishing and physics step
  duration_s=       stop after this long (default: until Ctrl-C)
  faults=           fault drills for a controller's safety layer: silent (stop publishing), bad_crc
                    (LowStates with a wrong CRC), nan (a NaN joint position)
"""

DEPLOY_HELP = """usage: legion deploy run=<run or exported folder> robot=go2|g1 [interface=NAME] [domain=0]
                     [command=[vx,vy,wz]] [duration_s=SECONDS] [confirm=true] [stand_s=2] [hold_s=1]
                     [log=DIR]

Runs an exported policy on a Unitree robot over DDS (rt/lowstate in, rt/lowcmd out), with the
edge runtime only (numpy, onnxruntime, cyclonedds: pip install 'legion-rl[unitree]'; no torch).
The policy's joint names are checked against the robot's motor map at start (refused, naming
the joints, if they differ), and nothing is sent before a fresh, valid LowState arrives.

Phases: damping (kp = 0) until Enter; stand up to the default pose over stand_s; hold it until
Enter; then the policy with the control loop's safety layer (stale state: hold the last targets,
then stop; bad CRC or NaN: stop; targets clamped to the joint limits and in rate) and a status
line every second. Any stop, and Ctrl-C, sends damping (kp = 0, kd > 0) before exiting.

  interface=NAME    the network interface the robot is on (e.g. eth0), lo for `legion bridge`
                    on this computer; default: CycloneDDS chooses
  domain=0          DDS domain
  command=[0,0,0]   velocity command (v_x [m/s], v_y [m/s], yaw rate [rad/s]), held
  duration_s=       policy phase length (default: until Ctrl-C)
  confirm=false     no Enter prompts (the simulated robot, scripted runs)
  stand_s, hold_s   stand-up ramp and hold [s]
  log=DIR           the policy phase as a TrajectoryLog episode (legion dataset convert takes it)
"""

# What `pip install "legion-rl[train]"` adds to the base (edge runtime) install.
TRAINING_STACK = {"torch", "warp", "newton", "mujoco", "mujoco_warp", "rsl_rl", "hydra", "omegaconf", "tensordict",
                  "tensorboard", "onnx", "h5py", "imageio", "pyarrow", "matplotlib"}


Number = TypeVar("Number", int, float)


class UsageError(Exception):
    """Bad arguments: printed as one message, exit code 2."""


def _fail(command: str, message: str) -> None:
    print(f"legion {command}: {message}", file=sys.stderr)
    sys.exit(2)


def parse_run_args(args: list[str], help_text: str, options: dict) -> tuple[Path, dict, list[str]]:
    """Splits ``run=<folder>``, this command's ``options`` (name -> default) and config overrides."""
    bad = [a for a in args if "=" not in a and not a.startswith("~")]
    run = [a.split("=", 1)[1] for a in args if a.startswith("run=")]
    if bad or len(run) != 1:
        raise UsageError(f"expected run=<run folder> and key=value options, got {' '.join(args) or 'nothing'}"
                         f"\n\n{help_text}")
    chosen, overrides = dict(options), []
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "run":
            continue
        if key in options:
            chosen[key] = value
        else:
            overrides.append(arg)
    return Path(run[0]), chosen, overrides


def _number(name: str, value: str, kind: type[Number] = int) -> Number:
    try:
        return kind(value)
    except ValueError:
        raise UsageError(f"{name}={value}: expected a{'n integer' if kind is int else ' number'}") from None


# --- commands ---------------------------------------------------------------------------------
def train(args: list[str]) -> None:
    from legion import commands, configs

    if "--nproc" in args:  # a shortcut for torchrun on this machine
        at = args.index("--nproc")
        if at + 1 >= len(args) or not args[at + 1].isdigit() or int(args[at + 1]) < 1:
            raise UsageError("--nproc K: K processes (ranks) on this machine, K >= 1")
        nproc, rest = args[at + 1], args[:at] + args[at + 2:]
        os.execvp(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   f"--nproc_per_node={nproc}", "-m", "legion", "train", *rest])
    if any(a.startswith("resume=") for a in args):
        if any(a in ("-h", "--help") for a in args):
            print(RESUME_HELP)
            return
        run_args = [f"run={a.split('=', 1)[1]}" if a.startswith("resume=") else a for a in args]
        run, options, overrides = parse_run_args(run_args, RESUME_HELP, {"checkpoint": None})
        commands.train(configs.load_run_config(run, overrides), run, resume=True, checkpoint=options["checkpoint"])
        return
    multirun = any(a in ("-m", "--multirun") for a in args)
    rank = int(os.environ.get("RANK", "0"))
    if rank > 0 and multirun:
        raise UsageError("a Hydra multirun cannot run under torchrun; sweep the distributed runs one by one.")
    if multirun or any(a.startswith("-") for a in args):  # a sweep, or Hydra's own flags (--help, --cfg job, ...)
        _hydra_train(args)
        return
    cfg, run_dir = configs.compose_run(*args)  # one run: composed once, Hydra's folder name included
    if rank > 0:  # torchrun's other ranks: rank 0 alone writes the run folder
        run_dir = Path(tempfile.gettempdir()) / f"legion-rank{rank}-{os.getpid()}"
    commands.train(cfg, run_dir)


def _hydra_train(args: list[str]) -> None:
    """A Hydra job per run (a ``-m`` sweep, or Hydra's flags): each job's config typed once."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from legion import commands, configs

    def job(cfg) -> None:  # Hydra reports a job's errors its own way: report ours as main() does first
        _run("train", lambda: commands.train(configs.typed(cfg), Path(HydraConfig.get().runtime.output_dir)))

    configs.schema.register()
    main = hydra.main(config_path=str(configs.CONFIG_DIR), config_name="train", version_base="1.3")(job)
    sys.argv = ["legion train", *args]
    main()


def _viewer(options: dict) -> bool:
    if options["viewer"] not in ("none", "web"):
        raise UsageError(f"viewer={options['viewer']}: the viewer is viewer=web (a live view in the browser).")
    return options["viewer"] == "web"


def _flag(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise UsageError(f"{name}={value}: expected true or false")
    return value.lower() == "true"


def _print_episode(k: int, episode_return: float, length: int, time_out: bool, success: bool | None = None) -> None:
    cause = "time out" if time_out else "terminated"
    outcome = "" if success is None else ", succeeded" if success else ", failed"
    print(f"episode {k + 1}: return {episode_return:8.3f}  length {length:5d}  ({cause}{outcome})", flush=True)


class _RecordedEpisodes:
    """Prints each recorded episode as it ends; ``summary()`` gives the success count, if the task has one."""

    def __init__(self):
        self.successes = []

    def __call__(self, k: int, episode) -> None:
        success = episode.attrs.get("success")
        if success is not None:
            self.successes.append(bool(success))
        _print_episode(k, episode.attrs["return"], episode.length, episode.attrs["time_out"], success)

    def summary(self) -> str:
        return f"; {sum(self.successes)} of {len(self.successes)} succeeded" if self.successes else ""


def play(args: list[str]) -> None:
    from legion import api, commands

    if any(a in ("-h", "--help") for a in args):
        print(PLAY_HELP)
        return
    run, options, overrides = parse_run_args(args, PLAY_HELP, {"checkpoint": None, "episodes": "5", "record": None,
                                                               "video": "false", "overwrite": "false",
                                                               "viewer": "none", "host": "127.0.0.1", "port": "8080"})
    episodes = _number("episodes", options["episodes"])
    video, overwrite = _flag("video", options["video"]), _flag("overwrite", options["overwrite"])
    if _viewer(options):
        from legion.viewer import watch_policy

        try:
            watch_policy(api.load_run(run, options["checkpoint"], overrides), options["host"],
                         _number("port", options["port"]))
        except KeyboardInterrupt:
            print("\n[legion] viewer stopped", flush=True)
        return
    if options["record"] or video:
        from datetime import datetime

        from legion.sim2real.trajectories.record import record_run

        video_dir = run / "videos" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S") if video else None
        out = Path(options["record"]) if options["record"] else None
        print(f"[legion] playing {run} for {episodes} episodes" + (f", recording into {out}" if out else "")
              + (f", videos into {video_dir}" if video else ""), flush=True)
        record_run(run, episodes, out, video_dir, options["checkpoint"], overrides, overwrite,
                   on_episode=_RecordedEpisodes())
        return
    loaded = api.load_run(run, options["checkpoint"], overrides)
    print(f"[legion] playing {loaded.checkpoint} on {loaded.env.num_envs} envs of {loaded.cfg.task.name}", flush=True)
    for i, episode in enumerate(commands.play(loaded, episodes)):
        _print_episode(i, episode["return"], episode["length"], episode["time_out"])


def evaluate(args: list[str]) -> None:
    from legion import evaluation

    if any(a in ("-h", "--help") for a in args):
        print(EVAL_HELP)
        return
    defaults = evaluation.Options()
    run, options, overrides = parse_run_args(args, EVAL_HELP, {
        "checkpoint": None, "commands": ",".join(evaluation.DEFAULT_COMMANDS), "envs": str(defaults.envs_per_command),
        "duration_s": str(defaults.duration_s), "settle_s": str(defaults.settle_s),
        "episodes": str(defaults.episodes), "randomization": defaults.randomization, "out": None})
    text = options["commands"].strip()
    if text.startswith("{"):
        try:
            commands = json.loads(text)
        except ValueError as e:
            raise UsageError(f"commands: invalid JSON ({e}); expected {{name: [v_x, v_y, yaw_rate], ...}}") from None
    else:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in evaluation.DEFAULT_COMMANDS]
        if unknown:
            raise UsageError(f"commands: unknown {unknown}; choose from {list(evaluation.DEFAULT_COMMANDS)} "
                             "or give JSON {name: [v_x, v_y, yaw_rate]}")
        commands = {n: evaluation.DEFAULT_COMMANDS[n] for n in names}
    chosen = evaluation.Options(commands=commands, envs_per_command=_number("envs", options["envs"]),
                                duration_s=_number("duration_s", options["duration_s"], float),
                                settle_s=_number("settle_s", options["settle_s"], float),
                                episodes=_number("episodes", options["episodes"]),
                                randomization=options["randomization"])
    loaded = evaluation.load(run, chosen, options["checkpoint"], overrides)
    if loaded.cfg.task.command is not None and loaded.cfg.task.command.type in evaluation.GOAL_COMMANDS:
        what = f"{chosen.episodes} episodes on {chosen.envs_per_command} envs"
    else:
        what = f"{len(commands)} commands x {chosen.envs_per_command} envs x {chosen.duration_s:g} s"
    print(f"[legion] evaluating {loaded.checkpoint} of {loaded.cfg.task.name}: {what}, randomization "
          f"{chosen.randomization}", flush=True)
    report = evaluation.measure(loaded, chosen)
    print(evaluation.table(report))
    written = evaluation.write(report, options["out"] or run / "eval")
    print(f"[legion] wrote {', '.join(str(p) for p in written)}")


def record(args: list[str]) -> None:
    from datetime import datetime

    if any(a in ("-h", "--help") for a in args):
        print(RECORD_HELP)
        return
    from legion.sim2real.trajectories.record import record_run, record_scripted

    if any(a.startswith("policy=") for a in args):
        options = {"policy": None, "episodes": "10", "out": None, "video": "false", "overwrite": "false"}
        overrides = [a for a in args if a.partition("=")[0] not in options]
        for key, _, value in (a.partition("=") for a in args):
            if key in options:
                options[key] = value
        episodes = _number("episodes", options["episodes"])
        task = next((o.split("=", 1)[1] for o in overrides if o.startswith("task=")), "task")
        out = Path(options["out"] or f"trajectories/{task}_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}.h5")
        video_dir = out.with_name(out.stem + "_videos") if _flag("video", options["video"]) else None
        print(f"[legion] recording {episodes} episodes of {options['policy']} into {out}", flush=True)
        overwrite, printed = _flag("overwrite", options["overwrite"]), _RecordedEpisodes()
        record_scripted(options["policy"], episodes, out, video_dir, overrides, overwrite, on_episode=printed)
        print(f"[legion] wrote {out}" + (f" and {video_dir}" if video_dir else "") + printed.summary(), flush=True)
        return
    run, options, overrides = parse_run_args(args, RECORD_HELP, {"checkpoint": None, "episodes": "10", "out": None,
                                                                 "video": "false", "overwrite": "false"})
    episodes = _number("episodes", options["episodes"])
    video, overwrite = _flag("video", options["video"]), _flag("overwrite", options["overwrite"])
    out = Path(options["out"]) if options["out"] else \
        run / "trajectories" / f"{datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}.h5"
    video_dir = out.with_name(out.stem + "_videos") if video else None
    print(f"[legion] recording {episodes} episodes of {run} into {out}", flush=True)
    printed = _RecordedEpisodes()
    record_run(run, episodes, out, video_dir, options["checkpoint"], overrides, overwrite, on_episode=printed)
    print(f"[legion] wrote {out}" + (f" and {video_dir}" if video else "") + printed.summary(), flush=True)


def _file_args(args: list[str], help_text: str, options: dict) -> tuple[Path, dict]:
    """One positional path and this command's ``option=value``s (no config overrides)."""
    paths = [a for a in args if "=" not in a]
    if len(paths) != 1:
        raise UsageError(f"expected one file, got {paths or 'none'}\n\n{help_text}")
    chosen = dict(options)
    for arg in args:
        if "=" in arg:
            key, _, value = arg.partition("=")
            if key not in options:
                raise UsageError(f"{key}: no such option; options: {', '.join(options)}\n\n{help_text}")
            chosen[key] = value
    return Path(paths[0]), chosen


def replay(args: list[str]) -> None:
    if any(a in ("-h", "--help") for a in args):
        print(REPLAY_HELP)
        return
    path, options = _file_args(args, REPLAY_HELP, {"mode": "actions", "episodes": None, "video": "false",
                                                   "plots": "false", "out": None, "device": None, "overwrite": "false",
                                                   "viewer": "none", "html": "false", "host": "127.0.0.1",
                                                   "port": "8080"})
    if options["mode"] not in ("actions", "states"):
        raise UsageError(f"mode={options['mode']}: choose mode=actions or mode=states.")
    episodes = None if options["episodes"] is None else \
        [_number("episodes", e) for e in options["episodes"].split(",") if e]
    video, plots = _flag("video", options["video"]), _flag("plots", options["plots"])
    live, html = _viewer(options), _flag("html", options["html"])
    from legion.sim2real.trajectories.replay import replay_command
    from legion.viewer import ReplayView

    view = ReplayView(live, html, options["host"], _number("port", options["port"]), f"legion-rl: {path.name}") \
        if live or html else None
    try:
        result, written = replay_command(path, options["mode"], episodes, options["device"], video, plots,
                                         options["out"], _flag("overwrite", options["overwrite"]), view)
    except BaseException as e:  # the viewer's server goes with the replay (a recording's stopped in finish())
        if view is not None:
            view.close()
        if isinstance(e, KeyboardInterrupt):
            print("\n[legion] replay stopped", flush=True)
            return
        raise
    print(result.report())
    if written:
        print(f"[legion] wrote {len(written)} files into {written[0].parent}")
    if view is not None and live:
        print("[legion] the replay ended; the viewer shows its last frame until Ctrl-C", flush=True)
        view.serve_until_stopped()


def dataset(args: list[str]) -> None:
    if not args or args[0] in ("-h", "--help") or any(a in ("-h", "--help") for a in args):
        print(DATASET_HELP)
        return
    if args[0] != "convert":
        raise UsageError(f"unknown dataset command '{args[0]}'\n\n{DATASET_HELP}")
    path, options = _file_args(args[1:], DATASET_HELP, {"format": None, "out": None, "run": None, "video": "false",
                                                        "overwrite": "false"})
    overwrite = _flag("overwrite", options["overwrite"])
    if options["format"] == "lerobot":
        from legion.sim2real.trajectories.lerobot import to_lerobot

        out = Path(options["out"]) if options["out"] else path.with_name(path.stem + "_lerobot")
        to_lerobot(path, out, video=_flag("video", options["video"]), overwrite=overwrite)
    elif options["format"] == "hdf5":
        from legion.sim2real.trajectories.record import convert_robot_log

        if not options["run"]:
            raise UsageError("format=hdf5 needs run=<run folder>: the run the robot's policy was exported from.")
        out = Path(options["out"]) if options["out"] else path.with_suffix(".h5") if path.is_file() \
            else path.with_name(path.name + ".h5")
        convert_robot_log(path, Path(options["run"]), out, overwrite)
    else:
        raise UsageError(f"format={options['format']}: choose format=lerobot (a trajectory file -> LeRobot v3) "
                         "or format=hdf5 (a robot log -> a trajectory file).")
    print(f"[legion] wrote {out}")


def randomization(args: list[str]) -> None:
    from legion import api, configs
    from legion.tasks.randomization import report

    if any(a in ("-h", "--help") for a in args):
        print(RANDOMIZATION_HELP)
        return
    bad = [a for a in args if "=" not in a and not a.startswith("~")]
    if bad:
        raise UsageError(f"expected key=value overrides, got {bad}\n\n{RANDOMIZATION_HELP}")
    if not any(a.split("=", 1)[0].lstrip("+") == "sim.num_envs" for a in args):
        args = [*args, "sim.num_envs=64"]
    cfg = configs.compose(*args)
    api.validate(cfg)
    api.setup_process()
    print(report(api.make_env(cfg)))


def export(args: list[str]) -> None:
    from legion.sim2real.export import export_run, summary

    if any(a in ("-h", "--help") for a in args):
        print(EXPORT_HELP)
        return
    run, options, overrides = parse_run_args(args, EXPORT_HELP, {"checkpoint": None, "out": None, "steps": "50"})
    out_dir, report = export_run(run, options["checkpoint"], options["out"], _number("steps", options["steps"]),
                                 overrides)
    print(summary(run, out_dir, report))


def sim2sim(args: list[str]) -> None:
    from legion.sim2real import sim2sim as s2s

    if any(a in ("-h", "--help") for a in args):
        print(SIM2SIM_HELP)
        return
    run, options, overrides = parse_run_args(args, SIM2SIM_HELP, {
        "checkpoint": None, "onnx": None, "duration_s": "10", "commands": json.dumps(s2s.DEFAULT_COMMANDS),
        "realtime": "false", "json": None, "physics": "mjcf", "robustness": "false", "episodes": "50"})
    try:
        commands = json.loads(options["commands"])
    except ValueError as e:
        raise UsageError(f"commands must be a JSON list of [v_x, v_y, yaw_rate] triples ({e})"
                         f"\n\n{SIM2SIM_HELP}") from None
    if options["physics"] not in ("mjcf", "matched"):
        raise UsageError(f"physics={options['physics']}: choose physics=mjcf or physics=matched.")
    result = s2s.compare(run, options["checkpoint"], Path(options["onnx"]) if options["onnx"] else None,
                         _number("duration_s", options["duration_s"], float), commands, options["physics"],
                         options["realtime"].lower() == "true", overrides, _flag("robustness", options["robustness"]),
                         _number("episodes", options["episodes"], int))
    if result.get("kind") == "goals":
        print(f"[legion] sim2sim {result['onnx']}: {len(result['newton'])} episodes x "
              f"{result['steps'] * result['control_dt']:g} s from the same starts, MuJoCo physics={options['physics']}")
        print(s2s.goals_table(result))
        if options["json"]:
            Path(options["json"]).write_text(json.dumps(result, indent=2))
        return
    print(f"[legion] sim2sim {result['onnx']}: {len(result['newton'])} commands x "
          f"{result['steps'] * result['control_dt']:g} s "
          f"({result['steps']} control steps of {result['control_dt']:g} s), MuJoCo physics={options['physics']}")
    print(s2s.table(result))
    if "robustness" in result:
        print(f"\nThe MuJoCo robot under each condition ({len(commands)} commands; falls; tracking error "
              "[m/s, rad/s]):")
        print(s2s.robustness_table(result))
    if options["json"]:
        keys = ("newton", "mujoco", "mean", "loop", "robustness", "notes")
        Path(options["json"]).write_text(json.dumps({k: result[k] for k in keys if k in result}, indent=2))


def robot(args: list[str]) -> None:
    if not args or any(a in ("-h", "--help") for a in args):
        print(ROBOT_HELP)
        return
    if args[0] != "inspect":
        raise UsageError(f"unknown robot command '{args[0]}'\n\n{ROBOT_HELP}")
    rest, options = [], {"out": None, "robot": None, "overwrite": "false"}
    words = iter(args[1:])
    for arg in words:  # --out DIR, --robot NAME: the spelling of most tools, as out=DIR, robot=NAME
        rest.append(f"{arg[2:]}={next(words, '')}" if arg in ("--out", "--robot") else arg)
    files = [a for a in rest if "=" not in a]
    if len(files) > 1 or not (files or any(a.startswith("robot=") for a in rest)):
        raise UsageError(f"expected one robot file (or robot=NAME), got {files or 'none'}\n\n{ROBOT_HELP}")
    for arg in (a for a in rest if "=" in a):
        key, _, value = arg.partition("=")
        if key not in options:
            raise UsageError(f"{key}: no such option; options: {', '.join(options)}\n\n{ROBOT_HELP}")
        options[key] = value
    from legion import api
    from legion.tasks.sim.inspect import inspect_robot, load_robot_config

    api.setup_process()
    config = load_robot_config(options["robot"]) if options["robot"] else None
    file = files[0] if files else None
    name = Path((file or (config.file if config else "robot")).split("/")[-1]).stem
    out = Path(options["out"]) if options["out"] else Path(f"{name}_inspect")
    print(inspect_robot(file, out, config, _flag("overwrite", options["overwrite"])).text())


def _dds_args(args: list[str], help_text: str, options: dict) -> tuple[Path, dict]:
    """run=<folder> and this command's options (no config overrides); robot= is required."""
    if any(a in ("-h", "--help") for a in args):
        print(help_text)
        raise SystemExit(0)
    run, chosen, unknown = parse_run_args(args, help_text, options)
    if unknown:
        raise UsageError(f"unknown option(s) {' '.join(unknown)}; options: {', '.join(options)}\n\n{help_text}")
    if not chosen["robot"]:
        raise UsageError(f"robot= is required (go2 or g1)\n\n{help_text}")
    return run, chosen


def bridge(args: list[str]) -> None:
    from legion.sim2real.bridge import FAULTS, UnitreeBridge

    run, o = _dds_args(args, BRIDGE_HELP, {"robot": None, "domain": "0", "interface": "lo", "rate": "500",
                                           "duration_s": None, "faults": ""})
    faults = {f for f in o["faults"].split(",") if f}
    if faults - set(FAULTS):
        raise UsageError(f"faults={o['faults']}: choose from {', '.join(FAULTS)}")
    sim = UnitreeBridge(run, o["robot"], _number("domain", o["domain"]), o["interface"] or None,
                        _number("rate", o["rate"], float))
    sim.faults = faults
    print(f"[bridge] {o['robot']} on DDS domain {o['domain']}, interface {o['interface'] or 'auto'}, "
          f"{o['rate']} Hz{', faults: ' + ','.join(sorted(faults)) if faults else ''}; Ctrl-C stops", flush=True)
    summary = sim.run(_number("duration_s", o["duration_s"], float) if o["duration_s"] else None,
                      status=lambda b: print(b.status_line(), flush=True))
    sim.close()
    print(f"[bridge] stopped: {json.dumps(summary)}")


def deploy(args: list[str]) -> None:
    from legion.sim2real.deploy.policy import StateError
    from legion.sim2real.deploy.unitree import deploy as run_deploy
    from legion.sim2real.deploy.unitree import exported_folder

    run, o = _dds_args(args, DEPLOY_HELP, {"robot": None, "domain": "0", "interface": None, "command": "[0,0,0]",
                                           "duration_s": None, "confirm": "true", "stand_s": "2", "hold_s": "1",
                                           "log": None})
    try:
        command = [float(c) for c in json.loads(o["command"])]
        assert len(command) == 3
    except (ValueError, TypeError, AssertionError):
        raise UsageError(f"command={o['command']}: expected [v_x, v_y, yaw_rate]\n\n{DEPLOY_HELP}") from None
    try:
        result = run_deploy(exported_folder(run), o["robot"], _number("domain", o["domain"]), o["interface"] or None,
                            command, _number("duration_s", o["duration_s"], float) if o["duration_s"] else None,
                            _number("stand_s", o["stand_s"], float), _number("hold_s", o["hold_s"], float),
                            _flag("confirm", o["confirm"]), o["log"], say=lambda line: print(line, flush=True))
    except (StateError, TimeoutError) as e:  # the robot's fault, after the loop damped it: exit 1
        print(f"legion deploy: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"[deploy] {json.dumps(result)}")


COMMANDS = {"train": train, "play": play, "eval": evaluate, "record": record, "replay": replay, "dataset": dataset,
            "randomization": randomization, "export": export, "sim2sim": sim2sim, "robot": robot, "bridge": bridge,
            "deploy": deploy}


def _run(command: str, function, *args) -> None:
    """Runs a command; bad input (any ValueError: its message names the fix) exits with code 2, a
    training that cannot go on with code 1, both with one message and no traceback."""
    try:
        function(*args)
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush stays quiet
        sys.exit(0)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "cyclonedds":
            _fail(command, "needs DDS (cyclonedds is missing): pip install 'legion-rl[unitree]'")
        if e.name and e.name.split(".")[0] in TRAINING_STACK:
            _fail(command, f"needs the training stack ({e.name} is missing): "
                           "pip install torch==2.13.0 && pip install 'legion-rl[train]'")
        raise
    except (UsageError, ValueError) as e:  # ConfigError, RunError, bad requests
        _fail(command, str(e))
    except RuntimeError as e:
        from legion.sim2real.deploy import PolicyLoadError
        from legion.sim2real.export import ExportError

        if isinstance(e, (ExportError, PolicyLoadError)):
            _fail(command, str(e))
        if "legion.sim2real.trajectories.media" in sys.modules:
            from legion.sim2real.trajectories.media import RenderingUnavailable

            if isinstance(e, RenderingUnavailable):
                _fail(command, str(e))
        if "torch" in sys.modules:
            from legion.agents.runner import TrainingDiverged

            if isinstance(e, TrainingDiverged):  # its message names the causes
                print(f"legion {command}: {e}", file=sys.stderr)
                sys.exit(1)
        raise


def main() -> None:
    # Offscreen OpenGL for MuJoCo's renderer (video=true): MuJoCo binds its backend when first
    # imported, which loading a task's simulation does.
    os.environ.setdefault("MUJOCO_GL", "egl")
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help", "help"):
        from legion.configs import task_names

        print(USAGE.format(tasks=", ".join(task_names())))
        return
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        from legion.configs import task_names

        _fail(command, f"unknown command.\n\n{USAGE.format(tasks=', '.join(task_names()))}")
    _run(command, COMMANDS[command], rest)


if __name__ == "__main__":
    main()
