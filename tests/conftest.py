"""Shared test setup: one Warp kernel cache for the whole suite, one torch thread, quiet Warp."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WARP_CACHE_PATH", str(ROOT / ".warp_cache"))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

import pytest  # noqa: E402
import torch  # noqa: E402
import warp as wp  # noqa: E402

wp.config.quiet = True
wp.config.log_level = wp.LOG_WARNING
wp.config.kernel_cache_dir = os.environ["WARP_CACHE_PATH"]
torch.set_num_threads(1)


def compose(*overrides: str):
    """The composed training config, as `legion train <overrides>` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from legion.cli import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


def make_env(*overrides: str):
    from legion.cli import make_env as _make_env

    return _make_env(compose(*overrides))


@pytest.fixture(scope="session")
def quadruped_env():
    """A 4-world quadruped_flat env shared by the tests that only read from fresh resets."""
    return make_env("task=quadruped_flat", "sim.num_envs=4")
