"""`legion export`: a trained policy to checked ONNX files and its policy.json."""

from __future__ import annotations

import os

from legion.commands import UsageError, flag, number, run_args

HELP = """usage: legion export run=<run folder> [checkpoint=PATH] [out=DIR] [overwrite=false] [steps=N]
                     [key=value ...]

Exports the run's newest good checkpoint (or `checkpoint=`) to DIR (default <run>/exported/,
replaced by each export; a DIR given that already holds an export is refused unless overwrite=true):
policy.onnx (fp32, opset 17, dynamic batch, normalizer folded in), policy_fp16.onnx and
policy.json (joint order, default pose, action scale/offset, PD gains, effort and joint limits,
control dt, observation layout, height-scan points, command and randomization ranges,
tracking terms, fall conditions, config hash, version).

Every export is verified and the command fails if a check fails: onnx.checker; onnxruntime
vs torch on observations from `steps` (default 50) policy steps in the task's env (max abs
difference <= 1e-5 fp32, <= 1e-2 fp16); operators TensorRT's ONNX parser supports.
Config keys can be overridden as in `legion play` (Hydra's grammar: key=value, +key=value, ~key).
"""


def run(args: list[str]) -> None:
    from legion.sim2real.export import export_run, summary

    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return
    run, options, overrides = run_args(args, HELP, {"checkpoint": None, "out": None, "overwrite": "false",
                                                    "steps": "50"})
    out, overwrite = options["out"], flag("overwrite", options["overwrite"])
    if out and os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"out={out} is a file: give a folder (the export writes policy.onnx, policy.json and more "
                         "into it)")
    held = os.path.join(out or "", "policy.json")
    if out and os.path.exists(held) and not overwrite:
        raise UsageError(f"out={out} already holds an export ({_exported(held)}): give another folder, or "
                         "overwrite=true to replace it")
    out_dir, report = export_run(run, options["checkpoint"], options["out"], number("steps", options["steps"]),
                                 overrides)
    print(summary(run, out_dir, report))


def _exported(policy_json: str) -> str:
    """What an existing export is, for the message that refuses to replace it."""
    import json

    try:
        meta = json.loads(open(policy_json).read())
        return f"{meta['checkpoint']} of task {meta['task']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a policy.json"
