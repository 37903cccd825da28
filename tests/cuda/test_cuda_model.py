"""The whole model on the GPU against transformers.BertModel (GPU only; skipped without one)."""


import os

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert, minilm_path
from tests._util import ragged_mask

# no_tf32: the fp32 reference must be true fp32.
pytestmark = [
    pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
    pytest.mark.usefixtures("no_tf32"),
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


CONFIGS = [(64, 2, 2, "gelu"), (96, 2, 1, "gelu_new"), (256, 4, 2, "gelu"), (384, 3, 2, "gelu")]  # d 32,48,64,128


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"h{c[0]}-d{c[0] // c[1]}-L{c[2]}-{c[3]}")
def hf_dir(request, tmp_path_factory):
    hidden, heads, layers, act = request.param
    path = tmp_path_factory.mktemp("bert")
    model = make_bert(path, hidden=hidden, heads=heads, layers=layers, act=act, seed=hidden)
    return path, model


def inputs(rng, vocab, batch, seq, left=False):
    ids = torch.from_numpy(rng.integers(0, vocab, (batch, seq))).cuda()
    mask = torch.from_numpy(ragged_mask(rng, batch, seq, left=left)).cuda()
    types = torch.from_numpy(rng.integers(0, 2, (batch, seq))).cuda()
    return ids, mask, types


_HF_CACHE = {}


def hf_forward(path, dtype, ids, mask, types, attn="sdpa"):
    from transformers import BertModel

    key = (str(path), dtype, attn)
    if key not in _HF_CACHE:
        if len(_HF_CACHE) >= 6:  # a few models per config: fp32 reference and the half peers
            _HF_CACHE.pop(next(iter(_HF_CACHE)))
        _HF_CACHE[key] = BertModel.from_pretrained(path, attn_implementation=attn, dtype=dtype).cuda().eval()
    m = _HF_CACHE[key]
    with torch.no_grad():
        return m(ids, attention_mask=mask, token_type_ids=types)


def max_err(a, b, mask):
    valid = mask.bool()
    return (a.float() - b.float()).abs()[valid].max().item()


@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 7), (2, 97), (4, 129), (2, 512)])
@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_float32_matches_transformers(hf_dir, rng, batch, seq, left):
    path, model = hf_dir
    ids, mask, types = inputs(rng, model.config.vocab_size, batch, seq, left)
    ref = hf_forward(path, torch.float32, ids, mask, types, attn="eager")
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32")
    out = enc(ids, mask, types)
    assert torch.isfinite(out.last_hidden_state).all()
    assert max_err(out.last_hidden_state, ref.last_hidden_state, mask) <= 1e-4
    assert (out.pooler_output - ref.pooler_output).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("batch,seq", [(2, 7), (3, 129), (2, 512)])
def test_half_precision_error_within_twice_transformers(hf_dir, rng, dtype, attention, batch, seq):
    path, model = hf_dir
    ids, mask, types = inputs(rng, model.config.vocab_size, batch, seq)
    ref = hf_forward(path, torch.float32, ids, mask, types, attn="eager").last_hidden_state
    theirs = hf_forward(path, DTYPES[dtype], ids, mask, types).last_hidden_state
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype)
    if attention == "flash" and enc.config["hidden_size"] // enc.config["num_attention_heads"] not in (32, 64, 128):
        # Refused, naming the head dim (the backend's attention_unsupported_reason): the skip says it.
        with pytest.raises(RuntimeError, match="head dim") as refused:
            enc.attention = "flash"
        pytest.skip(f"no flash attention to measure: {refused.value}")
    enc.attention = attention
    ours = enc(ids, mask, types).last_hidden_state
    assert ours.dtype == DTYPES[dtype]
    e_ours, e_theirs = max_err(ours, ref, mask), max_err(theirs, ref, mask)
    assert e_ours <= 2 * e_theirs + 1e-3, f"ftbert {e_ours:.3e} vs transformers {e_theirs:.3e}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_flash_and_unfused_agree(hf_dir, rng, dtype):
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, attention="unfused")
    d = enc.config["hidden_size"] // enc.config["num_attention_heads"]
    if d not in (32, 64, 128):
        assert enc.attention_for(2, 64) == "unfused"
        with pytest.raises(RuntimeError, match="head dim") as refused:
            enc.attention = "flash"
        pytest.skip(f"no flash attention to compare with: {refused.value}")
    ids, mask, types = inputs(rng, model.config.vocab_size, 3, 200, left=True)
    a = enc(ids, mask, types).last_hidden_state
    enc.attention = "flash"
    assert enc.attention_for(3, 200) == "flash"
    b = enc(ids, mask, types).last_hidden_state
    tol = 2e-2 if dtype == "float16" else 8e-2
    assert max_err(a, b, mask) <= tol


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("attention", ["unfused", "auto"])
def test_padding_invariance(hf_dir, rng, dtype, attention):
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, attention=attention)
    n, S = 13, 150
    ids = torch.from_numpy(rng.integers(0, model.config.vocab_size, (3, S))).cuda()
    mask = torch.ones_like(ids)
    mask[1, n:] = 0
    alone = enc(ids[1:2, :n]).last_hidden_state[0].float()
    batched = enc(ids, mask).last_hidden_state[1, :n].float()
    tol = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 6e-2}[dtype]
    assert (alone - batched).abs().max().item() <= tol


def test_no_memory_growth_over_1000_forwards_then_mixed_shapes(hf_dir, rng):
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip("measures the device's free memory, which the other test workers' allocations "
                    "move: run it in a serial pytest")
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16")
    ids, mask, types = inputs(rng, model.config.vocab_size, 8, 128)
    enc(ids, mask, types)
    enc(ids, mask, types)  # the second forward of a shape records its CUDA graph, once
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    ws = enc.workspace_bytes
    for _ in range(1000):
        enc(ids, mask, types)
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    assert enc.workspace_bytes == ws
    assert enc.recorded_shapes == 1
    assert abs(free0 - free1) < 4 * 1024 * 1024  # the engine itself allocates nothing per forward
    ref32 = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32")
    for batch, seq in [(1, 5), (16, 300), (2, 31), (8, 128)]:
        i, m, t = inputs(rng, model.config.vocab_size, batch, seq)
        err = max_err(enc(i, m, t).last_hidden_state, ref32(i, m, t).last_hidden_state, m)
        assert err < 5e-2


def test_graph_counts_say_what_each_forward_did(hf_dir, rng):
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", warmup=False)
    assert enc.graph_counts == {"replayed": 0, "recorded": 0, "op_by_op": 0}
    ids, mask, types = inputs(rng, model.config.vocab_size, 3, 40)
    for _ in range(4):  # seen, recorded, replayed twice
        enc(ids, mask, types)
    assert enc.graph_counts == {"replayed": 2, "recorded": 1, "op_by_op": 1}
    enc(*inputs(rng, model.config.vocab_size, 2, 17))  # a new shape: op by op
    assert enc.graph_counts == {"replayed": 2, "recorded": 1, "op_by_op": 2}
    enc.cuda_graphs = False  # forwards without graphs are not counted
    enc(ids, mask, types)
    assert enc.graph_counts == {"replayed": 2, "recorded": 1, "op_by_op": 2}


def test_numpy_and_cpu_tensors_follow_the_documented_rule(hf_dir, rng):
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16")
    ids = rng.integers(0, model.config.vocab_size, (2, 9))
    out_np = enc(ids)
    assert isinstance(out_np.last_hidden_state, np.ndarray) and out_np.last_hidden_state.dtype == np.float16
    out_cpu = enc(torch.from_numpy(ids))
    assert out_cpu.last_hidden_state.device.type == "cpu" and out_cpu.last_hidden_state.dtype == torch.float16
    out_gpu = enc(torch.from_numpy(ids).cuda())
    assert out_gpu.last_hidden_state.is_cuda
    np.testing.assert_array_equal(out_np.last_hidden_state, out_gpu.last_hidden_state.cpu().numpy())
    enc_bf = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="bfloat16")
    assert enc_bf(ids).last_hidden_state.dtype == np.float32  # numpy has no bfloat16


def test_runs_on_torch_current_stream(hf_dir, rng):
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16")
    ids, mask, types = inputs(rng, model.config.vocab_size, 4, 64)
    ref = enc(ids, mask, types).last_hidden_state.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        ids2 = ids * 1  # produced on s: the engine must see it
        out = enc(ids2, mask, types).last_hidden_state
        res = out.float().sum()  # consumed on s
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert torch.isfinite(res)


def test_stream_handle_is_torch_current_stream():
    # The encoder reads the current stream's raw handle (not torch.cuda.current_stream(), which is
    # slower); it must be the same stream, in and out of a stream context.
    from ftbert.encoder import _current_stream_handle

    index = torch.cuda.current_device()
    assert _current_stream_handle(index) == torch.cuda.current_stream(index).cuda_stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert _current_stream_handle(index) == s.cuda_stream != 0
    assert _current_stream_handle(index) == torch.cuda.current_stream(index).cuda_stream


def checked(enc, *args):
    """A forward, then the wait that raises what an input_check="async" forward found."""
    out = enc(*args)
    enc.synchronize()
    return out


@pytest.mark.parametrize("input_check", ["sync", "async"])
def test_bad_device_inputs_raise(hf_dir, input_check):
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", input_check=input_check)
    V = model.config.vocab_size
    ids = torch.full((2, 4), V, device="cuda")
    with pytest.raises(ValueError, match=f"input_ids holds {V}, out of range for vocab_size {V}"):
        checked(enc, ids)
    with pytest.raises(ValueError, match="input_ids holds -3, out of range"):
        checked(enc, torch.tensor([[1, -3, 2]], device="cuda", dtype=torch.int32))
    with pytest.raises(ValueError, match=f"input_ids holds {2**40}, out of range"):  # not wrapped to int32
        checked(enc, torch.tensor([[1, 2**40, 2]], device="cuda"))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        enc(torch.zeros((1, 513), dtype=torch.long, device="cuda"))
    ok = torch.ones((2, 4), dtype=torch.long, device="cuda")
    with pytest.raises(ValueError, match="token_type_ids holds 2, out of range for type_vocab_size 2"):
        checked(enc, ok, ok, ok * 2)
    for bad_mask in (ok * 2, ok - 2, ok * 0.5, ok.to(torch.uint8) * 3):
        with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1"):
            checked(enc, ok, bad_mask)
    ref = enc(ok, ok).last_hidden_state
    for good_mask in (ok.bool(), ok.float(), ok.to(torch.int8), ok.to(torch.uint8), ok.int()):
        assert torch.equal(checked(enc, ok, good_mask).last_hidden_state, ref)


def test_async_input_check_raises_at_the_next_forward_and_recovers(hf_dir, rng):
    path, model = hf_dir
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16")
    assert enc.input_check == "async"
    V = model.config.vocab_size
    ids, mask, types = inputs(rng, V, 3, 17)
    want = enc(ids, mask, types).last_hidden_state.clone()
    bad = ids.clone()
    bad[1, 5] = V + 11
    out = enc(bad, mask, types)  # returns without waiting for the check
    assert out.last_hidden_state.shape == want.shape
    # The next forward reports a check that has run: on a GPU that other processes keep busy it
    # may not have yet, and would then be reported by a later one.
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=rf"^an earlier forward's inputs were bad: input_ids holds {V + 11}, "
                                         rf"out of range for vocab_size {V} .*this call did not run"):
        enc(ids, mask, types)
    # Reported once: the encoder runs on, results unchanged, with graphs replaying.
    for _ in range(3):
        assert torch.equal(checked(enc, ids, mask, types).last_hidden_state, want)
    # A forward that waits anyway (nonfinite="raise") raises its own bad values at once.
    enc.nonfinite = "raise"
    with pytest.raises(ValueError, match=rf"^input_ids holds {V + 11}, out of range"):
        enc(bad, mask, types)
    assert torch.equal(enc(ids, mask, types).last_hidden_state, want)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_async_input_check_equals_sync_for_every_staged_dtype(hf_dir, rng, dtype):
    path, model = hf_dir
    V = min(model.config.vocab_size, 256)  # uint8 ids reach 255
    ids, mask, types = inputs(rng, V, 4, 33)
    ids, types = ids.to(dtype), types.to(dtype)
    outs = {}
    for mode in ("sync", "async"):
        enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float32", input_check=mode)
        outs[mode] = [checked(enc, ids, m, types).last_hidden_state for m in (mask, mask.bool(), mask.to(dtype))] * 1
        outs[mode] += [checked(enc, ids, mask, types).last_hidden_state for _ in range(2)]  # replays
    for a, b in zip(outs["sync"], outs["async"]):
        assert torch.equal(a, b)


def test_input_check_must_be_async_or_sync(hf_dir):
    path, _ = hf_dir
    with pytest.raises(ValueError, match=r"input_check must be 'async' or 'sync', got 'lazy'"):
        ftbert.Encoder.from_pretrained(path, device="cuda", input_check="lazy")
    enc = ftbert.Encoder.from_pretrained(path, device="cuda")
    with pytest.raises(ValueError, match=r"input_check must be 'async' or 'sync', got None"):
        enc.input_check = None
    assert enc.input_check == "async"


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "The quick brown fox jumps over the lazy dog, " * 40,
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_minilm_matches_sentence_transformers(dtype, attention):
    st = pytest.importorskip("sentence_transformers")
    path = minilm_path()
    ref = st.SentenceTransformer(path, device="cpu").encode(SENTENCES, normalize_embeddings=True)
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype)
    if dtype == "float32" and attention == "flash":
        pytest.skip("flash runs in half precision only")
    enc.attention = attention
    ours = enc.encode(SENTENCES)
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.9999, cos


def test_minilm_encode_replays_graphs_across_batches():
    # encode runs packed batches; a repeated call makes the same batches, so its forwards replay
    # the CUDA graphs the first call's shapes recorded; the embeddings equal those computed op by op.
    path = minilm_path()
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16")
    plain = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", cuda_graphs=False)
    texts = [SENTENCES[i % 5] + " and more" * (i % 4) for i in range(48)]
    ref = plain.encode(texts, batch_size=8)
    first, second = enc.encode(texts, batch_size=8), enc.encode(texts, batch_size=8)
    assert enc.recorded_shapes >= 1 and plain.recorded_shapes == 0
    np.testing.assert_array_equal(first, ref)
    np.testing.assert_array_equal(second, ref)


@pytest.mark.parametrize("pooling", ["mean", "cls", "pooler"])
def test_minilm_packed_encode_on_the_gpu_matches_the_cpu(pooling):
    # Packed batches on the GPU (ids copied from pinned memory, pooling on the packed output):
    # the CPU backend's embeddings, in input order, with batches cut by a small token budget.
    path = minilm_path()
    texts = [SENTENCES[i % len(SENTENCES)] + " and more" * (i % 7) for i in range(40)][::-1]
    cpu = ftbert.Encoder.from_pretrained(path).encode(texts, pooling=pooling, max_batch_tokens=64)
    enc = ftbert.Encoder.from_pretrained(path, device="cuda")
    for kwargs in (dict(max_batch_tokens=64), dict(batch_size=3), {}):
        gpu = enc.encode(texts, pooling=pooling, **kwargs)
        assert gpu.dtype == np.float32 and gpu.shape == cpu.shape
        np.testing.assert_allclose(gpu, cpu, atol=2e-4, err_msg=str(kwargs))


def test_a_gpu_encoder_is_warmed_by_default(tmp_path, monkeypatch):
    from tests._models import make_model

    make_model(tmp_path, "bert", hidden=64, heads=2, layers=1)
    monkeypatch.delenv("FTBERT_WARMUP", raising=False)
    assert ftbert.Encoder.from_pretrained(tmp_path, device="cuda").workspace_bytes > 0
    monkeypatch.setenv("FTBERT_WARMUP", "0")
    assert ftbert.Encoder.from_pretrained(tmp_path, device="cuda").workspace_bytes == 0


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_warm_up_leaves_results_unchanged(tmp_path, rng, family):
    from tests._models import make_model

    make_model(tmp_path, family, hidden=128, heads=2, layers=2)
    cold = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype="float16", warmup=False)
    warm = ftbert.Encoder.from_pretrained(tmp_path, device="cuda", dtype="float16", warmup=True)
    assert warm.workspace_bytes > 0 and cold.workspace_bytes == 0
    ids = torch.from_numpy(rng.integers(3, 99, (3, 45))).cuda()
    mask = torch.from_numpy(ragged_mask(rng, 3, 45)).cuda()
    for _ in range(2):  # the second time: CUDA graphs recorded
        assert torch.equal(warm(ids, mask).last_hidden_state, cold(ids, mask).last_hidden_state)
    cu = np.array([0, 7, 40, 41])
    flat = ids.flatten()[:41].to(torch.int32)
    assert torch.equal(warm.forward_packed(flat, cu).last_hidden_state,
                       cold.forward_packed(flat, cu).last_hidden_state)
