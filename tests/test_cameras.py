"""Cameras in every world (task.scene.cameras): what they see, where they are, when they render,
and the configs they refuse."""

import math

import numpy as np
import pytest
import torch

from conftest import make_env
from legion.configs import compose
from legion.tasks.sim import NewtonSim

WALL = "+task.scene.fixtures.wall={shape: box, size: [0.2, 4.0, 1.0], pos: [2.1, 0.0, 0.5]}"  # its face at x = 2
FRONT = "+task.scene.cameras.front={body: base, pos: [0.3, 0.0, 0.0], width: 16, height: 12, fov: 60, far: 4}"


def scene(*overrides: str):
    return compose("task=quadruped_flat", WALL, *overrides).task.scene


@pytest.mark.parametrize("backend", ["c", "warp"])
def test_a_wall_at_a_known_distance_reads_that_planar_depth(backend):
    """A camera fixed in the env frame at (0, 0, 0.5) looking along +x at a wall whose face is at
    x = 2: every pixel on the wall reads 2 m (planar depth: the distance along the ray would grow
    to 2 / cos of the pixel's angle off the axis, 2.3 m at the corners); the ground below reads
    its own planar depth; the sky above, nothing (0)."""
    cam = "+task.scene.cameras.fixed={pos: [0, 0, 0.5], width: 32, height: 24, fov: 60, far: 10}"
    sim = NewtonSim(scene(cam), num_envs=2, dt=0.005, decimation=4, backend=backend)
    depth = sim.cameras.depth("fixed")
    assert depth.shape == (2, 24, 32)
    # rows 8-15 look within 10 degrees of level: onto the wall (it spans z 0-1 at x = 2)
    wall = depth[:, 8:16]
    assert torch.allclose(wall, torch.full_like(wall, 2.0), atol=1e-3), wall
    # the bottom row looks 28.75 deg down: the ground at 0.5 / tan(28.75 deg) = 0.911 m ahead
    tan = (11.5 / 12) * math.tan(math.radians(30))
    assert torch.allclose(depth[:, -1], torch.full_like(depth[:, -1], 0.5 / tan), atol=2e-3), depth[:, -1]
    assert (depth[:, 0] == 0).all()  # above the wall's top edge: no return


def test_a_camera_on_a_body_moves_with_it_world_by_world():
    """A camera on the quadruped's base sees the wall 0.5 m nearer in the world whose robot stands
    0.5 m further forward; the other world's image is unchanged."""
    sim = NewtonSim(scene(FRONT), num_envs=2, dt=0.005, decimation=4, backend="c")
    robot = sim.robot
    robot.root_pose_w[:, 2] = 0.33
    robot.root_pose_w[:, 3:] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    sim.reset(torch.ones(2, dtype=torch.bool))
    before = sim.cameras.depth("front").clone()
    centre = before[:, 5:7, 7:9]
    assert torch.allclose(centre, torch.full_like(centre, 2.0 - 0.3), atol=2e-3), centre
    robot.root_pose_w[1, 0] = 0.5
    sim.reset(torch.tensor([False, True]))
    after = sim.cameras.depth("front")
    assert torch.equal(after[0], before[0])
    assert torch.allclose(after[1, 5:7, 7:9], torch.full((2, 2), 1.2), atol=2e-3), after[1]
    pose = sim.cameras.pose("front")  # the camera's position: the base's, plus 0.3 m forward
    assert torch.allclose(pose[:, :3], robot.root_pos_w + torch.tensor([0.3, 0.0, 0.0]), atol=1e-6)


def test_a_frame_every_period_steps_and_at_each_reset():
    sim = NewtonSim(scene(FRONT.replace("far: 4}", "far: 4, period: 3}")), num_envs=2, dt=0.005, decimation=4,
                    backend="c")
    robot = sim.robot
    robot.root_pose_w[:, 2] = 0.33
    sim.reset(torch.ones(2, dtype=torch.bool))
    frames = [sim.cameras.depth("front").clone()]
    for _ in range(3):  # the robot falls and walks nowhere: the image changes as its base sinks and tips
        sim.step()
        frames.append(sim.cameras.depth("front").clone())
    assert torch.equal(frames[1], frames[0]) and torch.equal(frames[2], frames[0])  # steps 1, 2: the old frame
    assert not torch.equal(frames[3], frames[0])  # step 3: a new one
    robot.root_pose_w[0, 0] = 0.5
    sim.reset(torch.tensor([True, False]))  # a reset world is drawn at once; the other keeps its frame
    now = sim.cameras.depth("front")
    assert torch.equal(now[1], frames[3][1]) and not torch.equal(now[0], frames[3][0])


def test_the_rgb_image_shows_the_scene_and_depth_observations_read_far_for_no_return():
    env = make_env("task=quadruped_flat", "sim.num_envs=2", WALL, FRONT.replace("}", ", channels: [depth, rgb]}"),
                   "+task.observations.camera={depth: {func: depth_image, params: {camera: front}},"
                   " colour: {func: rgb_image, params: {camera: front}}}")
    obs = env.get_observations()
    assert obs["camera"].shape == (2, 4, 12, 16) and obs["policy"].dim() == 2
    depth, rgb = obs["camera"][:, 0], obs["camera"][:, 1:]
    assert torch.allclose(depth[:, 0], torch.full_like(depth[:, 0], 4.0))  # the sky: no return, read as far
    assert (rgb >= 0).all() and (rgb <= 1).all()
    sky, wall = rgb[:, :, 0].mean(), rgb[:, :, 6].mean()
    assert abs(float(sky - wall)) > 0.05  # the wall is not the sky's colour
    assert env.observation_layout()["camera"][1]["size"] == 3  # an image term's size: its channels


def test_mujoco_renders_the_same_depth():
    """The same scene and camera through MuJoCo's GL renderer (the model plain MuJoCo simulates in
    sim2sim): the planar depths agree within 1 cm on all but the pixels on an edge."""
    import mujoco

    from legion.sim2real.trajectories.media import RenderingUnavailable  # noqa: F401  (sets MUJOCO_GL)

    cam = "+task.scene.cameras.fixed={pos: [0, 0, 0.5], width: 32, height: 24, fov: 60, far: 10}"
    sim = NewtonSim(scene(cam), num_envs=1, dt=0.005, decimation=4, backend="c")
    newton_depth = sim.cameras.depth("fixed")[0].numpy()
    model = sim.solver.mujoco_model()
    model.vis.global_.fovy = 60.0
    model.vis.map.znear = 0.1 / model.stat.extent  # MuJoCo's near plane, as a share of the model's extent
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    view = mujoco.MjvCamera()
    view.type = mujoco.mjtCamera.mjCAMERA_FREE
    view.lookat[:], view.distance, view.azimuth, view.elevation = (1.0, 0.0, 0.5), 1.0, 0.0, 0.0
    try:
        renderer = mujoco.Renderer(model, 24, 32)
    except Exception as e:
        pytest.skip(f"no offscreen OpenGL here: {e}")
    renderer.enable_depth_rendering()
    renderer.update_scene(data, view)
    mujoco_depth = renderer.render()
    renderer.close()
    hit = newton_depth > 0
    mujoco_depth = np.where(mujoco_depth < 9.0, mujoco_depth, 0.0)  # MuJoCo's far plane: no return
    agree = np.abs(newton_depth - mujoco_depth) < 0.01
    assert hit.sum() > 400 and agree.mean() > 0.95, (agree.mean(), newton_depth[::4, ::4], mujoco_depth[::4, ::4])


@pytest.mark.parametrize("camera, refused", [
    ("{body: tail}", r"task.scene.cameras.c.body: 'tail' names no body of the robot; its bodies: \['base'"),
    ("{channels: [depth, thermal]}", r"task.scene.cameras.c.channels: \['depth', 'thermal'\]; each one of"),
    ("{near: 2.0, far: 1.0}", r"task.scene.cameras.c: needs 0 < near < far"),
    ("{width: 8192, height: 8192, channels: [depth, rgb]}",
     r"task.scene.cameras: the images of 2048 worlds \(c: 8192x8192 depth\+rgb\) take 1024.0 GiB, more than half"),
])
def test_a_camera_that_cannot_be_is_refused_by_name_before_anything_runs(camera, refused):
    with pytest.raises(ValueError, match=refused):
        NewtonSim(scene(f"+task.scene.cameras.c={camera}"), num_envs=2048, dt=0.005, decimation=4, backend="c")


def test_a_group_mixing_images_and_vectors_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"task.observations.policy: its terms' values .* do not concatenate; put "
                                         r"images \(C, H, W\) in a group of their own"):
        make_env("task=quadruped_flat", "sim.num_envs=2", FRONT,
                 "+task.observations.policy.depth={func: depth_image, params: {camera: front}}")


def test_image_latency_shows_each_world_the_frame_of_steps_ago_and_a_new_episode_none_of_the_last():
    """Two envs alike but for the image latency (event image_latency: 0 and 2 control steps): the
    late one reads at step t what the other read at step t - 2 (the first frame until then), a
    restored checkpoint reads on alike, and after a reset the frame of the new episode at once."""
    def env_with(steps: int):
        torch.manual_seed(0)
        return make_env("task=quadruped_flat", "sim.num_envs=2", WALL, FRONT,
                        "+task.observations.camera={depth: {func: depth_image, params: {camera: front}}}",
                        f"+task.events.late={{func: image_latency, mode: startup, range: [{steps}, {steps}], "
                        "params: {camera: front}}")

    now, late = env_with(0), env_with(2)
    assert late.sim.cameras.latency["front"].tolist() == [2, 2]
    actions = torch.randn(8, 2, now.num_actions, generator=torch.Generator().manual_seed(1))
    seen = {"now": [], "late": []}
    with torch.inference_mode():
        for t in range(8):
            for key, env in (("now", now), ("late", late)):
                seen[key].append(env.get_observations()["camera"].clone())
                env.step(actions[t])
    assert not torch.equal(seen["now"][0], seen["now"][3])  # the robot moves: its camera's frames differ
    for t in range(8):
        assert torch.equal(seen["late"][t], seen["now"][max(t - 2, 0)]), t
    restored = env_with(2)  # a checkpoint carries the past frames: restored, it reads on as the original
    restored.sim.load_state_dict(late.sim.state_dict())
    with torch.inference_mode():
        for t in range(3):
            now.step(actions[t]), late.step(actions[t]), restored.step(actions[t])
            assert torch.equal(restored.get_observations()["camera"], late.get_observations()["camera"]), t
        now.reset(), late.reset()
        assert torch.equal(late.get_observations()["camera"], now.get_observations()["camera"])


def test_on_the_c_backend_mujoco_ray_casts_a_depth_camera_as_newton_renders_it():
    """arm_lift_camera's scene (its visible shapes are its colliding ones): the C backend casts the
    camera's rays with mj_multiRay on its threads; the images are Newton's SensorCamera's (1 mm), a
    cube moved per world included. A scene with visual-only meshes (the Go2's) keeps SensorCamera."""
    images = {}
    for backend in ("c", "warp"):
        env = make_env("task=arm_lift_camera", "sim.num_envs=4", f"sim.backend={backend}")
        assert env.sim.cameras.renderer("front") == ("mj_multiRay" if backend == "c" else "SensorCamera")
        with torch.inference_mode():
            for _ in range(3):  # the arm moves, reset events placed the cube per world
                env.step(0.5 * torch.ones(4, env.num_actions))
            images[backend] = env.sim.cameras.depth("front").clone()
    near = (images["c"] - images["warp"]).abs() < 1e-3
    assert near.float().mean() > 0.999 and (images["c"] > 0).float().mean() > 0.9
    assert torch.unique(images["c"].flatten(1), dim=0).shape[0] == 4  # each world its own cube place
    go2 = NewtonSim(compose("task=quadruped_flat", "robot=go2", FRONT).task.scene, num_envs=1, dt=0.005,
                    decimation=4, backend="c")
    assert go2.cameras.renderer("front") == "SensorCamera"


def test_ppo_keeps_its_rollout_images_in_float16_and_learns_from_them():
    """Half the memory of a rollout's images; the update reads them through the image normalizer."""
    from conftest import make_runner

    runner = make_runner("task=quadruped_flat", "sim.num_envs=4", "agent.num_steps_per_env=4", WALL, FRONT,
                         "+task.observations.policy_depth={depth: {func: depth_image, params: {camera: front}}}")
    stored = runner.ppo.storage.observations
    assert stored["policy_depth"].dtype == torch.float16 and stored["policy"].dtype == torch.float32
    cnn = runner.ppo.actor.cnns["policy_depth"].cnn
    before = [p.detach().clone() for p in cnn.parameters()]
    runner.learn(1)
    images = stored["policy_depth"].float()
    assert images.shape == (4, 4, 1, 12, 16) and (images > 0).any()  # a wall 1.7 m ahead, in metres
    assert not all(torch.equal(a, b) for a, b in zip(before, cnn.parameters()))


def test_a_pixel_policys_filters_stay_channels_last_through_a_checkpoint_and_convolve_as_nchw_ones(tmp_path):
    """oneDNN convolves channels-last filters ~1.5x faster on a CPU (bench/update.py --cnn-layouts), so
    the CNNs are built so; the actor acts as it would with NCHW filters, and a checkpoint saved from
    NCHW filters (an older one's) loads into channels-last ones."""
    from conftest import make_runner

    overrides = ("task=quadruped_flat", "sim.num_envs=4", "agent.num_steps_per_env=4", WALL, FRONT,
                 "+task.observations.policy_depth={depth: {func: depth_image, params: {camera: front}}}")
    runner = make_runner(*overrides, log_dir=tmp_path)
    runner.learn(1)
    actor, obs = runner.ppo.actor, runner.env.get_observations()
    filters = [m for m in actor.modules() if isinstance(m, torch.nn.Conv2d)]

    def channels_last(conv):  # each pixel's channels next to each other (also a 1-channel filter's)
        return conv.weight.is_contiguous(memory_format=torch.channels_last) and conv.weight.stride(1) == 1

    assert len(filters) == 3 and all(map(channels_last, filters))
    with torch.inference_mode():
        acted = actor(obs)
    for conv in filters:
        conv.to(memory_format=torch.contiguous_format)
    assert not any(map(channels_last, filters[1:]))
    with torch.inference_mode():
        expected = actor(obs)
    assert (acted - expected).abs().max() <= 1e-5 and expected.abs().max() > 0.01

    path = runner.save()
    resumed = make_runner(*overrides, env=runner.env)
    resumed.load(path)
    loaded = [m for m in resumed.ppo.actor.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(map(channels_last, loaded))
    assert all(torch.equal(a.weight, b.weight) for a, b in zip(loaded, filters))


def test_a_pixel_policy_trains_exports_and_runs_in_the_edge_runtime_as_in_training(tmp_path, monkeypatch):
    """A ``policy_<name>`` image group goes to the actor through rsl-rl's CNN model; `legion export`
    writes it with the image group as an ONNX input of its own and the camera in the contract; the
    edge runtime builds the image from a camera's raw depth (0: no return) as training did and acts
    as the torch policy does (1e-5); an image of another size is refused naming the camera; plain
    MuJoCo's renderer draws the camera's depth as Newton's ray tracer did."""
    import numpy as np

    from conftest import legion_in_process
    from legion import api
    from legion.sim2real.deploy import PolicyRunner, StateError

    monkeypatch.chdir(tmp_path)
    code, _, err = legion_in_process(
        "train", "task=quadruped_flat", "sim.num_envs=4", "agent.max_iterations=1", "agent.num_steps_per_env=4",
        WALL, FRONT, "+task.observations.policy_depth={depth: {func: depth_image, params: {camera: front}, "
                     "scale: 0.25}}")
    assert code == 0, err[-2000:]
    run = next((tmp_path / "runs" / "quadruped_flat").iterdir())
    actor = torch.load(next(run.glob("model_*.pt")), weights_only=False)["policy"]["actor_state_dict"]
    assert actor["cnns.policy_depth.cnn.0.weight"].shape == (16, 1, 5, 5)  # one depth channel into the first conv
    code, out, err = legion_in_process("export", f"run={run}")
    assert code == 0, err[-2000:]

    runner = PolicyRunner(run / "exported" / "policy.onnx")
    meta = runner.metadata
    assert meta.onnx.inputs == ["obs", "policy_depth"] and meta.observation.images[0].shape == [1, 12, 16]
    camera = meta.cameras["front"]
    assert (camera.body, camera.width, camera.height, camera.far) == ("base", 16, 12, 4.0)
    assert camera.intrinsics == pytest.approx([6 / math.tan(math.radians(30)), 6 / math.tan(math.radians(30)), 8, 6])

    loaded = api.load_run(run, None, ["sim.num_envs=4"])
    loaded.env.noise_enabled = False
    obs = loaded.env.refresh_observations()
    raw = loaded.env.sim.cameras.depth("front").numpy()  # what the camera driver reports: 0 = no return
    assert (raw == 0).any() and (raw > 0).any()
    images = np.stack([runner.terms.images({"front/depth": raw[i]})["policy_depth"] for i in range(4)])
    assert np.abs(images - obs["policy_depth"].numpy()).max() <= 1e-6
    policy = loaded.runner.policy
    with torch.inference_mode():
        expected = policy(obs).numpy()
    actions, _ = runner.policy(obs["policy"].numpy(), None, {"policy_depth": images})
    assert np.abs(actions - expected).max() <= 1e-5

    state = {key: np.zeros(shape, np.float32) for key, shape in runner.terms.state_shapes}
    state["base_quat"][3] = 1.0
    runner.act(state)  # a state of the right shapes acts
    with pytest.raises(StateError, match=r"robot state 'front/depth' has shape \(480, 640\) and dtype float32; the "
                                         r"policy expects shape \(12, 16\) numbers \(depth of camera 'front'"):
        runner.act({**state, "front/depth": np.zeros((480, 640), np.float32)})
    with pytest.raises(StateError, match=r"'front/depth' has shape \(12, 16\) and dtype uint16"):  # millimetres
        runner.act({**state, "front/depth": np.zeros((12, 16), np.uint16)})

    # Last, as it needs an offscreen OpenGL: plain MuJoCo (the export's robot.mjb, its OpenGL
    # renderer) draws world 0's state as Newton's ray tracer did.
    import mujoco

    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot

    try:
        robot = MuJoCoRobot(run / "exported" / "robot.mjb", meta)
    except Exception as e:  # no offscreen OpenGL
        pytest.skip(f"MuJoCo cannot render here: {e}")
    trained_robot = loaded.env.robot
    robot.data.qpos[0:3] = trained_robot.root_pos_w[0].numpy()
    robot.data.qpos[3:7] = trained_robot.root_quat_w[0, [3, 0, 1, 2]].numpy()
    robot.data.qpos[robot.qpos_ids] = trained_robot.joint_pos[0].numpy()
    mujoco.mj_forward(robot.model, robot.data)
    drawn = robot.read_state()["front/depth"]
    robot.close()
    assert drawn.shape == (12, 16) and 0.2 < (drawn > 0).mean() < 0.9
    assert ((drawn > 0) == (raw[0] > 0)).mean() > 0.95
    assert (np.abs(drawn - raw[0]) < 0.01).mean() > 0.95, (drawn, raw[0])


def test_camera_randomization_draws_per_world_and_corrupts_the_depth_as_configured():
    """Mount jitter moves each world's camera within its range (and so its image); depth noise of
    k = 0.02 / m spreads (observed - rendered) / d^2 with a standard deviation of 0.02; holes
    blank the configured share of pixels; a colour gain scales each world's channels."""
    def event(name, func, low, high):
        return f"+task.events.{name}={{func: {func}, mode: startup, range: [{low}, {high}], params: {{camera: front}}}}"

    cam = FRONT.replace("width: 16, height: 12", "width: 32, height: 24").replace("}", ", channels: [depth, rgb]}")
    images = ("+task.observations.camera={depth: {func: depth_image, params: {camera: front}},"
              " colour: {func: rgb_image, params: {camera: front}}}")
    env = make_env("task=quadruped_flat", "sim.num_envs=64", WALL, cam, images,
                   event("mount", "camera_position", -0.05, 0.05), event("turn", "camera_rotation", -0.1, 0.1),
                   event("noise", "depth_noise", 0.02, 0.02), event("holes", "depth_holes", 0.25, 0.25),
                   event("gain", "rgb_gain", 0.5, 1.5))
    cameras = env.sim.cameras
    offset = cameras.mount_pos["front"] - torch.tensor([0.3, 0.0, 0.0])
    assert offset.abs().max() <= 0.05 and offset.std() > 0.02  # drawn per world, within the range
    assert torch.unique(cameras.mount_quat["front"], dim=0).shape[0] == 64
    rendered = cameras.depth("front")
    assert torch.unique(rendered.flatten(1), dim=0).shape[0] == 64  # every world's camera sees its own image

    obs = env.get_observations()["camera"]
    depth = obs[:, 0]
    returned = (rendered > 0) & (depth < 4.0)
    holes = (rendered > 0) & (depth == 4.0)
    assert abs(float(holes.sum() / (rendered > 0).sum()) - 0.25) < 0.02  # 25% of the returns are holes
    error = ((depth - rendered) / rendered.square())[returned]
    assert abs(float(error.std()) - 0.02) < 0.002 and abs(float(error.mean())) < 0.002
    gain = env.sim.cameras.noise["front"]["gain"]
    assert 0.5 <= gain.min() and gain.max() <= 1.5 and gain.std() > 0.2
    unlit = cameras.rgb("front").permute(0, 3, 1, 2) / 255.0
    assert torch.allclose((unlit * gain[:, :, None, None]).clamp(max=1.0), obs[:, 1:])

    # A checkpoint carries what was drawn and rendered: a fresh env restored from it sees what this one sees.
    resumed = make_env("task=quadruped_flat", "sim.num_envs=64", WALL, cam, images, "seed=1")
    resumed.sim.load_state_dict(env.sim.state_dict())
    for view in ("mount_pos", "mount_quat"):
        assert torch.equal(getattr(resumed.sim.cameras, view)["front"], getattr(cameras, view)["front"])
    assert torch.equal(resumed.sim.cameras.noise["front"]["gain"], gain)
    assert torch.equal(resumed.sim.cameras.depth("front"), cameras.depth("front"))


def test_videos_show_what_each_camera_sees_beside_the_scene():
    import numpy as np

    from legion.sim2real.trajectories.media import RenderingUnavailable, SceneRenderer

    try:
        renderer = SceneRenderer(compose("task=arm_lift_camera"), 96, 128)
    except RenderingUnavailable as e:
        pytest.skip(f"no offscreen OpenGL here: {e}")
    joints = renderer.joint_names
    state = {"robot/joint_pos": np.zeros(len(joints)), "cube/root_pose_w": np.array([0.5, 0.1, 0.025, 0, 0, 0, 1.0])}
    away = renderer.render(state, joints)
    state["cube/root_pose_w"] = np.array([0.5, -0.1, 0.025, 0, 0, 0, 1.0])
    moved = renderer.render(state, joints)
    renderer.close()
    assert away.shape == (96, 192, 3)  # the scene, then a column half as wide for the task's camera
    panel = away[:, 128:].astype(float)
    assert panel.std() > 10  # the table, the cube: not blank
    changed = (np.abs(moved[:, 128:].astype(float) - panel).sum(-1) > 10).sum()
    assert changed >= 8, changed  # the camera sees the cube move (a 5 cm cube: about 4x4 of its 48x48 pixels)


@pytest.mark.skipif(__import__("browser").CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_the_web_viewer_shows_what_the_camera_sees_in_chromium():
    import threading
    import time

    import numpy as np
    from browser import Browser

    from legion.viewer import WebViewer

    env = make_env("task=quadruped_flat", "sim.num_envs=2", WALL, FRONT)
    view, stop = WebViewer(env, port=0), threading.Event()

    def loop():  # the camera turns on its mount, step by step: what it sees changes (a robot that
        with torch.inference_mode():  # fell may lie still, its view with it)
            yaw = 0.0
            while not stop.is_set():
                yaw += 0.02
                env.sim.cameras.mount_quat["front"][:] = torch.tensor([0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)])
                env.step(torch.zeros(env.num_envs, env.num_actions).uniform_(-1, 1))
                view.show(env.step_dt)
                time.sleep(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    # The page's 16x12 images (the camera's), their pixels read back through a canvas
    images = ("Array.from(document.querySelectorAll('img')).filter(i => i.naturalWidth == 16 && i.naturalHeight == 12)"
              ".map(i => { const c = document.createElement('canvas'); c.width = 16; c.height = 12;"
              " const g = c.getContext('2d'); g.drawImage(i, 0, 0);"
              " return Array.from(g.getImageData(0, 0, 16, 12).data); })")

    def rgb(images):
        return np.array(images[0], float).reshape(12, 16, 4)[..., :3]

    try:
        with Browser() as browser:
            browser.open(view.url, settle=2)
            first = browser.wait_for(images, until=lambda v: v and len(v) == 1,
                                     what="no 16x12 image of camera 'front' in the page")
            browser.wait_for(images, until=lambda v: v and len(v) == 1 and np.abs(rgb(v) - rgb(first)).mean() > 1,
                             timeout=30, what="the camera's image did not change in 30 s")
            errors = list(browser.errors)
    finally:
        stop.set()
        thread.join(10)
        view.close()
    assert not errors, errors
    assert rgb(first).std() > 20  # the wall, the sky (black): not blank


def test_sim2sim_runs_a_pixel_policy_of_a_goal_task_through_mujocos_renderer(tmp_path):
    """arm_lift_camera, whose policy does not observe the cube: each MuJoCo episode still starts
    with the cube where Newton's started, and the edge runtime acts on MuJoCo's rendered depth."""
    from conftest import export_untrained_run
    from legion.sim2real.sim2sim import compare_goals

    made = export_untrained_run(tmp_path, "task=arm_lift_camera", "task.episode_length_s=1.0")
    try:
        result = compare_goals(tmp_path, onnx=made["out"] / "policy.onnx", episodes=2, physics="matched")
    except Exception as e:
        if "OpenGL" not in str(e) and "EGL" not in str(e):
            raise
        pytest.skip(f"MuJoCo cannot render here: {e}")
    print(result["newton"], result["mujoco"])
    assert result["loop"]["stops"] == 0
    for newton, mujoco in zip(result["newton"], result["mujoco"]):
        assert mujoco["final_distance_m"] == pytest.approx(newton["final_distance_m"], abs=0.01)


def test_segmentation_labels_each_entity_and_an_actor_that_reads_it_is_not_exported(tmp_path, monkeypatch):
    """A camera fixed in the env frame, ahead of the robot, looking along +x at the wall sees the wall (a fixture: label
    3, after the robot's 2), the ground below it (1) and nothing above (0); one looking back at the
    robot sees it (2) where its depth is nearest. The observation term segmentation_mask is 1
    exactly there; a picture colours each label; and an actor that reads it is refused by export,
    which names the term (no robot's camera gives segmentation)."""
    from conftest import legion_in_process
    from legion.tasks.sim.camera import PALETTE, picture

    ahead = "+task.scene.cameras.ahead={pos: [0.6, 0, 0.5], width: 32, height: 24, fov: 60, channels: [segmentation]}"
    back = ("+task.scene.cameras.back={pos: [0.7, 0, 0.3], quat: [0, 0, 1, 0], width: 32, height: 24, fov: 60, "
            "channels: [depth, segmentation]}")
    env = make_env("task=quadruped_flat", "sim.num_envs=2", WALL, ahead, back,
                   "+task.observations.critic_seg={robot: {func: segmentation_mask, "
                   "params: {camera: back, entities: [robot, ground]}}}")
    cameras = env.sim.cameras
    assert cameras.labels == {"none": 0, "ground": 1, "robot": 2, "wall": 3}
    seen = cameras.segmentation("ahead")
    assert seen.shape == (2, 24, 32) and seen.dtype == torch.uint8
    assert (seen[:, 8:16] == 3).all() and (seen[:, -1] == 1).all() and (seen[:, 0] == 0).all()
    labels, depth = cameras.segmentation("back"), cameras.depth("back")
    robot = labels == 2
    assert robot.sum(dim=(1, 2)).min() > 20  # the robot fills part of the view, in both worlds
    assert depth[robot].max() < depth[labels == 1].max()  # nearer than the far ground
    mask = env.get_observations()["critic_seg"]
    assert mask.shape == (2, 2, 24, 32) and torch.equal(mask[:, 0] > 0, robot) and torch.equal(mask[:, 1] > 0,
                                                                                                  labels == 1)
    colours = picture(labels[0])
    assert colours.shape == (24, 32, 3) and torch.equal(colours[robot[0]][0], PALETTE[2])
    with pytest.raises(ValueError, match=r"entities \['table'\] are not in the scene; its labels: \['ground', "
                                         r"'robot', 'wall'\]"):
        make_env("task=quadruped_flat", "sim.num_envs=1", WALL, back, "+task.observations.critic_seg={t: "
                 "{func: segmentation_mask, params: {camera: back, entities: [table]}}}")

    monkeypatch.chdir(tmp_path)
    code, _, err = legion_in_process(
        "train", "task=quadruped_flat", "sim.num_envs=4", "agent.max_iterations=1", "agent.num_steps_per_env=4",
        WALL, back, "+task.observations.policy_seg={robot: {func: segmentation_mask, params: {camera: back}}}")
    assert code == 0, err[-2000:]
    run = next((tmp_path / "runs" / "quadruped_flat").iterdir())
    code, out, err = legion_in_process("export", f"run={run}")
    assert code != 0 and "the actor reads image terms ['robot'] of group 'policy_seg', which no robot's camera " \
                         "gives" in out + err, out[-1000:] + err[-2000:]


def test_a_recurrent_pixel_policy_trains_exports_and_remembers_in_the_edge_runtime(tmp_path, monkeypatch):
    """quadruped_rough_depth's actor reads a depth image and proprioception through an LSTM (a CNN
    and rsl-rl's RNN joined): PPO trains it from padded trajectories of images; `legion export`
    writes obs, the image and the LSTM's state as ONNX inputs (its check: onnxruntime against torch
    over a rollout, the state carried); the edge runtime acts as the torch policy does, step after
    step, its memory carried: the same image twice gives two different actions."""
    from conftest import SMALL_TERRAIN, legion_in_process
    from legion import api
    from legion.sim2real.deploy import PolicyRunner

    monkeypatch.chdir(tmp_path)
    small = ("task=quadruped_rough_depth", "sim.num_envs=4", "agent.actor.rnn.hidden_size=16",
             "task.scene.cameras.front.width=16", "task.scene.cameras.front.height=12", *SMALL_TERRAIN)
    code, _, err = legion_in_process("train", *small, "agent.max_iterations=2", "agent.num_steps_per_env=8")
    assert code == 0, err[-2000:]
    run = next((tmp_path / "runs" / "quadruped_rough_depth").iterdir())
    code, out, err = legion_in_process("export", f"run={run}")
    assert code == 0, err[-2000:]
    runner = PolicyRunner(run / "exported" / "policy.onnx")
    meta = runner.metadata
    assert meta.onnx.inputs == ["obs", "policy_depth", "h_in", "c_in"] and meta.onnx.recurrent.type == "lstm"

    loaded = api.load_run(run, None, ["sim.num_envs=4"])
    env, policy = loaded.env, loaded.runner.policy
    env.noise_enabled = False
    obs = env.refresh_observations()
    state, actions = None, []
    for _ in range(3):
        with torch.inference_mode():
            expected = policy(obs).numpy()
        got, state = runner.policy(obs["policy"].numpy(), state, {"policy_depth": obs["policy_depth"].numpy()})
        assert np.abs(got - expected).max() <= 1e-5
        actions.append(got)
    assert np.abs(actions[2] - actions[1]).max() > 1e-6  # the same observation, another memory


def test_field_of_view_jitter_shows_each_world_its_own_pinhole():
    """Cameras.set_fov (the event camera_fov): world 1 at 50 degrees, world 0 at the config's 60.
    Rendered at the widest, world 0's image is the plain camera's exactly; world 1's is the centre
    enlarged: the wall still at 2 m (planar depth does not depend on the field of view), its bottom
    row looking 24.1 degrees down instead of 28.75, at the ground 1.12 m ahead instead of 0.91
    (within one rendered pixel's angle: the nearest pixel)."""
    cam = "+task.scene.cameras.fixed={pos: [0, 0, 0.5], width: 32, height: 24, fov: 60, far: 10}"
    plain, jittered = (NewtonSim(scene(cam), num_envs=2, dt=0.005, decimation=4) for _ in range(2))
    jittered.cameras.set_fov("fixed", torch.tensor([False, True]), torch.tensor([60.0, 50.0]), max_fov=60.0)
    before, after = plain.cameras.depth("fixed"), jittered.cameras.depth("fixed")
    assert torch.equal(after[0], before[0])
    wall = after[1, 9:15]
    assert torch.allclose(wall, torch.full_like(wall, 2.0), atol=1e-3), wall
    ground = 0.5 / ((11.5 / 12) * math.tan(math.radians(25)))
    assert abs(float(after[1, -1].mean()) - ground) < 0.05 and float(before[1, -1].mean()) < 0.95
    assert (after[1, 0] == 0).all()  # the top row still above the wall

    env = make_env("task=quadruped_flat", "sim.num_envs=8", WALL, FRONT,
                   "+task.events.fov={func: camera_fov, mode: reset, range: [-10, 5], params: {camera: front}}")
    fov, cameras = env.sim.cameras.fov["front"], env.sim.cameras
    assert fov.min() >= 50 and fov.max() <= 65 and fov.std() > 1 and cameras._render_fov["front"] == 65
    assert "cameras.front.fov" in env.sim.state_dict()


def test_an_image_with_its_own_timestamp_is_held_when_stale_and_stops_the_loop_when_older(tmp_path):
    """A camera's image may carry its own time (``<camera>/timestamp``): while the rest of the state
    stays fresh, an image older than its frame period in training plus the loop's stale limit holds
    the last targets (the policy does not run on it), one older than 0.5 s stops the loop naming
    the camera; an image stamped ahead of the loop's clock stops it as a clock mismatch."""
    from conftest import export_untrained_run
    from legion.sim2real.deploy import ControlLoop, PolicyRunner
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot

    made = export_untrained_run(tmp_path, "task=arm_lift_camera", "task.episode_length_s=1.0")
    runner = PolicyRunner(made["out"] / "policy.onnx")
    try:
        robot = MuJoCoRobot(made["out"] / "robot.mjb", runner.metadata)
    except Exception as e:
        if "OpenGL" not in str(e) and "EGL" not in str(e):
            raise
        pytest.skip(f"MuJoCo cannot render here: {e}")
    (camera, contract), = runner.metadata.cameras.items()

    class StampedImages:
        """The robot, its camera's image stamped with the time it was taken: frozen from ``freeze`` on."""

        def __init__(self):
            self.freeze, self.image_time, self.ages = None, 0.0, []

        def read_state(self):
            state = robot.read_state()
            if self.freeze is None or state["timestamp"] < self.freeze:
                self.image_time = state["timestamp"]
            state[f"{camera}/timestamp"] = self.image_time
            self.ages.append(state["timestamp"] - self.image_time)
            return state

        def write_targets(self, targets):
            robot.write_targets(targets)

    stamped = StampedImages()
    robot.reset()
    stamped.freeze = robot.time() + 0.1
    loop = ControlLoop(stamped, runner, now=robot.time, realtime=False)
    modes = [loop.step() for _ in range(round(0.8 / loop.dt))]
    stale = contract.frame_period_s + loop.safety.stale_after_s
    expected = ["policy" if age <= stale else "hold" if age <= 0.5 else "stop" for age in stamped.ages]
    assert modes[:len(expected)] == expected and {"policy", "hold", "stop"} <= set(modes)  # (the stop is latched:
    assert modes[len(expected):] == ["stop"] * (len(modes) - len(expected))  # the state is not read again)
    assert loop.stopped is not None and loop.stopped.startswith(f"camera '{camera}' image ")
    assert "ms old (limit 500 ms)" in loop.stopped

    ahead = ControlLoop(stamped, runner, now=lambda: robot.time() - 1.0, realtime=False)
    stamped.freeze = None
    assert ahead.step() == "stop" and "clock mismatch" in ahead.stopped
