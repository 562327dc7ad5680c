"""Commands: what the policy is asked to do, sampled per env (``task.command``).

Every command draws its components uniformly from ``ranges`` ([low, high] each), per env, at each
episode start and every ``resampling_time_s``; :meth:`UniformCommand.hold` fixes it (evaluation,
sim-to-sim). Resampling is by mask; on a CPU no draw is made when no env needs one
(``env.any_world``), elsewhere nothing is read back to the host.
"""

import functools

import torch

from legion.tasks.math import (
    quat_error_magnitude,
    quat_from_euler_xyz,
    quat_mul,
    quat_near,
    quat_rotate,
    quat_rotate_inverse,
)


def _once_per_state(method):
    """``method(self)`` of a command, cached until the worlds' body poses or the command change
    (their torch version counters: a torch write bumps them, and NewtonSim does where Warp or
    MuJoCo write the state). The success, the rewards and the evaluation ask for the same errors
    several times a step, each a dozen tensor operations: on a CPU, most of a reach task's step."""

    @functools.wraps(method)
    def cached(self):
        body_q = self.env.sim.body_q
        if body_q.is_inference() or self.value.is_inference():  # made in inference mode: no version counters
            return method(self)
        key = (body_q._version, self.value._version)
        hit = self._cache.get(method.__name__)
        if hit is None or hit[0] != key:
            hit = self._cache[method.__name__] = (key, method(self))
        return hit[1]

    return cached


class UniformCommand:
    """Components drawn uniformly per env; subclasses turn the draw into ``value``.

    Attributes:
        value: (num_envs, dim) the current commands.
    """

    COMPONENTS: tuple[str, ...] = ()
    OPTIONAL: dict[str, float] = {}  # components that may be left out, and the value they then take

    def __init__(self, env, cfg):
        self.env = env
        known = set(self.COMPONENTS)
        unknown = set(cfg.ranges) - known
        missing = known - set(cfg.ranges) - set(self.OPTIONAL)
        if unknown or missing:
            raise ValueError(f"task.command.ranges: a {cfg.type} command takes {list(self.COMPONENTS)}"
                             + (f" ({sorted(self.OPTIONAL)} optional)" if self.OPTIONAL else "")
                             + f" (unknown: {sorted(unknown)}, missing: {sorted(missing)}).")
        ranges = [cfg.ranges.get(c, [self.OPTIONAL.get(c)] * 2) for c in self.COMPONENTS]
        self.ranges = torch.tensor(ranges, device=env.device, dtype=torch.float32)
        self.resampling_steps = max(1, round(cfg.resampling_time_s / env.step_dt))
        self.value = torch.zeros(env.num_envs, self.dim, device=env.device)
        self.steps_left = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)
        self.held = False

    @property
    def dim(self) -> int:
        return len(self.COMPONENTS)

    def sample(self) -> torch.Tensor:
        """(num_envs, dim) fresh commands for every env (the caller keeps those it needs)."""
        low, high = self.ranges.unbind(1)
        env = self.env
        return torch.lerp(low, high, torch.rand(env.num_envs, len(low), generator=env.generator, device=env.device))

    def resample(self, mask: torch.Tensor) -> None:
        """New commands for the envs in ``mask`` (num_envs,) bool, and for those whose time is up."""
        if self.held:
            return
        mask = mask | (self.steps_left <= 0)
        if not self.env.any_world(mask):
            return
        torch.where(mask[:, None], self.sample(), self.value, out=self.value)
        # In place: a rollout steps in inference mode, and a replaced tensor could not be updated outside it.
        self.steps_left.masked_fill_(mask, self.resampling_steps)

    def step(self) -> None:
        """Counts down one control step; the envs whose time is up draw at the next :meth:`resample`
        (the env's step resamples once, for those and the envs it resets: a draw is most of the
        command's cost on a CPU)."""
        if not self.held:
            self.steps_left -= 1

    def hold(self, value) -> None:
        """Fixes the commands at ``value`` ((dim,) for every env, or (num_envs, dim)) until
        :meth:`release`: no resampling, also across episode ends (evaluation, sim-to-sim)."""
        self.value[:] = torch.as_tensor(value, dtype=torch.float32, device=self.env.device)
        self.held = True

    def release(self) -> None:
        """Back to sampling: every env draws a new command now."""
        self.held = False
        self.resample(torch.ones(self.env.num_envs, dtype=torch.bool, device=self.env.device))


class VelocityCommand(UniformCommand):
    """Base velocity targets (v_x, v_y, yaw rate) in the base frame [m/s, m/s, rad/s].

    A fraction ``standing_fraction`` of the samples is exactly zero, so the policy also learns to
    stand still; a fraction ``turning_fraction`` only turns (zero linear velocity): a uniform draw
    of three components rarely asks to turn on the spot at full rate, where a policy that infers
    its velocity is weakest against a push. ``ranges``: ``lin_vel_x``, ``lin_vel_y``, ``ang_vel_z``.
    """

    COMPONENTS = ("lin_vel_x", "lin_vel_y", "ang_vel_z")

    def __init__(self, env, cfg):
        super().__init__(env, cfg)
        if cfg.standing_fraction + cfg.turning_fraction > 1.0:
            raise ValueError(f"task.command: standing_fraction ({cfg.standing_fraction}) and turning_fraction "
                             f"({cfg.turning_fraction}) are shares of the commands: together at most 1.")
        self.standing_fraction = cfg.standing_fraction
        self.turning_fraction = cfg.turning_fraction

    def sample(self) -> torch.Tensor:
        value = super().sample()
        draw = self.env.uniform(0.0, 1.0, (self.env.num_envs, 1))
        standing = draw < self.standing_fraction
        if self.turning_fraction:
            turning = (draw < self.standing_fraction + self.turning_fraction) & ~standing
            value[:, :2].masked_fill_(turning, 0.0)
        return torch.where(standing, 0.0, value)


class PositionCommand(UniformCommand):
    """A target position for one body (``cfg.entity``'s body ``cfg.body``, e.g. a cube to bring
    somewhere), drawn in a box of the robot's base frame (the robot's first body).

    ``ranges``: ``pos_x``, ``pos_y``, ``pos_z`` [m], base frame.

    Attributes:
        value: (num_envs, 3) target position [m], base frame.
        body: (the entity, body index) whose position is commanded.
    """

    COMPONENTS = ("pos_x", "pos_y", "pos_z")

    def __init__(self, env, cfg):
        super().__init__(env, cfg)
        if cfg.entity not in env.scene or not hasattr(env.scene[cfg.entity], "body_pos_w"):
            raise ValueError(f"task.command.entity: '{cfg.entity}' is not a scene entity with bodies; "
                             f"the scene has {list(env.scene)}.")
        entity = env.scene[cfg.entity]
        try:
            ids = entity.find_bodies(cfg.body) if cfg.body is not None else [0]
        except ValueError as e:
            raise ValueError(f"task.command.body: {e}") from None
        if len(ids) != 1:
            raise ValueError(f"task.command.body: '{cfg.body}' matches {[entity.body_names[i] for i in ids]} of "
                             f"{cfg.entity}; name exactly one body.")
        self.body = (entity, ids[0])
        self._cache: dict[str, tuple] = {}  # of _once_per_state (not state: LegionEnv.episode_state skips it)

    def base_pose_w(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The robot's base frame: position (num_envs, 3) [m] and orientation (num_envs, 4), world frame."""
        robot = self.env.robot
        return robot.body_pos_w[:, 0], robot.body_quat_w[:, 0]

    def target_pos_w(self) -> torch.Tensor:
        """(num_envs, 3) [m] the target position in the world frame."""
        base_pos, base_quat = self.base_pose_w()
        return base_pos + quat_rotate(base_quat, self.value[:, :3])

    def position_b(self) -> torch.Tensor:
        """(num_envs, 3) [m] the commanded body's position in the base frame, as ``value[:, :3]``."""
        entity, index = self.body
        base_pos, base_quat = self.base_pose_w()
        return quat_rotate_inverse(base_quat, entity.body_pos_w[:, index] - base_pos)

    @_once_per_state
    def position_error(self) -> torch.Tensor:
        """(num_envs,) [m] distance of the commanded body from its target position."""
        entity, index = self.body
        return torch.norm(entity.body_pos_w[:, index] - self.target_pos_w(), dim=-1)


class PoseCommand(PositionCommand):
    """A target pose (position and orientation) for one body, e.g. a robot's end effector, drawn in
    a box of the robot's base frame.

    ``ranges``: ``pos_x``, ``pos_y``, ``pos_z`` [m]; ``roll``, ``pitch``, ``yaw`` [rad] (optional,
    default 0): the orientation Rz(yaw) Ry(pitch) Rx(roll) relative to the base frame.

    Attributes:
        value: (num_envs, 7) target position [m] and orientation quaternion (x, y, z, w), base
            frame, with the sign of :attr:`reference`'s hemisphere.
        reference: (4,) the orientation at the middle of the ranges. q and -q are one rotation; the
            policy sees the one nearer this, which is continuous across the ranges (less than a
            half turn from their middle). "w >= 0" is not: a gripper pointing down has w ~ 0, and
            its sign, so the observed x, flipped at the home yaw.
    """

    COMPONENTS = ("pos_x", "pos_y", "pos_z", "roll", "pitch", "yaw")
    OPTIONAL = {"roll": 0.0, "pitch": 0.0, "yaw": 0.0}

    def __init__(self, env, cfg):
        super().__init__(env, cfg)
        self.reference = quat_from_euler_xyz(self.ranges[3:].mean(dim=1))

    @property
    def dim(self) -> int:
        return 7

    def canonical(self, pose: torch.Tensor) -> torch.Tensor:
        """(..., 7) ``pose`` with its quaternion in :attr:`reference`'s hemisphere."""
        return torch.cat([pose[..., :3], quat_near(pose[..., 3:7], self.reference)], -1)

    def sample(self) -> torch.Tensor:
        draw = super().sample()
        return torch.cat([draw[:, :3], quat_from_euler_xyz(draw[:, 3:], near=self.reference)], dim=-1)

    def hold(self, value) -> None:
        super().hold(self.canonical(torch.as_tensor(value, dtype=torch.float32, device=self.env.device)))

    def target_quat_w(self) -> torch.Tensor:
        """(num_envs, 4) the target orientation in the world frame."""
        return quat_mul(self.base_pose_w()[1], self.value[:, 3:7])

    @_once_per_state
    def orientation_error(self) -> torch.Tensor:
        """(num_envs,) [rad] angle between the commanded body's orientation and its target's."""
        entity, index = self.body
        return quat_error_magnitude(entity.body_quat_w[:, index], self.target_quat_w())


COMMANDS = {"velocity": VelocityCommand, "position": PositionCommand, "pose": PoseCommand}
