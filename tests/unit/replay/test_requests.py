"""Request bodies: verbatim history, max_tokens from osl, usage requested, gpt-oss options."""

from __future__ import annotations

from kvoffload.datasets import Call
from kvoffload.replay.requests import RequestOptions, build_payload, warmup_payload

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
    a = warmup_payload("m", 0, "f00d")
    b = warmup_payload("m", 0, "beef")
    assert a["messages"][0]["content"].startswith("f00d")
    assert a["messages"][0]["content"] != b["messages"][0]["content"]
