"""The benchmarks are part of the product: each one's smallest configuration runs to its table and
its JSON, so a benchmark that no longer runs (a renamed function, a config read the old way)
fails here, not on the day someone needs its figures."""

import json
import os
import runpy
import subprocess
import sys

import pytest

from conftest import ROOT, export_untrained_run, in_process

TINY_GO2 = ("task=quadruped_flat", "robot=go2")

# Each benchmark's smallest configuration, seconds each, and the JSON file it writes ("name[variant]":
# another configuration of the same script).
SMALLEST = {
    "throughput": (["--num-envs", "8", "--steps", "5"], "throughput.json"),
    "backends": (["--num-envs", "8", "--steps", "5", "--chunk", "2", "--robots", "quadruped"], "backends.json"),
    "robots": (["--num-envs", "8", "--steps", "5", "--robots", "go2"], "robots.json"),
    "update": (["--task", "cartpole", "--num-envs", "64", "--repeats", "1", "--threads", "1", "2", "--modes",
                "AUTO,STRICT"], "update.json"),
    "update[td3]": (["--task", "cartpole", "--num-envs", "16", "--threads", "1", "--repeats", "1", "agent=td3",
                     "agent.num_steps_per_env=2", "agent.off_policy.batch_size=64", "--precisions", "fp32"],
                    "update.json"),
    "async_vs_sync": (["--tasks", "cartpole", "--num-envs", "32", "--iterations", "2", "--seeds", "0"],
                      "async_vs_sync.json"),
    "overlap": (["--tasks", "cartpole", "--num-envs", "32", "--seconds", "0.5", "--repeats", "1"], "overlap.json"),
    "solver_settings": (["--settings", "10/10/1e-6", "4/4/1e-6", "--num-envs", "8", "--steps", "5", "--train", "0",
                         "--train-envs", "8", "--train-iterations", "1"], "solver_settings.json"),
    "learning": (["--task", "quadruped_flat", "--mode", "sync", "--num-envs", "16", "--minutes", "0.05",
                  "--eval-every", "0.05", "--envs-per-command", "1", "--eval-seconds", "1.2",
                  "agent.num_steps_per_env=4"], "learning_quadruped_flat.json"),
    "time_to_walk": (["--robots", "quadruped", "--seeds", "0", "--eval-every", "0.001", "sim.num_envs=16",
                      "agent.max_iterations=2", "agent.num_steps_per_env=4", "agent.stop_when.envs_per_command=1",
                      "agent.stop_when.episodes=1"], "time_to_walk.json"),
    "scaling": (["--tasks", "cartpole", "--procs", "1", "--num-envs", "16", "--iterations", "3"], "scaling.json"),
    "soak": (["--task", "cartpole", "--num-envs", "16", "--minutes", "0.35", "--sample-s", "10.5", "--settle", "0"],
             "soak.json"),
    "training_video": (["--task", "cartpole", "--num-envs", "8", "--iterations", "1", "--videos", "1",
                        "agent.video.max_seconds=0.2", "agent.num_steps_per_env=4"], "training_video.json"),
    "policy_latency": (["--calls", "50"], "policy_latency.json"),
    "cameras": (["--num-envs", "8", "--steps", "3", "--sizes", "16"], "cameras.json"),
    "actuator_network": (["--num-envs", "8", "--steps", "2", "--chunk", "2", "--backends", "c"],
                         "actuator_network.json"),
    "deploy_dds": (None, "deploy_dds_go2.json"),  # its run: an untrained Go2 policy, exported (below)
    "push_recovery": (None, "push_recovery.json"),  # its run: an untrained quadruped policy (below)
    "calibration": (None, "calibration.json"),  # its run: an untrained Go2 policy, exported (below)
    "peers": (None, "peers.json"),  # with mjlab's venv where MJLAB_PYTHON names its python (below)
}
# Run as scripts, in an interpreter of their own: overlap's processes (multiprocessing's spawn
# imports the script as their __main__). Every other benchmark runs in the test's process, as
# `python bench/<name>.py` would run it: an interpreter's start-up and imports (6-9 s) were most of
# a smallest configuration's time.
AS_SCRIPT = {"overlap"}


def bench_in_process(script, args: list[str]) -> tuple[int, str, str]:
    """``python <script> <args>`` in this process: the script's folder first on ``sys.path`` (its
    ``from common import ...``), and the benchmarks' modules imported afresh (``common`` reads
    LEGION_BENCH_OUT when imported) and forgotten after."""
    import torch

    path, threads = list(sys.path), torch.get_num_threads()
    sys.path.insert(0, str(script.parent))
    try:
        return in_process(lambda: runpy.run_path(str(script), run_name="__main__"), [str(script), *args])
    finally:
        sys.path[:] = path
        torch.set_num_threads(threads)
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(script.parent)):
                del sys.modules[name]


def test_every_benchmark_has_a_smallest_configuration_here():
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - {"common"}
    assert scripts == {name.split("[")[0] for name in SMALLEST}, \
        "a benchmark without a smallest configuration in this test, or one gone"


@pytest.mark.parametrize("name", SMALLEST)
def test_the_benchmark_runs_its_smallest_configuration(name, tmp_path, monkeypatch):
    args, written = SMALLEST[name]
    if name == "deploy_dds":
        pytest.importorskip("cyclonedds")
        (tmp_path / "run").mkdir()
        made = export_untrained_run(tmp_path / "run", *TINY_GO2)
        args = ["--run", str(made["out"]), "--seconds", "0.3", "--commands", "[[0.5, 0, 0]]"]
    if name == "push_recovery":
        (tmp_path / "run").mkdir()
        made = export_untrained_run(tmp_path / "run", "task=quadruped_flat")
        args = ["--runs", f"untrained={made['run'] / 'model_1.pt'}", "--duration-s", "0.4", "--directions", "2",
                "--phases", "1", "--commands", "[[0.5, 0, 0]]"]
    if name == "calibration":
        (tmp_path / "run").mkdir()
        made = export_untrained_run(tmp_path / "run", *TINY_GO2)
        args = ["--run", str(made["out"]), "--realities", "go2_payload", "--params", "kp_scale", "latency_ms",
                "--seconds", "4", "--evaluations", "12", "--bootstrap", "0", "--actuator-network"]
    script = ROOT / "bench" / f"{name.split('[')[0]}.py"
    if name == "peers":
        mjlab = os.environ.get("MJLAB_PYTHON", str(tmp_path / "no-mjlab" / "python"))
        args = ["--mjlab-python", mjlab, "--num-envs", "8", "--iterations", "3"]
    monkeypatch.setenv("LEGION_BENCH_OUT", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # for the processes a benchmark starts
    monkeypatch.chdir(tmp_path)
    if name in AS_SCRIPT:
        result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
        code, out, err = result.returncode, result.stdout, result.stderr
    else:
        code, out, err = bench_in_process(script, args)
    if name == "peers" and not os.path.isfile(mjlab):  # mjlab's venv is not part of the suite: it says how to make it
        assert code == 2 and "no-mjlab/python: no such file; make mjlab's venv" in err, err[-3000:]
        return
    assert code == 0, out[-2000:] + err[-3000:]
    assert "|---" in out, out[-2000:]  # its table
    report = json.loads((tmp_path / "results" / written).read_text())
    assert report["machine"] and report["rows"]


def test_the_shell_scripts_parse_and_the_fresh_machine_check_finds_the_readmes_test_command():
    for script in (ROOT / "bench").glob("*.sh"):
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"
    # bench/fresh_machine.sh runs the command between the backticks of this README line
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("Run the tests:"))
    assert line.count("`") == 2 and line.split("`")[1].startswith("python3 -m venv .venv")
    assert line.split("`")[1].endswith("python -m pytest")
