"""The fused flash attention kernels (cpp/cuda/attention/flash.cu, flash_sm90.cu) against a float64
reference.

Its error must stay within 2x the error torch's own scaled_dot_product_attention shows on the GPU
in the same dtype, on the same rounded inputs, against the same reference (plus 1e-4 absolute
slack for outputs near zero). Every row is compared, padded query positions included: only keys
are masked.
"""

import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
_ops = pytest.importorskip("ftbert._ops")
if not _ops.cuda_backend_built():
    pytest.skip("this ftbert build has no CUDA backend", allow_module_level=True)

from tests._util import ragged_mask  # noqa: E402

TORCH_DTYPE = {"float16": torch.float16, "bfloat16": torch.bfloat16}
SLACK = 1e-4


def sdpa_backends():
    """torch's memory-efficient SDPA backend (fused, fp32 accumulation, takes a mask). torch's
    default pick can be cuDNN, which builds a graph per new shape: seconds across this file."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch: its own choice
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@pytest.fixture(params=["default", "portable"], autouse=True)
def flash_kernel(request, monkeypatch):
    """Every test with the default kernel choice (on Hopper, head dims 64 and 128 run the
    warpgroup-MMA kernels of flash_sm90.cu) and again with FTBERT_FLASH_PORTABLE=1 (flash.cu's
    kernel for every head dim), the second only where it changes the kernel: head dims 64, 128."""
    if request.param == "portable":
        callspec = getattr(request.node, "callspec", None)
        if callspec is not None and callspec.params.get("head_dim", 64) not in (64, 128):
            pytest.skip("flash.cu's kernel is the default for this head dim")
        monkeypatch.setenv("FTBERT_FLASH_PORTABLE", "1")
    else:
        monkeypatch.delenv("FTBERT_FLASH_PORTABLE", raising=False)
    return request.param


def rounded(x, dtype):
    """x rounded to `dtype` on the GPU, back as float32 (the values the kernel sees after upload)."""
    return torch.from_numpy(x).cuda().to(TORCH_DTYPE[dtype]).float()


def reference64(qkv, bias, mask, heads, scale):
    """float64 attention on the rounded inputs; bias added in float64, nothing rounded in between."""
    B, S, H3 = qkv.shape
    H = H3 // 3
    d = H // heads
    x = (qkv.double() + bias.double()).view(B, S, 3, heads, d).permute(2, 0, 3, 1, 4)
    q, k, v = x[0], x[1], x[2]  # [B, heads, S, d]
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    keep = mask.view(B, 1, 1, S) != 0
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key -> zeros
    return torch.matmul(p, v).permute(0, 2, 1, 3).reshape(B, S, H)


def torch_sdpa(qkv, bias, mask, heads, scale, dtype):
    """torch's fused attention in `dtype`; q/k/v = round(qkv + bias), as the unfused path has them."""
    B, S, H3 = qkv.shape
    H = H3 // 3
    d = H // heads
    x = (qkv + bias).to(TORCH_DTYPE[dtype]).view(B, S, 3, heads, d).permute(2, 0, 3, 1, 4)
    keep = (mask != 0).view(B, 1, 1, S)
    with sdpa_backends():
        out = torch.nn.functional.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=keep,
                                                               scale=scale)
    return out.permute(0, 2, 1, 3).reshape(B, S, H).double()


def check_against_sdpa_error(gpu, rng, dtype, batch, seq, heads, head_dim, mask, scale=None,
                             spread=1.0):
    H = heads * head_dim
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    qkv = rng.standard_normal((batch, seq, 3 * H), dtype=np.float32) * np.float32(spread)
    bias = rng.standard_normal(3 * H, dtype=np.float32)
    out = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale)
    assert out.shape == (batch, seq, H)
    assert np.isfinite(out).all()

    qkv_r, bias_r = rounded(qkv, dtype), rounded(bias, dtype)
    mask_t = torch.from_numpy(mask).cuda()
    ref = reference64(qkv_r, bias_r, mask_t, heads, scale)
    err = (torch.from_numpy(out).cuda().double() - ref).abs().max().item()
    sdpa_err = (torch_sdpa(qkv_r, bias_r, mask_t, heads, scale, dtype) - ref).abs().max().item()
    assert err <= 2 * sdpa_err + SLACK, (
        f"max abs error {err:.3e} > 2 x torch sdpa's {sdpa_err:.3e} + {SLACK:.0e}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq", [1, 17, 97, 128, 255, 512, 1024])
def test_flash_matches_reference_within_2x_sdpa_error(gpu, rng, dtype, head_dim, seq):
    # Batch 1 unpadded (3 heads), then batch 8 with ragged lengths: 4 sequences padded on the
    # right and 4 on the left, so the first attended key falls anywhere inside a key tile.
    check_against_sdpa_error(gpu, rng, dtype, 1, seq, 3, head_dim,
                             np.ones((1, seq), dtype=np.int32))
    mask = np.concatenate([ragged_mask(rng, 4, seq), ragged_mask(rng, 4, seq, left=True)])
    check_against_sdpa_error(gpu, rng, dtype, 8, seq, 2, head_dim, mask)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("seq", [257, 401])
def test_flash_wide_tiles_on_a_large_grid(gpu, rng, dtype, head_dim, padding, seq):
    # Grids of at least two 128-row blocks per SM take the wide tiles (two mma tiles per warp;
    # on Hopper, the persistent kernel: at head dim 64 with three consumers from 384 tokens);
    # 24 x 12 heads x 3 query tiles covers GPUs of up to 432 SMs.
    batch, heads = 24, 12
    mask = ragged_mask(rng, batch, seq, left=padding == "left")
    check_against_sdpa_error(gpu, rng, dtype, batch, seq, heads, head_dim, mask)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq", [33, 64, 65])
def test_flash_short_sequences_on_a_large_grid(gpu, rng, dtype, head_dim, seq):
    # 48 x 12 heads of one query tile each: on Hopper at head dim 64, sequences of up to 64 keep
    # the one-warpgroup kernel on a grid the persistent kernel takes from 65 on.
    batch, heads = 48, 12
    mask = np.concatenate([ragged_mask(rng, 24, seq), ragged_mask(rng, 24, seq, left=True)])
    check_against_sdpa_error(gpu, rng, dtype, batch, seq, heads, head_dim, mask)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_flash_masks_keys_scattered_inside_a_tile(gpu, rng, dtype, head_dim):
    # Holes in the middle of the sequence: masked keys inside the range the kernel visits.
    batch, seq = 4, 203
    mask = (rng.random((batch, seq)) < 0.6).astype(np.int32)
    mask[np.arange(batch), rng.integers(0, seq, size=batch)] = 1  # at least one key each
    check_against_sdpa_error(gpu, rng, dtype, batch, seq, 2, head_dim, mask)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_flash_peaked_scores_rescale_running_max(gpu, rng, dtype):
    # Scores of spread ~25 make the running max jump between key tiles, so the accumulator is
    # rescaled many times; a wrong rescale shows up as a large error here.
    batch, seq, heads, head_dim = 2, 301, 2, 64
    mask = ragged_mask(rng, batch, seq)
    check_against_sdpa_error(gpu, rng, dtype, batch, seq, heads, head_dim, mask, scale=0.5,
                             spread=2.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_flash_fully_masked_sequence_gives_zeros(gpu, rng, dtype, head_dim):
    batch, seq, heads = 3, 77, 2
    H = heads * head_dim
    scale = 1.0 / math.sqrt(head_dim)
    qkv = rng.standard_normal((batch, seq, 3 * H)).astype(np.float32)
    bias = rng.standard_normal(3 * H).astype(np.float32)
    mask = ragged_mask(rng, batch, seq, left=True)
    mask[1] = 0
    out = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale)
    assert np.isfinite(out).all()
    assert (out[1] == 0).all()
    # The sequences around it are attended as usual.
    keep = [0, 2]
    qkv_r, bias_r = rounded(qkv[keep], dtype), rounded(bias, dtype)
    mask_t = torch.from_numpy(mask[keep]).cuda()
    ref = reference64(qkv_r, bias_r, mask_t, heads, scale)
    err = (torch.from_numpy(out[keep]).cuda().double() - ref).abs().max().item()
    sdpa_err = (torch_sdpa(qkv_r, bias_r, mask_t, heads, scale, dtype) - ref).abs().max().item()
    assert err <= 2 * sdpa_err + SLACK


def test_flash_support_matrix(gpu):
    for dtype in ("float16", "bfloat16"):
        for head_dim in (32, 64, 128):
            assert gpu.supports_attention("flash", dtype, head_dim)
        for head_dim in (16, 48, 80, 96, 256):
            assert not gpu.supports_attention("flash", dtype, head_dim)
            assert gpu.supports_attention("unfused", dtype, head_dim)
    assert not gpu.supports_attention("flash", "float32", 64)
    assert gpu.supports_attention("unfused", "float32", 64)


@pytest.mark.parametrize("dtype,head_dim,names", [("float16", 48, "head dim"),
                                                  ("float32", 64, "float32")])
def test_flash_unsupported_call_raises_naming_the_property(gpu, rng, dtype, head_dim, names):
    heads, seq = 2, 5
    H = heads * head_dim
    qkv = rng.standard_normal((1, seq, 3 * H)).astype(np.float32)
    bias = np.zeros(3 * H, dtype=np.float32)
    mask = np.ones((1, seq), dtype=np.int32)
    with pytest.raises(RuntimeError, match=names):
        gpu.flash_attention(dtype, qkv, bias, mask, heads, 1.0 / math.sqrt(head_dim))
