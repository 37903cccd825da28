"""The dynamic batcher alone (no HTTP): many concurrent jobs, each gets exactly its own rows;
forwards stay within the token budget and mix requests; a full queue, closing, a failing forward
and a cancelled job each end as they should."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import ftbert
from ftbert.serving.batcher import (
    EMBED, IDS, SCORE, TEXT, PAIR, Batcher, ForwardFailed, InputTooLong, Job, QueueFull, ShuttingDown,
)
from ftbert.serving.settings import ServeSettings
from tests.serving._helpers import make_cross_encoder, make_embedder
from tests._vocab import random_texts

TOL = 1e-5


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return make_embedder(tmp_path_factory.mktemp("embedder"))


def _recording(enc):
    """Wraps enc.forward_packed to record each forward's (sequences, longest, input ids)."""
    calls = []
    inner = enc.forward_packed

    def forward_packed(ids, cu, types=None):
        lengths = np.diff(np.asarray(cu))
        calls.append((len(lengths), int(lengths.max()), np.asarray(ids).copy()))
        return inner(ids, cu, types)

    enc.forward_packed = forward_packed
    return calls


def _batcher(path, n_encoders=1, **kw):
    encs = [ftbert.Encoder.from_pretrained(path) for _ in range(n_encoders)]
    b = Batcher(encs, ServeSettings(model=str(path), **kw))
    return b, encs


async def _gather(batcher, jobs, timeout=120):
    # A bounded wait: a batcher thread that died would otherwise leave the test hanging.
    futures = [batcher.submit(j) for j in jobs]
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), timeout)


def test_concurrent_jobs_each_get_their_own_rows_within_the_budget(embedder, rng):
    b, (enc,) = _batcher(embedder, max_batch_tokens=300, max_batch_size=7, max_wait_ms=200)
    calls = _recording(enc)
    ref = ftbert.Encoder.from_pretrained(embedder)
    b.start()
    try:
        tok = ref.tokenizer
        jobs, want = [], []
        for _ in range(40):
            texts = random_texts(rng, int(rng.integers(1, 6)), max_words=50)
            if rng.random() < 0.3:  # token ids given as they are
                jobs.append(Job(EMBED, IDS, tok(texts, truncation=True, max_length=64)["input_ids"]))
            else:
                jobs.append(Job(EMBED, TEXT, texts))
            want.append(ref.encode(texts))
        results = asyncio.run(_gather(b, jobs))
    finally:
        b.close()
    for job, res, w in zip(jobs, results, want):
        assert not isinstance(res, BaseException), res
        np.testing.assert_allclose(res.values, w, rtol=0, atol=TOL)
        ids = job.inputs if job.how == IDS else tok(job.inputs, truncation=True, max_length=64)["input_ids"]
        assert res.tokens == sum(map(len, ids))
    assert sum(c[0] for c in calls) == sum(len(j) for j in jobs)
    for sequences, longest, _ in calls:
        assert sequences <= 7
        assert sequences == 1 or sequences * longest <= 300
    assert any(c[0] > 1 for c in calls), "no forward held more than one input"
    assert b.queue_depth == 0 and b.accepted == b.finished == len(jobs)


def test_two_encoders_share_one_queue(embedder, rng):
    b, encs = _batcher(embedder, n_encoders=2, max_batch_size=3, max_wait_ms=1)
    b.start()
    try:
        texts = [random_texts(rng, int(rng.integers(1, 5))) for _ in range(30)]
        results = asyncio.run(_gather(b, [Job(EMBED, TEXT, t) for t in texts]))
    finally:
        b.close()
    for t, res in zip(texts, results):
        np.testing.assert_allclose(res.values, encs[0].encode(t), rtol=0, atol=TOL)


def test_scores_and_embeddings_share_forwards(tmp_path, rng):
    path = make_cross_encoder(tmp_path, num_labels=2)
    b, (enc,) = _batcher(path, max_wait_ms=100)
    b.start()
    try:
        pairs = list(zip(random_texts(rng, 5), random_texts(rng, 5)))
        texts = random_texts(rng, 4)
        scores, emb = asyncio.run(_gather(b, [Job(SCORE, PAIR, pairs), Job(EMBED, TEXT, texts)]))
    finally:
        b.close()
    np.testing.assert_allclose(scores.values, enc.predict(pairs, activation="identity"), rtol=0, atol=TOL)
    np.testing.assert_allclose(emb.values, enc.encode(texts), rtol=0, atol=TOL)


def test_full_queue_and_closed_batcher_refuse_jobs(embedder):
    b, _ = _batcher(embedder, max_queue=3, max_client_batch=3, max_wait_ms=60_000)
    b.start()

    async def main():
        first = b.submit(Job(EMBED, TEXT, ["a", "b"]))
        with pytest.raises(QueueFull):
            b.submit(Job(EMBED, TEXT, ["c", "d"]))
        assert b.queue_depth == 2
        second = b.submit(Job(EMBED, TEXT, ["e"]))  # fits exactly
        # close() finishes what was accepted (without waiting out max_wait), then refuses.
        await asyncio.get_running_loop().run_in_executor(None, b.close)
        with pytest.raises(ShuttingDown):
            b.submit(Job(EMBED, TEXT, ["f"]))
        return await first, await second

    first, second = asyncio.run(main())
    assert first.values.shape == (2, 32) and second.values.shape == (1, 32)
    assert b.accepted == b.finished == 2 and b.queue_depth == 0


def test_close_during_load_answers_every_accepted_job(embedder, rng):
    b, (enc,) = _batcher(embedder, max_batch_size=4, max_wait_ms=5)
    b.start()
    texts = [random_texts(rng, int(rng.integers(1, 4))) for _ in range(60)]

    async def main():
        futs = [b.submit(Job(EMBED, TEXT, t)) for t in texts]
        closer = threading.Thread(target=b.close)
        closer.start()
        results = await asyncio.gather(*futs)
        closer.join()
        return results

    results = asyncio.run(main())
    for t, res in zip(texts, results):
        np.testing.assert_allclose(res.values, enc.encode(t), rtol=0, atol=TOL)
    assert b.accepted == b.finished == len(texts)


def test_failing_forward_fails_only_its_jobs(embedder, rng):
    b, (enc,) = _batcher(embedder, max_batch_size=1, max_wait_ms=0)
    ref = ftbert.Encoder.from_pretrained(embedder)
    inner = enc.forward_packed
    poison = 7  # a token id that only the poisoned job holds

    def forward_packed(ids, cu, types=None):
        if poison in np.asarray(ids):
            raise RuntimeError("forward failed on purpose")
        return inner(ids, cu, types)

    enc.forward_packed = forward_packed
    b.start()
    try:
        good = [random_texts(rng, 2) for _ in range(5)]
        jobs = [Job(EMBED, TEXT, t) for t in good[:2]] + [Job(EMBED, IDS, [[2, poison, 3]])] + \
               [Job(EMBED, TEXT, t) for t in good[2:]]
        results = asyncio.run(_gather(b, jobs))
    finally:
        b.close()
    # The forward's error, as plain values: not an out of memory, its cause named.
    assert isinstance(results[2], ForwardFailed) and not results[2].out_of_memory
    assert results[2].cause == "RuntimeError: forward failed on purpose" and results[2].inputs == 1
    for t, res in zip(good, results[:2] + results[3:]):
        np.testing.assert_allclose(res.values, ref.encode(t), rtol=0, atol=TOL)


def test_cancelled_job_is_never_forwarded(embedder):
    b, (enc,) = _batcher(embedder, max_wait_ms=300)
    calls = _recording(enc)
    b.start()
    marker = 9

    async def main():
        cancelled = b.submit(Job(EMBED, IDS, [[2, marker, marker, 3]]))
        cancelled.cancel()
        kept = await b.submit(Job(EMBED, IDS, [[2, 10, 3]]))
        return kept

    try:
        kept = asyncio.run(main())
    finally:
        b.close()
    assert kept.values.shape == (1, 32)
    assert all(marker not in ids for _, _, ids in calls)
    assert b.queue_depth == 0 and b.accepted == b.finished == 2


def test_too_long_input_fails_its_job_when_not_truncating(embedder):
    b, _ = _batcher(embedder, truncate=False, max_input_length=10)
    b.start()
    try:
        results = asyncio.run(_gather(b, [Job(EMBED, TEXT, ["short", "the " * 20]), Job(EMBED, TEXT, ["ok"])]))
    finally:
        b.close()
    assert isinstance(results[0], InputTooLong) and results[0].index == 1 and results[0].limit == 10
    assert results[1].values.shape == (1, 32)


def test_tokenizer_errors_fail_their_round_and_the_thread_goes_on(embedder):
    b, _ = _batcher(embedder)
    b.start()
    real_tok, real_check = b.tokenizer._tok, b.tokenizer.check_lengths

    def tok(texts, *args, **kwargs):
        if "boom" in texts:
            raise RuntimeError("tokenizer failed on purpose")
        return real_tok(texts, *args, **kwargs)

    def check(how, seqs, truncate):
        if len(seqs) == 3:
            raise RuntimeError("length check failed on purpose")
        return real_check(how, seqs, truncate)

    b.tokenizer._tok, b.tokenizer.check_lengths = tok, check
    try:
        first = asyncio.run(_gather(b, [Job(EMBED, TEXT, ["boom"])]))
        second = asyncio.run(_gather(b, [Job(EMBED, TEXT, ["a", "b", "c"])]))
        third = asyncio.run(_gather(b, [Job(EMBED, TEXT, ["fine"])]))
    finally:
        b.close()
    assert isinstance(first[0], RuntimeError) and "tokenizer failed" in str(first[0])
    assert isinstance(second[0], RuntimeError) and "length check failed" in str(second[0])
    assert third[0].values.shape == (1, 32)
    assert b.queue_depth == 0 and b.accepted == b.finished == 3


@pytest.mark.parametrize("normalize", [True, False])
def test_long_texts_chunk_embeds_windows_as_encode_does(embedder, rng, normalize):
    b, (enc,) = _batcher(embedder, long_texts="chunk", chunk_overlap=5, max_batch_size=4, max_wait_ms=1)
    b.start()
    try:
        # Texts far past the model's limit, texts that fit, and an empty one (only the special tokens).
        texts = [random_texts(rng, int(rng.integers(1, 4)), max_words=400) for _ in range(12)]
        texts[3] = ["", "a short one"]
        jobs = [Job(EMBED, TEXT, t, normalize=normalize) for t in texts]
        results = asyncio.run(_gather(b, jobs))
        depth = b.queue_depth
    finally:
        b.close()
    tok = enc.tokenizer
    for t, res in zip(texts, results):
        assert not isinstance(res, BaseException), res
        want = enc.encode(t, long_texts="chunk", chunk_overlap=5, normalize=normalize)
        np.testing.assert_allclose(res.values, want, rtol=1e-6, atol=1e-6)
        # Usage: every window's tokens, the special tokens of each included.
        content = tok(t, add_special_tokens=False)["input_ids"]
        width = b.limits[TEXT] - 2
        windows = [max(1, -(-(len(c) - 5) // (width - 5))) for c in content]
        assert res.tokens == sum(len(c) for c in content) + 5 * sum(w - 1 for w in windows) + 2 * sum(windows)
    assert depth == 0 and b.accepted == b.finished == len(jobs)
    assert any(len(tok(x, add_special_tokens=False)["input_ids"]) > b.limits[TEXT] for t in texts for x in t)


def test_long_texts_chunk_leaves_pairs_and_token_ids_alone(tmp_path, rng):
    path = make_cross_encoder(tmp_path)
    b, (enc,) = _batcher(path, long_texts="chunk")
    b.start()
    try:
        pairs = [("a query", " ".join(["word"] * 300))]
        (res,) = asyncio.run(_gather(b, [Job(SCORE, PAIR, pairs)]))
    finally:
        b.close()
    assert res.values.shape == (1, 1)
    np.testing.assert_allclose(res.values[:, 0], enc.predict(pairs, activation="identity"), rtol=0, atol=TOL)


def test_long_texts_settings_are_checked(embedder):
    with pytest.raises(ValueError, match="long_texts must be 'truncate' or 'chunk', got 'split'"):
        ServeSettings(long_texts="split")
    with pytest.raises(ValueError, match="chunk_overlap must be a whole number of tokens >= 0, got -1"):
        ServeSettings(chunk_overlap=-1)
    with pytest.raises(ValueError, match="long_texts must be 'truncate' or 'chunk', got 'all'"):
        Job(EMBED, TEXT, ["x"], long_texts="all")
    b, _ = _batcher(embedder, long_texts="chunk", chunk_overlap=10_000)
    with pytest.raises(ValueError, match="chunk_overlap 10000 must be less than a window's"):
        b.start()


def test_jobs_tokenized_elsewhere_skip_the_tokenizer_and_answer_as_the_others(embedder, rng):
    # Jobs that come tokenized (a front process of --workers did it with the batcher's own rules)
    # go straight to the forward queue; they mix with jobs the batcher tokenizes, count against
    # the queue, fail on the same limits, and closing answers every one of them.
    from ftbert.serving.batcher import JobTokenizer

    b, (enc,) = _batcher(embedder, max_batch_size=5, max_wait_ms=2, long_texts="chunk", chunk_overlap=4)
    b.start()
    front = JobTokenizer(enc.tokenizer, b.settings, b.limits, threading.Lock)
    long_text = " ".join(random_texts(rng, 40))
    texts = [random_texts(rng, int(rng.integers(1, 4))) + ([long_text] if rng.random() < 0.3 else [])
             for _ in range(40)]
    tokenized = [rng.random() < 0.6 for _ in texts]

    async def main():
        futs = []
        for t, pre in zip(texts, tokenized):
            job = Job(EMBED, TEXT, t)
            if pre:
                job.tokenized = front.tokenize(job)
            futs.append(b.submit(job))
        too_long = Job(EMBED, IDS, [[5] * 70], truncate=False)
        too_long.tokenized = [(0, np.full(70, 5, np.int32), None, None)]
        futs.append(b.submit(too_long))
        closer = threading.Thread(target=b.close)
        closer.start()
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 120)
        closer.join()
        return results

    *results, refused = asyncio.run(main())
    assert isinstance(refused, InputTooLong) and refused.tokens == 70
    for t, res in zip(texts, results):
        np.testing.assert_allclose(res.values, enc.encode(t, long_texts="chunk", chunk_overlap=4), rtol=0, atol=TOL)
    assert b.accepted == b.finished == len(texts) + 1 and b.queue_depth == 0


def test_a_large_call_leaves_the_word_pieces_for_the_rust_tokenizer(tmp_path, rng, monkeypatch):
    from ftbert.serving.batcher import JobTokenizer
    from ftbert.tokenization import AsciiWordPieces, load_text_tokenizer, load_transformers_tokenizer
    from tests._tokenizers import write_wordpiece_tokenizer

    write_wordpiece_tokenizer(tmp_path, 200)
    limits = {TEXT: 24, PAIR: 24, IDS: 24}
    quick = JobTokenizer(load_transformers_tokenizer(tmp_path), ServeSettings(model=str(tmp_path)), limits,
                         threading.Lock, fast=load_text_tokenizer(tmp_path, limits[TEXT]).backend)
    pieces, calls = quick._ascii.word_pieces, []
    real = pieces.ids
    monkeypatch.setattr(pieces, "ids", lambda *a, **k: calls.append(a) or real(*a, **k))
    job = Job(EMBED, TEXT, random_texts(rng, 3))
    pieces_rows = quick.tokenize(job)
    assert len(calls) == 3
    monkeypatch.setattr(AsciiWordPieces, "MOST_CHARS", sum(map(len, job.inputs)) - 1)
    rust_rows = quick.tokenize(job)
    assert len(calls) == 3  # not called again: the texts went to the Rust tokenizer
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(pieces_rows, rust_rows))


@pytest.mark.parametrize("truncate", [True, False])
def test_the_tokenizer_warm_up_takes_any_input_limit(tmp_path, truncate):
    # A server's start tokenizes one text; with a limit shorter than that text and truncation off
    # it is refused as a request would be, and the start goes on.
    from ftbert.serving.batcher import JobTokenizer
    from ftbert.tokenization import load_text_tokenizer, load_transformers_tokenizer
    from tests._tokenizers import write_wordpiece_tokenizer

    write_wordpiece_tokenizer(tmp_path, 200)
    limits = {TEXT: 3, PAIR: 3, IDS: 3}
    settings = ServeSettings(model=str(tmp_path), truncate=truncate)
    tok = JobTokenizer(load_transformers_tokenizer(tmp_path), settings, limits, threading.Lock,
                       fast=load_text_tokenizer(tmp_path, limits[TEXT]).backend)
    tok.warm_up()
    assert tok._fast_truncation == ((3, "right") if truncate else None)  # the first call's setting made


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_the_fast_tokenizer_gives_transformers_rows_and_errors(tmp_path, rng, kind, side):
    # Single texts go through the checkpoint's tokenizer.json directly (JobTokenizer's `fast`):
    # the same rows as through transformers, cut at the limit from either side, in windows, and
    # the same error for a text too long to run uncut, whatever truncation the call before set.
    from ftbert.serving.batcher import JobTokenizer
    from ftbert.tokenization import load_text_tokenizer, load_transformers_tokenizer, same_pipeline
    from tests._tokenizers import write_bpe_tokenizer, write_unigram_tokenizer, write_wordpiece_tokenizer

    {"wordpiece": lambda: write_wordpiece_tokenizer(tmp_path, 200), "bpe": lambda: write_bpe_tokenizer(tmp_path, 150),
     "unigram": lambda: write_unigram_tokenizer(tmp_path, 150)}[kind]()
    limits = {TEXT: 24, PAIR: 24, IDS: 24}
    fast = load_text_tokenizer(tmp_path, limits[TEXT])
    assert fast is not None, "the tokenizer.json should give transformers' ids"
    # transformers 5 builds XLMRobertaTokenizer's pipeline itself (no normalizer, a whitespace split
    # first), unlike this file's: the servers then keep to transformers' tokenizer (same_pipeline).
    assert same_pipeline(fast.backend, load_transformers_tokenizer(tmp_path)) == (kind != "unigram")
    if kind == "unigram":
        return
    settings = ServeSettings(model=str(tmp_path), long_texts="chunk", chunk_overlap=3)
    slow = JobTokenizer(load_transformers_tokenizer(tmp_path), settings, limits, threading.Lock)
    quick = JobTokenizer(load_transformers_tokenizer(tmp_path), settings, limits, threading.Lock,
                         fast=fast.backend)
    # WordPiece's ASCII texts skip its normalizer (tokenization.AsciiShortcut): capitals, controls,
    # a special's spelling and accents on the way in, for both paths.
    assert (quick._ascii is not None) == (kind == "wordpiece")
    odd = ["Tabs\tand\nNEW lines\r", "bell\x07 and \x0bvt", "a [MASK] here", "Héllo Wörld", "UPPER Case"]
    long_text = " ".join(random_texts(rng, 12))
    jobs = []
    for _ in range(12):
        texts = random_texts(rng, int(rng.integers(1, 4))) + ([long_text] if rng.random() < 0.5 else [])
        texts.append(odd[int(rng.integers(len(odd)))])
        jobs.append(Job(EMBED, TEXT, texts, truncation_side=side, long_texts="truncate"))
        jobs.append(Job(EMBED, TEXT, texts, long_texts="chunk"))
        jobs.append(Job(EMBED, TEXT, [long_text], truncate=False, long_texts="truncate"))
    refused = 0
    for job in jobs:
        try:
            want = slow.tokenize(job)
        except InputTooLong as e:
            with pytest.raises(InputTooLong, match=f"{e.tokens} tokens"):
                quick.tokenize(job)
            refused += 1
            continue
        got = quick.tokenize(job)
        assert [(s, w) for s, _, _, w in got] == [(s, w) for s, _, _, w in want]
        assert all(np.array_equal(g[1], w[1]) and g[1].dtype == np.int32 for g, w in zip(got, want))
        assert all(t is None or not t.any() for _, _, t, _ in want)  # single texts: type 0 throughout
    assert refused == 12  # every uncut long text, between calls that cut


def test_a_checkpoint_whose_tokenizer_transformers_rebuilds_keeps_transformers_ids(tmp_path):
    # XLMRobertaTokenizer in transformers 5 builds its own pipeline (a whitespace split, no
    # normalizer) over this tokenizer.json's: the batcher keeps to transformers' tokenizer, so a
    # text with tabs and line breaks gets transformers' ids.
    from ftbert.tokenization import load_transformers_tokenizer
    from tests._models import make_roberta
    from tests._tokenizers import write_unigram_tokenizer

    make_roberta(tmp_path, family="xlm-roberta", hidden=32, heads=2, layers=1, vocab=150)
    write_unigram_tokenizer(tmp_path, 150)
    b, _ = _batcher(tmp_path)
    b.start()
    try:
        assert b.tokenizer._fast is None
        text = "Tabs\tand\nNEW lines\r"
        (row,) = b.tokenizer.tokenize(Job(EMBED, TEXT, [text]))
        assert row[1].tolist() == load_transformers_tokenizer(tmp_path)(text)["input_ids"]
    finally:
        b.close()
