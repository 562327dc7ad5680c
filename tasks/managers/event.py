"""The event manager: the task's event terms (``task.events``), when they run and what they draw.

A task configures them under ``task.events``, one entry per term (schema:
:class:`legion.configs.schema.EventTerm`)::

    name: {func: <a function of legion.tasks.mdp.events, or "package.module:function"; default: the entry's name>,
           mode: startup | reset | interval,
           range: [low, high],                      # of the drawn value, in the term's units
           distribution: uniform | log_uniform | gaussian,   # default uniform
           interval_s: [low, high],                 # interval mode: seconds between events
           params: {...},                           # the function's keyword arguments
           enabled: true,
           curriculum: {start: [low, high], steps: N,   # optional, reset/interval terms
                        interval_s: [low, high]}}         # optional, interval terms: at step 0

- ``startup``: once for every env, when the env is built.
- ``reset``: for the envs starting an episode, after the env has put them in the default state
  (default joint pose, default root poses, zero velocities); terms run in config order, so
  ``joint_pos_scale`` then ``joint_pos_offset`` compose.
- ``interval``: per env, every T seconds of simulated time, T drawn from ``interval_s`` for each
  env (again after each event and at each episode start).

Distributions over ``[low, high]``: ``uniform``; ``log_uniform`` (needs low > 0);
``gaussian``: mean at the centre, standard deviation a quarter of the width, clipped to the range.
A curriculum moves the range linearly from ``start`` to ``range`` over ``steps`` control steps
(and an interval term's ``interval_s`` from the curriculum's ``interval_s``, if given: pushes
that grow stronger and more frequent); :meth:`EventManager.set_range` is the hook for any other
schedule.

The term functions and what they may do are in :mod:`legion.tasks.mdp.events`. Ranges, drawn
values, interval timers and the step count live on the device and change in place: a captured
step (``sim.capture_step``) replays its kernels on the memory they saw.
"""

from __future__ import annotations

import math
import warnings

import torch

from legion.tasks.mdp import events
from legion.tasks.mdp.events import MODES
from legion.tasks.mdp.terms import bind_params, find_function

DISTRIBUTIONS = ("uniform", "log_uniform", "gaussian")


class EventTerm:
    """One configured event term: its function, mode, distribution and current range.

    Built from a :class:`legion.configs.schema.EventTerm` once the env's scene exists (``env`` None:
    only check the config, see :func:`legion.tasks.managers.check`).

    Attributes:
        range: (2,) the current range [low, high] on the env's device (a curriculum or
            :meth:`EventManager.set_range` moves it in place: a captured step reads it on every replay);
            ``low`` and ``high`` read it back to the host (not for the hot path).
        configured: the range in the config, (low, high).
        max_high: the highest ``high`` the range has been given (config, curriculum start,
            :meth:`set_range`): for what is sized by the range, e.g. the action-delay buffer.
        values: (num_envs, k) the values last drawn for each env (NaN before its first draw),
            in the range's units; what ``legion randomization`` reports.
        time_left: (num_envs,) [s] until each env's next interval event (interval mode only).
        interval: the configured (low, high) seconds between interval events; None for other modes.
        interval_now: (2,) the [low, high] seconds the next intervals are drawn from, on the device
            (a curriculum's ``interval_s`` moves it; interval mode only).
    """

    def __init__(self, env, name: str, cfg):
        where = self.where = f"task.events.{name}"
        self.env, self.name = env, name
        func = self.func = find_function(cfg.func or name, events, "events")
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

        self.curriculum, first_interval = None, None
        if cfg.curriculum is not None:
            if self.mode == "startup":
                raise ValueError(f"{where}: a curriculum on a startup term never takes effect (startup runs once); "
                                 "use mode reset or interval.")
            if cfg.curriculum.steps <= 0:
                raise ValueError(f"{where}.curriculum.steps: {cfg.curriculum.steps} must be > 0.")
            self.curriculum = (self._check_range(cfg.curriculum.start, "curriculum.start"), cfg.curriculum.steps)
            if cfg.curriculum.interval_s is not None:
                if self.interval is None:
                    raise ValueError(f"{where}.curriculum.interval_s: for an interval term (this term's mode is "
                                     f"{self.mode}).")
                first_interval = _pair(cfg.curriculum.interval_s, f"{where}.curriculum.interval_s")
                if first_interval[0] <= 0:
                    raise ValueError(f"{where}.curriculum.interval_s: {list(first_interval)} must be > 0 seconds.")
        first = self.curriculum[0] if self.curriculum else self.configured
        self.max_high = max(first[1], self.configured[1])
        if env is not None:
            self.range = torch.tensor(first, dtype=torch.float64, device=env.device)  # the config's numbers exactly
            if self.curriculum:  # the schedule's ends, for EventManager.step to move the range on the device
                self._schedule = torch.tensor([first, self.configured], dtype=torch.float64, device=env.device)
            self.values = torch.full((env.num_envs, 1), math.nan, device=env.device)
            if self.interval:
                self.time_left = torch.zeros(env.num_envs, device=env.device)
                first_interval = first_interval or self.interval
                self.interval_now = torch.tensor(first_interval, dtype=torch.float32, device=env.device)
                # the interval's ends, moved by EventManager.step as the range's
                self._interval_schedule = torch.tensor([first_interval, self.interval], device=env.device)

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
            low, high = self.range.unbind()
            x = self._sample((n, *shape), low, high, integer)
            flat = x.reshape(n, -1)
            if self.values.shape[1] != flat.shape[1]:  # the first draw sets the width; maybe in a rollout,
                with torch.inference_mode(False):  # so a normal tensor, updatable outside it too
                    self.values = torch.full((n, flat.shape[1]), math.nan, device=self.env.device)
            torch.where(mask[:, None], flat, self.values, out=self.values)
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
                x = torch.addcmul(low, high - low, u)
        return x.round() if integer else x

    def redraw_intervals(self, mask: torch.Tensor) -> None:
        """Draws, for the envs in ``mask``, the time until their next event from ``interval_s``."""
        assert self.interval is not None, f"{self.where} is not an interval term"
        low, high = self.interval_now.unbind()
        u = torch.rand(self.env.num_envs, generator=self.env.generator, device=self.env.device)
        torch.where(mask, low + (high - low) * u, self.time_left, out=self.time_left)


class EventManager:
    """The task's event terms (``task.events``), applied by :class:`legion.tasks.env.LegionEnv` (``env.events``).

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
                progress = (self.step_count / term.curriculum[1]).clamp(max=1.0)
                term.range.copy_(torch.lerp(start, end, progress))
                if term.interval is not None:
                    first, last = term._interval_schedule
                    term.interval_now.copy_(torch.lerp(first, last, progress.float()))
        for term in self.active("interval"):
            term.time_left -= dt
            due = term.time_left <= 1e-6
            if self.env.any_world(due):
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
            if term is None:
                skipped.append(name)
            elif term.enabled:  # a term this config turns off (sim2sim, a user's override) is off on purpose
                term.set_range(*entry["range"])
        if skipped:
            warnings.warn(f"Saved randomization ranges of {skipped} not restored: no such event term now.",
                          stacklevel=2)


def _pair(value, where: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected [low, high], got {value!r}.") from None
    if low > high:
        raise ValueError(f"{where}: [{low}, {high}] has low > high.")
    return low, high

