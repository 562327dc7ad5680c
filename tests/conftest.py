"""Shared test setup: one Warp kernel cache for the whole suite, one torch thread, quiet Warp."""

import _thread
import dataclasses
import gc
import os
import re
import signal
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WARP_CACHE_PATH", str(ROOT / ".warp_cache"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
# Ctrl-C as a terminal sends it: a shell starts a background job (`.ci/run &`) with SIGINT ignored,
# which Python keeps and every child inherits, and the tests that interrupt a `legion` command
# (play, deploy) would wait on a child that never hears it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

from legion import api, configs  # noqa: E402
from legion.configs import compose, schema  # noqa: E402  (for the tests)

api.setup_process()  # quiet Warp, the kernel cache above


def ctrl_c_inside_a_finalizer() -> float:
    """Ctrl-C handled while a finalizer's Python code runs, as when the garbage collector frees
    cyclic garbage in the main thread: a KeyboardInterrupt raised there cannot propagate (Python
    says "Exception ignored" and drops it), so a loop that relies on it runs on. Returns when the
    finalizer ended (``time.perf_counter()``)."""
    ended = []

    class Finalized:
        def __del__(self):
            try:
                _thread.interrupt_main()  # the signal is handled while this finalizer runs ...
                for _ in range(10_000):  # ... here, where an exception cannot propagate
                    pass
            finally:
                ended.append(time.perf_counter())

    garbage = Finalized()
    garbage.cycle = garbage  # only the cyclic garbage collector frees it
    del garbage
    gc.collect()  # (a full collection holds the interpreter for up to seconds on a big heap)
    return ended[0]


# --- learning tests -------------------------------------------------------------------------------
# A learning test trains briefly and checks that the policy got better. It takes the `seed` fixture
# (the run's training seed) and checks its statistics with `learned`, which records them. Its bounds
# come from the spread of those statistics over training seeds: `python -m pytest -m learning
# --seeds 20` runs every learning test once per seed 0-19 and prints each statistic's spread next to
# its bound (docs/testing.md has the latest table and how the bounds are set from it).
DEFAULT_SEED = next(f.default for f in dataclasses.fields(schema.Train) if f.name == "seed")


def pytest_addoption(parser):
    group = parser.getgroup("legion")
    group.addoption("--seeds", type=int, default=0, metavar="N",
                    help="run every learning test once per training seed 0..N-1 and print the spread of the "
                         "statistics each checks, against its bound")
    group.addoption("--spread-json", metavar="FILE", help="with --seeds: also write the spread as JSON to FILE")


def pytest_generate_tests(metafunc):
    seeds = metafunc.config.getoption("seeds")
    if seeds and "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", range(seeds), indirect=True, ids=lambda s: f"seed{s}")


def pytest_collection_modifyitems(items):
    for item in items:
        if "seed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.learning)


@pytest.fixture
def seed(request) -> int:
    """A learning test's training seed: the config's default, or each of ``--seeds N``'s."""
    return getattr(request, "param", DEFAULT_SEED)


@pytest.fixture
def learned(request, seed):
    """``learned(name=(value, bound), ...)``: records each statistic of a learning test (``--seeds``
    prints their spread) and asserts each value is above its bound. A statistic is written so that
    learning raises it: a return's rise, the fall of the share of worlds that fell."""

    def check(**statistics: tuple[float, float]) -> None:
        for name, (value, bound) in statistics.items():
            request.node.user_properties.append(("learned", {"statistic": name, "value": float(value),
                                                             "bound": bound, "seed": seed}))
        missed = [f"{name} {value:.4g} <= {bound:g}" for name, (value, bound) in statistics.items()
                  if not value > bound]
        assert not missed, f"seed {seed}: " + ", ".join(missed)

    return check


def pytest_terminal_summary(terminalreporter, config):
    """With ``--seeds``: each learning statistic's spread over the seeds, and how far its bound lies
    below the mean in standard deviations (z; under a normal spread z >= 2.33 fails <= 1% of runs)."""
    import json
    import statistics as stats

    if not config.getoption("seeds"):
        return
    rows: dict[tuple[str, str], dict] = {}
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        if report.when != "call":
            continue
        test = re.sub(r"\[seed\d+\]|-seed\d+|seed\d+-", "", report.nodeid)  # the test, over its seeds
        for key, record in report.user_properties:
            if key == "learned":
                row = rows.setdefault((test, record["statistic"]), {"bound": record["bound"], "values": {}})
                row["values"][record["seed"]] = record["value"]
    table = []
    for (test, statistic), row in sorted(rows.items()):
        values = list(row["values"].values())
        mean, sd = stats.fmean(values), stats.stdev(values) if len(values) > 1 else 0.0
        table.append({"test": test, "statistic": statistic, "n": len(values), "mean": mean, "sd": sd,
                      "min": min(values), "max": max(values), "bound": row["bound"],
                      "below_bound": sum(v <= row["bound"] for v in values),
                      "z": (mean - row["bound"]) / sd if sd else float("inf"), "values": row["values"]})
    write = terminalreporter.write_line
    write("")
    write(f"learning statistics over {config.getoption('seeds')} seeds (z: the bound's distance below the mean, in sd)")
    write(f"{'test':<90} {'statistic':<18} {'n':>3} {'mean':>8} {'sd':>7} {'min':>8} {'max':>8} {'bound':>7} "
          f"{'fails':>5} {'z':>5}")
    for r in table:
        write(f"{r['test']:<90} {r['statistic']:<18} {r['n']:>3} {r['mean']:>8.4g} {r['sd']:>7.3g} {r['min']:>8.4g} "
              f"{r['max']:>8.4g} {r['bound']:>7.4g} {r['below_bound']:>5} {r['z']:>5.2f}")
    if config.getoption("spread_json"):
        Path(config.getoption("spread_json")).write_text(json.dumps(table, indent=1))


# quadruped_rough on a small terrain (3 levels x 6 columns of tiles): cheap to build, every terrain type.
SMALL_TERRAIN = ("task.scene.ground.terrain.num_levels=3", "task.scene.ground.terrain.num_cols=6",
                 "task.scene.ground.terrain.border=2")


def legion_in_process(*args: str) -> tuple[int, str, str]:
    """``legion <args>`` run by this process, without the ~9 s of an interpreter's start-up and
    imports; returns the exit code, stdout and stderr (what Python writes to them)."""
    from legion import cli

    return in_process(cli.main, ["legion", *args])


def in_process(main, argv: list[str]) -> tuple[int, str, str]:
    """``main()`` with ``sys.argv`` set to ``argv``, as an interpreter would run it: the exit code
    (``SystemExit``'s; 1 and the traceback on stderr for an uncaught error), stdout and stderr."""
    import contextlib
    import io
    import sys
    import traceback

    out, err, saved = io.StringIO(), io.StringIO(), sys.argv
    sys.argv, code = list(argv), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):  # sys.exit("message"): printed, as the interpreter does
            err.write(f"{e.code}\n")
    except Exception:
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.argv = saved
    return code, out.getvalue(), err.getvalue()


def build_wheel(folder: Path) -> Path:
    """legion-rl's wheel, built from a copy of the checkout (setuptools writes build/ and *.egg-info
    into the tree it builds) into ``folder``."""
    import shutil
    import subprocess
    import sys

    source = folder / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".warp_cache", "runs", "build", "*.egg-info", "__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(folder), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = folder.glob("legion_rl-*.whl")
    return wheel


def make_env(*overrides: str):
    return api.make_env(compose(*overrides))


def make_runner(*overrides: str, env=None, log_dir=None):
    """The runner ``agent.mode`` names, on ``env`` or a fresh env of the same config, seeded as training is."""
    import torch

    from legion.sim2real.trajectories.demos import imitation_inputs, with_teacher_observations

    cfg = compose(*overrides)
    torch.manual_seed(cfg.seed)
    env = env or api.make_env(with_teacher_observations(cfg))
    return api.make_runner(env, cfg.agent, log_dir=log_dir, device=cfg.device, **imitation_inputs(cfg.agent, env))


@pytest.fixture(scope="session")
def quadruped_env():
    """A 4-world quadruped_flat env shared by the tests that only read from fresh resets."""
    return make_env("task=quadruped_flat", "sim.num_envs=4")


def export_untrained_run(run: Path, *overrides: str, action_std: float = 0.5) -> dict:
    """A run folder (config.yaml, model_1.pt) of 4 envs with an untrained policy whose observation
    normalizer saw 10 steps of random actions (so it is not the identity), exported with
    ``legion export``'s code. Returns the live pieces: run, cfg, env (noise off), runner, actor,
    loaded (a :class:`legion.api.LoadedRun`), out (the export folder) and report (its check)."""
    import torch

    from legion.agents.runner import Runner
    from legion.sim2real.export import export_run

    cfg = compose(*overrides, "sim.num_envs=4")
    configs.save_config(cfg, run / "config.yaml")
    torch.manual_seed(0)
    env = api.make_env(cfg)
    runner = Runner(env, cfg.agent, log_dir=None)
    actor = runner.ppo.get_policy()
    actor.train()
    with torch.inference_mode():
        obs = env.get_observations()
        for _ in range(10):  # random actions move every joint
            actor.update_normalization(obs)
            obs, *_ = env.step(action_std * torch.randn(env.num_envs, env.num_actions))
    actor.eval()
    runner.iteration = 1
    runner.save(run / "model_1.pt")
    env.noise_enabled = False
    loaded = api.LoadedRun(run, cfg, env, runner, run / "model_1.pt")
    out, report = export_run(run, loaded=loaded, steps=10)
    return {"run": run, "cfg": cfg, "env": env, "runner": runner, "actor": actor, "loaded": loaded, "out": out,
            "report": report}


def lockstep_errors(env, actor, runtime, robot_state, steps: int = 15) -> dict:
    """The edge runtime (``runtime``, a PolicyRunner) in lock-step with world 0 of ``env`` from a
    reset: the largest |runtime - env| of the observation, the action and the joint targets over
    ``steps`` control steps. ``robot_state(env)`` is what the robot reports for world 0."""
    import numpy as np
    import torch

    errors = {"obs": 0.0, "action": 0.0, "target": 0.0}
    with torch.inference_mode():
        env.reset()
        runtime.reset()
        # The runtime acts at once (on a robot, the latency is the robot's): world 0 without the
        # action delay a task may randomize
        env.action.delay[0] = 0
        obs = env.get_observations()
        for _ in range(steps):
            state, command = robot_state(env), env.command.value[0].numpy()
            errors["obs"] = max(errors["obs"],
                                np.abs(runtime.observation(state, command) - obs["policy"][0].numpy()).max())
            targets = runtime.act(state, command)
            actions = actor(obs)
            errors["action"] = max(errors["action"], np.abs(runtime.last_action - actions[0].numpy()).max())
            obs, _, dones, _ = env.step(actions)
            assert not dones[0], "world 0 ended its episode: the lock-step comparison needs one episode"
            targets_env = env.robot.joint_pos_target[0].numpy()  # every joint: those no action drives too
            errors["target"] = max(errors["target"], np.abs(targets - targets_env).max())
    return errors


def short_training(runner, iterations: int, steps: int = 100) -> tuple[dict, dict]:
    """The deterministic policy (noise off) over ``steps`` control steps of every world from a reset,
    before and after ``iterations`` of training: mean return and the share of worlds whose episode
    ended early. "Before" is the better of the untrained policy and holding the default pose (zero
    actions): what is measured is learning, not the undoing of an unlucky initial policy (over 20
    seeds, 20 iterations of arm_reach rose 0.34 above the untrained policy and stayed 0.02 below
    holding still). Every measurement draws the same resets and commands (the env's generator
    reseeded), so the differences are the policies'."""
    import torch

    env, policy = runner.env, runner.ppo.get_policy()

    def measure(act) -> dict:
        env.noise_enabled = False
        env.generator.manual_seed(123)
        env.reset()
        total = torch.zeros(env.num_envs)
        ended = torch.zeros(env.num_envs, dtype=torch.bool)
        with torch.inference_mode():
            obs = env.get_observations()
            for _ in range(steps):
                obs, rewards, dones, extras = env.step(act(obs))
                total += rewards
                ended |= dones.bool() & ~extras["time_outs"].bool()
        env.noise_enabled = True
        return {"return": float(total.mean()), "ended": float(ended.float().mean())}

    untrained, still = measure(policy), measure(lambda obs: torch.zeros(env.num_envs, env.num_actions))
    before = {"return": max(untrained["return"], still["return"]), "ended": min(untrained["ended"], still["ended"])}
    runner.learn(iterations)
    return before, measure(policy)
