"""Tier profiles as data: engine flags (per GPU vendor build x tier), lmcache-server and Caddy settings.

The YAML files beside this module are the single source of what each tier runs; `resolve` turns them
and a cell's deployment into the extravars of the phase playbooks. Nothing here touches a host.
"""
