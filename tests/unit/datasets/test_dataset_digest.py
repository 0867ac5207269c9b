"""The dataset digest (kvoffload/datasets/digest.py): one for a copy anywhere, another for other bytes."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from kvoffload.datasets import digest
from kvoffload.datasets.digest import dataset_digest


def test_a_copy_elsewhere_has_the_same_digest_and_other_bytes_another(tmp_path: Path) -> None:
    a = tmp_path / "a" / "ds"
    (a / "sub").mkdir(parents=True)
    (a / "calls.jsonl").write_text('{"x": 1}\n')
    (a / "sub" / "more.json").write_text("[]")
    first = dataset_digest(a)
    # by hand: sha256 over "<relative path>\0<size>\0<sha256 of the bytes>\n", files sorted
    lines = "".join(
        f"{rel}\0{len(data)}\0{hashlib.sha256(data).hexdigest()}\n"
        for rel, data in (("calls.jsonl", b'{"x": 1}\n'), ("sub/more.json", b"[]"))
    )
    assert first == "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    b = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(a, b)
    (b / ".DS_Store").write_text("finder")  # a copy tool's file: not the dataset's
    assert dataset_digest(b) == first
    (b / "calls.jsonl").write_text('{"x": 2}\n')
    assert dataset_digest(b) != first
    assert dataset_digest(tmp_path / "absent") is None
    # a file dataset: its name does not count either
    (tmp_path / "one.jsonl").write_text("{}\n")
    (tmp_path / "two.jsonl").write_text("{}\n")
    assert dataset_digest(tmp_path / "one.jsonl") == dataset_digest(tmp_path / "two.jsonl")


def test_a_large_file_counts_by_its_size_and_edges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.bin"
    body = bytes(range(256)) * 64  # 16 KiB
    big.write_bytes(body)
    whole = dataset_digest(big)
    monkeypatch.setattr(digest, "WHOLE_BYTES", 4096)
    monkeypatch.setattr(digest, "EDGE_BYTES", 1024)
    edges = dataset_digest(big)
    inner = hashlib.sha256(body[:1024] + body[-1024:]).hexdigest()
    assert edges == "sha256:" + hashlib.sha256(f"\0{len(body)}\0{inner}\n".encode()).hexdigest()
    assert edges != whole
