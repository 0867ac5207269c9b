"""plugins/modules/kvoffload_files.py: several files written in one module run, run as Ansible runs it (a
JSON arguments file). The vllm and lmcache_server roles write their environment files and the server's
unit with it in every deploy (molecule vllm and lmcache_server nvme converge it under a real systemd
with their idempotence step; the lab tests in every cell)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from tests.unit.roles.render import run_collection_module

ME = os.getuid()
MY_GROUP = os.getgid()


def _owner() -> tuple[str, str]:
    import grp
    import pwd

    return pwd.getpwuid(ME).pw_name, grp.getgrgid(MY_GROUP).gr_name


def run(tmp_path: Path, files: list[dict[str, str]], **flags: bool) -> dict[str, Any]:
    args: dict[str, object] = {"files": files, **{f"_ansible_{k}": v for k, v in flags.items()}}
    return run_collection_module("kvoffload_files", tmp_path, tmp_path, args)


def _spec(path: Path, content: str, mode: str = "0640") -> dict[str, str]:
    owner, group = _owner()
    return {"path": str(path), "content": content, "owner": owner, "group": group, "mode": mode}


def test_files_are_written_once_and_then_left_alone(tmp_path: Path) -> None:
    a, b = tmp_path / "replica-0.env", tmp_path / "replica-1.env"
    files = [_spec(a, "KVOFFLOAD_PORT='8000'\n"), _spec(b, "KVOFFLOAD_PORT='8001'\n")]
    first = run(tmp_path, files)
    assert first["changed"] is True and first["changed_paths"] == [str(a), str(b)], first
    assert a.read_text() == "KVOFFLOAD_PORT='8000'\n" and stat.S_IMODE(a.stat().st_mode) == 0o640
    again = run(tmp_path, files)
    assert again["changed"] is False and again["changed_paths"] == []
    # one replica's flags change: only its file is written (the role restarts only that replica)
    inode = a.stat().st_ino
    files[1]["content"] = "KVOFFLOAD_PORT='8001'\nVLLM_SERVER_DEV_MODE='1'\n"
    third = run(tmp_path, files)
    assert third["changed_paths"] == [str(b)] and a.stat().st_ino == inode
    assert b.read_text().endswith("VLLM_SERVER_DEV_MODE='1'\n")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary file left"


def test_a_mode_alone_is_corrected_in_place(tmp_path: Path) -> None:
    path = tmp_path / "lmcache.env"
    run(tmp_path, [_spec(path, "x\n", "0644")])
    inode = path.stat().st_ino
    result = run(tmp_path, [_spec(path, "x\n", "0640")])
    assert result["changed_paths"] == [str(path)] and path.stat().st_ino == inode
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_check_mode_writes_nothing_and_diff_shows_the_change(tmp_path: Path) -> None:
    path = tmp_path / "kvoffload-lmcache.service"
    path.write_text("[Service]\nExecStart=/old\n")
    path.chmod(0o644)
    result = run(tmp_path, [_spec(path, "[Service]\nExecStart=/new\n", "0644")], check_mode=True, diff=True)
    assert result["changed"] is True and path.read_text() == "[Service]\nExecStart=/old\n"
    assert result["diff"] == [
        {
            "before_header": str(path),
            "after_header": str(path),
            "before": "[Service]\nExecStart=/old\n",
            "after": "[Service]\nExecStart=/new\n",
        }
    ]
    # a fresh host in --check: the folder and the engine user are what the install would make
    fresh = [
        _spec(tmp_path / "etc" / "kvoffload" / "lmcache.env", "x\n"),
        {**_spec(tmp_path / "other.env", "y\n"), "group": "no-such-group-kvlab"},
    ]
    dry = run(tmp_path, fresh, check_mode=True)
    assert dry["changed"] is True and len(dry["changed_paths"]) == 2 and not (tmp_path / "other.env").exists()


def test_a_missing_folder_or_user_fails_naming_the_file(tmp_path: Path) -> None:
    missing = run(tmp_path, [_spec(tmp_path / "etc" / "kvoffload" / "lmcache.env", "x\n")])
    assert missing["failed"] and "lmcache.env: its folder does not exist" in missing["msg"]
    nouser = run(tmp_path, [{**_spec(tmp_path / "a.env", "x\n"), "owner": "no-such-user-kvlab"}])
    assert nouser["failed"] and "a.env: owner 'no-such-user-kvlab'" in nouser["msg"]
    badmode = run(tmp_path, [_spec(tmp_path / "a.env", "x\n", "rw-r")])
    assert badmode["failed"] and "is not an octal number" in badmode["msg"]
    assert not (tmp_path / "a.env").exists()
