"""The resolved replay command line, as the orchestrator and the replay role run it.

`replay_argv` is the one place the argv of `kvoffload-lab replay` for a cell is built: the
orchestrator (kvoffload/orchestrate/cell/deployment.py) passes it to the replay role as the list extravar
`replay_argv`, which the role runs as a command argv (no shell), and records it in cell.json. The role
builds the same list from its `replay_*` variables only when run on its own without `replay_argv`
(roles/replay/vars/main.yml, e.g. its molecule scenario); tests/unit/roles/test_replay_argv.py renders
that build for the orchestrator's extravars and holds it equal to `replay_argv`.

Fixed flags follow docs/architecture.md section 6. The gpt-oss agentic row is added only for
gpt-oss models: for any other model the argv is byte-identical to one built without that row (a test
holds this).
"""

from __future__ import annotations

from dataclasses import dataclass

GPT_OSS_FLAGS = (
    "--enable-agentic-tools",
    "--ask-mode",
    "--sanitize-harmony-tokens",
    "--agentic-max-attempts",
    "3",
)
REQUEST_TIMEOUT_S = 64800
WARMUP_REQUESTS = 4


def is_gpt_oss(model: str) -> bool:
    return "gpt-oss" in model.lower()


@dataclass(frozen=True)
class ReplaySpec:
    base_url: str
    model: str
    dataset_code: str
    dataset: str
    concurrency: int
    num_rounds: int
    output: str
    isl: int | None = None
    osl: str = "recorded"
    max_sessions: int | None = None
    duration_s: int | None = None  # whole seconds, as the campaign's duration_s
    tokenizer: str | None = None
    min_chunk_rounds: int = 5
    workers: int | None = None  # replay worker processes; None: the replay's default (per the client's cores)
    # Ask each answer where its prompt came from (`--attribution`): on for a campaign's replicas with a
    # KV connector (vLLM with LMCacheMPConnector, or the simulator's), whose connector answers it.
    attribution: bool = True
    honor_gaps: bool = False  # sleep each round's recorded gap first (the campaign's honor_gaps)


def fixed_flags(spec: ReplaySpec) -> list[str]:
    """Every flag beyond the cell's own parameters: the fixed row, optional limits, the gpt-oss row."""
    flags = [
        "--agentic-traces",
        "--warmup", str(WARMUP_REQUESTS),
        "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--tokenizer", spec.tokenizer or spec.model,
    ]  # fmt: skip
    if spec.attribution:
        flags.append("--attribution")
    if spec.dataset_code != "sammshen":
        flags += ["--min-chunk-rounds", str(spec.min_chunk_rounds)]
    if spec.duration_s is not None:
        flags += ["--duration", str(spec.duration_s)]
    if spec.workers is not None:
        flags += ["--workers", str(spec.workers)]
    if is_gpt_oss(spec.model):
        flags += list(GPT_OSS_FLAGS)
    if spec.honor_gaps:
        flags.append("--honor-gaps")
    return flags


def replay_argv(spec: ReplaySpec, executable: str = "kvoffload-lab") -> list[str]:
    """The argv of `kvoffload-lab replay` for one cell (no shell involved: pass it as a list): the
    cell's own parameters, the fixed flags, then `--output`. Its order is the replay role's
    (roles/replay/vars/main.yml `_replay_argv`), so that either build gives the same list."""
    argv = [
        executable, "replay",
        "--base-url", spec.base_url,
        "--model", spec.model,
        "--dataset-code", spec.dataset_code,
        "--dataset", spec.dataset,
        "--concurrency", str(spec.concurrency),
        "--num-rounds", str(spec.num_rounds),
    ]  # fmt: skip
    if spec.isl is not None:
        argv += ["--isl", str(spec.isl)]
    argv += ["--osl", spec.osl]
    if spec.max_sessions is not None:
        argv += ["--max-sessions", str(spec.max_sessions)]
    return argv + fixed_flags(spec) + ["--output", spec.output]
