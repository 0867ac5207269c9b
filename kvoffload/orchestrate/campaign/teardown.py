"""`kvoffload-lab teardown`'s one entry point: stop every kvoffload unit on every host, no campaign run.

Orchestration layer, beside `CampaignRunner` (whose campaign-wide playbooks take the same variables:
the first cell's extravars without `kvoffload_node`, so that they cover every node). A teardown belongs
to no campaign's results and installs nothing: its playbook's artifacts go to a scratch folder that is
removed afterwards, and its extravars name a package wheel that is never built (`NO_INSTALL`), so no
wheelhouse is built and no host is asked for its Python.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from kvoffload.config import LabConfig
from kvoffload.orchestrate.cell.deployment import cell_extravars
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.playbook import PlaybookResult, PlaybookRunner

if TYPE_CHECKING:
    from kvoffload.orchestrate.campaign.runner import Progress

# What the teardown's extravars name as the wheels: its tasks install nothing, so none is built.
NO_INSTALL = Wheels(package=Path("unused.whl"), wheelhouse=None)


def teardown_lab(lab: LabConfig, inventory: Path, progress: Progress) -> PlaybookResult:
    """Run playbooks/teardown.yml on every host of the lab (vLLM replicas, lmcache-server and Caddy
    stopped, the L2 folder wiped, the hosts' periodic disk jobs given back); `progress` hears its
    tasks. A failed playbook raises `PlaybookFailed`."""
    with tempfile.TemporaryDirectory(prefix="kvoffload-teardown-") as scratch:
        playbooks = PlaybookRunner(inventory, Path(scratch), on_task=lambda _h, task: progress.task(task))
        first = lab.cells[0]
        extravars = cell_extravars(lab, first, Path(scratch) / first.id, NO_INSTALL)
        del extravars["kvoffload_node"]  # campaign-wide: every node's hosts
        return playbooks.run("teardown.yml", extravars)
