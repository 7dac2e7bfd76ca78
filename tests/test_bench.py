"""`ninfer bench` end to end on the CPU backend with a tiny random preset: the table, the JSON
report and both per-op profiles (decode step and prefill chunk) are produced and consistent; the
peak device-memory column's bookkeeping (and, on the GPU, the column itself)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ninfer_nb.cli import main


def test_bench_reports_every_figure_and_profiles(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prompt-len", "24,40",
               "--gen", "6", "--prefill-chunk", "16", "--profile", "--max-context", "128", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["max_context"] == 128                # --max-context over the 40 + 6 (+ 8) the run needs
    assert all("peak_device_bytes" not in r for r in report["rows"])   # the CPU backend has no arena
    assert report["copy_bandwidth_GBps"] > 0
    assert report["kv_cache"] == "fp32"          # --kv-cache auto on the CPU backend
    rows = report["rows"]
    assert [r["prompt_tokens"] for r in rows] == [24, 40]
    for r in rows:
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["ttft_ms"] > 0
        assert len(r["ttft_ms_runs"]) == 3 and r["ttft_ms"] == sorted(r["ttft_ms_runs"])[1]   # the median
        assert r["bytes_per_token"] > 0 and 0 < r["fraction_of_limit"]
    decode, prefill = report["profile"], report["prefill_profile"]
    assert report["decode_step_us"] > 0 and report["decode_ops_us"] > 0
    assert report["decode_ops"] == sum(r["calls"] for r in decode)
    names = {r["op"] for r in decode}
    assert {"gdn_decode", "attention_gated"} <= names and "attention_gated" in {r["op"] for r in prefill}
    # linear layers per weight shape (tiny-qwen3.5: hidden 256, MLP 512, vocab 248320; the MLP's
    # gate_up GEMV is reported with its SwiGLU)
    assert {"linear_swiglu 1024x256", "linear 256x512", "linear 248320x256"} <= names, names
    for prof in (decode, prefill):
        assert abs(sum(r["share"] for r in prof) - 1.0) < 1e-6
        assert all(r["calls"] > 0 and r["time_us"] > 0 for r in prof)
    # the prefill chunk runs 16 tokens through each linear layer: more bytes of activations
    lin = {r["op"]: r for r in decode}["linear 256x512"], {r["op"]: r for r in prefill}["linear 256x512"]
    assert lin[1]["bytes"] > lin[0]["bytes"] and lin[0]["calls"] == lin[1]["calls"] == 4
    text = capsys.readouterr().out
    assert "One decode step by op" in text and "16-token prefill chunk" in text
    assert "The timed decode step took" in text
    assert "ninfer_nb" in text and "of limit" in text


def test_bench_peer_runs_transformers_on_the_preset(tmp_path: Path) -> None:
    """`--peer hf` with a preset: transformers builds the preset's shapes (random init) in a
    subprocess before ours loads, is timed the same way, and each row gets its ratio."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prompt-len", "24",
               "--gen", "5", "--peer", "hf", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    ours, peer = rows
    assert ours["engine"] == "ninfer_nb" and peer["engine"] == "transformers"
    assert peer["prompt_tokens"] == 24 and peer["generated"] == 5
    assert peer["decode_tok_s"] > 0 and peer["prefill_tok_s"] > 0
    assert ours["decode_vs_peer"] == ours["decode_tok_s"] / peer["decode_tok_s"]


def test_bench_experimental_kernels_need_cuda_and_known_names(monkeypatch) -> None:
    """`--experimental` turns on unvalidated CUDA kernels by name: a name the engine does not
    know stops bench before the model loads, and a known one (a stand-in table here, so the
    test does not follow which kernels are on trial) stops it on the CPU backend, each with a
    message instead of silently ignoring it."""
    import pytest

    from ninfer_nb.ops import cuda as cuda_ops

    argv = ["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prompt-len", "8", "--gen", "2",
            "--experimental"]
    monkeypatch.setattr(cuda_ops, "EXPERIMENTAL", {})
    with pytest.raises(SystemExit, match=r"unknown kernel name\(s\) \['no_such_kernel'\] "
                                         r"\(ops/cuda.py EXPERIMENTAL: none at present\)"):
        main(argv + ["no_such_kernel"])
    monkeypatch.setitem(cuda_ops.EXPERIMENTAL, "trial_kernel", "a kernel on trial")
    with pytest.raises(SystemExit, match=r"unknown kernel name\(s\) \['no_such_kernel'\] "
                                         r"\(ops/cuda.py EXPERIMENTAL: trial_kernel\)"):
        main(argv + ["trial_kernel,no_such_kernel"])
    with pytest.raises(SystemExit, match="--experimental / --decode-attention need the CUDA backend"):
        main(argv + ["trial_kernel"])
    with pytest.raises(SystemExit, match="--experimental / --decode-attention need the CUDA backend"):
        main(argv[:-1] + ["--decode-attention", "simt"])


def test_bench_concurrency_levels(tmp_path: Path, capsys) -> None:
    """`bench --concurrency 1,3`: one row per level; with three requests the engine ran rounds
    of three rows and each request got its tokens."""
    out = tmp_path / "conc.json"
    rc = main(["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prompt-len", "12",
               "--gen", "5", "--concurrency", "1,3", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["concurrency"]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["aggregate_decode_tok_s"] > 0 and r["per_request_decode_tok_s"] > 0
        assert 0 < r["ttft_mean_s"] <= r["ttft_max_s"] and r["gen_tokens"] == 5
    assert rows[0]["max_batch"] == 1 and rows[1]["max_batch"] == 3
    assert "aggregate t/s" in capsys.readouterr().out


def test_bench_max_context_shorter_than_the_run_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "--random", "tiny-qwen3.5", "--device", "cpu", "--prompt-len", "24", "--gen", "8",
              "--max-context", "31"])
    assert e.value.code == 2 and "--max-context 31 is shorter" in capsys.readouterr().err


def test_arena_used_counts_the_scratch_at_its_high_water_mark() -> None:
    """bench's peak column: the arena's high-water mark, with the scratch region (carved whole at
    start) counted at what its steps really took."""
    from ninfer_nb.bench import arena_used
    from ninfer_nb.runtime.arena import Arena

    arena = Arena(0, 1 << 20)
    scratch = arena.carve(64 << 10)                   # 64 KiB reserved, as the backend does at start
    arena.alloc(1000)                                 # a weight: 1024 B (256-byte aligned)
    scratch.alloc(3000)                               # one step's scratch: 3072 B
    scratch.reset()
    scratch.alloc(100)                                # a smaller step later: the mark stays
    arena.alloc(5000)                                 # the KV cache: 5120 B
    assert arena_used(arena, scratch) == 1024 + 3072 + 5120


@pytest.mark.gpu
def test_bench_peak_memory_on_cuda(tmp_path: Path, capsys) -> None:
    """The peak column on the GPU: the arena's used bytes hold the weights and the KV cache for the
    whole --max-context, the scratch counts at its high-water mark (not its reserved quarter of
    the arena), and the memory outside the arena (the CUDA context at least) is added."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "--random", "tiny-qwen3.5", "--device", "cuda", "--weights", "int4-g64", "--prompt-len", "64",
               "--gen", "4", "--repeat", "1", "--max-context", "4096", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["max_context"] == 4096 and report["kv_cache"] == "bf16"
    m = report["rows"][0]["device_memory"]
    kv = 1 * 2 * 2 * 64 * 4096 * 2              # 1 attention layer, K and V, 2 KV heads of 64, bf16
    assert m["weights"] > 100 << 20                                     # the bf16 embedding alone: 127 MB
    assert m["weights"] + kv <= m["arena_used"] < m["weights"] + (512 << 20)
    assert 0 < m["scratch_peak"] < 256 << 20
    assert 0 < m["outside_arena"] and m["peak"] == m["arena_used"] + m["outside_arena"] < m["device_total"]
    assert report["rows"][0]["peak_device_bytes"] == m["peak"]
    assert "peak GiB" in capsys.readouterr().out
