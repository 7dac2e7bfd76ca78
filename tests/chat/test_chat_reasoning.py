from __future__ import annotations

import random

import pytest

from ninfer_nb.chat import ReasoningSplitter, split_reasoning


def run_stream(chunks: list[str], starts_in_reasoning: bool) -> tuple[str, str, list[str]]:
    splitter = ReasoningSplitter(starts_in_reasoning)
    pieces = [p for c in chunks for p in splitter.push(c)] + splitter.flush()
    order = [kind for kind, _ in pieces]
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    content = "".join(t for k, t in pieces if k == "content")
    assert all(t for _, t in pieces), "no empty pieces"
    return reasoning, content, order


CASES = [
    # (text, starts_in_reasoning, reasoning, content)
    ("Let me think.\nStep 2.\n</think>\n\nThe answer is 4.", True, "Let me think.\nStep 2.", "The answer is 4."),
    ("\nthoughts\n\n</think>\n\nHi\n", True, "thoughts", "Hi\n"),
    ("<think>\nabc\n</think>\n\nHello", False, "abc", "Hello"),
    ("  \n<think>x</think>y", False, "x", "y"),
    ("Hello <think>not reasoning</think>", False, "", "Hello <think>not reasoning</think>"),
    ("\n\nplain answer", False, "", "plain answer"),
    ("still thinking when cut off\n", True, "still thinking when cut off", ""),
    ("</think>\n\nonly content", True, "", "only content"),
    ("r</think>c </think> <think> d", True, "r", "c </think> <think> d"),
    ("a <th b </thin c\n\n d</think>", True, "a <th b </thin c\n\n d", ""),
    ("<think", False, "", "<think"),
    ("", True, "", ""),
    ("<think>\n\n</think>\n\n", False, "", ""),
]


@pytest.mark.parametrize("text,starts,reasoning,content", CASES)
def test_split_reasoning(text: str, starts: bool, reasoning: str, content: str) -> None:
    assert split_reasoning(text, starts) == (reasoning, content)


@pytest.mark.parametrize("text,starts,reasoning,content", CASES)
def test_stream_with_tags_split_at_every_boundary(text: str, starts: bool, reasoning: str, content: str) -> None:
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            r, c, order = run_stream([text[:i], text[i:j], text[j:]], starts)
            assert (r, c) == (reasoning, content), (i, j)
            assert order == sorted(order, key=lambda k: k == "content")  # reasoning never after content


def test_char_by_char_streams_early() -> None:
    splitter = ReasoningSplitter(True)
    out = [splitter.push(ch) for ch in "abc\n\ndef"]
    assert out[0] == [("reasoning", "a")]  # no needless buffering
    assert out[3] == [] and out[4] == []  # newlines wait: they may precede </think>
    assert out[5] == [("reasoning", "\n\nd")]
    assert splitter.push("</th") == []
    assert splitter.push("ink>\n\nX") == [("content", "X")]


def test_random_fuzz_matches_non_streaming() -> None:
    rng = random.Random(1)
    parts = ["<think>", "</think>", "\n", "\n\n", " ", "a", "b c", "<", "</", "think", ">", "<thi", "</thin"]
    for _ in range(600):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        starts = rng.random() < 0.5
        cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 6)))
        chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        r, c, _ = run_stream(chunks, starts)
        assert (r, c) == split_reasoning(text, starts), (text, starts, chunks)
