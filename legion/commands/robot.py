"""`legion robot inspect`: a robot model as training loads it, its problems, and a starting config."""

from __future__ import annotations

from pathlib import Path

from legion.commands import UsageError, flag

HELP = """usage: legion robot inspect <file> [out=DIR] [robot=NAME|FILE.yaml] [overwrite=true]

Loads a robot model (MJCF .xml, URDF, USD; a path, a file name in tasks/assets, or
package://<package>/<path>) as training loads it, and prints its joints (type, limits, effort and
velocity limits, PD gains, armature, friction), Newton's drive of each DoF (and an MJCF's own
actuators), bodies (mass, inertia), collision shapes (mesh vertex counts), total mass, DoF and base.
Then one line per problem that keeps a policy from training, with the fix: a legged robot on a
fixed base, actuated joints without PD gains, no actuators, mesh colliders of thousands of vertices,
a configured root_height that starts the robot inside the ground.

  out=DIR          where <name>.png (the robot in its default pose, MuJoCo offscreen) and
                   <name>.yaml go (default: <name>_inspect/); the YAML is a starting robot config
                   (configs/robot/*.yaml's format: floating base, root height, default pose, body
                   groups, collision simplification, actuators; placeholders marked TODO)
  robot=NAME       apply configs/robot/NAME.yaml (or a robot YAML file, e.g. the one written here)
                   as training does, and report on the result: the check that its settings fix the
                   warnings; <file> may be left out (the config's file). No YAML is written.
                   The YAML needs no copy into the package: train with it where it is
                   (legion train task=... robot=<file.yaml>), or keep it as DIR/robot/NAME.yaml with
                   LEGION_CONFIG_PATH=DIR (':'-separated folders laid out as configs/), then robot=NAME.
  overwrite=true   replace an existing <name>.yaml (never replaced otherwise: it may hold your edits)
--out DIR and --robot NAME work too.
"""


def run(args: list[str]) -> None:
    if not args or any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    if args[0] != "inspect":
        raise UsageError(f"unknown robot command '{args[0]}'\n\n{HELP}")
    rest, options = [], {"out": None, "robot": None, "overwrite": "false"}
    words = iter(args[1:])
    for arg in words:  # --out DIR, --robot NAME: the spelling of most tools, as out=DIR, robot=NAME
        rest.append(f"{arg[2:]}={next(words, '')}" if arg in ("--out", "--robot") else arg)
    files = [a for a in rest if "=" not in a]
    if len(files) > 1 or not (files or any(a.startswith("robot=") for a in rest)):
        raise UsageError(f"expected one robot file (or robot=NAME), got {files or 'none'}\n\n{HELP}")
    for arg in (a for a in rest if "=" in a):
        key, _, value = arg.partition("=")
        if key not in options:
            raise UsageError(f"{key}: no such option; options: {', '.join(options)}\n\n{HELP}")
        options[key] = value
    from legion import api
    from legion.tasks.sim.inspect import inspect_robot, load_robot_config

    api.setup_process()
    config = load_robot_config(options["robot"]) if options["robot"] else None
    file = files[0] if files else None
    name = Path((file or (config.file if config else "robot")).split("/")[-1]).stem
    out = Path(options["out"]) if options["out"] else Path(f"{name}_inspect")
    print(inspect_robot(file, out, config, flag("overwrite", options["overwrite"])).text())
