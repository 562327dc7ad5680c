"""The termination manager: which episodes end this control step, and why.

``task.terminations`` names the terms (schema: :class:`legion.configs.schema.TerminationTerm`;
functions in :mod:`legion.tasks.mdp.terminations`), each (num_envs,) bool. A term marked
``time_out`` cuts the episode (PPO bootstraps its value) as the episode length limit does;
any other ends it as a failure. A world whose physics diverged (non-finite, or a joint or the
base faster than :data:`DIVERGED_SPEED`) is always ended (``Episode_Termination/nonfinite``),
its state zeroed before anything reads it.

Also here: :class:`SuccessTracker`, the task's success (``task.success``): a condition of the
same kind as a termination's, which is counted per episode and never ends one.
"""

from __future__ import annotations

import math

import torch

from legion.tasks import mdp

# [rad/s or m/s] No robot's joint or base moves this fast (160 revolutions per second); a world
# whose MuJoCo step diverged passes it on its way to MuJoCo's own bound (1e10) and to NaN, and its
# finite but absurd state would reach rewards and observations (a DAgger student's loss went from
# 0.4 to 1.6e5, then NaN). Random actions at full scale spin a Go2's joints to ~150 rad/s.
DIVERGED_SPEED = 1.0e3


class TerminationManager:
    """The task's termination terms (``task.terminations``) and the episode length limit.

    Attributes:
        terms: the resolved :class:`~legion.tasks.mdp.Term`\\ s, in config order.
    """

    def __init__(self, env, cfg: dict):
        self.env = env
        self.terms = [mdp.resolve(env, "terminations", name, term) for name, term in cfg.items()]

    def compute(self, log: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``(terminated, time_outs)``, each (num_envs,) bool, from the current state; adds each
        term's share of worlds ``Episode_Termination/<term>`` (and ``.../nonfinite``) to ``log``."""
        env, sim = self.env, self.env.sim
        time_outs = env.episode_length_buf >= env.max_episode_length
        # A world whose physics diverged is ended and counted, never propagated.
        # Per world, reductions that carry a NaN through (a third of isfinite().all()'s cost on a CPU):
        # a NaN or inf coordinate makes the sum of their magnitudes non-finite, and a NaN speed fails <=.
        healthy = (sim.joint_q.abs().sum(1) < math.inf) & (sim.joint_qd.abs().amax(1) <= DIVERGED_SPEED)
        terminated = diverged = ~healthy
        for term in self.terms:
            hit = term(env) & healthy
            if term.time_out:
                time_outs |= hit
            else:
                terminated = terminated | hit  # a new tensor: `diverged` is read below
            log[f"Episode_Termination/{term.name}"] = torch.mean(hit, dtype=torch.float32)
        log["Episode_Termination/nonfinite"] = torch.mean(diverged, dtype=torch.float32)  # (named before the bound)
        # Keep the bad numbers out of rewards and observations of this step (the reset follows): the
        # joint state and the body state the solver made from it (poses, velocities, contact
        # forces; reward terms read them, e.g. a tool's pose). No indexed assignment: no device sync
        # inside a captured step. The bodies' state is multiplied by 0 in those worlds, then cleared
        # of non-finite values (0 * NaN is NaN; only a diverged world has any): a third of the time
        # of masked_fill_, which on a CPU takes ~1.3 ns an element (~25 us a step per body tensor).
        if env.any_world(diverged):
            sim.joint_q.masked_fill_(diverged[:, None], 0.0)
            sim.joint_qd.masked_fill_(diverged[:, None], 0.0)
            keep = healthy[:, None, None].float()
            for state in (sim.body_q, sim.body_qd, *([sim.contact_forces] if sim.senses_contacts else [])):
                state.mul_(keep).nan_to_num_(0.0, 0.0, 0.0)
        return terminated, time_outs


class SuccessTracker:
    """The task's success (``task.success``): its condition met for ``hold_s`` without a break,
    latched per episode; it never ends an episode.

    Attributes:
        time_s: (num_envs,) [s] episode time at which the current episode succeeded (the hold
            complete; NaN before): it is the latch, :attr:`succeeded` is where it is a number.
        last_time_s: the same for each env's last finished episode (evaluation reads it, and
            :attr:`last_succeeded`, after the step that ended it).
    """

    def __init__(self, env, cfg):
        self.env, self.term = env, mdp.resolve(env, "success", cfg.func, cfg, "task.success")
        self.hold_steps = max(1, round(cfg.hold_s / env.step_dt))
        self.held = torch.zeros(env.num_envs, dtype=torch.long, device=env.device)  # control steps met in a row
        self.time_s = torch.full((env.num_envs,), math.nan, device=env.device)
        self.last_time_s = self.time_s.clone()

    @property
    def succeeded(self) -> torch.Tensor:
        """(num_envs,) bool, the current episode has succeeded."""
        return ~self.time_s.isnan()

    @property
    def last_succeeded(self) -> torch.Tensor:
        """(num_envs,) bool, each env's last finished episode succeeded."""
        return ~self.last_time_s.isnan()

    # In-place updates only: the state stays usable whether the env steps in inference mode or not.
    def step(self) -> None:
        self.held.add_(1).mul_(self.term(self.env))  # counts the steps met in a row
        now = (self.held >= self.hold_steps) & self.time_s.isnan()
        torch.where(now, self.env.episode_length_buf * self.env.step_dt, self.time_s, out=self.time_s)

    def reset(self, mask: torch.Tensor, finished: torch.Tensor) -> dict:
        """Starts new episodes in ``mask``; returns ``Episode_Success/rate``'s sum over ``finished``."""
        torch.where(finished, self.time_s, self.last_time_s, out=self.last_time_s)
        successes = ((self.time_s >= 0) & finished).sum()  # (NaN >= 0 is false)
        self.held.masked_fill_(mask, 0)
        self.time_s.masked_fill_(mask, math.nan)
        return {"Episode_Success/rate": successes}
