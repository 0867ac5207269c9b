"""This package's wheel in the controller's cache: reproducible, and named by its bytes.

Two checkouts that run campaigns at once (a demo and a test run, say) share the wheel cache; a wheel
path that one of them rewrote under the other's running campaign made that campaign ship a different
package mid-way. So the folder is named by the wheel's digest and is never rewritten.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvoffload.orchestrate.installs import wheelhouse as wh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_package_wheel_is_named_by_its_bytes_and_kept(tmp_path: Path) -> None:
    first = wh.build_package_wheel(tmp_path)
    digest = hashlib.sha256(first.read_bytes()).hexdigest()[:12]
    assert first.parent == tmp_path / f"package-{digest}"
    assert first.name.startswith("kvoffload_lab-") and first.suffix == ".whl"
    stamp = first.stat().st_mtime_ns
    again = wh.build_package_wheel(tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp  # same bytes: nothing rewritten
    # another checkout's wheel lives beside it, never in its place
    other = tmp_path / "package-000000000000" / first.name
    other.parent.mkdir()
    other.write_bytes(b"another build")
    assert wh.build_package_wheel(tmp_path) == first and other.read_bytes() == b"another build"
    assert not list(tmp_path.glob(".package-*")), "no temporary folder left behind"


def test_builds_of_one_checkout_at_once_take_turns(tmp_path: Path) -> None:
    # make test's lanes start several runs at once; setuptools builds in the checkout's build/ folder,
    # where two builds at once would remove each other's files mid-way.
    caches = [tmp_path / f"cache{i}" for i in range(3)]
    for cache in caches:
        cache.mkdir()
    with ThreadPoolExecutor(max_workers=3) as pool:
        wheels = list(pool.map(wh.build_package_wheel, caches))
    assert len({w.read_bytes() for w in wheels}) == 1, wheels
