"""Batch invariance on the CPU: a reference sequence's outputs (hidden states at its tokens, pooler,
head logits) are the same bits whatever else is in the batch, the batch's size (up to 64) and
padded length, the reference's place in it, padded or packed, fused or unfused attention, and (for
families whose positions do not move with it) padding on the left. Hypothesis draws the
compositions.

What makes it hold on the CPU backend: every GEMM runs on the panel kernel, which sums each element
over k in order whatever the number of rows (cpp/cpu/gemm.cpp); the softmax sums a row's keys from
its first attended one; the other ops work row by row. Padding adds exact zeros. The GPU's kernels
depend on the row count unless `batch_invariant=True` (tests/cuda/test_batch_invariance.py)."""

import pytest

import ftbert
from ftbert import _C
from tests._invariance import check_invariance, head_kind, make_invariance_model

# (family, kind) -> whether a left-padded row's positions are a right-padded one's (RoBERTa's
# counted positions and MPNet's; BERT's absolute ones and ModernBERT's rotary angles move with the
# padding). ELECTRA's embeddings are narrower than its layers (the projection GEMM) and it runs
# the token head.
# "mean": ModernBERT's classifier_pooling "mean" (the head reads the mean of the tokens); "late":
# EuroBERT's (its dense and activation on every token, then their mean). The rotary families'
# angles move with the padding, as ModernBERT's. DeBERTa's terms read distances only (v3: no
# absolute positions).
MODELS = {("bert", "cls"): False, ("roberta", "cls"): True, ("mpnet", "cls"): True,
          ("distilbert", "cls"): False, ("electra", "token"): False, ("modernbert", "cls"): False,
          ("modernbert", "mean"): False, ("nomic_bert", "cls"): False, ("gte", "cls"): False,
          ("jina_embeddings_v3", "cls"): False, ("eurobert", "late"): False, ("deberta-v2", "cls"): True}
DTYPES = ["float32"] + ([] if _C.cpu_dtype_unsupported_reason("bfloat16") else ["bfloat16"])


@pytest.fixture(scope="module", params=list(MODELS), ids=lambda m: "-".join(m))
def model(request, tmp_path_factory):
    family, kind = request.param
    path = tmp_path_factory.mktemp(family)
    hf = make_invariance_model(path, family, kind, hidden=48, heads=3, seed=21)
    return request.param, path, hf.config.pad_token_id or 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_a_sequence_gives_the_same_bits_in_any_batch(model, dtype, attention, padding_free):
    (family, kind), path, pad = model
    enc = ftbert.Encoder.from_pretrained(path, dtype=dtype, attention=attention, padding_free=padding_free)
    check_invariance(enc, head_kind(kind), pad, left_ok=MODELS[(family, kind)], first_token_always=padding_free)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_invariant_runs_packed_and_stays_invariant(model, dtype):
    # Packed whatever padding_free says: a left-padded sequence's pooled output is its first real
    # token's (its positions still are its padded ones, as in transformers).
    (family, kind), path, pad = model
    enc = ftbert.Encoder.from_pretrained(path, dtype=dtype, padding_free=False, batch_invariant=True)
    assert enc.batch_invariant and enc.padding_free is False
    check_invariance(enc, head_kind(kind), pad, left_ok=MODELS[(family, kind)], first_token_always=True)


def test_the_setting_takes_auto_true_or_false(tmp_path):
    # The CPU's kernels are invariant either way: "auto", the default, leaves the switch off here, so
    # batches keep padding_free's choice; True packs every batch. Anything else is refused.
    make_invariance_model(tmp_path, "bert", "cls", hidden=48, heads=3, seed=5)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.batch_invariant is False
    enc.batch_invariant = True
    enc.attention = "unfused"
    enc.padding_free = False
    assert enc.batch_invariant is True
    enc.batch_invariant = "auto"
    assert enc.batch_invariant is False
    assert ftbert.Encoder.from_pretrained(tmp_path, batch_invariant="auto").batch_invariant is False
    assert ftbert.Encoder.from_pretrained(tmp_path, batch_invariant=True).batch_invariant is True
    for bad in ("on", "Auto", 1, None):
        with pytest.raises(TypeError, match='batch_invariant must be "auto", True or False'):
            ftbert.Encoder.from_pretrained(tmp_path, batch_invariant=bad)
        with pytest.raises(TypeError, match='batch_invariant must be "auto", True or False'):
            enc.batch_invariant = bad
    assert enc.batch_invariant is False  # a refused value changes nothing


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_int8_weights_keep_it(model, padding_free):
    # quantization="int8": each row of activations is quantized with its own scale and the integer
    # sums are exact, so the int8 GEMM is invariant as the float kernels are.
    import warnings

    (family, kind), path, pad = model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CPU without an int8 dot product is warned about, not refused
        enc = ftbert.Encoder.from_pretrained(path, quantization="int8", padding_free=padding_free)
    check_invariance(enc, head_kind(kind), pad, left_ok=MODELS[(family, kind)], first_token_always=padding_free)
