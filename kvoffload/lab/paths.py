"""Where the virtual lab keeps its files: the image cache and the state of a running lab.

Cache (kept across labs): `$KVOFFLOAD_LAB_CACHE` or `/var/cache/kvoffload-lab`; base images live under
its `images/`. State of the running lab (PIDs, ssh key, loop device image, per-host files): `state/`
under the same cache root, or `$KVOFFLOAD_LAB_STATE` (tests use their own, so a test lab can run next
to the demo's). It is on disk, not in /run, so that `lab down` finds it after a crash of the
controller. Pure path arithmetic, no side effects.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CACHE_ROOT = Path("/var/cache/kvoffload-lab")
CACHE_ENV = "KVOFFLOAD_LAB_CACHE"
STATE_ENV = "KVOFFLOAD_LAB_STATE"


def cache_root() -> Path:
    """The cache root: `$KVOFFLOAD_LAB_CACHE` when set, else /var/cache/kvoffload-lab."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value) if value else DEFAULT_CACHE_ROOT


def images_dir() -> Path:
    """Folder holding one sub-folder per built base image (keyed by package-list hash)."""
    return cache_root() / "images"


def state_dir() -> Path:
    """Folder holding the state of the running lab (state.json, ssh key, host files, disk image)."""
    value = os.environ.get(STATE_ENV, "").strip()
    return Path(value) if value else cache_root() / "state"
