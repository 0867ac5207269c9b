"""A tiny random-weight Llama model folder that real vLLM (its CPU build) can serve, built offline.

The real-engine lane of the virtual lab needs a model, and the lab has no route to the Hugging Face hub.
This module writes one from nothing: the architecture of the captured reference model
(`tests/fixtures/vllm-0.32-cpu/tiny-llama-config/`, from a real vLLM run), a byte-level BPE tokenizer
trained here on the shipped conversations (so token counts of replayed prompts are realistic), and random
bfloat16 weights in a safetensors file written by hand (no torch, no safetensors package). Output is a
pure function of (recipe, corpus bytes, seed); a finished folder carries a stamp with the hash of those
inputs and is reused as it is. It writes only inside the folder it is given (and a lock file beside it);
it never downloads anything and never starts an engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import kvoffload
from kvoffload.errors import UserError
from kvoffload.locking import exclusive

# Bump when anything below changes what a build writes (files, tokenizer recipe, weight layout).
RECIPE_VERSION = 1
STAMP_NAME = "kvoffload-tiny-model.json"
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")  # ids 0..3, as config.json expects
BOS, EOS, UNK, PAD = SPECIAL_TOKENS
INIT_STD = 0.02
# The deepest prompts of the shipped conversations, rendered with CHAT_TEMPLATE and counted with the
# tokenizer trained on them, are 12.2K tokens (tau2-bench; median 6.0K) and 39.4K tokens (the sammshen
# session): 65536 positions cover both, so an engine's `--max-model-len` alone decides what it accepts.
MAX_POSITIONS = 65536

# The reference model's architecture (the fixture's config.json), except max_position_embeddings.
CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "dtype": "bfloat16",
    "eos_token_id": 1,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": INIT_STD,
    "intermediate_size": 256,
    "max_position_embeddings": MAX_POSITIONS,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pad_token_id": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "transformers_version": "5.19.0",
    "use_cache": True,
    "vocab_size": 8192,
}
GENERATION_CONFIG: dict[str, Any] = {
    "_from_model_config": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "output_attentions": False,
    "output_hidden_states": False,
    "pad_token_id": 3,
    "transformers_version": "5.19.0",
    "use_cache": True,
}
TOKENIZER_CONFIG: dict[str, Any] = {
    "backend": "tokenizers",
    "bos_token": BOS,
    "eos_token": EOS,
    "model_max_length": MAX_POSITIONS,
    "pad_token": PAD,
    "tokenizer_class": "TokenizersBackend",
    "unk_token": UNK,
}
# The reference template, plus tool calls (as JSON) and content that is null or not a string (an
# assistant turn that only calls tools). Transformers renders templates with trim_blocks, which eats a
# newline right after a block tag, so newlines that follow one are written as {{ '\n' }}. Each message
# renders on its own, so the text of a longer history extends the text of a shorter one (prefix caching
# across rounds sees the same tokens).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% if message['tool_calls'] %}{{ '\\n' }}{{ message['tool_calls'] | tojson }}{% endif %}"
    "{{ eos_token }}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{{ '\\n' }}{% endif %}"
)
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "model.safetensors",
)
_CORPUS_SUFFIXES = (".json", ".jsonl")
# "messages": tau2 and the re-shaped sammshen sample; "input": the full sammshen schema (one row a call).
_MESSAGE_LISTS = ("messages", "input")


def shipped_corpus() -> list[Path]:
    """The recorded conversations shipped in the repository's data/ folder (tau2-bench and sammshen)."""
    data = Path(kvoffload.__file__).resolve().parents[1] / "data"
    files = sorted(p for p in data.rglob("*") if p.is_file() and p.suffix in _CORPUS_SUFFIXES)
    if not files:
        raise UserError(f"{data}: no shipped conversations (*.json, *.jsonl) to train the tokenizer on")
    return files


def _corpus_files(corpus: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for path in corpus:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _CORPUS_SUFFIXES))
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"{path}: corpus file or folder does not exist")
    if not files:
        raise UserError(f"corpus {', '.join(map(str, corpus))}: no *.json or *.jsonl files in it")
    return files


def _documents(path: Path) -> Iterator[Any]:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            for line in text.splitlines():
                if line.strip():
                    yield json.loads(line)
        else:
            yield json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not JSON/JSONL text ({exc}); the tokenizer corpus must be JSON") from exc


def _message_texts(message: Mapping[str, Any]) -> Iterator[str]:
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]
    if message.get("tool_calls"):
        yield json.dumps(message["tool_calls"], ensure_ascii=False)


def _walk(node: Any) -> Iterator[str]:
    """Strings of every chat message (content, tool calls) and every tau2 policy under `node`."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in _MESSAGE_LISTS and isinstance(value, list):
                for message in value:
                    if isinstance(message, Mapping) and "role" in message:
                        yield from _message_texts(message)
            elif key == "policy" and isinstance(value, str):
                yield value  # tau2's system prompt is built from it: the bulk of every prompt
            else:
                yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def corpus_texts(files: Iterable[Path]) -> list[str]:
    """Distinct message strings of the conversation files, in file and record order.

    Cumulative histories (every sammshen row repeats the whole conversation so far) would otherwise
    weigh early turns many times over; each distinct string counts once.
    """
    seen: set[str] = set()
    texts: list[str] = []
    for path in files:
        for document in _documents(path):
            for text in _walk(document):
                if text and text not in seen:
                    seen.add(text)
                    texts.append(text)
    return texts


def train_tokenizer(texts: Sequence[str], vocab_size: int = int(CONFIG["vocab_size"])) -> str:
    """tokenizer.json text of a byte-level BPE trained on `texts`; the same texts give the same bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    # As Llama tokenizers do: a plain encode with special tokens starts with <s>. Chat prompts get it
    # from the template instead (engines encode rendered chats without adding special tokens).
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens landed at ids {ids}, not 0..{len(SPECIAL_TOKENS) - 1}")
    text: str = tokenizer.to_str()
    return text


def tensor_shapes(config: Mapping[str, Any] = CONFIG) -> dict[str, tuple[int, ...]]:
    """Name and shape of every tensor of HF's LlamaForCausalLM for `config` (torch [out, in] layout)."""
    hidden = int(config["hidden_size"])
    head_dim = int(config["head_dim"])
    q_out = int(config["num_attention_heads"]) * head_dim
    kv_out = int(config["num_key_value_heads"]) * head_dim
    inter = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for n in range(int(config["num_hidden_layers"])):
        layer = f"model.layers.{n}"
        shapes[f"{layer}.self_attn.q_proj.weight"] = (q_out, hidden)
        shapes[f"{layer}.self_attn.k_proj.weight"] = (kv_out, hidden)
        shapes[f"{layer}.self_attn.v_proj.weight"] = (kv_out, hidden)
        shapes[f"{layer}.self_attn.o_proj.weight"] = (hidden, q_out)
        shapes[f"{layer}.mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{layer}.mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{layer}.mlp.down_proj.weight"] = (hidden, inter)
        shapes[f"{layer}.input_layernorm.weight"] = (hidden,)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def bfloat16_bytes(values: np.ndarray[Any, Any]) -> bytes:
    """Little-endian bfloat16 of `values`: the top half of each float32, rounded to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


def random_weights(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, bytes]:
    """bfloat16 bytes per tensor: norms 1.0, the rest normal(0, 0.02).

    Each tensor draws from its own stream, seeded by (seed, CRC-32 of its name), so a tensor does not
    change when another is added or removed.
    """
    out: dict[str, bytes] = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        else:
            rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)
        out[name] = bfloat16_bytes(values)
    return out


def write_safetensors(path: Path, shapes: Mapping[str, tuple[int, ...]], data: Mapping[str, bytes]) -> None:
    """A safetensors file of bfloat16 tensors: u64 LE header length, JSON header, then the raw bytes.

    Tensors are laid out back to back in name order (as the safetensors library writes them, and its
    reader insists on: no gaps, no overlap); the header is space-padded to 8 bytes so data is aligned.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    names = sorted(shapes)
    for name in names:
        size = len(data[name])
        expected = 2 * int(np.prod(shapes[name], dtype=np.int64))
        if size != expected:
            raise ValueError(f"{name}: {size} bytes for shape {shapes[name]}, expected {expected}")
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as handle:
        handle.write(len(raw).to_bytes(8, "little"))
        handle.write(raw)
        for name in names:
            handle.write(data[name])


def inputs_key(corpus_files: Sequence[Path], seed: int) -> str:
    """Hash of everything a build depends on: the recipe, the configs, the corpus bytes and the seed."""
    digest = hashlib.sha256()
    spec = {
        "recipe": RECIPE_VERSION,
        "config": CONFIG,
        "generation": GENERATION_CONFIG,
        "tokenizer": TOKENIZER_CONFIG,
        "template": CHAT_TEMPLATE,
        "seed": seed,
    }
    digest.update(json.dumps(spec, sort_keys=True).encode())
    for path in corpus_files:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _stamp(folder: Path) -> dict[str, Any] | None:
    try:
        stamp = json.loads((folder / STAMP_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_complete(folder: Path, key: str) -> bool:
    """True when `folder` is a finished build of the inputs hashed to `key`."""
    stamp = _stamp(folder)
    return (
        stamp is not None
        and stamp.get("key") == key
        and all((folder / name).is_file() for name in MODEL_FILES)
    )


def _dump(path: Path, value: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _write_model(folder: Path, texts: Sequence[str], seed: int, key: str, sources: Sequence[str]) -> None:
    _dump(folder / "config.json", CONFIG)
    _dump(folder / "generation_config.json", GENERATION_CONFIG)
    _dump(folder / "tokenizer_config.json", TOKENIZER_CONFIG)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (folder / "tokenizer.json").write_text(train_tokenizer(texts))
    shapes = tensor_shapes(CONFIG)
    write_safetensors(folder / "model.safetensors", shapes, random_weights(shapes, seed))
    # Written last: a folder without it is not a finished build.
    _dump(folder / STAMP_NAME, {"key": key, "recipe": RECIPE_VERSION, "seed": seed, "corpus": list(sources)})


@contextlib.contextmanager
def _lock(out: Path) -> Iterator[None]:
    with exclusive(out.parent / f".{out.name}.lock"):
        yield


def _check_replaceable(out: Path) -> None:
    """Refuse to replace anything at `out` that is not an earlier build of ours (or an empty folder)."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder; remove it or choose another OUT")
    if any(out.iterdir()) and _stamp(out) is None:
        raise UserError(
            f"{out}: a folder that is not a tiny model built by kvoffload-lab (no {STAMP_NAME}); "
            "remove it or choose another OUT"
        )


def build_tiny_model(out: Path, corpus: list[Path] | None = None, seed: int = 0) -> Path:
    """Write (or reuse) the tiny Llama model folder at `out` and return `out`.

    `corpus`: JSON/JSONL conversation files or folders of them to train the tokenizer on (default: the
    shipped data/). A folder that already holds a finished build of the same inputs is left untouched;
    otherwise the model is built in a temporary folder beside `out` and renamed into place, so `out` is
    never seen half-written. An older build at `out` is replaced; anything else there is refused.
    """
    if seed < 0:
        raise UserError(f"seed {seed}: must be 0 or more")
    files = _corpus_files(corpus) if corpus is not None else shipped_corpus()
    key = inputs_key(files, seed)
    if is_complete(out, key):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out):
        if is_complete(out, key):  # built by someone else while we waited for the lock
            return out
        _check_replaceable(out)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
        try:
            _write_model(work, corpus_texts(files), seed, key, [str(p) for p in files])
            work.chmod(0o755)  # mkdtemp makes it 0700; engines may run as another user
            if not out.exists():
                work.replace(out)
            else:
                trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
                out.replace(trash / out.name)
                try:
                    work.replace(out)
                except OSError:
                    (trash / out.name).replace(out)
                    raise
                finally:
                    shutil.rmtree(trash, ignore_errors=True)
        finally:
            if work.exists():
                shutil.rmtree(work)
    return out
