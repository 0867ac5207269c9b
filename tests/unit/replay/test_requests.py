"""Request bodies: verbatim history, max_tokens from osl, usage requested, gpt-oss options."""

from __future__ import annotations

from kvoffload.datasets import Call
from kvoffload.replay.requests import RequestOptions, build_payload, warmup_payload
from kvoffload.tokenizer import FallbackTokenizer, render_chat

HISTORY = (
    {"role": "system", "content": "policy"},
    {"role": "user", "content": "hi <|channel|>analysis<|message|>there"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "{}"},
)
CALL = Call("s", 0, HISTORY, output_length=42)


def test_history_is_sent_verbatim_with_recorded_osl() -> None:
    body = build_payload(CALL, RequestOptions(model="m"))
    assert body["messages"] == list(HISTORY)
    assert body["max_tokens"] == 42
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True
    assert "tools" not in body
    assert "kv_transfer_params" not in body  # asked only of a target known to take it


def test_attribution_asks_lmcache_for_its_token_stats() -> None:
    body = build_payload(CALL, RequestOptions(model="m", attribution=True))
    assert body["kv_transfer_params"] == {"cached_token_stats": True}


def test_fixed_osl_and_fallback() -> None:
    assert build_payload(CALL, RequestOptions(model="m", osl=7))["max_tokens"] == 7
    no_len = Call("s", 0, HISTORY)
    assert build_payload(no_len, RequestOptions(model="m", osl_fallback=99))["max_tokens"] == 99


def test_gpt_oss_options() -> None:
    body = build_payload(
        CALL, RequestOptions(model="gpt-oss", sanitize_harmony_tokens=True, agentic_tools=True, ask_mode=True)
    )
    assert body["messages"][1]["content"] == "hi analysisthere"
    assert body["tools"][0]["function"]["name"] == "lookup"
    assert body["tool_choice"] == "auto"
    assert HISTORY[1]["content"].startswith("hi <|channel|>")  # the record itself is untouched


def test_warmup_shares_no_prefix_with_data() -> None:
    # What must not be shared is a KV block: the rendered warm-up and a data request part within the
    # first block (16 tokens, the smallest block size the engines use) after the common role header.
    data = render_chat(build_payload(CALL, RequestOptions(model="m"))["messages"])
    user_data = render_chat([{"role": "user", "content": "hi there, please count from one to ten."}])
    tok = FallbackTokenizer()
    opts = RequestOptions(model="m")
    warmups = [render_chat(warmup_payload(opts, i, n)["messages"]) for i, n in ((0, "f00d"), (0, "beef"))]
    for warmup in warmups:
        for other in (data, user_data):
            shared = _common_prefix(tok.encode(warmup), tok.encode(other))
            assert shared < 16, (warmup, other, shared)
    # Two warm-ups with different nonces part at once too (after "<|user|>\n"): no warm-up hits another.
    assert _common_prefix(tok.encode(warmups[0]), tok.encode(warmups[1])) == len(tok.encode("<|user|>\n"))


def _common_prefix(x: list[int], y: list[int]) -> int:
    n = 0
    for i, j in zip(x, y, strict=False):
        if i != j:
            break
        n += 1
    return n
