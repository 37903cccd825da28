"""FP8 weights on disk: which tensors are stored as float8 e4m3, and how they are (de)quantized.

The engine's quantization "fp8" (cpp/cuda/gemm/fp8_gemm.cu) keeps a layer weight W [in, out] in
e4m3 when both sides are multiples of 16 (cuBLASLt's FP8 kernels need it; CudaBackend::fp8_weight),
with one float32 scale per output channel (column): s_j = max_p |W[p, j]| / 448, q = W[:, j] * (448
/ max) rounded to nearest e4m3, saturating; an all-zero column gets scale 1. `ftbert convert
--quantization fp8` stores the same quantization (is_fp8, quantize_columns) so that a converted
directory and the engine agree on which tensors are e4m3; both readers hand out q * s in float32
(dequantize), and the engine quantizes those again at load when asked to.
"""

from __future__ import annotations

import torch

from .schema import Tensor, iter_tensors

# e4m3's largest finite magnitude (torch.finfo(torch.float8_e4m3fn).max).
E4M3_MAX = 448.0
# torch's (and the safetensors header reader's) name of the stored element type (safetensors F8_E4M3).
FP8_DTYPE = "float8_e4m3fn"
# A converted file's scale of tensor X is X + SCALE_SUFFIX ("layers.0.qkv_weight_scale"), as
# compressed-tensors names X.weight's "X.weight_scale".
SCALE_SUFFIX = "_scale"
# The engine's only multiple: both sides of an FP8 weight.
FP8_MULTIPLE = 16

def is_fp8(tensor: Tensor) -> bool:
    """Whether the engine keeps `tensor` (a schema.Tensor, [in, out]) in e4m3 under quantization
    "fp8": a matrix that only Backend::weight_gemm multiplies (the engine's own flag, cpp/core/
    weights.cpp) whose two sides are multiples of 16. The one rule for the converter, the reader of
    converted directories and the engine (CudaBackend::fp8_weight)."""
    return (tensor.gemm_weight and len(tensor.shape) == 2
            and all(int(d) % FP8_MULTIPLE == 0 for d in tensor.shape))


def fp8_names(config: dict) -> set[str]:
    """The names of the tensors `config` (an engine config) keeps in e4m3 (is_fp8)."""
    return {t.name for t in iter_tensors(config) if is_fp8(t)}


def quantize_columns(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [in, out] (float32) -> (q [in, out] float8_e4m3fn, scales [out] float32), as the engine
    quantizes at upload: per output channel, scale max|w| / 448 (1 for an all-zero column), q the
    column times 448 / max rounded to nearest e4m3, saturating at +-448."""
    w = w.float()
    top = w.abs().amax(dim=0)
    nonzero = top > 0
    inv = torch.where(nonzero, E4M3_MAX / torch.where(nonzero, top, 1.0), torch.ones_like(top))
    scales = torch.where(nonzero, top / E4M3_MAX, torch.ones_like(top))
    # torch's cast rounds to nearest even but turns values beyond 448 into NaN: clamp first, which
    # is the engine's saturation (__NV_SATFINITE).
    q = (w * inv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.contiguous(), scales.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * scale in float32; the scale broadcasts (per output channel, or one for the tensor)."""
    return q.float() * scale.float()


def bad_scale_count(scale: torch.Tensor) -> int:
    """How many scales are not finite positive numbers (a scale is max|w| / 448, never 0 or less)."""
    s = scale.float()
    return int((~(torch.isfinite(s) & (s > 0))).sum())
