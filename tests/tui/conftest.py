"""Fixtures for the TUI tests: an isolated data folder, the tiny checkpoint, app builders.

`tiny_model_dir` uses the lead's session fixture `tiny_qwen35_dir` when tests/conftest.py
provides it, and otherwise writes the same tiny random Qwen3.5 checkpoint itself.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ninfer_nb.tui.app import NinferApp
from ninfer_nb.tui.client import EngineClient
from ninfer_nb.tui.inprocess import InProcessClient
from ninfer_nb.tui.settings import ChatSettings, TuiConfig


def _tiny(request: pytest.FixtureRequest, factory: pytest.TempPathFactory, kind: str) -> Path:
    try:
        return Path(request.getfixturevalue(f"tiny_{kind}_dir"))
    except pytest.FixtureLookupError:
        from tests.support.checkpoints import write_tiny_checkpoint

        dest = factory.mktemp("tui") / f"tiny-{kind}"
        write_tiny_checkpoint(dest, kind)
        return dest


@pytest.fixture(scope="session")
def tiny_model_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny random Qwen3.5 hybrid checkpoint."""
    return _tiny(request, tmp_path_factory, "qwen35")


@pytest.fixture(scope="session")
def tiny_llama_model_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny random Llama checkpoint (plain KV cache: any shared prefix is reusable)."""
    return _tiny(request, tmp_path_factory, "llama")


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "data"
    monkeypatch.setenv("NINFER_TUI_DATA", str(d))
    return d


GREEDY = ChatSettings(temperature=0.0, seed=0, max_tokens=24)

MakeApp = Callable[..., NinferApp]


@pytest.fixture
def make_app(data_dir: Path) -> MakeApp:
    """Build an app around `client` (default: the in-process engine on `model`)."""

    def build(
        client: EngineClient | None = None,
        *,
        model: Path | str | None = None,
        chat: ChatSettings = GREEDY,
        perf_interval_s: float = 0.0,
        show_perf: bool = True,
        max_context: int = 4096,
    ) -> NinferApp:
        if client is None:
            client = InProcessClient(str(model), device="cpu", max_context=max_context)
        config = TuiConfig(
            data_dir=data_dir, model=str(model) if model else None, device="cpu",
            max_context=max_context, chat=chat, perf_interval_s=perf_interval_s,
            show_perf=show_perf, cursor_blink=False,   # no clock on screen in snapshots
        )
        return NinferApp(config, client)

    return build
