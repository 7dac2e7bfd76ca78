"""Run a checkpoint through the decoder on the GPU, checking every op against ops.cpu on the
same inputs; prints the first ops whose outputs (or updated states) disagree.
    python dev/opcheck.py CHECKPOINT_DIR [n_tokens]"""
from __future__ import annotations

import sys

import numpy as np

from ninfer_nb.engine.batch import ForwardBatch
from ninfer_nb.engine.cuda_backend import CudaBackend
from ninfer_nb.models import Decoder, build_weights
from ninfer_nb.models.loader import load_checkpoint
from ninfer_nb.models.state import new_state
from ninfer_nb.models.weights import LINEAR_TYPES
from ninfer_nb.ops import cpu
from ninfer_nb.runtime.tensor import Tensor

INPLACE = {"kv_store": (0, 1), "causal_conv1d": (1,), "gated_delta_rule": (5,), "gated_delta_rule_chunked": (5,),
           "gated_delta_rule_raw_gates": (7,), "gdn_decode": (4, 8)}


class CheckedOps:
    def __init__(self, gpu: object, host) -> None:
        self.gpu, self.host, self.report = gpu, host, []

    def __getattr__(self, name: str):
        gfn, cfn = getattr(self.gpu, name), getattr(cpu, name)

        def run(*args):
            hargs = [self.host(a) if isinstance(a, Tensor)
                     else a.map_arrays(self.host) if isinstance(a, LINEAR_TYPES) else a for a in args]
            if name in ("embedding",):
                hargs = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype.kind == "V" else a for a in hargs]
            ref = cfn(*[a.copy() if isinstance(a, np.ndarray) else a for a in hargs]) if name not in INPLACE else None
            if name in INPLACE:
                hcopy = [a.copy() if isinstance(a, np.ndarray) else a for a in hargs]
                ref = cfn(*hcopy)
            out = gfn(*args)
            outs = out if isinstance(out, tuple) else (out,)
            refs = ref if isinstance(ref, tuple) else (ref,)
            errs = []
            for o, r in zip(outs, refs):
                if o is None or r is None:
                    continue
                o = self.host(o).astype(np.float32)
                r = np.asarray(r, dtype=np.float32)
                errs.append(float(np.abs(o - r).max() / (np.abs(r).max() + 1e-12)))
            for idx in INPLACE.get(name, ()):
                g = self.host(args[idx]).astype(np.float32)
                errs.append(float(np.abs(g - hcopy[idx]).max() / (np.abs(hcopy[idx]).max() + 1e-12)))
            self.report.append((name, [a.shape for a in args if hasattr(a, "shape")], max(errs) if errs else 0.0))
            return out
        return run


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
    ck = load_checkpoint(path)
    be = CudaBackend(0)
    w = be.upload(build_weights(ck.config, ck.weights, ck.source))
    dec = Decoder(ck.config, w)
    ops = CheckedOps(be.ops, lambda t: be.to_host(t))
    st = new_state(ck.config, 64, be.zeros)
    ids = np.random.default_rng(0).integers(0, 240000, n).tolist()
    be.begin_step()
    i, p = be.ids(ids, 0)
    dec.forward(ops, ForwardBatch.single(i, p), st)
    bad = [r for r in ops.report if r[2] > 1e-3]
    for name, shapes, err in (bad or ops.report)[:25]:
        print(f"{name:28s} err {err:.2e}  {shapes}")
    print("ops:", len(ops.report), "bad:", len(bad))


if __name__ == "__main__":
    main()
