"""Both backends implement every member of the backend contract (engine/backends/base.py
`Backend`) with the contract's signature: methods with the same parameters (names, kinds,
defaults), properties as properties, attributes present. CudaBackend is checked as a class (it
needs a GPU to build). The CPU backend's decode steps and token ring are run on a tiny model."""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

from ninfer_nb.engine.backend import CpuBackend
from ninfer_nb.engine.backends.base import Backend
from ninfer_nb.engine.cuda_backend import CudaBackend


def _contract() -> tuple[dict[str, Any], set[str]]:
    """The protocol's methods / properties by name, and its plain attributes."""
    members = {name: value for name, value in vars(Backend).items()
               if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}
    return members, set(Backend.__annotations__)


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(inspect.unwrap(fn))
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("cls", [CpuBackend, CudaBackend])
def test_backend_provides_every_protocol_member(cls: type) -> None:
    members, attributes = _contract()
    assert {"decode_step", "launch_token_step", "collect_token", "discard_tokens", "graph_ready",
            "enable_token_pick", "time_decode_steps", "copy_", "zero_"} <= members.keys()
    for name, want in members.items():
        got = inspect.getattr_static(cls, name, None)
        assert got is not None, f"{cls.__name__} lacks {name}"
        if isinstance(want, property):
            assert isinstance(got, property), f"{cls.__name__}.{name} is not a property"
        else:
            assert inspect.isfunction(got), f"{cls.__name__}.{name} is not a method"
            assert _params(got) == _params(want), f"{cls.__name__}.{name}: {_params(got)} != {_params(want)}"
    for name in attributes:
        assert name in vars(cls) or name in getattr(cls, "__annotations__", {}), f"{cls.__name__}.{name}"


def _tiny() -> tuple[Any, Any, Any]:
    from ninfer_nb.engine.backend import random_array
    from ninfer_nb.engine.batch import ForwardBatch
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.presets import preset_config, random_weights
    from ninfer_nb.models.state import new_state

    cfg = preset_config("tiny-qwen3.5")
    rng = np.random.default_rng(0)
    decoder = Decoder(cfg, random_weights(cfg, lambda shape, kind: random_array(rng, shape, kind)))
    backend = CpuBackend()

    def run(state: Any) -> Any:
        return lambda ids, pos: decoder.forward(backend.ops, ForwardBatch.single(ids, pos), state)

    return cfg, backend, lambda: run(new_state(cfg, 16, backend.zeros))


def test_cpu_decode_steps_and_token_ring_agree() -> None:
    """decode_step runs eagerly; the token ring picks on the host (argmax at temperature 0,
    a seeded Gumbel-max sample otherwise) from the same logits; no graph: nothing is queued
    on an unread token and there is no device time to measure."""
    cfg, backend, forward = _tiny()
    assert not backend.decode_graphs and not backend.graph_ready
    assert backend.time_decode_steps(0) is None
    vocab = 1000
    a, b = forward(), forward()                   # two fresh caches, the same tokens
    with pytest.raises(RuntimeError, match="enable_token_pick"):
        backend.launch_token_step(b, 5, 0)
    backend.enable_token_pick(vocab)
    assert backend.token_pick_vocab == vocab
    for pos, token in enumerate([5, 17, 99]):
        row = backend.decode_step(a, token, pos)
        assert row.shape == (cfg.vocab_size,)
        backend.launch_token_step(b, token, pos)
        assert backend.collect_token() == int(np.argmax(row[:vocab]))
    with pytest.raises(RuntimeError, match="no decode graph"):
        backend.launch_token_step(b, None, 3)
    c, d = forward(), forward()
    picks = []
    for f in (c, d):
        backend.launch_token_step(f, 5, 0, (1.0, 1234, 0))
        picks.append(backend.collect_token())
    assert picks[0] == picks[1] and 0 <= picks[0] < vocab        # seeded: the same sample
    backend.launch_token_step(forward(), 5, 0)
    backend.discard_tokens()
    with pytest.raises(IndexError):
        backend.collect_token()


def test_the_decode_path_does_not_probe_the_backend() -> None:
    """The engine talks to backends through the Protocol alone: no hasattr / getattr probing
    and no type: ignore on the path from LLM to the backend."""
    from pathlib import Path

    import ninfer_nb

    root = Path(ninfer_nb.__file__).parent
    for name in ("llm.py", "engine/llm_engine.py", "engine/generator.py", "engine/state_slots.py",
                 "engine/batch.py", "engine/backend.py", "engine/cuda_backend.py", "engine/backends/base.py"):
        text = (root / name).read_text()
        for probe in ("hasattr(", "getattr(", "type: ignore"):
            assert probe not in text, f"{name}: {probe}"
