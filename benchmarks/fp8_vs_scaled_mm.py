"""ftbert's FP8 weight GEMM against torch._scaled_mm on the same e4m3 codes and scales, and both
against the float64 product of those codes (GPU with FP8: Hopper or later).

  python benchmarks/fp8_vs_scaled_mm.py [--draws 40] [--shapes 33x1536x384,3x4352x64,7x384x1536]

Each draw is the FP8 product test's operands (tests/cuda/test_fp8.py): rows of N(0, 1) plus an
offset, row 0 twenty times the others; a weight of N(0, 0.05) with an all-zero channel and a
channel thirty times the others; float16 inputs. Per shape: the largest error of each against the
float64 product, over the sum of the terms' magnitudes (what an accumulator's precision bounds),
and the largest difference between the two, over the product.
"""

import argparse

import numpy as np
import torch

from ftbert import _ops


def e4m3_rows(x: torch.Tensor):
    """Rows of x scaled so that their largest magnitude is 448, as e4m3, and their scales."""
    top = x.abs().amax(1, keepdim=True)
    inv = torch.where(top > 0, torch.tensor(448.0) / torch.where(top > 0, top, 1.0), 1.0)
    return (x * inv).clamp(-448, 448).to(torch.float8_e4m3fn), torch.where(top > 0, top / 448.0, 1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--shapes", default="33x1536x384,3x4352x64,7x384x1536", help="m x k x n, comma-separated")
    args = ap.parse_args(argv)
    runner = _ops.OpRunner("cuda")
    runner.quantization = "fp8"
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        ours_err = theirs_err = apart = 0.0
        for seed in range(args.draws):
            rng = np.random.default_rng(seed)
            a = (rng.standard_normal((m, k)) + rng.uniform(-1, 1)).astype(np.float32)
            a[0, :] *= 20
            w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
            w[:, 1] = 0.0
            w[:, 2] *= 30
            ours = runner.weight_gemm("float16", a, w).astype(np.float64)
            qa, sa = e4m3_rows(torch.from_numpy(a).half().float())
            qw, sw = e4m3_rows(torch.from_numpy(w).half().float().T.contiguous())
            scales = sa.double() * sw.double().T
            ref = ((qa.double() @ qw.double().T) * scales).numpy()
            terms = ((qa.double().abs() @ qw.double().abs().T) * scales).numpy().clip(1e-30)
            theirs = torch._scaled_mm(qa.cuda(), qw.cuda().T, scale_a=sa.cuda(), scale_b=sw.cuda().T,
                                      out_dtype=torch.float16).double().cpu().numpy()
            ours_err = max(ours_err, float((np.abs(ours - ref) / terms).max()))
            theirs_err = max(theirs_err, float((np.abs(theirs - ref) / terms).max()))
            apart = max(apart, float((np.abs(ours - theirs) / (np.abs(ref) + 1e-6)).max()))
        print(f"m={m} k={k} n={n}: max |ours-ref|/terms {ours_err:.2e} (2^{np.log2(max(ours_err, 1e-30)):.1f}), "
              f"|torch-ref|/terms {theirs_err:.2e} (2^{np.log2(max(theirs_err, 1e-30)):.1f}), "
              f"|ours-torch|/|ref| {apart:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
