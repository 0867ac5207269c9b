"""plugins/modules/kvoffload_l2_clear.py without a server: fs_native file names back to object keys,
and which entries of an L2 folder count as objects (its main() runs against the simulator in
tests/integration/test_sim_engine.py and against real LMCache on the real-engine lane)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from kvoffload.sim.l2_fs import object_name
from tests.unit.roles.render import collection_module

# A file real LMCache 0.5.6 wrote for a model served from /tmp/tinymodel (docs/contracts.md).
CHUNK = "1dbfde1c2912d814da51f4db5efe88fc2a5b91da59dbf34ea260bade4d4be67e"
REAL_NAME = f"-SEP-tmp-SEP-tinymodel@0x01000100@0@{CHUNK}.data"


def l2_clear() -> ModuleType:
    return collection_module("kvoffload_l2_clear")


def test_a_real_fs_native_name_gives_back_its_key() -> None:
    assert l2_clear().object_key(REAL_NAME) == {
        "chunk_hash_hex": CHUNK,
        "model_name": "/tmp/tinymodel",
        "kv_rank": 0x01000100,
        "object_group_id": 0,
        "cache_salt": "",
    }


def test_a_salted_name_and_the_simulators_names_parse() -> None:
    mod = l2_clear()
    salted = mod.object_key("org-SEP-m@0x00000002@1a@beef@tenant-7.data")
    assert salted == {
        "chunk_hash_hex": "beef",
        "model_name": "org/m",
        "kv_rank": 2,
        "object_group_id": 0x1A,
        "cache_salt": "tenant-7",
    }
    sim = mod.object_key(object_name("org/model", "00ff"))
    assert sim is not None and sim["model_name"] == "org/model" and sim["chunk_hash_hex"] == "00ff"


def test_names_that_are_not_objects_are_refused() -> None:
    mod = l2_clear()
    for name in (
        "model@0x0@0@beef.tmp",  # a temporary file
        "model@0x0@0@nothex.data",
        "model@0x0@0@abc.data",  # odd number of hex digits: not bytes
        "@0x0@0@beef.data",  # no model
        "model@0@beef.data",  # a field missing
        "a@b@0x0@0@beef@salt.data",  # one too many
        "lost+found",
    ):
        assert mod.object_key(name) is None, name


def test_the_folder_listing_skips_sub_folders_and_counts_other_files(tmp_path: Path) -> None:
    mod = l2_clear()
    (tmp_path / REAL_NAME).write_bytes(b"")
    (tmp_path / "m@0x0@0@00.data").write_bytes(b"")
    (tmp_path / "00.tmp").write_bytes(b"")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "m@0x0@0@11.data").write_bytes(b"")
    assert mod.object_files(str(tmp_path)) == (sorted([REAL_NAME, "m@0x0@0@00.data"]), ["00.tmp"])
    assert mod.object_files(str(tmp_path / "absent")) == ([], [])
