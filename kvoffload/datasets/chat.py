"""What a chat server accepts in a recorded message, checked when a trace loads.

The generic and sammshen loaders send a call's messages to the server as recorded (the replay adds
nothing but its own options), so a message the server refuses would fail that call with HTTP 400
mid-campaign, hours in, for every virtual user that replays it. These rules follow the OpenAI chat
completions API as vLLM serves it (its request model, then the chat template): the five roles it
defines (`function`, deprecated, is left out: chat templates do not render it); `content` a string or
a list of content parts, each an object with a string `type` (a `text` part with a string `text`),
missing only on an assistant message that makes tool calls; a `tool` message answers a call by its
`tool_call_id`; `tool_calls` a list of `{function: {name, arguments}}` whose `arguments` is JSON text
(vLLM parses it to render the template). Pure: returns the problem as text, the loader names the file
and the line.
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")


def _content_problem(content: Any) -> str | None:
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"'content' must be a string or a list of content parts, got {type(content).__name__}"
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return f"'content[{j}]' must be an object with a string 'type'"
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            return f"'content[{j}]' is a text part without a string 'text'"
    return None


def _tool_calls_problem(calls: Any) -> str | None:
    if not isinstance(calls, list):
        return f"'tool_calls' must be a list, got {type(calls).__name__}"
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"'tool_calls[{j}]' must be an object with a 'function' object with a string 'name'"
        arguments = function.get("arguments")
        if arguments is None or isinstance(arguments, dict):
            continue
        if not isinstance(arguments, str):
            return f"'tool_calls[{j}].function.arguments' must be JSON text, got {type(arguments).__name__}"
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            return f"'tool_calls[{j}].function.arguments' is not valid JSON"
    return None


def message_problem(message: dict[str, Any]) -> str | None:
    """Why a chat server would refuse `message` (an object with a string `role`), or None."""
    role = message["role"]
    if role not in ROLES:
        return f"role {role!r} is not one a chat server accepts (roles allowed: {', '.join(ROLES)})"
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            return f"a {role} message has 'tool_calls' (only an assistant message makes tool calls)"
        problem = _tool_calls_problem(calls)
        if problem:
            return problem
    content = message.get("content")
    if content is None:
        if role == "assistant" and calls:
            return None
        return f"a {role} message needs 'content'" + (" or 'tool_calls'" if role == "assistant" else "")
    problem = _content_problem(content)
    if problem:
        return problem
    call_id = message.get("tool_call_id")
    if role == "tool" and (not isinstance(call_id, str) or not call_id):
        return "a tool message needs a string 'tool_call_id' (the id of the call it answers)"
    return None
