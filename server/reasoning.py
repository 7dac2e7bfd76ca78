"""Reasoning effort -> a thinking-token budget, and the text that closes the thinking channel.

OpenAI's `reasoning_effort` (Chat) / `reasoning.effort` (Responses) and Anthropic's
`thinking.budget_tokens` become `ChatJob.thinking_budget`; the engine closes `</think>` once the
request has thought that many tokens (engine/output_hooks.py). Knows no HTTP.
"""
from __future__ import annotations

from .errors import BadRequest

# tokens of thinking per effort; None: no budget (the model thinks as long as it likes)
EFFORT_BUDGETS: dict[str, int | None] = {
    "minimal": 256, "low": 1024, "medium": 4096, "high": 16384, "xhigh": None, "max": None,
}
CLOSE_THINKING = "\n</think>"      # forced when the budget is spent; the model writes what follows


def effort_budget(effort: object, param: str) -> tuple[bool | None, int | None]:
    """(thinking on / off / None = the default, budget) for an effort value ("none" = off)."""
    if effort is None:
        return None, None
    if effort == "none":
        return False, None
    if not isinstance(effort, str) or effort not in EFFORT_BUDGETS:
        raise BadRequest(f"{param} must be one of none, {', '.join(EFFORT_BUDGETS)}; got {effort!r}",
                         param=param)
    return True, EFFORT_BUDGETS[effort]
