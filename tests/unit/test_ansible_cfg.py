"""The project-wide ansible.cfg holds no lab-only settings: no default inventory, host keys checked."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_default_inventory_and_no_host_key_override() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg.has_section("defaults")
    keys = {key for section in cfg.sections() for key in cfg[section]}
    assert "inventory" not in keys
    assert "host_key_checking" not in keys
