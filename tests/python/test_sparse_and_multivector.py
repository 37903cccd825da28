"""encode_sparse (SPLADE) and encode_multivector (ColBERT): rows equal to references built from
transformers' own models on the same tokens (log1p(relu(MaskedLM logits)) max-pooled over the
attended tokens of right-padded ragged batches; BertModel's hidden states through a saved linear,
normalized, padding dropped), for every family whose masked-LM head is read; the head chunked over
tokens gives the rows of one pass; top_k; the checkpoint layouts (colbert-ir's linear beside
`bert.`, PyLate's Dense module; tied and untied decoders, legacy LayerNorm names); and the errors
of a checkpoint without the head, a converted directory, a sentence-level Dense."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ftbert
from ftbert.weights_tools import MissingHead, convert_checkpoint
from tests._models import make_bert, make_model
from tests._tokenizers import write_bpe_tokenizer, write_unigram_tokenizer, write_wordpiece_tokenizer
from tests._vocab import random_texts

GPU = ftbert.cuda_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="no CUDA GPU")])]
VOCAB = 150
MAX_POS = 64
TOL = 1e-4  # float32 against transformers' float32
# Where an index may be zero in one and not the other: a max over tokens that rounds across 0.
BORDER = 1e-5
# Every family whose masked-LM head weights_tools/mlm_head.py reads, and the tokenizer its
# checkpoints ship.
FAMILIES = {"bert": "wordpiece", "distilbert": "distilbert", "roberta": "bpe", "xlm-roberta": "unigram",
            "camembert": "bpe", "electra": "wordpiece", "mpnet": "wordpiece", "modernbert": "wordpiece"}


def write_tokenizer(path, kind: str) -> None:
    if kind == "bpe":
        write_bpe_tokenizer(path, VOCAB, model_max_length=MAX_POS)
    elif kind == "unigram":
        write_unigram_tokenizer(path, VOCAB, model_max_length=MAX_POS)
    else:
        write_wordpiece_tokenizer(path, VOCAB, model_max_length=MAX_POS,
                                  tokenizer_class="DistilBertTokenizer" if kind == "distilbert" else "BertTokenizer")


def make_mlm(path, family: str, seed: int = 0, **extra):
    """A random *ForMaskedLM checkpoint with its tokenizer; its vocabulary bias lowered so that
    about half the vocabulary stays at zero after the max (a sparse vector, as SPLADE's are)."""
    model = make_model(path, family, kind="mlm", vocab=VOCAB, max_pos=MAX_POS, seed=seed, fill_biases=True, **extra)
    with torch.no_grad():
        model.get_output_embeddings().bias.sub_(0.3)
    model.save_pretrained(path)
    write_tokenizer(path, FAMILIES[family])
    return model


def load(path, **kw) -> ftbert.Encoder:
    with warnings.catch_warnings():  # the MLM head "is left out" of the plain encoder: expected
        warnings.simplefilter("ignore", UserWarning)
        return ftbert.Encoder.from_pretrained(path, **kw)


def padded(enc, texts):
    """Right-padded ids and mask of texts, tokenized as encode tokenizes them."""
    batch = enc.tokenizer(texts, padding=True, truncation=True, max_length=enc.max_seq_length, return_tensors="pt")
    assert enc.tokenizer.padding_side == "right"
    return batch["input_ids"], batch["attention_mask"]


def sparse_reference(model, enc, texts) -> np.ndarray:
    """SPLADE from transformers' MaskedLM logits: float64 [N, V], log1p(relu) max over attended tokens."""
    ids, mask = padded(enc, texts)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.double()
    act = torch.log1p(torch.relu(logits)) * mask[..., None]  # padding can only lower the max (act >= 0)
    return act.amax(1).numpy()


def dense(rows, vocab: int) -> np.ndarray:
    out = np.zeros((len(rows), vocab))
    for r, (idx, val) in enumerate(rows):
        assert idx.dtype == np.int64 and val.dtype == np.float32 and idx.shape == val.shape
        assert (np.diff(idx) > 0).all(), "indices sorted, no repeats"
        assert (val != 0).all(), "only non-zero entries"
        out[r, idx] = val
    return out


def assert_sparse_rows(rows, want: np.ndarray, tol: float = TOL) -> None:
    got = dense(rows, want.shape[1])
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    differ = (got != 0) != (want != 0)
    assert (np.maximum(got, want)[differ] < BORDER).all(), "the same indices, but for values at 0 within rounding"


# ---- encode_sparse --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    """family -> (path, transformers model) of a random *ForMaskedLM checkpoint, made once."""
    made = {}

    def get(family):
        if family not in made:
            path = tmp_path_factory.mktemp(f"mlm-{family}")
            made[family] = (path, make_mlm(path, family).eval())
        return made[family]

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sparse_equals_log1p_relu_of_masked_lm_logits_max_over_attended_tokens(mlm, rng, family):
    path, model = mlm(family)
    enc = load(path)
    texts = random_texts(rng, int(rng.integers(3, 9)))  # ragged: right padding in the reference
    want = sparse_reference(model, enc, texts)
    assert (want == 0).any() and (want > 0).any()
    rows = enc.encode_sparse(texts)
    assert len(rows) == len(texts)
    assert_sparse_rows(rows, want)
    one = enc.encode_sparse(texts[0])  # one str: one row
    assert len(one) == 1
    assert_sparse_rows(one, want[:1])


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_in_small_chunks_and_batches_gives_one_pass_rows(mlm, rng, device):
    path, model = mlm("bert")
    enc = load(path, device=device)
    texts = random_texts(rng, 40)
    want = sparse_reference(model, enc, texts)
    whole = enc.encode_sparse(texts)
    assert_sparse_rows(whole, want)
    # 7 tokens a chunk: sequences cut across chunks, several sequences in one; a few batches.
    for chunk, budget in ((7, 16384), (1, 256), (1000, 200)):
        rows = enc.encode_sparse(texts, chunk_tokens=chunk, max_batch_tokens=budget, batch_size=9)
        assert_sparse_rows(rows, want)
        np.testing.assert_allclose(dense(rows, VOCAB), dense(whole, VOCAB), rtol=0, atol=1e-6)


def test_sparse_from_packed_keeps_empty_sequences_empty_and_chunks_exact(mlm, rng):
    path, model = mlm("distilbert")
    enc = load(path)
    lengths = [5, 0, 13, 1, 0, 9]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    hidden = rng.standard_normal((int(cu[-1]), enc.hidden_size)).astype(np.float32)
    with torch.no_grad():
        x = torch.from_numpy(hidden)
        x = model.vocab_layer_norm(model.activation(model.vocab_transform(x)))
        act = torch.log1p(torch.relu(model.vocab_projector(x))).double().numpy()
    want = np.stack([act[a:b].max(0) if b > a else np.zeros(VOCAB) for a, b in zip(cu[:-1], cu[1:])])
    for chunk in (None, 1, 4, 5, 100):
        rows = enc.sparse_from_packed(hidden, cu, chunk_tokens=chunk)
        assert [len(i) for i, _ in rows][1] == 0 and len(rows[4][0]) == 0
        assert_sparse_rows(rows, want)


def test_top_k_keeps_the_k_largest_sorted_by_index(mlm, rng):
    path, _ = mlm("roberta")
    enc = load(path)
    texts = random_texts(rng, 6)
    full = enc.encode_sparse(texts)
    for k in (1, 5, VOCAB):
        for (idx, val), (fi, fv) in zip(enc.encode_sparse(texts, top_k=k), full):
            assert len(idx) == min(k, len(fi)) and (np.diff(idx) > 0).all()
            order = np.lexsort((fi, -fv))[:k]
            np.testing.assert_array_equal(idx, np.sort(fi[order]))
            np.testing.assert_allclose(val, fv[np.isin(fi, idx)], rtol=0, atol=1e-6)


def test_untied_decoder_and_legacy_layer_norm_names_are_read(tmp_path, rng):
    from transformers import BertForMaskedLM

    # tie_word_embeddings false, and a decoder weight of its own in the file: that one must be used.
    make_mlm(tmp_path, "bert")
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["cls.predictions.decoder.weight"] = torch.randn(VOCAB, 48) * 0.05
    # transformers 5 unties the decoder's bias with its weight: its own, not cls.predictions.bias, is added.
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"] + torch.randn(VOCAB) * 0.1
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    model = BertForMaskedLM.from_pretrained(tmp_path).eval()
    assert not torch.equal(model.cls.predictions.decoder.weight, model.bert.embeddings.word_embeddings.weight)
    assert torch.equal(model.cls.predictions.decoder.bias, tensors["cls.predictions.decoder.bias"])
    enc = load(tmp_path)
    texts = random_texts(rng, 4)
    want = sparse_reference(model, enc, texts)
    assert_sparse_rows(enc.encode_sparse(texts), want)
    # Old BERT checkpoints spell the head's LayerNorm gamma / beta.
    tensors = load_file(tmp_path / "model.safetensors")
    for old, new in (("weight", "gamma"), ("bias", "beta")):
        prefix = "cls.predictions.transform.LayerNorm."
        tensors[prefix + new] = tensors.pop(prefix + old)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert_sparse_rows(load(tmp_path).encode_sparse(texts), want)


def test_masked_lm_checkpoint_still_loads_its_encoder_with_the_warning(mlm):
    path, _ = mlm("bert")
    with pytest.warns(UserWarning, match="is not supported and is left out"):
        ftbert.Encoder.from_pretrained(path)


def test_sparse_without_a_masked_lm_head_names_the_directory_and_the_tensor(tmp_path):
    make_bert(tmp_path, hidden=48, heads=3, layers=1, vocab=VOCAB, max_pos=MAX_POS)
    write_tokenizer(tmp_path, "wordpiece")
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    with pytest.raises(MissingHead, match="cls.predictions.transform.dense.weight") as e:
        enc.encode_sparse(["a text"])
    assert str(tmp_path) in str(e.value) and "ForMaskedLM" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert "cls.predictions" in enc.unavailable_reason("sparse")


def test_sparse_of_a_converted_directory_says_to_load_the_huggingface_one(mlm, tmp_path):
    path, _ = mlm("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        convert_checkpoint(path, tmp_path / "conv", progress=False)
    enc = ftbert.Encoder.from_pretrained(tmp_path / "conv")
    for method in (enc.encode_sparse, enc.encode_multivector):
        with pytest.raises(MissingHead, match="ftbert-converted.*HuggingFace checkpoint directory"):
            method(["a text"])
    assert "ftbert-converted" in enc.unavailable_reason("sparse")


@pytest.mark.parametrize("bad, error", [({"top_k": 0}, ValueError), ({"top_k": 2.0}, TypeError),
                                        ({"chunk_tokens": 0}, ValueError), ({"batch_size": None}, TypeError)])
def test_bad_sparse_arguments_are_refused_by_name(mlm, bad, error):
    enc = load(mlm("bert")[0])
    with pytest.raises(error, match=next(iter(bad))):
        enc.encode_sparse(["a text"], **bad)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        enc.encode_sparse(["a text", 3])


# ---- the encoder's dtype --------------------------------------------------------------------------
def _cpu_bfloat16() -> bool:
    from ftbert._native import _C

    return not _C.cpu_dtype_unsupported_reason("bfloat16")


LOW_PRECISION = [
    pytest.param("cpu", "bfloat16", marks=pytest.mark.skipif(not _cpu_bfloat16(), reason="no AVX512-BF16 CPU")),
    pytest.param("cuda", "float16", marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="no CUDA GPU")]),
    pytest.param("cuda", "bfloat16", marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="no CUDA GPU")]),
]
# bfloat16 keeps 8 bits: a head's outputs of order 1 move by about 1e-2 through two GEMMs.
LOW_TOL = {"float16": 1e-2, "bfloat16": 5e-2}


@pytest.mark.parametrize("device, dtype", LOW_PRECISION)
def test_heads_in_the_encoders_dtype_stay_near_float32(tmp_path, mlm, rng, device, dtype):
    path, _ = mlm("bert")
    texts = random_texts(rng, 12)
    want = dense(load(path).encode_sparse(texts), VOCAB)
    low = load(path, device=device, dtype=dtype)
    got = dense(low.encode_sparse(texts, chunk_tokens=5), VOCAB)
    tol = LOW_TOL[dtype]
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    differ = (got != 0) != (want != 0)
    assert (np.maximum(got, want)[differ] < tol).all()
    make_colbert(tmp_path, "pylate", bias=True)
    f32 = load(tmp_path).encode_multivector(texts)
    assert_vectors(load(tmp_path, device=device, dtype=dtype).encode_multivector(texts), f32, tol=tol)


# ---- encode_multivector ---------------------------------------------------------------------------
DIM = 24


def make_colbert(path, layout: str, seed: int = 0, bias: bool = False, activation: str = "Identity"):
    """A ColBERT checkpoint of a random BertModel and a random linear [DIM, H]: colbert-ir's layout
    (`linear.weight` beside `bert.*` in model.safetensors, HF_ColBERT) or PyLate's (a plain BertModel
    directory, modules.json and 1_Dense/). Returns (BertModel, weight, bias or None)."""
    model = make_bert(path, hidden=48, heads=3, layers=2, vocab=VOCAB, max_pos=MAX_POS, seed=seed, fill_biases=True)
    write_tokenizer(path, "wordpiece")
    g = torch.Generator().manual_seed(seed + 1)
    weight = torch.randn(DIM, 48, generator=g) * 0.2
    b = torch.randn(DIM, generator=g) * 0.1 if bias else None
    if layout == "colbert-ir":
        tensors = {"bert." + k: v.contiguous() for k, v in model.state_dict().items()}
        tensors["linear.weight"] = weight
        if b is not None:
            tensors["linear.bias"] = b
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**cfg, "architectures": ["HF_ColBERT"]}))
    else:
        (path / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
        (path / "1_Dense").mkdir()
        module = "linear" if activation == "Identity" else "activation"
        (path / "1_Dense" / "config.json").write_text(json.dumps({
            "in_features": 48, "out_features": DIM, "bias": b is not None,
            "activation_function": f"torch.nn.modules.{module}.{activation}"}))
        tensors = {"linear.weight": weight, **({} if b is None else {"linear.bias": b})}
        save_file(tensors, path / "1_Dense" / "model.safetensors", metadata={"format": "pt"})
    return model.eval(), weight, b


def multivector_reference(model, enc, texts, weight, bias, activation=None, normalize=True) -> list[np.ndarray]:
    ids, mask = padded(enc, texts)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.double()
        out = hidden @ weight.double().T + (0 if bias is None else bias.double())
        if activation is not None:
            out = activation(out)
        if normalize:
            out = torch.nn.functional.normalize(out, dim=-1)
    return [out[i, : int(mask[i].sum())].numpy() for i in range(len(texts))]


def assert_vectors(got, want, tol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout, bias, activation", [("colbert-ir", False, None), ("pylate", False, None),
                                                      ("pylate", True, None), ("pylate", True, "Tanh")])
def test_multivector_is_each_tokens_hidden_state_projected_and_normalized(tmp_path, rng, device, layout, bias,
                                                                          activation):
    model, weight, b = make_colbert(tmp_path, layout, bias=bias, activation=activation or "Identity")
    enc = load(tmp_path, device=device)
    texts = random_texts(rng, int(rng.integers(3, 12)))
    act = torch.tanh if activation == "Tanh" else None
    want = multivector_reference(model, enc, texts, weight, b, act)
    got = enc.encode_multivector(texts)
    assert_vectors(got, want, tol=1e-5 if device == "cpu" else 1e-4)
    np.testing.assert_allclose(np.linalg.norm(got[0], axis=1), 1, rtol=0, atol=1e-5)
    raw = enc.encode_multivector(texts, normalize=False, max_batch_tokens=64, batch_size=2)
    assert_vectors(raw, multivector_reference(model, enc, texts, weight, b, act, normalize=False),
                   tol=1e-5 if device == "cpu" else 1e-4)


def test_multivector_without_a_projection_says_it_is_not_colbert(mlm):
    enc = load(mlm("bert")[0])
    with pytest.raises(MissingHead, match="no token projection.*linear.weight.*not a ColBERT checkpoint") as e:
        enc.encode_multivector(["a text"])
    assert str(mlm("bert")[0]) in str(e.value)


def test_a_dense_after_pooling_is_a_sentence_projection_not_colbert(tmp_path):
    make_colbert(tmp_path, "pylate")
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules.insert(1, {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    modules[2]["idx"] = 2
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    enc = load(tmp_path)
    with pytest.raises(MissingHead, match="follows the Pooling module"):
        enc.encode_multivector(["a text"])


def test_an_unknown_dense_activation_is_refused_by_name(tmp_path):
    make_colbert(tmp_path, "pylate")
    cfg = json.loads((tmp_path / "1_Dense" / "config.json").read_text())
    (tmp_path / "1_Dense" / "config.json").write_text(json.dumps({**cfg, "activation_function": "my.Swish"}))
    with pytest.raises(ValueError, match="activation_function 'my.Swish'"):
        load(tmp_path).encode_multivector(["a text"])


def test_a_model_with_both_heads_gives_both(tmp_path, rng):
    # A masked-LM checkpoint with a projection saved beside it: the heads are independent.
    model = make_mlm(tmp_path, "bert")
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["linear.weight"] = torch.randn(DIM, 48) * 0.2
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    enc = load(tmp_path)
    texts = random_texts(rng, 3)
    assert_sparse_rows(enc.encode_sparse(texts), sparse_reference(model, enc, texts))
    assert [v.shape[1] for v in enc.encode_multivector(texts)] == [DIM] * 3
    assert enc.unavailable_reason("sparse") is None and enc.unavailable_reason("multivector") is None
