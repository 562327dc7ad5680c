"""Shared test setup: one Warp kernel cache for the whole suite, one torch thread, quiet Warp."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WARP_CACHE_PATH", str(ROOT / ".warp_cache"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

import pytest  # noqa: E402

from legion import runs  # noqa: E402
from legion.runs import compose, typed  # noqa: E402, F401  (for the tests)

runs.setup_process()  # quiet Warp, the kernel cache above


def make_env(*overrides: str):
    return runs.make_env(compose(*overrides))


def make_runner(*overrides: str, env=None, log_dir=None):
    """The runner ``agent.mode`` names, on ``env`` or a fresh env of the same config, seeded as training is."""
    import torch

    cfg = typed(compose(*overrides))
    torch.manual_seed(cfg.seed)
    env = env or runs.make_env(cfg)
    return runs.make_runner(env, cfg.agent, log_dir=log_dir, device=cfg.device)


@pytest.fixture(scope="session")
def quadruped_env():
    """A 4-world quadruped_flat env shared by the tests that only read from fresh resets."""
    return make_env("task=quadruped_flat", "sim.num_envs=4")
