"""`legion`: the one command line. It dispatches to the command of its first argument, one module
each in :mod:`legion.commands` (its help, options and orchestration); nothing imports this module.

Every command takes Hydra's overrides (``key=value``, ``+key=value``, ``~key``) besides its own
``option=value``s. Bad arguments fail before anything is built, with one line per problem and
exit code 2.
"""

from __future__ import annotations

import importlib
import sys

from legion import set_process_env
from legion.commands import COMMANDS, fail, guarded

USAGE = """usage: legion <command> [key=value ...]

commands:
  train          train a policy          legion train task=quadruped_flat sim.num_envs=256
                 a Hydra multirun        legion train -m seed=0,1,2
                 resume a run            legion train resume=runs/cartpole/<date> [checkpoint=FILE]
                 K processes (torchrun)  legion train --nproc K task=quadruped_flat
  play           run a trained policy    legion play run=runs/cartpole/<date> [episodes=5] [record=FILE] [video=true]
                 watch it in a browser   legion play run=runs/quadruped_flat/<date> viewer=web
  eval           measure a policy        legion eval run=runs/quadruped_flat/<date> [commands=forward,stand]
  record         record episodes (HDF5)  legion record run=runs/cartpole/<date> episodes=10 out=demos.h5
  replay         replay a recording      legion replay demos.h5 [mode=actions|states] [video=true] [plots=true]
                                         [viewer=web] [html=true]
  dataset        convert recordings      legion dataset convert demos.h5 format=lerobot out=DIR
  randomization  what each env draws     legion randomization task=quadruped_flat
  export         export to ONNX          legion export run=runs/quadruped_flat/<date> [out=DIR]
  sim2sim        MuJoCo next to Newton   legion sim2sim run=runs/quadruped_flat/<date>
  robot          check a robot file      legion robot inspect my_robot.urdf [out=DIR] [robot=NAME]
  bridge         a simulated Unitree     legion bridge run=runs/quadruped_flat/<date> robot=go2
                 robot on its DDS topics
  deploy         a policy on a Unitree   legion deploy run=<run or exported folder> robot=go2 interface=eth0
                 robot over DDS
  calibrate      fit the sim to logs     legion calibrate run=<run or exported folder> log=<folder of logs>

`legion <command> --help` explains a command. Tasks: {tasks}
"""


def usage() -> str:
    from legion.configs import task_names

    return USAGE.format(tasks=", ".join(task_names()))


def main() -> None:
    set_process_env()  # before torch computes and mujoco is imported: both read it once
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help", "help"):
        guarded("--help", lambda: print(usage()))
        return
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        fail(command, f"unknown command.\n\n{usage()}")
    # (importing a command imports torch and the like: seconds, which Ctrl-C may cut short)
    guarded(command, lambda: importlib.import_module(f"legion.commands.{COMMANDS[command]}").run(rest))


if __name__ == "__main__":
    main()
