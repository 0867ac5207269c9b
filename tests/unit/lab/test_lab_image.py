"""Base image recipe: the cache key and the Debian mirror taken from this machine's apt sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.lab import image


def test_key_is_stable_and_follows_the_package_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    key = image.image_key()
    assert key == image.image_key()
    assert len(key) == 12
    monkeypatch.setattr(image, "ROLE_PACKAGES", (*image.ROLE_PACKAGES, "nvme-cli"))
    assert image.image_key() != key


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVOFFLOAD_LAB_CACHE", str(tmp_path))
    assert image.image_dir("abc") == tmp_path / "images" / "debian12-abc"
    monkeypatch.delenv("KVOFFLOAD_LAB_CACHE")
    assert image.image_dir("abc") == Path("/var/cache/kvoffload-lab/images/debian12-abc")


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "other.sources").write_text(
        "Types: deb\nURIs: https://example.org/apt\nSuites: nodistro\nComponents: main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    assert image.debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_mirror_from_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main\n"
    )
    assert image.debian_mirror(tmp_path) == "http://one.example/debian"


def test_mirror_falls_back_to_deb_debian_org(tmp_path: Path) -> None:
    assert image.debian_mirror(tmp_path) == "http://deb.debian.org/debian"
