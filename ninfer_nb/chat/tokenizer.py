"""Tokenizer: text ⇄ token ids over a `tokenizers.Tokenizer`, plus the ids the engine stops on.

`Tokenizer.from_dir` reads a Hugging Face tokenizer directory (tokenizer.json,
tokenizer_config.json, optional chat_template.jinja / chat_template.json and
generation_config.json). Other sources (GGUF metadata) build a `tokenizers.Tokenizer`
themselves and call the constructor directly.

Text written in the input that spells an added token (e.g. "<|im_start|>") always encodes to
that token's single id. BOS is added only when asked (`add_special_tokens=True`) and the
tokenizer wants it (`add_bos`); nothing else is ever added. This module knows nothing about
chat templates beyond carrying the template text and the tool-call dialect it names.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import tokenizers

from ninfer_nb.chat.tool_dialects import ToolCallDialect, detect_dialect
from ninfer_nb.errors import ModelFormatError


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token_ids: Sequence[int],
        bos_token_id: int | None = None,
        add_bos: bool = False,
        chat_template: str | None = None,
        bos_token: str = "",
        eos_token: str = "",
    ) -> None:
        self.backend = backend
        self._eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self._bos_token_id = bos_token_id
        self.add_bos = add_bos and bos_token_id is not None
        self._chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        special.update(self._eos_token_ids)
        if bos_token_id is not None:
            special.add(bos_token_id)
        self._special_token_ids = frozenset(special)

    # ---- construction from a Hugging Face directory -------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        root = Path(path)
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelFormatError(f"no tokenizer.json in {root}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ModelFormatError(f"cannot read {tok_file}: {first}") from None
        config = _read_json(root / "tokenizer_config.json")
        generation = _read_json(root / "generation_config.json")
        _add_missing_tokens(backend, config.get("added_tokens_decoder"))

        bos_token = _token_text(config.get("bos_token"))
        eos_token = _token_text(config.get("eos_token"))
        bos_id = backend.token_to_id(bos_token) if bos_token else None
        if bos_id is None and isinstance(generation.get("bos_token_id"), int) and bos_token:
            bos_id = generation["bos_token_id"]

        eos_ids: list[int] = []
        gen_eos = generation.get("eos_token_id")
        if isinstance(gen_eos, int):
            eos_ids.append(gen_eos)
        elif isinstance(gen_eos, list):
            eos_ids.extend(i for i in gen_eos if isinstance(i, int))
        eos_id = backend.token_to_id(eos_token) if eos_token else None
        if eos_id is not None:
            eos_ids.insert(0, eos_id)
        if not eos_ids:
            raise ModelFormatError(f"no eos token in {root} (tokenizer_config / generation_config)")

        if "add_bos_token" in config:
            add_bos = bool(config["add_bos_token"])
        else:  # no flag: trust tokenizer.json's post-processor, if it adds BOS
            probe = backend.encode("", add_special_tokens=True).ids
            add_bos = bos_id is not None and probe[:1] == [bos_id]

        return cls(
            backend,
            eos_token_ids=eos_ids,
            bos_token_id=bos_id,
            add_bos=add_bos,
            chat_template=_find_chat_template(root, config),
            bos_token=bos_token,
            eos_token=eos_token,
        )

    # ---- text ⇄ ids ---------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self._bos_token_id is not None:
            if ids[:1] != [self._bos_token_id]:
                ids.insert(0, self._bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, id: int) -> str | None:
        return self.backend.id_to_token(id)

    # ---- properties ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_token_ids

    @cached_property
    def tool_dialect(self) -> ToolCallDialect:
        """The tool-call syntax the chat template asks the model for (Qwen XML by default)."""
        return detect_dialect(self._chat_template)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self._vocab_size}, eos={list(self._eos_token_ids)}, "
            f"bos={self._bos_token_id}, add_bos={self.add_bos})"
        )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"cannot parse {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} is not a JSON object")
    return data


def _token_text(value: Any) -> str:
    """tokenizer_config stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return ""


def _add_missing_tokens(backend: tokenizers.Tokenizer, decoder: Any) -> None:
    """Append added tokens that only tokenizer_config.json knows, when their ids are next in line."""
    if not isinstance(decoder, dict):
        return
    entries: list[tuple[int, dict]] = []
    for key, entry in decoder.items():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and key.isdigit():
            entries.append((int(key), entry))
    for token_id, entry in sorted(entries, key=lambda e: e[0]):
        content = entry["content"]
        if backend.token_to_id(content) is not None:
            continue
        if token_id != backend.get_vocab_size(with_added_tokens=True):
            continue  # a gap: appending would give it the wrong id
        token = tokenizers.AddedToken(
            content,
            single_word=bool(entry.get("single_word", False)),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            normalized=bool(entry.get("normalized", False)),
            special=bool(entry.get("special", False)),
        )
        if entry.get("special", False):
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])


def _find_chat_template(root: Path, config: dict[str, Any]) -> str | None:
    """chat_template.jinja beats chat_template.json beats tokenizer_config.json's field."""
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = root / "chat_template.json"
    if json_file.is_file():
        template = _pick_template(_read_json(json_file).get("chat_template"))
        if template is not None:
            return template
    return _pick_template(config.get("chat_template"))


def _pick_template(value: Any) -> str | None:
    """A template is a string, or a list of {name, template} where "default" wins."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {
            e.get("name"): e.get("template")
            for e in value
            if isinstance(e, dict) and isinstance(e.get("template"), str)
        }
        if "default" in named:
            return named["default"]
        if named:
            return next(iter(named.values()))
    return None
