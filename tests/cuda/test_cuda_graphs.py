"""Replaying repeated shapes as CUDA graphs (Encoder.cuda_graphs): the same outputs as running the
forward op by op, whatever the inputs, buffers, streams and settings do in between (GPU only)."""

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert
from tests._util import ragged_mask

pytestmark = pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build")

# hidden, heads: head dims 32, 64, 128 (the flash kernels) and 48 (unfused only).
CONFIGS = [(64, 2), (96, 2), (128, 2), (256, 2)]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"h{c[0]}-d{c[0] // c[1]}")
def model_dir(request, tmp_path_factory):
    hidden, heads = request.param
    path = tmp_path_factory.mktemp("bert")
    make_bert(path, hidden=hidden, heads=heads, layers=2, seed=hidden)
    return path


def pair(path, dtype):
    """Two encoders of one checkpoint: with graphs (the default) and op by op."""
    graphs = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype)
    plain = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, cuda_graphs=False)
    assert graphs.cuda_graphs and not plain.cuda_graphs
    return graphs, plain


def inputs(rng, batch, seq, left=False):
    ids = torch.from_numpy(rng.integers(0, 211, (batch, seq))).cuda()
    mask = torch.from_numpy(ragged_mask(rng, batch, seq, left=left)).cuda()
    types = torch.from_numpy(rng.integers(0, 2, (batch, seq))).cuda()
    return ids, mask, types


def same(out_a, out_b):
    assert torch.equal(out_a.last_hidden_state, out_b.last_hidden_state)
    assert torch.equal(out_a.pooler_output, out_b.pooler_output)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_replays_match_op_by_op_with_fresh_inputs_each_call(model_dir, dtype, attention, rng):
    graphs, plain = pair(model_dir, dtype)
    if attention == "flash" and plain.attention_for(1, 1) != "flash":
        # Asking for flash where it cannot run is refused, and the message says why: the reason the
        # skip reports (the backend's attention_unsupported_reason: the dtype or the head dim).
        with pytest.raises(RuntimeError, match="not supported") as refused:
            graphs.attention = attention
        pytest.skip(f"no flash attention to replay: {refused.value}")
    graphs.attention = plain.attention = attention
    for batch, seq in [(3, 128), (1, 37)]:  # the larger first: a growing workspace drops recordings
        for call in range(4):  # op by op, recorded + replayed, replayed, replayed
            left = call % 2 == 1
            ids, mask, types = inputs(rng, batch, seq, left=left)  # new tensors, new addresses
            same(graphs(ids, mask, types), plain(ids, mask, types))
    assert graphs.recorded_shapes == 2
    assert plain.recorded_shapes == 0


def test_numpy_inputs_replay_too(model_dir, rng):
    graphs, plain = pair(model_dir, "float16")
    for _ in range(3):
        ids = rng.integers(0, 211, (2, 19))
        mask = ragged_mask(rng, 2, 19)
        out, ref = graphs(ids, mask), plain(ids, mask)
        np.testing.assert_array_equal(out.last_hidden_state, ref.last_hidden_state)
        np.testing.assert_array_equal(out.pooler_output, ref.pooler_output)
    assert graphs.recorded_shapes == 1


def test_growing_workspace_drops_recordings_and_stays_correct(model_dir, rng):
    graphs, plain = pair(model_dir, "float16")
    small = inputs(rng, 2, 16)
    for _ in range(2):
        same(graphs(*small), plain(*small))
    assert graphs.recorded_shapes == 1
    ws = graphs.workspace_bytes
    big = inputs(rng, 8, 200)
    same(graphs(*big), plain(*big))  # new buffers: the old recording pointed at freed ones
    assert graphs.workspace_bytes > ws
    assert graphs.recorded_shapes == 0
    for _ in range(2):
        small = inputs(rng, 2, 16)
        same(graphs(*small), plain(*small))
        big = inputs(rng, 8, 200)
        same(graphs(*big), plain(*big))
    assert graphs.recorded_shapes == 2


def test_attention_switch_and_tf32_are_honoured(model_dir, rng):
    graphs, plain = pair(model_dir, "float32")
    x = inputs(rng, 4, 33)
    for _ in range(2):
        same(graphs(*x), plain(*x))
    assert graphs.recorded_shapes == 1
    graphs._native.set_allow_tf32(True)  # GEMMs recorded without TF32 must not replay
    plain._native.set_allow_tf32(True)
    assert graphs.recorded_shapes == 0
    for _ in range(3):
        same(graphs(*x), plain(*x))
    half, half_plain = pair(model_dir, "float16")
    for attention in ["unfused", "auto", "unfused"]:  # the kernel is part of the recording's key
        half.attention = half_plain.attention = attention
        for _ in range(2):
            same(half(*x), half_plain(*x))


def test_at_most_128_shapes_are_kept_and_evicted_ones_still_run(model_dir, rng):
    graphs, plain = pair(model_dir, "float16")
    graphs(*inputs(rng, 1, 160))  # the workspace for every shape below: none drops the recordings
    first = inputs(rng, 1, 8)
    for _ in range(2):
        graphs(*first)
    limit = 128  # Session::kMaxRecordings
    for seq in range(9, 9 + limit):
        x = inputs(rng, 1, seq)
        graphs(*x), graphs(*x)
        if seq == 20:
            graphs(*first)  # keeps (1, 8) recent: (1, 9) goes first
    assert graphs.recorded_shapes == limit
    for x in (first, inputs(rng, 1, 9), inputs(rng, 1, 40)):
        same(graphs(*x), plain(*x))


def test_turning_graphs_off_frees_recordings(model_dir, rng):
    graphs, plain = pair(model_dir, "bfloat16")
    x = inputs(rng, 2, 50)
    graphs(*x), graphs(*x)
    assert graphs.recorded_shapes == 1
    graphs.cuda_graphs = False
    assert graphs.recorded_shapes == 0
    for _ in range(3):
        same(graphs(*x), plain(*x))
    assert graphs.recorded_shapes == 0
    graphs.cuda_graphs = True
    for _ in range(2):
        same(graphs(*x), plain(*x))
    assert graphs.recorded_shapes == 1


def test_replay_is_ordered_on_torch_current_stream(model_dir, rng):
    graphs, plain = pair(model_dir, "float16")
    ids, mask, types = inputs(rng, 4, 64)
    ref = plain(ids, mask, types).last_hidden_state
    graphs(ids, mask, types), graphs(ids, mask, types)  # recorded
    s = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(s):
            torch.cuda._sleep(2_000_000)  # the producer is slow: a replay that ran early would see stale ids
            ids2 = ids * 1
            out = graphs(ids2, mask, types).last_hidden_state
            res = out.float().sum()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)
        assert torch.isfinite(res)


def test_each_replay_writes_only_its_own_callers_tensors(model_dir, rng):
    # A replay writes the final hidden states straight into the caller's tensor: every call's
    # outputs are kept alive (so each has its own address), one call in between has host outputs
    # (the replay then writes the session's buffer), and at the end each output must still be its
    # own call's: a replay that wrote an earlier caller's tensor would leave a wrong one behind.
    graphs, plain = pair(model_dir, "float16")
    kept = []
    for call in range(6):
        ids, mask, types = inputs(rng, 3, 40, left=call % 2 == 1)
        if call == 3:
            host = [t.cpu().numpy() for t in (ids, mask, types)]
            out, ref = graphs(*host), plain(*host)
            np.testing.assert_array_equal(out.last_hidden_state, ref.last_hidden_state)
            np.testing.assert_array_equal(out.pooler_output, ref.pooler_output)
            continue
        kept.append((graphs(ids, mask, types), plain(ids, mask, types)))
    assert len({out.last_hidden_state.data_ptr() for out, _ in kept}) == len(kept)
    for out, ref in kept:
        same(out, ref)
    assert graphs.recorded_shapes == 1


@pytest.mark.parametrize("case", [
    dict(family="bert", kind="cls", num_labels=3),        # the head reads the pooler
    dict(family="roberta", kind="cls", num_labels=2),     # the head's own dense on token 0
    dict(family="distilbert", kind="cls", num_labels=5),  # no pooler
    dict(family="bert", kind="token", num_labels=4),      # every row: not written in place
], ids=["bert-cls", "roberta-cls", "distilbert-cls", "bert-token"])
def test_head_outputs_of_kept_replays_match_op_by_op(case, tmp_path, rng):
    from tests._models import make_model

    make_model(tmp_path, hidden=64, heads=2, layers=2, seed=71, **case)
    graphs, plain = pair(tmp_path, "float16")
    kept = []
    for _ in range(4):
        ids, mask, types = inputs(rng, 2, 33)
        ids = ids % graphs.config["vocab_size"]  # these vocabularies are smaller
        types = torch.zeros_like(types)  # RoBERTa and DistilBERT have one token type
        kept.append((graphs(ids, mask, types), plain(ids, mask, types)))
    for out, ref in kept:
        assert torch.equal(out.last_hidden_state, ref.last_hidden_state)
        assert torch.equal(out.logits, ref.logits)
        if ref.pooler_output is None:
            assert out.pooler_output is None
        else:
            assert torch.equal(out.pooler_output, ref.pooler_output)
    assert graphs.recorded_shapes == 1


@pytest.mark.parametrize("offset", [2, 16], ids=["misaligned", "aligned"])
def test_native_callers_output_at_any_address_gets_the_right_values(model_dir, rng, offset):
    # Through the native call a caller may hand any address. The recorded kernels' vectors were
    # chosen for an aligned buffer: a tensor not 16-byte aligned gets the copy instead, an aligned
    # one at an offset is written in place; either way, op by op, recorded and replayed.
    graphs, plain = pair(model_dir, "float16")
    B, S = 2, 24
    H = graphs.config["hidden_size"]
    ids, mask, types = (t.to(torch.int32).contiguous() for t in inputs(rng, B, S))
    ref = plain(ids, mask, types)
    buf = torch.zeros(B * S * H + 16, device="cuda", dtype=torch.float16)
    start = offset // buf.element_size()
    for _ in range(3):  # op by op, recorded and replayed, replayed
        buf.zero_()
        pooled = torch.empty(B, H, device="cuda", dtype=torch.float16)
        graphs._native.forward_device(
            ids.data_ptr(), mask.data_ptr(), types.data_ptr(), B, S, buf.data_ptr() + offset,
            pooled.data_ptr(), 0, torch.cuda.current_stream().cuda_stream, True, -1, False,
            4, 4, 4)
        torch.cuda.synchronize()
        assert torch.equal(buf[start:start + B * S * H].view(B, S, H), ref.last_hidden_state)
        assert not buf[:start].any() and not buf[start + B * S * H:].any()  # nothing around it
        assert torch.equal(pooled, ref.pooler_output)
    assert graphs.recorded_shapes == 1
