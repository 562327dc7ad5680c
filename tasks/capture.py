"""The env's whole control step as one CUDA graph (``sim.capture_step``): :class:`CapturedStep`.

:class:`legion.tasks.env.LegionEnv` hands its :meth:`~legion.tasks.env.LegionEnv.step` to a
:class:`CapturedStep` when the config asks for it; the eager step is the one it records. The
physics alone is a Warp graph in either case (``sim.use_graph``, :mod:`legion.tasks.sim`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch.autograd.graph import increment_version


class CapturedStep:
    """The env's control step recorded once as a CUDA graph and replayed for every later step
    (``sim.capture_step``; CUDA only).

    On a GPU an eager step is dozens of small launches (action, commands, contact timers, terms,
    resets by mask, observations) around the physics' one Warp graph, each costing the host more
    time than the device spends on it at thousands of envs; a replay launches them all at once.
    A replay repeats the captured kernels on the same memory, so the step keeps every piece of
    state in place, on the device, and reads nothing back to the host (tests/test_env.py holds
    it to both). The physics is captured inside the same graph: Warp joins torch's capture
    (``wp.capture_begin(external=True)``) and NewtonSim launches its kernels into it.

    The Python-side choices that shape a step (noise on or off, commands held, physical
    parameters waiting to be handed to the solver, final observations kept) are part of the capture: when one changes,
    the next steps run eagerly again and then capture anew. After-physics hooks (a recorder)
    read the state on the host, so with any registered the step runs eagerly.

    Args:
        env: the :class:`~legion.tasks.env.LegionEnv` whose eager ``_step`` it records.
    """

    WARMUP = 2  # eager steps before each capture: every kernel compiled and loaded, the allocator warm

    def __init__(self, env):
        if not str(env.device).startswith("cuda"):
            raise ValueError(f"sim.capture_step=true records the control step as a CUDA graph; device is "
                             f"'{env.device}'. Use device=cuda:N, or sim.capture_step=false (on the CPU the "
                             f"physics is already one Warp graph, sim.use_graph).")
        self.env = env
        self.actions = torch.zeros(env.num_envs, env.num_actions, device=env.device)  # the graph's input
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warp_graph = None  # Warp's record of the same capture
        self.outputs: tuple[TensorDict, torch.Tensor, torch.Tensor, dict] | None = None  # the graph's outputs
        self.shape: tuple | None = None  # the Python-side choices the graph was captured with
        self.eager_steps = 0

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        env = self.env
        shape = (env.noise_enabled, getattr(env.command, "held", None), env.sim.pending_params,
                 env.keep_final_observations)
        if shape != self.shape:
            self.graph = self.warp_graph = None
            self.shape, self.eager_steps = shape, 0
        self.actions.copy_(actions)
        if env.after_physics or self.graph is None and self.eager_steps < self.WARMUP:
            self.eager_steps += 1
            return env._step(self.actions)
        if self.graph is None:
            self._capture()
        assert self.graph is not None and self.outputs is not None  # both set by _capture
        self.graph.replay()
        # The replay wrote the worlds' state and the commands behind torch's back: their version
        # counters bumped as an eager step's writes would, so what is cached on them is recomputed.
        env.sim.wrote_state()
        if env.command is not None:
            increment_version(env.command.value)
        obs, rewards, dones, extras = self.outputs
        # Copies: the next replay overwrites the graph's outputs, and a rollout keeps a step's
        # observations (also those get_observations() gives) until after the next step.
        env._observations = obs.clone()
        env.extras = {**extras, "time_outs": extras["time_outs"].clone()}
        return env._observations, rewards.clone(), dones.clone(), env.extras

    def _capture(self) -> None:
        import warp as wp

        env = self.env
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(env.generator)  # resets, commands and noise draw from it
        stream = torch.cuda.Stream(device=env.device)
        warp_stream = wp.stream_from_torch(stream)  # before the capture: it creates a CUDA event
        try:
            # thread_local: the async runner's learner thread allocates and launches while the actor captures.
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                with wp.ScopedStream(warp_stream, sync_enter=False):
                    wp.capture_begin(stream=warp_stream, external=True)
                    try:
                        obs, rewards, dones, extras = env._step(self.actions)
                    finally:
                        # Kept with the torch graph: it holds the Warp modules whose kernels it calls.
                        self.warp_graph = wp.capture_end(stream=warp_stream)
        except Exception as e:
            raise RuntimeError(f"Capturing the control step as a CUDA graph failed ({type(e).__name__}: {e}). "
                               "Train with sim.capture_step=false (the eager step) and report this.") from e
        # The dicts are the env's own, which an eager reset writes into: the graph's outputs get their own.
        extras = {key: dict(value) if isinstance(value, dict) else value for key, value in extras.items()}
        self.outputs, self.graph = (obs, rewards, dones, extras), graph

