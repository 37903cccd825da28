"""Which weight-GEMM kernels give the batch-invariant reference's bits, at which row counts (GPU).

  python benchmarks/invariant_gemm_classes.py OUT.json

For BERT-base's and MiniLM's four weight GEMMs, float16 and bfloat16: the reference (the one
cuBLASLt algorithm a batch-invariant forward runs under "fixed") computes 16,384 random rows; at
each row count m every candidate of `weight_gemm_candidates` (cuBLAS, cuBLASLt's ranked algorithms
with and without a workspace, the Hopper CUTLASS kernels) computes the first m of them, and a line
names the candidates whose output equals the reference's rows bit for bit. Evidence for
CudaBackend::measure_gemm's class check: only the kernels that split k (or whose own choice does,
cuBLAS's) and CUTLASS's fused GELU (another epilogue) differ. Few rows are weak evidence (a
different order of fp32 sums changes about one 16-bit output in 10^4), which is why the engine
checks candidates on at least 4,096 rows.
"""

import json
import sys

import numpy as np

from ftbert import _ops

SHAPES = {"bert-base": [(2304, 768, "identity"), (768, 768, "identity"), (3072, 768, "gelu"),
                        (768, 3072, "identity")],
          "minilm": [(1152, 384, "identity"), (384, 384, "identity"), (1536, 384, "gelu"),
                     (384, 1536, "identity")]}
ROWS = [1, 7, 64, 128, 300, 1024, 2048, 4096, 8192, 16384]


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    r = _ops.OpRunner("cuda")
    r.set_gemm_choice("fixed")
    results = {}
    for dtype in ("float16", "bfloat16"):
        for model, shapes in SHAPES.items():
            for n, k, act in shapes:
                a = rng.standard_normal((max(ROWS), k)).astype(np.float32)
                w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
                bias = (rng.standard_normal(n) * 0.1).astype(np.float32) if act != "identity" else None
                r.batch_invariant = True
                reference = r.weight_gemm(dtype, a, w, 1, bias, act)
                key = f"{dtype} {model} n={n} k={k} {act}"
                row = {}
                for m in ROWS:
                    am = np.ascontiguousarray(a[:m])
                    r.batch_invariant = True
                    itself = np.array_equal(r.weight_gemm(dtype, am, w, 1, bias, act), reference[:m])
                    r.batch_invariant = False
                    names = r.weight_gemm_candidates(dtype, m, n, k, act)
                    same = [name for name in names
                            if np.array_equal(r.weight_gemm_candidate(name, dtype, am, w, bias=bias, act=act)
                                              .view(np.uint32), reference[:m].view(np.uint32))]
                    row[m] = {"candidates": names, "same": same, "invariant_itself": bool(itself)}
                    print(f"{key} m={m}: invariant_ok={itself} same {len(same)}/{len(names)}: "
                          f"{' '.join(same)}", flush=True)
                results[key] = row
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
