"""Velocity commands for locomotion: (v_x, v_y, yaw rate) in the base frame."""

import torch


class VelocityCommand:
    """Uniformly sampled base velocity targets, resampled per env every ``resampling_time_s``.

    A fraction ``standing_fraction`` of the samples is exactly zero, so the policy also learns to
    stand still.

    Args:
        env: the owning env (for its generator, device and control dt).
        lin_vel_x, lin_vel_y, ang_vel_z: [low, high] ranges [m/s, m/s, rad/s].
        resampling_time_s: seconds between resamples.
        standing_fraction: probability of a zero command.
    """

    def __init__(self, env, lin_vel_x, lin_vel_y, ang_vel_z, resampling_time_s=10.0, standing_fraction=0.02):
        self.env = env
        self.ranges = torch.tensor([lin_vel_x, lin_vel_y, ang_vel_z], device=env.device, dtype=torch.float32)
        self.resampling_steps = max(1, round(resampling_time_s / env.sim.control_dt))
        self.standing_fraction = standing_fraction
        self.value = torch.zeros(env.num_envs, 3, device=env.device)
        self.steps_left = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)

    def resample(self, env_ids: torch.Tensor) -> None:
        n = len(env_ids)
        low, high = self.ranges[:, 0], self.ranges[:, 1]
        value = low + (high - low) * self.env.uniform(0.0, 1.0, (n, 3))
        standing = self.env.uniform(0.0, 1.0, (n, 1)) < self.standing_fraction
        self.value[env_ids] = torch.where(standing, 0.0, value)
        self.steps_left[env_ids] = self.resampling_steps

    def step(self) -> None:
        """Counts down one control step and resamples the envs whose time is up."""
        self.steps_left -= 1
        due = (self.steps_left <= 0).nonzero().squeeze(-1)
        if due.numel():
            self.resample(due)
