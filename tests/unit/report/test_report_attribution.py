"""The turn-by-turn section as the report shows it: what each request says, costs only where the data
carry one, the cells left out (issue 43)."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from kvoffload.analysis import attribution as A
from kvoffload.report.build import attribution_views, render_markdown
from kvoffload.report.views import MISSING, attribution_tables
from tests.unit.analysis.analysis_frames import samples_frame


def _req(rnd: int, prompt: int, ttft: float, **fields: Any) -> dict[str, Any]:
    return {"cell_id": "c", "status": "ok", "round": rnd, "prompt_tokens": prompt, "ttft_s": ttft, **fields}


def _summary(cell_id: str, tier: str, **over: Any) -> dict[str, Any]:
    row = {"cell_id": cell_id, "tier": tier, "model": "m", "concurrency": 2, "num_rounds": 3, "isl": 8192,
           "osl": "32", "repeat": 0, "node": "n1", "status": "done", "done": True, "valid": True,
           "achieved_sessions": 2, "failed_requests": 0, "attrib_mismatch": ""}  # fmt: skip
    return {**row, **over}


def _chunks_of_256() -> pd.DataFrame:
    """The LMCache server's lookup counters over the run: 2048 L1 hit tokens in 8 keys (256 a chunk)."""
    rows = []
    for name, inc in (
        ("lmcache_mp_lookup_hit_l1_tokens_total", 2048),
        ("lmcache_mp_lookup_hit_l1_keys_total", 8),
    ):
        rows += [("before", 0.0, "t", name, {}, 0.0), ("after", 60.0, "t", name, {}, float(inc))]
    return samples_frame(rows)


# A cpu cell streamed by vLLM 0.32: no cached_token_stats (no GPU / LMCache split per request), but
# every request's cached_tokens and its LMCache lookup line (chunks of 256 tokens):
#  round 1: 1000 prompt, nothing cached, no lookup hit
#  round 2: 1200 prompt, 1024 cached, 4 L1 chunks; 1400 prompt, 1024 cached, 4 L1 chunks
STREAMED = pd.DataFrame(
    [
        _req(1, 1000, 0.05, cached_tokens=0, lmcache_l1_hit_chunks=0, lmcache_l2_hit_chunks=0),
        _req(2, 1200, 0.03, cached_tokens=1024, lmcache_l1_hit_chunks=4, lmcache_l2_hit_chunks=0),
        _req(2, 1400, 0.05, cached_tokens=1024, lmcache_l1_hit_chunks=4, lmcache_l2_hit_chunks=0),
    ]
)


def test_the_cpu_rounds_show_what_every_request_says() -> None:
    [view] = A.tier_attribution(pd.DataFrame([_summary("c", "cpu")]), STREAMED, _chunks_of_256())
    rounds, _, _ = attribution_tables(view)
    assert rounds.title == "cpu: TTFT and prompt sources by round"
    assert rounds.headers[4:] == [
        "cached tokens (GPU or LMCache)",
        "recomputed tokens",
        "LMCache L1 lookup hits",
        "LMCache L2 lookup hits",
    ]
    # round 1: 0 cached, 1000 recomputed, no lookup hit (known: 0, not "-"); round 2: 2048 cached,
    # 176 + 376 = 552 recomputed, 8 L1 chunks x 256 = 2048 L1 lookup hits, 0 in L2. TTFT p50 of .03 and
    # .05 is .04, p95 .03 + .95 x .02 = .049.
    assert rounds.rows == [
        ["1", "1", "0.050", "0.050", "0", "1000", "0", "0"],
        ["2", "2", "0.040", "0.049", "2048", "552", "2048", "0"],
    ]
    assert "a lookup hit may have been served from the GPU prefix cache" in rounds.note


def test_a_round_whose_requests_do_not_all_say_it_counts_them() -> None:
    # round 2's second request lost its LMCache log line: the lookup sums cover the one that has it
    lost = STREAMED.astype(object)
    lost.loc[2, ["lmcache_l1_hit_chunks", "lmcache_l2_hit_chunks"]] = None
    [view] = A.tier_attribution(pd.DataFrame([_summary("c", "cpu")]), lost, _chunks_of_256())
    rows = attribution_tables(view)[0].rows
    assert rows[1][1] == "2 (2 say cached_tokens, 1 with a lookup line)"
    assert rows[1][4:] == ["2048", "552", "1024", "0"]


def _gpu_hits_below_zero() -> pd.DataFrame:
    """24 gpu-tier requests, one user each, where a GPU hit makes TTFT shorter: TTFT = .01 + .04 r - .005 g
    (r recomputed, g cached, in 1K tokens; (r, g) in (1,0), (1,2), (2,0), (2,2), six requests each)."""
    rows = []
    for i in range(24):
        r, g = ((1, 0), (1, 2), (2, 0), (2, 2))[i % 4]
        ttft = 0.01 + 0.04 * r - 0.005 * g
        rows.append(_req(2, 1000 * (r + g), ttft, cached_tokens=1000 * g, user_id=f"u{i}"))
    return pd.DataFrame(rows)


def test_the_cost_table_shows_no_negative_cost_and_says_why() -> None:
    [view] = A.tier_attribution(
        pd.DataFrame([_summary("c", "gpu")]), _gpu_hits_below_zero(), samples_frame([])
    )
    _, costs, _ = attribution_tables(view)
    assert costs.headers == ["source", "ms per 1K tokens", "95 % interval (ms)", "what the data say"]
    rows = {r[0]: r[1:] for r in costs.rows}
    # the recomputed cost is .04 (the GPU column is balanced against it), its interval above zero; the
    # GPU one is below zero: no number, the reason instead
    assert rows["recomputed"][0::2] == ["40.00", "a cost: its 95 % interval is above zero"]
    low, high = (float(v) for v in rows["recomputed"][1].split("-"))
    assert 0 < low < 40 < high
    assert rows["gpu"][:2] == [MISSING, MISSING]
    assert rows["gpu"][2].startswith("no cost: unconstrained least squares puts it below zero")
    # a gpu-tier cell has no LMCache: no L1 or L2 cost, and why
    assert rows["l2"] == [MISSING, MISSING, "not estimable: no request had tokens from LMCache L2"]
    for row in costs.rows:
        assert not any(re.match(r"-\d", cell) for cell in row[1:3]), row
    assert (
        "Non-negative least squares of TTFT as the client saw it over 24 requests of 24 sessions"
        in costs.note
    )


def test_the_section_names_the_group_and_the_cells_left_out() -> None:
    failed = STREAMED.assign(cell_id="f")
    rows = [
        _summary("c", "cpu"),
        _summary("f", "cpu", status="failed", failed_requests=1),
        _summary("g", "gpu"),
    ]
    views = A.tier_attribution(pd.DataFrame(rows), pd.concat([STREAMED, failed]), _chunks_of_256())
    entries = attribution_views(views)
    # the gpu cell has no request: its view has nothing to show and no cell left out, so it is skipped
    assert [(e["group"], e["new_group"], e["left_out"]) for e in entries] == [
        ("m c=2 rounds=3 isl=8192 osl=32 on n1", True, "Left out: f (status 'failed': a partial run).")
    ]
    md = render_markdown(
        {"title": "t", "finding_groups": [], "routing_note": "", "attribution": entries, "predicted": None,
         "capacity_inputs": None, "knees": [], "knee_table": None, "recommendations": [], "tradeoff": None,
         "warnings": [], "info_notes": [], "groups": [], "sessions": None, "cpu": None, "gpus": None,
         "campaign": [], "timing": None, "hosts": None, "software": None}
    )  # fmt: skip
    section = md[md.index("## Where each turn's prompt came from") :]
    assert section.index("### m c=2 rounds=3 isl=8192 osl=32 on n1") < section.index("Left out: f")
    assert "| 2 | 2 | 0.040 | 0.049 | 2048 | 552 | 2048 | 0 |" in section
