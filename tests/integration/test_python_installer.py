"""The kvoffload_python role with uv and with pip, run for real on this machine (local connection).

uv comes out of its wheel in the wheelhouse, as the orchestrator ships it: the venv it makes has no
pip, a second run changes nothing, a changed set installs again, and a later run with pip (no uv wheel
named) adds pip to that venv in place and installs with it.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from kvoffload.orchestrate.installs import wheelhouse as wh
from tests.support.ansible import ansible_playbook

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the wheelhouse is built for x86_64 hosts"),
]

PLAY = (
    "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [kvoffload, kvoffload_python]\n"
)


def _tiny_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one module `name` whose VERSION is `version`."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in {**files, f"{dist}/RECORD": record}.items():
            zf.writestr(member, text)
    return path


@pytest.fixture(scope="module")
def uv_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """uv's wheel, fetched as the orchestrator fetches it (pip download, for the hosts' interpreter)."""
    cache = tmp_path_factory.mktemp("wheel-cache")
    return wh._download_set(cache, "tools", [wh.UV_REQUIREMENT], wh.DEFAULT_HOSTS_PYTHON)


def _play(tmp_path: Path, extravars: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The role once on this machine, its output as JSON (the json callback)."""
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    variables = {"ansible_python_interpreter": "/usr/bin/python3", **extravars}
    return ansible_playbook(
        "-i",
        "localhost,",
        str(play),
        extravars=variables,
        # uv would take TMPDIR as it is (Python falls back to /tmp): the role must give it its own
        env={"ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "json", "TMPDIR": "/nonexistent-kvoffload"},
        timeout=300,
    )


def _converge(tmp_path: Path, house: Path, requirements: list[str], uv: str | None) -> dict[str, Any]:
    """Run the role once; the play's stats of localhost."""
    result = _play(
        tmp_path,
        {
            "kvoffload_venv": str(tmp_path / "venv"),
            "kvoffload_wheelhouse": str(house),
            "kvoffload_python_wheelhouse_dest": str(tmp_path / "dest" / "wheelhouse"),
            "kvoffload_python_uv_dest": str(tmp_path / "dest" / "uv"),
            "kvoffload_python_requirements": requirements,
            "kvoffload_python_uv_wheel": uv,
        },
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    out = json.loads(result.stdout[result.stdout.index("{") :])
    stats: dict[str, Any] = out["stats"]["localhost"]
    return stats


def _version(venv: Path, module: str) -> str:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"import {module}; print({module}.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip()


def test_uv_then_pip_install_into_one_venv(tmp_path: Path, uv_folder: Path) -> None:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for wheel in uv_folder.glob("*.whl"):
        (house / wheel.name).write_bytes(wheel.read_bytes())
    uv = wh.uv_wheel(house)
    assert uv is not None and re.fullmatch(r"uv-[0-9.]+-py3-none-.*\.whl", uv), uv
    _tiny_wheel(house, "kvtiny", "1.0")
    venv = tmp_path / "venv"

    first = _converge(tmp_path, house, ["kvtiny==1.0"], uv)
    assert first["changed"] > 0 and first["failures"] == 0
    assert "uv =" in (venv / "pyvenv.cfg").read_text(), "uv made the venv"
    assert (tmp_path / "dest" / "uv" / uv.removesuffix(".whl") / "uv").is_file(), "uv unpacked by wheel"
    assert not (venv / "bin" / "pip").exists(), "a uv venv carries no pip"
    assert _version(venv, "kvtiny") == "1.0"
    assert list((venv / "lib").glob("python3*/site-packages/__pycache__/kvtiny.*.pyc")), "bytecode compiled"
    # uv unpacked the wheels beside the venv (not in /tmp, a small tmpfs on many hosts) and left nothing
    assert not list(tmp_path.glob(".tmp*"))

    assert _converge(tmp_path, house, ["kvtiny==1.0"], uv)["changed"] == 0, "a second run changes nothing"

    _tiny_wheel(house, "kvtiny", "2.0")
    assert _converge(tmp_path, house, ["kvtiny==2.0"], uv)["changed"] > 0
    assert _version(venv, "kvtiny") == "2.0"

    # pip from now on (no uv wheel named): pip joins the uv venv, and installs the next set
    _tiny_wheel(house, "kvother", "1.0")
    assert _converge(tmp_path, house, ["kvtiny==2.0", "kvother==1.0"], None)["changed"] > 0
    assert (venv / "bin" / "pip").exists()
    assert _version(venv, "kvother") == "1.0"
    assert _converge(tmp_path, house, ["kvtiny==2.0", "kvother==1.0"], None)["changed"] == 0


def test_a_uv_wheel_without_a_wheelhouse_is_refused(tmp_path: Path) -> None:
    result = _play(
        tmp_path,
        {
            "kvoffload_venv": str(tmp_path / "venv"),
            "kvoffload_python_requirements": ["kvtiny==1.0"],
            "kvoffload_python_uv_wheel": "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl",
        },
    )
    assert result.returncode != 0
    assert "kvoffload_python_uv_wheel" in result.stdout and "uv-*.whl" in result.stdout, result.stdout[-3000:]
    assert not (tmp_path / "venv").exists()
