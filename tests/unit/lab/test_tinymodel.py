"""The tiny Llama folder of the real-engine lane: safetensors layout, tokenizer, determinism, reuse.

The folder is checked against the captured reference model (tests/fixtures/vllm-0.32-cpu/
tiny-llama-config) and its safetensors header is parsed here independently of the writer.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest
from tokenizers import Tokenizer

from kvoffload.cli.main import main
from kvoffload.datasets import load_dataset
from kvoffload.errors import UserError
from kvoffload.lab import tinymodel

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "tiny-llama-config"
DATA = ROOT / "data"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tinymodel.build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", seed=0)


def _read_safetensors(path: Path) -> tuple[dict[str, Any], int, bytes]:
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    return header, length, raw[8 + length :]


def _tensor(path: Path, name: str) -> np.ndarray[Any, Any]:
    header, _, data = _read_safetensors(path)
    start, end = header[name]["data_offsets"]
    halves = np.frombuffer(data[start:end], dtype="<u2").astype(np.uint32) << np.uint32(16)
    return halves.view(np.float32).reshape(header[name]["shape"])


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_configs_are_the_reference_with_longer_positions(model: Path) -> None:
    config = _json(model / "config.json")
    reference = _json(REFERENCE / "config.json")
    assert config.pop("max_position_embeddings") == 65536
    assert reference.pop("max_position_embeddings") == 8192
    assert config == reference
    assert _json(model / "generation_config.json") == _json(REFERENCE / "generation_config.json")
    tok_config = _json(model / "tokenizer_config.json")
    assert tok_config.pop("model_max_length") == 65536
    ref_tok_config = _json(REFERENCE / "tokenizer_config.json")
    ref_tok_config.pop("model_max_length")
    assert tok_config == ref_tok_config


def test_safetensors_header_parses_and_sizes_match(model: Path) -> None:
    header, length, data = _read_safetensors(model / "model.safetensors")
    assert length % 8 == 0
    assert header.pop("__metadata__") == {"format": "pt"}
    spans = []
    for name, entry in header.items():
        assert entry["dtype"] == "BF16", name
        start, end = entry["data_offsets"]
        assert end - start == 2 * math.prod(entry["shape"]), name
        spans.append((start, end))
    spans.sort()
    assert spans[0][0] == 0
    assert spans[-1][1] == len(data)
    assert all(prev[1] == cur[0] for prev, cur in itertools.pairwise(spans))


def test_names_and_shapes_are_llama_for_causal_lm_of_the_config(model: Path) -> None:
    header, _, _ = _read_safetensors(model / "model.safetensors")
    header.pop("__metadata__")
    shapes = {name: tuple(entry["shape"]) for name, entry in header.items()}
    # hidden 128, 4 heads x 32, 2 kv heads x 32, intermediate 256, vocab 8192, untied lm_head
    per_layer = {
        "self_attn.q_proj.weight": (128, 128),
        "self_attn.k_proj.weight": (64, 128),
        "self_attn.v_proj.weight": (64, 128),
        "self_attn.o_proj.weight": (128, 128),
        "mlp.gate_proj.weight": (256, 128),
        "mlp.up_proj.weight": (256, 128),
        "mlp.down_proj.weight": (128, 256),
        "input_layernorm.weight": (128,),
        "post_attention_layernorm.weight": (128,),
    }
    expected = {
        "model.embed_tokens.weight": (8192, 128),
        "model.norm.weight": (128,),
        "lm_head.weight": (8192, 128),
        **{f"model.layers.{n}.{key}": shape for n in range(2) for key, shape in per_layer.items()},
    }
    assert shapes == expected
    assert tinymodel.tensor_shapes(_json(model / "config.json")) == expected


def test_weights_are_unit_norms_and_small_normals(model: Path) -> None:
    weights = model / "model.safetensors"
    for name in ("model.norm.weight", "model.layers.1.input_layernorm.weight"):
        assert np.all(_tensor(weights, name) == 1.0)
    embed = _tensor(weights, "model.embed_tokens.weight")
    assert abs(float(embed.mean())) < 0.001
    assert 0.0195 < float(embed.std()) < 0.0205
    # independent streams per tensor: two same-shaped projections differ
    up = _tensor(weights, "model.layers.0.mlp.up_proj.weight")
    gate = _tensor(weights, "model.layers.0.mlp.gate_proj.weight")
    assert not np.array_equal(up, gate)


def test_bfloat16_rounds_to_nearest_even() -> None:
    values = np.array([1.0, -2.0, 1 + 2**-8, 1 + 3 * 2**-8, 0.02], dtype=np.float32)
    halves = np.frombuffer(tinymodel.bfloat16_bytes(values), dtype="<u2")
    # 1 + 2^-8 is half-way between 1.0 and the next bf16: ties go to the even mantissa (1.0)
    assert halves.tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x3CA4]


def test_tokenizer_has_the_special_ids_and_full_vocab(model: Path) -> None:
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert [tok.token_to_id(t) for t in ("<s>", "</s>", "<unk>", "<pad>")] == [0, 1, 2, 3]
    assert tok.get_vocab_size() == 8192
    assert tok.encode("hello", add_special_tokens=True).ids[0] == 0
    assert tok.encode("ok</s>", add_special_tokens=False).ids[-1] == 1


@pytest.mark.parametrize(
    "text",
    [
        "I\u2019d like to change my upcoming return flight from Atlanta to Las Vegas.",
        '{"user_id": "mia_li_3668", "reservation_id": "NO6JO3"}',
        "  indented\n\tcode = [x ** 2 for x in range(10)]  # naïve café 日本語 🚀",
    ],
)
def test_tokenizer_round_trips_text(model: Path, text: str) -> None:
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids
    assert all(0 <= i < 8192 for i in ids)
    assert tok.decode(ids) == text


def test_max_positions_cover_every_shipped_conversation(model: Path) -> None:
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    # as transformers renders chat templates (trim_blocks, lstrip_blocks, a non-escaping tojson)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = env.from_string((model / "chat_template.jinja").read_text())
    limit = _json(model / "config.json")["max_position_embeddings"]
    deepest = {}
    for code, folder in (("tau2-bench-v1", "tau2-bench"), ("sammshen", "sammshen-sample")):
        counts = [
            len(
                tok.encode(
                    template.render(
                        messages=list(call.messages),
                        bos_token="<s>",
                        eos_token="</s>",
                        add_generation_prompt=True,
                    ),
                    add_special_tokens=False,
                ).ids
            )
            for session in load_dataset(code, DATA / folder)
            for call in session.calls[-1:]
        ]
        deepest[code] = max(counts)
    # data/README.md: tau2 prompts reach about 12.3K tokens with gpt-4.1's own tokenizer
    assert 10_000 < deepest["tau2-bench-v1"] < 16_384
    assert deepest["sammshen"] < limit


def test_chat_template_renders_tool_turns_and_stays_prefix_stable(model: Path) -> None:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = env.from_string((model / "chat_template.jinja").read_text())
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    short = template.render(messages=history[:1], bos_token="<s>", eos_token="</s>")
    full = template.render(messages=history, bos_token="<s>", eos_token="</s>", add_generation_prompt=True)
    assert full == (
        '<s><|user|>\nhi</s>\n<|assistant|>\n\n[{"id": "c1", "function": {"name": "f"}}]</s>\n'
        "<|tool|>\ndone</s>\n<|assistant|>\n"
    )
    assert full.startswith(short)


def test_same_seed_gives_identical_bytes_and_another_seed_other_weights(model: Path, tmp_path: Path) -> None:
    again = tinymodel.build_tiny_model(tmp_path / "again", seed=0)
    for name in tinymodel.MODEL_FILES:
        assert (again / name).read_bytes() == (model / name).read_bytes(), name
    other = tinymodel.build_tiny_model(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (model / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()


def _corpus(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    row = {"messages": [{"role": "user", "content": text}]}
    path = folder / "chat.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def test_a_complete_folder_is_reused_without_rewriting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = [_corpus(tmp_path / "corpus", "the quick brown fox jumps over the lazy dog " * 20)]
    out = tinymodel.build_tiny_model(tmp_path / "m", corpus=corpus, seed=5)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}

    def no_rebuild(*args: object) -> None:
        raise AssertionError("rebuilt a complete folder")

    monkeypatch.setattr(tinymodel, "_write_model", no_rebuild)
    assert tinymodel.build_tiny_model(tmp_path / "m", corpus=corpus, seed=5) == out
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()} == before


def test_changed_inputs_replace_the_folder(tmp_path: Path) -> None:
    corpus = [_corpus(tmp_path / "corpus", "alpha beta gamma delta " * 20)]
    out = tinymodel.build_tiny_model(tmp_path / "m", corpus=corpus, seed=0)
    first = _json(out / tinymodel.STAMP_NAME)["key"]
    corpus[0].write_text(json.dumps({"messages": [{"role": "user", "content": "other words " * 20}]}) + "\n")
    tinymodel.build_tiny_model(out, corpus=corpus, seed=0)
    assert _json(out / tinymodel.STAMP_NAME)["key"] != first
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "corpus", "m"]


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = [_corpus(tmp_path / "corpus", "some words here " * 20)]

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(tinymodel, "write_safetensors", broken)
    with pytest.raises(OSError, match="disk full"):
        tinymodel.build_tiny_model(tmp_path / "m", corpus=corpus)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "corpus"]


def test_a_foreign_folder_is_refused(tmp_path: Path) -> None:
    corpus = [_corpus(tmp_path / "corpus", "words " * 20)]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a tiny model built by kvoffload-lab"):
        tinymodel.build_tiny_model(tmp_path / "notes", corpus=corpus)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_corpus_texts_are_distinct_message_strings_and_policies(tmp_path: Path) -> None:
    calls = [{"name": "get_user", "arguments": {"user_id": "u1"}}]
    tau2 = {
        "info": {"environment_info": {"policy": "POLICY TEXT"}},
        "simulations": [
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "hello",
                        "raw_data": {"message": {"role": "x", "content": "RAW"}},
                    },
                    {"role": "assistant", "content": None, "tool_calls": calls},
                ]
            }
        ],
    }
    (tmp_path / "t.json").write_text(json.dumps(tau2))
    rows = [
        {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]},
        {"input": [{"role": "system", "content": "sys"}, {"role": "user", "content": [{"text": "part"}]}]},
    ]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = tinymodel.corpus_texts([tmp_path / "t.json", tmp_path / "s.jsonl"])
    assert texts == ["POLICY TEXT", "hello", json.dumps(calls), "sys", "part"]


def test_cli_builds_and_prints_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "tiny-model", str(tmp_path / "cli"), "--seed", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert _json(tmp_path / "cli" / tinymodel.STAMP_NAME)["seed"] == 2
    assert main(["lab", "tiny-model", str(tmp_path / "cli"), "--seed", "-1"]) == 2
