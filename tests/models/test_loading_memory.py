"""Loading never widens and holds about one shard of host memory: a multi-shard float16
checkpoint (~200 MB) is loaded in a fresh process, its peak RSS growth measured from
/proc/self/status (VmHWM, reset through clear_refs); broken checkpoints are one-line errors with
exit status 2."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from ninfer_nb import cli
from tests.support.sharded import tiny_tokenizer, write_sharded

MiB = 2**20


PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from ninfer_nb.models import build_weights
    from ninfer_nb.models.loader import load_checkpoint
    from ninfer_nb.models.weights import map_weights

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    def sink(part):
        # a stand-in device: reads every array once, keeps nothing on the host
        map_weights(part, lambda w: w.map_arrays(lambda a: float(np.asarray(a).ravel()[-1])), lambda a: 0)
        return None

    kept = []
    def keep(part):
        map_weights(part, lambda w: kept.append(w) or w, lambda a: a)
        return part

    ckpt = load_checkpoint(sys.argv[1])
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                               # VmHWM := VmRSS
    except OSError:
        print(json.dumps({"peak": None}))
        sys.exit(0)
    base = status("VmRSS")
    build_weights(ckpt.config, ckpt.weights, ckpt.source, place=sink if sys.argv[2] == "device" else keep)
    print(json.dumps({"peak": status("VmHWM") - base,
                      "dtypes": sorted({w.dtype for w in kept if hasattr(w, "dtype")})}))
""")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    d = tmp_path_factory.mktemp("sharded") / "ckpt"
    return d, write_sharded(d)


def _probe(path: Path, mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path), mode], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if out["peak"] is None:
        pytest.skip("/proc/self/clear_refs is not writable here: the peak cannot be reset")
    return out


def test_device_load_holds_about_one_layer(sharded: tuple[Path, list[Path]]) -> None:
    """Layers go to the 'device' as they are built: peak host growth stays under the largest
    shard plus 64 MiB (the issue's bound is + 2 GiB), far below the fp16 model (~200 MB)."""
    d, shards = sharded
    largest = max(s.stat().st_size for s in shards)
    total = sum(s.stat().st_size for s in shards)
    assert len(shards) == 4 and total > 3 * largest
    peak = _probe(d, "device")["peak"]
    print(f"peak RSS growth {peak / MiB:.0f} MiB, largest shard {largest / MiB:.0f} MiB, model {total / MiB:.0f} MiB")
    assert peak < largest + 64 * MiB, (peak / MiB, largest / MiB)


def test_host_load_keeps_float16(sharded: tuple[Path, list[Path]]) -> None:
    """On the host (CPU backend) the model stays float16: growth about the model's stored size,
    half of what widening to float32 would take."""
    d, shards = sharded
    total = sum(s.stat().st_size for s in shards)
    out = _probe(d, "host")
    assert out["dtypes"] == ["f16"]
    assert out["peak"] < total + max(s.stat().st_size for s in shards) + 64 * MiB < 2 * total


def _run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(args)
    err = capsys.readouterr().err
    return code, err


def test_config_missing_field_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    code, err = _run_cli(["-m", str(d), "--device", "cpu", "--prompt", "hi"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "config.json" in err and "num_attention_heads" in err


def test_truncated_shard_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "vocab_size": 16}))
    tiny_tokenizer(d)
    save_file({"model.embed_tokens.weight": np.zeros((16, 64), np.float16)}, str(d / "model.safetensors"))
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-100])
    code, err = _run_cli(["-m", str(d), "--device", "cpu", "--prompt", "hi"], capsys)
    assert code == 2 and err.count("\n") == 1 and "truncated" in err


def test_convert_and_perplexity_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "exists").mkdir()
    code, err = _run_cli(["convert", str(tmp_path / "nope"), str(tmp_path / "exists"), "--weights", "int8-g128"], capsys)
    assert code == 2 and "never overwrites" in err and err.count("\n") == 1
    code, err = _run_cli(["perplexity", str(tmp_path / "nope")], capsys)
    assert code == 2 and err.count("\n") == 1
