"""Watching the robot: the live web viewer (through its websocket and in a real browser), the
replay as one HTML file, videos while training, and W&B offline. One short quadruped training
serves every test: it writes videos at each iteration and logs to W&B in offline mode."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from browser import CHROMIUM, Browser

from conftest import compose, legion_in_process
from legion import api
from legion.commands.train import train

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-iteration quadruped run with a video at each iteration, logged to W&B offline."""
    run = tmp_path_factory.mktemp("viewer") / "run"
    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_DIR", "WANDB_SILENT")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    os.environ.pop("WANDB_DIR", None)  # the run's own folder: <run>/wandb/
    try:
        cfg = compose("task=quadruped_flat", "sim.num_envs=16", "agent.max_iterations=2", "agent.num_steps_per_env=8",
                      "agent.video.every=1", "agent.video.max_seconds=1", "agent.logger=wandb")
        train(cfg, run)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return run


@pytest.fixture(scope="module")
def live(trained):
    """``legion play viewer=web``'s loop on a free loopback port, in a thread, for 60 s at most."""
    from legion.viewer import watch_policy

    loaded = api.load_run(trained, num_envs=2)
    ready, views = threading.Event(), []
    thread = threading.Thread(target=watch_policy, args=(loaded,), daemon=True,
                              kwargs={"port": 0, "steps": 3000, "on_ready": lambda v: (views.append(v), ready.set())})
    thread.start()
    assert ready.wait(60)
    yield views[0], loaded
    views[0].close()  # the loop ends with the server
    thread.join(30)


def test_legion_play_viewer_web_prints_its_loopback_address_and_stops_on_ctrl_c(trained):
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    code, _, err = legion_in_process("play", f"run={trained}", "viewer=gui")
    assert code == 2 and "viewer=gui: the viewer is viewer=web" in err
    play = subprocess.Popen([sys.executable, "-m", "legion", "play", f"run={trained}", "viewer=web", "port=0",
                             "sim.num_envs=1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    try:
        assert play.stdout is not None
        for line in play.stdout:
            lines.append(line)
            if line.startswith("[legion] viewer at "):
                break
        url = re.search(r"http://127\.0\.0\.1:\d+", lines[-1])
        assert url, "".join(lines)
        with urllib.request.urlopen(url.group(0), timeout=30) as page:  # viser's client, from the wheel
            assert b"<html" in page.read(2000).lower()
        play.send_signal(signal.SIGINT)
        try:
            # 120 s: under a loaded 2-core suite its exit once outlasted 60 s after the viewer stopped
            out, _ = play.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # where it hangs: every thread's stack, when py-spy is installed
            spy = shutil.which("py-spy")
            stacks = subprocess.run([spy, "dump", "--pid", str(play.pid)], capture_output=True, text=True,
                                    timeout=60) if spy else None
            pytest.fail("legion play did not exit within 120 s of Ctrl-C after: " + "".join(lines)
                        + (stacks.stdout + stacks.stderr if stacks else "(install py-spy for its threads' stacks)"))
    finally:
        play.kill()
    assert play.returncode == 0 and "[legion] viewer stopped" in out, "".join(lines) + out


# --- the viewer's websocket, read as viser's client reads it -------------------------------------
def _decode(frame: bytes) -> list[dict]:
    """viser's wire format: sizes, a zstd-compressed msgpack of messages, 8-byte aligned raw arrays."""
    import msgspec
    import zstandard

    size, compressed = struct.unpack_from("<QQ", frame)
    body = msgspec.msgpack.decode(zstandard.ZstdDecompressor().decompress(frame[16:16 + compressed],
                                                                         max_output_size=size))
    offset, arrays = 16 + compressed, []
    for length in body["binaryBufferLengths"]:
        offset += -offset % 8
        arrays.append(frame[offset:offset + length])
        offset += length

    def resolve(value):
        if isinstance(value, dict) and "__binary_index" in value:
            return np.frombuffer(arrays[value["__binary_index"]], dtype=value["dtype"])
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    return [resolve(m) for m in body["messages"]]


def _listen(url: str, seconds: float, send: list[dict] | None = None) -> list[dict]:
    """The messages a viser client receives in ``seconds`` (after sending ``send``, found by label)."""
    import msgspec
    import viser
    import websockets

    async def session():
        received = []
        async with websockets.connect(url.replace("http", "ws"), subprotocols=[f"viser-v{viser.__version__}"],
                                      max_size=2**28) as ws:
            # A client counts as connected once it reports its camera, as the browser does first.
            await ws.send(msgspec.msgpack.encode({
                "type": "ViewerCameraMessage", "wxyz": [1.0, 0.0, 0.0, 0.0], "position": [-2.0, -2.0, 1.0],
                "fov": 1.0, "near": 0.01, "far": 100.0, "image_height": 480, "image_width": 640,
                "look_at": [0.0, 0.0, 0.0], "up_direction": [0.0, 0.0, 1.0]}))
            end = time.time() + seconds
            while time.time() < end:
                try:
                    frame = await asyncio.wait_for(ws.recv(), max(0.05, end - time.time()))
                except asyncio.TimeoutError:
                    break
                received += _decode(frame)
                for message in send or []:  # a GUI change, once its control's id is known
                    uuid = next((m["uuid"] for m in received if m.get("props", {}).get("label") == message["label"]),
                                None)
                    if uuid is not None and not message.get("sent"):
                        await ws.send(msgspec.msgpack.encode({"type": "GuiUpdateMessage", "uuid": uuid,
                                                              "updates": {"value": message["value"]}}))
                        message["sent"] = True
        return received

    return asyncio.run(session())


def test_a_websocket_client_sees_the_robot_move_and_its_command_reaches_the_env(live):
    import shutil

    view, loaded = live
    assert view.url.startswith("http://127.0.0.1:")
    shutil.copy(loaded.run / "model_2.pt", loaded.run / "model_3.pt")  # the run trained on
    messages = _listen(view.url, 6.0, send=[{"label": "lin_vel_x", "value": 0.8},
                                            {"label": "Reload newest checkpoint", "value": True}])
    updates = [m for m in messages if m["type"] == "SceneNodeUpdateMessage" and m["name"].startswith("/model/shapes/")
               and "batched_positions" in m["updates"]]
    # The quadruped's shapes, batched by geometry (the followed world only): each node's poses.
    shapes = {m["name"]: len(m["updates"]["batched_positions"]) // 3 for m in updates}
    assert sum(shapes.values()) >= 9, shapes  # a torso, and two segments per leg
    poses = [m["updates"]["batched_positions"] for m in updates if m["name"] == max(shapes, key=shapes.get)]
    assert len(poses) > 20  # a pose update per frame
    assert any(not np.array_equal(poses[0], p) for p in poses[1:])  # the robot moves
    time.sleep(0.5)  # the viewer applies browser changes between control steps
    command = loaded.env.command
    assert command.held and np.allclose(command.value[:, 0].cpu().numpy(), 0.8, atol=1e-6)
    assert loaded.checkpoint.name == "model_3.pt"  # the button reloaded the newest checkpoint
    (loaded.run / "model_3.pt").unlink()


@needs_chromium
def test_chromium_shows_the_live_robot_and_it_moves(live, tmp_path):
    from newton.viewer import ViewerViser

    view, _ = live
    canvas = "Array.from(document.querySelectorAll('canvas')).some(c => c.width > 0 && c.height > 0)"  # WebGL's

    def changed(a, b):
        height, width = a.shape[:2]
        centre = (slice(height // 4, 3 * height // 4), slice(width // 16, width // 2))  # left of the panel
        return (np.abs(a[centre].astype(int) - b[centre]).sum(-1) > 40).mean()

    def screenshot_until(browser, until, seconds):
        """Screenshots, a second apart, until ``until(shot)`` or ``seconds`` pass: the last one (software
        WebGL on a loaded machine is slow, so the test waits for what it needs, not a fixed while)."""
        deadline = time.time() + seconds
        while not until(shot := browser.screenshot()) and time.time() < deadline:
            browser.wait(1)
        return shot

    with Browser() as browser:
        empty = ViewerViser(host="127.0.0.1", port=0, verbose=False)  # the same page without a robot
        try:
            browser.open(f"http://127.0.0.1:{empty.server.get_port()}", settle=2)
            browser.wait_for(canvas, what="no WebGL canvas in the empty viewer's page")
            browser.wait(4)  # its ground and grid drawn
            blank = browser.screenshot()
        finally:
            empty.close()
        browser.open(view.url, settle=2)
        first = screenshot_until(browser, lambda shot: changed(shot, blank) > 0.02, 60)
        second = screenshot_until(browser, lambda shot: changed(first, shot) > 0.002, 30)
        errors = list(browser.errors)
    assert not errors, errors
    assert changed(first, blank) > 0.02, "the robot is not where the camera looks"
    assert changed(first, second) > 0.002, "the live view did not change in 30 s"


@needs_chromium
def test_a_replay_html_file_opens_from_disk_and_shows_the_robot(trained, tmp_path):
    from legion.commands.replay import replay_and_write
    from legion.sim2real.trajectories.record import record_run
    from legion.viewer import ReplayView

    recording = tmp_path / "demos.h5"
    record_run(trained, 1, recording, overrides=["task.episode_length_s=1"])
    result, written = replay_and_write(recording, "actions", None, None, False, False, tmp_path / "out", False,
                                     ReplayView(live=False, html=True))
    page = tmp_path / "out" / "replay.html"
    assert written == [page] and result.bit_exact
    text = page.read_text()
    assert "<script" in text and "http://" not in text.split("</head>")[0].split("playbackPath")[0]
    with Browser() as browser:
        browser.open(page.as_uri(), settle=6)
        shot = browser.screenshot()
        errors = list(browser.errors)
        assert "playbackPath=blob:" in browser.evaluate("decodeURIComponent(location.search)")
    assert not errors, errors
    # The robot: grey shapes in the middle, on the white-and-grid scene; the ground alone is far lighter.
    middle = shot[shot.shape[0] // 3: 2 * shot.shape[0] // 3, shot.shape[1] // 3: 2 * shot.shape[1] // 3]
    assert (middle.min(-1) < 200).mean() > 0.002


def test_videos_while_training_decode_and_show_the_robot(trained):
    import imageio.v2 as imageio
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    videos = sorted(p.name for p in (trained / "videos").glob("*.mp4"))
    assert videos == ["iter_1.mp4", "iter_2.mp4"]
    reader = imageio.get_reader(str(trained / "videos" / "iter_2.mp4"))
    frames = [reader.get_data(i) for i in range(reader.count_frames())]
    assert len(frames) == 25  # 1 s (agent.video.max_seconds) at 25 frames per second (agent.video.fps)
    assert reader.get_meta_data()["fps"] == 25
    assert frames[0].shape == (240, 320, 3)
    assert np.abs(frames[0].astype(int) - frames[-1]).mean() > 1.0  # it moves
    events = EventAccumulator(str(trained), size_guidance={"images": 0})
    events.Reload()
    gifs = events.Images("Video/episode")
    assert [g.step for g in gifs] == [1, 2] and gifs[0].encoded_image_string[:6] == b"GIF89a"


def test_wandb_offline_writes_its_run_folder_with_the_scalars(trained):
    runs = list((trained / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((trained / "wandb").iterdir())
    records = _wandb_records(next(runs[0].glob("*.wandb")))
    rows = [{item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    assert [int(row["_step"]) for row in rows] == [1, 2]
    for row in rows:
        assert {"Train/mean_reward", "Perf/env_steps_per_s", "Loss/value"} <= set(row), sorted(row)
        assert float(row["Perf/env_steps_per_s"]) > 0
    videos = sorted(p.name.split("_")[1] for p in runs[0].glob("files/media/videos/video_*.mp4"))
    assert videos == ["1", "2"]  # each iteration's video, uploaded by `wandb sync`


def _wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` file: W&B's LevelDB-style log (a 7-byte file header, 32 KiB
    blocks of records with a 7-byte header: crc32, length, type: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, offset = path.read_bytes(), [], b"", 7
    block = 32768
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack_from("<IHB", data, offset)
        chunk = data[offset + 7: offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_a_urdf_robot_is_drawn_from_the_model_newton_builds():
    """The Go2 is a URDF: videos draw the MJCF Newton's solver writes of it, meshes shown,
    collision shapes hidden, joints by the simulator's names."""
    from legion.sim2real.trajectories.media import RenderingUnavailable, SceneRenderer

    cfg = compose("task=quadruped_flat", "robot=go2")
    try:
        renderer = SceneRenderer(cfg, 96, 128)
    except RenderingUnavailable as e:
        pytest.skip(f"no offscreen OpenGL here: {e}")
    go2_joints = [f"{leg}_{part}_joint" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")]
    assert sorted(renderer.joint_names) == sorted(go2_joints)
    model = renderer.model
    assert model.nmesh >= 4 and (model.geom_group == 3).sum() >= 13  # meshes drawn; hulls, spheres, boxes hidden
    standing = {"robot/root_pose_w": np.array([0, 0, 0.35, 0, 0, 0, 1.0]),
                "robot/joint_pos": np.tile([0.1, 0.8, -1.5], 4)}
    assert renderer.robot_fraction(standing, go2_joints) > 0.02  # the robot covers a real part of the image
    folded = {**standing, "robot/joint_pos": np.tile([0.1, 0.0, -2.6], 4)}
    change = np.abs(renderer.render(folded, go2_joints).astype(float) - renderer.render(standing, go2_joints)).mean()
    renderer.close()
    assert change > 1.0  # the legs move in the image as the joints do
