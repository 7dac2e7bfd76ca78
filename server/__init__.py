"""ninfer-serve: an aiohttp server speaking OpenAI Chat Completions, OpenAI Responses and
Anthropic Messages on top of one `ninfer_nb` engine. `create_app` builds the application;
`python -m ninfer_nb.server` / `ninfer-serve` runs it."""
from __future__ import annotations

from .app import create_app
from .config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
