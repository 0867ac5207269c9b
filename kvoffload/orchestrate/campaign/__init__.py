"""A campaign over cells and nodes: the runner, node scheduling and pools, the knee search, estimates of
wall time, the status board and the live page beside a run, teardown. Uses kvoffload.orchestrate.cell,
.installs and .checks; nothing below imports it back."""
