"""Bad flags of every command but `replay` (its corpus is test_replay_flags.py), and bad result files
fed to `ingest`/`report`: exit 2 naming the flag (or the file and line), with no traceback and nothing
touched: no host, no socket, no child process, no lab, no GPU measurement, no model build.

Placeholders in argv and needles: {tmp} (the test's folder), {file} (an existing regular file), {dir}
(an existing empty folder), {missing} (a path that does not exist), {inv} and {camp} (a valid lab, see
labs.py), {results} and {results2} (copies of tests/fixtures/campaign-small). Commands that would create
folders are given {tmp}/r (--results) and {tmp}/w (--wheel-cache); neither may exist afterwards.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.badinput.harness import ROOT, assert_refused, cli, install_traps
from tests.unit.badinput.labs import Lab

CAMPAIGN_SMALL = ROOT / "tests" / "fixtures" / "campaign-small"
LAB = ("{inv}", "--campaign", "{camp}")
OUT = ("--results", "{tmp}/r", "--wheel-cache", "{tmp}/w")
TARGET = ("--target", "vllm-0=http://192.0.2.11:8000/metrics")
CACHE = ("sim", "cache-server", "--l1-size-gb", "1", "--eviction-policy", "LRU")
CAL = ("calibrate", "--model-shape", "tiny")


@dataclass(frozen=True)
class FlagCase:
    id: str
    argv: tuple[str, ...]
    needles: tuple[str, ...]
    # Changes the files before the command runs (a broken result file).
    setup: Callable[[dict[str, Path]], Any] | None = None


def _lines(path: str, n: int, text: str) -> Callable[[dict[str, Path]], None]:
    """Replace line `n` of a file of the {results} copy."""

    def setup(paths: dict[str, Path]) -> None:
        file = paths["results"] / path
        lines = file.read_text().splitlines()
        lines[n - 1] = text
        file.write_text("\n".join(lines) + "\n")

    return setup


def _replace(path: str, data: bytes) -> Callable[[dict[str, Path]], None]:
    def setup(paths: dict[str, Path]) -> None:
        (paths["results"] / path).write_bytes(data)

    return setup


def _campaign(**values: Any) -> Callable[[dict[str, Path]], None]:
    def setup(paths: dict[str, Path]) -> None:
        campaign = yaml.safe_load(paths["camp"].read_text())
        paths["camp"].write_text(json.dumps({**campaign, **values}))

    return setup


SESSIONS = "cells/a1gpu/sessions.json"
REQUESTS = "cells/a1gpu/requests.jsonl"
SAMPLES = "cells/a1gpu/metrics/vllm-0.jsonl"

CASES = [
    # plan
    FlagCase(
        "plan-no-inventory",
        ("plan",),
        ("plan: give an inventory (hosts.yml); only `plan --explain KEY` needs none",),
    ),
    FlagCase("plan-unknown-flag", ("plan", *LAB, "--dry-run"), ("unrecognized arguments: --dry-run",)),
    FlagCase(
        "plan-results-is-a-file",
        ("plan", *LAB, "--results", "{file}"),
        ("--results {file}: exists and is not a folder",),
    ),
    FlagCase(
        "plan-inventory-missing",
        ("plan", "{missing}"),
        ("{missing}: cannot read: No such file or directory",),
    ),
    FlagCase(
        "plan-campaign-missing", ("plan", "{inv}", "--campaign", "{missing}"), ("{missing}: cannot read",)
    ),
    # run
    FlagCase(
        "run-unknown-cell",
        ("run", *LAB, *OUT, "--cells", "0000000000"),
        ("--cells: unknown cell id(s) 0000000000",),
    ),
    FlagCase(
        "run-hosts-python-short",
        ("run", *LAB, *OUT, "--hosts-python", "3.11"),
        ("--hosts-python '3.11': give the hosts' python3 version as X.Y.Z",),
    ),
    FlagCase(
        "run-results-is-a-file",
        ("run", *LAB, "--results", "{file}", "--wheel-cache", "{tmp}/w"),
        ("--results {file}: exists and is not a folder",),
    ),
    FlagCase(
        "run-wheel-cache-is-a-file",
        ("run", *LAB, "--results", "{tmp}/r", "--wheel-cache", "{file}"),
        ("--wheel-cache {file}: exists and is not a folder",),
    ),
    FlagCase("run-inventory-missing", ("run", "{missing}", *OUT), ("{missing}: cannot read",)),
    FlagCase("run-unknown-flag", ("run", *LAB, *OUT, "--resume"), ("unrecognized arguments: --resume",)),
    FlagCase(
        "run-bad-sim-profile",
        ("run", *LAB, *OUT),
        ("{camp}: sim_profile: unknown simulator profile 'tiny2'",),
        _campaign(sim_profile="tiny2"),
    ),
    # provision, teardown
    FlagCase(
        "provision-hosts-python-word",
        ("provision", *LAB, *OUT, "--hosts-python", "bookworm"),
        ("--hosts-python 'bookworm'",),
    ),
    FlagCase(
        "provision-results-is-a-file",
        ("provision", *LAB, "--results", "{file}"),
        ("--results {file}: exists and is not a folder",),
    ),
    FlagCase("provision-extra-argument", ("provision", *LAB, *OUT, "all"), ("unrecognized arguments: all",)),
    FlagCase(
        "teardown-takes-no-results-flag",
        ("teardown", *LAB, "--results", "{tmp}/r"),
        ("unrecognized arguments: --results",),
    ),
    FlagCase("teardown-no-inventory", ("teardown",), ("the following arguments are required: inventory",)),
    # report, ingest
    FlagCase("report-missing-folder", ("report", "{missing}"), ("RESULTS_DIR {missing}: not a folder",)),
    FlagCase("report-a-file", ("report", "{file}"), ("RESULTS_DIR {file}: not a folder",)),
    FlagCase(
        "report-format-unknown",
        ("report", "{dir}", "--format", "pdf"),
        ("argument --format: invalid choice: 'pdf'",),
    ),
    FlagCase(
        "report-two-data-formats",
        ("report", "{dir}", "--format", "json", "--format", "csv"),
        ("--format: give at most one of json, csv per run",),
    ),
    FlagCase(
        "report-output-without-data-format",
        ("report", "{dir}", "--output", "{tmp}/x.csv"),
        ("--output is only for --format json or csv",),
    ),
    FlagCase(
        "report-output-is-a-folder",
        ("report", "{dir}", "--format", "csv", "--output", "{dir}"),
        ("--output {dir}: give a file in an existing folder",),
    ),
    FlagCase(
        "report-output-folder-missing",
        ("report", "{dir}", "--format", "csv", "--output", "{missing}/x.csv"),
        ("--output {missing}/x.csv: give a file in an existing folder",),
    ),
    FlagCase(
        "report-no-cells-folder",
        ("report", "{dir}"),
        ("{dir}: no cells/ folder; give a campaign results folder",),
    ),
    FlagCase("ingest-missing-folder", ("ingest", "{missing}"), ("RESULTS_DIR {missing}: not a folder",)),
    FlagCase("ingest-no-cells-folder", ("ingest", "{dir}"), ("{dir}: no cells/ folder",)),
    FlagCase(
        "ingest-no-cell-folders",
        ("ingest", "{results}"),
        ("{results}/cells: no cell folders, nothing to ingest",),
        lambda p: [shutil.rmtree(c) for c in (p["results"] / "cells").iterdir()],
    ),
    FlagCase(
        "ingest-requests-bad-line",
        ("ingest", "{results}"),
        ("{results}/" + REQUESTS + ": line 3: not a request record (invalid JSON",),
        _lines(REQUESTS, 3, '{"schema": 1, "user_id": "u1", "round"'),
    ),
    FlagCase(
        "ingest-requests-line-not-object",
        ("ingest", "{results}"),
        ("{results}/" + REQUESTS + ": line 2: not a request record (a JSON list, not an object)",),
        _lines(REQUESTS, 2, "[1, 2]"),
    ),
    FlagCase(
        "ingest-requests-newer-schema",
        ("ingest", "{results}"),
        ("{results}/" + REQUESTS + ": request record schema [4] is not supported",),
        _lines(REQUESTS, 1, '{"schema": 4, "user_id": "u1"}'),
    ),
    FlagCase(
        "ingest-samples-bad-line",
        ("ingest", "{results}"),
        ("{results}/" + SAMPLES + ": line 4: not a metric sample (invalid JSON",),
        _lines(SAMPLES, 4, '{"ts": 1800000000.0, "target": '),
    ),
    FlagCase(
        "ingest-samples-not-utf8",
        ("ingest", "{results}"),
        ("{results}/" + SAMPLES + ": line 1: not a metric sample (not UTF-8 text)",),
        _replace(SAMPLES, b'{"ts": 1.0, "target": "\xff"}\n{"ts": 2.0}\n'),
    ),
    FlagCase(
        "ingest-samples-value-a-word",
        ("ingest", "{results}"),
        ("{results}/" + SAMPLES + ": not valid metric sample lines", "line 2", '"high"'),
        _lines(SAMPLES, 2, '{"ts": 1.0, "target": "vllm-0", "name": "x", "labels": {}, "value": "high"}'),
    ),
    FlagCase(
        "ingest-sessions-not-json",
        ("ingest", "{results}"),
        ("{results}/" + SESSIONS + ": not valid JSON",),
        _replace(SESSIONS, b'{"schema": 1,'),
    ),
    FlagCase(
        "ingest-sessions-not-utf8",
        ("ingest", "{results}"),
        ("{results}/" + SESSIONS + ": not valid JSON", "can't decode byte 0xff"),
        _replace(SESSIONS, b'{"schema": "\xff"}'),
    ),
    FlagCase(
        "ingest-sessions-negative-count",
        ("ingest", "{results}"),
        ("{results}/" + SESSIONS + ": key 'complete': Input should be greater than or equal to 0",),
        _replace(
            SESSIONS,
            json.dumps(
                {
                    "requested_concurrency": 2,
                    "virtual_users_available": 4,
                    "achieved_sessions": 4,
                    "complete": -1,
                    "incomplete": 0,
                    "error": 0,
                    "failed_requests": 0,
                }
            ).encode(),
        ),
    ),
    # compare
    FlagCase("compare-one-folder", ("compare", "{dir}"), ("compare: give at least two RESULTS_DIR folders",)),
    FlagCase(
        "compare-missing-folder", ("compare", "{dir}", "{missing}"), ("RESULTS_DIR {missing}: not a folder",)
    ),
    FlagCase(
        "compare-format-unknown",
        ("compare", "{dir}", "{dir}", "--format", "xml"),
        ("argument --format: invalid choice: 'xml'",),
    ),
    FlagCase(
        "compare-figure-unknown",
        ("compare", "{results}", "{results2}", "--figure", "ttft_p42_s"),
        ("--figure ttft_p42_s: not a summary column",),
    ),
    # datasets inspect
    FlagCase(
        "datasets-code-unknown",
        ("datasets", "inspect", "--dataset-code", "sharegpt", "{dir}"),
        ("argument --dataset-code/--code: invalid choice: 'sharegpt'",),
    ),
    FlagCase(
        "datasets-code-missing",
        ("datasets", "inspect", "{dir}"),
        ("the following arguments are required: --dataset-code/--code",),
    ),
    FlagCase(
        "datasets-max-rounds-zero",
        ("datasets", "inspect", "--dataset-code", "generic", "{tmp}/data", "--max-rounds", "0"),
        ("--max-rounds 0: must be 1 or more",),
    ),
    FlagCase(
        "datasets-max-rounds-negative",
        ("datasets", "inspect", "--dataset-code", "generic", "{tmp}/data", "--max-rounds", "-3"),
        ("--max-rounds -3: must be 1 or more",),
    ),
    FlagCase(
        "datasets-max-rounds-word",
        ("datasets", "inspect", "--dataset-code", "generic", "{tmp}/data", "--max-rounds", "all"),
        ("argument --max-rounds: invalid int value: 'all'",),
    ),
    FlagCase("datasets-no-action", ("datasets",), ("the following arguments are required: SUBCOMMAND",)),
    # metrics sample
    FlagCase(
        "sample-interval-zero",
        ("metrics", "sample", *TARGET, "--output", "{tmp}/m", "--interval", "0"),
        ("--interval 0.0: must be a finite number of seconds > 0",),
    ),
    FlagCase(
        "sample-interval-negative",
        ("metrics", "sample", *TARGET, "--output", "{tmp}/m", "--interval", "-15"),
        ("--interval -15.0: must be a finite number",),
    ),
    FlagCase(
        "sample-interval-nan",
        ("metrics", "sample", *TARGET, "--output", "{tmp}/m", "--interval", "nan"),
        ("--interval nan: must be a finite number",),
    ),
    FlagCase(
        "sample-interval-inf",
        ("metrics", "sample", *TARGET, "--output", "{tmp}/m", "--interval", "inf"),
        ("--interval inf: must be a finite number",),
    ),
    FlagCase(
        "sample-interval-word",
        ("metrics", "sample", *TARGET, "--output", "{tmp}/m", "--interval", "15s"),
        ("argument --interval: invalid float value: '15s'",),
    ),
    FlagCase(
        "sample-timeout-zero",
        ("metrics", "sample", *TARGET, "--output", "{tmp}/m", "--timeout", "0"),
        ("--timeout 0.0: must be a finite number",),
    ),
    FlagCase(
        "sample-timeout-nan",
        ("metrics", "sample", *TARGET, "--output", "{tmp}/m", "--timeout", "nan"),
        ("--timeout nan: must be a finite number",),
    ),
    FlagCase(
        "sample-no-target",
        ("metrics", "sample", "--output", "{tmp}/m"),
        ("metrics: give at least one --target NAME=URL or --gpu NAME=TOOL",),
    ),
    FlagCase(
        "sample-target-without-name",
        ("metrics", "sample", "--target", "http://192.0.2.11:8000/metrics", "--output", "{tmp}/m"),
        ("--target 'http://192.0.2.11:8000/metrics': expected NAME=URL",),
    ),
    FlagCase(
        "sample-target-not-http",
        ("metrics", "sample", "--target", "v=ftp://192.0.2.11/metrics", "--output", "{tmp}/m"),
        ("--target 'v=ftp://192.0.2.11/metrics': expected NAME=URL with an http:// or https:// URL",),
    ),
    FlagCase(
        "sample-target-snapshot-name",
        ("metrics", "sample", "--target", "snapshot-x=http://192.0.2.11:9/m", "--output", "{tmp}/m"),
        ("target name 'snapshot-x' must be",),
    ),
    FlagCase(
        "sample-target-name-with-slash",
        ("metrics", "sample", "--target", "a/b=http://192.0.2.11:9/m", "--output", "{tmp}/m"),
        ("target name 'a/b' must be",),
    ),
    FlagCase(
        "sample-target-twice",
        ("metrics", "sample", *TARGET, *TARGET, "--output", "{tmp}/m"),
        ("target name 'vllm-0' is given twice",),
    ),
    FlagCase(
        "sample-gpu-tool-unknown",
        ("metrics", "sample", "--gpu", "g=rocm-smi", "--output", "{tmp}/m"),
        ("--gpu 'g=rocm-smi'",),
    ),
    FlagCase(
        "sample-output-missing",
        ("metrics", "sample", *TARGET),
        ("the following arguments are required: --output",),
    ),
    FlagCase(
        "sample-output-is-a-file",
        ("metrics", "sample", *TARGET, "--output", "{file}"),
        ("--output {file}: exists and is not a folder",),
    ),
    # metrics snapshot
    FlagCase(
        "snapshot-output-is-a-folder",
        ("metrics", "snapshot", *TARGET, "--output", "{dir}"),
        ("--output {dir}: is a folder; give the file to write",),
    ),
    FlagCase(
        "snapshot-output-under-a-file",
        ("metrics", "snapshot", *TARGET, "--output", "{file}/s.jsonl"),
        ("--output {file}/s.jsonl: folder {file}: exists and is not a folder",),
    ),
    FlagCase(
        "snapshot-no-target",
        ("metrics", "snapshot", "--output", "{tmp}/s.jsonl"),
        ("metrics: give at least one --target",),
    ),
    FlagCase(
        "snapshot-timeout-negative",
        ("metrics", "snapshot", *TARGET, "--output", "{tmp}/s.jsonl", "--timeout", "-1"),
        ("--timeout -1.0: must be a finite number",),
    ),
    # metrics gpu-textfile
    FlagCase(
        "textfile-tool-unknown",
        ("metrics", "gpu-textfile", "--tool", "rocm-smi", "--output", "{tmp}/g.prom"),
        ("argument --tool: invalid choice: 'rocm-smi'",),
    ),
    FlagCase(
        "textfile-tool-missing",
        ("metrics", "gpu-textfile", "--output", "{tmp}/g.prom"),
        ("the following arguments are required: --tool",),
    ),
    FlagCase(
        "textfile-not-prom",
        ("metrics", "gpu-textfile", "--tool", "nvidia-smi", "--output", "{tmp}/g.txt"),
        ("--output {tmp}/g.txt: must end in .prom",),
    ),
    FlagCase(
        "textfile-folder-missing",
        ("metrics", "gpu-textfile", "--tool", "nvidia-smi", "--output", "{missing}/g.prom"),
        ("--output {missing}/g.prom: folder {missing} does not exist",),
    ),
    FlagCase(
        "textfile-output-is-a-folder",
        ("metrics", "gpu-textfile", "--tool", "nvidia-smi", "--output", "{tmp}/d.prom"),
        ("--output {tmp}/d.prom: is a folder",),
        lambda p: (p["tmp"] / "d.prom").mkdir(),
    ),
    FlagCase(
        "textfile-interval-zero",
        ("metrics", "gpu-textfile", "--tool", "nvidia-smi", "--output", "{tmp}/g.prom", "--interval", "0"),
        ("--interval 0.0: must be a finite number",),
    ),
    FlagCase(
        "textfile-timeout-nan",
        ("metrics", "gpu-textfile", "--tool", "amd-smi", "--output", "{tmp}/g.prom", "--timeout", "nan"),
        ("--timeout nan: must be a finite number",),
    ),
    # lab
    FlagCase("lab-no-action", ("lab",), ("the following arguments are required: ACTION",)),
    FlagCase("lab-unknown-action", ("lab", "reboot"), ("argument ACTION: invalid choice: 'reboot'",)),
    FlagCase("lab-up-no-hosts", ("lab", "up", "--hosts", "0"), ("--hosts 0: choose between 1 and 32 hosts",)),
    FlagCase(
        "lab-up-too-many-hosts",
        ("lab", "up", "--hosts", "33"),
        ("--hosts 33: choose between 1 and 32 hosts",),
    ),
    FlagCase(
        "lab-up-hosts-word", ("lab", "up", "--hosts", "two"), ("argument --hosts: invalid int value: 'two'",)
    ),
    FlagCase(
        "lab-up-prefix-dash",
        ("lab", "up", "--prefix", "kv-lab"),
        ("--prefix kv-lab: use up to 10 letters/digits",),
    ),
    FlagCase(
        "lab-up-prefix-long",
        ("lab", "up", "--prefix", "kvoffloadlab"),
        ("--prefix kvoffloadlab: use up to 10 letters/digits",),
    ),
    FlagCase(
        "lab-up-bridge-long",
        ("lab", "up", "--bridge", "kvoffload-bridge0"),
        ("--bridge 'kvoffload-bridge0': a network link name of 1-15",),
    ),
    FlagCase(
        "lab-up-bridge-space",
        ("lab", "up", "--bridge", "kv lab"),
        ("--bridge 'kv lab': a network link name",),
    ),
    FlagCase(
        "lab-up-subnet-word", ("lab", "up", "--subnet", "lab-net"), ("--subnet lab-net: not an IPv4 network",)
    ),
    FlagCase(
        "lab-up-subnet-public",
        ("lab", "up", "--subnet", "8.8.8.0/24"),
        ("--subnet 8.8.8.0/24: use a private network",),
    ),
    FlagCase(
        "lab-up-subnet-too-small",
        ("lab", "up", "--subnet", "10.213.0.0/28"),
        ("--subnet 10.213.0.0/28: use a private network of /24 or larger",),
    ),
    FlagCase(
        "lab-up-nvme-too-small", ("lab", "up", "--nvme-size-mb", "100"), ("--nvme-size-mb: at least 320",)
    ),
    FlagCase(
        "lab-up-inventory-is-a-folder",
        ("lab", "up", "--inventory", "{dir}"),
        ("--inventory {dir}: is a folder",),
    ),
    FlagCase("lab-down-unknown-flag", ("lab", "down", "--force"), ("unrecognized arguments: --force",)),
    FlagCase(
        "lab-tiny-model-negative-seed",
        ("lab", "tiny-model", "{tmp}/model", "--seed", "-1"),
        ("--seed -1: must be 0 or more",),
    ),
    FlagCase("lab-tiny-model-no-out", ("lab", "tiny-model"), ("the following arguments are required: OUT",)),
    # sim serve (vLLM's flags) and sim cache-server (lmcache server's)
    FlagCase("serve-no-model", ("sim", "serve"), ("sim serve: give the model as the first argument",)),
    FlagCase(
        "serve-port-word",
        ("sim", "serve", "m", "--port", "http"),
        ("argument --port: invalid int value: 'http'",),
    ),
    FlagCase(
        "serve-port-too-big",
        ("sim", "serve", "m", "--port", "70000"),
        ("--port 70000: must be a TCP port 1-65535",),
    ),
    FlagCase(
        "serve-port-negative",
        ("sim", "serve", "m", "--port", "-1"),
        ("--port -1: must be a TCP port 1-65535",),
    ),
    FlagCase(
        "serve-block-size",
        ("sim", "serve", "m", "--block-size", "7"),
        ("argument --block-size: invalid choice: 7",),
    ),
    FlagCase(
        "serve-gpu-utilization",
        ("sim", "serve", "m", "--gpu-memory-utilization", "1.5"),
        ("argument --gpu-memory-utilization: must be in (0, 1], got 1.5",),
    ),
    FlagCase(
        "serve-max-num-seqs-zero",
        ("sim", "serve", "m", "--max-num-seqs", "0"),
        ("argument --max-num-seqs: must be a positive integer, got 0",),
    ),
    FlagCase(
        "serve-max-model-len-negative",
        ("sim", "serve", "m", "--max-model-len", "-5"),
        ("argument --max-model-len: '-5' is not a positive size",),
    ),
    FlagCase(
        "serve-kv-cache-bytes-zero",
        ("sim", "serve", "m", "--kv-cache-memory-bytes", "0GiB"),
        ("argument --kv-cache-memory-bytes: '0GiB' is not a positive size",),
    ),
    FlagCase(
        "serve-kv-transfer-not-json",
        ("sim", "serve", "m", "--kv-transfer-config", "{oops"),
        ("argument --kv-transfer-config: not valid JSON",),
    ),
    FlagCase(
        "serve-kv-connector-unknown",
        ("sim", "serve", "m", "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'),
        ("--kv-transfer-config: kv_connector 'NixlConnector' is not modelled",),
    ),
    FlagCase(
        "serve-sim-profile-unknown",
        ("sim", "serve", "m", "--sim-profile", "h300"),
        ("--sim-profile h300: unknown profile",),
    ),
    FlagCase(
        "serve-unknown-flag",
        ("sim", "serve", "m", "--speculative-decoding"),
        ("unrecognized arguments: --speculative-decoding",),
    ),
    FlagCase(
        "cache-l1-missing",
        ("sim", "cache-server", "--eviction-policy", "LRU"),
        ("the following arguments are required: --l1-size-gb",),
    ),
    FlagCase(
        "cache-l1-zero",
        ("sim", "cache-server", "--l1-size-gb", "0", "--eviction-policy", "LRU"),
        ("argument --l1-size-gb: must be > 0, got 0",),
    ),
    FlagCase(
        "cache-eviction-unknown",
        ("sim", "cache-server", "--l1-size-gb", "1", "--eviction-policy", "FIFO"),
        ("argument --eviction-policy: invalid choice: 'FIFO'",),
    ),
    FlagCase(
        "cache-port-too-big", (*CACHE, "--port", "65536"), ("--port 65536: must be a TCP port 1-65535",)
    ),
    FlagCase(
        "cache-http-port-zero", (*CACHE, "--http-port", "0"), ("--http-port 0: must be a TCP port 1-65535",)
    ),
    FlagCase(
        "cache-l2-not-json", (*CACHE, "--l2-adapter", "fs:/mnt"), ("--l2-adapter 'fs:/mnt': not valid JSON",)
    ),
    FlagCase(
        "cache-chunk-size-zero",
        (*CACHE, "--chunk-size", "0"),
        ("--chunk-size 0: must be a positive number of tokens",),
    ),
    FlagCase(
        "cache-eviction-ratio",
        (*CACHE, "--eviction-ratio", "2"),
        ("argument --eviction-ratio: must be between 0.0 and 1.0, got 2",),
    ),
    # calibrate
    FlagCase(
        "calibrate-shape-unknown",
        ("calibrate", "--model-shape", "gpt-5", "--output", "{tmp}/p.yaml"),
        ("argument --model-shape: invalid choice: 'gpt-5'",),
    ),
    FlagCase(
        "calibrate-output-missing",
        ("calibrate", "--model-shape", "tiny"),
        ("the following arguments are required: --output",),
    ),
    FlagCase(
        "calibrate-from-raw-binary",
        (*CAL, "--output", "{tmp}/p.yaml", "--from-raw", "{tmp}/raw.bin"),
        ("--from-raw {tmp}/raw.bin: not UTF-8 text (byte 0)",),
        lambda p: (p["tmp"] / "raw.bin").write_bytes(b"\xff\xfe\x00garbage"),
    ),
    FlagCase(
        "calibrate-output-not-yaml",
        (*CAL, "--output", "{tmp}/p.json"),
        ("--output {tmp}/p.json: a profile is YAML",),
    ),
    FlagCase(
        "calibrate-output-is-a-folder",
        (*CAL, "--output", "{tmp}/p.yaml"),
        ("--output {tmp}/p.yaml: is a folder",),
        lambda p: (p["tmp"] / "p.yaml").mkdir(),
    ),
    FlagCase(
        "calibrate-disk-bytes-zero",
        (*CAL, "--output", "{tmp}/p.yaml", "--disk-bytes", "0"),
        ("argument --disk-bytes: '0' is not a size > 0",),
    ),
    FlagCase(
        "calibrate-disk-bytes-unit",
        (*CAL, "--output", "{tmp}/p.yaml", "--disk-bytes", "2X"),
        ("argument --disk-bytes: '2X' is not a size > 0",),
    ),
    FlagCase(
        "calibrate-disk-bytes-infinite",
        (*CAL, "--output", "{tmp}/p.yaml", "--disk-bytes", "infG"),
        ("argument --disk-bytes: 'infG' is not a size > 0",),
    ),
    FlagCase(
        "calibrate-disk-dir-missing",
        (*CAL, "--output", "{tmp}/p.yaml", "--disk-dir", "{missing}"),
        ("--disk-dir {missing}: not an existing folder",),
    ),
    FlagCase(
        "calibrate-device-unknown",
        (*CAL, "--output", "{tmp}/p.yaml", "--device", "tpu"),
        ("argument --device: invalid choice: 'tpu'",),
    ),
    FlagCase(
        "calibrate-from-raw-missing",
        (*CAL, "--output", "{tmp}/p.yaml", "--from-raw", "{missing}"),
        ("--from-raw {missing}: cannot read",),
    ),
    FlagCase(
        "calibrate-from-raw-not-json",
        (*CAL, "--output", "{tmp}/p.yaml", "--from-raw", "{file}"),
        ("{file}: not a calibrate raw file",),
    ),
    # demo
    FlagCase(
        "demo-engine-unknown", ("demo", "--engine", "tgi"), ("argument --engine: invalid choice: 'tgi'",)
    ),
    FlagCase("demo-campaign-missing", ("demo", "--campaign", "{missing}"), ("{missing}: cannot read",)),
    FlagCase(
        "demo-campaign-bad-key",
        ("demo", "--campaign", "{camp}"),
        ("{camp}: concurrency[0]: must be a positive integer, got 0",),
        _campaign(concurrency=[0]),
    ),
    FlagCase(
        "demo-campaign-bad-dataset",
        ("demo", "--campaign", "{camp}"),
        ("{camp}: dataset.path: {tmp}/nowhere ('nowhere', from the folder of the file that sets it) does",),
        _campaign(dataset={"code": "generic", "path": "nowhere"}),
    ),
    FlagCase(
        "demo-results-is-a-file",
        ("demo", "--campaign", "{camp}", "--results", "{file}"),
        ("--results {file}: exists and is not a folder",),
    ),
    FlagCase("demo-unknown-flag", ("demo", "--fast"), ("unrecognized arguments: --fast",)),
    FlagCase("demo-nodes-out-of-range", ("demo", "--nodes", "9"), ("argument --nodes: invalid choice: 9",)),
    FlagCase(
        "lab-up-nodes-beyond-hosts",
        ("lab", "up", "--hosts", "2", "--nodes", "2"),
        ("--nodes 2 --clients 1: choose at least 1 of each and at most 2 together",),
    ),
    FlagCase(
        "lab-up-clients-beyond-hosts",
        ("lab", "up", "--hosts", "3", "--nodes", "2", "--clients", "2"),
        ("--nodes 2 --clients 2: choose at least 1 of each and at most 3 together",),
    ),
    FlagCase(
        "lab-up-one-host-two-clients",
        ("lab", "up", "--hosts", "1", "--clients", "2"),
        ("a one-host lab is its own client and node",),
    ),
]


def _fill(text: str, paths: dict[str, Path]) -> str:
    """Placeholders only (argv may hold JSON braces)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(paths.get(m[1], m[0])), text)


def _paths(tmp_path: Path, argv: tuple[str, ...]) -> dict[str, Path]:
    lab = Lab(tmp_path, inline=False)
    lab.write()
    (tmp_path / "a-file.txt").write_text("not a folder, not JSON\n")
    (tmp_path / "empty").mkdir()
    paths = {
        "tmp": tmp_path,
        "file": tmp_path / "a-file.txt",
        "dir": tmp_path / "empty",
        "missing": tmp_path / "missing",
        "inv": lab.inv,
        "camp": lab.camp,
        "results": tmp_path / "results-a",
        "results2": tmp_path / "results-b",
    }
    text = " ".join(argv)
    for key in ("results", "results2"):
        if "{" + key + "}" in text:
            shutil.copytree(CAMPAIGN_SMALL, paths[key])
    return paths


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_bad_flag_is_refused(
    case: FlagCase, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _paths(tmp_path, case.argv + case.needles)
    if case.setup is not None:
        case.setup(paths)
    touched = install_traps(monkeypatch)
    outcome = cli([_fill(a, paths) for a in case.argv], capsys)
    assert_refused(outcome, *(_fill(n, paths) for n in case.needles))
    assert touched == []
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)
    commands = {
        c.argv[0] if c.argv[0] not in ("metrics", "sim", "lab", "datasets") else " ".join(c.argv[:2])
        for c in CASES
    }
    assert "replay" not in commands
    assert {
        "plan",
        "run",
        "provision",
        "teardown",
        "report",
        "ingest",
        "compare",
        "calibrate",
        "demo",
    } <= commands
    assert {
        "metrics sample",
        "metrics snapshot",
        "metrics gpu-textfile",
        "lab up",
        "lab down",
        "sim serve",
        "sim cache-server",
        "datasets inspect",
    } <= commands
