"""`ninfer-tui` entry point: parse the command line, build the engine client, run the app.

The only place in the TUI that reads environment variables (NINFER_TUI_DATA overrides the
history folder) or decides between in-process and --url mode.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import platformdirs

from .client import EngineClient
from .settings import ChatSettings, SettingError, TuiConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ninfer-tui",
        description="Chat with a ninfer_nb model in the terminal and watch the engine work.",
    )
    p.add_argument(
        "model", nargs="?", help="HF directory, GGUF file or preset (default: SmolLM2-135M)"
    )
    p.add_argument("--url", help="talk to a running ninfer-serve at this base URL instead")
    p.add_argument("--api-key", help="bearer token for --url")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (in-process)")
    p.add_argument("--max-context", type=int, default=4096, help="context length in tokens")
    p.add_argument("--prefill-chunk", type=int, default=1024, help="prefill chunk in tokens")
    p.add_argument("--no-thinking", action="store_true", help="start with reasoning off")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", default="", help="system prompt")
    p.add_argument("--no-perf", action="store_true", help="start with the monitor hidden")
    p.add_argument("--history", action="store_true", help="start with the history sidebar open")
    p.add_argument("--no-blink", action="store_true", help="steady (non-blinking) cursor")
    return p


def config_from_args(args: argparse.Namespace, data_dir: Path) -> TuiConfig:
    chat = (
        ChatSettings(seed=args.seed)
        .with_temperature(args.temperature)
        .with_top_p(args.top_p)
        .with_max_tokens(args.max_tokens)
        .with_thinking(not args.no_thinking)
        .with_system(args.system)
    )
    if args.max_context < 16:
        raise SettingError(f"--max-context must be >= 16, got {args.max_context}")
    return TuiConfig(
        data_dir=data_dir,
        model=args.model,
        url=args.url,
        api_key=args.api_key,
        device=args.device,
        max_context=args.max_context,
        prefill_chunk=args.prefill_chunk,
        chat=chat,
        show_perf=not args.no_perf,
        show_history=args.history,
        cursor_blink=not args.no_blink,
    )


def make_client(config: TuiConfig) -> EngineClient:
    if config.url is not None:
        from .http_client import HttpClient

        return HttpClient(config.url, api_key=config.api_key, model=config.model)
    from .inprocess import InProcessClient

    return InProcessClient(
        config.model,
        device=config.device,
        max_context=config.max_context,
        prefill_chunk=config.prefill_chunk,
    )


def default_data_dir() -> Path:
    override = os.environ.get("NINFER_TUI_DATA")
    if override:
        return Path(override)
    return Path(platformdirs.user_data_dir("ninfer-tui", appauthor=False))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args, default_data_dir())
    except SettingError as exc:
        sys.stderr.write(f"ninfer-tui: {exc}\n")
        return 2
    from .app import NinferApp

    NinferApp(config, make_client(config)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
