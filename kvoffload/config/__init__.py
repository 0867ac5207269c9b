"""Validated inventory and campaign, and the campaign's resolved cells (docs/architecture.md section 3).

The bottom layer of the controller: everything above (orchestrate, playbook, profiles, cli) reads the
lab through these models. Reads YAML files and validates; never touches a host, runs Ansible or reads
profile files. Every bad input raises `ConfigError` (a `UserError`) naming the file and the key.
"""

from kvoffload.config.campaign import Campaign, DatasetSpec
from kvoffload.config.cells import Cell, resolve_cells
from kvoffload.config.errors import ConfigError
from kvoffload.config.inventory import Host, Inventory, NvmeDevice, ReplicaSpec
from kvoffload.config.load import (
    LabConfig,
    campaign_dataset_path,
    load_campaign,
    load_inventory,
    load_lab,
)

__all__ = [
    "Campaign",
    "Cell",
    "ConfigError",
    "DatasetSpec",
    "Host",
    "Inventory",
    "LabConfig",
    "NvmeDevice",
    "ReplicaSpec",
    "campaign_dataset_path",
    "load_campaign",
    "load_inventory",
    "load_lab",
    "resolve_cells",
]
