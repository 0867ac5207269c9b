"""`kvoffload-lab datasets inspect`: tokens per round, which tokenizer counted, 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli.main import main
from kvoffload.datasets import load_dataset
from kvoffload.datasets.tokens import round_tokens
from kvoffload.tokenizer import FallbackTokenizer
from tests.support.datasets import generic_lines


def _dataset(tmp_path: Path) -> Path:
    path = tmp_path / "calls.jsonl"
    path.write_text("\n".join(generic_lines(3, 6)) + "\n")
    return path


def _word_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_json_names_the_tokenizer_and_gives_percentiles_per_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _dataset(tmp_path)
    assert main(["datasets", "inspect", "--dataset-code", "generic", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokenizer"] == "kvoffload-fallback"
    expected = round_tokens(load_dataset("generic", path), FallbackTokenizer(), "generic")
    assert out["tokens_per_round"] == {"num_rounds": None, "rounds": [r.as_dict() for r in expected]}
    assert [r["round"] for r in out["tokens_per_round"]["rounds"]] == [1, 2, 3, 4, 5, 6]
    assert all(r["p50"] <= r["p90"] <= r["p99"] <= r["max"] for r in out["tokens_per_round"]["rounds"])


def test_a_hub_id_in_the_hf_cache_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--Qwen--Qwen3-8B" / "snapshots" / "r1"
    tokenizer = _word_tokenizer(snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    path = _dataset(tmp_path)
    argv = ["datasets", "inspect", "--dataset-code", "generic", str(path), "--tokenizer", "Qwen/Qwen3-8B"]
    assert main([*argv, "--json", "--num-rounds", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokenizer"] == str(tokenizer)
    # Users of 5 rounds: 3 sessions of 6 calls give one user each, so 5 rounds of 3 calls.
    assert [(r["round"], r["calls"]) for r in out["tokens_per_round"]["rounds"]] == [
        (i, 3) for i in range(1, 6)
    ]
    fallback = round_tokens(load_dataset("generic", path), FallbackTokenizer(), "generic", 5)
    assert [r["max"] for r in out["tokens_per_round"]["rounds"]] != [r.max for r in fallback]


def test_tables_fit_80_columns_and_say_who_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["datasets", "inspect", "--dataset-code", "generic", str(_dataset(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "input tokens per round (whole sessions)" in out
    assert "tokens counted by kvoffload-fallback (approximate" in out
    assert "┃ rounds ┃ users ┃" in out  # headers not cut to "roun…"


def test_a_server_that_does_not_tokenize_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    argv = ["datasets", "inspect", "--dataset-code", "generic", str(_dataset(tmp_path)), "--tokenizer", url]
    assert main(argv) == 2
    assert f"--tokenizer {url}" in capsys.readouterr().err


def test_the_former_code_flag_still_works_and_says_it_is_deprecated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _dataset(tmp_path)
    assert main(["datasets", "inspect", "--dataset-code", "generic", str(path), "--json"]) == 0
    current = capsys.readouterr()
    assert "deprecated" not in current.err
    assert main(["datasets", "inspect", "--code", "generic", str(path), "--json"]) == 0
    former = capsys.readouterr()
    assert json.loads(former.out) == json.loads(current.out)
    assert "--code is deprecated; use --dataset-code" in former.err
