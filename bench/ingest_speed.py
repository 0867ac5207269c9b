"""Ingest speed: 1M request records and 1M metric samples, ours vs row-by-row json.loads + DataFrame.

Run: `.venv/bin/python bench/ingest_speed.py [--rows N]`. Writes synthetic files in a temporary folder,
then times, in the same run and on the same files:
- ours: `kvoffload.ingest.jsonl.read_requests` / `read_samples` (pyarrow JSON reader, labels made
  canonical JSON strings) and `.to_pandas()`;
- baseline: `[json.loads(line) for line in f]` then `pandas.DataFrame(records)`.
Prints seconds, rows/s and the speed-up (target >= 10x). Best of --repeat runs each.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from kvoffload.ingest.jsonl import read_requests, read_samples


def write_requests(path: Path, n: int) -> None:
    rnd = random.Random(1)
    with path.open("w") as f:
        for i in range(n):
            ok = rnd.random() > 0.01
            f.write(
                json.dumps(
                    {
                        "schema": 1,
                        "user_id": f"s{i // 10}-c0",
                        "session_id": f"s{i // 10}",
                        "chunk": 0,
                        "round": i % 10 + 1,
                        "request_id": f"r{i:08d}",
                        "t_start": 1.8e9 + i * 0.01,
                        "ttft_s": rnd.random() if ok else None,
                        "latency_s": 5 * rnd.random(),
                        "tpot_s": 0.02 * rnd.random() if ok else None,
                        "prompt_tokens": rnd.randint(100, 32000),
                        "completion_tokens": rnd.randint(1, 1000),
                        "cached_tokens": rnd.randint(0, 30000),
                        "status": "ok" if ok else "error",
                        "http_status": 200 if ok else 500,
                        "error": None if ok else "HTTP 500",
                        "replica": f"vllm-{i % 4}",
                    }
                )
                + "\n"
            )


LABEL_SETS = [
    {"engine": "0", "model_name": "Qwen/Qwen3-8B"},
    {"engine": "0", "le": "0.5", "model_name": "Qwen/Qwen3-8B"},
    {"device": "nvme0n1"},
    {"cpu": "17", "mode": "idle"},
    {"l2_name": "fs"},
    {},
    {
        "gpu": "3",
        "uuid": "GPU-70e4a360-0ec1-2524-ab02-6e61f45a6bbc",
        "model": "NVIDIA H200",
        "vendor": "nvidia",
    },
]


def write_samples(path: Path, n: int) -> None:
    rnd = random.Random(2)
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "ts": 1.8e9 + 15 * (i // 500),
                        "target": f"vllm-{i % 4}",
                        "name": f"metric_{i % 120}",
                        "labels": LABEL_SETS[i % len(LABEL_SETS)],
                        "value": rnd.random() * 1e6,
                    }
                )
                + "\n"
            )


def baseline(path: Path) -> pd.DataFrame:
    with path.open() as f:
        records = [json.loads(line) for line in f]
    return pd.DataFrame(records)


def best_of(repeat: int, fn: Callable[[], pd.DataFrame]) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = len(fn())
        best = min(best, time.perf_counter() - t0)
    return best, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="records per file (1000000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the best counts (3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvoffload-bench-") as tmp:
        req, smp = Path(tmp) / "requests.jsonl", Path(tmp) / "samples.jsonl"
        t0 = time.perf_counter()
        write_requests(req, args.rows)
        write_samples(smp, args.rows)
        print(f"wrote {args.rows:,} requests ({req.stat().st_size / 1e6:.0f} MB) and {args.rows:,} samples "
              f"({smp.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")  # fmt: skip
        for label, path, ours in (
            ("requests", req, lambda: read_requests(req).to_pandas()),
            ("samples", smp, lambda: read_samples(smp).to_pandas()),
        ):
            t_ours, n_ours = best_of(args.repeat, ours)
            t_base, n_base = best_of(args.repeat, lambda p=path: baseline(p))
            assert n_ours == n_base == args.rows, (n_ours, n_base)
            print(
                f"{label:8s}  ours {t_ours:6.2f} s ({n_ours / t_ours / 1e6:5.2f} M rows/s)   "
                f"baseline {t_base:6.2f} s ({n_base / t_base / 1e6:5.2f} M rows/s)   "
                f"speed-up {t_base / t_ours:5.1f}x"
            )


if __name__ == "__main__":
    main()
