"""Shared by the benchmarks: quiet Warp, one kernel cache, config composition, JSON output."""

import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WARP_CACHE_PATH", str(ROOT / ".warp_cache"))
# Where the benchmarks write: results (JSON, plots) into bench/results/ and their own training runs
# into runs/, or both into LEGION_BENCH_OUT (the tests run each benchmark's smallest configuration
# into a temporary folder).
OUT = os.environ.get("LEGION_BENCH_OUT")
RESULTS = Path(OUT) / "results" if OUT else ROOT / "bench" / "results"
RUNS = Path(OUT) / "runs" if OUT else ROOT / "runs"

import torch  # noqa: E402
import warp as wp  # noqa: E402

from legion.api import make_env, make_runner, setup_process  # noqa: E402, F401  (for the benchmarks)
from legion.configs import compose  # noqa: E402, F401

setup_process()  # quiet Warp, the kernel cache above


def machine() -> str:
    """Host, CPU model and core count, and the versions that set the speed."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.node()}, {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, warp {wp.__version__}"


def write_json(name: str, rows, **meta) -> Path:
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), **meta, "rows": rows},
                              indent=2))
    return out


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:,.0f}" if isinstance(v, float) and v > 100 else
                                 f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
