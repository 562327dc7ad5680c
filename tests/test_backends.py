"""sim.backend: MuJoCo's C library on every CPU core (``c``) simulates what MuJoCo Warp (``warp``)
does, keeps every world to itself, and takes per-world parameters; bad choices are named.

Exact replay on the C backend: tests/test_trajectories.py records and replays on the default
backend, which is ``c`` on a CPU."""

import mujoco
import numpy as np
import pytest
import torch
import warp as wp
from test_sim import QUAD, STAND_POSE
from test_sim import stand as place_standing

from conftest import make_env
from legion.configs.schema import Robot, Scene
from legion.sim2real.deploy.mujoco_robot import pd_torque
from legion.tasks.sim import NewtonSim, solver
from legion.tasks.sim.solver import SOLVERS, MuJoCoC, adapter

MASS = 22.472  # kg, tasks/assets/quadruped.xml


def stand(sim: NewtonSim, steps: int, height: float = 0.33) -> None:
    """Every world dropped in the standing pose from ``height``, then held there ``steps`` control steps."""
    place_standing(sim, height)
    for _ in range(steps):
        sim.step()


def feet_force(sim: NewtonSim) -> torch.Tensor:
    """(num_envs, 4, 3) [N]: the contact force on each foot."""
    robot = sim.robot
    feet = [i for i, name in enumerate(robot.body_names) if name.endswith("_foot")]
    return robot.contact_forces_w[:, feet]


def test_auto_is_c_on_a_cpu_and_bad_choices_are_named():
    assert NewtonSim(num_envs=1, **QUAD).backend == "c"
    assert NewtonSim(num_envs=1, backend="warp", **QUAD).backend == "warp"
    # auto on another solver: Warp's (chosen before anything is built; test_solvers builds XPBD)
    assert adapter("xpbd", "auto", "cpu") is SOLVERS["xpbd"]
    pole = Scene(robot=Robot(file="cartpole.xml"), ground=None, contact_sensing=False)
    with pytest.raises(ValueError, match="sim.backend=c is MuJoCo's C library: it steps sim=mujoco only"):
        NewtonSim(pole, num_envs=1, dt=0.005, decimation=1, solver="xpbd", backend="c")
    with pytest.raises(ValueError, match=r"Unknown sim.backend 'gpu'; choose one of \['auto', 'warp', 'c'\]"):
        NewtonSim(num_envs=1, backend="gpu", **QUAD)
    with pytest.raises(ValueError, match="on cuda:0 use sim.backend=warp"):
        NewtonSim(num_envs=1, backend="c", device="cuda:0", **QUAD)


def test_a_standing_quadruped_is_the_same_on_both_backends():
    """Dropped 3 cm onto its feet and held for 1 s: the same height, pose and foot forces (the
    backends differ in float precision and warm start only)."""
    sims = {backend: NewtonSim(num_envs=2, backend=backend, **QUAD) for backend in ("warp", "c")}
    for sim in sims.values():
        stand(sim, steps=50)
    warp, c = sims["warp"].robot, sims["c"].robot
    assert c.root_pos_w[:, 2].tolist() == pytest.approx(warp.root_pos_w[:, 2].tolist(), abs=1e-3)
    assert torch.allclose(c.joint_pos, warp.joint_pos, atol=0.01)
    assert c.root_lin_vel_w.abs().max() < 0.03  # settled
    for sim in sims.values():  # the feet carry the robot's weight, nothing else touches
        forces = feet_force(sim)
        assert forces[..., 2].sum(dim=1).tolist() == pytest.approx([MASS * 9.81] * 2, rel=0.02)
        assert torch.allclose(sim.robot.contact_forces_w.sum(dim=1), forces.sum(dim=1))
    assert torch.allclose(feet_force(sims["c"]), feet_force(sims["warp"]), rtol=0.1, atol=3.0)


def test_worlds_are_independent_on_the_c_backend():
    """One thread steps many worlds with one MjData: a world's future must depend on its own
    history only (warm start included), or exact replay would depend on the thread schedule.
    World 0 is dropped from 0.6 m in one sim only; the other worlds stay equal bit for bit."""
    targets = STAND_POSE + 0.3 * torch.randn(30, 4, 12, generator=torch.Generator().manual_seed(0))
    sims = [NewtonSim(num_envs=4, backend="c", **QUAD) for _ in range(2)]
    for sim in sims:
        stand(sim, steps=5)
    dropped = sims[1].robot
    dropped.root_pos_w[0, 2] = 0.6
    sims[1].reset(torch.tensor([0]))
    for sim in sims:
        for target in targets:
            sim.robot.joint_pos_target[:] = target
            sim.step()
    same, other = sims
    assert not torch.equal(same.joint_q[0], other.joint_q[0])
    assert torch.equal(same.joint_q[1:], other.joint_q[1:])
    assert torch.equal(same.joint_qd[1:], other.joint_qd[1:])
    assert torch.equal(same.contact_forces[1:], other.contact_forces[1:])
    assert same.joint_qd.abs().max() > 0.1  # they really moved


def test_per_world_parameters_reach_the_c_model():
    """5 kg more on world 1's base, world 2 on the Moon, world 3's base centre of mass 8 cm
    forward: each world's feet carry its own weight, world 3's front feet more of it (MuJoCo
    ignores a body's centre of mass where its compiler found it at the body's origin, unless
    told otherwise). The C model holds them as rows per world, not a copy of the model per world."""
    sim = NewtonSim(num_envs=4, backend="c", **QUAD)
    sim.robot.body_mass[1, 0] += 5.0
    sim.gravity[2] = torch.tensor([0.0, 0.0, -1.62])
    sim.robot.body_com[3, 0, 0] += 0.08
    sim.params_changed("body_mass", "gravity", "body_com")
    stand(sim, steps=50)
    forces = feet_force(sim)[..., 2]
    weight = forces.sum(dim=1)
    assert weight.tolist() == pytest.approx([MASS * 9.81, (MASS + 5.0) * 9.81, MASS * 1.62, MASS * 9.81], rel=0.02)
    front = forces[:, :2].sum(dim=1) / weight  # FL, FR: the front feet's share
    assert front[3] > front[0] + 0.1
    solver = sim.solver
    assert len(solver._thread_models) == sim.threads  # one model per thread, however many worlds
    assert solver.world_model(1).body_mass[1] == pytest.approx(solver.mj_model.body_mass[1] + 5.0)
    assert solver.world_model(2).opt.gravity[2] == pytest.approx(-1.62)
    assert solver.world_model(0).body_mass[1] == solver.mj_model.body_mass[1]


@pytest.mark.bit_exact
def test_the_compiled_loop_steps_the_worlds_bit_for_bit_as_the_python_loop(tmp_path, monkeypatch):
    """The threads step their worlds with step_worlds.c (compiled at first use); where no C compiler
    builds it, with the same calls from Python. Both give the same states, warm starts and contact
    forces bit for bit, per-world parameters and a command latency included; the fallback is
    announced, naming the fix."""
    targets = STAND_POSE + 0.3 * torch.randn(10, 4, 12, generator=torch.Generator().manual_seed(1))
    sims = [NewtonSim(num_envs=4, backend="c", **QUAD) for _ in range(2)]
    assert sims[0].solver._loop is not None  # this machine has a C compiler (.ci/run installs gcc)
    sims[1].solver._loop = None
    for sim in sims:
        sim.set_command_latency(torch.ones(4, dtype=torch.bool), torch.tensor([0, 1, 3, 6]), max_steps=6)
        sim.robot.body_mass[1, 0] += 5.0
        sim.gravity[2] = torch.tensor([0.0, 0.0, -1.62])
        sim.params_changed("body_mass", "gravity")
        stand(sim, steps=5)
        for target in targets:
            sim.robot.joint_pos_target[:] = target
            sim.step()
    compiled, python = (sim.state_dict() for sim in sims)
    assert compiled.keys() == python.keys() and "solver.states" in compiled
    for name in compiled:
        assert torch.equal(compiled[name], python[name]), name
    assert compiled["contact_forces"].abs().max() > 10.0 and compiled["joint_qd"].abs().max() > 0.1

    # A process that has not loaded the loop yet, with no compiler and nothing compiled
    monkeypatch.setattr(solver, "_WORLD_LOOP", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(wp.config, "kernel_cache_dir", str(tmp_path))
    with pytest.warns(UserWarning, match=r"could not compile step_worlds.c .* Install a C compiler"):
        assert NewtonSim(num_envs=2, backend="c", **QUAD).solver._loop is None
    assert solver._WORLD_LOOP is False  # tried once per process


def test_a_mujoco_error_in_the_compiled_loop_raises_naming_the_world():
    """MuJoCo reports some errors by calling its error handler (without one it prints and exits the
    process): inside step_worlds.c they raise mujoco.FatalError in Python, as the bindings' own
    calls do, naming the world, and the process goes on. Twenty balls in a 20 kB arena overflow
    MuJoCo's stack in their first step."""
    balls = "".join(f'<body pos="{0.05 * i} 0 {0.1 + 0.05 * i}"><freejoint/><geom size=".1"/></body>'
                    for i in range(20))
    model = mujoco.MjModel.from_xml_string(f'<mujoco><size memory="20K"/><worldbody><geom type="plane" size="5 5 .1"/>'
                                           f'{balls}</worldbody></mujoco>')
    data = mujoco.MjData(model)
    spec = int(mujoco.mjtState.mjSTATE_INTEGRATION)
    states = np.zeros((3, mujoco.mj_stateSize(model, spec)))
    mujoco.mj_getState(model, data, states[0], spec)
    states[:] = states[0]
    lib = solver._mujoco_library()
    loop = solver._world_loop(lib)
    nothing = np.zeros((3, 0))
    with pytest.raises(mujoco.FatalError, match=r"world 1: mj_stackAlloc: out of memory"):
        solver._step_in_c(loop, lib, model, data, model, states, spec, np.zeros(0), np.zeros(0, dtype=np.int64),
                          nothing, nothing, range(1, 3), steps=2)
    with pytest.raises(mujoco.FatalError, match="mj_stackAlloc"):  # the same step through the bindings
        mujoco.mj_step(model, data)


def test_the_c_backend_steps_dc_motors_as_newton_does(monkeypatch):
    """The Go2's DC motors are actuators of the C backend's model, so a control step stays in C.
    Their torque is Newton's ClampingDCMotor law exactly, per world's gains (world 1's kp, kd and
    effort limit changed), at states up to three times the motors' speed at zero torque; and random
    targets move the robot as NewtonSim's own newton.actuators do on the same backend."""
    go2 = ("task=quadruped_flat", "robot=go2", "sim.num_envs=4", "task.events.push.enabled=false")
    env = make_env(*go2)
    sim, solver = env.sim, env.sim.solver
    assert solver.steps_motors and sim.motors is None
    assert solver.mj_model.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER  # the motors explicit, as Newton's
    robot = sim.robot
    for name, scale in (("joint_stiffness", 1.3), ("joint_damping", 2.0), ("joint_effort_limit", 0.7)):
        getattr(robot, name)[1] *= scale
    sim.params_changed("joint_stiffness", "joint_damping", "joint_effort_limit")
    sim.step()  # hands them to the solver
    cfgs = sim.motor_cfgs
    sat = np.array([cfgs[i].saturation_effort for i in cfgs])
    v_lim = np.array([cfgs[i].velocity_limit for i in cfgs])
    rng = np.random.default_rng(0)
    for world in (0, 1):
        model = solver.world_model(world)
        data = mujoco.MjData(model)
        gains = [getattr(robot, name)[world].double().numpy()
                 for name in ("joint_stiffness", "joint_damping", "joint_effort_limit")]
        qpos, qvel = model.jnt_qposadr[1:], model.jnt_dofadr[1:]  # the 12 leg joints, after the free base
        for _ in range(200):
            q, qd, target = rng.uniform(-2, 2, 12), rng.uniform(-3, 3, 12) * v_lim, rng.uniform(-2, 2, 12)
            data.qpos[qpos], data.qvel[qvel], data.ctrl[:12] = q, qd, target
            mujoco.mj_forward(model, data)
            expected = pd_torque(target, q, qd, *gains, saturation=sat, velocity_limit=v_lim)
            assert np.abs(data.qfrc_actuator[qvel] - expected).max() < 1e-9
            assert np.abs(data.sensordata[-12:] - expected).max() < 1e-9  # what sim.motor_torque reads

    actions = 0.5 * torch.randn(3, 4, 12, generator=torch.Generator().manual_seed(0))
    envs = {"c": make_env(*go2)}
    monkeypatch.setattr(MuJoCoC, "_motors", lambda self, sim, template: [])  # the motors left to NewtonSim
    envs["newton"] = make_env(*go2)
    assert not envs["newton"].sim.solver.steps_motors and envs["newton"].sim.motors is not None
    for action in actions:
        for e in envs.values():
            e.step(action)
        c, newton = (e.sim for e in envs.values())
        assert torch.allclose(c.robot.joint_pos, newton.robot.joint_pos, atol=2e-4)  # float32 Newton vs float64 C
        assert torch.allclose(c.motor_torque, newton.motor_torque, atol=0.02)
    assert c.motor_torque.abs().max() > 5.0  # they really pushed


def test_async_training_leaves_a_core_to_the_learner():
    """Under agent.mode=async the learner computes beside the physics: the C backend takes one
    core fewer (sim.threads=0); a number given is taken as it is."""
    import os

    from conftest import compose
    from legion import api

    def threads(*overrides: str) -> int:
        env = api.make_env(compose("task=cartpole", "sim.num_envs=2", *overrides))
        assert len(env.sim.solver._shares) == env.sim.threads  # one MjData and share of the worlds each
        return env.sim.threads

    cores = len(os.sched_getaffinity(0))
    assert threads("agent.mode=sync") == cores
    assert threads("agent.mode=async") == max(1, cores - 1)
    assert threads("agent.mode=async", "sim.threads=3") == 3


def test_every_worker_starts_with_the_backend_and_a_ctrl_c_in_the_start_still_exits():
    """No step starts a thread (a Ctrl-C that lands while ThreadPoolExecutor starts one inside a
    step leaves a thread the interpreter's exit waits for forever); a Ctrl-C during the backend's
    own start of its workers leaves none behind: the process exits."""
    import subprocess
    import sys

    pool = solver._started_pool(3)
    assert len(pool._threads) == 3 and all(t.is_alive() for t in pool._threads)
    pool.shutdown()
    ctrl_c_during_start = """
import os, signal, threading
from legion.tasks.sim import solver
wait = threading.Event.wait
def interrupted_wait(self, timeout=None):  # a new worker's start handshake, interrupted by Ctrl-C
    os.kill(os.getpid(), signal.SIGINT)
    return wait(self, timeout)
threading.Event.wait = interrupted_wait
try:
    solver._started_pool(2)
except KeyboardInterrupt:
    threading.Event.wait = wait
    print("interrupted", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", ctrl_c_during_start], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "interrupted" in done.stdout, done.stderr


@pytest.mark.parametrize("backend", ["c", "warp"])
def test_a_command_latency_delays_each_worlds_targets_by_physics_steps(backend):
    """NewtonSim.set_command_latency (the event command_latency): a world's targets act L physics
    steps late, within a control step and across them: each world steps as a sim of one physics
    step per control step that is handed the targets L steps late (the C backend's compiled loop
    switches ctrl mid-step; MuJoCo Warp's steps one by one). The env's targets stay what it wrote;
    a world reset acts on its new targets at once."""
    latency = torch.tensor([0, 1, 3, 6])  # physics steps of 5 ms; 4 to a control step
    targets = STAND_POSE + 0.4 * torch.randn(6, 4, 12, generator=torch.Generator().manual_seed(2))
    late = NewtonSim(num_envs=4, backend=backend, **QUAD)
    fine = {name: NewtonSim(num_envs=4, backend=backend, **(QUAD | {"decimation": 1})) for name in ("late", "prompt")}
    for sim in (late, *fine.values()):
        place_standing(sim, 0.33)
    late.set_command_latency(torch.ones(4, dtype=torch.bool), latency, max_steps=6)
    worlds = torch.arange(4)
    for t, target in enumerate(targets):
        late.robot.joint_pos_target[:] = target
        late.step()
        assert torch.equal(late.robot.joint_pos_target, target)
        for k in range(4 * t, 4 * t + 4):
            fine["late"].robot.joint_pos_target[:] = targets[((k - latency) // 4).clamp(min=0), worlds]
            fine["prompt"].robot.joint_pos_target[:] = target
            for sim in fine.values():
                sim.step()
    # float32 state between control steps (Newton's) against between physics steps: not bit for bit
    error = (late.robot.joint_pos - fine["late"].robot.joint_pos).abs().amax(1)
    effect = (late.robot.joint_pos - fine["prompt"].robot.joint_pos).abs().amax(1)
    assert error.max() < 2e-3, error
    assert effect[0] < 2e-3 and effect[1:].min() > 0.02, effect  # world 0 has no latency; the others' move late

    late.robot.joint_pos_target[:] = STAND_POSE
    late.reset(torch.tensor([False, False, False, True]))  # world 3 starts over: its first targets at once
    late.step()
    sent = late._sent[:, 3, -12:]  # world 3's targets of the last control steps, its legs'
    assert torch.equal(sent[(late._sent_step - 1) % len(sent)], STAND_POSE)
    assert torch.equal(sent[(late._sent_step - 2) % len(sent)], STAND_POSE)
    state = late.state_dict()
    assert torch.equal(state["command_latency"], latency) and "command_latency.sent" in state


def test_the_command_latency_event_delays_the_go2s_dc_motors_alike_in_c_and_in_newton(monkeypatch):
    """The event command_latency draws milliseconds and delays in physics steps (5 ms here): the
    Go2's DC motors stepped in C (their ctrl switched inside the compiled loop) and by NewtonSim's
    newton.actuators (the targets switched before each physics step) move alike, and not as
    without the latency."""
    go2 = ("task=quadruped_flat", "robot=go2", "sim.num_envs=4", "task.events.push.enabled=false")
    latency = "+task.events.latency={func: command_latency, mode: startup, range: [0, %g]}"
    actions = 0.5 * torch.randn(4, 4, 12, generator=torch.Generator().manual_seed(0))
    envs = {"c": make_env(*go2, latency % 15), "prompt": make_env(*go2, latency % 0)}  # the same draws
    monkeypatch.setattr(MuJoCoC, "_motors", lambda self, sim, template: [])  # the motors left to NewtonSim
    envs["newton"] = make_env(*go2, latency % 15)
    drawn = envs["c"].sim.command_latency
    assert torch.equal(envs["newton"].sim.command_latency, drawn) and drawn.min() >= 0 and drawn.max() <= 3
    assert envs["c"].sim.solver.steps_motors and envs["newton"].sim.motors is not None
    for action in actions:
        for e in envs.values():
            e.step(action)
    c, newton, prompt = (envs[name].sim.robot.joint_pos for name in ("c", "newton", "prompt"))
    assert torch.allclose(c, newton, atol=2e-4)  # float32 Newton vs float64 C
    moved = (c - prompt).abs().amax(1)
    assert drawn.min() == 0 and drawn.max() > 0, drawn  # (this seed's draw: late and prompt worlds)
    assert moved[drawn == 0].max() == 0 and moved[drawn > 0].min() > 0.01, moved


def test_the_joint_backlash_event_gives_the_go2s_motors_gear_play_alike_in_c_and_in_newton(monkeypatch):
    """The event joint_backlash draws each calf motor's play per world (up to 0.1 rad here): the
    Go2 moves alike with its motors stepped in step_worlds.c, in its Python fallback (bit for bit)
    and by NewtonSim's newton.actuators, and not as without the play; a joint with no DC motor is
    refused by name."""
    go2 = ("task=quadruped_flat", "robot=go2", "sim.num_envs=4", "task.events.push.enabled=false")
    play = "+task.events.play={func: joint_backlash, mode: startup, range: [0, %g], params: {joints: '.*_calf_joint'}}"
    actions = 0.5 * torch.randn(4, 4, 12, generator=torch.Generator().manual_seed(0))
    envs = {"c": make_env(*go2, play % 0.1), "c-python": make_env(*go2, play % 0.1), "none": make_env(*go2, play % 0)}
    envs["c-python"].sim.solver._loop = None
    monkeypatch.setattr(MuJoCoC, "_motors", lambda self, sim, template: [])  # the motors left to NewtonSim
    envs["newton"] = make_env(*go2, play % 0.1)
    drawn = envs["c"].sim.motor_backlash
    calves = [i for i, name in enumerate(envs["c"].robot.joint_names) if name.endswith("calf_joint")]
    assert len(calves) == 4 and drawn[:, calves].min() > 0 and drawn[:, calves].max() <= 0.1
    assert drawn.sum() == drawn[:, calves].sum()  # the other motors have none
    assert torch.equal(envs["newton"].sim.motor_backlash, drawn)
    for action in actions:
        for e in envs.values():
            e.step(action)
    c, python, newton, none = (envs[name].sim.robot.joint_pos for name in ("c", "c-python", "newton", "none"))
    assert torch.equal(c, python)
    assert torch.allclose(c, newton, atol=2e-4)  # float32 Newton vs float64 C
    assert (c - none).abs().max() > 0.01

    with pytest.raises(ValueError, match=r"joint_backlash: joints \[.*'FL_hip_joint'.*\] have no dc_motor actuator"):
        make_env("task=quadruped_flat", "sim.num_envs=2", play.replace(".*_calf_joint", ".*") % 0.1)


def _pd_network(path, kp: float, kd: float, history: int = 3) -> None:
    """An actuator network that is a PD law exactly: relu(x) - relu(-x) = x, on the present error and
    velocity (the older instants of its history weighted 0)."""
    from legion.sim2real.deploy.actuator_network import ActuatorNetwork

    first = np.zeros((2, 2 * history))
    first[0, 0], first[0, history] = kp, -kd
    first[1] = -first[0]
    ActuatorNetwork(weights=[first, np.array([[1.0, -1.0]])], biases=[np.zeros(2), np.zeros(1)],
                    input_mean=np.zeros(2 * history), input_std=np.ones(2 * history), activation="relu").save(path)


@pytest.mark.parametrize("backend", ["c", "warp"])
def test_an_actuator_network_drives_the_joints_at_every_physics_step(backend, tmp_path):
    """The Go2's legs driven by an actuator network that computes their DC motors' PD law (torque-
    speed line out of reach) move as the DC motors move them, step for step from the same random
    targets: the network is evaluated before every physics step on each world's own state, its
    torque clipped to the per-env effort limits and applied to the right joints in the right order.
    A network file that is not one is refused naming it."""
    _pd_network(tmp_path / "pd.npz", kp=25.0, kd=0.5)
    go2 = ("task=quadruped_flat", "robot=go2", "sim.num_envs=4", "task.events.push.enabled=false",
           f"sim.backend={backend}")
    free = [f"task.scene.robot.actuators.{g}.{k}=1e6" for g in ("hip_thigh", "knee")
            for k in ("saturation_effort", "velocity_limit")]
    network = [f"{plus}task.scene.robot.actuators.{g}.{k}" for g in ("hip_thigh", "knee") for plus, k in
               (("", "model=network"), ("+", f"network={tmp_path / 'pd.npz'}"))]
    envs = {"dc_motor": make_env(*go2, *free), "network": make_env(*go2, *network)}
    assert len(envs["network"].sim.networks) == 1 and envs["network"].sim.motors is None
    for e in envs.values():  # world 1's motors weaker (the events' motor_strength)
        e.sim.robot.joint_effort_limit[1] *= 0.3
        e.sim.params_changed("joint_effort_limit")
    actions = 0.8 * torch.randn(6, 4, 12, generator=torch.Generator().manual_seed(0))
    most = torch.zeros(4, 12)  # the largest torque each motor applied, in units of its effort limit
    net, previous = envs["network"].sim, None
    assert net.networks[0]["history"].shape == (4, 12, 2, 9)  # 3 instants 20 ms apart: 9 physics steps of 5 ms
    for action in actions:
        start = (net.robot.joint_pos.clone(), net.robot.joint_vel.clone())
        for e in envs.values():
            e.step(action)
        dc = envs["dc_motor"].sim
        assert torch.allclose(dc.robot.joint_pos, net.robot.joint_pos, atol=2e-4)
        # The history, now first: 3 physics steps back the state this control step began from, 7 back
        # the previous one's (each with the targets then in effect)
        began = torch.stack([net.robot.joint_pos_target - start[0], start[1]], -1)
        history = net.networks[0]["history"]
        assert torch.allclose(history[..., 3], began, atol=1e-6)
        assert previous is None or torch.allclose(history[..., 7], previous, atol=1e-6)
        previous = began
        most = torch.maximum(most, net.networks[0]["torque"].abs() / net.robot.joint_effort_limit)
    assert (most <= 1 + 1e-6).all() and (most[0] > 0.2).any() and torch.isclose(most[1].max(), torch.tensor(1.0))

    (tmp_path / "broken.npz").write_bytes(b"not a network")
    with pytest.raises(ValueError, match="broken.npz: not a readable legion-actuator-network/1 file"):
        make_env(*go2[:-1], *network[:1], f"+task.scene.robot.actuators.hip_thigh.network={tmp_path / 'broken.npz'}")
