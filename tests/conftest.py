"""Shared test setup: one Warp kernel cache for the whole suite, one torch thread, quiet Warp."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WARP_CACHE_PATH", str(ROOT / ".warp_cache"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

import pytest  # noqa: E402

from legion.cli import compose, setup_process  # noqa: E402

setup_process()  # quiet Warp, the kernel cache above


def make_env(*overrides: str):
    from legion.cli import make_env as _make_env

    return _make_env(compose(*overrides))


@pytest.fixture(scope="session")
def quadruped_env():
    """A 4-world quadruped_flat env shared by the tests that only read from fresh resets."""
    return make_env("task=quadruped_flat", "sim.num_envs=4")
