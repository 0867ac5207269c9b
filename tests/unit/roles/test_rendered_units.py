"""Golden renders of every unit, environment file and Caddyfile per tier, checked by systemd and Caddy.

For each tier x engine the resolver's extravars (kvoffload/profiles/resolve.py) are rendered through the
roles' templates; the output must equal the golden file (regenerate: KVOFFLOAD_REGEN_GOLDEN=1), every
unit must pass `systemd-analyze verify --man=no` with nothing on stderr, and every Caddyfile must pass
`caddy validate` (Debian's 2.6.2 in CI).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvoffload.profiles import resolve as r
from tests.unit.roles.render import render, role_defaults

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("KVOFFLOAD_REGEN_GOLDEN") == "1"
REPLICAS = (
    r.Replica(host="gpu1", address="10.0.0.11", index=0, gpus="0"),
    r.Replica(host="gpu1", address="10.0.0.11", index=1, gpus="1,2"),
)
CASES = [(tier, engine) for tier in r.TIERS for engine in ("vllm", "sim")]


def extravars(tier: str, engine: str) -> dict[str, Any]:
    dep = r.Deployment(
        tier=tier,  # type: ignore[arg-type]
        gpu_vendor="nvidia",
        engine=engine,  # type: ignore[arg-type]
        model="Qwen/Qwen3-8B",
        replicas=REPLICAS,
        lmcache_address="10.0.0.12",
        lb_address="10.0.0.12",
        sim_profile="tiny" if engine == "sim" else None,
        kv_cache_memory_bytes=1073741824 if engine == "sim" else None,
    )
    return r.resolve(dep)


def variables(tier: str, engine: str, venv: str = "/opt/kvoffload/venv") -> dict[str, Any]:
    merged = role_defaults("node_exporter", "caddy", "lmcache_server", "vllm")
    merged.update(extravars(tier, engine))
    merged["kvoffload_venv"] = venv
    # Facts of the node: a 512 MiB NVMe mount holds the L2 (the role sizes the adapter from it).
    merged["ansible_facts"] = {"mounts": [{"mount": "/mnt/kvoffload-nvme", "size_total": 536870912}]}
    return merged


def rendered_files(tier: str, engine: str, venv: str = "/opt/kvoffload/venv") -> dict[str, str]:
    v = variables(tier, engine, venv)
    files = {
        "kvoffload-vllm@.service": render("vllm", "etc/systemd/system/kvoffload-vllm@.service.j2", v),
        "Caddyfile": render("caddy", "etc/kvoffload/caddy/Caddyfile.j2", v),
        "kvoffload-caddy.service": render("caddy", "etc/systemd/system/kvoffload-caddy.service.j2", v),
        "prometheus-node-exporter.service.d/kvoffload.conf": render(
            "node_exporter", "etc/systemd/system/prometheus-node-exporter.service.d/kvoffload.conf.j2", v
        ),
    }
    for replica in ({"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1,2"}):
        files[f"replica-{replica['index']}.env"] = render(
            "vllm", "etc/kvoffload/vllm/replica.env.j2", {**v, "replica": replica}
        )
    if engine == "vllm":  # the simulator has no GPU: no telemetry unit by default
        files["kvoffload-gpu-telemetry.service"] = render(
            "vllm", "etc/systemd/system/kvoffload-gpu-telemetry.service.j2", v
        )
    if tier != "gpu":
        files["kvoffload-lmcache.service"] = render(
            "lmcache_server", "etc/systemd/system/kvoffload-lmcache.service.j2", v
        )
        files["lmcache.env"] = render("lmcache_server", "etc/kvoffload/lmcache.env.j2", v)
    return files


@pytest.mark.parametrize(("tier", "engine"), CASES)
def test_rendered_files_match_golden(tier: str, engine: str) -> None:
    folder = GOLDEN / f"{tier}-{engine}"
    for name, text in rendered_files(tier, engine).items():
        path = folder / name
        if REGEN:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"missing golden {path}: run with KVOFFLOAD_REGEN_GOLDEN=1"
        assert text == path.read_text(), (
            f"{path} differs; inspect, then regenerate with KVOFFLOAD_REGEN_GOLDEN=1"
        )


def test_goldens_carry_the_contract() -> None:
    cpu = rendered_files("cpu", "sim")
    assert (
        "kvoffload-lab sim serve ${KVOFFLOAD_MODEL} --sim-profile ${KVOFFLOAD_SIM_PROFILE}"
        in cpu["kvoffload-vllm@.service"]
    )
    assert "CUDA_VISIBLE_DEVICES='1,2'" in cpu["replica-1.env"]
    assert "KVOFFLOAD_PORT='8001'" in cpu["replica-1.env"]
    assert (
        systemd_words(cpu["replica-0.env"], "KVOFFLOAD_ENGINE_ARGS")
        == extravars("cpu", "sim")["vllm_engine_args"]
    )
    nvme_sim = rendered_files("nvme", "sim")
    lm_words = systemd_words(nvme_sim["lmcache.env"], "KVOFFLOAD_LMCACHE_ARGS")
    assert lm_words[:-2] == extravars("nvme", "sim")["lmcache_server_args"]
    # The L2 adapter: the resolver's, plus 90% of the 512 MiB mount as its capacity
    assert lm_words[-2] == "--l2-adapter"
    assert json.loads(lm_words[-1]) == {
        **extravars("nvme", "sim")["lmcache_server_l2_adapter"],
        "max_capacity_gb": 0.45,
    }
    assert "lb_policy least_conn" in cpu["Caddyfile"]
    assert "lb_policy header X-User-Id" in rendered_files("gpu", "vllm")["Caddyfile"]
    nvme = rendered_files("nvme", "vllm")
    assert (
        "/opt/kvoffload/venv/bin/lmcache server $KVOFFLOAD_LMCACHE_ARGS" in nvme["kvoffload-lmcache.service"]
    )
    assert "ReadWritePaths=/mnt/kvoffload-nvme/lmcache-l2" in nvme["kvoffload-lmcache.service"]
    assert "RequiresMountsFor=/mnt/kvoffload-nvme\n" in nvme["kvoffload-lmcache.service"]
    # Real vLLM through its API server module (the CPU build's `vllm` CLI fails), telemetry opted out
    unit = nvme["kvoffload-vllm@.service"]
    assert "ExecStart=/opt/kvoffload/venv/bin/python -m vllm.entrypoints.openai.api_server --model " in unit
    assert "VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 LMCACHE_TRACK_USAGE=false" in unit
    assert "LMCACHE_TRACK_USAGE=false" in nvme["kvoffload-lmcache.service"]
    # One user for replicas and server (CUDA IPC files are 0600)
    assert "User=kvoffload-engine\n" in unit and "User=kvoffload-engine\n" in nvme["kvoffload-lmcache.service"]
    for files in (cpu, nvme):
        assert "Restart=on-failure" in files["kvoffload-vllm@.service"]
    telemetry = nvme["kvoffload-gpu-telemetry.service"]
    assert (
        "ExecStart=/opt/kvoffload/venv/bin/kvoffload-lab metrics gpu-textfile --tool nvidia-smi "
        "--output /var/lib/prometheus/node-exporter/kvoffload_gpu.prom --interval 15\n" in telemetry
    )
    assert "ReadWritePaths=/var/lib/prometheus/node-exporter\n" in telemetry
    assert "User=kvoffload-gpu-telemetry\n" in telemetry and "Restart=on-failure\n" in telemetry
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in (
        nvme["prometheus-node-exporter.service.d/kvoffload.conf"]
    )
    assert "kvoffload-gpu-telemetry.service" not in cpu  # engine sim


def test_amd_telemetry_polls_amd_smi() -> None:
    v = {**variables("gpu", "vllm"), "kvoffload_gpu_vendor": "amd"}
    unit = render("vllm", "etc/systemd/system/kvoffload-gpu-telemetry.service.j2", v)
    assert "gpu-textfile --tool amd-smi --output" in unit
    assert ":/opt/rocm/bin\n" in unit


def systemd_words(env_file: str, name: str) -> list[str]:
    """The argv words `$NAME` becomes in ExecStart: env-file double-quote unescaping, then systemd's
    split at whitespace with quote removal (POSIX-shell-like for the single quotes we write)."""
    line = next(line for line in env_file.splitlines() if line.startswith(f"{name}="))
    quoted = line.split("=", 1)[1]
    assert quoted.startswith('"') and quoted.endswith('"'), line
    value = re.sub(r'\\([\\"$`])', r"\1", quoted[1:-1])
    return shlex.split(value)


def _stub_venv(root: Path) -> str:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("python", "lmcache", "kvoffload-lab"):
        stub = venv / "bin" / name
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    return str(venv)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (apt: systemd)")
@pytest.mark.parametrize(("tier", "engine"), CASES)
def test_units_pass_systemd_analyze_verify(tier: str, engine: str, tmp_path: Path) -> None:
    # Same render with the venv in tmp_path, so verify finds executables there.
    files = rendered_files(tier, engine, venv=_stub_venv(tmp_path))
    units = tmp_path / "units"
    for name, text in files.items():
        (units / name).parent.mkdir(parents=True, exist_ok=True)
        (units / name).write_text(text)
    targets = [
        f"{units / 'kvoffload-vllm@.service'}:kvoffload-vllm@0.service",
        str(units / "kvoffload-caddy.service"),
    ]
    if tier != "gpu":
        targets.append(str(units / "kvoffload-lmcache.service"))
    if engine == "vllm":
        targets.append(str(units / "kvoffload-gpu-telemetry.service"))
    debian_unit = Path("/lib/systemd/system/prometheus-node-exporter.service")
    if debian_unit.exists():  # the drop-in is verified together with Debian's unit it extends
        shutil.copy(debian_unit, units / debian_unit.name)
        targets.append(str(units / debian_unit.name))
    for target in targets:
        result = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", target],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0 and result.stderr == "", f"{target}:\n{result.stderr}"


@pytest.mark.skipif(shutil.which("caddy") is None, reason="caddy missing (apt: caddy)")
@pytest.mark.parametrize("tier", r.TIERS)
def test_caddyfiles_pass_caddy_validate(tier: str, tmp_path: Path) -> None:
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(rendered_files(tier, "vllm")["Caddyfile"])
    result = subprocess.run(
        ["caddy", "validate", "--adapter", "caddyfile", "--config", str(caddyfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path)),
    )
    assert result.returncode == 0 and "Valid configuration" in result.stdout + result.stderr, result.stderr
