"""Render a conversation as a Markdown transcript (for /save). Pure text, no I/O."""
from __future__ import annotations

from .conversation import Conversation


def to_markdown(conv: Conversation, *, model: str = "", system: str = "") -> str:
    lines: list[str] = [f"# {conv.title}", ""]
    if model:
        lines += [f"*Model:* `{model}`", ""]
    if system:
        lines += ["## System", "", system, ""]
    for m in conv.messages:
        lines += [f"## {'User' if m.role == 'user' else 'Assistant'}", ""]
        if m.reasoning:
            quoted = "\n".join(f"> {ln}" if ln else ">" for ln in m.reasoning.splitlines())
            lines += ["<details><summary>Reasoning</summary>", "", quoted, "", "</details>", ""]
        if m.content:
            lines += [m.content, ""]
        for call in m.tool_calls:
            lines += [f"**Tool call** `{call.name}`", "", "```json", call.arguments, "```", ""]
        if m.footer:
            lines += [f"*{m.footer}*", ""]
    return "\n".join(lines).rstrip() + "\n"
