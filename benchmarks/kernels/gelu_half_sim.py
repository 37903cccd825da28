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

A second form keeps one ulp (item 21): P(a) = -1 + k2 a² + k1 a + q(u), the quadratic in fp32 (two
FMAs), q a degree-7 polynomial in float16 on u = min(a, 8) / 4 - 1/2 (its coefficients rounded to
float16 one at a time from the top, the rest refitted), the -1 an exponent decrement of the
result. Built, it made the FFN-in GEMM slower (gelu-forms-h100.txt).
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


def fit_hybrid(amax=8.0, degree=7):
    """The second form's fp32 k2, k1 and float16 coefficients of q (highest degree first)."""
    a = (amax / 2) * (1 - np.cos(np.linspace(0.0, np.pi, 20001)))
    target = log_ndtr(-a) / np.log(2.0) + 1.0
    k2, k1, _ = np.polyfit(a, target, 2)
    k2, k1 = F32(k2), F32(k1)
    rest = target - (F64(k2) * a * a + F64(k1) * a)
    u = hybrid_u(a.astype(F32), amax).astype(F64)
    weight = np.where(a < 4.4, 1.0, 0.1)  # float16 outputs are subnormal past a ~ 4.4
    coeffs = []
    for d in range(degree, -1, -1):
        c = np.linalg.lstsq(np.vander(u, d + 1) * weight[:, None], rest * weight, rcond=None)[0][0]
        coeffs.append(F16(c))
        rest = rest - F64(coeffs[-1]) * u**d
    return k2, k1, np.array(coeffs, F16)


def hybrid_u(a, amax):  # min(a, amax) in float16, then a / 4 - 1/2 as one HFMA2
    h = np.minimum(a, F32(amax)).astype(F16)
    return fma(h, np.full_like(h, F16(0.25)), np.full_like(h, F16(-0.5)), F16)


def gelu_hybrid(x, k2, k1, coeffs16, amax=8.0):  # [n] float32 -> float32
    a = np.abs(x)
    q = horner(coeffs16, hybrid_u(a, amax), F16).astype(F32)
    p = fma(fma(np.full_like(a, k2), a, np.full_like(a, k1), F32), a, q, F32)  # log2 Φ(-a) + 1
    phi = (np.exp2(p.astype(F64)) / 2).astype(F32)
    return fma(-a, phi, np.maximum(x, F32(0)), F32)


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
    report("fp32 quadratic + float16 q", gelu_hybrid(x, *fit_hybrid()), exact, x, F16)


if __name__ == "__main__":
    main()
