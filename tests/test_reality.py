"""A robot stand-in that is not the training model (legion/sim2real/reality.py): reality files
checked by name, each effect acting as written (latency at physics-step resolution with its
jitter, the drivers' gains, gear play and torque limit, friction, payload, sensors), the shipped
realities standing a Go2, and `legion sim2sim` / `legion bridge` running one."""

import json
import re

import numpy as np
import pytest
import torch

from conftest import export_untrained_run, legion_in_process, make_env
from legion.configs import compose
from legion.sim2real.reality import Joints, Latency, Reality, RealityRobot, load_reality

SHIPPED = ("go2_worn_motors", "go2_payload", "go2_backlash", "go2_gear_play")


@pytest.fixture(scope="module")
def go2(tmp_path_factory):
    """An untrained Go2 quadruped_flat run with its export (robot.mjb: the model as trained)."""
    run = tmp_path_factory.mktemp("go2")
    made = export_untrained_run(run, "task=quadruped_flat", "robot=go2")
    return {"run": run, "mjb": made["out"] / "robot.mjb", "meta": _meta(made["out"])}


def _meta(out):
    from legion.sim2real.deploy.contract import PolicyContract

    return PolicyContract.load(out / "policy.json")


def _reality(tmp_path, text: str):
    path = tmp_path / "reality.yaml"
    path.write_text(text)
    return path


def _stand(robot, meta, seconds: float) -> float:
    """Holds the default pose for ``seconds``; the base height [m] at the end."""
    for _ in range(round(seconds / (meta.physics_dt * meta.decimation))):
        robot.write_targets(np.asarray(meta.default_joint_pos))
    return float(robot.data.qpos[2])


@pytest.mark.parametrize("text, message", [
    ("latency_ms: {mena: 3}", r"Key 'mena' not in 'Latency'"),
    ("lantency_ms: {mean: 3}", r"Key 'lantency_ms' not in 'Reality'"),
    ("latency_ms: {mean: 3, jitter: -1}", r"latency_ms.jitter=-1.0: must be >= 0"),
    ("joints: {'.*_calf_joint': {backlash: -0.1}}", r"joints..\*_calf_joint.backlash=-0.1: must be >= 0"),
    ("base: {com_offset_m: [0.1, 0]}", r"base.com_offset_m=\[0.1, 0.0\]: give \[x, y, z\]"),
    ("physics_hz: fast", r"Value 'fast' of type 'str' could not be converted to Float"),
])
def test_a_reality_file_that_is_wrong_is_refused_by_name(tmp_path, text, message):
    with pytest.raises(ValueError, match=r"reality=.*reality.yaml: .*" + message):
        load_reality(_reality(tmp_path, text))


def test_a_reality_the_robot_cannot_be_made_of_is_refused_naming_what_is_wrong(go2, tmp_path):
    with pytest.raises(ValueError, match=r"joints \['.\*_knee'\] match none of the policy's joints \(FL_hip_joint"):
        RealityRobot(go2["mjb"], go2["meta"], load_reality(_reality(tmp_path, "joints: {'.*_knee': {kp_scale: 0.5}}")))
    with pytest.raises(ValueError, match=r"physics_hz=300 does not divide the caller's step of 5 ms"):
        RealityRobot(go2["mjb"], go2["meta"], Reality(physics_hz=300))
    with pytest.raises(ValueError, match=r"no such file, nor a shipped reality \(go2_backlash, go2_gear_play, "
                                         r"go2_payload"):
        load_reality("go2_on_ice")
    with pytest.raises(ValueError, match=r"reality=.*: while parsing a flow mapping .* line 1"):
        load_reality(_reality(tmp_path, "latency_ms: {mean: 8, jitter: 2"))
    with pytest.raises(ValueError, match=r"latency_ms.mean=nan: not a finite number; base.added_mass_kg=inf: not a "
                                         r"finite number; base.com_offset_m\[2\]=inf: not a finite number; "
                                         r"joints..\*_calf_joint.kp_scale=-1.0: must be > 0; "
                                         r"joints..\*_calf_joint.torque_speed=.*: both must be > 0; "
                                         r"encoders.velocity_noise=-0.1: must be >= 0"):
        load_reality(_reality(tmp_path, "latency_ms: {mean: .nan}\nbase: {added_mass_kg: .inf, com_offset_m: [0, 0, "
                                        ".inf]}\njoints: {'.*_calf_joint': {kp_scale: -1, torque_speed: {saturation: "
                                        "40, velocity_limit: 0}}}\nencoders: {velocity_noise: -0.1}"))


def test_a_reality_without_its_own_rate_steps_a_tick_the_exports_step_does_not_divide(go2):
    """The bridge ticks every 2 ms, the Go2's export steps every 5: a reality that names no rate of
    its own steps the 2 ms tick whole, and a 20 ms tick in four of the export's 5 ms steps."""
    assert go2["meta"].physics_dt == pytest.approx(0.005)
    for tick_s, substeps in ((0.002, 1), (0.02, 4), (0.005, 1)):
        robot = RealityRobot(go2["mjb"], go2["meta"], Reality(), tick_s=tick_s)
        assert robot.substeps == substeps and robot.model.opt.timestep == pytest.approx(tick_s / substeps)


def test_commands_act_after_their_latency_at_physics_step_resolution_with_its_jitter(go2):
    """1 kHz physics, ticks of 1 ms: a command sent at a tick acts from the 7th physics step on
    with a latency of 7 ms; with a jitter of 3 ms the delays of 4,000 commands have that mean and
    spread (a normal cut at zero: at 7 ms mean, 1 in 100 is cut)."""
    meta = go2["meta"]
    robot = RealityRobot(go2["mjb"], meta, Reality(physics_hz=1000, latency_ms=Latency(7.0)), tick_s=0.001)
    default, moved = np.asarray(meta.default_joint_pos), np.asarray(meta.default_joint_pos) + 0.1
    robot.physics_step(moved)
    acting = [bool(np.allclose(robot.acting[0], moved))]
    for _ in range(9):
        robot.physics_step()
        acting.append(bool(np.allclose(robot.acting[0], moved)))
    assert acting == [False] * 7 + [True] * 3
    jittery = RealityRobot(go2["mjb"], meta, Reality(physics_hz=1000, latency_ms=Latency(7.0, 3.0)), tick_s=0.001)
    for _ in range(4000):
        jittery.send(default)
    delays = np.array([c[0] - jittery.data.time for c in jittery.in_flight]) * 1e3
    assert delays.min() >= 0 and np.mean(delays) == pytest.approx(7.0, abs=0.15)
    assert np.std(delays) == pytest.approx(3.0, rel=0.06)


def test_a_calibration_candidate_runs_each_step_on_the_command_expected_to_have_arrived(go2):
    """``at_arrival`` (calibration's candidate models), 1 kHz physics: with a latency of 7.4 ms a
    command sent at a tick drives the 8th physics step (7-8 ms) for its last 60% and every one after;
    with 7 ms it acts from the 8th on, as a reality's. With a jitter of 1.5 ms each step runs on the
    share of it a command arriving at a normal draw about 7.4 ms has arrived for, on average: the
    mean over 20,000 draws (within 0.01: 3 of its standard errors). The share read back from the
    torque the drivers applied, kp (q* - q) - kd dq."""
    meta = go2["meta"]
    default, moved = np.asarray(meta.default_joint_pos), np.asarray(meta.default_joint_pos) + 0.1
    arrivals = np.random.default_rng(0).normal(7.4, 1.5, 20_000)
    drawn = [float(np.clip(k + 1 - arrivals, 0.0, 1.0).mean()) for k in range(14)]
    for latency, expected, tolerance in ((Latency(7.4), [0.0] * 7 + [0.6] + [1.0] * 6, 1e-6),
                                         (Latency(7.0), [0.0] * 7 + [1.0] * 7, 1e-6),
                                         (Latency(7.4, 1.5), drawn, 0.01)):
        robot = RealityRobot(go2["mjb"], meta, Reality(physics_hz=1000, latency_ms=latency), tick_s=0.001,
                             at_arrival=True)
        kp, kd = robot.gains[0], robot.gains[1]
        shares = []
        for k in range(14):
            q, dq = robot.data.qpos[robot.qpos_ids].copy(), robot.data.qvel[robot.qvel_ids].copy()
            robot.physics_step(moved if k == 0 else None)
            shares.append(float(np.mean((q + (robot.tau + kd * dq) / kp - default) / 0.1)))
        assert shares == pytest.approx(expected, abs=tolerance), latency
    assert 0.05 < drawn[5] < 0.2 and 0.8 < drawn[9] < 0.95  # (the jitter spreads the command over several steps)
    assert not robot.in_flight and np.allclose(robot.acting[0], moved)  # retired 4 std past its arrival


def test_the_drivers_and_joints_of_a_reality_act_as_written(go2, tmp_path):
    """At rest in the default pose, targets 0.1 rad off: the calf motors push with 0.5 kp on the
    error less half the gear play (0.04 rad), clipped at their 5 N m limit where that is less; the
    thighs keep the model's drivers. The joints carry the written friction and armature."""
    meta = go2["meta"]
    reality = load_reality(_reality(tmp_path, """
joints:
  FL_calf_joint: {kp_scale: 0.5, backlash: 0.04, coulomb_friction: 0.3, viscous_friction: 0.1, armature: 0.05}
  .*_calf_joint: {kp_scale: 0.5, backlash: 0.04, torque_limit: 5.0}
"""))
    nominal = RealityRobot(go2["mjb"], meta, Reality())
    robot = RealityRobot(go2["mjb"], meta, reality)
    kp = np.asarray(meta.joint_stiffness)
    names = meta.joint_names
    calf, fl_calf, thigh = names.index("FR_calf_joint"), names.index("FL_calf_joint"), names.index("FR_thigh_joint")
    target = np.asarray(meta.default_joint_pos) + 0.1
    robot.physics_step(target)
    nominal.physics_step(target)
    assert robot.tau[fl_calf] == pytest.approx(min(0.5 * kp[fl_calf] * 0.08, meta.effort_limits[fl_calf]), rel=1e-6)
    assert robot.tau[calf] == pytest.approx(min(0.5 * kp[calf] * 0.08, 5.0), rel=1e-6)
    assert robot.tau[thigh] == pytest.approx(nominal.tau[thigh], rel=1e-6)
    assert nominal.tau[calf] == pytest.approx(min(kp[calf] * 0.1, meta.effort_limits[calf]), rel=1e-6)
    dof = robot.qvel_ids[fl_calf]
    assert robot.model.dof_frictionloss[dof] == 0.3 and robot.model.dof_armature[dof] == 0.05
    assert robot.model.dof_damping[dof] == pytest.approx(nominal.model.dof_damping[dof] + 0.1)
    assert robot.model.dof_frictionloss[robot.qvel_ids[calf]] == 0.0  # FR's calf: the second pattern


def test_a_payload_or_weaker_drivers_make_the_go2_stand_lower_and_each_shipped_reality_stands_it(go2):
    """Holding the default pose for 1.5 s: 3 kg on the base, or the worn motors' 85% kp, lower it
    by more than 5 mm against the nominal model; every shipped reality keeps it standing."""
    meta = go2["meta"]
    nominal = _stand(RealityRobot(go2["mjb"], meta, Reality()), meta, 1.5)
    heights = {name: _stand(RealityRobot(go2["mjb"], meta, load_reality(name)), meta, 1.5) for name in SHIPPED}
    print(f"base height nominal {nominal:.4f} m, " + ", ".join(f"{k} {v:.4f}" for k, v in heights.items()))
    assert heights["go2_payload"] < nominal - 0.005 and heights["go2_worn_motors"] < nominal - 0.005
    assert all(h > 0.2 for h in heights.values())


def test_a_hung_robots_legs_swing_alike_whatever_its_base_carries(go2):
    """Hung (a gantry holds the base), the legs swing against the world, not against the base's own
    inertia: a 3 kg payload off the base's centre changes a 0.4 rad swing by under 1e-5 rad (2e-7
    here), where on the floor it sags the robot (above). Held only in place, the base moved within
    each step: 4e-3 rad apart, and a payload's calves fitted 11% stiffer than they were."""
    from legion.sim2real.reality import Base

    meta = go2["meta"]
    default = np.asarray(meta.default_joint_pos, np.float64)
    swings = []
    for base in (Base(), Base(added_mass_kg=3.0, com_offset_m=[0.04, 0.0, 0.02])):
        robot = RealityRobot(go2["mjb"], meta, Reality(base=base))
        robot.hang()
        robot.reset(joint_pos=default)
        swing = []
        for tick in range(50):
            robot.write_targets(default + 0.3 * np.sin(2 * np.pi * 2.0 * tick * meta.control_dt))
            swing.append(robot.data.qpos[robot.qpos_ids].copy())
        swings.append(np.array(swing))
    assert np.abs(swings[0] - default).max() > 0.1  # (they swung)
    assert np.abs(swings[1] - swings[0]).max() < 1e-5


def test_the_sensors_read_with_the_reality_noise_and_bias(go2, tmp_path):
    meta = go2["meta"]
    reality = load_reality(_reality(tmp_path, """
encoders: {position_noise: 0.01, position_bias: 0.02, velocity_noise: 0.5}
imu: {gyro_noise: 0.1, gyro_bias: [0.05, 0.0, -0.05]}
"""))
    robot = RealityRobot(go2["mjb"], meta, reality)
    truth = robot.data.qpos[robot.qpos_ids].copy()
    readings = [robot.read_state() for _ in range(2000)]
    error = np.array([r["joint_pos"] for r in readings]) - truth
    assert error.mean() == pytest.approx(0.02, abs=4 * 0.01 / np.sqrt(error.size))
    assert error.std() == pytest.approx(0.01, rel=0.05)
    gyro = np.array([r["base_ang_vel"] for r in readings])
    assert np.allclose(gyro.mean(0), [0.05, 0.0, -0.05], atol=4 * 0.1 / np.sqrt(2000))
    assert np.array([r["joint_vel"] for r in readings]).std() == pytest.approx(0.5, rel=0.05)


def test_legion_sim2sim_runs_the_policy_on_a_reality(go2, tmp_path):
    """The MuJoCo column is the reality's robot (its episode differs from the nominal model's);
    the Newton column is untouched."""

    results = {}
    for name in ("nominal", "go2_payload"):
        code, out, err = legion_in_process("sim2sim", f"run={go2['run']}", "duration_s=1", "commands=[[0.5,0,0]]",
                                           f"json={tmp_path / name}.json",
                                           *(() if name == "nominal" else (f"reality={name}",)))
        assert code == 0, err[-2000:]
        assert ("the MuJoCo robot made of reality go2_payload" in out) == (name != "nominal")
        results[name] = json.loads((tmp_path / f"{name}.json").read_text())
    nominal, payload = results["nominal"], results["go2_payload"]
    assert payload["newton"] == nominal["newton"]
    assert payload["mujoco"][0]["vel_error_xy"] != nominal["mujoco"][0]["vel_error_xy"]
    code, _, err = legion_in_process("sim2sim", f"run={go2['run']}", "reality=go2_on_ice", "duration_s=1")
    assert code != 0 and "reality=go2_on_ice: no such file, nor a shipped reality" in err


def test_the_bridge_on_a_reality_steps_its_own_physics_rate_and_publishes_what_its_sensors_read(go2):
    """2 kHz physics under a 500 Hz bridge: 4 physics steps a tick; the published joint positions
    carry the encoders' bias and noise, the motors' tau_est is the torque the drivers apply."""
    from legion.sim2real.bridge import UnitreeBridge

    bridge = UnitreeBridge(go2["mjb"].parent, "go2", domain=71, interface="lo", reality="go2_backlash")
    try:
        assert bridge.sim.model.opt.timestep == pytest.approx(0.0005) and bridge.sim.substeps == 4
        bridge.hold = False  # as if a LowCmd had arrived: hold the default pose
        for _ in range(50):
            bridge.sim.physics_step(np.asarray(go2["meta"].default_joint_pos))
            bridge.tick()
        truth = bridge.sim.data.qpos[bridge.sim.qpos_ids]
        published = np.array([bridge.state.motor_state[m].q for m in bridge.motors])
        assert 0 < np.abs(published - truth - 0.003).max() < 5 * 0.002
        tau = np.array([bridge.state.motor_state[m].tau_est for m in bridge.motors])
        assert np.allclose(tau, bridge.sim.tau, atol=1e-4) and np.abs(tau).max() > 1.0
    finally:
        bridge.close()


def _excitation_log(go2, reality: Reality, seconds: float, folder, amplitude: float = 0.15, hung: bool = True):
    from legion.sim2real.calibrate import simulated_log
    from legion.sim2real.deploy.excite import Excitation

    return simulated_log(go2["mjb"].parent, reality, folder, Excitation("chirp", amplitude, seconds), hung=hung)


def test_a_robot_that_is_the_candidate_model_replays_its_own_log_from_every_windows_first_tick(go2, tmp_path):
    """A hung Go2 at 90% kp with 0.2 N m of friction and 10 ms of latency (two physics steps: its
    commands act from the same step whether picked up at a step or at arrival), without noise: the
    candidate model of those values replays every window of its chirp as logged, the first ticks
    too (the target written before a window acts while the window's first is in flight). Measured:
    5.5e-9 rad^2 and 4.3e-6 (N m)^2 at worst, from the log's float32 rounding; with the window's
    first target acting from its start, 2.0e-6 and 1.5e-3."""
    from legion.sim2real.calibrate import Fit, fitted, load_windows

    meta = go2["meta"]
    values = {"kp_scale": 0.9, "coulomb_friction": 0.2, "latency_ms": 10.0}
    truth = Reality(latency_ms=Latency(10.0), joints={".*": Joints(kp_scale=0.9, coulomb_friction=0.2)})
    windows = load_windows(_excitation_log(go2, truth, 3.0, tmp_path / "logs"), meta.joint_names, meta.control_dt, 0.5)
    errors = Fit(go2["mjb"], meta, windows, fitted(list(values))).errors(values)
    assert errors[:, 0].max() < 1e-7 and errors[:, 1].max() < 1e-4, errors.max(0)


def test_legion_calibrate_recovers_a_hung_go2s_motor_parameters_from_an_excitation_log(go2, tmp_path):
    """A 10 s chirp logged from a hung Go2 whose drivers run at 80% kp, with 0.3 N m of Coulomb
    friction and 10 +- 1 ms of latency (and encoder noise), from its joint positions and tau_est:
    the fit finds 0.801, 0.300 and 10.2 ms (tolerances 5%, 10%, 2.5 ms), every one pinned down, and
    the held-out joint RMSE falls below a third of the nominal model's. The reality file it writes
    runs as one."""

    from legion.sim2real.reality import Encoders

    truth = Reality(name="truth", latency_ms=Latency(10.0, 1.0), encoders=Encoders(position_noise=0.001),
                    joints={".*": Joints(kp_scale=0.8, coulomb_friction=0.3)})
    logs = _excitation_log(go2, truth, 10.0, tmp_path / "logs")
    code, out, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={logs}", "evaluations=300")
    assert code == 0, err[-2000:]
    assert "[calibrate] 15 windows of 0.5 s to fit, 4 held out" in out and "evaluations/s | ETA" in out
    report = json.loads((logs / "calibration.json").read_text())
    code, _, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={logs}", "evaluations=300")
    assert code == 2 and f"{logs} already holds a calibration (calibration.json" in err, err[-2000:]
    assert json.loads((logs / "calibration.json").read_text()) == report  # refused before the fit
    estimates = report["estimates"]
    print(out[-600:])
    assert estimates["kp_scale"] == pytest.approx(0.8, rel=0.05)
    assert estimates["coulomb_friction"] == pytest.approx(0.3, rel=0.1)
    assert estimates["latency_ms"] == pytest.approx(10.0, abs=2.5)
    assert all(p["pinned"] for p in report["profile"].values()) and "NOT PINNED" not in out
    # the spread from 7 replays: each of the 3 values moved either way, and the estimates themselves
    assert "[calibrate] one-step bootstrap: 200 resamples of the windows, from 7 evaluations" in out
    low, high = report["profile"]["kp_scale"]["bootstrap"]  # pinned: its 95% interval within +-20%
    assert low < high  # the refits moved: a spread, not the estimate 200 times
    from legion.sim2real.calibrate import table

    assert "WARNING" not in out  # a fit no better than the model on held-out windows is said to be so
    worse = {**report, "held_out_rmse_rad": {"nominal": 0.001, "calibrated": 0.002}}
    assert "the calibrated model does not beat the nominal one on the held-out windows" in table(worse)
    rmse = report["held_out_rmse_rad"]
    assert rmse["calibrated"] < rmse["nominal"] / 3
    calibrated = load_reality(logs / "reality_calibrated.yaml")
    assert calibrated.joints[".*"].kp_scale == pytest.approx(estimates["kp_scale"], abs=1e-4)
    assert calibrated.latency_ms.mean == pytest.approx(estimates["latency_ms"], abs=1e-3)
    # training on the calibrated simulator: the run's task, randomized about the estimates
    task = compose(f"task={logs / 'task_calibrated.yaml'}", "robot=go2").task
    low, high = task.events["calibrated_kp_scale_all"].range
    assert low <= estimates["kp_scale"] <= high and high - low < 0.2 * estimates["kp_scale"]
    low, high = task.events["calibrated_coulomb_friction_all"].range
    assert low <= estimates["coulomb_friction"] <= high
    # the latency drawn per episode in physics steps of 5 ms, in place of the task's whole control steps
    assert not task.events["action_delay"].enabled
    low, high = task.events["calibrated_latency"].range
    assert low <= estimates["latency_ms"] <= high and high - low < 10.0
    env = make_env(f"task={logs / 'task_calibrated.yaml'}", "robot=go2", "sim.num_envs=64")
    steps = env.sim.command_latency
    assert steps.min() >= round(low / 5) and steps.max() <= round(high / 5)
    assert (logs / "calibration.png").stat().st_size > 10_000


def test_a_fitted_jitter_widens_the_latency_training_draws_per_episode(go2, tmp_path):
    """A link fitted at 12 ms with 3 ms of jitter (the mean's 95% interval 11-13 ms): training draws
    each episode's latency over 11-13 ms widened by twice the jitter, 5-19 ms, in whole physics
    steps of 5 ms (1 to 4); a robot that does not jitter keeps the mean's interval; a latency whose
    loss is flat (the logs say nothing of it) spans its prior, 0-30 ms, and no further."""
    from legion.sim2real.calibrate import training_overlay

    pinned = {"pinned": True, "rise": 0.5, "bootstrap": [11.0, 13.0]}
    flat = {"pinned": False, "rise": 0.01, "bootstrap": [11.0, 13.0]}
    for latency, jitter, expected in ((pinned, 3.0, [5.0, 19.0]), (pinned, 0.0, [11.0, 13.0]),
                                      (flat, 3.0, [0.0, 30.0])):
        report = {"log": "logs", "estimates": {"latency_ms": 12.0, "latency_jitter_ms": jitter},
                  "profile": {"latency_ms": latency,
                              "latency_jitter_ms": {"pinned": True, "rise": 0.5, "bootstrap": [2.0, 4.0]}}}
        task_file = tmp_path / f"task_jitter_{jitter:g}{'' if latency['pinned'] else '_flat'}.yaml"
        task_file.write_text(training_overlay(report, go2["meta"], None))
        assert compose(f"task={task_file}", "robot=go2").task.events["calibrated_latency"].range == expected
    steps = make_env(f"task={tmp_path / 'task_jitter_3.yaml'}", "robot=go2", "sim.num_envs=64").sim.command_latency
    assert steps.min() >= 1 and steps.max() <= 4 and steps.max() > steps.min()


def test_a_value_flagged_for_its_spread_trains_over_that_spread_and_a_flat_one_over_its_prior(go2, tmp_path):
    """Gear play's calves as fitted from 60 s of logs: viscous friction 0.017 N m s/rad, its interval
    0.001-0.035 too wide to report (flagged) but the loss rising 6% at +-20% of its prior; it joins
    the damping scale as 0-0.035 over the Go2's kd, not the prior's 0-0.5 (twice the damping). The
    centre of mass likewise: 2 mm, flagged, drawn over 0.3-3.7 mm (its spread), not +-8 cm. A flat
    profile (the loss rising 1%) says nothing: the whole prior."""
    from legion.sim2real.calibrate import training_overlay

    kd = go2["meta"].joint_damping[0]
    assert set(go2["meta"].joint_damping) == {kd}  # one PD damping: the friction joins its scale
    for rise, kd_range, com_range in ((0.06, [0.95, 1.05 + 0.035 / kd], [0.0003, 0.0037]),
                                      (0.01, [0.95, 1.05 + 0.5 / kd], [-0.08, 0.08])):
        flagged = {"pinned": False, "rise": rise}
        report = {"log": "logs", "estimates": {"kd_scale": 1.0, "viscous_friction": 0.0175, "com_x_m": 0.002},
                  "profile": {"kd_scale": {"pinned": True, "rise": 0.3, "bootstrap": [0.95, 1.05]},
                              "viscous_friction": {**flagged, "bootstrap": [0.001, 0.035]},
                              "com_x_m": {**flagged, "bootstrap": [0.0003, 0.0035]}}}
        task_file = tmp_path / f"task_rise_{rise:g}.yaml"
        task_file.write_text(training_overlay(report, go2["meta"], None))
        events = compose(f"task={task_file}", "robot=go2").task.events
        assert events["calibrated_kd_scale_all"].range == pytest.approx(kd_range, abs=1e-4)
        assert events["calibrated_com_x"].range == pytest.approx(com_range, abs=1e-4)


def test_calibrate_fits_gear_play_and_training_simulates_it(go2, tmp_path):
    """A hung Go2 with 0.03 rad of gear play in every joint and its drivers at 90% kp: a 10 s chirp
    gives 0.0299 rad and 0.8996 (tolerances 10% and 3%), both pinned, the held-out RMSE 0.056x the
    nominal model's; the task file it writes draws each env's play about the estimate, which the
    env's DC motors then have (tests/test_backends.py: the dead zone in both backends)."""
    from legion.sim2real.calibrate import calibrate, training_overlay
    from legion.sim2real.reality import Encoders

    truth = Reality(encoders=Encoders(position_noise=0.001), joints={".*": Joints(kp_scale=0.9, backlash=0.03)})
    logs = _excitation_log(go2, truth, 10.0, tmp_path / "logs")
    report = calibrate(logs, go2["mjb"].parent, ["kp_scale", "backlash"], max_evaluations=300,
                       say=lambda line: None)
    estimates, rmse = report["estimates"], report["held_out_rmse_rad"]
    print(estimates, rmse)
    assert estimates["backlash"] == pytest.approx(0.03, rel=0.1)
    assert estimates["kp_scale"] == pytest.approx(0.9, rel=0.03)
    assert all(p["pinned"] for p in report["profile"].values())
    assert rmse["calibrated"] < rmse["nominal"] / 3
    task_file = tmp_path / "task_calibrated.yaml"
    task_file.write_text(training_overlay(report, go2["meta"], None))
    low, high = compose(f"task={task_file}", "robot=go2").task.events["calibrated_backlash_all"].range
    env = make_env(f"task={task_file}", "robot=go2", "sim.num_envs=8")
    assert low <= estimates["backlash"] <= high
    play = env.sim.motor_backlash
    assert play.shape == (8, 12) and play.min() >= low - 1e-6 and play.max() <= high + 1e-6 and play.min() > 0.02


def test_calibrate_finds_the_encoders_zero_offset(go2, tmp_path):
    """A hung Go2 at 90% kp whose encoders read every joint 0.02 rad off (and 0.001 rad of noise):
    with ``encoder_bias`` fitted, a 10 s chirp gives 0.8999 and 0.0200 (tolerances 3%), both pinned,
    and the held-out joint RMSE 0.05x the nominal model's (each window starts from the logged
    positions less the offset); kp alone comes out at 0.898 with the held-out error at 0.998x, the
    offset all of it. The reality file it writes reads the joints that far off, and the task file
    says training does not simulate it."""
    from legion.sim2real.calibrate import calibrate, training_overlay
    from legion.sim2real.reality import Encoders

    truth = Reality(encoders=Encoders(position_noise=0.001, position_bias=0.02), joints={".*": Joints(kp_scale=0.9)})
    logs = _excitation_log(go2, truth, 10.0, tmp_path / "logs")
    report = calibrate(logs, go2["mjb"].parent, ["kp_scale", "encoder_bias"], max_evaluations=300,
                       say=lambda line: None)
    estimates = report["estimates"]
    print(estimates, report["held_out_rmse_rad"])
    assert estimates["encoder_bias"] == pytest.approx(0.02, rel=0.03)
    assert estimates["kp_scale"] == pytest.approx(0.9, rel=0.03)
    assert all(p["pinned"] for p in report["profile"].values())
    rmse = report["held_out_rmse_rad"]
    assert rmse["calibrated"] < rmse["nominal"] / 3
    assert load_reality(logs / "reality_calibrated.yaml").encoders.position_bias == pytest.approx(
        estimates["encoder_bias"], abs=1e-6)
    assert "# encoder_bias: the robot's encoders read +0.02" in training_overlay(report, go2["meta"], None)


def test_calibrate_keeps_the_model_where_the_robot_is_the_model(go2, tmp_path):
    """A hung Go2 that is the model, read by noisy encoders (0.001 rad, 0.05 rad/s): the fit of
    gains, damping and armature per joint group stays at the model (gains within 10%, armature
    within 0.002 kg m^2 of the model's), no worse than it on the held-out windows. (The search once
    started the armature mid-prior, 0.05 kg m^2 where the Go2 has none, and found the calves' gains
    1.44x and damping 1.53x, worse than the model there.)"""
    from legion.sim2real.calibrate import calibrate
    from legion.sim2real.reality import Encoders

    logs = _excitation_log(go2, Reality(encoders=Encoders(position_noise=0.001, velocity_noise=0.05)), 10.0,
                           tmp_path / "logs")
    groups = {"calf": ".*_calf_joint", "upper": ".*_(hip|thigh)_joint"}
    report = calibrate(logs, go2["mjb"].parent, ["kp_scale", "kd_scale", "armature"], max_evaluations=300,
                       bootstrap=0, groups=groups, say=lambda line: None)
    estimates, rmse = report["estimates"], report["held_out_rmse_rad"]
    print(estimates, rmse)
    for group in groups:
        assert estimates[f"kp_scale@{group}"] == pytest.approx(1.0, rel=0.1)
        assert estimates[f"kd_scale@{group}"] == pytest.approx(1.0, rel=0.1)
        assert estimates[f"armature@{group}"] < 0.002
    assert rmse["calibrated"] <= 1.05 * rmse["nominal"]
    assert all(p["pinned"] for p in report["profile"].values()), report["profile"]
    # A hair above its prior's bound, the armature's profile is the move up: the move down, cut short by
    # the bound, is no move (it once flagged a payload reality's friction and latency, found at ~1e-6).
    from legion.sim2real.calibrate import Fit, load_windows

    meta = go2["meta"]
    fit = Fit(go2["mjb"], meta, load_windows(logs, meta.joint_names, meta.control_dt, 0.5, True),
              ["armature@calf", "armature@upper"], groups)
    x = np.array([1e-6, 0.0])
    up = x + [0.2, 0.0]
    loss = fit.loss(fit.values(x))
    assert fit.rise(x, 0, loss) == pytest.approx(fit.loss(fit.values(up)) / loss - 1) and fit.rise(x, 0, loss) > 0.05


def test_legion_calibrate_refuses_logs_it_cannot_use_by_name(go2, tmp_path):
    from legion.sim2real.calibrate import load_windows

    logs = _excitation_log(go2, Reality(), 3.0, tmp_path / "logs")
    names, dt = go2["meta"].joint_names, go2["meta"].control_dt
    assert len(load_windows(logs, names, dt, 0.5)) == 5
    with pytest.raises(ValueError, match=r"its joints are \['FL_hip_joint'.*the run's \['FR_hip_joint'.*a log of "
                                         r"another robot, or of another joint order"):
        load_windows(logs, names[3:6] + names[:3] + names[6:], dt, 0.5)
    with pytest.raises(ValueError, match=r"1 windows of 2 s; calibrating needs at least 4 \(8 s of logged control\)"):
        load_windows(logs, names, dt, 2.0)
    episode = dict(np.load(logs / "episode_000000.npz"))
    episode["joint_pos"][40, 2] = np.nan
    (tmp_path / "nan").mkdir()
    np.savez(tmp_path / "nan" / "episode_000000.npz", **episode)
    with pytest.raises(ValueError, match=r"1 of its 150 ticks hold NaN or infinite values \(first at tick 40\)"):
        load_windows(tmp_path / "nan", names, dt, 0.5)
    episode["joint_pos"][40, 2] = 0.0
    episode["base_ang_vel"] = episode["base_ang_vel"] + 2.0
    (tmp_path / "walking").mkdir()
    np.savez(tmp_path / "walking" / "episode_000000.npz", **episode)
    with pytest.raises(ValueError, match=r"the base turned at up to 2.0\d rad/s: a log of the robot hung .* or say "
                                         r"it stood or walked: hung=false"):
        load_windows(tmp_path / "walking", names, dt, 0.5)
    code, _, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={logs}", "params=kp_scale,mass")
    assert code != 0 and "params=kp_scale,mass: choose from kp_scale, kd_scale" in err
    code, _, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={logs}", "workers=0")
    assert code != 0 and "workers=0: give a number of processes, 1 or more (or auto)" in err
    for bad, message in (("window_s=0", "window_s=0: must be > 0 s"), ("evaluations=0", "evaluations=0: must be >= 1"),
                         ("bootstrap=-1", "bootstrap=-1: must be >= 0"),
                         ("groups=calf:(", "groups=calf:(: '(' is not a regular expression")):
        code, _, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={logs}", bad)
        assert code == 2 and message in err, err[-500:]


def test_calibrate_fits_joint_groups_apart(go2, tmp_path):
    """Calves at 70% kp, hips and thighs at 90%: fitted per group (`groups=`), each within 5%; the
    reality file it writes holds one pattern per group and makes a robot."""
    from legion.sim2real.calibrate import calibrate
    from legion.sim2real.reality import Joints

    truth = Reality(latency_ms=Latency(5.0), joints={".*_calf_joint": Joints(kp_scale=0.7), ".*": Joints(kp_scale=0.9)})
    logs = _excitation_log(go2, truth, 8.0, tmp_path / "logs")
    groups = {"calf": ".*_calf_joint", "upper": ".*_(hip|thigh)_joint"}
    report = calibrate(logs, go2["mjb"].parent, ["kp_scale", "latency_ms"], max_evaluations=300, bootstrap=0,
                       groups=groups, say=lambda line: None,
                       task={"events": {"stiffness": {"func": "stiffness_scale", "enabled": True}}})
    estimates = report["estimates"]
    assert set(estimates) == {"kp_scale@calf", "kp_scale@upper", "latency_ms"}
    assert estimates["kp_scale@calf"] == pytest.approx(0.7, rel=0.05)
    assert estimates["kp_scale@upper"] == pytest.approx(0.9, rel=0.05)
    calibrated = load_reality(logs / "reality_calibrated.yaml")
    assert set(calibrated.joints) == set(groups.values())
    RealityRobot(go2["mjb"], go2["meta"], calibrated)
    # the training overlay: each group's kp drawn at its estimate (pinned, no bootstrap: a point), the
    # task's own stiffness randomization off; the env it makes has those gains
    assert all(p["pinned"] for p in report["profile"].values())
    assert "stiffness: {enabled: false}" in (logs / "task_calibrated.yaml").read_text()
    env = make_env(f"task={logs / 'task_calibrated.yaml'}", "robot=go2", "sim.num_envs=2")
    scale = (env.robot.joint_stiffness / env.robot.defaults["joint_stiffness"])[0]
    calves = torch.tensor(["calf" in n for n in env.robot.joint_names])
    assert torch.allclose(scale[calves], torch.tensor(estimates["kp_scale@calf"]), rtol=1e-4)
    assert torch.allclose(scale[~calves], torch.tensor(estimates["kp_scale@upper"]), rtol=1e-4)


def test_a_fit_replays_its_windows_in_worker_processes_to_the_same_loss(go2, tmp_path):
    """`calibrate workers=`: an evaluation's windows shared among two processes give the loss and
    the per-window errors of replaying them all here, to the last bit (each window starts from its
    own logged state, whichever robot replayed the window before it)."""
    from legion.sim2real.calibrate import Fit, Workers, fitted, load_windows

    logs = _excitation_log(go2, Reality(latency_ms=Latency(5.0)), 3.0, tmp_path / "logs")
    meta = go2["meta"]
    windows = load_windows(logs, meta.joint_names, meta.control_dt, 0.5, True)
    fit = Fit(go2["mjb"], meta, windows, fitted(["kp_scale", "latency_ms"]))
    values = fit.values(np.array([0.3, 0.4]))
    here = fit.errors(values)
    with Workers(2) as workers:
        fit.workers = workers
        assert np.array_equal(fit.errors(values), here) and len(here) == len(windows) > 2
        assert fit.loss(values) == Fit(go2["mjb"], meta, windows, fit.names).loss(values)


def test_the_bootstraps_gauss_newton_step_lands_where_a_converged_search_does(go2, tmp_path):
    """The spread's refits are one Gauss-Newton step each from the estimate: from values away from
    the optimum a search converges to (kp 10% high, Coulomb friction 0.1 N m low) the resamples'
    median lands within a quarter of that distance of it (measured: 0.09 of it, kp 0.793 and 0.291
    N m for 0.7995 and 0.300), and from the optimum their 95% interval holds it, narrow (within
    +-2%) but a spread, since the encoders' noise differs between windows."""
    from legion.sim2real.calibrate import Fit, fitted, load_windows, one_step_bootstrap
    from legion.sim2real.reality import Encoders

    truth = Reality(encoders=Encoders(position_noise=0.001), joints={".*": Joints(kp_scale=0.8, coulomb_friction=0.3)})
    logs = _excitation_log(go2, truth, 4.0, tmp_path / "logs")
    meta = go2["meta"]
    fit = Fit(go2["mjb"], meta, load_windows(logs, meta.joint_names, meta.control_dt, 0.5, True),
              fitted(["kp_scale", "coulomb_friction"]))
    best, _ = fit.search(300, 0)
    off = {"kp_scale": best["kp_scale"] * 1.1, "coulomb_friction": best["coulomb_friction"] - 0.1}
    refits = one_step_bootstrap([(fit, 2)], off, 200, 0)
    for name in fit.names:
        landed = np.median([r[name] for r in refits])
        assert abs(landed - best[name]) < 0.25 * abs(off[name] - best[name]), (name, landed, best[name])
    refits = one_step_bootstrap([(fit, 2)], best, 200, 0)
    for name in fit.names:
        low, high = np.percentile([r[name] for r in refits], [2.5, 97.5])
        assert low < best[name] < high and high - low < 0.04 * best[name], (name, low, high, best[name])


def test_the_polish_after_the_search_walks_a_valley_to_its_floor(go2, tmp_path):
    """Coulomb and viscous friction trade against each other on a chirp (a search stopped with the
    calves' at 0.377 N m and 0.102 N m s/rad for 0.40 and 0.08 on a worn Go2's logs): Levenberg-Marquardt
    steps from such a point, or from every value off, land on the truth (a hung Go2 at 85% kp,
    120% kd, 0.4 N m and 0.08 N m s/rad of friction, 10 ms of latency; 4 s of chirp). Measured:
    every value within 0.8% from both starts (the encoders' noise), the loss 6.4x and 76x lower,
    in 45 evaluations each."""
    from legion.sim2real.calibrate import Fit, fitted, load_windows
    from legion.sim2real.reality import Encoders

    truth = {"kp_scale": 0.85, "kd_scale": 1.2, "coulomb_friction": 0.4, "viscous_friction": 0.08, "latency_ms": 10.0}
    reality = Reality(latency_ms=Latency(10.0), encoders=Encoders(position_noise=0.001), joints={".*": Joints(
        kp_scale=0.85, kd_scale=1.2, coulomb_friction=0.4, viscous_friction=0.08)})
    meta = go2["meta"]
    logs = _excitation_log(go2, reality, 4.0, tmp_path / "logs")
    fit = Fit(go2["mjb"], meta, load_windows(logs, meta.joint_names, meta.control_dt, 0.5, True), fitted(list(truth)))
    traded = {**truth, "coulomb_friction": 0.37, "viscous_friction": 0.10}
    off = {"kp_scale": 0.8, "kd_scale": 1.3, "coulomb_friction": 0.35, "viscous_friction": 0.11, "latency_ms": 8.0}
    for start in (traded, off):
        x, loss = fit.polish(fit.coordinates(start), fit.loss(start))
        assert loss < 0.25 * fit.loss(start), (loss, fit.loss(start))
        assert fit.values(x) == pytest.approx(truth, rel=0.02), (start, fit.values(x))


def test_the_drivers_gains_come_straight_from_the_logged_torques(go2, tmp_path):
    """The search's start: calves at 70% kp and 150% kd, the rest at 90% / 80%, 5 ms of latency:
    least squares on tau_est = kp (q* - q) - kd dq gives each group's within 10% from 4 s of chirp
    hung (measured: at most 7.2%; the joints' velocity changes within the step before a tick) and
    within 2% standing (0.7%), where the motion alone lets latency trade against the gains."""
    from legion.sim2real.calibrate import Fit, fitted, load_windows
    from legion.sim2real.reality import Joints

    truth = Reality(latency_ms=Latency(5.0), joints={".*_calf_joint": Joints(kp_scale=0.7, kd_scale=1.5),
                                                     ".*": Joints(kp_scale=0.9, kd_scale=0.8)})
    groups = {"calf": ".*_calf_joint", "upper": ".*_(hip|thigh)_joint"}
    expected = {"kp_scale@calf": 0.7, "kd_scale@calf": 1.5, "kp_scale@upper": 0.9, "kd_scale@upper": 0.8}
    meta = go2["meta"]
    for hung, amplitude, tolerance in ((True, 0.15, 0.10), (False, 0.05, 0.02)):
        logs = _excitation_log(go2, truth, 4.0, tmp_path / str(hung), amplitude, hung=hung)
        windows = load_windows(logs, meta.joint_names, meta.control_dt, 0.5, hung)
        fit = Fit(go2["mjb"], meta, windows, fitted(["kp_scale", "kd_scale", "latency_ms"], groups), groups)
        assert fit.torque_gains() == pytest.approx(expected, rel=tolerance)


def test_calibrate_finds_a_payload_from_a_standing_go2s_log(go2, tmp_path):
    """A Go2 carrying 2.5 kg on its base 4 cm forward of the base's centre of mass, its drivers at
    90% kp, standing on the floor through a small chirp (hung=false: every window started from the
    logged base pose and velocity): the fit finds the payload within 10%, the centre of mass within
    1 cm and kp within 5% (the stance legs' tau_est carry the weight, fore and hind as it sits,
    which from joint positions alone trades against kp). A free base's log without the base's
    state is refused by name. The task file draws the mass about the estimate."""
    from legion.sim2real.calibrate import calibrate, load_windows, simulated_log
    from legion.sim2real.deploy.excite import Excitation
    from legion.sim2real.reality import Base

    truth = Reality(base=Base(added_mass_kg=2.5, com_offset_m=[0.04, 0.0, 0.0]), joints={".*": Joints(kp_scale=0.9)})
    logs = simulated_log(go2["mjb"].parent, truth, tmp_path / "logs", Excitation("chirp", 0.05, 8.0), hung=False)
    report = calibrate(logs, go2["mjb"].parent, ["kp_scale", "added_mass_kg", "com_x_m"], max_evaluations=300,
                       bootstrap=0, say=lambda line: None, hung=False,
                       task={"events": {"added_base_mass": {"func": "added_mass", "enabled": True},
                                        "base_com": {"func": "com_offset", "enabled": True}}})
    estimates = report["estimates"]
    assert estimates["added_mass_kg"] == pytest.approx(2.5, rel=0.1)
    assert estimates["kp_scale"] == pytest.approx(0.9, rel=0.05)
    assert estimates["com_x_m"] == pytest.approx(0.04, abs=0.01)
    rmse = report["held_out_rmse_rad"]
    assert rmse["calibrated"] < rmse["nominal"]
    calibrated = load_reality(logs / "reality_calibrated.yaml").base
    assert calibrated.added_mass_kg == pytest.approx(estimates["added_mass_kg"], abs=1e-3)
    assert calibrated.com_offset_m[0] == pytest.approx(estimates["com_x_m"], abs=1e-4)
    task = compose(f"task={logs / 'task_calibrated.yaml'}", "robot=go2").task
    assert not task.events["added_base_mass"].enabled and not task.events["base_com"].enabled
    env = make_env(f"task={logs / 'task_calibrated.yaml'}", "robot=go2", "sim.num_envs=2")
    moved = env.robot.body_com - env.robot.defaults["body_com"]
    assert torch.allclose(moved[:, 0, 0], torch.tensor(estimates["com_x_m"]), atol=1e-4)
    assert (moved[:, 0, 1:] == 0).all() and (moved[:, 1:] == 0).all()  # only x, only the base
    low, high = task.events["calibrated_added_mass"].range  # (no bootstrap: a point, to 4 digits)
    assert low == pytest.approx(estimates["added_mass_kg"], rel=1e-3) and high == low
    names, dt = go2["meta"].joint_names, go2["meta"].control_dt
    episode = dict(np.load(logs / "episode_000000.npz"))
    del episode["base_pos"]
    np.savez(tmp_path / "logs" / "episode_000000.npz", **episode)
    with pytest.raises(ValueError, match=r"a log of a free base \(hung=false\) needs the base's state, and "
                                         r"\['base_pos'\] are not logged"):
        load_windows(logs, names, dt, 0.5, hung=False)


def test_calibrate_fits_a_hung_log_and_a_standing_one_together(go2, tmp_path):
    """A Go2 with 0.3 N m of Coulomb friction in its joints and 2.5 kg on its base, logged twice: a
    chirp hung (the friction shows, the payload cannot) and one standing (the payload shows). Both
    folders in one fit (`log=hung,standing hung=true,false`): each window replayed as its robot was,
    the friction from the hung windows, then the payload from the standing ones (two stages), the
    friction within 15% and the payload within 10% (0.300 and 2.54 kg). A hung= that matches
    neither one folder nor all of them is refused by name."""
    from legion.sim2real.calibrate import calibrate
    from legion.sim2real.reality import Base

    truth = Reality(base=Base(added_mass_kg=2.5), joints={".*": Joints(coulomb_friction=0.3)})
    hung = _excitation_log(go2, truth, 4.0, tmp_path / "hung")
    standing = _excitation_log(go2, truth, 6.0, tmp_path / "standing", amplitude=0.05, hung=False)
    report = calibrate([hung, standing], go2["mjb"].parent, ["coulomb_friction", "added_mass_kg"],
                       max_evaluations=150, bootstrap=0, say=lambda line: None, hung=[True, False])
    estimates = report["estimates"]
    print(estimates, report["held_out_rmse_rad"])
    assert estimates["coulomb_friction"] == pytest.approx(0.3, rel=0.15)
    assert estimates["added_mass_kg"] == pytest.approx(2.5, rel=0.1)
    assert report["windows"] + report["held_out"] == 7 + 11  # every window of both
    # the friction fitted hung predicts the torques standing (0.03 N m against the model's 0.96)
    torques = report["held_out_torque_rmse_on_the_ground_nm"]
    assert torques["fitted_hung"] < 0.2 * torques["nominal"]
    assert not any(p.get("inconsistent") for p in report["profile"].values())
    code, _, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={hung},{standing}",
                                     "hung=true,false,true")
    assert code != 0 and "hung=true,false,true: one value for every log folder, or one for each of the 2" in err


def test_motors_fitted_hung_that_stand_in_for_gear_play_are_flagged_by_the_torques_standing(go2, tmp_path):
    """A Go2 whose gears have 0.03 rad of play (its drivers otherwise the model's), logged hung and
    standing: fitted hung, softer drivers stand in for the play (kp 0.79; searched again standing,
    0.94), and standing they predict the torques worse than the model (0.53 N m against 0.25; 0.40
    against 0.17 with 0.02 rad of play,
    where a robot the model describes gets 0.03 against 0.96, above): flagged as inconsistent, not
    reported as the robot's, and the task file keeps the task's own randomization of them."""
    from legion.sim2real.calibrate import calibrate, table

    truth = Reality(joints={".*": Joints(backlash=0.03)})
    hung = _excitation_log(go2, truth, 4.0, tmp_path / "hung")
    standing = _excitation_log(go2, truth, 6.0, tmp_path / "standing", amplitude=0.05, hung=False)
    report = calibrate([hung, standing], go2["mjb"].parent, ["kp_scale", "added_mass_kg"], max_evaluations=150,
                       bootstrap=20, say=lambda line: None, hung=[True, False], task={"events": {"stiffness": {}}})
    torques = report["held_out_torque_rmse_on_the_ground_nm"]
    print(report["estimates"], torques)
    assert torques["fitted_hung"] > 1.5 * torques["nominal"]
    low, high = report["profile"]["added_mass_kg"]["bootstrap"]  # (kp in both stages: the second's step)
    assert np.isfinite([low, high]).all() and low < high
    assert report["profile"]["kp_scale"] == {**report["profile"]["kp_scale"], "pinned": False, "inconsistent": True}
    assert "kp_scale" in table(report) and "INCONSISTENT with the logs on the ground" in table(report)
    assert "WARNING: the motors fitted to the hung logs predict the torques on the ground worse" in table(report)
    task = (hung / "task_calibrated.yaml").read_text()
    assert "calibrated_kp_scale" not in task and "stiffness: {enabled: false}" not in task
    assert "calibrated_added_mass" in task


def test_calibrate_finds_the_foot_friction_where_a_standing_go2s_feet_slip(go2, tmp_path):
    """A Go2 standing on a slippery floor (friction 0.3) through a 0.2 rad chirp, whose feet slip:
    the fit of the foot friction alone comes within 15% (floors of 0.2, 0.3 and 0.45: 0.198, 0.277
    and 0.471 from 60 evaluations; at a 0.1 rad chirp on 0.2 the feet held and the estimate was
    flagged not pinned down), the held-out joint RMSE under a third of the nominal model's (0.03-0.13
    of it). The reality file and the task file carry it (the task's own friction event off); from
    logs of the robot hung it is refused, naming why."""
    from legion.sim2real.calibrate import calibrate

    logs = _excitation_log(go2, Reality(foot_friction=0.3), 8.0, tmp_path / "logs", amplitude=0.2, hung=False)
    report = calibrate(logs, go2["mjb"].parent, ["foot_friction"], max_evaluations=60, bootstrap=0,
                       say=lambda line: None, hung=False, task={"events": {"friction": {"enabled": True}}})
    estimate = report["estimates"]["foot_friction"]
    assert estimate == pytest.approx(0.3, rel=0.15) and report["profile"]["foot_friction"]["pinned"]
    rmse = report["held_out_rmse_rad"]
    assert rmse["calibrated"] < rmse["nominal"] / 3
    assert load_reality(logs / "reality_calibrated.yaml").foot_friction == pytest.approx(estimate, abs=1e-4)
    task = compose(f"task={logs / 'task_calibrated.yaml'}", "robot=go2").task
    assert task.events["calibrated_friction"].func == "friction" and not task.events["friction"].enabled
    assert task.events["calibrated_friction"].range[0] == pytest.approx(estimate, rel=1e-3)
    with pytest.raises(ValueError, match=r"params=foot_friction: a hung robot's legs carry no weight and its feet "
                                         r"touch nothing"):
        calibrate(logs, go2["mjb"].parent, ["foot_friction"], say=lambda line: None, hung=True)


def _nonlinear_motor(seed: int = 0) -> Reality:
    """A hung Go2 whose motors no PD law describes: 0.03 rad of gear play and a torque-speed line of
    6 N m at stall falling to zero at 10 rad/s (the chirp's faster half runs into it), 90% kp, 5 +- 1 ms
    of latency and encoder noise."""
    from legion.sim2real.reality import Encoders, TorqueSpeed

    return Reality(name="nonlinear_motor", seed=seed, latency_ms=Latency(5.0, 1.0),
                   encoders=Encoders(position_noise=0.001, velocity_noise=0.05),
                   joints={".*": Joints(kp_scale=0.9, backlash=0.03, torque_speed=TorqueSpeed(6.0, 10.0))})


def test_the_actuator_network_reproduces_a_nonlinear_motors_torque_on_held_out_data(go2, tmp_path):
    """20 s of a 0.2 rad chirp on the nonlinear motor: `legion calibrate ... actuator_network=true`
    learns a network whose torque RMSE on the held-out windows is under a third of the nominal
    analytic motor's and of the fitted one's (kp_scale, kd_scale and latency fitted in the same run).
    Measured on three logs (reality and calibrate seeds 0, 1, 2): network 0.047, 0.048, 0.046 N m;
    nominal 0.324, 0.322, 0.323; fitted 0.373, 0.270, 0.252 (40 evaluations; with 300: 0.264,
    0.262, 0.263, near the best PD law fitted to the torques by least squares, 0.256): ratios
    0.13-0.19. Replayed with the network driving every joint on the fitted latency, the held-out joint
    RMSE is 0.23-0.45 of the nominal model's (seeds 0-3: 0.44, 0.45, 0.39, 0.23; the fitted analytic
    motor's 0.41-0.48): bound 0.6. It writes actuator_network.npz (its file reloads with what it was learned
    from), the comparison into calibration.json and the printed table, and task_calibrated.yaml
    drives every joint with it."""
    from legion.sim2real.deploy.actuator_network import load

    logs = _excitation_log(go2, _nonlinear_motor(), 20.0, tmp_path / "logs", amplitude=0.2)
    code, out, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={logs}",
                                       "params=kp_scale,kd_scale,latency_ms", "evaluations=40", "bootstrap=0",
                                       "actuator_network=true")
    assert code == 0, err[-2000:]
    print(out[-800:])
    entry = json.loads((logs / "calibration.json").read_text())["actuator_network"]["all"]
    rmse = entry["held_out_torque_rmse_nm"]
    assert rmse["network"] < rmse["nominal"] / 3 and rmse["network"] < rmse["fitted"] / 3
    joints = json.loads((logs / "calibration.json").read_text())["held_out_rmse_rad"]
    assert joints["actuator_network"] < 0.6 * joints["nominal"]
    assert set(rmse["fitted_with"]) == {"kp_scale", "kd_scale", "latency_ms"}
    assert f"actuator network all (12 joints): held-out torque RMSE network {rmse['network']:.4f} N m" in out
    assert "does not beat" not in out
    # learned from a hung robot only: it has not seen the torques that hold a robot up, and says so
    assert entry["on_the_ground"] is False and 0 < entry["torque_p99_nm"] < 10
    assert "WARNING: the actuator network of all learned from a hung robot only" in out
    path = (logs / "actuator_network.npz").resolve()
    assert entry["file"] == str(path) and entry["joints"] == go2["meta"].joint_names
    network = load(path)
    assert network.history == 3 and network.stride_s == go2["meta"].control_dt
    assert network.info["joints"] == go2["meta"].joint_names and network.info["log"] == str(logs.resolve())
    assert network.info["held_out_torque_rmse_nm"] == rmse
    # training on it: the robot's actuators, then one of the network over every joint (the last match wins)
    # with the robot's gains and effort limits, one entry per set of joints that share them (the Go2's
    # calves have their own limit); an env of it builds (a URDF's joints have no drive of their own)
    cfg = compose(f"task={logs / 'task_calibrated.yaml'}", "robot=go2", "sim.num_envs=2")
    actuators = cfg.task.scene.robot.actuators
    assert list(actuators) == ["hip_thigh", "knee", "all_0", "all_1"]
    for name, robots in (("all_0", "hip_thigh"), ("all_1", "knee")):
        entry, own = actuators[name], actuators[robots]
        assert (entry.model, entry.network) == ("network", str(path))
        assert (entry.stiffness, entry.damping, entry.effort_limit) == (own.stiffness, own.damping, own.effort_limit)
        assert {j for j in go2["meta"].joint_names if re.fullmatch(entry.joints, j)} == \
            {j for j in go2["meta"].joint_names if re.fullmatch(own.joints, j)}
    env = make_env(f"task={logs / 'task_calibrated.yaml'}", "robot=go2", "sim.num_envs=2")
    assert len(env.sim.networks) == 1 and len(env.sim.networks[0]["dofs"]) == 12
    env.close()


def test_the_actuator_network_file_gives_the_torques_of_the_trained_network(go2, tmp_path):
    """Per joint group, the saved network reloaded (numpy) gives the trained torch network's torques
    on the held-out samples (within 1e-6 N m), and the same seed learns the same weights."""
    from legion.sim2real.calibrate import learn_actuator_networks, load_windows, motor_samples
    from legion.sim2real.deploy.actuator_network import load

    meta = go2["meta"]
    logs = _excitation_log(go2, _nonlinear_motor(), 8.0, tmp_path / "logs", amplitude=0.2)
    windows = load_windows(logs, meta.joint_names, meta.control_dt, 0.5)
    groups = {"calf": ".*_calf_joint", "upper": ".*_(hip|thigh)_joint"}
    learned = learn_actuator_networks(windows, meta, groups, seed=3)
    assert set(learned) == set(groups) and len(learned["calf"].joints) == 4 and len(learned["upper"].joints) == 8
    for label, actuator in learned.items():
        joints = [meta.joint_names.index(name) for name in actuator.joints]
        samples = motor_samples(windows[3::4], joints)
        loaded = load(actuator.network.save(tmp_path / f"actuator_network_{label}.npz"))
        with torch.no_grad():
            trained = actuator.module(torch.as_tensor(samples.errors), torch.as_tensor(samples.velocities)).numpy()
        assert trained.shape == samples.torques.shape
        assert np.abs(loaded(samples.errors, samples.velocities) - trained).max() < 1e-6
        assert loaded.info["joints"] == actuator.joints and loaded.info["held_out_torque_rmse_nm"] == actuator.rmse
        assert actuator.rmse["fitted"] is None  # no calibration's estimates given: no fitted motor
    again = learn_actuator_networks(windows, meta, {"calf": groups["calf"]}, seed=3)["calf"].network
    assert all(np.array_equal(a, b) for a, b in zip(again.weights, learned["calf"].network.weights))


def test_an_actuator_network_from_logs_without_tau_est_is_refused(go2, tmp_path):
    logs = _excitation_log(go2, Reality(), 3.0, tmp_path / "logs")
    episode = dict(np.load(logs / "episode_000000.npz"))
    del episode["joint_torque"]
    np.savez(logs / "episode_000000.npz", **episode)
    code, _, err = legion_in_process("calibrate", f"run={go2['run']}", f"log={logs}", "actuator_network=true")
    assert code != 0 and "actuator_network=true: the logs in" in err
    assert "hold no joint_torque, the motors' tau_est" in err
    assert not (logs / "calibration.json").exists()
