"""Unitree SDK2 over DDS: the messages and their CRC, the motor maps, and the edge runtime driving
`legion bridge`'s simulated Go2 over loopback DDS, faults included (sim2real/deploy/unitree.py,
sim2real/bridge.py)."""

import os
import random
import re
import signal
import struct
import subprocess
import sys
import threading
import time

import cyclonedds.idl as idl
import numpy as np
import pytest

from conftest import ctrl_c_inside_a_finalizer, export_untrained_run, legion_in_process
from legion.sim2real.deploy import ControlLoop, PolicyRunner, StateError
from legion.sim2real.deploy import unitree as u
from legion.tasks.sim import resolve_asset

# One DDS domain per test process (xdist workers run side by side on the same loopback).
DOMAIN = 60 + int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
MESSAGES = (u.GoLowCmd, u.GoLowState, u.HgLowCmd, u.HgLowState)


def unitree_crc_py(words: list[int]) -> int:
    """unitree_sdk2py/utils/crc.py's ``_crc_py`` (Unitree's crc32_core), bit by bit, as the SDK has it."""
    crc, polynomial = 0xFFFFFFFF, 0x04C11DB7
    for current in words:
        bit = 1 << 31
        for _ in range(32):
            crc = ((crc << 1) & 0xFFFFFFFF) ^ polynomial if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
            if current & bit:
                crc ^= polynomial
            bit >>= 1
    return crc


def randomized(kind: type, rng: random.Random):
    """A message with every motor's numbers and the IMU drawn at random (as a robot's would be)."""
    message = kind()
    motors = message.motor_cmd if hasattr(message, "motor_cmd") else message.motor_state
    for m in motors:
        m.mode, m.q, m.dq = rng.randrange(256), rng.uniform(-3, 3), rng.uniform(-20, 20)
        if hasattr(m, "kp"):
            m.kp, m.kd, m.tau = rng.uniform(0, 100), rng.uniform(0, 5), rng.uniform(-40, 40)
    if hasattr(message, "imu_state"):
        message.imu_state.quaternion = [rng.uniform(-1, 1) for _ in range(4)]
        message.imu_state.gyroscope = [rng.uniform(-5, 5) for _ in range(3)]
    return message


@pytest.mark.parametrize("kind", MESSAGES, ids=lambda k: k.__name__)
def test_the_crc_is_unitrees_crc32_core_over_the_c_struct(kind):
    rng = random.Random(0)
    message = randomized(kind, rng)
    packed = u._STRUCT[kind].pack(*u._flat(message))
    words = list(struct.unpack(f"<{len(packed) // 4}I", packed))[:-1]  # the crc word left out, as the SDK does
    assert u.message_crc(message) == unitree_crc_py(words)
    before = u.message_crc(message)
    (message.motor_cmd if hasattr(message, "motor_cmd") else message.motor_state)[3].q += 1e-3
    assert u.message_crc(message) != before


@pytest.mark.parametrize("kind", (*MESSAGES, u.SportModeState), ids=lambda k: k.__name__)
def test_the_fast_cdr_codec_writes_cyclonedds_own_bytes(kind):
    message = randomized(kind, random.Random(1)) if kind is not u.SportModeState else kind(velocity=[0.5, -0.25, 1.0])
    data = message.serialize()
    assert data == idl.IdlStruct.serialize(message)  # cyclonedds' own (slow) serializer, byte for byte
    back = kind.deserialize(data)
    assert u._flat(back) == u._flat(kind.__idl__.deserialize(data))
    assert np.allclose(u._flat(back), u._flat(message), rtol=1e-6)  # float32 on the wire


def _urdf_joints(uri: str) -> list[str]:
    text = resolve_asset(uri).read_text()
    return re.findall(r'<joint\s+name="([^"]+)"\s+type="(?:revolute|continuous)"', text)


def test_motor_maps_name_the_robot_files_joints():
    g1 = _urdf_joints("package://example-robot-data/robots/g1_description/urdf/g1_29dof_rev_1_0.urdf")
    assert list(u.ROBOTS["g1"].motors) == g1  # Unitree's G1 motor order is its URDF's joint order
    go2 = _urdf_joints("package://example-robot-data/robots/go2_description/urdf/go2.urdf")
    assert sorted(u.ROBOTS["go2"].motors) == sorted(go2) and len(go2) == 12
    assert u.ROBOTS["go2"].motors[:3] == ("FR_hip_joint", "FR_thigh_joint", "FR_calf_joint")  # motor 0-2: front right


def test_a_policy_for_other_joints_is_refused_naming_them():
    go2 = list(u.ROBOTS["go2"].motors)
    order = u.motor_order(u.ROBOTS["go2"], sorted(go2))
    assert [u.ROBOTS["go2"].motors[i] for i in order] == sorted(go2)
    with pytest.raises(ValueError, match=r"no go2 motor drives \['FL_knee'\].*leaves motors \['FL_calf_joint'\]"):
        u.motor_order(u.ROBOTS["go2"], [n if n != "FL_calf_joint" else "FL_knee" for n in go2])


# --- against the simulated robot, over DDS on loopback ----------------------------------------------
@pytest.fixture(scope="module")
def go2_export(tmp_path_factory):
    run = tmp_path_factory.mktemp("go2_run")
    export_untrained_run(run, "task=quadruped_flat", "robot=go2")
    return run / "exported"


@pytest.fixture
def bridge(go2_export):
    from legion.sim2real.bridge import UnitreeBridge

    sim = UnitreeBridge(go2_export, "go2", domain=DOMAIN, interface="lo")
    stop = threading.Event()
    thread = threading.Thread(target=sim.run, kwargs={"should_stop": stop.is_set, "duration_s": 120}, daemon=True)
    thread.start()
    yield sim
    stop.set()
    thread.join(timeout=5)
    sim.close()


def sim_seconds(bridge, seconds: float, write=None) -> None:
    """Waits until the bridge's physics has run ``seconds`` more, calling ``write()`` every 20 ms."""
    end = bridge.sim.data.time + seconds
    deadline = time.monotonic() + 30 * seconds + 5
    while bridge.sim.data.time < end or bridge.hold:
        assert time.monotonic() < deadline, "the bridge's physics did not advance"
        if write is not None:
            write()
        time.sleep(0.02)


def test_deploy_drives_the_bridge_in_the_motor_order_and_the_robot_stands_then_damps(bridge, go2_export):
    runner = PolicyRunner(go2_export / "policy.onnx")
    robot = u.UnitreeRobot("go2", runner, domain=DOMAIN, interface="lo")
    state = robot.read_state()
    sim = bridge.sim
    assert np.allclose(state["joint_pos"], sim.data.qpos[sim.qpos_ids], atol=1e-6)  # policy order both sides
    assert np.allclose(state["base_quat"], [0, 0, 0, 1]) and "base_lin_vel" in state  # the policy reads it
    default = np.asarray(runner.metadata.default_joint_pos, np.float32)
    targets = default + np.linspace(-0.05, 0.05, len(default)).astype(np.float32)  # a distinct target per joint
    sim_seconds(bridge, 1.0, lambda: robot.write_targets(targets))
    applied = [bridge.last_command.motor_cmd[i] for i in u.motor_order(u.ROBOTS["go2"], runner.joint_names)]
    assert np.allclose([c.q for c in applied], targets, atol=1e-6)
    assert np.allclose([c.kp for c in applied], runner.metadata.joint_stiffness)
    standing = sim.data.qpos[2]
    assert standing > 0.22, f"the Go2 did not stand on the policy's gains: base at {standing:.3f} m"
    sim_seconds(bridge, 1.0, robot.damp)
    last = bridge.last_command.motor_cmd[0]
    assert last.kp == 0 and last.kd == u.ROBOTS["go2"].damping_kd
    assert sim.data.qpos[2] < standing - 0.05, "damping (kp = 0) should let the robot sink"
    robot.close()


def test_a_robot_that_stops_publishing_is_held_then_stopped_and_damped(bridge, go2_export):
    runner = PolicyRunner(go2_export / "policy.onnx")
    robot = u.UnitreeRobot("go2", runner, domain=DOMAIN, interface="lo")
    loop = ControlLoop(robot, runner)
    loop.run(10)
    assert loop.stats.modes["policy"] == 10
    bridge.faults.add("silent")
    loop.run(30)  # 0.6 s: stale after 50 ms (hold), stopped after 250 ms
    assert loop.stats.modes["hold"] > 0 and loop.stats.modes["stop"] > 0
    assert "old" in loop.stopped
    time.sleep(0.1)
    assert bridge.last_command.motor_cmd[0].kp == 0, "the stopped loop should send damping"
    robot.close()


@pytest.mark.parametrize("fault, message", [("bad_crc", "CRC"), ("nan", "non-finite")])
def test_a_lowstate_with_a_bad_crc_or_nan_stops_the_loop(bridge, go2_export, fault, message):
    runner = PolicyRunner(go2_export / "policy.onnx")
    robot = u.UnitreeRobot("go2", runner, domain=DOMAIN, interface="lo")
    loop = ControlLoop(robot, runner)
    loop.run(5)
    bridge.faults.add(fault)
    time.sleep(0.05)
    with pytest.raises(StateError, match=message):
        loop.run(5)
    assert message in loop.stopped
    time.sleep(0.1)
    assert bridge.last_command.motor_cmd[0].kp == 0  # damped on the way out
    robot.close()


def test_a_lowcmd_with_a_bad_crc_is_dropped_by_the_bridge(bridge):
    from cyclonedds.pub import DataWriter
    from cyclonedds.topic import Topic

    p = u.participant(DOMAIN, "lo")
    writer = DataWriter(p, Topic(p, u.LOWCMD, u.GoLowCmd))
    cmd = u.GoLowCmd()
    cmd.crc = u.message_crc(cmd) ^ 1
    deadline = time.monotonic() + 5
    while bridge.bad_crc == 0 and time.monotonic() < deadline:
        writer.write(cmd)
        time.sleep(0.02)
    assert bridge.bad_crc > 0 and bridge.last_command is None and bridge.hold  # never applied


def test_a_network_interface_or_domain_dds_cannot_use_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"domain=999: a DDS domain id is 0-232"):
        u.participant(999, "lo")
    with pytest.raises(ValueError, match=r"DDS domain 7 on interface=nosuch0 could not start .* the network "
                                         r"interfaces here: .*\blo\b"):
        u.participant(7, "nosuch0")


def test_a_go2_policy_on_a_g1_is_refused_at_start_naming_the_joints(go2_export):
    runner = PolicyRunner(go2_export / "policy.onnx")
    with pytest.raises(ValueError, match=r"no g1 motor drives \['FL_hip_joint'.*undriven"):
        u.UnitreeRobot("g1", runner, domain=DOMAIN, interface="lo")


def test_no_robot_state_refuses_to_start(go2_export):
    runner = PolicyRunner(go2_export / "policy.onnx")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no rt/lowstate within 0.3 s"):
        u.UnitreeRobot("go2", runner, domain=DOMAIN + 40, interface="lo", timeout_s=0.3)
    assert time.monotonic() - start < 3


def test_legion_deploy_against_the_bridge_status_log_and_ctrl_c_damps(bridge, go2_export, tmp_path):
    environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
    deploy = subprocess.Popen(
        [sys.executable, "-m", "legion", "deploy", f"run={go2_export}", "robot=go2", f"domain={DOMAIN}", "interface=lo",
         "confirm=false", "stand_s=0.5", "hold_s=0.2", "command=[0.5,0,0]", f"log={tmp_path / 'log'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ)
    lines = []
    try:
        assert deploy.stdout is not None
        for line in deploy.stdout:
            lines.append(line)
            if line.startswith("[deploy] policy ") and " Hz " in line:  # a status line of the policy phase
                break
        deploy.send_signal(signal.SIGINT)
        out, _ = deploy.communicate(timeout=30)
    finally:
        deploy.kill()
    text = "".join(lines) + out
    assert deploy.returncode == 0, text
    status = r"\[deploy\] policy +\d+\.\d s \| [\d.]+ Hz \| deadline misses \d+ \| latency p50 \d+ us"
    assert re.search(status, text), text
    assert "stopped (interrupted); damping sent" in text, text
    assert bridge.last_command.motor_cmd[0].kp == 0 and bridge.last_command.motor_cmd[0].kd > 0
    episode = np.load(tmp_path / "log" / "episode_000000.npz")
    assert (episode["mode"] == 0).sum() >= 40 and np.allclose(episode["command"][0], [0.5, 0, 0])
    # what calibrating the simulator needs besides the policy's state: the motors' torque, the accelerometer
    torque = episode["joint_torque"]  # (NaN rows: ticks after the stop, where no state was read)
    assert torque.shape == episode["joint_pos"].shape and np.nanmax(np.abs(torque)) > 1
    assert 5 < np.nanmedian(np.linalg.norm(episode["base_accel"], axis=1)) < 15  # gravity's 9.81, standing/walking


def test_legion_deploy_into_a_log_folder_that_holds_a_log_is_refused_before_it_reaches_the_robot(go2_export, tmp_path):
    (tmp_path / "walk").mkdir()
    (tmp_path / "walk" / "episode_000000.npz").write_bytes(b"an earlier session")
    # No robot on this domain: reaching for one would wait 2 s and fail on the missing rt/lowstate instead.
    code, out, err = legion_in_process("deploy", f"run={go2_export}", "robot=go2", f"domain={DOMAIN + 40}",
                                       "interface=lo", "confirm=false", f"log={tmp_path / 'walk'}")
    assert code == 2 and "walk already holds a log (episode_*.npz): log into an empty or new folder" in err, err
    assert "Traceback" not in err and "overwrite" not in err and "[deploy]" not in out, (out, err)
    assert (tmp_path / "walk" / "episode_000000.npz").read_bytes() == b"an earlier session"


def test_ctrl_c_inside_a_finalizer_stops_deploy_and_the_bridge(bridge, go2_export):
    """Ctrl-C as a flag in both loops that run until stopped: deploy's policy phase (its status
    line runs between ticks) and a bridge ticking in the main thread (its status, once a second).
    Handled inside a finalizer, a KeyboardInterrupt would be dropped and both would run on to
    their 20 s."""
    from legion.sim2real.bridge import UnitreeBridge

    def say(line):
        if line.startswith("[deploy] policy ") and " Hz " in line:
            ctrl_c_inside_a_finalizer()

    start = time.monotonic()
    result = u.deploy(go2_export, "go2", DOMAIN, "lo", command=(0.5, 0.0, 0.0), duration_s=20, stand_s=0.3,
                      hold_s=0.2, confirm=False, say=say)
    assert result["stopped"] == "interrupted" and time.monotonic() - start < 10
    assert bridge.last_command.motor_cmd[0].kp == 0 and bridge.last_command.motor_cmd[0].kd > 0  # damping

    alone = UnitreeBridge(go2_export, "go2", domain=DOMAIN + 50, interface="lo")
    start = time.monotonic()
    summary = alone.run(20, status=lambda b: ctrl_c_inside_a_finalizer())
    alone.close()
    assert time.monotonic() - start < 5 and 0 < summary["ticks"] < 3 / alone.period


def test_legion_bridge_command_serves_a_client(go2_export):
    bridge = subprocess.Popen([sys.executable, "-m", "legion", "bridge", f"run={go2_export.parent}", "robot=go2",
                               f"domain={DOMAIN + 20}", "duration_s=6"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        runner = PolicyRunner(go2_export / "policy.onnx")
        robot = u.UnitreeRobot("go2", runner, domain=DOMAIN + 20, interface="lo", timeout_s=20)
        for _ in range(25):
            robot.write_targets(np.asarray(runner.metadata.default_joint_pos, np.float32))
            time.sleep(0.02)
        robot.close()
        out, _ = bridge.communicate(timeout=30)
    finally:
        bridge.kill()
    assert bridge.returncode == 0, out
    assert re.search(r"\[bridge\] go2 sim +[\d.]+ s \| LowCmd \d+ \(bad CRC 0\)", out), out
    assert '"waiting_for_command": false' in out, out


def test_excitation_routines_start_and_end_at_the_default_pose_and_sweep_what_they_say():
    from legion.sim2real.deploy.excite import Excitation

    chirp = Excitation("chirp", amplitude=0.1, duration_s=20.0)
    t = np.arange(0, 20.0001, 0.001)
    x = np.array([chirp.offsets(s, 12) for s in t])
    assert np.abs(x[0]).max() == 0 and np.abs(x[-1]).max() < 1e-9 and np.abs(x).max() <= 0.1
    assert not np.allclose(x[:, 0], x[:, 1])  # the joints are phase-shifted
    for start in (2.0, 17.0):  # the frequency from the zero crossings of joint 0 over 1 s
        window = x[(t >= start) & (t < start + 1.0), 0]
        crossings = np.count_nonzero(np.diff(np.sign(window)) != 0)
        assert crossings / 2 == pytest.approx(chirp.frequency(start + 0.5), abs=0.6)
    steps = Excitation("steps", amplitude=0.2, duration_s=10.0)
    levels = np.array([steps.offsets(s, 12) for s in np.arange(1.0, 9.0, 0.01)])
    assert set(np.round(np.unique(levels), 6)) == {-0.2, 0.0, 0.2}
    for bad, message in ((dict(name="sine"), "excite=sine: choose one of chirp, steps"),
                         (dict(amplitude=-0.1), "needs amplitude > 0 \\(got -0.1\\)"),
                         (dict(duration_s=1.0), "duration_s > 2 fade_s \\(got 1.0, 1.0\\)")):
        with pytest.raises(ValueError, match=message):
            Excitation(**bad)


def test_deploy_excites_a_hung_robot_through_the_safety_layer_and_logs_it(go2_export, tmp_path):
    """`legion deploy excite=chirp duration_s=0` against `legion bridge hung=true`: a 3 s chirp
    instead of the policy; its episode holds the routine's targets tick for tick, every joint
    follows them (the legs in the air), and the motors' torques are logged."""
    from legion.sim2real.bridge import UnitreeBridge
    from legion.sim2real.deploy.excite import Excitation

    bridge = UnitreeBridge(go2_export, "go2", domain=DOMAIN + 30, interface="lo", hung=True)
    stop = threading.Event()
    thread = threading.Thread(target=bridge.run, kwargs={"should_stop": stop.is_set, "duration_s": 60}, daemon=True)
    thread.start()
    try:
        routine = Excitation("chirp", amplitude=0.1, duration_s=3.0, f_max=2.0, fade_s=0.5)
        result = u.deploy(go2_export, "go2", DOMAIN + 30, "lo", duration_s=0, stand_s=0.5, hold_s=0.3,
                          confirm=False, log_dir=tmp_path, say=lambda line: None, excite=routine)
        height = float(bridge.sim.data.qpos[2])
    finally:
        stop.set()
        thread.join(timeout=5)
        bridge.close()
    assert result["stopped"] is None and len(result["logs"]) == 1
    assert height > 0.5  # held in the air
    episode = np.load(result["logs"][0])
    default = np.asarray(PolicyRunner(go2_export / "policy.onnx").metadata.default_joint_pos)
    ticks = len(episode["targets"])
    assert ticks == 150 and (episode["mode"] == 0).all() and np.isnan(episode["actions"]).all()
    expected = np.array([routine.offsets(k * 0.02, 12) for k in range(ticks)])
    assert np.allclose(episode["targets"] - default, expected, atol=1e-6)
    moved = episode["joint_pos"] - default
    # the joints follow within a tick or two of the LowCmd and LowState round trip (1.0 measured at lags 1-2)
    follow = [min(np.corrcoef(moved[10 + lag:, j], expected[10:ticks - lag, j])[0, 1] for j in range(12))
              for lag in (1, 2)]
    assert max(follow) > 0.95, follow
    assert moved.std(0) == pytest.approx(expected.std(0), rel=0.2)
    assert np.nanmax(np.abs(episode["joint_torque"])) > 0.1  # the legs' own weight and inertia, in the air
