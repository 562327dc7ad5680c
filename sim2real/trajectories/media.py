"""Video and plots of trajectories: MuJoCo's offscreen renderer (the robot's own MJCF, or for a
URDF or USD robot the model Newton builds from it), MP4 through imageio, PNG through matplotlib.

Rendering needs an OpenGL that works without a display: ``MUJOCO_GL=egl`` (Debian: libegl1,
libegl-mesa0, libgl1-mesa-dri; software rendering through Mesa's llvmpipe when there is no GPU)
or ``MUJOCO_GL=osmesa`` (libosmesa6). MuJoCo picks the backend when it is first imported, so
:func:`legion.api.setup_process` sets ``MUJOCO_GL=egl`` unless it is set already.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402  (after MUJOCO_GL)
from mujoco import (  # noqa: E402
    MjData,
    MjSpec,
    MjvCamera,
    mj_forward,
    mjtBuiltin,
    mjtCamera,
    mjtGeom,
    mjtJoint,
    mjtLightType,
    mjtObj,
    mjtTexture,
    mjtTextureRole,
)

from legion.sim2real.deploy.policy import quat_rotate_inverse  # noqa: E402
from legion.tasks.sim.camera import picture  # noqa: E402

SHAPES = {"box": mjtGeom.mjGEOM_BOX, "sphere": mjtGeom.mjGEOM_SPHERE,
          "capsule": mjtGeom.mjGEOM_CAPSULE, "cylinder": mjtGeom.mjGEOM_CYLINDER}


class RenderingUnavailable(RuntimeError):
    """No offscreen OpenGL here; the message says what to install."""


def _wxyz(quat) -> list[float]:
    x, y, z, w = quat
    return [w, x, y, z]


def _size(shape: str, size) -> list[float]:
    """A scene config's size (box edges, radius, length) as MuJoCo's (half extents, half length)."""
    return [s / 2 for s in size] if shape == "box" else [size[0]] if shape == "sphere" else [size[0], size[1] / 2]


def robot_spec(robot) -> tuple[MjSpec, dict[str, str]]:
    """The robot alone as a MuJoCo spec: its MJCF as it is, or, for any other file Newton reads
    (URDF, USD), the MJCF Newton's MuJoCo solver writes of the model Newton builds from it (the
    model that trains, as ``robot.mjb`` of an export), its visual meshes drawn and its collision
    shapes kept in geom group 3 (hidden). Returns the spec and the names the simulator gives the
    joints whose MJCF names differ (Newton writes its labels' paths with underscores).

    Args:
        robot: the ``task.scene.robot`` config (:class:`legion.configs.schema.Robot`).
    """
    import contextlib
    import io
    import tempfile

    from legion.tasks.sim import resolve_asset
    from legion.tasks.sim.scene import add_robot, short_label

    path = resolve_asset(robot.file)
    if path.suffix == ".xml":
        return MjSpec.from_file(str(path)), {}
    import newton

    builder = newton.ModelBuilder()
    newton.solvers.SolverMuJoCo.register_custom_attributes(builder)
    add_robot(builder, robot, newton)
    model = builder.finalize(device="cpu")
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        newton.solvers.SolverMuJoCo(model, use_mujoco_cpu=True, skip_visual_only_geoms=False,
                                    save_to_mjcf=f"{tmp}/robot.xml")
        spec = MjSpec.from_file(f"{tmp}/robot.xml")
    assert model.shape_flags is not None  # allocated by finalize
    visible = model.shape_flags.numpy() & int(newton.ShapeFlags.VISIBLE)
    for geom in spec.geoms:  # Newton names them shape_<shape index>_<geom index>
        if not visible[int(geom.name.split("_")[1])]:
            geom.group = 3
    names = {label.replace("/", "_"): short_label(label) for label in model.joint_label}
    return spec, names


class SceneRenderer:
    """The task's scene in plain MuJoCo, drawn offscreen with a camera tracking the robot.

    The robot is its own MJCF, or the model Newton builds from any other robot file
    (:func:`robot_spec`); the ground (a checkered plane), free objects and fixtures come from the
    scene config, as Newton builds them. Only kinematics is computed: the state comes
    from a trajectory.

    Args:
        cfg: the recording's config (:class:`legion.configs.schema.Train`).
        height, width: image size [pixels] (even numbers: H.264 needs them).
    """

    def __init__(self, cfg, height: int = 480, width: int = 640):
        scene = cfg.task.scene
        spec, sim_names = robot_spec(scene.robot)
        robot_bodies = len(spec.bodies)  # the world and the robot's bodies come first
        spec.visual.quality.shadowsize = 1024  # MuJoCo's 4096 doubles a software-rendered frame's time
        spec.visual.headlight.ambient = [0.35, 0.35, 0.35]
        spec.visual.headlight.diffuse = [0.6, 0.6, 0.6]
        sky = spec.add_texture(name="legion_sky", type=mjtTexture.mjTEXTURE_SKYBOX,
                               builtin=mjtBuiltin.mjBUILTIN_GRADIENT, width=256, height=1536)
        sky.rgb1, sky.rgb2 = [0.55, 0.7, 0.85], [0.05, 0.07, 0.1]
        light = spec.worldbody.add_light(name="legion_sun", type=mjtLightType.mjLIGHT_DIRECTIONAL)
        light.dir, light.diffuse, light.castshadow = [0.3, 0.3, -1.0], [0.6, 0.6, 0.6], True
        if scene.ground is not None:
            grid = spec.add_texture(name="legion_grid", type=mjtTexture.mjTEXTURE_2D,
                                    builtin=mjtBuiltin.mjBUILTIN_CHECKER, width=256, height=256)
            grid.rgb1, grid.rgb2 = [0.25, 0.3, 0.35], [0.35, 0.4, 0.45]
            material = spec.add_material(name="legion_grid", texrepeat=[1, 1], texuniform=True, reflectance=0.1)
            material.textures[mjtTextureRole.mjTEXROLE_RGB] = "legion_grid"
            spec.worldbody.add_geom(name="legion_ground", type=mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.5],
                                    material="legion_grid", contype=0, conaffinity=0)
        for name, obj in scene.objects.items():
            body = spec.worldbody.add_body(name=f"legion_{name}")
            body.add_freejoint(name=f"legion_{name}")
            body.add_geom(type=SHAPES[obj.shape], size=_size(obj.shape, obj.size), rgba=[0.8, 0.4, 0.2, 1])
        for name, fixture in scene.fixtures.items():
            spec.worldbody.add_geom(name=f"legion_{name}", type=SHAPES[fixture.shape],
                                    size=_size(fixture.shape, fixture.size), pos=fixture.pos,
                                    quat=_wxyz(fixture.quat), rgba=[0.55, 0.45, 0.35, 1], contype=0, conaffinity=0)
        self.model = model = spec.compile()
        self.data = MjData(model)
        self.robot_bodies = set(range(1, robot_bodies))
        self.robot_geoms = np.flatnonzero(np.isin(model.geom_bodyid, list(self.robot_bodies)))
        # Where each recorded view goes in qpos: free roots (position, quaternion w first) and joints by name.
        self.free = {}
        if model.njnt and model.jnt_type[0] == mjtJoint.mjJNT_FREE and model.jnt_bodyid[0] in self.robot_bodies:
            self.free["robot/root_pose_w"] = int(model.jnt_qposadr[0])
        for name in scene.objects:
            self.free[f"{name}/root_pose_w"] = int(model.jnt_qposadr[model.joint(f"legion_{name}").id])
        moving = (int(mjtJoint.mjJNT_HINGE), int(mjtJoint.mjJNT_SLIDE))  # ints: `np.int32 in (mjtJoint, ...)` is False
        joints = [j for j in range(model.njnt)
                  if int(model.jnt_type[j]) in moving and model.jnt_bodyid[j] in self.robot_bodies]
        self.joint_names = [sim_names.get(name, name) for name in (str(model.joint(j).name) for j in joints)]
        self.joint_qpos = model.jnt_qposadr[joints].astype(int)
        backend = getattr(mujoco, "GLContext", None)
        if backend is not None and backend.__module__ == "mujoco.glfw" and not os.environ.get("DISPLAY"):
            raise RenderingUnavailable(
                "MuJoCo was imported with its windowed (GLFW) backend and there is no display: set MUJOCO_GL=egl "
                "(or osmesa) before Python starts, or call legion.api.setup_process() before anything imports mujoco.")
        try:
            self.renderer = mujoco.Renderer(model, height, width)
        except Exception as e:  # no usable OpenGL: say what to install
            raise RenderingUnavailable(
                f"MuJoCo cannot render offscreen here (MUJOCO_GL={os.environ.get('MUJOCO_GL')}): {e}. "
                "On Debian/Ubuntu: apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri (MUJOCO_GL=egl) or libosmesa6 "
                "(MUJOCO_GL=osmesa); set MUJOCO_GL before Python starts.") from e
        # A free camera whose target follows the middle of the robot's geometry (MuJoCo's tracking
        # camera aims at the root body, which leaves a tall robot, e.g. a cart-pole, half out of view).
        self.camera = MjvCamera()
        self.camera.type = mjtCamera.mjCAMERA_FREE
        self.camera.distance = float(np.clip(1.8 * model.stat.extent, 1.0, 8.0))
        self.camera.elevation, self.camera.azimuth = -20.0, 135.0
        # The scene's own cameras (task.scene.cameras): what each sees, drawn beside the scene
        from legion.sim2real.deploy.mujoco_robot import MuJoCoCamera
        from legion.sim2real.export import camera_contract

        self.views = [MuJoCoCamera(model, name, camera_contract(cam, cfg.sim.dt * cfg.sim.decimation),
                                   ["rgb" if "rgb" in cam.channels else "depth"], name)
                      for name, cam in scene.cameras.items()]

    def set_state(self, state: dict[str, np.ndarray], joint_names: list[str]) -> None:
        """Poses the scene: ``state`` maps ``"<entity>/<view>"`` to one step's values; the robot's
        ``joint_pos`` is in ``joint_names`` order (the simulator's)."""
        qpos = self.data.qpos
        for view, address in self.free.items():
            pose = state[view]
            qpos[address:address + 3] = pose[:3]
            qpos[address + 3:address + 7] = _wxyz(pose[3:7])
        index = {name: i for i, name in enumerate(joint_names)}
        missing = [n for n in self.joint_names if n not in index]
        if missing:
            raise ValueError(f"the trajectory has no positions for the MJCF joints {missing}")
        qpos[self.joint_qpos] = state["robot/joint_pos"][[index[n] for n in self.joint_names]]
        mj_forward(self.model, self.data)
        corners = self.data.geom_xpos[self.robot_geoms]
        self.camera.lookat[:] = (corners.min(0) + corners.max(0)) / 2

    def render(self, state: dict[str, np.ndarray], joint_names: list[str]) -> np.ndarray:
        """(height, width, 3) uint8 RGB of the scene in ``state``; with scene cameras, (height,
        width * 3 / 2, 3): what each camera sees in a column on the right (depth: the nearest return
        white, the farthest dark grey, no return black), one above the other."""
        self.set_state(state, joint_names)
        self.renderer.update_scene(self.data, self.camera)
        image = self.renderer.render()
        if not self.views:
            return image
        height, width = image.shape[:2]
        column = np.zeros((height, width // 2, 3), np.uint8)
        cell = height // len(self.views)
        for k, view in enumerate(self.views):
            (seen,) = view.render(self.data).values()
            seen = picture(torch.from_numpy(seen)).numpy()
            zoom = max(1, min(cell // seen.shape[0], (width // 2) // seen.shape[1]))
            seen = seen.repeat(zoom, 0).repeat(zoom, 1)[:cell, : width // 2]
            column[k * cell: k * cell + seen.shape[0], : seen.shape[1]] = seen
        return np.concatenate([image, column], axis=1)

    def robot_fraction(self, state: dict[str, np.ndarray], joint_names: list[str]) -> float:
        """The share of the image's pixels that show the robot (a segmentation render)."""
        self.set_state(state, joint_names)
        self.renderer.enable_segmentation_rendering()
        try:
            self.renderer.update_scene(self.data, self.camera)
            segments = self.renderer.render()  # per pixel: (object id, object type)
        finally:
            self.renderer.disable_segmentation_rendering()
        ids, types = segments[..., 0], segments[..., 1]
        return float(np.mean(np.isin(ids, self.robot_geoms) & (types == mjtObj.mjOBJ_GEOM)))

    def close(self) -> None:
        self.renderer.close()
        for view in self.views:
            view.close()


def write_video(renderer: SceneRenderer, states, path: Path, fps: float, joint_names: list[str],
                on_frame=None) -> Path:
    """Renders each state of ``states`` (an iterable of one-step state dicts) into an H.264 MP4 at
    ``fps``; ``on_frame(k, image)`` sees each image."""
    import imageio.v2 as imageio

    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    writer = imageio.get_writer(str(tmp), fps=fps, codec="libx264", pixelformat="yuv420p", macro_block_size=2,
                                ffmpeg_log_level="error")
    try:
        for k, state in enumerate(states):
            image = renderer.render(state, joint_names)
            writer.append_data(image)
            if on_frame is not None:
                on_frame(k, image)
    finally:
        writer.close()
    tmp.replace(path)
    return path


def episode_frames(episode):
    """The recorded states of an :class:`~.file.Episode`, one dict per step."""
    states = episode.group("states")
    for t in range(episode.length):
        yield {view: values[t] for view, values in states.items()}


def frames(result, episode: int):
    """The states to draw for one episode of a replay (a :class:`~.replay.ReplayResult`): the
    initial state, then the simulator's state after each step (``mode=states``: each state set)."""
    length = int(np.sum(np.isfinite(result.error[next(iter(result.error))][episode])))
    if result.mode == "actions":
        yield {view: values[episode] for view, values in result.initial.items()}
    for t in range(length):
        yield {view: values[episode, t] for view, values in result.replayed.items()}


# --- plots -----------------------------------------------------------------------------------------
def _figure(rows: int, cols: int, title: str):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(3.2 * cols, 2.3 * rows + 0.6), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    figure.suptitle(title)
    return figure, axes


def plot_episode(result, episode: int, out: Path, name: str) -> list[Path]:
    """PNG plots of one replayed episode into ``out``: joint positions (file, replay, targets),
    base velocity (commanded vs actual) and height, reward terms, and for robot logs the joint
    position error. Returns the paths written."""
    ep = result.episodes[episode]
    dt, length = result.control_dt, ep.length
    compared = np.isfinite(result.error["robot/joint_pos"][episode])
    # Comparison points: after step t (actions: t + 1 control steps in), or at step t (states).
    offset = 1 if result.mode == "actions" else 0
    time = (np.arange(compared.size) + offset) * dt
    steps = np.arange(length) * dt
    simulated = "simulated" if result.source == "robot" else "replayed"
    recorded = "logged" if result.source == "robot" else "recorded"
    written = []

    names = result.joint_names
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    figure, axes = _figure(rows, cols, f"{name}: joint positions ({result.source}, mode={result.mode})")
    targets = ep.data.get("targets")
    action = result.attrs.get("action") or {"type": "joint_position", "joints": names}  # robot logs: every joint
    driven = list(action["joints"]) if action["type"] == "joint_position" else []
    for j, joint in enumerate(names):
        ax = axes[j // cols][j % cols]
        ax.plot(steps, ep.data["states/robot/joint_pos"][:, j], label=recorded, color="black", lw=1.2)
        ax.plot(time[compared], result.replayed["robot/joint_pos"][episode][compared, j], "--", label=simulated,
                color="tab:orange", lw=1.2)
        if targets is not None and joint in driven:
            ax.plot(steps, targets[:, driven.index(joint)], ":", label="target", color="tab:blue", lw=1.0)
        ax.set_title(joint, fontsize=9)
        ax.set_xlabel("time [s]", fontsize=8)
    for k in range(len(names), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    axes[0][0].legend(fontsize=7)
    written.append(_save(figure, out / f"{name}_joints.png"))

    if "states/robot/root_pose_w" in ep.data:
        pose, vel = ep.data["states/robot/root_pose_w"], ep.data["states/robot/root_vel_w"]
        lin_b = quat_rotate_inverse(pose[:, 3:7], vel[:, :3])
        ang_b = quat_rotate_inverse(pose[:, 3:7], vel[:, 3:6])
        sim_pose = result.replayed["robot/root_pose_w"][episode][compared]
        sim_vel = result.replayed["robot/root_vel_w"][episode][compared]
        sim_lin = quat_rotate_inverse(sim_pose[:, 3:7], sim_vel[:, :3])
        sim_ang = quat_rotate_inverse(sim_pose[:, 3:7], sim_vel[:, 3:6])
        figure, axes = _figure(1, 4, f"{name}: base motion (base frame)")
        commands = ep.data.get("commands")
        for k, (label, actual, replayed) in enumerate((("v_x [m/s]", lin_b[:, 0], sim_lin[:, 0]),
                                                       ("v_y [m/s]", lin_b[:, 1], sim_lin[:, 1]),
                                                       ("yaw rate [rad/s]", ang_b[:, 2], sim_ang[:, 2]),
                                                       ("height [m]", pose[:, 2], sim_pose[:, 2]))):
            ax = axes[0][k]
            ax.plot(steps, actual, label=recorded, color="black", lw=1.2)
            ax.plot(time[compared], replayed, "--", label=simulated, color="tab:orange", lw=1.2)
            if commands is not None and k < 3:
                ax.plot(steps, commands[:, k], ":", label="commanded", color="tab:green", lw=1.2)
            ax.set_title(label, fontsize=9)
            ax.set_xlabel("time [s]", fontsize=8)
        axes[0][0].legend(fontsize=7)
        written.append(_save(figure, out / f"{name}_base.png"))

    terms = ep.group("reward_terms")
    if terms:
        figure, axes = _figure(1, 1, f"{name}: reward terms (weight x dt), return {ep.attrs.get('return', 0):.3f}")
        ax = axes[0][0]
        for term, values in terms.items():
            ax.plot(steps, values, label=term, lw=1.0)
        ax.plot(steps, ep.data["rewards"], color="black", lw=1.5, label="total")
        ax.set_xlabel("time [s]")
        ax.legend(fontsize=7, ncol=2)
        written.append(_save(figure, out / f"{name}_rewards.png"))

    if result.source == "robot" and result.mode == "actions":
        rmse = result.joint_rmse()[episode]
        figure, axes = _figure(1, 1, f"{name}: joint position RMSE, simulated vs logged")
        ax = axes[0][0]
        ax.bar(range(len(names)), rmse, color="tab:red")
        ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
        ax.set_ylabel("RMSE [rad]")
        written.append(_save(figure, out / f"{name}_joint_error.png"))
    return written


def _save(figure, path: Path) -> Path:
    figure.savefig(path, dpi=100)
    return path
