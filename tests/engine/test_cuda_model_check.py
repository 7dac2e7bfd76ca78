"""A model whose shapes the CUDA kernels cannot run is refused at load, with the parameter, its
value and what the kernels take, instead of loading and then failing every request (it once
served HTTP 500s: a GDN key head dim of 16). The check (ops/cuda.py unsupported_shapes) is a
pure function of the config, so all of this runs without a GPU: the load path is driven with a
CudaBackend that has no device behind it (only check_model runs before the refusal)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ninfer_nb import llm as llm_module
from ninfer_nb.config import ModelConfig
from ninfer_nb.engine.cuda_backend import CudaBackend
from ninfer_nb.errors import UnsupportedModelError
from ninfer_nb.kernels.attention import attention as K_attn
from ninfer_nb.kernels.gdn import gdn as K_gdn
from ninfer_nb.models.presets import PRESETS, preset_config
from ninfer_nb.ops.cuda import check_model, unsupported_shapes
from tests.support.checkpoints import BASE_LLAMA, BASE_MOE, BASE_QWEN35

DK16 = "linear_key_head_dim=16: the CUDA backend's gated delta rule needs a multiple of 32 up to 256"


def qwen35(**overrides: Any) -> ModelConfig:
    return ModelConfig.from_hf(dict(BASE_QWEN35, model_type="qwen3_5_text", **overrides))


def test_gdn_key_head_dim_16_is_refused_with_the_value_and_the_limit() -> None:
    assert 32 * K_gdn.MAX_KPL == 256                     # the message's figure is the kernel's
    cfg = qwen35()                                       # the tiny test checkpoints' shapes: Dk = 16
    assert cfg.linear_key_head_dim == 16
    with pytest.raises(UnsupportedModelError) as e:
        check_model(cfg)
    assert e.value.message == DK16 + "; use --device cpu"
    assert e.value.code == "unsupported_model"
    for dk in (48, 512):
        assert unsupported_shapes(qwen35(linear_key_head_dim=dk)) == [
            f"linear_key_head_dim={dk}: the CUDA backend's gated delta rule needs a multiple of 32 up to 256"]


def test_shapes_the_kernels_run_pass() -> None:
    for name in PRESETS:                                 # the real Qwen3.6 shapes and the tiny presets
        assert unsupported_shapes(preset_config(name)) == [], name
    # the GPU tests' tiny checkpoints (tests/engine/test_gpu_model.py GPU_SHAPES / BF16_SHAPES)
    assert unsupported_shapes(qwen35(linear_key_head_dim=32, linear_value_head_dim=32)) == []
    assert unsupported_shapes(qwen35(linear_key_head_dim=32, linear_value_head_dim=32, head_dim=64)) == []
    moe = ModelConfig.from_hf(dict(BASE_MOE, model_type="qwen3_5_moe_text", linear_key_head_dim=32,
                                   linear_value_head_dim=64))
    assert unsupported_shapes(moe) == []
    assert unsupported_shapes(ModelConfig.from_hf(dict(BASE_LLAMA, model_type="llama"))) == []


def test_every_config_limit_is_named() -> None:
    bad = unsupported_shapes(qwen35(head_dim=2 * K_attn.MAX_D, num_key_value_heads=3, linear_num_value_heads=3,
                                    linear_conv_kernel_dim=9, hidden_size=9000))
    assert [b.split(":")[0] for b in bad] == [
        "hidden_size=9000", "head_dim=512", "num_key_value_heads=3", "linear_key_head_dim=16",
        "linear_num_value_heads=3", "linear_conv_kernel_dim=9"]
    moe = ModelConfig.from_hf(dict(BASE_MOE, model_type="qwen3_5_moe_text", linear_key_head_dim=32,
                                   num_experts=2000, num_experts_per_tok=40, moe_intermediate_size=33))
    assert [b.split(":")[0] for b in unsupported_shapes(moe)] == [
        "num_experts=2000", "num_experts_per_tok=40", "moe_intermediate_size=33"]
    # llama: no GDN layers, so no GDN limit applies
    assert unsupported_shapes(ModelConfig.from_hf(dict(BASE_LLAMA, model_type="llama", head_dim=512))) == [
        "head_dim=512: the CUDA backend's attention takes head dims up to 256"]


@pytest.fixture
def deviceless_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLM gets a CudaBackend with no device behind it: anything past check_model would fail."""
    monkeypatch.setattr(llm_module, "create_backend", lambda *a, **k: CudaBackend.__new__(CudaBackend))


def test_llm_refuses_at_load_before_any_weight_goes_up(tiny_qwen35_dir: Path, deviceless_cuda: None) -> None:
    with pytest.raises(UnsupportedModelError, match=DK16):
        llm_module.LLM(str(tiny_qwen35_dir), device="cuda")


def test_cli_reports_it_as_one_error_line(tiny_qwen35_dir: Path, deviceless_cuda: None, capsys) -> None:
    from ninfer_nb.cli import main

    assert main(["--model", str(tiny_qwen35_dir), "--device", "cuda", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("ninfer: error:")] == [
        f"ninfer: error: {DK16}; use --device cpu"]


def test_server_reports_it_and_does_not_start(tiny_qwen35_dir: Path, deviceless_cuda: None, capsys) -> None:
    from ninfer_nb.server.__main__ import main

    assert main([str(tiny_qwen35_dir), "--device", "cuda", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"ninfer-serve: error: {DK16}; use --device cpu" in err.splitlines()
    assert "serving" not in err
