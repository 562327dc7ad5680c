"""Event terms: episode starts and domain randomization, drawn per environment.

A task configures them under ``task.events``, one entry per term::

    name: {func: <a function below; default: the entry's name>,
           mode: startup | reset | interval,
           range: [low, high],                      # of the drawn value, in the term's units
           distribution: uniform | log_uniform | gaussian,   # default uniform
           interval_s: [low, high],                 # interval mode: seconds between events
           params: {...},                           # the function's keyword arguments
           enabled: true,
           curriculum: {start: [low, high], steps: N}}   # optional, reset/interval terms

- ``startup``: once for every env, when the env is built.
- ``reset``: for the envs starting an episode, after the env has put them in the default state
  (default joint pose, default root pose, zero velocities); terms run in config order, so
  ``joint_pos_scale`` then ``joint_pos_offset`` compose.
- ``interval``: per env, every T seconds of simulated time, T drawn from ``interval_s`` for each
  env (again after each event and at each episode start).

Distributions over ``[low, high]``: ``uniform``; ``log_uniform`` (needs low > 0);
``gaussian``: mean at the centre, standard deviation a quarter of the width, clipped to the range.
A curriculum moves the range linearly from ``start`` to ``range`` over ``steps`` control steps;
:meth:`Events.set_range` is the hook for any other schedule.

A term function is ``f(env, env_ids, draw, **params)``: ``draw(*shape, integer=False)`` returns
(len(env_ids), *shape) samples of the term's current range from the env's seeded generator
(``integer=True``: whole numbers, every one in [low, high] equally likely under ``uniform``).
Physical parameters are written through the per-env views of ``env.sim`` relative to
``env.sim.defaults`` (so applying a term again never compounds) and named with
``env.sim.params_changed``; the next physics step hands them to the solver.
"""

from __future__ import annotations

import inspect
import math
import re
import warnings

import torch

from legion.tasks.mdp.math import quat_from_yaw, quat_mul

MODES = ("startup", "reset", "interval")
DISTRIBUTIONS = ("uniform", "log_uniform", "gaussian")
TERM_KEYS = ("func", "mode", "range", "distribution", "interval_s", "params", "enabled", "curriculum")


def event(modes: tuple[str, ...] = MODES, domain: tuple[float, float] = (-math.inf, math.inf)):
    """Marks a function as an event term: the modes it may run in and the values its range may
    take (checked when the term is configured and whenever its range changes)."""

    def mark(func):
        func.event_modes, func.event_domain = modes, domain
        return func

    return mark


class EventTerm:
    """One configured event term: its function, mode, distribution and current range.

    Attributes:
        low, high: the current range (a curriculum or :meth:`Events.set_range` moves it).
        configured: the range in the config, (low, high).
        values: (num_envs, k) the values last drawn for each env (NaN before its first draw),
            in the range's units; what ``legion randomization`` reports.
        time_left: (num_envs,) [s] until each env's next interval event (interval mode only).
    """

    def __init__(self, env, name: str, spec: dict):
        where = f"task.events.{name}"
        spec = dict(spec or {})
        unknown = sorted(set(spec) - set(TERM_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; an event term takes {list(TERM_KEYS)}.")
        func_name = spec.get("func", name)
        func = globals().get(func_name)
        if not hasattr(func, "event_modes"):
            raise ValueError(f"{where}: unknown event function '{func_name}'. Available: {available()}")
        self.env, self.name, self.func, self.where = env, name, func, where
        self.mode = spec.get("mode", "reset")
        if self.mode not in func.event_modes:
            raise ValueError(f"{where}: mode '{self.mode}' is not one of {list(func.event_modes)} "
                             f"(the modes {func_name} supports; all modes: {list(MODES)}).")
        self.distribution = spec.get("distribution", "uniform")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"{where}: unknown distribution '{self.distribution}'; "
                             f"choose one of {list(DISTRIBUTIONS)}.")
        if "range" not in spec:
            raise ValueError(f"{where}: needs a range: [low, high].")
        self.configured = self._check_range(spec["range"], "range")
        self.low, self.high = self.configured
        self.params = dict(spec.get("params") or {})
        try:
            inspect.signature(func).bind(env, None, None, **self.params)
        except TypeError as e:
            raise ValueError(f"{where}: bad params {self.params} for {func_name}: {e}") from e
        self.enabled = bool(spec.get("enabled", True))

        self.interval = None
        if self.mode == "interval":
            if "interval_s" not in spec:
                raise ValueError(f"{where}: an interval term needs interval_s: [low, high] (seconds).")
            self.interval = _pair(spec["interval_s"], f"{where}.interval_s")
            if self.interval[0] <= 0:
                raise ValueError(f"{where}.interval_s: {list(self.interval)} must be > 0 seconds.")
            self.time_left = torch.zeros(env.num_envs, device=env.device)
        elif "interval_s" in spec:
            raise ValueError(f"{where}: interval_s is for mode interval (this term's mode is {self.mode}).")

        self.curriculum = None
        if spec.get("curriculum") is not None:
            cur = dict(spec["curriculum"])
            if self.mode == "startup":
                raise ValueError(f"{where}: a curriculum on a startup term never takes effect (startup runs once); "
                                 "use mode reset or interval.")
            if set(cur) != {"start", "steps"} or int(cur["steps"]) <= 0:
                raise ValueError(f"{where}.curriculum: expected {{start: [low, high], steps: N > 0}}, got {cur}.")
            self.curriculum = (self._check_range(cur["start"], "curriculum.start"), int(cur["steps"]))
            self.low, self.high = self.curriculum[0]
        self.values = torch.full((env.num_envs, 1), math.nan, device=env.device)

    def _check_range(self, value, key: str) -> tuple[float, float]:
        low, high = _pair(value, f"{self.where}.{key}")
        d_low, d_high = self.func.event_domain
        if low < d_low or high > d_high:
            raise ValueError(f"{self.where}.{key}: [{low}, {high}] leaves the domain [{d_low}, {d_high}] "
                             f"of {self.func.__name__}.")
        if self.distribution == "log_uniform" and low <= 0:
            raise ValueError(f"{self.where}.{key}: log_uniform needs low > 0, got [{low}, {high}].")
        return low, high

    def set_range(self, low: float, high: float) -> None:
        self.low, self.high = self._check_range((low, high), "range")

    def apply(self, env_ids: torch.Tensor) -> None:
        """Runs the term for the envs ``env_ids`` (k,), drawing from the current range."""
        self.func(self.env, env_ids, self._drawer(env_ids), **self.params)

    def _drawer(self, env_ids: torch.Tensor):
        def draw(*shape: int, integer: bool = False) -> torch.Tensor:
            x = self._sample((len(env_ids), *shape), self.low, self.high, integer)
            flat = x.reshape(len(env_ids), -1)
            if self.values.shape[1] != flat.shape[1]:
                self.values = torch.full((self.env.num_envs, flat.shape[1]), math.nan, device=self.env.device)
            self.values[env_ids] = flat
            return x

        draw.low, draw.high = self.low, self.high
        return draw

    def _sample(self, shape: tuple, low: float, high: float, integer: bool = False) -> torch.Tensor:
        env = self.env
        if self.distribution == "gaussian":
            z = torch.randn(shape, generator=env.generator, device=env.device)
            x = ((low + high) / 2 + (high - low) / 4 * z).clamp(low, high)
        else:
            u = torch.rand(shape, generator=env.generator, device=env.device)
            if integer and self.distribution == "uniform":
                return torch.floor(low + (high - low + 1) * u).clamp(max=high)
            if self.distribution == "log_uniform":
                x = torch.exp(math.log(low) + (math.log(high) - math.log(low)) * u)
            else:
                x = low + (high - low) * u
        return x.round() if integer else x

    def redraw_intervals(self, env_ids: torch.Tensor) -> None:
        u = torch.rand(len(env_ids), generator=self.env.generator, device=self.env.device)
        self.time_left[env_ids] = self.interval[0] + (self.interval[1] - self.interval[0]) * u


class Events:
    """The task's event terms (``task.events``), applied by :class:`legion.tasks.env.LegionEnv`.

    Built before the simulation (it needs only ``env.num_envs``, ``device`` and ``generator``),
    so a bad config fails at once, naming the term.

    Attributes:
        terms: every configured term by name, enabled or not (disabled ones are checked, not run).
        step_count: control steps since the env was built (drives curricula; saved by
            :meth:`state_dict`).
    """

    def __init__(self, env, cfg: dict):
        self.env = env
        self.terms = {name: EventTerm(env, name, spec) for name, spec in (cfg or {}).items()}
        self.step_count = 0
        self._parts: dict[str, torch.Tensor] = {}

    def part(self, name: str, like: torch.Tensor, fill: float) -> torch.Tensor:
        """A per-env buffer shaped like ``like`` (filled with ``fill`` on first use) holding one
        term's share of a parameter that several terms edit (e.g. body mass: scale and added)."""
        if name not in self._parts:
            self._parts[name] = torch.full_like(like, fill)
        return self._parts[name]

    def active(self, mode: str) -> list[EventTerm]:
        return [t for t in self.terms.values() if t.enabled and t.mode == mode]

    def apply(self, mode: str, env_ids: torch.Tensor) -> None:
        """Runs the enabled ``startup`` or ``reset`` terms, in config order, for ``env_ids``."""
        for term in self.active(mode):
            term.apply(env_ids)
        if mode == "reset":
            for term in self.active("interval"):
                term.redraw_intervals(env_ids)

    def step(self, dt: float) -> None:
        """One control step of ``dt`` seconds: advances curricula, fires the interval terms due."""
        self.step_count += 1
        for term in self.terms.values():
            if term.curriculum is not None and term.enabled:
                (start_low, start_high), steps = term.curriculum
                f = min(1.0, self.step_count / steps)
                low, high = term.configured
                term.low, term.high = start_low + f * (low - start_low), start_high + f * (high - start_high)
        for term in self.active("interval"):
            term.time_left -= dt
            due = (term.time_left <= 1e-6).nonzero().squeeze(-1)
            if due.numel():
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

    def log(self) -> dict[str, float]:
        """``Randomization/<term>_low`` and ``_high``: the current ranges, for TensorBoard."""
        out = {}
        for name, (low, high) in self.ranges().items():
            out[f"Randomization/{name}_low"], out[f"Randomization/{name}_high"] = low, high
        return out

    def state_dict(self) -> dict:
        return {
            "randomization": {t.name: {"range": [t.low, t.high], "distribution": t.distribution, "mode": t.mode}
                              for t in self.terms.values() if t.enabled},
            "step_count": self.step_count,
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state.get("step_count", 0))
        skipped = []
        for name, entry in state.get("randomization", {}).items():
            term = self.terms.get(name)
            if term is None or not term.enabled:
                skipped.append(name)
                continue
            term.set_range(*entry["range"])
        if skipped:
            warnings.warn(f"Saved randomization ranges of {skipped} not restored: no such enabled event term now.")


def available() -> list[str]:
    return sorted(name for name, f in globals().items() if hasattr(f, "event_modes"))


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
def joint_pos_scale(env, env_ids, draw):
    """Joint positions times U(range), per joint, clamped to the joint limits."""
    sim = env.sim
    pos = sim.joint_pos[env_ids] * draw(sim.num_joints)
    sim.joint_pos[env_ids] = pos.clamp(sim.joint_limits[:, 0], sim.joint_limits[:, 1])


@event(modes=("reset",))
def joint_pos_offset(env, env_ids, draw):
    """Joint positions plus U(range) [rad or m], per joint, clamped to the joint limits."""
    sim = env.sim
    pos = sim.joint_pos[env_ids] + draw(sim.num_joints)
    sim.joint_pos[env_ids] = pos.clamp(sim.joint_limits[:, 0], sim.joint_limits[:, 1])


@event(modes=("reset",))
def joint_vel(env, env_ids, draw):
    """Joint velocities U(range) [rad/s or m/s], per joint."""
    env.sim.joint_vel[env_ids] = draw(env.sim.num_joints)


@event(modes=("reset",))
def root_yaw(env, env_ids, draw):
    """Base turned about the world z axis by U(range) [rad]."""
    sim = _floating(env, "root_yaw")
    sim.root_quat[env_ids] = quat_mul(quat_from_yaw(draw()), sim.root_quat[env_ids])


@event(modes=("reset",))
def root_xy(env, env_ids, draw):
    """Base moved by U(range) [m] along world x and y."""
    sim = _floating(env, "root_xy")
    sim.root_pos[env_ids, :2] += draw(2)


@event(modes=("reset",))
def root_vel(env, env_ids, draw):
    """Base linear and angular velocity, each component U(range) [m/s, rad/s], world frame."""
    sim = _floating(env, "root_vel")
    velocity = draw(6)
    sim.root_lin_vel[env_ids] = velocity[:, :3]
    sim.root_ang_vel[env_ids] = velocity[:, 3:]


@event(modes=("reset", "interval"))
def push_base(env, env_ids, draw):
    """A push: the base's world-frame x and y velocity change by U(range) [m/s] each."""
    sim = _floating(env, "push_base")
    sim.root_lin_vel[env_ids, :2] += draw(2)


def _floating(env, name: str):
    if not env.sim.floating_base:
        raise ValueError(f"Event function {name} needs a floating-base robot; {env.cfg['robot']} has a fixed base.")
    return env.sim


# --- contact material ------------------------------------------------------------------------
@event(domain=(0.01, math.inf))
def friction(env, env_ids, draw, bodies: str = ".*"):
    """Friction coefficient U(range) of every shape of the selected bodies, one value per env.
    The robot's own value is the one in effect against the ground (see :mod:`legion.tasks.sim`)."""
    shapes = _shapes(env, bodies)
    env.sim.shape_friction[env_ids[:, None], shapes] = draw(1)
    env.sim.params_changed("shape_friction")


@event(domain=(0.0, 0.6))
def restitution(env, env_ids, draw, bodies: str = ".*"):
    """Coefficient of restitution U(range) of the selected bodies' shapes, one value per env.
    Above ~0.6 MuJoCo's soft contacts gain energy at 5 ms steps, hence the domain."""
    shapes = _shapes(env, bodies)
    env.sim.shape_restitution[env_ids[:, None], shapes] = draw(1)
    env.sim.params_changed("shape_restitution")


def _shapes(env, bodies: str) -> torch.Tensor:
    body_ids = torch.tensor(env.sim.find_bodies(bodies), device=env.device)
    return torch.isin(env.sim.shape_body, body_ids).nonzero().squeeze(-1)


# --- mass properties -------------------------------------------------------------------------
@event()
def added_mass(env, env_ids, draw, bodies: str = "base"):
    """Mass of each selected body plus U(range) [kg] (inertia scaled with it)."""
    ids = env.sim.find_bodies(bodies)
    env.events.part("body_mass_added", env.sim.body_mass, 0.0)[env_ids[:, None], ids] = draw(len(ids))
    _write_mass(env, env_ids)


@event(domain=(0.0, math.inf))
def mass_scale(env, env_ids, draw, bodies: str = ".*"):
    """Mass of each selected body times U(range), per body (inertia scaled with it)."""
    ids = env.sim.find_bodies(bodies)
    env.events.part("body_mass_scale", env.sim.body_mass, 1.0)[env_ids[:, None], ids] = draw(len(ids))
    _write_mass(env, env_ids)


def _write_mass(env, env_ids):
    """mass = default * scale + added, at least 10% of the default; the inertia tensor follows
    the mass (same shape, same density distribution)."""
    sim, events = env.sim, env.events
    default = sim.defaults["body_mass"][env_ids]
    scale = events.part("body_mass_scale", sim.body_mass, 1.0)[env_ids]
    added = events.part("body_mass_added", sim.body_mass, 0.0)[env_ids]
    mass = default * scale + added
    mass = torch.maximum(mass, 0.1 * default)
    sim.body_mass[env_ids] = mass
    ratio = mass / default.clamp(min=1e-9)
    sim.body_inertia[env_ids] = sim.defaults["body_inertia"][env_ids] * ratio[..., None, None]
    sim.params_changed("body_mass", "body_inertia")


@event()
def com_offset(env, env_ids, draw, bodies: str = "base"):
    """Centre of mass of each selected body moved by U(range) [m] along each body axis."""
    sim = env.sim
    ids = sim.find_bodies(bodies)
    sim.body_com[env_ids[:, None], ids] = sim.defaults["body_com"][env_ids[:, None], ids] + draw(len(ids), 3)
    sim.params_changed("body_com")


# --- actuators and joints --------------------------------------------------------------------
def _scale_joint_param(env, env_ids, draw, name: str, joints: str):
    sim = env.sim
    ids = sim.find_joints(joints)
    getattr(sim, name)[env_ids[:, None], ids] = sim.defaults[name][env_ids[:, None], ids] * draw(len(ids))
    sim.params_changed(name)


@event(domain=(0.0, math.inf))
def stiffness_scale(env, env_ids, draw, joints: str = ".*"):
    """PD stiffness of each selected joint times U(range), per joint."""
    _scale_joint_param(env, env_ids, draw, "joint_stiffness", joints)


@event(domain=(0.0, math.inf))
def damping_scale(env, env_ids, draw, joints: str = ".*"):
    """PD damping of each selected joint times U(range), per joint."""
    _scale_joint_param(env, env_ids, draw, "joint_damping", joints)


@event(domain=(0.01, math.inf))
def effort_limit_scale(env, env_ids, draw, joints: str = ".*"):
    """Motor strength: the torque limit of each selected joint times U(range), per joint (it
    clamps the PD torque of position actuators; feed-forward efforts are not clamped)."""
    _scale_joint_param(env, env_ids, draw, "joint_effort_limit", joints)


@event(domain=(0.0, math.inf))
def joint_friction(env, env_ids, draw, joints: str = ".*"):
    """Dry friction loss U(range) [N m] of each selected joint, per joint."""
    ids = env.sim.find_joints(joints)
    env.sim.joint_friction[env_ids[:, None], ids] = draw(len(ids))
    env.sim.params_changed("joint_friction")


@event(domain=(0.0, math.inf))
def joint_armature(env, env_ids, draw, joints: str = ".*"):
    """Armature (reflected rotor inertia) U(range) [kg m^2] of each selected joint, per joint."""
    ids = env.sim.find_joints(joints)
    env.sim.joint_armature[env_ids[:, None], ids] = draw(len(ids))
    env.sim.params_changed("joint_armature")


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def action_delay(env, env_ids, draw):
    """Actuator latency: actions reach the joints U{range} whole control steps late, per env."""
    env.action.set_delay(env_ids, draw(integer=True).long(), max_delay=int(draw.high))


# --- world and sensing -----------------------------------------------------------------------
@event(domain=(-0.5, 0.5))
def gravity_tilt(env, env_ids, draw):
    """Gravity turned by U(range) [rad] about the world x axis, then about the world y axis."""
    sim = env.sim
    angle = draw(2)
    cx, sx, cy, sy = torch.cos(angle[:, 0]), torch.sin(angle[:, 0]), torch.cos(angle[:, 1]), torch.sin(angle[:, 1])
    direction = torch.stack([-cx * sy, sx, -cx * cy], dim=-1)
    sim.gravity[env_ids] = direction * sim.defaults["gravity"][env_ids].norm(dim=-1, keepdim=True)
    sim.params_changed("gravity")


@event(modes=("startup", "reset"), domain=(0.0, math.inf))
def obs_noise_scale(env, env_ids, draw, terms: str = ".*", group: str | None = None):
    """Observation noise of the matching noisy terms (regex over term names; ``group``: one
    observation group or all) times U(range), one factor per env and term."""
    for group_name, group_terms in env.observation_terms.items():
        for term in group_terms:
            if term.noise_scale is not None and group in (None, group_name) and re.fullmatch(terms, term.name):
                term.noise_scale[env_ids] = draw(1)
