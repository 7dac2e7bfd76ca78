"""Where ninfer_nb keeps downloaded files (the default model, and nothing else yet).

Resolution order: `$NINFER_CACHE` (used as is), else `$XDG_CACHE_HOME/ninfer_nb`, else
`~/.cache/ninfer_nb`. This module only computes the path; it creates nothing and knows nothing
about what is stored there.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The cache directory for this user (not created). `environ` defaults to `os.environ`."""
    env = os.environ if environ is None else environ
    override = env.get("NINFER_CACHE", "").strip()
    if override:
        return Path(override).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg).expanduser() / "ninfer_nb"
    return Path.home() / ".cache" / "ninfer_nb"
