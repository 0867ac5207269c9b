"""Turning a recorded call into the request body that replays it (teacher-forced, verbatim history).

The gpt-oss options exist because gpt-oss's harmony chat format needs help with recorded agent traces;
they are resolved only for gpt-oss models (see command.py) and mean, in this tool:
- sanitize harmony tokens: strip harmony control tokens (`<|channel|>`, `<|message|>`...) that recorded
  content may carry, which the harmony template would otherwise treat as structure;
- agentic tools: declare the tools that the recorded history calls (name, free-form object arguments),
  since harmony renders tool calls only for declared tools;
- ask mode: let the model choose between text and a tool call (`tool_choice: auto`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvoffload.datasets import Call

HARMONY_TOKEN = re.compile(r"<\|(?:start|end|message|channel|constrain|return|call)\|>")


@dataclass(frozen=True)
class RequestOptions:
    model: str
    osl: int | None = None  # None: the recorded output_length
    osl_fallback: int = 128  # when the record has no output_length
    ignore_eos: bool = True
    sanitize_harmony_tokens: bool = False
    agentic_tools: bool = False
    ask_mode: bool = False
    # Ask the server where each prompt's tokens came from (LMCache's `cached_token_stats` through
    # vLLM's `kv_transfer_params`). Off unless the target is known to take it: a server that
    # validates request bodies strictly may refuse the unknown field.
    attribution: bool = False


def max_tokens(call: Call, opts: RequestOptions) -> int:
    if opts.osl is not None:
        return opts.osl
    return max(1, call.output_length) if call.output_length else opts.osl_fallback


def _sanitize(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str) and "<|" in content:
        return {**message, "content": HARMONY_TOKEN.sub("", content)}
    return message


def _declared_tools(messages: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    names: dict[str, None] = {}
    for m in messages:
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names[fn["name"]] = None
    return [
        {
            "type": "function",
            "function": {"name": n, "parameters": {"type": "object", "additionalProperties": True}},
        }
        for n in names
    ]


def build_payload(call: Call, opts: RequestOptions) -> dict[str, Any]:
    """The streaming chat-completions body for one recorded call."""
    messages = [_sanitize(m) for m in call.messages] if opts.sanitize_harmony_tokens else list(call.messages)
    payload: dict[str, Any] = {
        "model": opts.model,
        "messages": messages,
        "max_tokens": max_tokens(call, opts),
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if opts.ignore_eos:
        payload["ignore_eos"] = True
    if opts.attribution:
        payload["kv_transfer_params"] = {"cached_token_stats": True}
    if opts.agentic_tools:
        tools = _declared_tools(call.messages)
        if tools:
            payload["tools"] = tools
            if opts.ask_mode:
                payload["tool_choice"] = "auto"
    return payload


def warmup_payload(opts: RequestOptions, index: int, nonce: str) -> dict[str, Any]:
    """A throwaway request whose first tokens are a random nonce: it shares no prefix with any dataset.

    It asks for `ignore_eos` as the replayed requests do, so a model whose first choice is its end
    token (a random-weight test model can be) still answers with tokens.
    """
    payload: dict[str, Any] = {
        "model": opts.model,
        "messages": [{"role": "user", "content": f"{nonce} warm-up {index}: count from one to ten."}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if opts.ignore_eos:
        payload["ignore_eos"] = True
    return payload
