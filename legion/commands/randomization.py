"""`legion randomization`: what each env of a task draws (event terms, physical parameters)."""

from __future__ import annotations

from legion.commands import UsageError

HELP = """usage: legion randomization [task=NAME] [key=value ...]

Builds a fresh env of the task (sim.num_envs defaults to 64 here) and prints each event term of
task.events (mode, distribution, configured and current range, and the min / mean / max of
the values drawn across the envs), then the per-env physical parameters that differ from the
model (min / mean / max over envs). Overrides as for `legion train`, e.g.
  legion randomization task=quadruped_flat sim.num_envs=256 task.events.stiffness.enabled=true
"""


def run(args: list[str]) -> None:
    from legion import api, configs
    from legion.tasks.randomization import report

    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    bad = [a for a in args if "=" not in a and not a.startswith("~")]
    if bad:
        raise UsageError(f"expected key=value overrides, got {bad}\n\n{HELP}")
    if not any(a.split("=", 1)[0].lstrip("+") == "sim.num_envs" for a in args):
        args = [*args, "sim.num_envs=64"]
    cfg = configs.compose(*args)
    api.validate(cfg)
    api.setup_process()
    print(report(api.make_env(cfg)))
