"""A bf16 checkpoint loads as bf16 records (never widened on the host) and computes exactly
what the float32 checkpoint of the same values computes, for the dense and MoE hybrids and
Llama."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ninfer_nb import LLM
from ninfer_nb.models import build_weights
from ninfer_nb.models.loader import load_checkpoint
from ninfer_nb.models.safetensors_io import SafetensorsFile, checkpoint_files
from ninfer_nb.models.weights import DenseWeight, map_weights
from ninfer_nb.models.weights_format import PlannedTensor, ShardWriter

IDS = [11, 400, 9120, 77, 31000, 5, 248000, 1234]


def _rewrite(src: Path, dest: Path, dtype: np.dtype) -> None:
    """A copy of an HF checkpoint directory with every float tensor rounded to bf16, stored as
    `dtype`."""
    shutil.copytree(src, dest)
    for path in checkpoint_files(dest):
        st = SafetensorsFile(path)
        arrays = {n: st.read(n) for n in st.keys()}
        st.close()
        out = {n: (a.astype(ml_dtypes.bfloat16).astype(dtype) if a.dtype.kind == "f" else a) for n, a in arrays.items()}
        path.unlink()
        w = ShardWriter(path, [PlannedTensor(n, a.dtype, a.shape) for n, a in out.items()], {"format": "pt"})
        for n, a in out.items():
            w.write(n, a)
        w.close()


@pytest.mark.parametrize("kind", ["tiny_qwen35_moe_dir", "tiny_llama_dir"])
def test_bf16_checkpoint_stays_bf16_and_matches_f32(kind: str, request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    src = Path(request.getfixturevalue(kind))
    _rewrite(src, tmp_path / "bf16", np.dtype(ml_dtypes.bfloat16))
    _rewrite(src, tmp_path / "f32", np.dtype(np.float32))
    ckpt = load_checkpoint(str(tmp_path / "bf16"))
    tags: list[str] = []
    map_weights(build_weights(ckpt.config, ckpt.weights, ckpt.source),
                lambda r: tags.append(r.dtype if isinstance(r, DenseWeight) else "q") or r, lambda a: a)
    assert set(tags) == {"bf16"}, set(tags)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())
    got = LLM(str(tmp_path / "bf16"), device="cpu", max_context=32).logits(IDS)
    want = LLM(str(tmp_path / "f32"), device="cpu", max_context=32).logits(IDS)
    # same values, summed in another order (f32 weights are stored column-major on the CPU)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert (got.argmax(-1) == want.argmax(-1)).all()
