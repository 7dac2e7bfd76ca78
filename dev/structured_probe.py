"""Grammar libraries side by side at the Qwen3.5/3.6 vocabulary (CPU, not a test).

For each of llguidance, xgrammar and outlines-core that is importable: the one-time tokenizer
setup, the compile time of a tool-parameters JSON schema and of json_object (generic JSON; the
library's closest form), and the per-token mask cost while a realistic instance of the schema
(prose in a string, nested objects, arrays, enums) is fed token by token as the real tokenizer
encodes it, then EOS. Each mask is written into an int32 bitmask [ceil(V/32)] in NumPy memory.
Masks and compiles are timed in process CPU time (`timed`); tokenizer setup in wall and CPU time.
Prints Markdown tables (median / p99 / max per-token mask time over all positions of all repeats):
first the chosen path, ninfer_nb.structured, on the same instance as JSON and as tool calls, then
the three libraries side by side (`--libs ""` skips them; xgrammar and outlines-core are not
project dependencies: `pip install --no-deps xgrammar apache-tvm-ffi outlines-core` to compare).

Usage: python3 dev/structured_probe.py [--repeats 5] [--libs llguidance,xgrammar,outlines_core]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ninfer_nb.chat.tokenizer import Tokenizer  # noqa: E402
from tests.support.qwen_tokenizer import write_qwen_tokenizer_files  # noqa: E402

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "summary": {"type": "string"},
        "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
        "assignees": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "email": {"type": "string"},
                    "role": {"type": "string", "enum": ["owner", "reviewer", "watcher"]},
                },
                "required": ["name", "role"],
                "additionalProperties": False,
            },
        },
        "due": {
            "type": "object",
            "properties": {"year": {"type": "integer"}, "month": {"type": "integer"}, "day": {"type": "integer"}},
            "required": ["year", "month", "day"],
            "additionalProperties": False,
        },
        "estimate_hours": {"type": "number"},
        "labels": {"type": "array", "items": {"type": "string"}},
        "blocking": {"type": "boolean"},
    },
    "required": ["title", "summary", "priority", "assignees", "due", "blocking"],
    "additionalProperties": False,
}

INSTANCE: dict[str, Any] = {
    "title": "Decode graph falls back to the host sampler",
    "summary": (
        "With top-k 20, top-p 0.95 and a presence penalty the decode step copies the full logits "
        "row to the host every token, which halves the throughput on the 35B model. The sampler "
        "should run on the device per row of the batch, with the host path kept as the reference."
    ),
    "priority": "high",
    "assignees": [
        {"name": "Ada Lovelace", "email": "ada@example.org", "role": "owner"},
        {"name": "Alan Turing", "role": "reviewer"},
    ],
    "due": {"year": 2026, "month": 12, "day": 24},
    "estimate_hours": 12.5,
    "labels": ["sampling", "performance", "server"],
    "blocking": True,
}


def load_tokenizer() -> Tokenizer:
    with tempfile.TemporaryDirectory() as tmp:
        write_qwen_tokenizer_files(Path(tmp))
        return Tokenizer.from_dir(tmp)


def timed(fn: Callable[[], Any], clock: Callable[[], float] = time.process_time) -> tuple[Any, float]:
    """(result, seconds): the process's CPU time by default (all its threads), which a busy shared
    machine inflates far less than the wall clock."""
    t0 = clock()
    out = fn()
    return out, clock() - t0


class Lib:
    """One library: setup once, compile, then a fresh stepper (mask_into(bitmask), advance(t))."""

    name = ""

    def setup(self, tok: Tokenizer) -> None: ...

    def compile_schema(self, schema: dict) -> Any: ...

    def compile_json_object(self) -> Any: ...

    def stepper(self, compiled: Any) -> tuple[Callable[[np.ndarray], None], Callable[[int], bool]]: ...


class LLGuidance(Lib):
    name = "llguidance"

    def setup(self, tok: Tokenizer) -> None:
        import llguidance

        self.llg = llguidance
        self.tok = llguidance.LLTokenizer(
            tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=list(tok.eos_token_ids)
        )

    def _matcher(self, grammar: str) -> Any:
        m = self.llg.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def compile_schema(self, schema: dict) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        self._matcher(grammar)  # the grammar is built and checked against the tokenizer here
        return grammar

    def compile_json_object(self) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema({"type": "object"})
        self._matcher(grammar)
        return grammar

    def stepper(self, compiled: Any):
        m = self._matcher(compiled)

        def mask_into(bitmask: np.ndarray) -> None:
            m.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

        return mask_into, m.consume_token


class XGrammar(Lib):
    name = "xgrammar"

    def setup(self, tok: Tokenizer) -> None:
        import torch
        import transformers
        import xgrammar

        self.xgr, self.torch = xgrammar, torch
        hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend)
        info = xgrammar.TokenizerInfo.from_huggingface(
            hf, vocab_size=tok.vocab_size, stop_token_ids=list(tok.eos_token_ids)
        )
        self.info = info

    def _compiler(self) -> Any:
        return self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)

    def compile_schema(self, schema: dict) -> Any:
        return self._compiler().compile_json_schema(json.dumps(schema), strict_mode=True)

    def compile_json_object(self) -> Any:
        return self._compiler().compile_json_schema(json.dumps({"type": "object"}))

    def stepper(self, compiled: Any):
        m = self.xgr.GrammarMatcher(compiled)
        torch = self.torch

        def mask_into(bitmask: np.ndarray) -> None:
            m.fill_next_token_bitmask(torch.from_numpy(bitmask).view(1, -1))

        return mask_into, m.accept_token


class OutlinesCore(Lib):
    name = "outlines_core"

    def setup(self, tok: Tokenizer) -> None:
        import outlines_core

        self.oc = outlines_core
        eos = tok.eos_token_ids[0]
        table: dict[bytes, list[int]] = {}
        for token_id in range(tok.vocab_size):
            if token_id in tok.eos_token_ids:
                continue
            text = tok.backend.id_to_token(token_id)
            if text is None:
                continue
            data = _token_bytes(text) if token_id < 248044 else text.encode()
            table.setdefault(data, []).append(token_id)
        self.vocab = outlines_core.Vocabulary(eos, table)

    def compile_schema(self, schema: dict) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocab)

    def compile_json_object(self) -> Any:
        return None  # a regex cannot express unbounded JSON nesting; outlines-core has no CFG

    def stepper(self, compiled: Any):
        guide = self.oc.Guide(compiled)

        def mask_into(bitmask: np.ndarray) -> None:
            guide.write_mask_into(bitmask.ctypes.data, bitmask.size, 4)

        def advance(token_id: int) -> bool:
            guide.advance(token_id, return_tokens=False)
            return True

        return mask_into, advance


def _token_bytes(text: str) -> bytes:
    from tests.support.qwen_tokenizer import _byte_to_unicode

    inverse = {c: b for b, c in _byte_to_unicode().items()}
    return bytes(inverse[c] for c in text)


def timed_setup(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall, CPU) seconds of a one-time setup, which may run on several threads."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall0, time.process_time() - cpu0


LIBS: dict[str, type[Lib]] = {"llguidance": LLGuidance, "xgrammar": XGrammar, "outlines_core": OutlinesCore}


def mask_times(lib: Lib, compiled: Any, tokens: list[int], words: int) -> list[float]:
    """Seconds per mask along `tokens`; checks every token is allowed by the mask before it."""
    mask_into, advance = lib.stepper(compiled)
    bitmask = np.zeros(words, dtype=np.int32)
    times = []
    for step, t in enumerate(tokens):
        times.append(timed(lambda: mask_into(bitmask))[1])
        if not (int(bitmask[t >> 5]) >> (t & 31)) & 1:
            raise RuntimeError(f"{lib.name}: token {t} disallowed at step {len(times) - 1}")
        if step + 1 < len(tokens) and not advance(t):  # the last token is EOS: checked, not fed
            raise RuntimeError(f"{lib.name}: token {t} rejected")
    return times


def xml_call(name: str, args: dict) -> str:
    """`args` as a Qwen3.5 XML tool call (strings raw, other values JSON), in schema order."""
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n" for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def probe_ninfer(tok: Tokenizer, repeats: int) -> None:
    """The chosen path, ninfer_nb.structured (llguidance): compile, first mask, per-token masks."""
    from ninfer_nb.structured import compile_constraint, grammar_tokenizer

    wall, cpu = timed_setup(lambda: grammar_tokenizer(tok, tok.vocab_size))
    tools = [{"type": "function", "function": {"name": "file_issue", "parameters": SCHEMA}}]
    cases = [
        ("json_schema", SCHEMA, json.dumps(INSTANCE)),
        ("json_object", None, json.dumps(INSTANCE)),
        ("tool_calls qwen_xml", {"tools": tools, "tool_choice": "required", "dialect": "qwen_xml"},
         xml_call("file_issue", INSTANCE)),
        ("tool_calls hermes_json", {"tools": tools, "tool_choice": "required", "dialect": "hermes_json"},
         "<tool_call>\n" + json.dumps({"name": "file_issue", "arguments": INSTANCE}) + "\n</tool_call>"),
    ]
    print(f"\nninfer_nb.structured (llguidance), GrammarTokenizer built in {wall:.2f} s wall, {cpu:.2f} s CPU")
    print("| constraint | tokens | compile ms | first mask µs | mask µs median / p99 / max | advance µs median |")
    print("|---|---|---|---|---|---|")
    for label, spec, text in cases:
        kind = label.split()[0]
        constraint, t_compile = timed(lambda: compile_constraint(kind, spec, tok))
        tokens = tok.encode(text) + [tok.eos_token_ids[0]]
        masks, advances = [], []
        for _ in range(repeats):
            matcher = constraint.matcher()
            bitmask = np.empty((tok.vocab_size + 31) // 32, dtype=np.int32)
            for step, t in enumerate(tokens):
                masks.append(timed(lambda: matcher.fill_bitmask(bitmask))[1])
                if not (int(bitmask[t >> 5]) >> (t & 31)) & 1:
                    raise RuntimeError(f"{label}: token {t} disallowed at step {step}")
                if step + 1 < len(tokens):
                    advances.append(timed(lambda: matcher.advance(t))[1])
        us, adv = np.array(masks) * 1e6, np.array(advances) * 1e6
        print(f"| {label} | {len(tokens)} | {t_compile * 1e3:.1f} | {us[0]:.0f} | "
              f"{np.median(us):.0f} / {np.percentile(us, 99):.0f} / {us.max():.0f} | {np.median(adv):.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--libs", default=",".join(LIBS))
    args = ap.parse_args()

    tok = load_tokenizer()
    text = json.dumps(INSTANCE)  # ", " and ": " separators: accepted by all three's defaults
    tokens = tok.encode(text) + [tok.eos_token_ids[0]]
    words = (tok.vocab_size + 31) // 32
    print(f"vocab {tok.vocab_size}, instance {len(text)} chars / {len(tokens)} tokens, "
          f"repeats {args.repeats}")
    probe_ninfer(tok, args.repeats)
    rows = []
    for name in filter(None, args.libs.split(",")):
        lib = LIBS[name]()
        t_setup = timed_setup(lambda: lib.setup(tok))
        compiled, t_schema = timed(lambda: lib.compile_schema(SCHEMA))
        obj, t_obj = timed(lib.compile_json_object)
        times = []
        for _ in range(args.repeats):
            times += mask_times(lib, compiled, tokens, words)
        us = np.array(times) * 1e6
        first_us = us[0]
        obj_us = np.array(mask_times(lib, obj, tokens, words)) * 1e6 if obj is not None else None
        rows.append((name, t_setup, t_schema, first_us, t_obj if obj is not None else None, us, obj_us))
        print(f"  {name} done", flush=True)

    print("\n| library | tokenizer setup s wall / CPU | schema compile ms | first mask µs | json_object compile ms "
          "| schema mask µs median / p99 / max | json_object mask µs median / p99 |")
    print("|---|---|---|---|---|---|---|")
    for name, t_setup, t_schema, first_us, t_obj, us, obj_us in rows:
        obj_c = f"{t_obj * 1e3:.1f}" if t_obj is not None else "n/a"
        obj_m = (f"{np.median(obj_us):.0f} / {np.percentile(obj_us, 99):.0f}"
                 if obj_us is not None else "n/a")
        print(f"| {name} | {t_setup[0]:.1f} / {t_setup[1]:.1f} | {t_schema * 1e3:.1f} | {first_us:.0f} | {obj_c} | "
              f"{np.median(us):.0f} / {np.percentile(us, 99):.0f} / {us.max():.0f} | {obj_m} |")


if __name__ == "__main__":
    main()
