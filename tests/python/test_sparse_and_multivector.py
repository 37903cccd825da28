"""encode_sparse (SPLADE) and encode_multivector (ColBERT): rows equal to references built from
transformers' own models on the same tokens (log1p(relu(MaskedLM logits)) max-pooled over the
attended tokens of right-padded ragged batches; BertModel's hidden states through a saved linear,
normalized, padding dropped), for every family whose masked-LM head is read; the head chunked over
tokens gives the rows of one pass; top_k; the checkpoint layouts (colbert-ir's linear beside
`bert.`, PyLate's Dense module; tied and untied decoders, legacy LayerNorm names); and the errors
of a checkpoint without the head, a converted directory, a sentence-level Dense."""

from __future__ import annotations

import json
import re
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

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


# ---- ColBERT's queries and documents (markers, [MASK] expansion, skiplist) ------------------------
# The references below follow each implementation's own steps on batched, padded tensors:
# colbert-ir's QueryTokenizer / DocTokenizer.tensorize and ColBERT.query / doc
# (colbert/modeling/tokenization/*.py, colbert/modeling/colbert.py), PyLate's ColBERT.tokenize and
# encode (pylate/models/colbert.py), on transformers' BertModel and the saved projection.
COLBERT_IR_META = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 12,
                   "doc_maxlen": 20, "attend_to_mask_tokens": False, "mask_punctuation": True, "dim": DIM}
PYLATE_CONFIG = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 12, "document_length": 20,
                 "attend_to_expansion_tokens": False, "do_query_expansion": True,
                 "skiplist_words": [".", ",", "!", "?", "#"], "similarity_fn_name": "MaxSim", "model_type": "ColBERT"}


def write_marker_tokenizer(path, layout: str):
    """A WordPiece tokenizer whose vocabulary holds the markers: colbert-ir's [unused0] / [unused1]
    in the vocabulary (as BERT's are), PyLate's "[Q] " / "[D] " added after it (as PyLate adds them).
    Every id fits VOCAB."""
    import transformers

    from tests._vocab import write_vocab

    vocab = write_vocab(path, VOCAB - 2)  # [PAD] [UNK] [CLS] [SEP] [MASK], letters, "." "," "!" "?", words
    if layout == "colbert-ir":
        vocab = vocab[:1] + ["[unused0]", "[unused1]"] + vocab[1:]
    tok = transformers.BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, model_max_length=MAX_POS)
    if layout == "pylate":
        tok.add_tokens(["[Q] ", "[D] "])
    assert len(tok) == VOCAB
    tok.save_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path)


def make_marked_colbert(path, layout: str, settings: dict | None = None, seed: int = 0, bias: bool = False):
    """make_colbert's checkpoint with a marker tokenizer and the layout's settings file (`settings`
    changes the defaults above; None leaves a key out). Returns (model, weight, bias, tokenizer)."""
    model, weight, b = make_colbert(path, layout, seed=seed, bias=bias)
    tok = write_marker_tokenizer(path, layout)
    base = COLBERT_IR_META if layout == "colbert-ir" else PYLATE_CONFIG
    values = {k: v for k, v in {**base, **(settings or {})}.items() if v is not None}
    name = "artifact.metadata" if layout == "colbert-ir" else "config_sentence_transformers.json"
    (path / name).write_text(json.dumps(values))
    return model, weight, b, tok


def _insert_prefix_token(t, value):
    """colbert/modeling/tokenization/utils.py's _insert_prefix_token (PyLate's insert_prefix_token)."""
    return torch.cat([t[:, :1], torch.full((t.shape[0], 1), value, dtype=t.dtype), t[:, 1:]], dim=1)


def colbert_ir_reference(model, tok, texts, weight, meta, is_query):
    import string

    meta = {**ftbert.weights_tools.extra_heads.COLBERT_IR_DEFAULTS, **meta}
    if is_query:
        marker, maxlen = tok.convert_tokens_to_ids(meta["query_token_id"]), meta["query_maxlen"]
        obj = tok(texts, padding="max_length", truncation=True, return_tensors="pt", max_length=maxlen - 1)
    else:
        marker, maxlen = tok.convert_tokens_to_ids(meta["doc_token_id"]), meta["doc_maxlen"]
        obj = tok(texts, padding="longest", truncation="longest_first", return_tensors="pt", max_length=maxlen - 1)
    ids, mask = _insert_prefix_token(obj["input_ids"], marker), _insert_prefix_token(obj["attention_mask"], 1)
    if is_query:
        ids[ids == tok.pad_token_id] = tok.mask_token_id
        if meta["attend_to_mask_tokens"]:
            mask[ids == tok.mask_token_id] = 1
    skiplist = set()
    if not is_query and meta["mask_punctuation"]:
        skiplist = {w for s in string.punctuation for w in (s, tok.encode(s, add_special_tokens=False)[0])}
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state.double() @ weight.double().T
    keep = torch.tensor([[x not in skiplist and x != tok.pad_token_id for x in row] for row in ids.tolist()])
    out = torch.nn.functional.normalize(out * keep[..., None], dim=2)
    return [out[i][keep[i]].numpy() for i in range(len(texts))]


def pylate_reference(model, tok, texts, weight, bias, config, is_query):
    config = {**ftbert.weights_tools.extra_heads.PYLATE_DEFAULTS, **config}
    prefix = config["query_prefix" if is_query else "document_prefix"]
    maxlen = config["query_length" if is_query else "document_length"]
    prefix_id = tok.convert_tokens_to_ids(prefix) if prefix else None
    expand = is_query and config["do_query_expansion"]
    tok.pad_token_id = tok.mask_token_id  # PyLate pads with the mask token
    texts = [t.strip() for t in texts]  # sentence-transformers' Transformer.tokenize
    obj = tok(texts, padding="max_length" if expand else True, truncation="longest_first", return_tensors="pt",
              max_length=maxlen - 1 if prefix_id is not None else maxlen)
    ids, mask, types = obj["input_ids"], obj["attention_mask"], obj["token_type_ids"]
    if prefix_id is not None:
        ids, mask, types = (_insert_prefix_token(t, v) for t, v in ((ids, prefix_id), (mask, 1), (types, 0)))
    if expand and config["attend_to_expansion_tokens"]:
        mask.fill_(1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state.double()
        out = out @ weight.double().T + (0 if bias is None else bias.double())
    if not is_query:
        skiplist = [tok.convert_tokens_to_ids(w) for w in config["skiplist_words"]]
        keep = ~torch.isin(ids, torch.tensor(skiplist)) & mask.bool()
    else:
        keep = torch.ones_like(ids, dtype=torch.bool) if expand else mask.bool()
    return [torch.nn.functional.normalize(out[i][keep[i]], dim=1).numpy() for i in range(len(texts))]


def colbert_texts(rng, n):
    """Short and long texts (past the document length) with punctuation, one empty."""
    texts = random_texts(rng, n - 1, max_words=30)
    texts[0] = "Hello, world! " + texts[0]  # a skiplist token and an unknown one ("#") in one text
    return texts + [""]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attend", [False, True])
def test_colbert_ir_queries_and_documents_are_marked_expanded_and_skipped_as_colbert_ir_does(tmp_path, rng, device,
                                                                                             attend):
    meta = {**COLBERT_IR_META, "attend_to_mask_tokens": attend}
    model, weight, _, tok = make_marked_colbert(tmp_path, "colbert-ir", meta)
    enc = load(tmp_path, device=device)
    texts = colbert_texts(rng, 9)
    tol = 1e-5 if device == "cpu" else 1e-4
    queries = enc.encode_multivector(texts, is_query=True, batch_size=3)
    assert_vectors(queries, colbert_ir_reference(model, tok, texts, weight, meta, is_query=True), tol=tol)
    assert all(len(q) == meta["query_maxlen"] for q in queries)  # [MASK]-expanded or cut
    docs = enc.encode_multivector(texts)  # documents by default
    assert_vectors(docs, colbert_ir_reference(model, tok, texts, weight, meta, is_query=False), tol=tol)
    # Punctuation is dropped from documents: fewer rows than tokens for a text that has some.
    doc_tokens = len(tok(texts[0], truncation=True, max_length=COLBERT_IR_META["doc_maxlen"] - 1)["input_ids"]) + 1
    assert len(docs[0]) < doc_tokens


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("settings", [{}, {"attend_to_expansion_tokens": True}, {"do_query_expansion": False},
                                      {"query_prefix": "", "skiplist_words": None, "query_length": None}])
def test_pylate_queries_and_documents_follow_pylates_settings(tmp_path, rng, device, settings):
    model, weight, b, tok = make_marked_colbert(tmp_path, "pylate", settings, bias=True)
    enc = load(tmp_path, device=device)
    texts = colbert_texts(rng, 8) + ["  spaced out  "]
    config = {k: v for k, v in {**PYLATE_CONFIG, **settings}.items() if v is not None}
    tol = 1e-5 if device == "cpu" else 1e-4
    for is_query in (True, False):
        got = enc.encode_multivector(texts, is_query=is_query, max_batch_tokens=64)
        assert_vectors(got, pylate_reference(model, tok, texts, weight, b, config, is_query), tol=tol)


@pytest.mark.parametrize("layout, settings", [("colbert-ir", {}), ("colbert-ir", {"attend_to_mask_tokens": True}),
                                              ("pylate", {}), ("pylate", {"do_query_expansion": False})])
def test_sentence_transformers_multi_vector_encoder_agrees(tmp_path, rng, layout, settings):
    # A second, independent reading of both layouts: sentence-transformers' MultiVectorEncoder
    # (6.x) loads colbert-ir and PyLate checkpoints as their implementations run them.
    st = pytest.importorskip("sentence_transformers")
    if not hasattr(st, "MultiVectorEncoder"):
        pytest.skip(f"sentence-transformers {st.__version__} has no MultiVectorEncoder")
    make_marked_colbert(tmp_path, layout, settings, bias=layout == "pylate")
    enc = load(tmp_path)
    texts = colbert_texts(rng, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = st.MultiVectorEncoder(str(tmp_path), device="cpu")
    for is_query in (True, False):
        want = model.encode_query(texts) if is_query else model.encode_document(texts)
        assert_vectors(enc.encode_multivector(texts, is_query=is_query), [np.asarray(w, np.float64) for w in want])


def test_queries_and_documents_of_one_text_differ_by_marker_and_expansion(tmp_path):
    # A short text without punctuation: as a document its tokens and the marker, as a query the
    # same padded with [MASK] to query_maxlen; the two kinds' vectors differ from the first token on
    # (the marker is another token, so every token's context is another).
    make_marked_colbert(tmp_path, "colbert-ir")
    enc = load(tmp_path)
    texts = ["the of and", "he was"]
    tokens = [len(ids) for ids in enc.tokenizer(texts)["input_ids"]]
    queries, docs = enc.encode_multivector(texts, is_query=True), enc.encode_multivector(texts, is_query=False)
    assert [len(d) for d in docs] == [n + 1 for n in tokens]
    assert [len(q) for q in queries] == [COLBERT_IR_META["query_maxlen"]] * 2
    for q, d in zip(queries, docs):
        assert np.abs(q[: len(d)] - d).max(axis=1).min() > 1e-3


def test_without_settings_texts_go_in_as_they_are_with_one_warning(tmp_path, rng):
    model, weight, b = make_colbert(tmp_path, "colbert-ir")
    enc = load(tmp_path)
    texts = random_texts(rng, 4)
    want = multivector_reference(model, enc, texts, weight, b)
    with pytest.warns(UserWarning, match=r"no ColBERT settings.*has no artifact.metadata") as caught:
        got = enc.encode_multivector(texts, is_query=True)
    assert len([w for w in caught if "ColBERT settings" in str(w.message)]) == 1
    assert_vectors(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the second call and the other kind warn no more
        assert_vectors(enc.encode_multivector(texts), want)
        assert_vectors(load(tmp_path).encode_multivector(texts, is_query=True), want)


def test_a_pylate_checkpoint_without_its_settings_warns_naming_the_file(tmp_path, rng):
    make_colbert(tmp_path, "pylate")
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": "MaxSim"}))
    with pytest.warns(UserWarning, match="config_sentence_transformers.json has no query_prefix / document_prefix"):
        load(tmp_path).encode_multivector(random_texts(rng, 2), is_query=True)


def test_pylates_saved_max_seq_length_does_not_cut_documents(tmp_path, rng):
    # PyLate saves the max_seq_length it last set (here a query's); documents still reach document_length.
    model, weight, b, tok = make_marked_colbert(tmp_path, "pylate")
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 11, "do_lower_case": False}))
    enc = load(tmp_path)
    assert enc.max_seq_length == MAX_POS
    texts = [" ".join(["word"] * 40)]
    got = enc.encode_multivector(texts)
    assert len(got[0]) == PYLATE_CONFIG["document_length"]
    assert_vectors(got, pylate_reference(model, tok, texts, weight, b, PYLATE_CONFIG, False))


class _OverlapGate:
    """An encoder's engine (`_native`) seen through a gate: the first forward from a thread named
    `waiter...` waits, inside its engine call, until another thread has run a whole forward
    meanwhile, so the two overlap whatever the scheduling. Other attributes pass through."""

    def __init__(self, native, waiter: str):
        object.__setattr__(self, "_gate", (native, waiter, threading.Event(), threading.Event()))

    def __getattr__(self, name):
        return getattr(self._gate[0], name)

    def __setattr__(self, name, value):
        setattr(self._gate[0], name, value)

    def forward_host(self, *args):
        native, waiter, waiting, overlapped = self._gate
        if threading.current_thread().name.startswith(waiter) and not overlapped.is_set():
            waiting.set()
            assert overlapped.wait(60), "no forward ran beside the gated one"
            return native.forward_host(*args)
        inside = waiting.is_set() and not overlapped.is_set()
        out = native.forward_host(*args)
        if inside:
            overlapped.set()
        return out


def test_padded_queries_leave_other_threads_forwards_on_the_encoders_setting(tmp_path, rng):
    # One thread's ColBERT queries (unattended [MASK] rows: padded calls) beside plain forwards on
    # one padding_free=True encoder, one of them run while a query's padded call is inside the
    # engine: the plain ones see padding_free True and stay packed throughout (zeros at padding,
    # where a padded forward has rows).
    from tests._util import ragged_mask

    make_marked_colbert(tmp_path, "colbert-ir")
    enc = load(tmp_path, padding_free=True, concurrency=2)
    # The one-word text is a query shorter than the query length, so some call runs padded (random
    # texts alone can all fill it, and then no call would reach the gate).
    texts = random_texts(rng, 6, max_words=6) + ["Short."]
    want_queries = enc.encode_multivector(texts, is_query=True, batch_size=3)
    ids = rng.integers(5, VOCAB, (5, 19))
    mask = ragged_mask(rng, 5, 19)
    mask[3, 6:] = 0
    want = enc(ids, mask).last_hidden_state
    assert (want[mask == 0] == 0).all()
    enc._native = _OverlapGate(enc._native, waiter="colbert-queries")

    def queries():
        for _ in range(5):
            assert_vectors(enc.encode_multivector(texts, is_query=True, batch_size=3), want_queries, tol=0)

    plain_forwards = 0
    with ThreadPoolExecutor(1, thread_name_prefix="colbert-queries") as pool:
        done = pool.submit(queries)
        while not done.done():
            assert enc.padding_free is True
            np.testing.assert_array_equal(enc(ids, mask).last_hidden_state, want)
            plain_forwards += 1
        done.result()
    assert plain_forwards >= 1 and enc._native._gate[3].is_set()
    assert enc.padding_free is True and enc._native.padding_free is True


def test_unattended_query_expansion_runs_padded_under_batch_invariance(tmp_path, rng):
    # batch_invariant packs every other forward; the queries' padded calls keep its kernels, so
    # a query's vectors are the same bits whatever queries share its batch.
    model, weight, _, tok = make_marked_colbert(tmp_path, "colbert-ir")
    enc = load(tmp_path, batch_invariant=True)
    texts = colbert_texts(rng, 7)
    alone = [enc.encode_multivector([t], is_query=True)[0] for t in texts]
    assert_vectors(alone, colbert_ir_reference(model, tok, texts, weight, COLBERT_IR_META, is_query=True), tol=1e-5)
    for batch_size in (2, 5):
        assert_vectors(enc.encode_multivector(texts, is_query=True, batch_size=batch_size), alone, tol=0)
    assert_vectors(enc.encode_multivector(texts[::-1], is_query=True, batch_size=3)[::-1], alone, tol=0)
    assert enc.batch_invariant and len(enc.encode_multivector(["a text"])) == 1  # documents: packed


@pytest.mark.parametrize("layout, settings, pattern", [
    ("colbert-ir", {"query_token_id": "[unused7]"}, r"query_token_id '\[unused7\]' is not a token"),
    ("pylate", {"document_prefix": "[Doc] "}, r"document_prefix '\[Doc\] ' is not a token"),
    ("colbert-ir", {"query_maxlen": "32"}, r"artifact.metadata: query_maxlen must be a positive integer"),
    ("pylate", {"document_length": MAX_POS + 1}, r"document length 65 is more than the model's 64 positions"),
])
def test_settings_the_checkpoint_cannot_follow_are_refused_by_name(tmp_path, layout, settings, pattern):
    make_marked_colbert(tmp_path, layout, settings)
    with pytest.raises(ValueError, match=pattern):
        load(tmp_path).encode_multivector(["a text"], is_query=True)


def test_is_query_must_be_a_bool(tmp_path):
    make_marked_colbert(tmp_path, "colbert-ir")
    with pytest.raises(TypeError, match="is_query must be True or False"):
        load(tmp_path).encode_multivector(["a text"], is_query="yes")


# ---- /embed_multivector's is_query (the server) ----------------------------------------------------
def _serve_extra():
    from ftbert.serving import missing_serve_extra

    message = missing_serve_extra()
    if message:
        pytest.skip(message)


@pytest.fixture(scope="module")
def marked_colbert(tmp_path_factory):
    """A colbert-ir checkpoint whose queries' [MASK] tokens are not attended (colbertv2.0's setting)
    and a PyLate one whose are: (path, Encoder) each."""
    made = {}
    for name, layout, settings in (("ir", "colbert-ir", {}),
                                   ("pylate", "pylate", {"attend_to_expansion_tokens": True})):
        path = tmp_path_factory.mktemp(name)
        make_marked_colbert(path, layout, settings, bias=layout == "pylate")
        made[name] = (path, load(path))
    return made


def _vectors(reply):
    assert reply.status_code == 200, reply.text
    return [np.asarray(v, np.float32) for v in reply.json()]


@pytest.mark.parametrize("name", ["ir", "pylate"])
def test_the_route_gives_documents_by_default_and_queries_with_is_query(marked_colbert, rng, name):
    _serve_extra()
    import httpx

    from tests.serving._helpers import serve

    path, enc = marked_colbert[name]
    texts = colbert_texts(rng, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        server = serve(path)
    with server:
        post = lambda body: httpx.post(server.url + "/embed_multivector", json=body, timeout=60)  # noqa: E731
        # Today's request shape: documents, marked and skiplisted, through the batcher.
        assert_vectors(_vectors(post({"inputs": texts})), enc.encode_multivector(texts), tol=TOL)
        assert_vectors(_vectors(post({"inputs": texts, "is_query": False, "normalize": False})),
                       enc.encode_multivector(texts, normalize=False), tol=TOL)
        # Queries: colbert-ir's unattended [MASK] tokens in the batcher's padded forwards, PyLate's
        # attended ones in its packed forwards.
        assert_vectors(_vectors(post({"inputs": texts, "is_query": True})),
                       enc.encode_multivector(texts, is_query=True), tol=TOL)
        long = " ".join(["word"] * 40)
        assert len(_vectors(post({"inputs": long}))[0]) == 20  # cut at the document length
        r = post({"inputs": ["the of", long], "truncate": False})  # 19: the document length less the marker
        assert r.status_code == 413 and re.search(r"inputs\[1\] has \d+ tokens, more than the 19 this checkpoint's "
                                                  "ColBERT document takes", r.json()["error"]["message"])
        r = post({"inputs": "a", "is_query": "yes"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "is_query"


def test_a_batch_invariant_server_answers_unattended_queries(marked_colbert, rng):
    # --batch-invariant packs the batcher's forwards; the queries' padded calls keep their guarantee.
    _serve_extra()
    import httpx

    from tests.serving._helpers import serve

    path, _ = marked_colbert["ir"]
    texts = colbert_texts(rng, 5)
    want = load(path, batch_invariant=True).encode_multivector(texts, is_query=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        server = serve(path, batch_invariant=True)
    with server:
        body = {"inputs": texts, "is_query": True}
        assert_vectors(_vectors(httpx.post(server.url + "/embed_multivector", json=body, timeout=60)), want, tol=0)


def test_a_front_process_gives_documents_and_unattended_queries(marked_colbert, rng):
    # The queries' padded forwards run in the engine process's batcher (Job.attended), as documents'
    # packed ones do; a request mixing lengths that --max-input-length cuts keeps each keep mask.
    _serve_extra()
    from tests.serving.test_workers import WorkersServer

    path, enc = marked_colbert["ir"]
    texts = colbert_texts(rng, 4)
    front = WorkersServer(path)
    try:
        assert_vectors(_vectors(front.client.post("/embed_multivector", json={"inputs": texts})),
                       enc.encode_multivector(texts), tol=TOL)
        for normalize in (True, False):
            r = front.client.post("/embed_multivector", json={"inputs": texts, "is_query": True, "normalize": normalize})
            assert_vectors(_vectors(r), enc.encode_multivector(texts, is_query=True, normalize=normalize), tol=TOL)
    finally:
        status, err = front.stop()
    assert status == 0, err[-3000:]


def test_a_job_with_attended_counts_is_checked_by_name():
    from ftbert.serving.batcher import EMBED, IDS, MULTIVECTOR, TEXT, Job

    Job(MULTIVECTOR, IDS, [[1, 2, 3], [4, 5]], attended=[2, 2])
    for kind, how, inputs, attended, pattern in (
            (EMBED, IDS, [[1, 2]], [1], "one count per input of a multivector job"),
            (MULTIVECTOR, TEXT, ["a"], [1], "one count per input of a multivector job"),
            (MULTIVECTOR, IDS, [[1, 2]], [1, 1], r"got 2 for 1 inputs"),
            (MULTIVECTOR, IDS, [[1, 2]], [3], r"attended\[0\] must be an int from 1 to its input's 2 tokens, got 3"),
            (MULTIVECTOR, IDS, [[1, 2]], [0], r"attended\[0\] must be an int from 1"),
            (MULTIVECTOR, IDS, [[1, 2]], [True], r"attended\[0\] must be an int")):
        with pytest.raises(ValueError, match=pattern):
            Job(kind, how, inputs, attended=attended)
