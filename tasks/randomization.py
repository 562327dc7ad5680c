"""`legion randomization`: what a task's domain randomization really puts into the simulation.

Builds the task's env as training would (same config, same seed) and prints, per event term,
the configured range and the min / mean / max of the values drawn across the environments,
then every per-env physical parameter of the simulation that differs from the robot model.
"""

from __future__ import annotations

import math


def report(env) -> str:
    """The two tables, as text."""
    import torch

    lines = [f"{env.cfg.name}: {env.num_envs} envs, seed-drawn values at construction (startup terms; "
             "reset terms from the first episode start; interval terms once they fired)", ""]
    head = ("term", "mode", "distribution", "configured", "current", "drawn min", "mean", "max")
    rows = []
    for term in env.events.terms.values():
        values = term.values[~term.values.isnan()]
        drawn = (f"{values.min():.4g}", f"{values.mean():.4g}", f"{values.max():.4g}") if values.numel() else ("-",) * 3
        mode = term.mode + (f" {term.interval[0]:g}-{term.interval[1]:g} s" if term.interval else "")
        rows.append((term.name if term.enabled else f"{term.name} (off)", mode, term.distribution,
                     _range(term.configured), _range((term.low, term.high)), *drawn))
    lines += _table(head, rows)

    sim = env.sim
    rows = []
    for entity in sim.scene.values():
        for name, default in entity.defaults.items():
            value = getattr(entity, name)
            changed = (value != default).reshape(sim.num_envs, -1).any(0)
            if not changed.any():
                continue
            v = value.reshape(sim.num_envs, -1)[:, changed]
            d = default.reshape(sim.num_envs, -1)[:, changed]
            rows.append((f"{entity.name}.{name}", f"{int(changed.sum())} of {changed.numel()}", f"{v.min():.4g}",
                         f"{v.mean():.4g}", f"{v.max():.4g}", _range((float(d.min()), float(d.max())))))
    lines += ["", "per-env physical parameters that differ from the model (entries changed in any env):", ""]
    lines += _table(("parameter", "entries", "min", "mean", "max", "model"), rows) if rows else ["(none)"]
    if (sim.gravity != sim.defaults["gravity"]).any():
        g = sim.gravity
        tilt = torch.acos((-g[:, 2] / g.norm(dim=-1)).clamp(-1.0, 1.0))
        lines += ["", f"gravity tilt from vertical [rad]: min {float(tilt.min()):.4g}, mean {float(tilt.mean()):.4g}, "
                      f"max {float(tilt.max()):.4g}"]
    delay = env.action.delay
    if delay.any():
        lines += ["", f"action delay [control steps]: min {int(delay.min())}, mean {float(delay.float().mean()):.3g}, "
                      f"max {int(delay.max())}"]
    latency = env.sim.command_latency
    if latency is not None:
        lines += ["", f"command latency [physics steps of {env.sim.physics_dt * 1000:g} ms]: min {int(latency.min())}, "
                      f"mean {float(latency.float().mean()):.3g}, max {int(latency.max())}"]
    return "\n".join(lines)


def _range(pair) -> str:
    low, high = pair
    return f"[{low:.4g}, {high:.4g}]" if not (math.isnan(low) or math.isnan(high)) else "-"


def _table(head: tuple, rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows)]
