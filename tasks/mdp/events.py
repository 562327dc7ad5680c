"""Event terms: episode starts and domain randomization, drawn per environment.

A task configures them under ``task.events``, one entry per term (schema:
:class:`legion.configs.schema.EventTerm`)::

    name: {func: <a function below, or "package.module:function"; default: the entry's name>,
           mode: startup | reset | interval,
           range: [low, high],                      # of the drawn value, in the term's units
           distribution: uniform | log_uniform | gaussian,   # default uniform
           interval_s: [low, high],                 # interval mode: seconds between events
           params: {...},                           # the function's keyword arguments
           enabled: true,
           curriculum: {start: [low, high], steps: N}}   # optional, reset/interval terms

- ``startup``: once for every env, when the env is built.
- ``reset``: for the envs starting an episode, after the env has put them in the default state
  (default joint pose, default root poses, zero velocities); terms run in config order, so
  ``joint_pos_scale`` then ``joint_pos_offset`` compose.
- ``interval``: per env, every T seconds of simulated time, T drawn from ``interval_s`` for each
  env (again after each event and at each episode start).

Distributions over ``[low, high]``: ``uniform``; ``log_uniform`` (needs low > 0);
``gaussian``: mean at the centre, standard deviation a quarter of the width, clipped to the range.
A curriculum moves the range linearly from ``start`` to ``range`` over ``steps`` control steps;
:meth:`Events.set_range` is the hook for any other schedule.

A term function is ``f(env, mask, draw, **params)``, marked with :func:`event`: it acts on the
envs where ``mask`` (num_envs,) bool is set and leaves the others exactly as they are (write with
:func:`where`). Masks, not index lists: finding which envs are due would read data back to the
host on a GPU at every step. ``draw(*shape, integer=False)`` returns (num_envs, *shape) samples of
the term's current range from the env's seeded generator (``integer=True``: whole numbers, every
one in [low, high] equally likely under ``uniform``); ``draw.max`` is the highest value the range
may reach (for what is sized by it). ``entity`` names the scene entity a term acts on (default
the robot); ``joints`` / ``bodies`` arrive as index tensors (see :mod:`legion.tasks.mdp`).
Physical parameters are written through the entity's per-env views relative to
``entity.defaults`` (so applying a term again never compounds) and named with
``env.sim.params_changed``; the next physics step hands them to the solver. A term keeps what it
carries over in place, on the device, and reads nothing back to the host: a captured step
(``sim.capture_step``) replays its kernels on the memory they saw.
"""

from __future__ import annotations

import math
import re
import sys
import warnings

import torch

from legion.tasks.math import quat_from_yaw, quat_mul
from legion.tasks.mdp.terms import bind_params, find_function

MODES = ("startup", "reset", "interval")
DISTRIBUTIONS = ("uniform", "log_uniform", "gaussian")


def event(modes: tuple[str, ...] = MODES, domain: tuple[float, float] = (-math.inf, math.inf)):
    """Marks a function as an event term: the modes it may run in and the values its range may
    take (checked when the term is configured and whenever its range changes)."""

    def mark(func):
        func.event_modes, func.event_domain = modes, domain
        return func

    return mark


class EventTerm:
    """One configured event term: its function, mode, distribution and current range.

    Built from a :class:`legion.configs.schema.EventTerm` once the env's scene exists (``env`` None:
    only check the config, see :func:`legion.tasks.mdp.check`).

    Attributes:
        range: (2,) the current range [low, high] on the env's device (a curriculum or
            :meth:`Events.set_range` moves it in place: a captured step reads it on every replay);
            ``low`` and ``high`` read it back to the host (not for the hot path).
        configured: the range in the config, (low, high).
        max_high: the highest ``high`` the range has been given (config, curriculum start,
            :meth:`set_range`): for what is sized by the range, e.g. the action-delay buffer.
        values: (num_envs, k) the values last drawn for each env (NaN before its first draw),
            in the range's units; what ``legion randomization`` reports.
        time_left: (num_envs,) [s] until each env's next interval event (interval mode only).
    """

    def __init__(self, env, name: str, cfg):
        where = self.where = f"task.events.{name}"
        self.env, self.name = env, name
        func = self.func = find_function(cfg.func or name, sys.modules[__name__], "events")
        self.mode = cfg.mode
        if self.mode not in func.event_modes:
            raise ValueError(f"{where}: mode '{self.mode}' is not one of {list(func.event_modes)} "
                             f"(the modes {func.__name__} supports; all modes: {list(MODES)}).")
        self.distribution = cfg.distribution
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"{where}: unknown distribution '{self.distribution}'; "
                             f"choose one of {list(DISTRIBUTIONS)}.")
        self.configured = self._check_range(cfg.range, "range")
        self.params = bind_params(func, cfg.params, where, leading=3, env=env)
        self.enabled = cfg.enabled

        self.interval = None
        if self.mode == "interval":
            if cfg.interval_s is None:
                raise ValueError(f"{where}: an interval term needs interval_s: [low, high] (seconds).")
            self.interval = _pair(cfg.interval_s, f"{where}.interval_s")
            if self.interval[0] <= 0:
                raise ValueError(f"{where}.interval_s: {list(self.interval)} must be > 0 seconds.")
        elif cfg.interval_s is not None:
            raise ValueError(f"{where}: interval_s is for mode interval (this term's mode is {self.mode}).")

        self.curriculum = None
        if cfg.curriculum is not None:
            if self.mode == "startup":
                raise ValueError(f"{where}: a curriculum on a startup term never takes effect (startup runs once); "
                                 "use mode reset or interval.")
            if cfg.curriculum.steps <= 0:
                raise ValueError(f"{where}.curriculum.steps: {cfg.curriculum.steps} must be > 0.")
            self.curriculum = (self._check_range(cfg.curriculum.start, "curriculum.start"), cfg.curriculum.steps)
        first = self.curriculum[0] if self.curriculum else self.configured
        self.max_high = max(first[1], self.configured[1])
        if env is not None:
            self.range = torch.tensor(first, dtype=torch.float64, device=env.device)  # the config's numbers exactly
            if self.curriculum:  # the schedule's ends, for Events.step to move the range on the device
                self._schedule = torch.tensor([first, self.configured], dtype=torch.float64, device=env.device)
            self.values = torch.full((env.num_envs, 1), math.nan, device=env.device)
            if self.interval:
                self.time_left = torch.zeros(env.num_envs, device=env.device)

    def _check_range(self, value, key: str) -> tuple[float, float]:
        low, high = _pair(value, f"{self.where}.{key}")
        d_low, d_high = self.func.event_domain
        if low < d_low or high > d_high:
            raise ValueError(f"{self.where}.{key}: [{low}, {high}] leaves the domain [{d_low}, {d_high}] "
                             f"of {self.func.__name__}.")
        if self.distribution == "log_uniform" and low <= 0:
            raise ValueError(f"{self.where}.{key}: log_uniform needs low > 0, got [{low}, {high}].")
        return low, high

    @property
    def low(self) -> float:
        return float(self.range[0])

    @property
    def high(self) -> float:
        return float(self.range[1])

    def set_range(self, low: float, high: float) -> None:
        low, high = self._check_range((low, high), "range")
        self.range[0], self.range[1] = low, high
        self.max_high = max(self.max_high, high)

    def apply(self, mask: torch.Tensor) -> None:
        """Runs the term for the envs where ``mask`` (num_envs,) is set, drawing from the current range."""
        self.func(self.env, mask, self._drawer(mask), **self.params)

    def _drawer(self, mask: torch.Tensor):
        def draw(*shape: int, integer: bool = False) -> torch.Tensor:
            n = self.env.num_envs
            x = self._sample((n, *shape), self.range[0], self.range[1], integer)
            flat = x.reshape(n, -1)
            if self.values.shape[1] != flat.shape[1]:  # the first draw sets the width; maybe in a rollout,
                with torch.inference_mode(False):  # so a normal tensor, updatable outside it too
                    self.values = torch.full((n, flat.shape[1]), math.nan, device=self.env.device)
            self.values.copy_(where(mask, flat, self.values))
            return x

        draw.max = self.max_high
        return draw

    def _sample(self, shape: tuple, low: torch.Tensor, high: torch.Tensor, integer: bool = False) -> torch.Tensor:
        env = self.env
        if self.distribution == "gaussian":
            z = torch.randn(shape, generator=env.generator, device=env.device)
            x = ((low + high) / 2 + (high - low) / 4 * z).clamp(low, high)
        else:
            u = torch.rand(shape, generator=env.generator, device=env.device)
            if integer and self.distribution == "uniform":
                return torch.floor(low + (high - low + 1) * u).clamp(max=high)
            if self.distribution == "log_uniform":
                x = torch.exp(torch.log(low) + (torch.log(high) - torch.log(low)) * u)
            else:
                x = low + (high - low) * u
        return x.round() if integer else x

    def redraw_intervals(self, mask: torch.Tensor) -> None:
        u = torch.rand(self.env.num_envs, generator=self.env.generator, device=self.env.device)
        self.time_left.copy_(where(mask, self.interval[0] + (self.interval[1] - self.interval[0]) * u, self.time_left))


class Events:
    """The task's event terms (``task.events``), applied by :class:`legion.tasks.env.LegionEnv`.


    Attributes:
        terms: every configured term by name, enabled or not (disabled ones are checked, not run).
        step_count: () long, control steps since the env was built (drives curricula; saved by
            :meth:`state_dict`). On the device, as the ranges: a captured step advances both.
    """

    def __init__(self, env, cfg: dict):
        self.env = env
        self.terms = {name: EventTerm(env, name, term) for name, term in cfg.items()}
        self.step_count = torch.zeros((), dtype=torch.long, device=env.device)
        self._parts: dict[str, torch.Tensor] = {}

    def part(self, name: str, like: torch.Tensor, fill: float) -> torch.Tensor:
        """A per-env buffer shaped like ``like`` (filled with ``fill`` on first use) holding one
        term's share of a parameter that several terms edit (e.g. body mass: scale and added)."""
        if name not in self._parts:
            self._parts[name] = torch.full_like(like, fill)
        return self._parts[name]

    def active(self, mode: str) -> list[EventTerm]:
        return [t for t in self.terms.values() if t.enabled and t.mode == mode]

    def apply(self, mode: str, mask: torch.Tensor) -> None:
        """Runs the enabled ``startup`` or ``reset`` terms, in config order, for the envs in ``mask``."""
        for term in self.active(mode):
            term.apply(mask)
        if mode == "reset":
            for term in self.active("interval"):
                term.redraw_intervals(mask)

    def step(self, dt: float) -> None:
        """One control step of ``dt`` seconds: advances curricula, fires the interval terms due."""
        self.step_count += 1
        for term in self.terms.values():
            if term.curriculum is not None and term.enabled:
                start, end = term._schedule
                term.range.copy_(torch.lerp(start, end, (self.step_count / term.curriculum[1]).clamp(max=1.0)))
        for term in self.active("interval"):
            term.time_left -= dt
            due = term.time_left <= 1e-6
            term.apply(due)
            term.redraw_intervals(due)

    def set_range(self, name: str, low: float, high: float) -> None:
        """The curriculum hook: the range the term ``name`` draws from from now on (a term with a
        configured curriculum goes back to its schedule at the next step)."""
        if name not in self.terms:
            raise ValueError(f"No event term '{name}'; the task has {list(self.terms)}.")
        self.terms[name].set_range(low, high)

    def ranges(self) -> dict[str, tuple[float, float]]:
        return {t.name: (t.low, t.high) for t in self.terms.values() if t.enabled}

    def log(self) -> dict[str, torch.Tensor]:
        """``Randomization/<term>_low`` and ``_high``: the current ranges, for TensorBoard (device
        tensors, read once per iteration by the runner)."""
        terms = [t for t in self.terms.values() if t.enabled]
        if not terms:
            return {}
        ranges = torch.stack([t.range for t in terms])  # a copy: the ranges themselves move on
        out = {}
        for term, (low, high) in zip(terms, ranges):
            out[f"Randomization/{term.name}_low"], out[f"Randomization/{term.name}_high"] = low, high
        return out

    def state_dict(self) -> dict:
        return {
            "randomization": {t.name: {"range": [t.low, t.high], "distribution": t.distribution, "mode": t.mode}
                              for t in self.terms.values() if t.enabled},
            "step_count": int(self.step_count),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count.fill_(int(state.get("step_count", 0)))
        skipped = []
        for name, entry in state.get("randomization", {}).items():
            term = self.terms.get(name)
            if term is None or not term.enabled:
                skipped.append(name)
                continue
            term.set_range(*entry["range"])
        if skipped:
            warnings.warn(f"Saved randomization ranges of {skipped} not restored: no such enabled event term now.")


def where(mask: torch.Tensor, value: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """``value`` in the envs of ``mask`` (num_envs,), ``current`` elsewhere (broadcast over the
    trailing dimensions)."""
    return torch.where(mask.view(-1, *([1] * (current.dim() - 1))), value, current)


def _pair(value, where: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected [low, high], got {value!r}.") from None
    if low > high:
        raise ValueError(f"{where}: [{low}, {high}] has low > high.")
    return low, high


# --- episode start (mode reset): perturb the default state the env has just written ------------
@event(modes=("reset",))
def joint_pos_scale(env, mask, draw, joints=".*"):
    """Positions of the selected robot joints times U(range), per joint, clamped to the joint limits."""
    robot = env.robot
    pos = robot.joint_pos[:, joints]
    scaled = (pos * draw(len(joints))).clamp(robot.joint_limits[joints, 0], robot.joint_limits[joints, 1])
    robot.joint_pos[:, joints] = where(mask, scaled, pos)


@event(modes=("reset",))
def joint_pos_offset(env, mask, draw, joints=".*"):
    """Positions of the selected robot joints plus U(range) [rad or m], per joint, clamped to the limits."""
    robot = env.robot
    pos = robot.joint_pos[:, joints]
    moved = (pos + draw(len(joints))).clamp(robot.joint_limits[joints, 0], robot.joint_limits[joints, 1])
    robot.joint_pos[:, joints] = where(mask, moved, pos)


@event(modes=("reset",))
def joint_vel(env, mask, draw, joints=".*"):
    """Velocities of the selected robot joints U(range) [rad/s or m/s], per joint."""
    robot = env.robot
    robot.joint_vel[:, joints] = where(mask, draw(len(joints)), robot.joint_vel[:, joints])


@event(modes=("reset",))
def root_yaw(env, mask, draw, entity: str = "robot"):
    """The entity's root turned about the world z axis by U(range) [rad]."""
    root = _floating(env, entity, "root_yaw")
    root.root_quat_w[:] = where(mask, quat_mul(quat_from_yaw(draw()), root.root_quat_w), root.root_quat_w)


@event(modes=("reset",))
def root_xy(env, mask, draw, entity: str = "robot"):
    """The entity's root moved by U(range) [m] along world x and y."""
    root = _floating(env, entity, "root_xy")
    root.root_pos_w[:, :2] = where(mask, root.root_pos_w[:, :2] + draw(2), root.root_pos_w[:, :2])


@event(modes=("reset",))
def root_vel(env, mask, draw, entity: str = "robot"):
    """The entity's root linear and angular velocity, each component U(range) [m/s, rad/s], world frame."""
    root = _floating(env, entity, "root_vel")
    root.root_vel_w[:] = where(mask, draw(6), root.root_vel_w)


@event(modes=("reset", "interval"))
def push_base(env, mask, draw, entity: str = "robot"):
    """A push: the root's world-frame x and y velocity change by U(range) [m/s] each."""
    root = _floating(env, entity, "push_base")
    velocity = root.root_lin_vel_w[:, :2]
    root.root_lin_vel_w[:, :2] = where(mask, velocity + draw(2), velocity)


def _floating(env, entity: str, name: str):
    root = env.scene[entity]
    if not getattr(root, "floating_base", False):
        raise ValueError(f"Event function {name} needs a free root; {entity} has none.")
    return root


# --- contact material ------------------------------------------------------------------------
@event(domain=(0.01, math.inf))
def friction(env, mask, draw, entity: str = "robot", bodies=".*"):
    """Friction coefficient U(range) of every shape of the selected bodies, one value per env.
    The entity's own value is the one in effect against the ground (see :mod:`legion.tasks.sim`)."""
    target = env.scene[entity]
    chosen = mask[:, None] & torch.isin(target.shape_body, bodies)  # (num_envs, num_shapes)
    target.shape_friction[:] = torch.where(chosen, draw(1), target.shape_friction)
    env.sim.params_changed("shape_friction")


@event(domain=(0.0, 0.6))
def restitution(env, mask, draw, entity: str = "robot", bodies=".*"):
    """Coefficient of restitution U(range) of the selected bodies' shapes, one value per env.
    Above ~0.6 MuJoCo's soft contacts gain energy at 5 ms steps, hence the domain."""
    target = env.scene[entity]
    chosen = mask[:, None] & torch.isin(target.shape_body, bodies)
    target.shape_restitution[:] = torch.where(chosen, draw(1), target.shape_restitution)
    env.sim.params_changed("shape_restitution")


# --- mass properties -------------------------------------------------------------------------
@event()
def added_mass(env, mask, draw, entity: str = "robot", bodies="base"):
    """Mass of each selected body plus U(range) [kg] (inertia scaled with it)."""
    target = env.scene[entity]
    part = env.events.part(f"{entity}.body_mass_added", target.body_mass, 0.0)
    part[:, bodies] = where(mask, draw(len(bodies)), part[:, bodies])
    _write_mass(env, target)


@event(domain=(0.0, math.inf))
def mass_scale(env, mask, draw, entity: str = "robot", bodies=".*"):
    """Mass of each selected body times U(range), per body (inertia scaled with it)."""
    target = env.scene[entity]
    part = env.events.part(f"{entity}.body_mass_scale", target.body_mass, 1.0)
    part[:, bodies] = where(mask, draw(len(bodies)), part[:, bodies])
    _write_mass(env, target)


@event(domain=(0.1, 10.0))
def size_scale(env, mask, draw, entity: str = "robot", bodies=".*"):
    """Every shape of each selected body scaled by U(range), one factor per body (the shapes keep
    their proportions and their place on the body). The mass stays (``mass_scale`` changes it);
    the inertia follows the size (x factor^2)."""
    target = env.scene[entity]
    part = env.events.part(f"{entity}.body_size_scale", target.body_mass, 1.0)
    part[:, bodies] = where(mask, draw(len(bodies)), part[:, bodies])
    on_body = target.shape_body >= 0
    factor = torch.where(on_body, part[:, target.shape_body.clamp(min=0)], 1.0)  # (num_envs, num_shapes)
    target.shape_size[:] = target.defaults["shape_size"] * factor[..., None]
    env.sim.params_changed("shape_size")
    _write_mass(env, target)


def _write_mass(env, target):
    """mass = default * scale + added, at least 10% of the default; the inertia tensor follows
    the mass (same shape, same density distribution) and the size (x size factor^2). Envs whose
    parts did not change get the values they already hold."""
    events, name = env.events, target.name
    default = target.defaults["body_mass"]
    scale = events.part(f"{name}.body_mass_scale", target.body_mass, 1.0)
    added = events.part(f"{name}.body_mass_added", target.body_mass, 0.0)
    size = events.part(f"{name}.body_size_scale", target.body_mass, 1.0)
    mass = torch.maximum(default * scale + added, 0.1 * default)
    target.body_mass[:] = mass
    factor = mass / default.clamp(min=1e-9) * size**2
    target.body_inertia[:] = target.defaults["body_inertia"] * factor[..., None, None]
    env.sim.params_changed("body_mass", "body_inertia")


@event()
def com_offset(env, mask, draw, entity: str = "robot", bodies="base"):
    """Centre of mass of each selected body moved by U(range) [m] along each body axis."""
    target = env.scene[entity]
    moved = target.defaults["body_com"][:, bodies] + draw(len(bodies), 3)
    target.body_com[:, bodies] = where(mask, moved, target.body_com[:, bodies])
    env.sim.params_changed("body_com")


# --- actuators and joints --------------------------------------------------------------------
def _scale_joint_param(env, mask, draw, name: str, joints: torch.Tensor):
    robot = env.robot
    view = getattr(robot, name)
    view[:, joints] = where(mask, robot.defaults[name][:, joints] * draw(len(joints)), view[:, joints])
    env.sim.params_changed(name)


@event(domain=(0.0, math.inf))
def stiffness_scale(env, mask, draw, joints=".*"):
    """PD stiffness of each selected joint times U(range), per joint."""
    _scale_joint_param(env, mask, draw, "joint_stiffness", joints)


@event(domain=(0.0, math.inf))
def damping_scale(env, mask, draw, joints=".*"):
    """PD damping of each selected joint times U(range), per joint."""
    _scale_joint_param(env, mask, draw, "joint_damping", joints)


@event(domain=(0.01, math.inf))
def effort_limit_scale(env, mask, draw, joints=".*"):
    """Motor strength: the torque limit of each selected joint times U(range), per joint (it
    clamps the PD torque of position actuators; feed-forward efforts are not clamped)."""
    _scale_joint_param(env, mask, draw, "joint_effort_limit", joints)


@event(domain=(0.0, math.inf))
def joint_friction(env, mask, draw, joints=".*"):
    """Dry friction loss U(range) [N m] of each selected joint, per joint."""
    robot = env.robot
    robot.joint_friction[:, joints] = where(mask, draw(len(joints)), robot.joint_friction[:, joints])
    env.sim.params_changed("joint_friction")


@event(domain=(0.0, math.inf))
def joint_armature(env, mask, draw, joints=".*"):
    """Armature (reflected rotor inertia) U(range) [kg m^2] of each selected joint, per joint."""
    robot = env.robot
    robot.joint_armature[:, joints] = where(mask, draw(len(joints)), robot.joint_armature[:, joints])
    env.sim.params_changed("joint_armature")


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def action_delay(env, mask, draw):
    """Actuator latency: actions reach the joints U{range} whole control steps late, per env."""
    env.action.set_delay(mask, draw(integer=True).long(), max_delay=int(draw.max))


# --- world and sensing -----------------------------------------------------------------------
@event(domain=(-0.5, 0.5))
def gravity_tilt(env, mask, draw):
    """Gravity turned by U(range) [rad] about the world x axis, then about the world y axis."""
    sim = env.sim
    angle = draw(2)
    cx, sx, cy, sy = torch.cos(angle[:, 0]), torch.sin(angle[:, 0]), torch.cos(angle[:, 1]), torch.sin(angle[:, 1])
    direction = torch.stack([-cx * sy, sx, -cx * cy], dim=-1)
    sim.gravity[:] = where(mask, direction * sim.defaults["gravity"].norm(dim=-1, keepdim=True), sim.gravity)
    sim.params_changed("gravity")


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def obs_noise_scale(env, mask, draw, terms: str = ".*", group: str | None = None):
    """Observation noise of the matching noisy terms (regex over term names; ``group``: one
    observation group or all) times U(range), one factor per env and term."""
    for group_name, group_terms in env.observation_terms.items():
        for term in group_terms:
            if term.noise_scale is not None and group in (None, group_name) and re.fullmatch(terms, term.name):
                term.noise_scale[:] = where(mask, draw(1), term.noise_scale)
