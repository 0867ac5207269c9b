"""What the live page (`kvoffload-lab watch`) costs the controller, on a real results folder.

The page's server answers each poll with `LiveView.state()` (status.json re-read when it changed, each
cell's requests.jsonl tailed from where the last read stopped) and recomputes the findings in a thread
whenever the set of DONE cells changed. This times, in CPU seconds of this process:
- the first poll (every record file read whole: a page opened on a finished campaign),
- a steady poll (nothing new: what each poll costs while a run is between writes),
- a poll after one cell's records grew by a replay's worth (the same records appended once more),
- one findings refresh (the report's analysis of the DONE cells, on a copy),
and the page's share of one core at its poll interval (`POLL_S`) with the findings refreshed once per
cell of the folder, against the campaign's own wall time (campaign.json `started_at`/`finished_at`, or
the cells' span): the baseline measured on the same folder.

    python bench/watch_poll.py results/demo
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kvoffload.contracts.layout import CampaignPaths
from kvoffload.report.live import LiveView
from kvoffload.report.watch_page import POLL_S


def _cpu(fn: object) -> float:
    start = time.process_time()
    fn()  # type: ignore[operator]
    return time.process_time() - start


def _campaign_wall_s(paths: CampaignPaths) -> float | None:
    starts, ends = [], []
    for cell in paths.cells():
        try:
            record = json.loads(cell.cell_json.read_text())
        except (OSError, ValueError):
            continue
        if record.get("started_at") and record.get("finished_at"):
            starts.append(float(record["started_at"]))
            ends.append(float(record["finished_at"]))
    return max(ends) - min(starts) if starts else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("campaign", type=Path, help="a results/<campaign> folder (left unchanged)")
    parser.add_argument("--repeat", type=int, default=50, help="steady polls to average (default 50)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as scratch:
        folder = Path(scratch) / args.campaign.name
        shutil.copytree(args.campaign, folder, ignore=shutil.ignore_patterns("tables", "report"))
        paths = CampaignPaths(folder)
        cells = [c for c in paths.cells() if c.requests.is_file()]
        records = sum(1 for c in cells for _ in c.requests.open("rb"))
        view = LiveView(folder)
        first = _cpu(view.state)
        steady = sum(_cpu(view.state) for _ in range(args.repeat)) / args.repeat
        grown = cells[0].requests if cells else None
        appended = 0.0
        if grown is not None:
            text = grown.read_bytes()
            with grown.open("ab") as out:
                out.write(text)
            appended = _cpu(view.state)
        refresh = _cpu(view.refresh_findings)
        wall = _campaign_wall_s(paths)
    print(f"{args.campaign}: {len(cells)} cells, {records} request records")
    print(f"  first poll (every record read)   {first * 1000:8.1f} ms CPU")
    print(f"  steady poll (nothing new)        {steady * 1000:8.2f} ms CPU (mean of {args.repeat})")
    print(f"  poll after a cell's records grew {appended * 1000:8.1f} ms CPU")
    print(f"  findings refresh (DONE cells)    {refresh * 1000:8.1f} ms CPU")
    if wall:
        polls = wall / POLL_S
        total = polls * steady + first + len(cells) * (refresh + appended)
        print(
            f"  over the campaign's {wall:.0f} s at one poll per {POLL_S:g} s: {total:.1f} s CPU, "
            f"{100 * total / wall:.2f} % of one core (ratio to the campaign's wall time: {total / wall:.4f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
