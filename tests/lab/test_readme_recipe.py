"""README's "Your campaign on the virtual lab", run end to end as a reader would (issue 45).

The recipe's block goes to bash as written: `datasets inspect`, `lab up`, the campaign it writes,
`plan`, `run`, `lab down` and its look at the report. The test sets only the recipe's placeholders:
`WORK`, a temporary folder, and `DATA`/`CODE`, a dataset of its own in the generic JSONL format (the
shipped airline conversations rewritten one line per call, as a reader's own recordings would be), and
gives `lab up` this module's network names and state folder so that it never meets a demo lab or
another lane's. Its campaign is README's: two tiers at two concurrencies on the simulator, a few
minutes. Asserts on what the run produced and what the recipe showed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvoffload.datasets import load_dataset
from tests.support.lab import DATASET, free_lab_names, kvlab, lab_marks
from tests.support.readme_recipes import ROOT, recipes

pytestmark = lab_marks(1800)
NAMES = free_lab_names("g", 14)
# README's campaign replays max_sessions: 16 users (twice the concurrency 8 it holds), the first that
# fit its isl
USERS = 16


def _generic_dataset(path: Path, sessions: int) -> Path:
    """The first `sessions` airline conversations as generic JSONL: one line per LLM call, the whole
    messages list it saw, its recorded output length and the gap before it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "session_id": s.session_id,
                "messages": list(c.messages),
                "output_length": c.output_length,
                "pre_gap": c.pre_gap,
            }
        )
        for s in load_dataset("tau2-bench-v1", DATASET)[:sessions]
        for c in s.calls
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_virtual_lab_recipe_runs_end_to_end_on_a_dataset_of_ones_own(tmp_path: Path) -> None:
    recipe = recipes()["virtual-lab-campaign"]
    work = tmp_path / "work"
    data = _generic_dataset(tmp_path / "my-recordings" / "calls.jsonl", sessions=12)
    env = {
        **os.environ,
        "KVOFFLOAD_LAB_STATE": str(tmp_path / "state"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    script = recipe.script(
        {"WORK": str(work), "DATA": str(data), "CODE": "generic"}, extra_args={"lab up": NAMES.up_args()}
    )
    try:
        done = subprocess.run(["bash", "-euxo", "pipefail", "-c", script], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=1500, check=False)  # fmt: skip
    finally:
        down = kvlab(env, "lab", "down", timeout=300)  # a no-op when the recipe's own `lab down` ran
        assert down.returncode == 0, down.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-6000:]

    # the recipe's own `lab down` took the lab away, with the inventory `lab up` wrote
    assert not (work / "hosts.yml").exists() and not (tmp_path / "state" / "state.json").exists()
    results = work / "results" / "mine"
    campaign = json.loads((results / "campaign.json").read_text())
    assert campaign["dataset"]["code"] == "generic" and campaign["dataset"]["digest"].startswith("sha256:")
    cells = [json.loads(p.read_text()) for p in sorted((results / "cells").glob("*/cell.json"))]
    got = sorted((c["config"]["tier"], c["config"]["concurrency"]) for c in cells)
    assert got == [("cpu", 2), ("cpu", 8), ("gpu", 2), ("gpu", 8)], got
    assert all(c["status"] == "done" for c in cells), [c["status"] for c in cells]
    for cell in (results / "cells").iterdir():
        counts = json.loads((cell / "sessions.json").read_text())
        assert counts["failed_requests"] == 0 and counts["complete"] == USERS, counts
    assert (results / "report" / "index.html").is_file()
    # what the recipe's last line showed the reader: the decision table at the README's target
    shown = done.stdout
    assert "## Which tier, at what scale, at what cost" in shown
    assert "sessions at p95 TTFT <= 0.5 s" in shown
    table = shown.split("Levels (the load each held", 1)[0]  # the levels table below repeats the tiers
    rows = [line for line in table.splitlines() if line.startswith(("| gpu |", "| cpu |"))]
    assert len(rows) == 2 and "baseline" in rows[0], rows
    assert "EXAMPLE prices, not a quote." in shown
