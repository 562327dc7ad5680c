"""Commands: what the policy is asked to do, sampled per env (``task.command``)."""

import torch


class VelocityCommand:
    """Uniformly sampled base velocity targets (v_x, v_y, yaw rate) in the base frame [m/s, m/s,
    rad/s], resampled per env every ``resampling_time_s``.

    A fraction ``standing_fraction`` of the samples is exactly zero, so the policy also learns to
    stand still. ``ranges``: ``lin_vel_x``, ``lin_vel_y``, ``ang_vel_z``, each [low, high].

    Attributes:
        value: (num_envs, 3) the current commands.
    """

    COMPONENTS = ("lin_vel_x", "lin_vel_y", "ang_vel_z")

    def __init__(self, env, cfg):
        self.env = env
        unknown, missing = set(cfg.ranges) - set(self.COMPONENTS), set(self.COMPONENTS) - set(cfg.ranges)
        if unknown or missing:
            raise ValueError(f"task.command.ranges: a velocity command takes {list(self.COMPONENTS)} "
                             f"(unknown: {sorted(unknown)}, missing: {sorted(missing)}).")
        self.ranges = torch.tensor([cfg.ranges[c] for c in self.COMPONENTS], device=env.device, dtype=torch.float32)
        self.resampling_steps = max(1, round(cfg.resampling_time_s / env.step_dt))
        self.standing_fraction = cfg.standing_fraction
        self.value = torch.zeros(env.num_envs, 3, device=env.device)
        self.steps_left = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.held = False

    def resample(self, mask: torch.Tensor) -> None:
        """New commands for the envs in ``mask`` (num_envs,) bool."""
        if self.held:
            return
        n = self.env.num_envs
        low, high = self.ranges[:, 0], self.ranges[:, 1]
        value = low + (high - low) * self.env.uniform(0.0, 1.0, (n, 3))
        standing = self.env.uniform(0.0, 1.0, (n, 1)) < self.standing_fraction
        self.value[:] = torch.where(mask[:, None], torch.where(standing, 0.0, value), self.value)
        self.steps_left = torch.where(mask, self.resampling_steps, self.steps_left)

    def step(self) -> None:
        """Counts down one control step and resamples the envs whose time is up."""
        if self.held:
            return
        self.steps_left -= 1
        self.resample(self.steps_left <= 0)

    def hold(self, value) -> None:
        """Fixes the commands at ``value`` ((3,) for every env, or (num_envs, 3)) until :meth:`release`:
        no resampling, also across episode ends (evaluation, sim-to-sim)."""
        self.value[:] = torch.as_tensor(value, dtype=torch.float32, device=self.env.device)
        self.held = True

    def release(self) -> None:
        """Back to sampling: every env draws a new command now."""
        self.held = False
        self.resample(torch.ones(self.env.num_envs, dtype=torch.bool, device=self.env.device))


COMMANDS = {"velocity": VelocityCommand}
