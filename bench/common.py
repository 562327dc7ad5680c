"""Shared by the benchmarks: quiet Warp, one kernel cache, config composition, JSON output."""

import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WARP_CACHE_PATH", str(ROOT / ".warp_cache"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import warp as wp  # noqa: E402

wp.config.quiet = True
wp.config.log_level = wp.LOG_WARNING
wp.config.kernel_cache_dir = os.environ["WARP_CACHE_PATH"]
torch.set_num_threads(1)


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from legion.cli import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


def machine() -> str:
    return f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, warp {wp.__version__}"


def write_json(name: str, rows, **meta) -> Path:
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), **meta, "rows": rows}, indent=2))
    return out


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:,.0f}" if isinstance(v, float) and v > 100 else
                                 f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
