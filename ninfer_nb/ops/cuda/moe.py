"""Mixture-of-experts on the GPU (kernels/moe/): the router (fused with the norm for one token),
per-pair decode experts, prefill grouped by expert, and the rules that pick among them."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_nb.errors import UnsupportedModelError
from ninfer_nb.kernels.linear import gemm_mma as K_mma
from ninfer_nb.kernels.moe import moe as K_moe
from ninfer_nb.kernels.moe import moe_grouped as K_moeg
from ninfer_nb.kernels.moe import moe_pipelined as K_moep
from ninfer_nb.kernels.moe import moe_rows as K_moer
from ninfer_nb.kernels.moe import moe_wgmma as K_moew
from ninfer_nb.models.weights import DenseWeight, QuantizedWeight
from ninfer_nb.quant.tiled import TILE_ROWS, is_tiled

from .launch import SIM, _need, _ptr, _rows
from .linear import LinearOps
from .norm import Normed
from .records import dense

# The most blocks a launch has along grid y (the quantized MoE's routed pairs per launch).
MAX_GRID_Y = 65535
# Prefill MoE on the pipelined GEMMs (kernels/moe/moe_wgmma.py on cc 9.0, else moe_pipelined.py)
# from this many routed pairs (T * k) up; fewer keep moe_grouped.py's GEMMs (fewer launches).
MOE_PIPELINED_MIN_PAIRS = 1024
# MoE decode expert kernels with more loads in flight per lane (kernels/moe/moe.py), for up
# to this many tokens; batches keep the plain pair (faster there).
MOE_UNROLLED_MAX_T = 1
# MoE for MOE_UNROLLED_MAX_T + 1 .. GROUPED_MIN_T - 1 tokens grouped by expert on the tensor cores
# (kernels/moe/moe_rows.py) instead of the per-pair kernels.
MOE_ROWS = True
MOE_ROWS_WARPS = 4        # warps per block of its gate_up / down kernels (1 in the simulator)
# The decode router as one thread-block cluster (kernels/moe/moe.py moe_router_cluster_kernel,
# cc >= 9.0, up to 256 routed experts) instead of the arrival-counter kernel.
ROUTER_CLUSTER = True


def _expert_stacks(gate_up: Any, down: Any) -> tuple[DenseWeight, DenseWeight]:
    """The expert stacks' dense records; the expert kernels read bf16 only."""
    gu, dn = dense(gate_up, "moe_experts"), dense(down, "moe_experts")
    _need(gu.dtype == "bf16" and dn.dtype == "bf16", "moe_experts: expert weights must be bf16")
    return gu, dn


def _quant_stacks(gate_up: Any, down: Any) -> bool:
    """True for quantized expert stacks in the tiled layout the MoE gemv_tiled builds read
    (gate_up [E, 2I, H] with I % 16 == 0); other quantized stacks are refused."""
    if not (isinstance(gate_up, QuantizedWeight) or isinstance(down, QuantizedWeight)):
        return False
    ok = all(isinstance(w, QuantizedWeight) and is_tiled(w.format) and w.ndim == 3 for w in (gate_up, down))
    if not ok or gate_up.shape[-2] % (2 * TILE_ROWS):
        raise UnsupportedModelError(f"moe_experts: no CUDA kernel for expert stacks "
                                    f"{getattr(gate_up, 'format', None)} / {getattr(down, 'format', None)}")
    return True


class MoeOps(LinearOps):
    def moe_router(self, x: Any, weight: Any, top_k: int, renormalize: bool = True,
                   shared_slot: bool = False) -> tuple[Any, Any]:
        """moe_route(linear(x, weight), ...); for one token of a `Normed` input and a bf16
        router: one kernel (`_moe_router_fused`)."""
        w = dense(weight, "moe_router")
        if self._router_fusable(x, w, top_k, shared_slot):
            return self._moe_router_fused(x, w.data, top_k, renormalize, shared_slot)[:2]
        return self.moe_route(self.linear(x, w), top_k, renormalize, shared_slot)

    def moe(self, x: Any, router: Any, top_k: int, renormalize: bool, shared_slot: bool, gate_up: Any,
            down: Any, residual: Any = None) -> Any:
        """moe_experts(x, *moe_router(x, router, ...), gate_up, down, residual): the routed
        experts (with the shared one, when it is a slot). One token of a `Normed` input: the
        fused router also writes the normed row, which the expert kernels read as plain x."""
        r = dense(router, "moe")
        if _quant_stacks(gate_up, down):
            if self._router_fusable(x, r, top_k, shared_slot):
                ids, w, xn = self._moe_router_fused(x, r.data, top_k, renormalize, shared_slot)
                return self._moe_quant(xn, ids, w, gate_up, down, residual)
            ids, w = self.moe_router(x, r, top_k, renormalize, shared_slot)
            return self._moe_quant(self.plain(x), ids, w, gate_up, down, residual)
        gu, dn = _expert_stacks(gate_up, down)
        gate_up, down = gu.data, dn.data
        if self._router_fusable(x, r, top_k, shared_slot):
            hid = r.shape[1]
            inter = gate_up.shape[1] // 2
            if (shared_slot and MOE_UNROLLED_MAX_T >= 1 and hid % (256 * K_moe.MOE_WIDE_GU) == 0
                    and inter % 256 == 0 and _ptr(gate_up) % 16 == 0 and _ptr(down) % 16 == 0):
                # decode, wide experts: the router kernel computes the shared slot's h row too
                h = self.empty((top_k + 1, inter))                       # [k + 1, I]
                ids, w, xn = self._moe_router_fused(x, r.data, top_k, renormalize, shared_slot, gate_up, h)
                w8 = K_moe.MOE_WARPS
                self._go(K_moe.moe_gate_up_wide_kernel, ((inter + w8 - 1) // w8, top_k), 32 * w8, xn, ids,
                         gate_up, h)
                return self._moe_down_wide(h, ids, w, down, 1, hid, residual)
            ids, w, xn = self._moe_router_fused(x, r.data, top_k, renormalize, shared_slot)
            return self.moe_experts(xn, ids, w, gu, dn, residual)
        ids, w = self.moe_router(x, r, top_k, renormalize, shared_slot)
        return self.moe_experts(x, ids, w, gu, dn, residual)

    def _router_fusable(self, x: Any, w: DenseWeight, top_k: int, shared_slot: bool) -> bool:
        n, k = w.shape
        return (isinstance(x, Normed) and w.dtype == "bf16" and k % 8 == 0 and _ptr(w.data) % 16 == 0
                and n - int(shared_slot) <= K_moe.ROUTE_MAX_E and 0 < top_k < K_moe.MAX_TOPK)

    def _moe_router_fused(self, x: Any, weight: Any, top_k: int, renormalize: bool, shared_slot: bool,
                          gate_up: Any = None, h: Any = None) -> tuple[Any, Any, Any]:
        """(ids, weights, the normed row xn [1, H]) from one launch of the norm, the router GEMV
        and the top-k: kernels/moe/moe.py moe_router_cluster_kernel (cc >= 9.0, E <= 256; the logits
        meet in one block's shared memory) or moe_router_fused_kernel (a persistent arrival
        counter; the last block routes). With gate_up and h [k + 1, I]: its extra blocks also
        write the shared slot's row h[k]."""
        n, k = weight.shape
        slots = top_k + int(shared_slot)
        ids = self.empty((1, slots), np.int32)                           # [1, k (+1 shared)]
        w = self.empty((1, slots))
        xn = self.empty((1, k))                                          # [1, H] rms_norm(x) * weight
        n_h = 0 if h is None else h.shape[1]
        if h is None:
            gate_up, h = self._dummy_u16_3(), xn                         # placeholders, never read
        warps = K_moe.ROUTE_BLOCK // 32
        args = (_rows(x.x, k), x.weight, np.float32(x.eps), weight, xn)
        cluster = self._router_cluster(n - int(shared_slot), args, gate_up, h)
        if cluster:
            extra = (n_h + int(shared_slot) + warps - 1) // warps           # shared h rows (+ its gate)
            blocks = cluster * (1 + (extra + cluster - 1) // cluster)
            self._go(K_moe.moe_router_cluster_kernel, blocks, K_moe.ROUTE_BLOCK, *args, np.int32(top_k),
                     np.int32(renormalize), np.int32(shared_slot), np.int32(n_h), ids, w, gate_up, h,
                     cluster=cluster)
            return ids, w, xn
        if self._router_counter is None:          # 0 between launches; the last block resets it
            self._router_counter = self.zeros((1,), np.int32, persistent=True)
        logits = self.empty((n,))                                        # [E (+1)] router logits
        blocks = (n + 2 * warps - 1) // (2 * warps) + (n_h + warps - 1) // warps
        self._go(K_moe.moe_router_fused_kernel, blocks, K_moe.ROUTE_BLOCK, *args, logits, self._router_counter,
                 np.int32(top_k), np.int32(renormalize), np.int32(shared_slot), ids, w, gate_up, h)
        return ids, w, xn

    def _router_cluster(self, n_exp: int, args: tuple[Any, ...], gate_up: Any, h: Any) -> int:
        """The cluster size for moe_router_cluster_kernel (one block per 16 routed experts), or 0:
        the arrival-counter kernel (cc < 9.0, more than ROUTE_CLUSTER_MAX blocks, ROUTER_CLUSTER
        off, or a GPU that cannot hold such a cluster)."""
        rows = K_moe.ROUTE_BLOCK // 32 * 2                               # 2 logits per warp
        c = (n_exp + rows - 1) // rows
        if not ROUTER_CLUSTER or SIM or self.arch is None or self.arch < (9, 0) or c > K_moe.ROUTE_CLUSTER_MAX:
            return 0
        ok = self._cluster_ok.get((K_moe.moe_router_cluster_kernel.name, c))
        if ok is None:
            probe = args + (np.int32(1), np.int32(1), np.int32(0), np.int32(0), self.empty((1, 1), np.int32),
                            self.empty((1, 1)), gate_up, h)
            ok = self._cluster_fits(K_moe.moe_router_cluster_kernel, probe, c, K_moe.ROUTE_BLOCK, c)
        return c if ok else 0

    def _dummy_u16_3(self) -> Any:
        return self.empty((1, 1, 8), np.uint16)                          # a typed placeholder

    def moe_route(self, logits: Any, top_k: int, renormalize: bool = True,
                  shared_slot: bool = False) -> tuple[Any, Any]:
        t, cols = logits.shape
        n_exp = cols - int(shared_slot)
        _need(0 < top_k <= min(K_moe.MAX_TOPK - 1, n_exp), f"moe_route: top_k must be in 1..{K_moe.MAX_TOPK - 1}")
        _need(n_exp <= K_moe.ROUTE_MAX_E, f"moe_route: at most {K_moe.ROUTE_MAX_E} experts")
        slots = top_k + int(shared_slot)
        ids = self.empty((t, slots), np.int32)                            # [T, k (+1 shared)]
        w = self.empty((t, slots))
        if t:
            threads = 32                                                 # a power of two, <= E
            while threads < min(n_exp, K_moe.ROUTE_BLOCK):
                threads *= 2
            self._go(K_moe.moe_route_kernel, t, threads, logits, np.int32(top_k), np.int32(renormalize),
                     np.int32(shared_slot), ids, w)
        return ids, w

    def moe_experts(self, x: Any, ids: Any, weights: Any, gate_up: Any, down: Any,
                    residual: Any = None) -> Any:
        """The routed experts' sum [T, H]; with `residual`: residual += it, in place (one
        token: the down kernel adds into the residual stream as it writes)."""
        if _quant_stacks(gate_up, down):
            return self._moe_quant(self.plain(x), ids, weights, gate_up, down, residual)
        gu, dn = _expert_stacks(gate_up, down)
        gate_up, down = gu.data, dn.data
        x = self.plain(x)
        t, hid = x.shape
        top_k = ids.shape[1]
        inter = gate_up.shape[1] // 2
        if t == 0:
            return self.empty((t, hid)) if residual is None else residual
        if SIM or t >= K_moeg.GROUPED_MIN_T:     # prefill: grouped by expert (the simulator: always)
            out = self.empty((t, hid))
            self._moe_experts_grouped(x, ids, weights, gate_up, down, out)
            return out if residual is None else self.add_into(residual, out)
        if MOE_ROWS and MOE_UNROLLED_MAX_T < t and self._rows_fit(x, ids.shape[1], gate_up, down):
            return self._moe_experts_rows(x, ids, weights, gate_up, down, residual)
        h = self.empty((t * top_k, inter))                               # [T*k, I]
        vec = np.int32(hid % 8 == 0 and inter % 8 == 0 and all(_ptr(a) % 16 == 0 for a in (x, gate_up, down, h)))
        w8 = K_moe.MOE_WARPS
        if t <= MOE_UNROLLED_MAX_T and vec and hid % (256 * K_moe.MOE_UNROLL) == 0 and inter % 256 == 0:
            gate_up_kernel = (K_moe.moe_gate_up_wide_kernel if hid % (256 * K_moe.MOE_WIDE_GU) == 0
                              else K_moe.moe_gate_up_unrolled_kernel)
            self._go(gate_up_kernel, ((inter + w8 - 1) // w8, t * top_k), 32 * w8, x, ids, gate_up, h)
            return self._moe_down_wide(h, ids, weights, down, t, hid, residual)
        out = self.empty((t, hid))
        self._go(K_moe.moe_gate_up_kernel, ((inter + w8 - 1) // w8, t * top_k), 32 * w8, x, ids, gate_up, h, vec)
        self._go(K_moe.moe_down_kernel, ((hid + w8 - 1) // w8, t), 32 * w8, h, ids, weights, down, out, vec)
        return out if residual is None else self.add_into(residual, out)

    def _moe_quant(self, x: Any, ids: Any, weights: Any, gate_up: QuantizedWeight, down: QuantizedWeight,
                   residual: Any) -> Any:
        """Routed experts on tiled quantized stacks (quant/tiled.py), any number of tokens: one
        gemv_tiled "gate_up" launch (silu(gate) * up of every routed pair, h [T * k, I]) and one
        "down" launch (each token's slots' down rows times h, weighted, summed, plus the
        residual as the bias, written over it)."""
        t, hid = x.shape
        top_k = ids.shape[1]
        inter = gate_up.shape[-2] // 2
        _need(down.shape[-1] == inter and down.shape[-2] == hid and gate_up.shape[-1] == hid,
              f"moe_experts: stacks {gate_up.shape} / {down.shape} vs x {x.shape}")
        if t == 0:
            return self.empty((t, hid)) if residual is None else residual
        out = self.empty((t, hid)) if residual is None else _rows(residual, hid)
        x2 = _rows(x, hid)
        step = MAX_GRID_Y // top_k                  # tokens per launch pair: grid y holds T * k pairs
        for t0 in range(0, t, step):
            t1 = min(t, t0 + step)
            n = t1 - t0
            ids_c, w_c, out_c = ids[t0:t1], weights[t0:t1], out[t0:t1]
            with self.scope():
                h = self.empty((n * top_k, inter))                       # [n*k, I]
                self._tiled_gemv("swiglu", x2[t0:t1], x2.reshape(-1), 1.0, gate_up, None, h, ids=ids_c, ew=w_c,
                                 experts="gate_up", grid_y=n * top_k)
                bias = out_c.reshape(-1) if residual is not None else None
                self._tiled_gemv("plain", h.reshape(n, top_k * inter), h.reshape(-1), 1.0, down, bias, out_c,
                                 ids=ids_c, ew=w_c, experts="down", grid_y=n)
        return out if residual is None else residual

    def _rows_fit(self, x: Any, n_slots: int, gate_up: Any, down: Any) -> bool:
        """Whether kernels/moe/moe_rows.py takes these shapes."""
        hid = x.shape[1]
        n_exp, two_i, _ = gate_up.shape
        inter = two_i // 2
        w = 1 if SIM else MOE_ROWS_WARPS
        return (x.shape[0] * n_slots <= K_moer.MAX_PAIRS and n_exp <= K_moer.MAX_EXPERTS
                and hid % (32 * K_moer.GU_UNROLL * w) == 0 and hid % 16 == 0 and inter % 16 == 0
                and inter % (32 * K_moer.DN_UNROLL) == 0 and all(_ptr(a) % 16 == 0 for a in (x, gate_up, down)))

    def _moe_experts_rows(self, x: Any, ids: Any, weights: Any, gate_up: Any, down: Any, residual: Any) -> Any:
        """Routed experts grouped by expert for a few tokens (kernels/moe/moe_rows.py): the sort
        and x's bf16 hi / lo halves, gate_up + SwiGLU and down MMAs over each touched expert's
        rows, the slot-ordered combine (+= residual)."""
        t, hid = x.shape
        n_slots = ids.shape[1]
        n_exp = gate_up.shape[0]
        inter = gate_up.shape[1] // 2
        n_pairs = t * n_slots
        n_it = K_moer.max_items(n_pairs, n_exp)
        w = 1 if SIM else MOE_ROWS_WARPS
        out = self.empty((t, hid)) if residual is None else _rows(residual, hid)
        with self.scope():
            items = self.empty((n_it, 3), np.int32)                      # [items, (expert, row, rows)]
            order = self.empty((n_pairs,), np.int32)                     # [P] pair ids, expert-sorted
            n_items = self.empty((1,), np.int32)
            xhi = self.empty((t, hid), np.uint16)                        # [T, H] bf16 hi / lo of x
            xlo = self.empty((t, hid), np.uint16)
            hhi = self.empty((n_pairs, inter), np.uint16)                # [P, I] bf16 hi / lo of h, sorted
            hlo = self.empty((n_pairs, inter), np.uint16)
            y = self.empty((n_pairs, hid))                               # [P, H] weighted rows, pair order
            pt = K_moer.PREP_THREADS
            self._go(K_moer.moe_rows_prep_kernel, 1 + (t * hid // 8 + pt - 1) // pt, pt, ids, x, np.int32(n_exp),
                     items, order, n_items, xhi, xlo)
            self._go(K_moer.moe_rows_gate_up_kernel, (inter // 16, n_it), 32 * w, xhi, xlo, gate_up, items, order,
                     n_items, np.int32(n_slots), hhi, hlo)
            self._go(K_moer.moe_rows_down_kernel, ((hid + 16 * w - 1) // (16 * w), n_it), 32 * w, hhi, hlo, down,
                     items, order, n_items, weights.reshape(-1), y)
            ct = K_moer.COMBINE_THREADS
            self._go(K_moer.moe_rows_combine_kernel, ((hid + ct - 1) // ct, t), ct, y, ids, np.int32(n_exp), out,
                     np.int32(residual is not None))
        return out if residual is None else residual

    def _moe_down_wide(self, h: Any, ids: Any, weights: Any, down: Any, t: int, hid: int, residual: Any) -> Any:
        out = self.empty((t, hid)) if residual is None else _rows(residual, hid)
        w8 = K_moe.MOE_WARPS
        self._go(K_moe.moe_down_wide_kernel, ((hid + w8 - 1) // w8, t), 32 * w8, h, ids, weights, down, out,
                 np.int32(residual is not None))
        return out if residual is None else residual

    def _moe_experts_grouped(self, x: Any, ids: Any, weights: Any, gate_up: Any, down: Any, out: Any) -> None:
        """Prefill MoE grouped by expert (kernels/moe/moe_grouped.py): device-side sort of the
        (token, slot) pairs by expert, SwiGLU and down tensor-core GEMMs over each expert's rows
        (each expert's weights read once per 64-row tile; x and h rounded to bf16 as MMA
        operands, fp32 accumulate), slot-ordered combine into out [T, H]. From
        MOE_PIPELINED_MIN_PAIRS routed pairs the GEMMs are moe_wgmma's (cc 9.0: 64-row wgmma
        tiles, SwiGLU epilogue) or moe_pipelined's (elsewhere).
        Its scratch is handed back to the arena before returning (only `out` lives on); later
        kernels on the same stream are ordered after the combine, so reuse is safe."""
        t, hid = x.shape
        top_k = ids.shape[1]
        n_exp = gate_up.shape[0]
        inter = gate_up.shape[1] // 2
        n_pairs = t * top_k
        _need(hid % 2 == 0 and inter % 2 == 0, "moe_experts (grouped): H and I must be even (bf16x2 words)")
        n_chunks = (n_pairs + K_moeg.SORT_CHUNK - 1) // K_moeg.SORT_CHUNK
        n_tiles = K_moeg.max_row_tiles(n_pairs, n_exp)                   # grid bound, no host sync
        with self.scope():
            ids_f = ids.reshape(-1)                                          # [P = T*k] pair p = t*k + s
            hist = self.empty((n_chunks, n_exp), np.int32)                   # [C, E] counts -> chunk bases
            offs = self.empty((n_exp + 1,), np.int32)                        # [E+1] row offsets
            tile_off = self.empty((n_exp + 1,), np.int32)                    # [E+1] row-tile offsets
            order = self.empty((n_pairs,), np.int32)                         # [P] pair ids, expert-sorted
            h = self.empty((n_pairs, inter), np.uint16)                      # [P, I] bf16 SwiGLU rows, sorted
            y = self.empty((n_pairs, hid))                                   # [P, H] weighted rows, pair order
            self._go(K_moeg.moe_hist_kernel, n_chunks, K_moeg.SORT_THREADS, ids_f, hist)
            self._go(K_moeg.moe_scan_kernel, 1, K_moeg.SORT_THREADS, hist, offs, tile_off)
            self._go(K_moeg.moe_scatter_kernel, n_chunks, K_moeg.SORT_THREADS, ids_f, hist, offs, order)
            aligned = all(_ptr(a) % 16 == 0 for a in (x, gate_up, down))
            if (n_pairs >= MOE_PIPELINED_MIN_PAIRS and not SIM and self.use_wgmma and aligned
                    and hid % K_moew.K_ALIGN == 0 and inter % K_moew.K_ALIGN == 0):
                xb = self._bf16_copy(x)
                self._go(K_moew.moe_wgmma_gate_up_kernel, (inter // K_moew.BN_GU, n_tiles), K_moew.THREADS,
                         xb, gate_up, offs, tile_off, order, np.int32(top_k), h, smem=K_moew.SMEM_BYTES)
                self._go(K_moew.moe_wgmma_down_kernel, ((hid + K_moew.BN - 1) // K_moew.BN, n_tiles),
                         K_moew.THREADS, h, down, offs, tile_off, order, weights.reshape(-1), y,
                         smem=K_moew.SMEM_BYTES)
                ct = K_moeg.COMBINE_THREADS
                self._go(K_moeg.moe_combine_kernel, ((hid + ct - 1) // ct, t), ct, y, ids_f, np.int32(n_exp), out)
                return
            if (n_pairs >= MOE_PIPELINED_MIN_PAIRS and not SIM and hid % K_mma.BK == 0
                    and inter % K_mma.BK == 0 and aligned):
                self._moe_pipelined(x, order, offs, weights, gate_up, down, h, y, top_k)
                ct = K_moeg.COMBINE_THREADS
                self._go(K_moeg.moe_combine_kernel, ((hid + ct - 1) // ct, t), ct, y, ids_f, np.int32(n_exp), out)
                return
            bn = K_moeg.BN_GU
            self._go(K_moeg.moe_grouped_gate_up_kernel, ((inter + bn - 1) // bn, n_tiles), K_moeg.THREADS,
                     x, order, offs, tile_off, gate_up, h, np.int32(top_k))
            bn = K_moeg.BN_DN
            self._go(K_moeg.moe_grouped_down_kernel, ((hid + bn - 1) // bn, n_tiles), K_moeg.THREADS,
                     h, order, offs, tile_off, weights.reshape(-1), down, y)
            ct = K_moeg.COMBINE_THREADS
            self._go(K_moeg.moe_combine_kernel, ((hid + ct - 1) // ct, t), ct, y, ids_f, np.int32(n_exp), out)

    def _moe_pipelined(self, x: Any, order: Any, offs: Any, weights: Any, gate_up: Any, down: Any, h: Any,
                       y: Any, top_k: int) -> None:
        """Steps 1-5 of kernels/moe/moe_pipelined.py: 128-row tile offsets, the gathered bf16 rows,
        gate_up GEMM, SwiGLU to bf16 h, down GEMM scattered to pair rows y (scaled)."""
        n_pairs, hid = y.shape
        n_exp = gate_up.shape[0]
        inter = gate_up.shape[1] // 2
        tile_off = self.empty((n_exp + 1,), np.int32)                    # [E+1] 128-row tile offsets
        xs = self.empty((n_pairs, hid), np.uint16)                       # [P, H] bf16 rows, expert-sorted
        g = self.empty((n_pairs, 2 * inter))                             # [P, 2I] gate | up, fp32
        n_tiles = K_moep.max_row_tiles(n_pairs, n_exp)                   # grid bound, no host sync
        wts = weights.reshape(-1)
        self._go(K_moep.moe_tile_offsets_kernel, 1, 32, offs, tile_off)
        self._go(K_moep.moe_gather_bf16_kernel, n_pairs, K_moep.GATHER_THREADS, x, order, np.int32(top_k), xs)
        self._go(K_moep.moe_mma_grouped_kernel, ((2 * inter + K_mma.BN - 1) // K_mma.BN, n_tiles), K_mma.THREADS,
                 xs, gate_up, offs, tile_off, order, wts, np.int32(0), g)
        st = K_moep.SWIGLU_THREADS
        self._go(K_moep.moe_swiglu_bf16_kernel, max(1, min(K_moep.SWIGLU_MAX_BLOCKS, (n_pairs * inter + st - 1) // st)),
                 st, g, h)
        self._go(K_moep.moe_mma_grouped_kernel, ((hid + K_mma.BN - 1) // K_mma.BN, n_tiles), K_mma.THREADS,
                 h, down, offs, tile_off, order, wts, np.int32(1), y)

