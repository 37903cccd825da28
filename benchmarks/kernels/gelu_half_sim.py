"""Would the FFN-in epilogue's erf-GELU keep its precision with its polynomial in half precision?

The epilogue (cpp/cuda/gemm/erf_gelu.cuh) computes GELU(x) = max(x, 0) - a Φ(-a), a = |x|, with
Φ(-a) = 2^P(a) and P a degree-7 polynomial evaluated in fp32: 8 FP32 FMAs per element, which on an
H100 cost the tensor cores of the other warpgroup about a cycle each. Packed half-precision FMAs
(HFMA2) cost them nothing (wgmma-overlap-h100.txt), so this simulates the cheaper form -- P in
float16 on u = a / 4 (clamped to 2), the last FMA and the max in fp32 -- and compares both with
float64 erf-GELU, rounded to the output dtype as the kernel does. numpy rounds each simulated
instruction as the GPU would (a fused multiply-add rounds once); ex2's own error is left out
(it only adds).

    python benchmarks/kernels/gelu_half_sim.py

Result (levers-tried-h100.txt, item 14): float16 outputs err by up to 24-34 ulps on the negative
tail (mean 0.75-0.79 ulp against 0.22), where test_fused_gemm_gelu_is_erf_gelu_rounded_once holds
the kernel to one ulp; so it was not built.
"""
import numpy as np
import torch

F16, F32, F64 = np.float16, np.float32, np.float64


def ndtr(x):  # Φ(x), float64
    return torch.special.ndtr(torch.from_numpy(np.asarray(x, F64))).numpy()


def log_ndtr(x):  # log Φ(x), float64, accurate in the tail
    return torch.special.log_ndtr(torch.from_numpy(np.asarray(x, F64))).numpy()


# The kernel's fp32 coefficients of P(a), highest degree first (erf_gelu.cuh).
KERNEL_COEFFS = [-1.8348245021115872e-06, 6.159854819998145e-05, -0.0009305267594754696,
                 0.008507898077368736, -0.053960081189870834, -0.4584643840789795,
                 -1.1512510776519775, -0.9999952912330627]


def fma(p, a, c, dtype):
    """p * a + c rounded once to dtype."""
    return (p.astype(F64) * a.astype(F64) + c.astype(F64)).astype(dtype)


def horner(coeffs, u, dtype):
    p = np.full_like(u, dtype(coeffs[0]))
    for c in coeffs[1:]:
        p = fma(p, u, np.full_like(u, dtype(c)), dtype)
    return p


def gelu_fp32(x):  # [n] float32 -> float32: the kernel today
    a = np.abs(x)
    phi = np.exp2(horner(KERNEL_COEFFS, a, F32).astype(F64)).astype(F32)
    return fma(-a, phi, np.maximum(x, F32(0)), F32)


def gelu_half_poly(x, coeffs16):  # [n] float32 -> float32: P in float16 on u = a / 4
    a = np.abs(x)
    u = np.minimum((a.astype(F16).astype(F64) / 4).astype(F16), F16(2))
    phi = np.exp2(horner(coeffs16, u, F16).astype(F64)).astype(F16).astype(F32)
    return fma(-a, phi, np.maximum(x, F32(0)), F32)


def fit_half(degree):
    """log2 Φ(-a) on [0, 6] in u = a / 4, least squares on Chebyshev points, rounded to float16."""
    a = 3.0 + 3.0 * np.cos(np.linspace(0.0, np.pi, 4001))
    return np.polyfit(a / 4.0, log_ndtr(-a) / np.log(2.0), degree).astype(F16)


def report(name, got, exact, x, out_dtype):
    got = got.astype(out_dtype).astype(F64)
    err = np.abs(got - exact)
    ulp = np.spacing(np.abs(exact).astype(out_dtype)).astype(F64)
    tail = (x < 0) & (np.abs(exact) > 1e-3)
    print(f"  {name:26s} max {np.max(err / ulp):5.1f} ulp  mean {np.mean(err / ulp):.3f} ulp  "
          f"mean abs {err.mean():.2e}  negative tail max rel {np.max(err[tail] / np.abs(exact[tail])):.1e}")


def main():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-12, 12, 2_000_001), 2 * rng.standard_normal(2_000_000)])
    x = x.astype(F32)
    exact = x.astype(F64) * ndtr(x.astype(F64))
    print("float16 outputs against float64 erf-GELU:")
    report("fp32 degree 7 (today)", gelu_fp32(x), exact, x, F16)
    report("exact, rounded once", exact, exact, x, F16)
    for degree in (5, 6, 7):
        report(f"float16 P, degree {degree}", gelu_half_poly(x, fit_half(degree)), exact, x, F16)


if __name__ == "__main__":
    main()
