"""Success metrics of a trained run: how often, how fast and how precisely its policy does the task.

For tasks with a ``task.success`` and a pose or position command (``arm_reach``, ``arm_lift``):
:func:`manipulation_metrics` runs the deterministic policy (observation noise off) for a number
of whole episodes and reports the success rate, the time to success and the final position and
orientation errors of the commanded body. ``legion eval`` reports these next to the locomotion
metrics.
"""

from __future__ import annotations

import math
import statistics


def manipulation_metrics(loaded, episodes: int = 100) -> dict:
    """Success rate, time to success and final errors over the first ``episodes`` episodes.

    Args:
        loaded: a :class:`legion.runs.LoadedRun` (its env and trained policy); every env starts a
            fresh episode here, so each counted episode is whole. Commands are the task's (or
            what the caller fixed with ``loaded.env.command.hold``).
        episodes: how many finished episodes to count (the env's worlds run them in parallel).

    Returns:
        ``{"task", "episodes", "success_rate", "time_to_success_s", "final_position_error_m",
        "final_orientation_error_rad", "per_episode"}``. ``time_to_success_s`` (episode time at
        which the success condition had held ``hold_s``) is over the successful episodes only;
        the final errors are the commanded body's distance [m] and angle [rad] from the command
        at the start of the episode's last control step (the step that ends an episode also
        resets its world). Each summary is ``{"mean", "median", "max"}``, or ``None`` where
        nothing was measured (no success; a position command has no orientation).
        ``per_episode``: one ``{"success", "time_to_success_s", "final_position_error_m",
        "final_orientation_error_rad"}`` per episode, in the order they ended.

    Raises:
        ValueError: the task defines no success, or its command is not a pose or position command.
    """
    import torch

    env = loaded.env
    if env.success is None:
        raise ValueError(f"task {env.cfg.name} defines no success (task.success): there is no success rate to "
                         "measure. Add a success section to its config (see configs/task/arm_reach.yaml).")
    command = env.command
    if not hasattr(command, "position_error"):
        raise ValueError(f"task {env.cfg.name}: manipulation metrics need a pose or position command "
                         f"(task.command.type), not {type(command).__name__}.")
    if episodes < 1:
        raise ValueError(f"episodes={episodes}: must be >= 1.")
    has_orientation = hasattr(command, "orientation_error")
    policy = loaded.runner.ppo.get_policy()
    policy.eval()
    records: list[dict] = []
    with torch.inference_mode():
        obs = env.reset()
        policy.reset()
        while len(records) < episodes:
            position_error = command.position_error()
            orientation_error = command.orientation_error() if has_orientation else None
            obs, _, dones, _ = env.step(policy(obs))
            policy.reset(dones)
            ended = dones.nonzero().squeeze(-1).tolist()  # one read-back per step: evaluation, not training
            for i in ended[: episodes - len(records)]:
                success = bool(env.success.last_succeeded[i])
                records.append({
                    "success": success,
                    "time_to_success_s": float(env.success.last_time_s[i]) if success else None,
                    "final_position_error_m": float(position_error[i]),
                    "final_orientation_error_rad": float(orientation_error[i]) if has_orientation else None,
                })

    def summary(values: list) -> dict | None:
        values = [v for v in values if v is not None and not math.isnan(v)]
        if not values:
            return None
        return {"mean": statistics.fmean(values), "median": statistics.median(values), "max": max(values)}

    return {
        "task": env.cfg.name,
        "episodes": len(records),
        "success_rate": sum(r["success"] for r in records) / len(records),
        "time_to_success_s": summary([r["time_to_success_s"] for r in records]),
        "final_position_error_m": summary([r["final_position_error_m"] for r in records]),
        "final_orientation_error_rad": summary([r["final_orientation_error_rad"] for r in records]),
        "per_episode": records,
    }
