"""Loader for tau2-bench results files (dataset code `tau2-bench-v1`).

A tau2 `Results` JSON holds simulations; each later assistant message of a simulation is one agent LLM
call, whose prompt is everything the agent could see before it. The loader rebuilds that view:
- the system prompt is not stored, so it is rebuilt as tau2 does it: agent instructions followed by the
  domain policy from `info.environment_info.policy` (our instruction wording; the policy dominates the
  token count);
- tool calls become OpenAI-shaped (`{id, type: function, function: {name, arguments: <JSON string>}}`) and
  tool results carry `tool_call_id`;
- tool calls made by the user simulator (`requestor == "user"`, telecom) and the tool messages answering
  them are invisible to the agent and dropped;
- `messages[0]` (the fixed greeting) is history, not a call; `usage.completion_tokens` is the recorded
  output length; `pre_gap` is the time between the previous agent call and the last message before this
  one (from the ISO timestamps).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from kvoffload.datasets.errors import data_error
from kvoffload.datasets.files import data_files, json_document
from kvoffload.datasets.model import Call, Message, Session
from kvoffload.datasets.split import split_sessions

AGENT_INSTRUCTIONS = (
    "You are a customer service agent. Help the user while following the <policy> below exactly.\n"
    "On each turn do one of two things: write a message to the user, or make a tool call; never both.\n"
    "Be helpful, stay within the policy, and produce valid JSON whenever you call a tool."
)


def system_prompt(policy: str) -> str:
    return f"<instructions>\n{AGENT_INSTRUCTIONS}\n</instructions>\n<policy>\n{policy}\n</policy>"


def _openai_tool_calls(path: Path, where: str, calls: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, tc in enumerate(calls):
        if not isinstance(tc, dict) or not isinstance(tc.get("name"), str):
            raise data_error(path, where, f"tool_calls[{i}] must be an object with a string 'name'")
        args = tc.get("arguments") or {}
        out.append(
            {
                "id": str(tc.get("id", "")),
                "type": "function",
                "function": {
                    "name": tc["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                },
            }
        )
    return out


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _simulation_calls(path: Path, domain: str, policy: str, index: int, sim: Any) -> list[Call]:
    where = f"simulations[{index}]"
    if not isinstance(sim, dict) or not isinstance(sim.get("messages"), list):
        raise data_error(path, where, "must be an object with a 'messages' list")
    session_id = f"{domain}:{sim.get('id', index)}"
    visible: list[Message] = [{"role": "system", "content": system_prompt(policy)}]
    calls: list[Call] = []
    last_call_ts: float | None = None
    last_seen_ts: float | None = None
    for j, msg in enumerate(sim["messages"]):
        mwhere = f"{where}.messages[{j}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("assistant", "user", "tool"):
            raise data_error(path, mwhere, "must be an object with role assistant, user or tool")
        role = msg["role"]
        ts = _timestamp(msg.get("timestamp"))
        tool_calls = msg.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise data_error(path, mwhere, "'tool_calls' must be a list")
        if role == "assistant":
            if j > 0:
                usage = msg.get("usage") or {}
                out_len = usage.get("completion_tokens") if isinstance(usage, dict) else None
                gap = 0.0
                if calls and last_call_ts is not None and last_seen_ts is not None:
                    gap = max(0.0, last_seen_ts - last_call_ts)
                calls.append(
                    Call(
                        session_id,
                        len(calls),
                        tuple(visible),
                        out_len if isinstance(out_len, int) and not isinstance(out_len, bool) else None,
                        gap,
                        f"{path.name}:{mwhere}",
                    )
                )
                last_call_ts = ts
            message: Message = {"role": "assistant", "content": msg.get("content")}
            if tool_calls:
                message["tool_calls"] = _openai_tool_calls(path, mwhere, tool_calls)
            visible.append(message)
        elif role == "user":
            if isinstance(msg.get("content"), str) and msg["content"]:
                visible.append({"role": "user", "content": msg["content"]})
        elif msg.get("requestor", "assistant") != "user":
            visible.append(
                {"role": "tool", "tool_call_id": str(msg.get("id", "")), "content": msg.get("content")}
            )
        else:
            continue  # a tool result for the user simulator: the agent never sees it
        if ts is not None:
            last_seen_ts = ts
    return calls


def load(path: Path) -> list[Session]:
    calls: list[Call] = []
    for file in data_files(path, (".json",)):
        doc = json_document(file)
        if not isinstance(doc, dict) or not isinstance(doc.get("simulations"), list):
            raise data_error(file, "top level", "not a tau2 results file (no 'simulations' list)")
        info = doc.get("info")
        env = info.get("environment_info") if isinstance(info, dict) else None
        policy = env.get("policy") if isinstance(env, dict) else None
        if not isinstance(env, dict) or not isinstance(policy, str):
            raise data_error(file, "info.environment_info.policy", "missing or not a string")
        domain = str(env.get("domain_name") or file.stem)
        for i, sim in enumerate(doc["simulations"]):
            calls.extend(_simulation_calls(file, domain, policy, i, sim))
    return split_sessions(calls)
