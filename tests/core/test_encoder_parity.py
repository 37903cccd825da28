"""The whole encoder on the CPU against transformers.BertModel in float32 (max abs error <= 1e-4)."""

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert
from tests._util import assert_threads_match_sequential, ragged_mask

TOL = 1e-4

CONFIGS = [
    # (hidden, heads, layers, act): head dims 32, 48, 64; 1-4 layers; erf and tanh GELU
    (64, 2, 1, "gelu"),
    (96, 2, 2, "gelu_new"),
    (128, 2, 3, "gelu"),
    (96, 3, 4, "gelu_pytorch_tanh"),
]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"h{c[0]}-heads{c[1]}-L{c[2]}-{c[3]}")
def model_pair(request, tmp_path_factory):
    hidden, heads, layers, act = request.param
    path = tmp_path_factory.mktemp("bert")
    hf = make_bert(path, hidden=hidden, heads=heads, layers=layers, act=act, seed=hidden + layers)
    return hf, ftbert.Encoder.from_pretrained(path)


def run_both(hf, enc, ids, mask, types):
    with torch.no_grad():
        ref = hf(
            torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(mask).long(),
            token_type_ids=torch.from_numpy(types).long(),
        )
    out = enc(ids, mask, types)
    return out, ref


@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 7), (2, 128), (2, 512)])
@pytest.mark.parametrize("left", [False, True], ids=["right-pad", "left-pad"])
def test_matches_transformers_float32(model_pair, rng, batch, seq, left):
    hf, enc = model_pair
    ids = rng.integers(0, hf.config.vocab_size, (batch, seq)).astype(np.int64)
    mask = ragged_mask(rng, batch, seq, left=left)
    types = rng.integers(0, 2, (batch, seq))
    out, ref = run_both(hf, enc, ids, mask, types)
    valid = mask.astype(bool)
    assert np.isfinite(out.last_hidden_state).all()  # padded rows too
    err_h = np.abs(out.last_hidden_state - ref.last_hidden_state.numpy())[valid].max()
    err_p = np.abs(out.pooler_output - ref.pooler_output.numpy()).max()
    assert err_h <= TOL and err_p <= TOL, f"hidden {err_h:.2e}, pooler {err_p:.2e}"


def test_outputs_at_valid_positions_ignore_padding_tokens(model_pair, rng):
    hf, enc = model_pair
    B, S = 3, 40
    ids = rng.integers(0, hf.config.vocab_size, (B, S))
    mask = ragged_mask(rng, B, S)
    a = enc(ids, mask).last_hidden_state
    ids2 = np.where(mask == 1, ids, rng.integers(0, hf.config.vocab_size, (B, S)))
    b = enc(ids2, mask).last_hidden_state
    np.testing.assert_array_equal(a[mask == 1], b[mask == 1])


def test_right_padded_sequence_equals_it_alone(model_pair, rng):
    hf, enc = model_pair
    S, n = 50, 17
    ids = rng.integers(0, hf.config.vocab_size, (2, S))
    mask = np.ones((2, S), np.int32)
    mask[1, n:] = 0
    batched = enc(ids, mask).last_hidden_state[1, :n]
    alone = enc(ids[1:2, :n]).last_hidden_state[0]
    np.testing.assert_allclose(batched, alone, atol=1e-5)


def test_torch_inputs_give_torch_outputs(model_pair, rng):
    hf, enc = model_pair
    ids = torch.from_numpy(rng.integers(0, hf.config.vocab_size, (2, 9)))
    out = enc(ids)
    assert isinstance(out.last_hidden_state, torch.Tensor) and out.last_hidden_state.dtype == torch.float32
    assert out.last_hidden_state.shape == (2, 9, hf.config.hidden_size)
    ref = enc(ids.numpy()).last_hidden_state
    np.testing.assert_array_equal(out.last_hidden_state.numpy(), ref)


def test_workspace_stops_growing_at_a_steady_shape(model_pair, rng):
    hf, enc = model_pair
    ids = rng.integers(0, hf.config.vocab_size, (4, 64))
    enc(ids)
    held = enc.workspace_bytes
    for _ in range(5):
        enc(ids)
    assert enc.workspace_bytes == held
    enc(ids[:1, :5])  # smaller shapes reuse it
    assert enc.workspace_bytes == held


def test_shapes_in_any_order_stay_correct(model_pair, rng):
    # The workspace grows by tokens and by batch separately: long-and-narrow then short-and-wide.
    hf, enc = model_pair
    for batch, seq in [(1, 300), (9, 3), (2, 150), (17, 2), (1, 1)]:
        ids = rng.integers(0, hf.config.vocab_size, (batch, seq))
        out, ref = run_both(hf, enc, ids, np.ones((batch, seq), np.int64), np.zeros((batch, seq), np.int64))
        assert np.abs(out.last_hidden_state - ref.last_hidden_state.numpy()).max() <= TOL
        assert np.abs(out.pooler_output - ref.pooler_output.numpy()).max() <= TOL


def test_concurrent_forwards_from_threads_match_sequential(model_pair, rng):
    # Several threads on one encoder (serialized inside) and on the shared CPU thread pool.
    hf, enc = model_pair
    assert_threads_match_sequential(enc, rng, hf.config.vocab_size, max_len=200)


def test_cuda_graphs_setting_records_nothing_on_the_cpu(model_pair, rng):
    # On by default everywhere; the CPU backend records nothing, so repeated shapes run op by op.
    hf, enc = model_pair
    assert enc.cuda_graphs
    ids = rng.integers(0, hf.config.vocab_size, (2, 11))
    mask = ragged_mask(rng, 2, 11)
    types = np.zeros((2, 11), np.int64)
    outs = [run_both(hf, enc, ids, mask, types) for _ in range(3)]
    for out, ref in outs:
        valid = mask[..., None].astype(bool)
        assert np.abs((out.last_hidden_state - ref.last_hidden_state.numpy()) * valid).max() <= TOL
    assert enc.recorded_shapes == 0
