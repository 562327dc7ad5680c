"""Trajectories: record, replay bit for bit, robot logs, damaged files, no silent overwrite, bounded
memory, video that shows the robot, LeRobot v3 datasets."""

import dataclasses
import json
import os
import shutil
import subprocess
import textwrap

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import ROOT, compose, legion_in_process
from legion import api, configs
from legion.commands.train import train

RANDOMIZED = ["task.events.push.interval_s=[0.1,0.2]", "task.events.action_delay.enabled=true",
              "task.events.link_mass.enabled=true", "task.events.stiffness.enabled=true",
              "task.events.gravity_tilt.enabled=true", "task.events.restitution.enabled=true",
              "+task.events.latency={func: command_latency, mode: reset, range: [0, 25]}"]
EPISODES = "meta/episodes/chunk-000/file-000.parquet"


def make_run(folder, *overrides):
    """A run folder (config.yaml + model_1.pt) of an untrained policy: enough to act."""
    from legion.agents.runner import Runner

    folder.mkdir(parents=True, exist_ok=True)
    cfg = compose(*overrides, "sim.num_envs=4")
    configs.save_config(cfg, folder / "config.yaml")
    torch.manual_seed(0)
    runner = Runner(api.make_env(cfg), cfg.agent, log_dir=None)
    runner.iteration = 1
    runner.save(folder / "model_1.pt")
    return folder


@pytest.fixture(scope="module")
def quadruped(tmp_path_factory):
    """Three recorded quadruped episodes with pushes every 0.1-0.2 s, actuator delay, command
    latency, and randomized link masses, PD stiffness, gravity and restitution."""
    from legion.sim2real.trajectories.record import record_run

    root = tmp_path_factory.mktemp("quadruped")
    run = make_run(root / "run", "task=quadruped_flat")
    record_run(run, 3, root / "demos.h5", overrides=RANDOMIZED)
    return {"run": run, "file": root / "demos.h5", "root": root}


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    """A cart-pole run and three episodes recorded through the command line."""
    root = tmp_path_factory.mktemp("cartpole")
    run = make_run(root / "run", "task=cartpole")
    code, out, err = legion_in_process("record", f"run={run}", "episodes=3", f"out={root / 'demos.h5'}")
    assert code == 0, err[-3000:]
    return {"run": run, "file": root / "demos.h5", "root": root, "stdout": out}


# --- recording and exact replay ------------------------------------------------------------------
@pytest.mark.bit_exact
def test_actions_replay_reproduces_a_randomized_pushed_delayed_recording_bit_for_bit(quadruped):
    from legion.sim2real.trajectories import TrajectoryFile
    from legion.sim2real.trajectories.replay import replay

    with TrajectoryFile(quadruped["file"]) as f:
        assert f.attrs["total"] == sum(f.episode(n).length for n in f.episodes) and len(f.episodes) == 3
        episodes = [f.episode(n) for n in f.episodes]
        assert f.attrs["robot_sha256"] and f.attrs["versions"]["newton"] and f.attrs["control_dt"] == 0.02
    # What the replay must reproduce really happened: pushes between steps, delays, parameters.
    pushes = sum(int((e.data["states/robot/root_vel_w"][1:]
                      != e.data["next_states/robot/root_vel_w"][:-1]).any(1).sum()) for e in episodes)
    assert pushes >= 3
    assert any(int(e.data["params/action_delay"]) > 0 for e in episodes)
    assert len({int(e.data["params/command_latency"]) for e in episodes}) > 1  # physics steps, per episode
    masses = np.stack([e.data["params/robot/body_mass"] for e in episodes])
    assert np.ptp(masses, axis=0).max() > 0.05  # every episode ran with its own masses
    first = episodes[0]
    assert set(first.group("obs/policy")) == {"base_lin_vel", "base_ang_vel", "projected_gravity", "velocity_commands",
                                              "joint_pos_rel", "joint_vel", "last_action"}
    assert first.data["obs/policy/last_action"][1:].tolist() == first.data["actions"][:-1].tolist()
    terms = sum(first.group("reward_terms").values())
    assert np.allclose(np.maximum(terms, 0.0), first.data["rewards"], atol=1e-6)  # only_positive_rewards

    result = replay(quadruped["file"], "actions")
    assert result.bit_exact and result.first_divergence() is None
    assert result.replayed["robot/joint_pos"].shape[:2] == (3, max(e.length for e in episodes))
    for i, e in enumerate(episodes):  # the terminal state too (recorded before the env reset the world)
        assert np.array_equal(result.replayed["robot/root_pose_w"][i, :e.length],
                              e.data["next_states/robot/root_pose_w"])
    assert "bit-exact" in result.report()


@pytest.mark.bit_exact
def test_states_replay_equals_the_recording_exactly(quadruped):
    from legion.sim2real.trajectories import TrajectoryFile
    from legion.sim2real.trajectories.replay import replay

    result = replay(quadruped["file"], "states", episodes=[2, 0])
    with TrajectoryFile(quadruped["file"]) as f:
        for row, name in enumerate(["demo_2", "demo_0"]):
            episode = f.episode(name)
            for view, values in episode.group("states").items():
                assert np.array_equal(result.replayed[view][row, :episode.length], values), view
    assert result.bit_exact


def test_record_and_replay_on_the_command_line(cartpole, tmp_path, monkeypatch):
    assert cartpole["stdout"].count("episode ") == 3 and "wrote" in cartpole["stdout"]
    monkeypatch.chdir(tmp_path)
    code, out, err = legion_in_process("replay", str(cartpole["file"]))
    assert code == 0 and "bit-exact: every state equals the recording" in out, err[-3000:]
    code, out, err = legion_in_process("play", f"run={cartpole['run']}", "episodes=2", "record=played.h5")
    assert code == 0, err[-3000:]
    from legion.sim2real.trajectories import TrajectoryFile

    with TrajectoryFile(tmp_path / "played.h5") as f:
        assert len(f.episodes) == 2 and f.attrs["task"] == "cartpole"
    for args, message in ((["replay", "missing.h5"], "missing.h5 does not exist"),
                          (["replay", str(cartpole["file"]), "mode=forward"], "mode=forward: choose mode=actions"),
                          (["replay", str(cartpole["file"]), "episodes=9"], "has no episode 9; it has 3"),
                          (["dataset", "convert", str(cartpole["file"]), "format=csv"], "format=csv: choose")):
        code, _, err = legion_in_process(*args)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)


@pytest.mark.bit_exact
def test_recording_while_training_changes_nothing_the_run_learns(tmp_path):
    from legion.sim2real.trajectories import TrajectoryFile

    tiny = ["task=cartpole", "sim.num_envs=32", "agent.max_iterations=2", "agent.num_steps_per_env=8"]
    plain = train(compose(*tiny), tmp_path / "plain")
    recorded = train(compose(*tiny, "task.record.every=1", "task.record.episodes=2", "task.record.num_envs=2"),
                          tmp_path / "recorded")
    for a, b in zip(plain.ppo.get_policy().state_dict().values(), recorded.ppo.get_policy().state_dict().values()):
        assert torch.equal(a, b)
    for iteration in (1, 2):
        with TrajectoryFile(tmp_path / "recorded" / "trajectories" / f"iter_{iteration}.h5") as f:
            assert len(f.episodes) == 2 and f.attrs["checkpoint"].endswith(f"model_{iteration}.pt")
    assert not (tmp_path / "plain" / "trajectories").exists()
    with pytest.raises(configs.ConfigError, match="task.record.episodes=0: must be > 0"):
        api.validate(configs.compose("task=cartpole", "task.record.every=5", "task.record.episodes=0"))


# --- damaged files, other models, outputs that exist ------------------------------------------------
def test_truncated_corrupt_or_unfinished_files_are_refused_by_name(cartpole, tmp_path):
    from legion.sim2real.trajectories import TrajectoryFile, TrajectoryFileError

    data = cartpole["file"].read_bytes()
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(TrajectoryFileError, match="is not a readable HDF5 file \\(truncated or corrupt\\?\\)"):
        TrajectoryFile(truncated)

    corrupt = tmp_path / "corrupt.h5"
    shutil.copy(cartpole["file"], corrupt)
    with h5py.File(corrupt, "r") as f:
        offset = f["data/demo_1/actions"].id.get_chunk_info(0).byte_offset
    with open(corrupt, "r+b") as f:
        f.seek(offset + 4)
        byte = f.read(1)
        f.seek(offset + 4)
        f.write(bytes([byte[0] ^ 0xFF]))
    with TrajectoryFile(corrupt) as f:
        f.episode("demo_0")  # the undamaged episodes still read
        with pytest.raises(TrajectoryFileError, match="data/demo_1/actions cannot be read .* the file is corrupt"):
            f.episode("demo_1")

    unfinished = tmp_path / "unfinished.h5"
    shutil.copy(cartpole["file"], unfinished.with_name("unfinished.h5.partial"))
    with pytest.raises(TrajectoryFileError, match="unfinished.h5.partial is there: that recording never finished"):
        TrajectoryFile(unfinished)

    altered = tmp_path / "altered.h5"
    shutil.copy(cartpole["file"], altered)
    with h5py.File(altered, "r+") as f:
        del f["data/demo_2"]
    with pytest.raises(TrajectoryFileError, match="its episodes hold .* samples, /data says total=.*altered"):
        TrajectoryFile(altered)

    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(TrajectoryFileError, match="not a legion trajectory file"):
        TrajectoryFile(other)

    # A damaged object header: h5py raises RuntimeError (Object visitation failed), not OSError.
    damaged = tmp_path / "damaged.h5"
    shutil.copy(cartpole["file"], damaged)
    with h5py.File(damaged, "r") as f:
        header = h5py.h5o.get_info(f["data/demo_1/obs"].id).addr
    with open(damaged, "r+b") as f:
        f.seek(header)
        f.write(b"\xff" * 8)
    with pytest.raises(TrajectoryFileError, match="damaged.h5 is corrupt: .*bad object header.* Record or convert it"):
        TrajectoryFile(damaged)
    code, _, err = legion_in_process("replay", str(damaged))
    assert code == 2 and "damaged.h5 is corrupt" in err and "Traceback" not in err, err[-3000:]

    altered = tmp_path / "altered.h5"  # its config attribute no longer YAML the schema takes
    shutil.copy(cartpole["file"], altered)
    with h5py.File(altered, "r+") as f:
        f["data"].attrs["config"] = f["data"].attrs["config"][:200]
    code, _, err = legion_in_process("replay", str(altered))
    assert code == 2 and "altered.h5: the config it was recorded with cannot be read (" in err, err[-3000:]
    assert "the file is corrupt or was altered" in err and "Traceback" not in err


def test_a_recording_of_another_robot_model_is_refused(cartpole, tmp_path):
    from legion.sim2real.trajectories import TrajectoryFileError
    from legion.sim2real.trajectories.record import record_run
    from legion.sim2real.trajectories.replay import replay

    model = tmp_path / "cartpole.xml"
    shutil.copy(ROOT / "tasks" / "assets" / "cartpole.xml", model)
    record_run(cartpole["run"], 1, tmp_path / "demos.h5", overrides=[f"task.scene.robot.file={model}"])
    model.write_text(model.read_text().replace('mass="0.1"', 'mass="0.2"'))  # a heavier pole
    with pytest.raises(TrajectoryFileError, match="recorded with another robot model: .*cartpole.xml has sha256"):
        replay(tmp_path / "demos.h5")


def test_existing_outputs_are_never_overwritten_silently(cartpole, tmp_path):
    from legion.sim2real.trajectories import TrajectoryFileError, TrajectoryWriter
    from legion.sim2real.trajectories.lerobot import to_lerobot

    before = cartpole["file"].read_bytes()
    code, _, err = legion_in_process("record", f"run={cartpole['run']}", "episodes=1", f"out={cartpole['file']}")
    assert code == 2 and "exists; choose another out= or pass overwrite=true" in err
    assert cartpole["file"].read_bytes() == before
    with pytest.raises(TrajectoryFileError, match="exists; choose another out="):
        TrajectoryWriter(cartpole["file"], {"source": "sim", "config": ""})
    kept = tmp_path / "kept"  # a folder is no trajectory file, overwrite or not: refused before recording
    (kept / "mine").mkdir(parents=True)
    code, _, err = legion_in_process("record", f"run={cartpole['run']}", "episodes=1", f"out={kept}", "overwrite=true")
    assert code == 2 and "kept is a folder, not a trajectory file" in err and "Traceback" not in err, err[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and (kept / "mine").is_dir()
    folder = tmp_path / "dataset"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(TrajectoryFileError, match="exists and is not empty"):
        to_lerobot(cartpole["file"], folder)
    with pytest.raises(TrajectoryFileError, match="not a LeRobot dataset .* refusing to replace it"):
        to_lerobot(cartpole["file"], folder, overwrite=True)
    assert (folder / "notes.txt").read_text() == "mine"
    made = to_lerobot(cartpole["file"], tmp_path / "lerobot")
    to_lerobot(cartpole["file"], made, overwrite=True)  # a dataset is replaced when asked
    assert json.loads((made / "meta" / "info.json").read_text())["total_episodes"] == 3


def test_six_thousand_steps_of_64_envs_record_in_bounded_memory(tmp_path):
    """6,000 control steps x 64 cart-poles (384k env-steps, ~700 episodes written): the process
    grows by no more than a few MB after the first 1,000 steps (a leak of one episode's buffers
    per episode would add hundreds)."""
    from legion.sim2real.trajectories import TrajectoryFile, TrajectoryWriter
    from legion.sim2real.trajectories.record import file_attrs, record

    cfg = compose("task=cartpole", "sim.num_envs=64", "task.terminations.pole_fell.params.limit=100.0",
                  "task.terminations.cart_off_rail.params.limit=100.0")  # every episode runs its 500 steps
    env = api.make_env(cfg)
    steps, rss = [0], {}

    def policy(obs):
        steps[0] += 1
        if steps[0] in (1_000, 6_000):
            rss[steps[0]] = resident_mb()
        return 0.3 * torch.sin(torch.arange(env.num_envs, dtype=torch.float32)[:, None] + 0.01 * steps[0])

    written = 0
    with TrajectoryWriter(tmp_path / "long.h5", file_attrs(cfg, env)) as writer:
        for episode in record(env, policy, episodes=10**9):
            writer.add(episode)
            written += 1
            if steps[0] >= 6_000:
                break
    growth = rss[6_000] - rss[1_000]
    print(f"\nrecorded {written} episodes in 6,000 steps of 64 envs; RSS {rss[1_000]:.0f} -> {rss[6_000]:.0f} MB")
    assert written >= 640  # ten of each env's 500-step episodes
    assert growth < 25, f"RSS grew by {growth:.1f} MB between step 1,000 and 6,000"
    with TrajectoryFile(tmp_path / "long.h5") as f:
        assert len(f.episodes) == written and f.episode(f.episodes[-1]).length == 500  # time-outs


def resident_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


# --- the robot's log ------------------------------------------------------------------------------------
def test_a_robot_log_replays_in_newton_joint_by_joint(quadruped, tmp_path):
    """The edge runtime drives plain MuJoCo with Newton's solver settings and logs; converted, the
    log drives Newton with the logged targets and retraces the logged joints to ~1e-6 rad."""
    from legion.sim2real.deploy import ControlLoop, PolicyRunner, TrajectoryLog
    from legion.sim2real.deploy.log import MODES
    from legion.sim2real.deploy.mujoco_robot import MuJoCoRobot
    from legion.sim2real.export import export_run
    from legion.sim2real.sim2sim import physics_options
    from legion.sim2real.trajectories import TrajectoryFileError
    from legion.sim2real.trajectories.record import convert_robot_log
    from legion.sim2real.trajectories.replay import replay, write_outputs

    run = quadruped["run"]
    out, _ = export_run(run, steps=5)
    runner = PolicyRunner(out / "policy.onnx")
    settings = configs.load_run_config(run)
    robot = MuJoCoRobot(ROOT / "tasks" / "assets" / "quadruped.xml", runner.metadata,
                        options=physics_options("matched", settings.sim))
    logs = tmp_path / "logs"
    with TrajectoryLog(logs, runner) as log:
        loop = ControlLoop(robot, runner, now=robot.time, realtime=False, logger=log)
        for command in ([0.5, 0.0, 0.0], [0.0, 0.0, 0.5]):
            robot.reset()
            runner.reset()
            loop.run(20, command=command)
            log.end_episode()
    log0 = np.load(logs / "episode_000000.npz")
    assert log0["joint_pos"].shape == (20, 12) and log0["targets"].shape == (20, 12) and log0["obs"].shape == (20, 48)
    assert set(log0["mode"].tolist()) == {MODES.index("policy")} and np.isfinite(log0["targets"]).all()
    assert json.loads(str(log0["meta"]))["joint_names"] == runner.joint_names
    with pytest.raises(ValueError, match="already holds a log"):
        TrajectoryLog(logs, runner)

    converted = convert_robot_log(logs, run, tmp_path / "robot.h5")
    result = replay(converted)
    assert result.source == "robot" and result.error["robot/joint_pos"].shape == (2, 20)
    assert np.isfinite(result.error["robot/joint_pos"]).sum() == 2 * 19  # tick t's targets -> tick t + 1's state
    rmse = result.joint_rmse()
    assert rmse.shape == (2, 12) and rmse.max() < 1e-5, rmse.max()
    assert np.nanmax(result.error["robot/root_pose_w"]) < 1e-5
    moved = np.abs(result.recorded["robot/joint_pos"][:, -1] - result.initial["robot/joint_pos"]).max()
    assert moved > 0.05  # the joints really moved
    written = write_outputs(result, tmp_path / "replay", video=False, plots=True)
    assert {p.name for p in written} >= {"replay.json", "demo_0_joints.png", "demo_0_base.png",
                                         "demo_0_joint_error.png"}
    assert json.loads((tmp_path / "replay" / "replay.json").read_text())["joint_rmse"]["FL_calf_joint"] < 1e-5

    other = make_run(tmp_path / "other", "task=quadruped_flat", "seed=3")
    with pytest.raises(TrajectoryFileError, match="recorded with a policy exported from another run"):
        convert_robot_log(logs, other, tmp_path / "other.h5")


def test_a_log_folder_that_holds_a_log_or_is_a_file_is_refused_before_logging(tmp_path):
    """Refused by the constructor, before a robot runs; at the first episode's end a whole session
    would be lost."""
    from types import SimpleNamespace

    from legion.sim2real.deploy import TrajectoryLog

    policy = tmp_path / "policy.onnx"
    policy.write_bytes(b"onnx")
    runner = SimpleNamespace(policy=SimpleNamespace(path=policy))
    (tmp_path / "walk").mkdir()
    (tmp_path / "walk" / "episode_000000.npz").write_bytes(b"an earlier session")
    with pytest.raises(ValueError, match="walk already holds a log \\(episode_\\*.npz\\): log into an empty or new"):
        TrajectoryLog(tmp_path / "walk", runner)
    with pytest.raises(ValueError, match="policy.onnx is a file, not a folder: log into an empty or new folder"):
        TrajectoryLog(policy, runner)
    assert TrajectoryLog(tmp_path / "new" / "walk", runner).folder.is_dir()
    # replacing it, when asked: the earlier session goes whole (it held two episodes, the new one holds one)
    (tmp_path / "walk" / "episode_000001.npz").write_bytes(b"an earlier session")

    @dataclasses.dataclass
    class Layout:
        size: int = 0

    runner.metadata = SimpleNamespace(joint_names=["j"], control_dt=0.02, task="t", robot="r", config_sha256="",
                                      legion_version="", observation=Layout())
    with TrajectoryLog(tmp_path / "walk", runner, overwrite=True) as log:
        assert len(list((tmp_path / "walk").glob("episode_*.npz"))) == 2  # kept until it writes
        log.tick({"joint_pos": [0.1]}, np.zeros(1), "hold", 0.001, None, None)
    assert [p.name for p in (tmp_path / "walk").glob("episode_*.npz")] == ["episode_000000.npz"]
    assert np.load(tmp_path / "walk" / "episode_000000.npz")["joint_pos"].tolist() == [[np.float32(0.1)]]


# --- video and plots ------------------------------------------------------------------------------------
def test_rendered_frames_show_the_robot_and_change_over_time(quadruped, tmp_path):
    import imageio.v2 as imageio

    from legion.sim2real.trajectories import TrajectoryFile
    from legion.sim2real.trajectories.media import RenderingUnavailable, SceneRenderer, episode_frames
    from legion.sim2real.trajectories.replay import replay, write_outputs

    with TrajectoryFile(quadruped["file"]) as f:
        try:
            renderer = SceneRenderer(f.config, 96, 128)
        except RenderingUnavailable as e:
            pytest.skip(f"no offscreen OpenGL here: {e}")
        episode, joints = f.episode("demo_0"), f.attrs["joint_names"]
    states = list(episode_frames(episode))
    shares = [renderer.robot_fraction(states[t], joints) for t in (0, len(states) // 2, len(states) - 1)]
    renderer.close()
    assert min(shares) > 0.02, shares  # the robot covers a real part of every image

    result = replay(quadruped["file"], "actions", episodes=[0])
    written = write_outputs(result, tmp_path, video=True, plots=True, size=(96, 128))
    assert {p.name for p in written} >= {"demo_0.mp4", "demo_0_joints.png", "demo_0_base.png", "demo_0_rewards.png"}
    frames = np.stack([frame for frame in imageio.get_reader(tmp_path / "demo_0.mp4").iter_data()]).astype(np.float32)
    assert frames.shape == (episode.length + 1, 96, 128, 3)  # the initial state, then every step
    assert frames.mean() > 30 and frames.std() > 10  # neither black nor blank
    change = np.abs(frames[1:] - frames[:-1]).mean((1, 2, 3))
    assert (change > 0.1).mean() > 0.5 and np.abs(frames[-1] - frames[0]).mean() > 2  # the robot moves
    assert imageio.get_reader(tmp_path / "demo_0.mp4").get_meta_data()["fps"] == 50.0


# --- LeRobot ---------------------------------------------------------------------------------------------
def test_lerobot_dataset_follows_the_v3_layout(quadruped, tmp_path):
    """Checked against LeRobot 0.4's v3.0 code (lerobot/datasets/utils.py, lerobot_dataset.py)."""
    from legion.sim2real.trajectories import TrajectoryFile
    from legion.sim2real.trajectories.lerobot import to_lerobot

    root = to_lerobot(quadruped["file"], tmp_path / "ds")
    with TrajectoryFile(quadruped["file"]) as f:
        episodes = [f.episode(n) for n in f.episodes]
    total = sum(e.length for e in episodes)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet", "meta/info.json",
        "meta/stats.json", "meta/tasks.parquet"]
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 50 and info["robot_type"] == "quadruped"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, total, 1)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] is None and info["splits"] == {"train": "0:3"}
    features = info["features"]
    assert {"timestamp", "frame_index", "episode_index", "index", "task_index"} <= set(features)
    assert features["observation.state"]["shape"] == [37] and features["action"]["shape"] == [12]
    assert features["observation.policy"]["shape"] == [48] and features["observation.critic"]["shape"] == [49]
    for spec in features.values():
        assert spec["names"] is None or len(spec["names"]) == spec["shape"][0]

    data = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    assert data.num_rows == total
    action = data.schema.field("action").type  # datasets.Sequence(length=12): a fixed-size list
    assert pa.types.is_fixed_size_list(action) and action.list_size == 12 and action.value_type == pa.float32()
    assert data.schema.field("timestamp").type == pa.float32() and data.schema.field("index").type == pa.int64()
    columns = data.to_pydict()
    assert columns["index"] == list(range(total))
    assert np.array_equal(np.array(columns["action"][: episodes[0].length], np.float32), episodes[0].data["actions"])
    assert np.allclose(np.array(columns["timestamp"][:3]), [0.0, 0.02, 0.04])

    meta = pq.read_table(root / EPISODES).to_pydict()
    assert meta["length"] == [e.length for e in episodes] and meta["tasks"] == [["quadruped_flat"]] * 3
    assert meta["dataset_from_index"] == [0, episodes[0].length, episodes[0].length + episodes[1].length]
    assert meta["dataset_to_index"][-1] == total and meta["data/file_index"] == [0, 0, 0]
    assert len(meta["stats/action/q99"][0]) == 12
    tasks = pq.read_table(root / "meta" / "tasks.parquet")
    pandas = json.loads(tasks.schema.metadata[b"pandas"])
    assert (pandas["index_columns"] == ["__index_level_0__"]
            and tasks.to_pydict()["__index_level_0__"] == ["quadruped_flat"])

    stats = json.loads((root / "meta" / "stats.json").read_text())
    assert set(stats["action"]) == {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
    actions = np.concatenate([e.data["actions"] for e in episodes])
    assert np.allclose(stats["action"]["mean"], actions.mean(0), atol=1e-5)
    assert np.allclose(stats["action"]["std"], actions.std(0), atol=1e-5) and stats["action"]["count"] == [total]



@pytest.mark.skipif(not os.environ.get("LEGION_LEROBOT_PYTHON"),
                    reason="the lerobot package pins torch<2.11 and cannot share this environment (torch 2.13); "
                           "set LEGION_LEROBOT_PYTHON to a Python with lerobot installed to run this check")
def test_the_lerobot_package_loads_the_dataset_offline(cartpole, tmp_path):
    from legion.sim2real.trajectories import TrajectoryFile
    from legion.sim2real.trajectories.lerobot import to_lerobot
    from legion.sim2real.trajectories.media import RenderingUnavailable

    try:
        root = to_lerobot(cartpole["file"], tmp_path / "ds", video=True, size=(96, 128))
    except RenderingUnavailable:
        root = to_lerobot(cartpole["file"], tmp_path / "ds")
    script = textwrap.dedent(f"""
        import json
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
        ds = LeRobotDataset("local/legion", root={str(root)!r}, video_backend="pyav")
        item = ds[len(ds) - 1]
        print(json.dumps({{"frames": len(ds), "episodes": ds.num_episodes, "fps": ds.fps, "task": item["task"],
                          "action": item["action"].reshape(-1).tolist(), "episode": int(item["episode_index"]),
                          "image": list(item["observation.images.tracking"].shape)
                                   if "observation.images.tracking" in item else None}}))
    """)
    env = {"PATH": os.environ["PATH"], "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    loaded = subprocess.run([os.environ["LEGION_LEROBOT_PYTHON"], "-c", script], capture_output=True, text=True,
                            timeout=600, env=env, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    out = json.loads(loaded.stdout.strip().splitlines()[-1])
    with TrajectoryFile(cartpole["file"]) as f:
        last = f.episode(f.episodes[-1])
        total = f.attrs["total"]
    assert (out["frames"], out["episodes"], out["fps"], out["task"]) == (total, 3, 50, "cartpole")
    assert out["episode"] == 2 and out["action"] == pytest.approx(last.data["actions"][-1].tolist())
    assert out["image"] in (None, [3, 96, 128])
