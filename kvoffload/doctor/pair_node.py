"""Node side of `doctor`'s cell-free pair check: runs ON a lab node and writes one JSON object.

LMCache's own server and its own MP client run as two transient systemd units with the engine units'
[Service] keys, no model and no cell: `lmcache server` (the kvoffload-lmcache.service's keys) and
`lmcache bench server` (a replica's, kvoffload-vllm@.service), LMCache's end-to-end test of an MP server
(lmcache 0.5.6 wheel, lmcache/cli/commands/bench/server_bench/command.py: LOOKUP, RETRIEVE of the hits,
STORE of the misses, CHECKSUM; cases/baseline.py: a cold pass stores each sequence, a warm pass zeroes
the client's blocks, retrieves them and compares per-chunk MD5 digests with the cold pass's). With an
L2 folder the bench runs a second time after the server's L1 was emptied, so that its warm pass can
only be served from the L2 files: the bench's KV tensors come from a fixed seed
(server_bench/helpers.py `_allocate_gpu_kv_cache`: `torch.random.manual_seed(42)`), so the second run's
retrieved digests must equal the first run's stored ones.

Standalone on purpose, as probe.py: playbooks/doctor_pair.yml copies this one file to a node and runs
it as root with the node's python3, so it imports only the standard library, never `kvoffload`. The
unit keys come from the play (the roles' one definition, kvoffload_engine_sandbox and the
lmcache_server role's resource keys); this file adds only what a transient unit needs besides them
(a name, its environment, the check's own L2 folder). It judges nothing: the controller
(kvoffload/doctor/pair_cellfree.py) parses the bench's output and the server's metrics.

Run by hand: `python3 pair_node.py --properties '{"server": {...}, "bench": {...}}' --mode cpu | jq .`
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TypeAlias

VERSION = 1
# The kvoffload role's kvoffload_venv (tests/unit/roles/test_shared_vars.py holds them equal).
DEFAULT_VENV = "/opt/kvoffload/venv"
UNIT_PREFIX = "kvoffload-doctor-pair"
# A [Service] key's value: one string, or a list written once per item (DeviceAllow= of ROCm's devices)
Value: TypeAlias = str | list[str]
# The engine units' environment (roles/lmcache_server and roles/vllm unit templates, `Environment=`):
# no usage reports, no banner, GPUs in PCI bus order, HOME in the unit's state folder. The state folders
# are the units' own (StateDirectory=), so caches (Triton, torch) land where the engines keep theirs.
COMMON_ENV = {
    "PYTHONUNBUFFERED": "1",
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "LMCACHE_DISABLE_BANNER": "1",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
}
STATE_DIRS = {"server": "kvoffload-lmcache", "bench": "kvoffload-vllm"}
# Two sequences of four chunks each: paged blocks of 16 tokens, four layers of 8 heads x 128 (4 MiB per
# chunk of 256 tokens in float16), and three requests' worth of blocks so that the two sequences sit in
# different blocks (server_bench/client.py `create_request`: block_offset = seq * blocks % (NB - blocks)),
# hence different data: a retrieve of the wrong sequence shows in its digest.
SEQUENCES = 2
CHUNKS_PER_SEQUENCE = 4
BLOCK_SIZE = 16
LAYERS = 4
# An L1 that holds both sequences without an eviction (32 MiB at chunk 256), pinned on a CUDA build:
# big enough to need LimitMEMLOCK above the kernel's 8 MiB default.
L1_GB = 0.25
START_BOUND_S = 180.0
BENCH_BOUND_S = 300.0
L2_STORE_BOUND_S = 30.0
POLL_S = 0.5
# Families the node waits on between the two bench runs (the controller judges every family).
L1_WRITES = "lmcache_mp_l1_write_chunks_total"
L2_STORED = "lmcache_mp_l2_store_completed_objects_chunks_total"
# What the controller reads of the server process while it runs: its sandbox as the kernel applies it.
STATUS_KEYS = ("NoNewPrivs", "CapEff", "CapBnd", "VmLck", "VmPin")
SHOW_KEYS = (
    "User",
    "NUMAPolicy",
    "NUMAMask",
    "LimitMEMLOCK",
    "NoNewPrivileges",
    "ProtectSystem",
    "PrivateTmp",
)


def _run(cmd: list[str], timeout: float = 60.0) -> tuple[int, str, str]:
    """(rc, stdout, stderr) of a command; rc 127 when it is missing, 124 when it timed out."""
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return 124, out, f"timed out after {timeout:.0f} s"
    return done.returncode, done.stdout, done.stderr


def free_port() -> int:
    """A loopback port nothing listens on now (the check's server binds loopback only, so it never
    meets a running lmcache-server's ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def unit_command(
    unit: str, properties: dict[str, Value], env: dict[str, str], argv: list[str], *, wait: bool
) -> list[str]:
    """`systemd-run` of one transient service with exactly these [Service] keys (`-p KEY=VALUE`, in the
    given order; a key with a list of values once per value, as a unit file writes DeviceAllow=) and
    environment; `wait`: block until it exits, its stdout and stderr piped back."""
    cmd = ["systemd-run", f"--unit={unit}", "--collect", "--quiet"]
    if wait:
        cmd += ["--wait", "--pipe"]
    for key, value in properties.items():
        for item in [value] if isinstance(value, str) else value:
            cmd += ["-p", f"{key}={item}"]
    cmd += [f"--setenv={k}={v}" for k, v in env.items()]
    return [*cmd, "--", *argv]


def unit_properties(base: dict[str, Value], role: str, l2_dir: str | None = None) -> dict[str, Value]:
    """A transient unit's keys: the rendered unit's (`base`, from the play), its state folder as the
    rendered unit names it, and for the server the check's own L2 folder as its one writable path
    besides (the rendered unit's ReadWritePaths= is the real L2 folder)."""
    out = dict(base)
    out["StateDirectory"] = STATE_DIRS[role]
    if role == "server" and l2_dir is not None:
        out["ReadWritePaths"] = l2_dir
    return out


def unit_env(role: str) -> dict[str, str]:
    return {**COMMON_ENV, "HOME": f"/var/lib/{STATE_DIRS[role]}"}


def kv_shape(chunk_size: int) -> tuple[str, int]:
    """The bench's `--kvcache-shape-spec` and `--num-tokens` for CHUNKS_PER_SEQUENCE chunks a sequence
    (it prepends one token: server_bench/helpers.py `_build_token_ids`)."""
    if chunk_size % BLOCK_SIZE:
        raise ValueError(f"chunk size {chunk_size} is not a multiple of the bench's block size {BLOCK_SIZE}")
    blocks = CHUNKS_PER_SEQUENCE * chunk_size // BLOCK_SIZE
    return f"(2,{3 * blocks},{BLOCK_SIZE},8,128):float16:{LAYERS}", CHUNKS_PER_SEQUENCE * chunk_size


def server_argv(
    venv: str, rpc_port: int, http_port: int, chunk_size: int, l1_gb: float, l2_dir: str | None
) -> list[str]:
    """`lmcache server` on loopback, as the lmcache_server role starts it (kvoffload/profiles/resolve.py
    lmcache_args): `auto` offers the CUDA IPC path and the engine-driven copy path, each client picks
    one; an fs_native L2 with O_DIRECT as the nvme tier's profile."""
    argv = [
        f"{venv.rstrip('/')}/bin/lmcache", "server",
        "--host", "127.0.0.1", "--port", str(rpc_port),
        "--http-host", "127.0.0.1", "--http-port", str(http_port),
        "--chunk-size", str(chunk_size),
        "--l1-size-gb", f"{l1_gb:g}",
        "--eviction-policy", "LRU",
        "--supported-transfer-mode", "auto",
    ]  # fmt: skip
    if l2_dir is not None:
        adapter = {"type": "fs_native", "base_path": l2_dir, "num_workers": 2, "use_odirect": True}
        argv += ["--l2-adapter", json.dumps(adapter, separators=(",", ":"))]
    return argv


def bench_argv(venv: str, rpc_port: int, http_port: int, mode: str, chunk_size: int) -> list[str]:
    """`lmcache bench server`: `--mode gpu` allocates the KV on CUDA and moves it by CUDA IPC handles,
    `cpu` through the engine-driven copy path (its --transfer-mode auto, server_bench/config.py)."""
    spec, tokens = kv_shape(chunk_size)
    return [
        f"{venv.rstrip('/')}/bin/lmcache", "bench", "server",
        "--rpc-url", f"tcp://127.0.0.1:{rpc_port}", "--url", f"http://127.0.0.1:{http_port}",
        "--mode", mode, "--transfer-mode", "auto",
        "--num-tokens", str(tokens), "--kvcache-shape-spec", spec,
        "--start", "0", "--end", str(SEQUENCES), "--interval", "0",
        "--format", "json",
    ]  # fmt: skip


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def family_sum(text: str, name: str) -> float:
    """Sum of the samples named `name` in a Prometheus text exposition (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            try:
                total += float(match.group(3))
            except ValueError:
                continue
    return total


def _http(url: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> str:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # loopback only
        text: str = resp.read().decode(errors="replace")
        return text


def _journal(unit: str, lines: int = 60) -> str:
    return _run(["journalctl", "--no-pager", "--output", "cat", "--lines", str(lines), "--unit", unit], 30)[1]


def _active(unit: str) -> str:
    return _run(["systemctl", "is-active", unit], 30)[1].strip()


def _main_pid(unit: str) -> int | None:
    out = _run(["systemctl", "show", "--property", "MainPID", "--value", unit], 30)[1].strip()
    return int(out) if out.isdigit() and int(out) > 0 else None


def process_facts(pid: int, venv: str, root: Path = Path("/")) -> dict[str, Any]:
    """What the kernel says of the server process: its sandbox (no new privileges, capabilities), its
    locked and pinned memory, the NUMA policies of its mappings, and the compiled modules of LMCache
    (and torch's) it has mapped, i.e. loaded against the venv's torch."""
    proc = root / "proc" / str(pid)
    status = {}
    try:
        for line in (proc / "status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in STATUS_KEYS:
                status[key] = value.strip()
    except OSError:
        pass
    mapped: set[str] = set()
    lib = f"{venv.rstrip('/')}/lib/"
    try:
        for line in (proc / "maps").read_text().splitlines():
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if (
                path.startswith(lib)
                and ".so" in path
                and ("/lmcache/" in path or "/torch/lib/libtorch" in path)
            ):
                mapped.add(path.rsplit("/", 1)[-1])
    except OSError:
        pass
    policies: set[str] = set()
    try:
        for line in (proc / "numa_maps").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2:
                policies.add(fields[1])
    except OSError:
        pass
    return {"status": status, "mapped": sorted(mapped), "numa_policies": sorted(policies)}


class PairError(RuntimeError):
    """A step of the check that cannot go on, and which step it was."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.message = message


class PairRun:
    """One check on this node: start the server unit, run the bench unit (twice with an L2), read the
    server, stop it and remove what the check made. `facts` is the JSON answer."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tag = secrets.token_hex(3)
        self.server_unit = f"{UNIT_PREFIX}-server-{self.tag}.service"
        self.props: dict[str, dict[str, Value]] = json.loads(args.properties)
        self.l2_dir: str | None = None
        self.facts: dict[str, Any] = {
            "version": VERSION,
            "host": socket.gethostname(),
            "mode": args.mode,
            "venv": args.venv,
            "chunk_size": args.chunk_size,
            "sequences": SEQUENCES,
            "chunks_per_sequence": CHUNKS_PER_SEQUENCE,
            "l1_gb": args.l1_gb,
            "properties": self.props,
            "passes": [],
        }

    def engine_user(self) -> str | None:
        """The user both units run as (the play's `User=`), None where the play gives none."""
        user = self.props.get("server", {}).get("User")
        return user if isinstance(user, str) and user else None

    def why_not(self) -> tuple[str, str] | None:
        """(`skip` or `error`, why) when the check cannot run here."""
        if not Path(self.args.venv, "bin", "lmcache").is_file():
            return (
                "skip",
                f"no engine venv with LMCache at {self.args.venv} yet (the engine set's install makes it)",
            )
        if shutil.which("systemd-run") is None or not Path("/run/systemd/system").is_dir():
            return (
                "error",
                "no systemd here (systemd-run, /run/systemd/system): the engines run as systemd units",
            )
        if os.geteuid() != 0:
            return "error", "not root: transient system units need root"
        user = self.engine_user()
        if user:
            try:
                pwd.getpwnam(user)
            except KeyError:
                return "error", f"the engine user {user} does not exist (the engine roles create it)"
        return None

    def l2_folder(self) -> None:
        """The check's own L2 folder beside the real one (on the same mount), the engine user's alone."""
        parent = self.args.l2_parent
        if not parent:
            self.facts["l2"] = {"path": None, "why_not": "no L2 on this host (no nvme cell)"}
            return
        if not Path(parent).is_dir():
            self.facts["l2"] = {
                "path": None,
                "why_not": f"{parent} does not exist yet (provisioning makes it)",
            }
            return
        folder = Path(parent) / f".{UNIT_PREFIX}-{self.tag}"
        folder.mkdir(mode=0o700)
        user = self.engine_user()
        if user:
            entry = pwd.getpwnam(user)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        self.l2_dir = str(folder)
        self.facts["l2"] = {"path": self.l2_dir, "why_not": None}

    def start_server(self, rpc: int, http: int) -> None:
        argv = server_argv(self.args.venv, rpc, http, self.args.chunk_size, self.args.l1_gb, self.l2_dir)
        props = unit_properties(self.props["server"], "server", self.l2_dir)
        cmd = unit_command(self.server_unit, props, unit_env("server"), argv, wait=False)
        self.facts["server"] = {"unit": self.server_unit, "command": cmd}
        rc, _out, err = _run(cmd, 60)
        if rc != 0:
            raise PairError("server", f"systemd-run refused the server unit (rc {rc}): {err.strip()[-600:]}")
        t0 = time.monotonic()
        while True:
            try:
                if json.loads(_http(f"http://127.0.0.1:{http}/healthcheck")).get("status") == "healthy":
                    break
            except (OSError, ValueError, urllib.error.URLError):
                pass
            state = _active(self.server_unit)
            if state not in ("active", "activating", "reloading"):
                raise PairError("server", f"the server unit is {state or 'gone'} before it answered")
            if time.monotonic() - t0 > START_BOUND_S:
                raise PairError("server", f"no healthy /healthcheck within {START_BOUND_S:.0f} s")
            time.sleep(POLL_S)
        self.facts["server"]["start_seconds"] = round(time.monotonic() - t0, 3)
        pid = _main_pid(self.server_unit)
        show = _run(["systemctl", "show", self.server_unit, *[f"--property={k}" for k in SHOW_KEYS]], 30)[1]
        self.facts["server"]["applied"] = dict(
            line.split("=", 1) for line in show.splitlines() if "=" in line
        )
        if pid is not None:
            self.facts["server"]["process"] = process_facts(pid, self.args.venv)

    def bench(self, name: str, rpc: int, http: int) -> dict[str, Any]:
        unit = f"{UNIT_PREFIX}-bench-{self.tag}-{name}.service"
        argv = bench_argv(self.args.venv, rpc, http, self.args.mode, self.args.chunk_size)
        cmd = unit_command(
            unit, unit_properties(self.props["bench"], "bench"), unit_env("bench"), argv, wait=True
        )
        t0 = time.monotonic()
        rc, out, err = _run(cmd, BENCH_BOUND_S)
        if rc == 124:
            _run(["systemctl", "stop", unit], 60)
        result = {
            "name": name,
            "unit": unit,
            "command": cmd,
            "rc": rc,
            "stdout": out[-20000:],
            "stderr_tail": err[-3000:],
            "seconds": round(time.monotonic() - t0, 3),
        }
        self.facts["passes"].append(result)
        return result

    def empty_l1(self, http: int) -> None:
        """Wait until L2 holds every chunk L1 took (LMCache writes L2 behind the store), then empty L1
        (POST /cache/clear clears L1 only in 0.5.6: tests/fixtures/lmcache-0.5.6-cpu/README.md)."""
        t0 = time.monotonic()
        text = ""
        while time.monotonic() - t0 < L2_STORE_BOUND_S:
            text = _http(f"http://127.0.0.1:{http}/metrics")
            if family_sum(text, L2_STORED) >= family_sum(text, L1_WRITES) > 0:
                break
            time.sleep(POLL_S)
        cleared = _http(f"http://127.0.0.1:{http}/cache/clear", {"tier": "l1", "force": False})
        self.facts["l2"].update(
            {
                "l1_writes": family_sum(text, L1_WRITES),
                "l2_stored": family_sum(text, L2_STORED),
                "wait_seconds": round(time.monotonic() - t0, 3),
                "cleared": cleared[:300],
            }
        )

    def __call__(self) -> dict[str, Any]:
        t0 = time.monotonic()
        blocked = self.why_not()
        if blocked is not None:
            self.facts[blocked[0]] = blocked[1]
            if blocked[0] == "error":
                self.facts["stage"] = "preflight"
            return self.facts
        stage = "l2"
        try:
            self.l2_folder()
            stage = "server"
            if self.args.mode == "gpu" and shutil.which("nvidia-modprobe"):
                # as the units' `ExecStartPre=-+/usr/bin/nvidia-modprobe -u -c=0`: outside the sandbox
                _run(["nvidia-modprobe", "-u", "-c=0"], 60)
            rpc, http = free_port(), free_port()
            self.facts["ports"] = {"rpc": rpc, "http": http}
            self.start_server(rpc, http)
            stage = "bench"
            self.bench("l1", rpc, http)
            if self.l2_dir is not None and self.facts["passes"][-1]["rc"] == 0:
                stage = "l2"
                self.empty_l1(http)
                stage = "bench"
                self.bench("l2", rpc, http)
            stage = "metrics"
            self.facts["metrics_text"] = _http(f"http://127.0.0.1:{http}/metrics")
            self.facts["status"] = json.loads(_http(f"http://127.0.0.1:{http}/status"))
        except PairError as exc:
            self.facts["stage"], self.facts["error"] = exc.stage, exc.message
        except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
            self.facts["stage"], self.facts["error"] = stage, f"{type(exc).__name__}: {exc}"
        finally:
            self.stop()
        self.facts["seconds"] = round(time.monotonic() - t0, 3)
        return self.facts

    def stop(self) -> None:
        server = self.facts.get("server")
        if server is not None:
            if self.facts.get("error"):
                server["journal"] = _journal(self.server_unit)[-6000:]
            rc, _out, err = _run(["systemctl", "stop", self.server_unit], 90)
            if rc != 0 and "not loaded" not in err:
                server["stop_error"] = err.strip()[-300:]
        if self.l2_dir is not None:
            shutil.rmtree(self.l2_dir, ignore_errors=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="kvoffload-lab doctor's cell-free pair check (node side)")
    p.add_argument("--properties", required=True, help='JSON {"server": {KEY: VALUE}, "bench": {...}}')
    p.add_argument("--venv", default=DEFAULT_VENV, help=f"the engine venv (default {DEFAULT_VENV})")
    p.add_argument(
        "--mode", choices=("cpu", "gpu"), default="gpu", help="the bench's KV: CUDA or host memory"
    )
    p.add_argument("--chunk-size", type=int, default=256, help="LMCache's chunk size in tokens (default 256)")
    p.add_argument("--l1-gb", type=float, default=L1_GB, help=f"the server's L1, GB (default {L1_GB})")
    p.add_argument("--l2-parent", default=None, help="the folder above the L2 folder (nvme tier)")
    p.add_argument("--out", default=None, help="write the JSON here too")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    text = json.dumps(PairRun(args)(), indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    sys.stdout.write(text + "\n")  # a standalone program: its JSON is its output
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
