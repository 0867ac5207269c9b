"""One cell's lifecycle on one node: its plan and extra-vars, deploy, cold start and reset, replay
watch, faults, the record it leaves (cell.json), and the plain-Ansible path. Imports nothing from
kvoffload.orchestrate.campaign: the campaign hands a cell what it needs (cell/run.py, CampaignServices)."""
