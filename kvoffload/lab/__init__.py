"""The virtual lab: systemd-nspawn hosts on a private bridge, standing in for real lab hosts.

Sits beside the product pipeline, not inside it: `kvoffload-lab lab up` builds hosts that the rest of
the tool then treats exactly like real ones (through an inventory and ssh). Nothing in `orchestrate`,
`playbook` or the roles may import this package or know that a host is virtual.
"""
