"""`legion robot inspect`: a robot file's joints, bodies, drives and colliders as Newton loads
them, a picture of its default pose, the warnings that name what will not train, and a starting
robot YAML that the schema accepts and that fixes those warnings."""

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import legion_in_process as legion
from legion.configs.schema import Actuator, Robot
from legion.tasks.sim.inspect import Inspection, inspect_robot, load_robot_config
from legion.tasks.sim.scene import resolve_asset

PACKAGE = "package://example-robot-data/robots"
GO2 = f"{PACKAGE}/go2_description/urdf/go2.urdf"
G1 = f"{PACKAGE}/g1_description/urdf/g1_29dof_rev_1_0.urdf"
PANDA = f"{PACKAGE}/panda_description/urdf/panda.urdf"


def _installed() -> bool:
    try:
        resolve_asset(GO2)
    except FileNotFoundError:
        return False
    return True


needs_robots = pytest.mark.skipif(not _installed(), reason="example-robot-data is not installed "
                                  "(pip install 'legion-rl[robots]'; CI installs it)")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("inspect")


# One inspection per robot for the whole module: loading a robot with meshes takes seconds.
@pytest.fixture(scope="module")
def go2(out) -> Inspection:
    return inspect_robot(GO2, out / "go2")


@pytest.fixture(scope="module")
def g1(out) -> Inspection:
    return inspect_robot(G1, out / "g1")


@pytest.fixture(scope="module")
def panda(out) -> Inspection:
    return inspect_robot(PANDA, out / "panda")


@pytest.fixture(scope="module")
def quadruped(out) -> Inspection:
    return inspect_robot("quadruped.xml", out / "quadruped")


def urdf_mass(uri: str) -> float:
    """The sum of the URDF's <inertial><mass value=...> tags."""
    return sum(float(m.get("value", 0)) for m in ET.parse(resolve_asset(uri)).getroot().iter("mass"))


def robot_pixels(path) -> float:
    """The share of the PNG's pixels in the robot's orange (the floor is blue-grey, the sky black)."""
    import imageio.v2 as imageio

    image = np.asarray(imageio.imread(path)).astype(int)
    assert image.shape == (480, 640, 3)
    r, b = image[..., 0], image[..., 2]
    return float(np.mean((r > 60) & (r > 1.3 * b)))


def validated(path) -> Robot:
    """The YAML checked as Hydra's composition checks a robot group: against the Robot schema
    (a misspelt key or a wrong type fails), its actuators against Actuator."""
    from omegaconf import OmegaConf

    text = path.read_text()
    assert text.startswith("# @package task.scene.robot\n")
    robot = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Robot), OmegaConf.load(path)))
    assert isinstance(robot, Robot)
    for entry in robot.actuators.values():
        OmegaConf.merge(OmegaConf.structured(Actuator), entry)
    return robot


@needs_robots
def test_go2_urdf_numbers_warnings_picture_and_yaml(go2):
    assert [j.type for j in go2.joints] == ["revolute"] * 12
    efforts = {j.name: j.effort_limit for j in go2.joints}
    assert efforts["FL_hip_joint"] == efforts["RR_thigh_joint"] == pytest.approx(23.7)  # the URDF's <limit effort>
    assert efforts["FL_calf_joint"] == pytest.approx(45.43)
    assert sorted({round(j.velocity_limit, 3) for j in go2.joints}) == [15.7, 30.1]
    assert go2.total_mass == pytest.approx(urdf_mass(GO2), abs=1e-4) and 15 < go2.total_mass < 17
    assert not go2.floating_base  # a URDF's base is fixed unless told ...
    fixed, gains = go2.warnings  # ... and this one has feet: two problems, each with its fix
    assert fixed.startswith("fixed base for a legged robot") and "set floating_base: true" in fixed
    assert fixed.count("\n") == 0 and "zero PD gains on 12 actuated joints" in gains and "stiffness" in gains
    assert robot_pixels(go2.image) > 0.02

    yaml = validated(go2.yaml)
    assert yaml.file == GO2 and yaml.floating_base is True
    assert yaml.root_height is not None and 0.3 < yaml.root_height < 0.5  # straight-ish legs: ~0.38 m
    assert yaml.joint_pos["FL_calf_joint"] == pytest.approx(-0.8378)  # 0 is outside the knee's range
    assert yaml.bodies["base"] == "base" and yaml.bodies["feet"] == ".*_foot"
    assert yaml.collision.approximate[".*_foot"] == "bounding_sphere"
    actuators = {a["joints"]: a for a in yaml.actuators.values()}
    assert actuators[".*_calf_joint"]["effort_limit"] == pytest.approx(45.43)
    assert actuators[".*_hip_joint|.*_thigh_joint"]["effort_limit"] == pytest.approx(23.7)
    assert "stiffness: 45.43" in go2.yaml.read_text() and "TODO placeholder" in go2.yaml.read_text()


@needs_robots
def test_g1_mesh_colliders_and_the_written_yaml_fixes_every_warning(g1, out):
    assert len(g1.joints) == 29 and g1.total_mass == pytest.approx(urdf_mass(G1), abs=1e-4)
    assert max(s.vertices for s in g1.shapes) > 9000  # pelvis, torso and head collide with their visual meshes
    meshes = [w for w in g1.warnings if w.startswith("mesh colliders with thousands of vertices")]
    assert len(meshes) == 1 and "collision.approximate: {pelvis_contour_link: bounding_box" in meshes[0]
    assert robot_pixels(g1.image) > 0.01
    yaml = validated(g1.yaml)
    assert yaml.bodies["feet"] == ".*_ankle_roll_link" and yaml.bodies["base"] == "pelvis"

    # The YAML applied as training applies it: a floating base, gains, primitives for the meshes.
    fixed = inspect_robot(None, out / "g1_fixed", load_robot_config(str(g1.yaml)))
    assert fixed.floating_base and fixed.warnings == [] and fixed.yaml is None
    assert all(j.stiffness > 0 and j.drive.startswith("config: ") for j in fixed.joints)
    assert not [s for s in fixed.shapes if s.type == "mesh" and s.vertices >= 1000]
    assert fixed.total_mass == pytest.approx(g1.total_mass)


@needs_robots
def test_panda_has_no_gains_and_a_fixed_base(panda):
    assert len(panda.joints) == 9 and not panda.floating_base
    assert [j.effort_limit for j in panda.joints[:7]] == pytest.approx([87] * 4 + [12] * 3)
    assert len(panda.warnings) == 1 and panda.warnings[0].startswith("zero PD gains on 9 actuated joints")
    assert panda.total_mass == pytest.approx(urdf_mass(PANDA), abs=1e-4)
    assert robot_pixels(panda.image) > 0.01
    yaml = validated(panda.yaml)
    assert yaml.floating_base is False and yaml.root_height is None
    assert yaml.bodies["tcp"] == "panda_hand_tcp"
    assert yaml.joints == {"arm": "|".join(f"panda_joint{i}" for i in range(1, 8)),
                           "gripper": "panda_finger_joint1|panda_finger_joint2"}
    assert set(yaml.collision.approximate.values()) == {"convex_hull"}  # an arm's links: hulls, not boxes


def test_quadruped_mjcf_gains_from_its_actuators(quadruped):
    assert quadruped.floating_base and len(quadruped.joints) == 12 and quadruped.warnings == []
    assert quadruped.total_mass == pytest.approx(22.472, abs=1e-3)  # the file's comment: 15 + 4 x 1.868 kg
    # Newton turned each <position> servo into joint gains: the two tables agree.
    servos = {row[1]: (float(row[3]), float(row[4])) for row in quadruped.mujoco_actuators}
    assert {j.name: (j.stiffness, j.damping) for j in quadruped.joints} == servos
    assert {j.mode for j in quadruped.joints} == {"position"}
    assert robot_pixels(quadruped.image) > 0.01
    yaml = validated(quadruped.yaml)
    assert yaml.file == "quadruped.xml" and yaml.bodies["undesired_contacts"] == ".*_thigh|.*_calf"
    assert "TODO placeholder" not in quadruped.yaml.read_text()  # the file has its gains


def test_root_height_of_a_configured_pose(out):
    """robot=quadruped's standing pose: the file's comment says the front feet (spheres of 22 mm)
    touch the ground at base height 0.3222 m."""
    standing = inspect_robot(None, None, load_robot_config("quadruped"))
    assert standing.root_height == pytest.approx(0.3222, abs=1e-3)
    assert standing.image is None and standing.yaml is None  # out=None writes nothing
    assert standing.warnings == []  # the config's 0.33 m starts it 8 mm above the ground
    sunk = load_robot_config("quadruped")
    sunk.root_height = 0.30
    (warning,) = inspect_robot(None, None, sunk).warnings
    assert warning.startswith("root_height 0.3 m starts the robot 2.2 cm inside the ground") and \
        warning.endswith("set root_height: 0.33 in the robot YAML.")


def test_a_robot_without_actuators_is_told(out):
    cartpole = inspect_robot("cartpole.xml", out / "cartpole")
    assert [w.split(":")[0] for w in cartpole.warnings] == ["no actuators"]
    assert "actuators: {<group>" in cartpole.warnings[0]
    validated(cartpole.yaml)


def test_a_robot_whose_mesh_files_are_missing_is_told_it_has_no_colliders(tmp_path):
    urdf = tmp_path / "meshless.urdf"
    urdf.write_text("""<robot name="meshless">
  <link name="base"><inertial><mass value="2"/><inertia ixx="0.1" iyy="0.1" izz="0.1" ixy="0" ixz="0" iyz="0"/>
    </inertial><collision><geometry><mesh filename="meshes/missing.stl"/></geometry></collision></link>
</robot>""")
    result = inspect_robot(str(urdf), robot=Robot(file=str(urdf), floating_base=True))
    assert result.shapes == []
    assert result.warnings[0].startswith("1 mesh files not found, their shapes left out (") and \
        "missing.stl" in result.warnings[0]
    assert result.warnings[1].startswith("no collision shapes: the robot falls through the ground")


def test_broken_and_missing_files_fail_with_one_line(tmp_path):
    broken = tmp_path / "broken.urdf"
    broken.write_text('<robot name="r">\n  <link name="base">\n    <inertial><mass value="1"/>')  # truncated
    for path, problem in ((broken, "no element found"), (tmp_path / "missing.urdf", "not found")):
        code, _, err = legion("robot", "inspect", str(path), f"out={tmp_path / 'out'}")
        assert code != 0 and err.count("\n") == 1, err
        assert err.startswith("legion robot: ") and path.name in err and problem in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_help_and_writing(out):
    code, help_text, _ = legion("robot", "inspect", "--help")
    assert code == 0 and "usage: legion robot inspect <file> [out=DIR]" in help_text
    code, text, err = legion("robot", "inspect", "arm.xml", "--out", str(out / "arm"))
    assert code == 0, err
    assert "arm: MJCF" in text and "warnings: none" in text and f"wrote {out / 'arm' / 'arm.png'}" in text
    validated(out / "arm" / "arm.yaml")
    code, _, err = legion("robot", "inspect", "arm.xml", f"out={out / 'arm'}")
    assert code == 2 and "arm.yaml exists" in err and "overwrite=true" in err  # a YAML may hold edits
