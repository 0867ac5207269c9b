"""`kvoffload-lab doctor`: is each node of a lab ready for a campaign?

`probe.py` is a standalone script run ON a node (stdlib only, never imports this package); `nodes.py`
runs it on every node through the playbook facade, adds the checks that need the inventory and the
controller, and judges. Nothing here prints: the CLI (kvoffload/cli/doctor.py) renders the tables.
"""
