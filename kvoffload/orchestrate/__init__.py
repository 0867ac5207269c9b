"""Campaign orchestration: provision once, then every cell's lifecycle, resume and interruption.

Sits between the CLI and {playbook, replay, metrics, ingest, report}: it decides what runs when, writes
the results layout (docs/architecture.md section 9) and never talks to hosts except through
`kvoffload.playbook` (and the HTTP metrics endpoints it checks for a cold start). It does not print; it
reports progress through callbacks that the CLI renders.
"""
