"""A user's own robot (and task) outside the package: robot=<file.yaml>, LEGION_CONFIG_PATH, and the
whole way from a URDF to an exported policy with legion-rl installed from its wheel (no checkout)."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from test_robots import needs_robots

from conftest import build_wheel, compose
from legion import configs
from legion.configs import ConfigError
from legion.tasks.sim.scene import resolve_asset

# The fast quadruped as a user's robot file: no `# @package` header (a robot file's place is known)
MY_ROBOT = """file: quadruped.xml
root_height: 0.33
joint_pos: {".*_calf_joint": -1.5}
bodies: {base: base, feet: ".*_foot", undesired_contacts: ".*_(thigh|calf)", illegal_contacts: base}
actuators:
  legs: {joints: ".*", stiffness: 30.0, damping: 1.0}
"""


def test_a_robot_or_task_file_given_by_its_path_is_composed_into_the_typed_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(MY_ROBOT)
    cfg = compose("task=quadruped_flat", "robot=mine.yaml")
    assert cfg.task.scene.robot.actuators["legs"].stiffness == 30.0 and cfg.task.scene.robot.root_height == 0.33
    assert cfg.task.scene.robot.file == "quadruped.xml"
    # a task of one's own, its `# @package _global_` header read as Hydra reads a file's
    task = (configs.CONFIG_DIR / "task" / "quadruped_flat.yaml").read_text()
    (tmp_path / "my_task.yml").write_text(task.replace("name: quadruped_flat", "name: my_flat"))
    cfg = compose(f"task={tmp_path / 'my_task.yml'}", "robot=mine.yaml", "sim.num_envs=8")
    assert (cfg.task.name, cfg.sim.num_envs, cfg.task.scene.robot.actuators["legs"].damping) == ("my_flat", 8, 1.0)
    with pytest.raises(ConfigError, match=r"^robot=nothere\.yaml: no such file \(from .*legion robot inspect"):
        compose("task=quadruped_flat", "robot=nothere.yaml")
    (tmp_path / "bad.yaml").write_text(MY_ROBOT + "stifness: 3\n")
    with pytest.raises(ConfigError, match=r"task\.scene\.robot\.stifness: no such key"):
        compose("task=quadruped_flat", "robot=bad.yaml")


def test_configs_in_legion_config_path_are_found_by_name(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    (mine / "robot").mkdir(parents=True)
    (mine / "robot" / "my_quadruped.yaml").write_text("# @package task.scene.robot\n" + MY_ROBOT)
    monkeypatch.setenv("LEGION_CONFIG_PATH", f"{tmp_path / 'empty'}:{mine}")
    with pytest.raises(ConfigError, match=r"^LEGION_CONFIG_PATH: no such folder .*empty; it names folders"):
        compose("task=quadruped_flat")
    (tmp_path / "empty").mkdir()
    cfg = compose("task=quadruped_flat", "robot=my_quadruped")
    assert cfg.task.scene.robot.actuators["legs"].stiffness == 30.0
    assert configs.config_file("robot", "my_quadruped") == mine / "robot" / "my_quadruped.yaml"
    # legion robot inspect robot=NAME finds it there too, and refuses a gain no robot can have
    from legion.tasks.sim.inspect import load_robot_config

    assert load_robot_config("my_quadruped").actuators["legs"].stiffness == 30.0
    (mine / "robot" / "weak.yaml").write_text(MY_ROBOT.replace("stiffness: 30.0", "stiffness: -30.0"))
    with pytest.raises(ValueError, match=r"^.*mine/robot/weak\.yaml: actuators\.legs\.stiffness=-30: must be >= 0"):
        load_robot_config("weak")
    with pytest.raises(ConfigError, match=r"Could not find 'robot/my_quadrupd'(?s:.*)my_quadruped\n(?s:.*)"
                                          r"Your own: <group>=<path to a \.yaml file>"):
        compose("task=quadruped_flat", "robot=my_quadrupd")
    # A name the package has too: Hydra would take the package's, silently; refused instead
    (mine / "robot" / "go2.yaml").write_text(MY_ROBOT)
    with pytest.raises(ConfigError, match=r"^robot=go2: .*mine/robot/go2\.yaml \(LEGION_CONFIG_PATH\) has the name "
                                          r"of the package's configs/robot/go2\.yaml, which comes first: rename yours"):
        compose("task=quadruped_flat", "robot=go2")
    (mine / "task").mkdir()
    task = (configs.CONFIG_DIR / "task" / "quadruped_flat.yaml").read_text()
    (mine / "task" / "my_flat.yaml").write_text(task.replace("name: quadruped_flat", "name: my_flat")
                                                .replace("/robot: quadruped", "/robot: my_quadruped"))
    assert "my_flat" in configs.task_names()
    cfg = compose("task=my_flat")
    assert cfg.task.name == "my_flat" and cfg.task.scene.robot.actuators["legs"].stiffness == 30.0


@needs_robots
def test_a_task_takes_its_robots_learning_settings_from_a_tuning_file(tmp_path, monkeypatch):
    """configs/tuning/<task>_<robot>.yaml, where it exists, sets one robot's agent for one task (the G1 on
    biped_flat: a fixed rate and a tenth of the entropy bonus on a CPU); the command line still wins."""
    def algorithm(*overrides):
        a = compose(*overrides).agent.algorithm
        return a.schedule, a.learning_rate, a.entropy_coef

    assert algorithm("task=biped_flat", "robot=g1") == ("fixed", 5e-4, 0.001)
    assert algorithm("task=biped_flat_deployable", "robot=g1") == ("fixed", 5e-4, 0.001)  # (its parent task's)
    assert algorithm("task=biped_flat", "robot=g1", "device=cuda:0") == ("adaptive", 1e-3, 0.01)  # unmeasured there
    assert algorithm("task=biped_flat") == algorithm("task=quadruped_flat", "robot=go2") == ("adaptive", 1e-3, 0.01)
    assert algorithm("task=biped_flat", "robot=g1", "agent.algorithm.entropy_coef=0.003")[2] == 0.003
    # a user's robot gets its own, from LEGION_CONFIG_PATH
    mine = tmp_path / "mine"
    (mine / "tuning").mkdir(parents=True)
    (mine / "tuning" / "quadruped_flat_my_quadruped.yaml").write_text(
        "# @package _global_\nagent: {algorithm: {entropy_coef: 0.002}}\n")
    (mine / "robot").mkdir()
    (mine / "robot" / "my_quadruped.yaml").write_text("# @package task.scene.robot\n" + MY_ROBOT)
    monkeypatch.setenv("LEGION_CONFIG_PATH", str(mine))
    assert algorithm("task=quadruped_flat", "robot=my_quadruped")[2] == 0.002


@needs_robots
def test_a_robot_of_your_own_from_urdf_to_exported_policy_with_the_wheel_installed(tmp_path):
    """As a user of `pip install legion-rl` has it: no checkout, no configs/ to copy into. inspect
    writes the robot YAML outside the package; train takes its path; play, eval and export of the
    run need nothing but the run folder."""
    wheel = build_wheel(tmp_path)
    # A venv of its own holding the wheel; the dependencies from this interpreter's site-packages,
    # added by a .pth after the install (as a plain path: its .pth files, legion's editable finder
    # among them, stay unread, so `legion` is the wheel's)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                                "--no-build-isolation", "--disable-pip-version-check", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LEGION_CONFIG_PATH")}
    work = tmp_path / "work"
    work.mkdir()

    def legion(*args: str) -> str:
        result = subprocess.run([str(venv / "bin" / "legion"), *args], cwd=work, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
        return result.stdout

    def legion_one_interpreter(*commands: list[str]) -> list[str]:
        """Each command as `legion` runs it, one after another in one interpreter of the venv (its
        start-up, 6-9 s, once); the output of each."""
        script = ("import json, sys\nfrom legion import cli\nfor args in json.loads(sys.argv[1]):\n"
                  "    sys.argv = ['legion', *args]\n    cli.main()\n    print('\\0', flush=True)\n")
        result = subprocess.run([str(python), "-c", script, json.dumps(commands)], cwd=work, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
        return result.stdout.split("\0\n")[:len(commands)]

    found = subprocess.run([str(python), "-c", "import legion.configs; print(legion.configs.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True)
    assert Path(found.stdout.strip()).is_relative_to(venv), found.stdout + found.stderr

    urdf = resolve_asset("package://example-robot-data/robots/a1_description/urdf/a1.urdf").resolve()
    legion("robot", "inspect", str(urdf), "out=my_robots")
    yaml = work / "my_robots" / "a1.yaml"
    # Its TODO placeholders are values that train (kp = effort limit / 1 rad, kd = kp / 20): none stops
    # training, so the file is used as inspect wrote it
    assert "TODO" in yaml.read_text() and "stiffness: 33.5" in yaml.read_text()
    out = legion("train", f"robot={yaml}", "task=quadruped_flat", "sim.num_envs=4", "agent.max_iterations=1",
                 "agent.num_steps_per_env=4")
    (run,) = (work / "runs" / "quadruped_flat").iterdir()
    assert (run / "model_1.pt").is_file() and str(urdf) in (run / "config.yaml").read_text(), out
    yaml.unlink()  # the run keeps its robot: nothing else is needed from here on
    played, _, _ = legion_one_interpreter(
        ["play", f"run={run}", "episodes=1", "sim.num_envs=1", "task.episode_length_s=0.1"],
        ["eval", f"run={run}", "commands=stand", "envs=1", "duration_s=0.1", "settle_s=0"],
        ["export", f"run={run}", "steps=2"])
    assert "episode 1: return" in played
    assert list((run / "eval").glob("model_1.json"))
    assert (run / "exported" / "policy.onnx").is_file() and (run / "exported" / "policy.json").is_file()
