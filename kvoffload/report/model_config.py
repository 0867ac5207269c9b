"""Where the report finds a cell's model's config.json on the controller, for its KV bytes per token.

Read at the report's edge (kvoffload/report/build.py `capacity_inputs`), never by the analysis. A cell's
`model` (cell.json `config.model`) is the campaign's: a folder the controller shipped, or a hub id that
the vllm role downloaded on the vLLM hosts into the staging folder (roles/vllm/tasks/model.yml,
`vllm_model_dir`). The controller has a hub id's config.json only where something cached it there: the
Hugging Face hub cache (the tokenizer the plan and the report count with comes from there too), or the
staging folder itself when the controller is also a vLLM host. Looked for in that order; the first found
is named with where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvoffload.tokenizer import hf_hub_cache

CONFIG_JSON = "config.json"
# Where the vllm role stages a model on a vLLM host: kvoffload/orchestrate/cell/deployment.py REMOTE_MODELS
# (a unit test holds the two equal), a hub id as `org--name`, a shipped folder by its own name.
STAGED_MODELS = Path("/var/lib/kvoffload/models")


@dataclass(frozen=True)
class FoundConfig:
    """A model's config.json and, in words, where it was found."""

    path: Path
    where: str


def is_hub_id(model: str) -> bool:
    """`org/name`, as opposed to a folder path (absolute, relative or under ~)."""
    return model.count("/") == 1 and not model.startswith(("/", ".", "~"))


def cached_hub_file(model: str, name: str, cache: Path) -> Path | None:
    """`name` of hub id `model` in the hub cache `cache`: in the snapshot `refs/main` names, else in the
    newest snapshot that has it (a pinned revision leaves no refs/main)."""
    repo = cache / ("models--" + model.replace("/", "--"))
    main = repo / "refs" / "main"
    if main.is_file():
        candidate = repo / "snapshots" / main.read_text().strip() / name
        if candidate.is_file():
            return candidate
    found = [p for p in (repo / "snapshots").glob(f"*/{name}") if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime, str(p))) if found else None


def find_model_config(
    model: str, cache: Path | None = None, staged: Path = STAGED_MODELS
) -> FoundConfig | None:
    """The config.json of `model` on this machine, or None: the folder `model` names, else (a hub id)
    the hub cache (`cache`, default `hf_hub_cache()`), else the lab's staged copy under `staged`."""
    if not model:
        return None
    folder = Path(model).expanduser()
    if (folder / CONFIG_JSON).is_file():
        return FoundConfig(folder / CONFIG_JSON, "the model folder")
    hub = is_hub_id(model)
    if hub:
        cache = cache if cache is not None else hf_hub_cache()
        cached = cached_hub_file(model, CONFIG_JSON, cache)
        if cached is not None:
            return FoundConfig(cached, f"the Hugging Face hub cache {cache}")
    staged_copy = staged / (model.replace("/", "--") if hub else folder.name) / CONFIG_JSON
    if staged_copy.is_file():
        return FoundConfig(staged_copy, "the lab's staged copy (this machine is a vLLM host)")
    return None
