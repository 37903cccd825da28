"""Padding-free ("packed") execution on the GPU (skipped without one).

Op by op: each CUDA op run packed (the OpRunner packs over its `mask=` argument, or `packed=True`)
against the CPU backend's packed op and against the CUDA op run padded. Data moves (packing, the
scatter back, clearing rows past the tokens, head split/merge) must match exactly; arithmetic to the
usual tolerance (a few units in the last place of the dtype plus float32 noise); flash attention
within twice torch's own SDPA error of a float64 reference, with the default kernel choice and with
FTBERT_FLASH_PORTABLE=1.

Model by model: a CUDA encoder (float32, float16, bfloat16; unfused and flash attention; CUDA graphs
on and off) packed against the same encoder padded, for host inputs, CUDA tensors
(padding_free=True: the token count is read back from the device) and forward_packed; replays of
a token-count bucket's recording against the forward run op by op, with batches of different token
counts in one bucket back to back (the recording's rows past T)."""

import contextlib
import math

import numpy as np
import pytest
import torch

import ftbert
from ftbert.text import forward_packed_batch, pack_sequences
from tests._models import make_bert, make_model, widen_head
from tests._packing import SEQUENCE_MASK_STYLES, compacted, first_positions, pack_reference, sequence_mask
from tests._util import assert_close
# The op tests' dtypes, rounding and tolerance check: one definition for both.
from tests.cuda.test_cuda_ops import DTYPES, FP32_NOISE, TORCH_DTYPE, check, randn, rounded

# no_tf32: the float64 / float32 references computed with torch on the GPU must be true fp32 or better.
pytestmark = [
    pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
    pytest.mark.usefixtures("no_tf32"),
]

HALF = ["float16", "bfloat16"]
SDPA_SLACK = 1e-4
# Packed against padded on one encoder, relative to max(1, max |value|): the bounds of
# tests/cuda/test_cuda_model.py's padding test (one sequence alone against it in a batch).
MODEL_TOL = {"float32": 2e-5, "float16": 1e-2, "bfloat16": 6e-2}


# ---- packing, scatter back, clearing past the tokens -------------------------------------------


@pytest.mark.parametrize("style", SEQUENCE_MASK_STYLES)
@pytest.mark.parametrize("batch,seq", [(1, 1), (1, 31), (4, 1), (5, 13), (33, 33), (7, 64), (3, 65),
                                       (40, 520), (1025, 3), (3000, 5)])
def test_pack_sequences_matches_cpu_exactly(gpu, cpu, rng, style, batch, seq):
    # One block packs: more sequences than warps (33+), than threads (1025, 3000: several lengths
    # per thread in the scan), rows longer than a warp's 32 positions and not a multiple of them.
    mask = sequence_mask(rng, batch, seq, style)
    cu, index = gpu.pack_sequences(mask)
    want_cu, want_index = cpu.pack_sequences(mask)
    np.testing.assert_array_equal(cu, want_cu)
    np.testing.assert_array_equal(index, want_index)
    ref_cu, ref_index = pack_reference(mask)
    np.testing.assert_array_equal(cu, ref_cu)
    np.testing.assert_array_equal(index, ref_index)


@pytest.mark.parametrize("style", SEQUENCE_MASK_STYLES)
@pytest.mark.parametrize("batch,seq", [(1, 1), (5, 13), (33, 33), (40, 520), (3000, 5)])
def test_pack_sequences_first_unattended_matches_cpu(gpu, cpu, rng, style, batch, seq):
    mask = sequence_mask(rng, batch, seq, style)
    want = int((mask[:, 0] == 0).any())
    assert gpu.pack_sequences_first_unattended(mask) == want
    assert cpu.pack_sequences_first_unattended(mask) == want
    one_left = np.ones((batch, seq), np.int32)
    one_left[int(rng.integers(batch)), 0] = 0  # one row among many
    assert gpu.pack_sequences_first_unattended(one_left) == 1
    assert gpu.pack_sequences_first_unattended(np.ones((batch, seq), np.int32)) == 0


@pytest.mark.parametrize("batch,seq", [(3, 4), (1100, 2)])
def test_pack_sequences_all_padding_and_all_tokens(gpu, batch, seq):
    cu, index = gpu.pack_sequences(np.zeros((batch, seq), np.int32))
    assert (cu == 0).all() and (index == -1).all()
    cu, index = gpu.pack_sequences(np.ones((batch, seq), np.int32))
    np.testing.assert_array_equal(cu, np.arange(batch + 1) * seq)
    np.testing.assert_array_equal(index, np.arange(batch * seq))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 2, 3, 8, 13, 64])  # rows of 2 to 256 bytes: every word size
@pytest.mark.parametrize("style", ["right", "left", "inner", "empty_rows", "mixed"])
def test_unpack_rows_matches_cpu_exactly(gpu, cpu, rng, dtype, width, style):
    batch, seq = 6, 37
    mask = sequence_mask(rng, batch, seq, style)
    if not mask.any():
        mask[0, 0] = 1
    packed = randn(rng, (int(mask.sum()), width), dtype, offset=3.0)  # no zeros among the tokens
    got = gpu.unpack_rows(dtype, packed, mask)
    np.testing.assert_array_equal(got, cpu.unpack_rows("float32", packed, mask))
    valid = mask.astype(bool)
    np.testing.assert_array_equal(got[valid], packed)
    assert (got[~valid] == 0).all(), "padding must be zeroed (the output buffer starts as garbage)"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 3, 8, 48])
@pytest.mark.parametrize("extra", ["none", "one", "all"])
def test_clear_rows_past_tokens_matches_cpu_exactly(gpu, cpu, rng, dtype, width, extra):
    batch, seq = 5, 29
    mask = sequence_mask(rng, batch, seq, "mixed")
    mask[0, 0] = 1
    tokens = int(mask.sum())
    rows = {"none": tokens, "one": min(tokens + 1, batch * seq), "all": batch * seq}[extra]
    x = randn(rng, (rows, width), dtype, offset=5.0)
    got = gpu.clear_rows_past_tokens(dtype, x, mask)
    np.testing.assert_array_equal(got, cpu.clear_rows_past_tokens("float32", x, mask))
    np.testing.assert_array_equal(got[:tokens], x[:tokens])
    assert (got[tokens:] == 0).all()


# ---- embeddings, head split/merge, softmax, first-token dense -----------------------------------


def embedding_tables(rng, dtype, vocab, positions, types, hidden):
    word = randn(rng, (vocab, hidden), dtype, 0.5)
    pos = randn(rng, (positions, hidden), dtype, 0.5)
    typ = randn(rng, (types, hidden), dtype, 0.5, offset=0.3)
    gamma = randn(rng, hidden, dtype, 0.3, offset=1.0)
    beta = randn(rng, hidden, dtype, 0.2)
    return word, pos, typ, gamma, beta


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", SEQUENCE_MASK_STYLES)
@pytest.mark.parametrize("batch,seq,hidden", [(1, 1, 32), (3, 13, 48), (4, 97, 336), (2, 300, 768)])
@pytest.mark.parametrize("pad", [None, 1])
def test_embed_layernorm_packed(gpu, cpu, rng, dtype, style, batch, seq, hidden, pad):
    vocab = 57
    mask = sequence_mask(rng, batch, seq, style)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    kwargs = {}
    if pad is None:
        types = 3
        tt = rng.integers(0, types, (batch, seq)).astype(np.int32)
        positions = seq + 2
    else:  # the RoBERTa family's positions: pad ids at most padding and some under mask 1 too
        types = 1
        tt = np.zeros((batch, seq), np.int32)
        ids[(mask == 0) & (rng.random((batch, seq)) < 0.7)] = pad
        ids[(mask == 1) & (rng.random((batch, seq)) < 0.1)] = pad
        positions = seq + pad + 1
        kwargs["position_pad_id"] = pad
    tables = embedding_tables(rng, dtype, vocab, positions, types, hidden)
    got = gpu.embed_layernorm(dtype, ids, tt, *tables, 1e-5, mask=mask, **kwargs)
    padded = gpu.embed_layernorm(dtype, ids, tt, *tables, 1e-5, **kwargs)
    valid = mask.astype(bool)
    assert got.shape == (int(mask.sum()), hidden)
    np.testing.assert_array_equal(got, padded[valid])  # one kernel row per token either way
    want = cpu.embed_layernorm("float32", ids, tt, *tables, 1e-5, mask=mask, **kwargs)
    check(got, want, dtype, atol=FP32_NOISE * max(1.0, np.abs(want).max(initial=0.0)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", SEQUENCE_MASK_STYLES)
@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1, 1, 32), (2, 7, 7, 48), (3, 97, 3, 64), (1, 129, 2, 128),
                                               (2, 5, 3, 33)])
def test_add_qkv_bias_transpose_packed_matches_cpu_exactly(gpu, cpu, rng, dtype, style, batch, seq, heads, d):
    H = heads * d
    mask = sequence_mask(rng, batch, seq, style)
    qkv = randn(rng, (batch, seq, 3 * H), dtype)
    bias = randn(rng, 3 * H, dtype, offset=2.0)
    got = gpu.add_qkv_bias_transpose(dtype, qkv, bias, heads, mask=mask)
    want = cpu.add_qkv_bias_transpose("float32", qkv, bias, heads, mask=mask)
    valid = np.broadcast_to(mask.astype(bool)[:, None, :, None], (batch, heads, seq, d))
    for name, g, w in zip("qkv", got, want):
        assert g.shape == (batch, heads, seq, d), name
        # The same fp32 sum on both sides, rounded once to the dtype; padding zeroed.
        np.testing.assert_array_equal(g, rounded(w, dtype), err_msg=name)
        assert (g[~valid] == 0).all(), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_qkv_bias_transpose_packed_with_no_token_gives_zeros(gpu, rng, dtype):
    batch, seq, heads, d = 2, 9, 2, 32
    H = heads * d
    qkv = randn(rng, (batch, seq, 3 * H), dtype, offset=3.0)
    bias = randn(rng, 3 * H, dtype, offset=2.0)
    gpu.add_qkv_bias_transpose(dtype, qkv, bias, heads)  # leaves non-zeros in memory it frees
    got = gpu.add_qkv_bias_transpose(dtype, qkv, bias, heads, mask=np.zeros((batch, seq), np.int32))
    for name, g in zip("qkv", got):
        assert (g == 0).all(), f"{name}: every position is padding"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", SEQUENCE_MASK_STYLES)
@pytest.mark.parametrize("batch,heads,seq,d", [(1, 1, 1, 32), (2, 3, 7, 48), (3, 4, 97, 64), (1, 2, 129, 128),
                                               (2, 3, 5, 33)])
def test_transpose_heads_packed_matches_cpu_exactly(gpu, cpu, rng, dtype, style, batch, heads, seq, d):
    mask = sequence_mask(rng, batch, seq, style)
    x = randn(rng, (batch, heads, seq, d), dtype)
    got = gpu.transpose_heads(dtype, x, mask=mask)
    assert got.shape == (int(mask.sum()), heads * d)
    np.testing.assert_array_equal(got, cpu.transpose_heads("float32", x, mask=mask))
    np.testing.assert_array_equal(got, gpu.transpose_heads(dtype, x)[mask.astype(bool)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", SEQUENCE_MASK_STYLES)
def test_masked_softmax_packed_is_the_padded_softmax(gpu, rng, dtype, style):
    batch, heads, seq = 5, 3, 77
    mask = sequence_mask(rng, batch, seq, style)
    scores = randn(rng, (batch, heads, seq, seq), dtype, 4.0)
    got = gpu.masked_softmax(dtype, scores, mask, 0.125, packed=True)
    np.testing.assert_array_equal(got, gpu.masked_softmax(dtype, scores, mask, 0.125))
    assert np.isfinite(got).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["right", "left", "inner", "empty_rows", "mixed"])
@pytest.mark.parametrize("hidden,out,act", [(48, 48, "tanh"), (336, 336, "tanh"), (48, 48, "gelu"), (64, 64, "relu"),
                                            (48, 1, "identity"), (96, 5, "identity")])
def test_first_token_dense_packed(gpu, cpu, rng, dtype, style, hidden, out, act):
    # Packed, a sequence's first token is its first attended one; an empty sequence's is zeros, so
    # it gives act(b).
    batch, seq = 7, 11
    mask = sequence_mask(rng, batch, seq, style)
    x = randn(rng, (batch, seq, hidden), dtype)
    weight = randn(rng, (hidden, out), dtype, 1.0 / math.sqrt(hidden))
    bias = randn(rng, out, dtype, 0.5)
    got = gpu.first_token_dense(dtype, x, weight, bias, act, mask=mask)
    want = cpu.first_token_dense("float32", x, weight, bias, act, mask=mask)
    # The same sequences padded on the right: the padded op reads the same rows.
    np.testing.assert_allclose(want, cpu.first_token_dense("float32", compacted(x, mask), weight, bias, act),
                               rtol=0, atol=1e-6)
    pos = first_positions(mask)
    first = np.where(pos[:, None] >= 0, x[np.arange(batch), np.maximum(pos, 0)], 0.0).astype(np.float64)
    dense = first @ weight
    # The CUDA op rounds the GEMM output to the dtype before bias + activation.
    check(got, want, dtype, magnitude=np.abs(want) + np.abs(dense),
          atol=FP32_NOISE * (np.abs(first) @ np.abs(weight) + np.abs(bias)))


# ---- flash attention ----------------------------------------------------------------------------


@pytest.fixture(params=["default", "portable"])
def flash_kernel(request, monkeypatch):
    """The default kernel choice (on Hopper, head dims 64 and 128 run flash_sm90.cu's kernels)
    and FTBERT_FLASH_PORTABLE=1 (flash.cu's kernel for every head dim); read at every call."""
    if request.param == "portable":
        monkeypatch.setenv("FTBERT_FLASH_PORTABLE", "1")
    else:
        monkeypatch.delenv("FTBERT_FLASH_PORTABLE", raising=False)
    return request.param


def sdpa_backends():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def attention64(qkv, bias, mask, heads, scale):
    """float64 attention of the rounded inputs (CUDA tensors) over each row's attended keys:
    [B, S, H]; rows with no key: zeros."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = (qkv.double() + bias.double()).view(B, S, 3, heads, d).permute(2, 0, 3, 1, 4)
    s = torch.matmul(x[0], x[1].transpose(-1, -2)) * scale
    s = s.masked_fill(mask.view(B, 1, 1, S) == 0, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.matmul(p, x[2]).permute(0, 2, 1, 3).reshape(B, S, H3 // 3)


def sdpa(qkv, bias, mask, heads, scale, dtype):
    """torch's fused attention in `dtype` on q/k/v = round(qkv + bias), float64 out."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // heads
    x = (qkv + bias).to(TORCH_DTYPE[dtype]).view(B, S, 3, heads, d).permute(2, 0, 3, 1, 4)
    with sdpa_backends():
        out = torch.nn.functional.scaled_dot_product_attention(
            x[0], x[1], x[2], attn_mask=(mask != 0).view(B, 1, 1, S), scale=scale)
    return out.permute(0, 2, 1, 3).reshape(B, S, H3 // 3).double()


def flash_case(rng, dtype, batch, seq, heads, head_dim, mask, gpu):
    """Runs packed and padded flash attention on one random input: (packed [T, H], padded [B, S, H],
    error budget), the budget being 2x torch SDPA's error against float64 plus slack, measured on
    the sequences with at least one token."""
    H = heads * head_dim
    scale = 1.0 / math.sqrt(head_dim)
    qkv = rng.standard_normal((batch, seq, 3 * H), dtype=np.float32)
    bias = rng.standard_normal(3 * H, dtype=np.float32)
    packed = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=True)
    padded = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale)
    assert packed.shape == (int(mask.sum()), H) and padded.shape == (batch, seq, H)
    assert np.isfinite(packed).all()
    live = np.flatnonzero(mask.any(1))
    q = torch.from_numpy(qkv[live]).cuda().to(TORCH_DTYPE[dtype]).float()
    b = torch.from_numpy(bias).cuda().to(TORCH_DTYPE[dtype]).float()
    m = torch.from_numpy(mask[live]).cuda()
    ref = attention64(q, b, m, heads, scale)
    budget = 2 * (sdpa(q, b, m, heads, scale, dtype) - ref)[m.bool()].abs().max().item() + SDPA_SLACK
    ref_rows = ref[m.bool()].cpu().numpy()  # the attended positions, in packed order
    return packed, padded, ref_rows, budget


def assert_flash_packed(packed, padded, ref_rows, mask, budget):
    valid = mask.astype(bool)
    err = np.abs(packed.astype(np.float64) - ref_rows).max(initial=0.0)
    assert err <= budget, f"packed: max error {err:.3e} > {budget:.3e}"
    # The padded kernel is held to the same budget by test_flash_attention.py: the two may each use
    # it up, in opposite directions.
    diff = np.abs(packed.astype(np.float64) - padded[valid]).max(initial=0.0)
    assert diff <= 2 * budget, f"packed vs padded: {diff:.3e} > {2 * budget:.3e}"


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("lengths", ["ragged", "odd", "short_and_empty", "long"])
def test_flash_packed_matches_padded_flash(gpu, rng, flash_kernel, dtype, head_dim, lengths):
    if lengths == "ragged":  # right, left and inner padding in one batch
        batch, seq = 6, 77
        mask = sequence_mask(rng, batch, seq, "mixed")
        mask[0] = 1
    elif lengths == "odd":  # odd lengths up to 255: first/last keys anywhere in a tile
        batch, seq = 8, 255
        mask = np.zeros((batch, seq), np.int32)
        for b, n in enumerate(rng.integers(0, 128, batch) * 2 + 1):
            mask[b, :n] = 1
    elif lengths == "short_and_empty":  # length-1 and empty sequences among longer ones
        batch, seq = 9, 40
        mask = np.zeros((batch, seq), np.int32)
        for b, n in enumerate([40, 1, 0, 1, 17, 0, 1, 33, 2]):
            mask[b, :n] = 1
    else:  # long sequences, 300 to 520 tokens (several key tiles of 64 or 128)
        batch, seq = 4, 520
        mask = np.zeros((batch, seq), np.int32)
        for b, n in enumerate([520, 300, 417, 389]):
            if b % 2:
                mask[b, seq - n:] = 1
            else:
                mask[b, :n] = 1
    packed, padded, ref_rows, budget = flash_case(rng, dtype, batch, seq, 2, head_dim, mask, gpu)
    assert_flash_packed(packed, padded, ref_rows, mask, budget)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq", [257, 401])
def test_flash_packed_wide_tiles_on_a_large_grid(gpu, rng, flash_kernel, dtype, head_dim, seq):
    # A grid of 24 sequences x 12 heads x 3 query tiles takes the wide tiles (on Hopper, the
    # persistent kernel: at head dim 64 with three consumers from 384 tokens).
    batch = 24
    mask = sequence_mask(rng, batch, seq, "mixed")
    mask[0] = 1
    packed, padded, ref_rows, budget = flash_case(rng, dtype, batch, seq, 12, head_dim, mask, gpu)
    assert_flash_packed(packed, padded, ref_rows, mask, budget)


@pytest.mark.parametrize("dtype", HALF)
def test_flash_packed_sequences_do_not_see_each_other(gpu, rng, flash_kernel, dtype):
    # A sequence's outputs are those it has alone, whatever is packed next to it.
    heads, head_dim, seq = 2, 64, 90
    H = heads * head_dim
    scale = 1.0 / math.sqrt(head_dim)
    qkv = rng.standard_normal((3, seq, 3 * H), dtype=np.float32)
    bias = rng.standard_normal(3 * H, dtype=np.float32)
    mask = np.zeros((3, seq), np.int32)
    for b, n in enumerate([90, 13, 61]):
        mask[b, :n] = 1
    together = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=True)
    cu, _ = pack_reference(mask)
    for b in range(3):
        alone = gpu.flash_attention(dtype, qkv[b:b + 1], bias, mask[b:b + 1], heads, scale, packed=True)
        np.testing.assert_array_equal(together[cu[b]:cu[b + 1]], alone)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("batch", [3, 24], ids=["few-blocks", "large-grid"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash_non_finite_neighbour_leaves_a_sequence_alone(gpu, rng, flash_kernel, dtype,
                                                            packed, batch, head_dim):
    # Sequence 1's K and V are inf. Every other sequence's last key tile runs past its end into
    # the rows that follow (77 tokens against 128-key tiles): those keys are masked, but a kernel
    # that multiplies their V by a weight of 0 gets NaN. A batch of 24 x 12 heads takes the
    # large-grid kernel on Hopper, 3 the other.
    heads, seq = 12, 77
    H = heads * head_dim
    scale = 1.0 / math.sqrt(head_dim)
    qkv = rng.standard_normal((batch, seq, 3 * H), dtype=np.float32)
    bias = rng.standard_normal(3 * H, dtype=np.float32)
    mask = np.zeros((batch, seq), np.int32)
    for b, n in enumerate(rng.integers(1, seq + 1, batch)):
        mask[b, :n] = 1
    clean = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=packed)
    qkv[1, :, H:] = np.inf
    out = gpu.flash_attention(dtype, qkv, bias, mask, heads, scale, packed=packed)
    cu, _ = pack_reference(mask)
    for b in range(batch):
        if b == 1:
            continue
        rows = slice(cu[b], cu[b + 1]) if packed else (b, slice(0, int(mask[b].sum())))
        assert np.isfinite(out[rows]).all(), f"sequence {b} has non-finite outputs"
        np.testing.assert_array_equal(out[rows], clean[rows])


# ---- the model ----------------------------------------------------------------------------------

# hidden, heads: head dims 32, 64 and 128 (the flash kernels) and 48 (unfused only).
CONFIGS = [(64, 2), (128, 2), (256, 2), (96, 2)]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"h{c[0]}-d{c[0] // c[1]}")
def bert(request, tmp_path_factory):
    hidden, heads = request.param
    path = tmp_path_factory.mktemp("bert")
    hf = make_bert(path, hidden=hidden, heads=heads, layers=2, seed=hidden + 7)
    yield path, hf
    torch.cuda.empty_cache()


def encoder(path, dtype, padding_free, graphs=True, attention="auto"):
    # padding_free's rules, which batch_invariant (packing every forward) overrides: off here.
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, cuda_graphs=graphs,
                                         padding_free=padding_free, batch_invariant=False)
    d = enc.config["hidden_size"] // enc.config["num_attention_heads"]
    if attention == "flash" and (dtype == "float32" or d not in (32, 64, 128)):
        pytest.skip(f"no flash attention for {dtype} at head dim {d}")
    enc.attention = attention
    return enc


def host_batch(rng, vocab, batch, seq, padding):
    """numpy (input_ids, attention_mask, token_type_ids). padding: right, left, inner (holes, every
    row starting with a token) or short (1 to 4 tokens each in a long batch, one full row)."""
    ids = rng.integers(1, vocab, (batch, seq))
    types = rng.integers(0, 2, (batch, seq))
    if padding == "short":
        mask = np.zeros((batch, seq), np.int32)
        for b, n in enumerate(rng.integers(1, 5, batch)):
            mask[b, :n] = 1
        mask[batch // 2] = 1
    elif padding == "inner":
        mask = (rng.random((batch, seq)) < 0.6).astype(np.int32)
        mask[:, 0] = 1
    else:
        mask = sequence_mask(rng, batch, seq, padding)
        mask[mask.sum(1) == 0, -1 if padding == "left" else 0] = 1  # no empty rows here
    ids[mask == 0] = 0
    return ids, mask, types


def as_numpy(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, np.float32)


def assert_packed_like_padded(packed, padded, mask, dtype, first_tokens_agree=True):
    """Per-token outputs equal at attended positions and exactly zero at padding; the pooler too
    when every sequence starts at position 0."""
    mask = as_numpy(mask).astype(bool)
    hidden = as_numpy(packed.last_hidden_state)
    assert_close(hidden[mask], as_numpy(padded.last_hidden_state)[mask], MODEL_TOL[dtype], "hidden",
                 relative=True)
    assert (hidden[~mask] == 0).all(), "packed padding must be exactly zero"
    if first_tokens_agree and packed.pooler_output is not None:
        assert_close(packed.pooler_output, padded.pooler_output, MODEL_TOL[dtype], "pooled", relative=True)


def assert_pooler_reads_first_tokens(out, hf, mask, dtype):
    """pooled = tanh(hidden[first attended token] · W + b), from the same forward's hidden state, with
    the pooler's weights rounded to the dtype as the engine holds them."""
    mask = as_numpy(mask).astype(bool)
    hidden = as_numpy(out.last_hidden_state).astype(np.float64)
    pos = first_positions(mask)
    first = np.where(pos[:, None] >= 0, hidden[np.arange(len(pos)), np.maximum(pos, 0)], 0.0)
    dense = hf.pooler.dense
    w = dense.weight.detach().to(TORCH_DTYPE[dtype]).double().numpy()
    b = dense.bias.detach().to(TORCH_DTYPE[dtype]).double().numpy()
    want = np.tanh(first @ w.T + b)
    # The dense output is rounded to the dtype before tanh, and tanh's output again: a few roundings
    # of values below 2.
    tol = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 4e-2}[dtype]
    err = np.abs(as_numpy(out.pooler_output) - want).max()
    assert err <= tol, f"pooled: {err:.3e} > {tol:.0e}"


def same_outputs(a, b):
    for name in ("last_hidden_state", "pooler_output", "logits"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is None:
            continue
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), name
        else:
            np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_host_inputs_packed_match_padded(bert, rng, dtype, attention, graphs):
    path, hf = bert
    on = encoder(path, dtype, True, graphs, attention)
    off = encoder(path, dtype, False, False, attention)
    # The largest batch first: a growing workspace drops the recordings made before it.
    for padding, batch, seq in [("short", 16, 300), ("left", 4, 130), ("right", 5, 77), ("inner", 3, 64)]:
        ids, mask, types = host_batch(rng, hf.config.vocab_size, batch, seq, padding)
        want = off(ids, mask, types)
        outs = [on(ids, mask, types) for _ in range(3)]  # op by op; recorded and replayed; replayed
        for out in outs:
            assert isinstance(out.last_hidden_state, np.ndarray)
            assert_packed_like_padded(out, want, mask, dtype, first_tokens_agree=padding != "left")
            assert_pooler_reads_first_tokens(out, hf, mask, dtype)
        same_outputs(outs[0], outs[1])
        same_outputs(outs[0], outs[2])
    assert on.recorded_shapes == (4 if graphs else 0)


def test_padding_free_set_on_a_live_encoder_takes_effect_for_cuda_tensors(bert, rng):
    # Set after construction, the mode governs the next forward as if given at construction:
    # True packs (zeros at padding) and, since the count's read back waits for the GPU anyway,
    # checks the values at the call, so a bad one raises there and then.
    path, hf = bert
    vocab = hf.config.vocab_size
    enc = encoder(path, "float16", "auto")
    ids, mask, types = host_batch(rng, vocab, 5, 67, "right")
    pad = torch.from_numpy(mask).cuda() == 0

    def run(ids):
        return enc(*(torch.from_numpy(a).cuda() for a in (ids, mask, types)))

    for mode, packed in [(True, True), (False, False), (True, True), ("auto", False)]:
        enc.padding_free = mode
        rows = run(ids).last_hidden_state[pad]
        assert bool((rows == 0).all()) == packed, f"padding_free={mode!r}"
    enc.padding_free = True
    bad = ids.copy()
    bad[1, 3] = vocab
    with pytest.raises(ValueError, match=rf"^input_ids holds {vocab}, out of range for vocab_size"):
        run(bad)
    assert bool((run(ids).last_hidden_state[pad] == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_cuda_tensors_with_padding_free_true_match_padded(bert, rng, dtype, attention, graphs):
    # CUDA tensors: the sequences are packed on the device, T counted in the value check's read back.
    path, hf = bert
    on = encoder(path, dtype, True, graphs, attention)
    off = encoder(path, dtype, False, False, attention)
    auto = encoder(path, dtype, "auto", graphs, attention)
    for padding, batch, seq in [("right", 6, 100), ("left", 3, 257), ("short", 12, 130)]:
        ids, mask, types = host_batch(rng, hf.config.vocab_size, batch, seq, padding)
        want = off(*(torch.from_numpy(a).cuda() for a in (ids, mask, types)))
        outs = []
        for _ in range(3):  # fresh tensors each call
            x = [torch.from_numpy(a).cuda() for a in (ids, mask, types)]
            out = on(*x)
            assert out.last_hidden_state.is_cuda and out.last_hidden_state.dtype == TORCH_DTYPE[dtype]
            assert_packed_like_padded(out, want, mask, dtype, first_tokens_agree=padding != "left")
            assert_pooler_reads_first_tokens(out, hf, mask, dtype)
            outs.append(out)
        same_outputs(outs[0], outs[2])
        # auto keeps CUDA tensors of fewer than 4,096 positions padded (Encoder::
        # auto_counts_on_device: their count exists only once the GPU has written them).
        padded = auto(*(torch.from_numpy(a).cuda() for a in (ids, mask, types)))
        assert (padded.last_hidden_state[torch.from_numpy(mask).cuda() == 0] != 0).any()
        same_outputs(padded, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_cuda_tensors_under_auto_pack_where_the_device_count_says_it_pays(bert, rng, dtype, graphs):
    # From 4,096 positions and 2 sequences, auto counts CUDA tensors on the device: packed (the
    # outputs of padding_free=True, bit for bit) with 10% padding or more, unless a sequence starts
    # with padding and the pooler reads its first token; padded (padding_free=False's bits) else.
    path, hf = bert
    vocab = hf.config.vocab_size
    auto = encoder(path, dtype, "auto", graphs)
    on = encoder(path, dtype, True, graphs)
    off = encoder(path, dtype, False, graphs)

    def cuda(arrays):
        return [torch.from_numpy(a).cuda() for a in arrays]

    ids, mask, types = host_batch(rng, vocab, 17, 301, "right")
    mask[0] = 1  # one full row; the rest ragged: well over 10% padding
    ids[mask == 0] = 0
    full = np.ones_like(mask)
    nearly_full = full.copy()
    nearly_full[3, -int(0.05 * 301):] = 0  # under 10% padding: stays padded
    left = mask[:, ::-1].copy()  # left padding: the pooler would read another token packed
    small = (ids[:2, :200], mask[:2, :200], types[:2, :200])  # 400 positions: never counted
    cases = [("ragged", (ids, mask, types), on), ("full", (ids, full, types), off),
             ("nearly full", (ids, nearly_full, types), off), ("left", (ids, left, types), off),
             ("small", small, off)]
    for name, arrays, twin in cases:
        for _ in range(3):  # op by op, recorded, replayed
            got = auto(*cuda(arrays))
            want = twin(*cuda(arrays))
            try:
                same_outputs(got, want)
            except AssertionError as e:
                raise AssertionError(f"{name}: not {'packed' if twin is on else 'padded'}: {e}") from None
    # What auto packed is still right: against the padded forward, to the usual tolerance.
    got = auto(*cuda((ids, mask, types)))
    assert_packed_like_padded(got, off(*cuda((ids, mask, types))), mask, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_forward_packed_with_cuda_tensors(bert, rng, dtype, attention):
    path, hf = bert
    enc = encoder(path, dtype, False, True, attention)  # forward_packed packs whatever the setting
    off = encoder(path, dtype, False, False, attention)
    lengths = [37, 1, 80, 5, 64, 1, 19]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    T, B, H = int(cu[-1]), len(lengths), hf.config.hidden_size
    ids = rng.integers(1, hf.config.vocab_size, T)
    types = rng.integers(0, 2, T)
    S = max(lengths)
    pids, mask, ptypes = np.zeros((B, S), np.int64), np.zeros((B, S), np.int32), np.zeros((B, S), np.int64)
    for b in range(B):
        pids[b, :lengths[b]] = ids[cu[b]:cu[b + 1]]
        ptypes[b, :lengths[b]] = types[cu[b]:cu[b + 1]]
        mask[b, :lengths[b]] = 1
    want = off(*(torch.from_numpy(a).cuda() for a in (pids, mask, ptypes)))
    valid = torch.from_numpy(mask).cuda().bool()
    outs = []
    for c in (cu.tolist(), cu, torch.from_numpy(cu)):  # 3 calls: op by op, recorded, replayed
        out = enc.forward_packed(torch.from_numpy(ids).cuda(), c, torch.from_numpy(types).cuda())
        assert out.last_hidden_state.is_cuda and tuple(out.last_hidden_state.shape) == (T, H)
        assert tuple(out.pooler_output.shape) == (B, H)
        assert_close(out.last_hidden_state, want.last_hidden_state[valid], MODEL_TOL[dtype], "hidden",
                     relative=True)
        assert_close(out.pooler_output, want.pooler_output, MODEL_TOL[dtype], "pooled", relative=True)
        outs.append(out)
    same_outputs(outs[0], outs[1])
    same_outputs(outs[0], outs[2])
    assert enc.recorded_shapes == 1
    # No token types (staged as 0s), and int32 ids as int64 ones.
    zeros = enc.forward_packed(torch.from_numpy(ids).cuda(), cu, torch.zeros(T, dtype=torch.long, device="cuda"))
    same_outputs(enc.forward_packed(torch.from_numpy(ids).cuda().int(), cu), zeros)
    # Host inputs to the same encoder: packed on the host instead, the same forward.
    host = enc.forward_packed(ids, cu, types)
    np.testing.assert_array_equal(as_numpy(host.last_hidden_state), as_numpy(outs[2].last_hidden_state))
    np.testing.assert_array_equal(as_numpy(host.pooler_output), as_numpy(outs[2].pooler_output))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("inputs", ["numpy", "cuda"])
def test_ragged_packed_batches_in_one_bucket_replay_one_recording(bert, rng, dtype, inputs):
    # forward_packed batches of 5-8 sequences of up to 33-64 tokens, 193-256 in all, run at one
    # recorded shape (8 x 64 over 256 rows): one recording, replayed from the third batch on, the
    # same bits as the same shape op by op, and the padded forward's values.
    path, hf = bert
    graphs = encoder(path, dtype, False, True, "flash")
    plain = encoder(path, dtype, False, False, "flash")
    padded = encoder(path, dtype, False, False, "unfused")
    H = hf.config.hidden_size
    for i in range(8):
        while True:
            lengths = rng.integers(1, int(rng.integers(33, 65)) + 1, int(rng.integers(5, 9)))
            if 193 <= lengths.sum() <= 256 and lengths.max() >= 33:
                break
        cu = np.concatenate([[0], np.cumsum(lengths)])
        T, B = int(cu[-1]), len(lengths)
        ids = rng.integers(1, hf.config.vocab_size, T)
        if inputs == "cuda":
            ids = torch.from_numpy(ids).cuda()
        out = graphs.forward_packed(ids, cu)
        assert tuple(out.last_hidden_state.shape) == (T, H) and tuple(out.pooler_output.shape) == (B, H)
        same_outputs(out, plain.forward_packed(ids, cu))
        S = int(lengths.max())
        pids, mask = np.zeros((B, S), np.int64), np.zeros((B, S), np.int32)
        host_ids = ids.cpu().numpy() if inputs == "cuda" else ids
        for b in range(B):
            pids[b, :lengths[b]] = host_ids[cu[b]:cu[b + 1]]
            mask[b, :lengths[b]] = 1
        want = padded(pids, mask)
        assert_close(as_numpy(out.last_hidden_state), as_numpy(want.last_hidden_state)[mask.astype(bool)],
                     MODEL_TOL[dtype], "hidden", relative=True)
        assert_close(as_numpy(out.pooler_output), as_numpy(want.pooler_output), MODEL_TOL[dtype], "pooled",
                     relative=True)
    assert graphs.recorded_shapes == 1
    assert graphs.graph_counts == {"replayed": 6, "recorded": 1, "op_by_op": 1}


def fresh_op_by_op(ref, *args):
    """`ref`'s forward run op by op over the same rows a recording has (a shape seen for the first
    time): turning CUDA graphs off and on forgets every shape seen."""
    ref.cuda_graphs = False
    ref.cuda_graphs = True
    return ref(*args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("inputs", ["numpy", "cuda"])
def test_one_bucket_replays_batches_of_different_token_counts(bert, rng, dtype, attention, inputs):
    # B x S = 8 x 64 = 512 positions: buckets of 64 rows. T = 128, 70, 100, 65 share the bucket of
    # 128 rows, in an order that leaves stale rows past a smaller T behind a larger one.
    path, hf = bert
    graphs = encoder(path, dtype, True, True, attention)
    plain = encoder(path, dtype, True, False, attention)
    ref = encoder(path, dtype, True, True, attention)
    batch, seq = 8, 64

    def batch_of(tokens):
        lengths = np.full(batch, tokens // batch)
        lengths[: tokens % batch] += 1
        rng.shuffle(lengths)
        mask = np.zeros((batch, seq), np.int32)
        for b, n in enumerate(lengths):
            if b % 2:
                mask[b, seq - n:] = 1
            else:
                mask[b, :n] = 1
        ids = rng.integers(1, hf.config.vocab_size, (batch, seq))
        types = rng.integers(0, 2, (batch, seq))
        assert mask.sum() == tokens
        args = (ids, mask, types)
        return args if inputs == "numpy" else tuple(torch.from_numpy(a).cuda() for a in args)

    for i, tokens in enumerate([128, 70, 100, 65, 128, 40, 33]):
        args = batch_of(tokens)
        out = graphs(*args)
        mask = args[1]
        # Against the same rows run op by op: bit for bit (from the third call on, a replay).
        same_outputs(out, fresh_op_by_op(ref, *args))
        # Against exactly T rows, op by op.
        assert_packed_like_padded(out, plain(*args), mask, dtype)
        if i == 4:
            assert graphs.recorded_shapes == 1  # one bucket so far
    assert graphs.recorded_shapes == 2  # and the bucket of 64 rows (40, 33)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_fully_masked_rows_length_one_and_full_batches(bert, rng, dtype, attention):
    path, hf = bert
    on = encoder(path, dtype, True, True, attention)
    off = encoder(path, dtype, False, False, attention)
    batch, seq = 7, 45
    ids = torch.from_numpy(rng.integers(1, hf.config.vocab_size, (batch, seq))).cuda()
    lengths = [45, 0, 1, 1, 0, 13, 1]
    mask = torch.zeros((batch, seq), dtype=torch.int32, device="cuda")
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    for _ in range(3):
        out = on(ids, mask)
        assert torch.isfinite(out.last_hidden_state).all() and torch.isfinite(out.pooler_output).all()
        assert (out.last_hidden_state[[1, 4]] == 0).all()
        want = off(ids, mask)
        assert_packed_like_padded(out, want, mask, dtype, first_tokens_agree=False)
        keep = [b for b, n in enumerate(lengths) if n]
        assert_close(out.pooler_output[keep], want.pooler_output[keep], MODEL_TOL[dtype], "pooled",
                     relative=True)
        assert_pooler_reads_first_tokens(out, hf, mask, dtype)  # empty rows: tanh(b)
    full = torch.ones((batch, seq), dtype=torch.int32, device="cuda")  # T = B * S
    out, want = on(ids, full), off(ids, full)
    assert_close(out.last_hidden_state, want.last_hidden_state, MODEL_TOL[dtype], "hidden", relative=True)
    assert_close(out.pooler_output, want.pooler_output, MODEL_TOL[dtype], "pooled", relative=True)
    nothing = torch.zeros((batch, seq), dtype=torch.int32, device="cuda")  # T = 0
    out = on(ids, nothing)
    assert (out.last_hidden_state == 0).all()
    assert_pooler_reads_first_tokens(out, hf, nothing, dtype)


# name -> make_model arguments: a sequence head on the first token and a token head, head dims 64
# and 32, ELECTRA with its projection.
HEAD_CASES = {
    "roberta-cls": dict(family="roberta", kind="cls", hidden=128, heads=2, layers=2, num_labels=3, seed=81),
    "electra-token": dict(family="electra", kind="token", hidden=64, heads=2, layers=1, num_labels=5,
                          embedding=32, seed=82),
}


@pytest.fixture(scope="module", params=list(HEAD_CASES))
def head_case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_model(path, **HEAD_CASES[request.param])
    widen_head(hf)
    hf.save_pretrained(path)
    return request.param, path, hf


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_heads_packed_match_padded(head_case, rng, dtype, attention):
    name, path, hf = head_case
    on = encoder(path, dtype, True, True, attention)
    off = encoder(path, dtype, False, False, attention)
    pad = hf.config.pad_token_id
    cuda = lambda *a: tuple(torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in a)  # noqa: E731
    for padding in ("right", "left"):
        batch, seq = 6, 53
        mask = sequence_mask(rng, batch, seq, padding)
        mask[mask.sum(1) == 0, -1 if padding == "left" else 0] = 1
        ids = rng.integers(0, hf.config.vocab_size - 1, (batch, seq))
        ids += ids >= pad
        ids[mask == 0] = pad
        types = rng.integers(0, hf.config.type_vocab_size, (batch, seq))
        want = off(*cuda(ids, mask, types))
        valid = mask.astype(bool)
        for inputs in ("numpy", "cuda", "cuda", "cuda"):  # CUDA tensors: op by op, recorded, replayed
            out = on(ids, mask, types) if inputs == "numpy" else on(*cuda(ids, mask, types))
            assert_packed_like_padded(out, want, mask, dtype)
            logits = as_numpy(out.logits)
            if name.endswith("token"):
                assert_close(logits[valid], as_numpy(want.logits)[valid], MODEL_TOL[dtype], "token logits",
                             relative=True)
                assert (logits[~valid] == 0).all()
            elif padding == "right":
                assert_close(logits, want.logits, MODEL_TOL[dtype], "logits", relative=True)
            else:
                # Left padding: packed reads the first real token. RoBERTa's positions come from the
                # ids, so that is what the padded forward gives for the same sequences right-padded.
                right_ids = np.full_like(ids, pad)
                right_mask = np.zeros_like(mask)
                for b in range(batch):
                    n = int(mask[b].sum())
                    right_ids[b, :n] = ids[b][valid[b]]
                    right_mask[b, :n] = 1
                right = off(*cuda(right_ids, right_mask, np.zeros_like(types)))
                assert_close(logits, right.logits, MODEL_TOL[dtype], "logits vs right-padded", relative=True)
                assert np.abs(logits - as_numpy(want.logits)).max() > 10 * MODEL_TOL[dtype], (
                    "the test cannot tell the first real token from position 0")


def test_forward_packed_device_errors(bert, rng):
    path, hf = bert
    enc = encoder(path, "float16", True)
    ids = torch.from_numpy(rng.integers(1, hf.config.vocab_size, 10)).cuda()
    with pytest.raises(ValueError, match=r"cu_seqlens is on cuda:0: pass it on the host"):
        enc.forward_packed(ids, torch.tensor([0, 4, 10], device="cuda"))
    with pytest.raises(ValueError, match=r"token_type_ids is on cpu but input_ids is on cuda:0"):
        enc.forward_packed(ids, [0, 4, 10], torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match=r"cu_seqlens ends at 9 but input_ids has 10 tokens"):
        enc.forward_packed(ids, [0, 4, 9])
    # A bad value: checked on the GPU as it is staged (input_check="async"), raised by the next
    # call or synchronize(); "sync" raises at the call itself.
    bad = torch.full((10,), hf.config.vocab_size, device="cuda")
    enc.forward_packed(bad, [0, 4, 10])
    with pytest.raises(ValueError, match=rf"input_ids holds {hf.config.vocab_size}, out of range"):
        enc.synchronize()
    enc.forward_packed(ids, [0, 4, 10], bad - hf.config.vocab_size + hf.config.type_vocab_size)
    # The next forward reports a check that has run: on a GPU that other workers keep busy it may
    # not have yet (test_cuda_model.py's async test waits the same way).
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=rf"an earlier forward's inputs were bad: token_type_ids holds "
                                         rf"{hf.config.type_vocab_size}"):
        enc.forward_packed(ids, [0, 4, 10])
    enc.input_check = "sync"
    with pytest.raises(ValueError, match=rf"input_ids holds {hf.config.vocab_size}, out of range"):
        enc.forward_packed(bad, [0, 4, 10])
    enc.input_check = "async"
    with pytest.raises(ValueError, match="exceeds max_position_embeddings 512"):
        enc.forward_packed(torch.ones(513, dtype=torch.long, device="cuda"), [0, 513])
    cpu_enc = ftbert.Encoder.from_pretrained(path, padding_free=True)
    with pytest.raises(ValueError, match=r"input_ids is on cuda:0 but the encoder runs on cpu"):
        cpu_enc.forward_packed(ids, [0, 4, 10])
    # The encoder still runs.
    assert tuple(enc.forward_packed(ids, [0, 4, 10]).last_hidden_state.shape) == (10, hf.config.hidden_size)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_warm_up_batches_holds_single_inputs_and_the_largest_workspace(bert, rng, dtype, graphs):
    # After warm_up_batches, a single input of any length up to 512 replays a recording of it (the
    # fused attention's lengths; the unfused one's run op by op the first time), and ragged batches
    # within its budget never grow the workspace, which would drop every recording.
    path, hf = bert
    budget, most = 2048, 32
    enc = encoder(path, dtype, False, graphs, "auto")
    plain = encoder(path, dtype, False, False, "auto")
    fused = {n for n in range(1, 513) if enc.attention_for(1, n) != "unfused"}
    shapes = {ftbert._C.recorded_packed_shape(1, n, n, 512) for n in fused}
    if len(fused) == 512:  # head dim 48 has no fused attention
        assert len(shapes) == 14
    assert enc.warm_up_batches(budget, most) == (len(shapes) if graphs else 0)
    workspace, counts = enc.workspace_bytes, enc.graph_counts
    gpu = torch.device("cuda")

    def run(lengths):
        batch = pack_sequences([rng.integers(1, hf.config.vocab_size, n).astype(np.int32) for n in lengths],
                               [None] * len(lengths))
        got, _ = forward_packed_batch(enc, batch, gpu)
        same_outputs(got, forward_packed_batch(plain, batch, gpu)[0])
        assert enc.workspace_bytes == workspace, lengths

    singles = [1, 512] + [int(n) for n in rng.choice(np.arange(2, 512), 10, replace=False)]
    for n in singles:
        run([n])
    if graphs:  # an unfused length seen once before (at warm-up) records now: nothing else does
        replayed = sum(n in fused for n in singles)
        now = enc.graph_counts
        assert now["replayed"] - counts["replayed"] == replayed, now
        assert sum(now.values()) - sum(counts.values()) == len(singles), now
        assert now["recorded"] - counts["recorded"] <= len(singles) - replayed, now
    for count, longest in [(most, budget // most), (budget // 512, 512), (most, 1), (3, 300)]:
        run([longest] * count)
    for _ in range(8):
        count = int(rng.integers(1, most + 1))
        longest = int(rng.integers(1, min(512, budget // count) + 1))
        run([longest] + [int(n) for n in rng.integers(1, longest + 1, count - 1)])
    if graphs:  # the single inputs' recordings are all still held
        before = enc.graph_counts["replayed"]
        for n in sorted(fused)[:: max(1, len(fused) // 20)]:
            run([n])
        assert enc.graph_counts["replayed"] - before == len(sorted(fused)[:: max(1, len(fused) // 20)])
