"""One Encoder called from many threads at once, on the CPU backend: every result equals the result
of the same call made alone, whatever the other threads run meanwhile (shapes, padding, input kinds,
failing calls, encode()), with the default `concurrency` and with concurrency=2 (two forwards in
the engine at a time). The GPU side of the same contract is tests/cuda/test_concurrency.py."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import ftbert
import ftbert.text
from ftbert.text import tokenizer_lock
from tests._models import make_bert
from tests._util import run_in_threads, ragged_mask
from tests._vocab import random_texts, write_vocab

VOCAB = 211
TIMEOUT = 120  # seconds for any one thread: a deadlock fails the test instead of hanging the run
CONCURRENCY = [None, 2]  # None: the default


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    make_bert(path, hidden=64, heads=2, layers=2, vocab=VOCAB, seed=11)
    write_vocab(path, VOCAB)  # a tokenizer, for encode()
    return path


def load(path, concurrency=None):
    if concurrency is None:
        return ftbert.Encoder.from_pretrained(path)
    enc = ftbert.Encoder.from_pretrained(path, concurrency=concurrency)
    assert enc.concurrency == concurrency
    return enc


def in_threads(n, work):
    return run_in_threads(n, work, TIMEOUT)


def make_calls(rng, n):
    """n argument tuples of mixed shapes (batch 1..6, seq 1..70), padding sides and input kinds."""
    calls = []
    for i in range(n):
        b, s = int(rng.integers(1, 7)), int(rng.integers(1, 71))
        ids = rng.integers(0, VOCAB, (b, s))
        mask = ragged_mask(rng, b, s, left=bool(rng.integers(2)))
        types = rng.integers(0, 2, (b, s))
        kind = i % 4
        if kind == 0:  # numpy, all three arguments
            calls.append((ids, mask, types))
        elif kind == 1:  # numpy int32 ids, mask only
            calls.append((ids.astype(np.int32), mask))
        elif kind == 2:  # torch CPU tensors
            calls.append((torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)))
        else:  # torch, bool mask
            calls.append((torch.from_numpy(ids), torch.from_numpy(mask).bool()))
    return calls


def outputs(out):
    """(last_hidden_state, pooler_output) as numpy arrays."""
    h, p = out.last_hidden_state, out.pooler_output
    if isinstance(h, torch.Tensor):
        h, p = h.numpy(), p.numpy()
    return h, p


def assert_same(got, ref, what):
    for name, a, b in zip(("last_hidden_state", "pooler_output"), got, ref):
        assert a.shape == b.shape, f"{what}: {name} shape {a.shape} != {b.shape}"
        if not np.array_equal(a, b):
            diff = np.abs(a.astype(np.float64) - b)
            raise AssertionError(
                f"{what}: {name} differs from the one-at-a-time result in {int((diff > 0).sum())} of "
                f"{diff.size} values, max |diff| {diff.max():.3e}"
            )


@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda c: f"concurrency={c or 'default'}")
def test_threads_match_one_at_a_time(model_dir, rng, concurrency):
    enc = load(model_dir, concurrency)
    calls = make_calls(rng, 48)
    ref = [outputs(enc(*c)) for c in calls]
    threads = 8

    def work(t):
        # Every call runs twice, in two threads, in a different order each time.
        mine = [(i, calls[i]) for i in range(len(calls)) if i % threads == t]
        mine += [(i, calls[i]) for i in reversed(range(len(calls))) if (i + 3) % threads == t]
        return [(i, outputs(enc(*c))) for i, c in mine]

    done = 0
    for results in in_threads(threads, work):
        for i, got in results:
            assert_same(got, ref[i], f"call {i} (shape {tuple(calls[i][0].shape)})")
            done += 1
    assert done == 2 * len(calls)
    assert_same(outputs(enc(*calls[0])), ref[0], "call 0 after the threads")


def test_two_encoders_run_at_once(model_dir, rng):
    # Two engines in one process, each called from its own threads: the CPU backend's shared
    # thread pool and BLAS are used by both at the same time.
    a, b = load(model_dir), load(model_dir)
    calls = make_calls(rng, 24)
    ref = [outputs(a(*c)) for c in calls]

    def work(t):
        enc = (a, b)[t % 2]
        return [(i, outputs(enc(*calls[i]))) for i in range(t, len(calls), 3)]

    for results in in_threads(6, work):
        for i, got in results:
            assert_same(got, ref[i], f"call {i}")


@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda c: f"concurrency={c or 'default'}")
def test_failing_calls_leave_the_others_correct(model_dir, rng, concurrency):
    # Out-of-range ids are found by the engine during the call: the error must reach its caller and
    # leave nothing held, or the calls after it would wait forever or run on stale state.
    enc = load(model_dir, concurrency)
    calls = make_calls(rng, 16)
    ref = [outputs(enc(*c)) for c in calls]
    bad = np.full((2, 9), VOCAB + 5)

    def work(t):
        got = []
        for i in range(t, len(calls), 2):
            with pytest.raises(ValueError, match="out of range"):
                enc(bad)
            got.append((i, outputs(enc(*calls[i]))))
            with pytest.raises(ValueError, match="out of range"):
                enc(torch.from_numpy(bad))
        return got

    for results in in_threads(6, work):
        for i, got in results:
            assert_same(got, ref[i], f"call {i}")


def test_changing_concurrency_while_threads_run(model_dir, rng):
    enc = load(model_dir, 2)
    calls = make_calls(rng, 20)
    ref = [outputs(enc(*c)) for c in calls]
    settings = [1, 3, 2, 4, 1, 2]

    def work(t):
        if t == 0:  # one thread changes the setting while the others call
            for n in settings * 3:
                enc.concurrency = n
                time.sleep(0.01)
            return []
        return [(i, outputs(enc(*calls[i]))) for _ in range(2) for i in range(t - 1, len(calls), 5)]

    for results in in_threads(6, work):
        for i, got in results:
            assert_same(got, ref[i], f"call {i}")
    assert enc.concurrency == settings[-1]


# ---- encode() ---------------------------------------------------------------------------------
@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda c: f"concurrency={c or 'default'}")
def test_encode_from_threads_matches_one_at_a_time(model_dir, rng, concurrency):
    enc = load(model_dir, concurrency)
    threads = 4
    texts = [random_texts(rng, int(rng.integers(5, 20))) for _ in range(threads)]
    kwargs = [dict(pooling=p, batch_size=int(rng.integers(1, 8))) for p in ("mean", "cls", "pooler", "mean")]
    ref = [enc.encode(texts[t], **kwargs[t]) for t in range(threads)]

    def work(t):
        return [enc.encode(texts[t], **kwargs[t]) for _ in range(3)]

    for t, results in enumerate(in_threads(threads, work)):
        for got in results:
            np.testing.assert_array_equal(got, ref[t], err_msg=f"thread {t}")


def test_tokenizer_loads_once_when_threads_arrive_together(model_dir, rng, monkeypatch):
    import transformers

    real = transformers.AutoTokenizer.from_pretrained
    loads = []

    def slow_load(*args, **kwargs):
        loads.append(threading.get_ident())
        time.sleep(0.2)  # the threads behind the first must find the load under way, not start their own
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", slow_load)
    texts = random_texts(rng, 6)
    ref = load(model_dir).encode(texts)
    assert len(loads) == 1
    enc = load(model_dir)
    for got in in_threads(6, lambda t: enc.encode(texts)):
        np.testing.assert_array_equal(got, ref)
    assert len(loads) == 2, f"{len(loads) - 1} tokenizer loads for one encoder"


class ProbeTokenizer:
    """Wraps a tokenizer; counts how many of its calls are in progress at once."""

    def __init__(self, tok):
        self._tok = tok
        self._guard = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.calls = 0

    def __call__(self, *args, **kwargs):
        with self._guard:
            self.inside += 1
            self.calls += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            time.sleep(0.002)  # a window in which another thread's call would overlap this one
            return self._tok(*args, **kwargs)
        finally:
            with self._guard:
                self.inside -= 1

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_encode_never_runs_two_tokenizer_calls_at_once(model_dir, rng, monkeypatch):
    # Two texts per tokenizer call: 6 calls per encode, each made on that encode's background
    # thread, while the other callers' threads and their own background threads tokenize too.
    monkeypatch.setattr(ftbert.text, "TOKENIZE_CHUNK", 2)
    enc = load(model_dir)
    texts = [random_texts(rng, 12) for _ in range(4)]
    ref = [enc.encode(t, batch_size=2) for t in texts]
    probe = ProbeTokenizer(enc._text_tokenizer())
    enc._text_tok = probe  # what encode() calls
    for t, got in enumerate(in_threads(4, lambda t: enc.encode(texts[t], batch_size=2))):
        np.testing.assert_array_equal(got, ref[t])
    assert probe.calls == 4 * 6
    assert probe.most_inside == 1


def test_tokenizing_goes_on_while_another_thread_is_in_its_forward(model_dir, rng):
    # The tokenizer lock must not be held across the forward: thread A is held inside its forward
    # until thread B has tokenized, run and pooled a whole encode() of its own.
    in_forward, release = threading.Event(), threading.Event()

    class HeldOnce(ftbert.Encoder):
        def forward_packed(self, *args, **kwargs):  # encode's forwards
            if not in_forward.is_set():
                in_forward.set()
                assert release.wait(TIMEOUT), "never released"
            return super().forward_packed(*args, **kwargs)

    texts_a, texts_b = random_texts(rng, 5), random_texts(rng, 5)
    plain = load(model_dir)
    ref_a, ref_b = plain.encode(texts_a), plain.encode(texts_b)
    enc = load(model_dir)
    enc.__class__ = HeldOnce
    with ThreadPoolExecutor(2) as ex:
        a = ex.submit(enc.encode, texts_a)
        try:
            assert in_forward.wait(TIMEOUT)
            b = ex.submit(enc.encode, texts_b)
            np.testing.assert_array_equal(b.result(timeout=30), ref_b)
            assert not a.done()
        finally:
            release.set()
        np.testing.assert_array_equal(a.result(timeout=TIMEOUT), ref_a)


def test_tokenizer_lock_is_one_per_encoder(model_dir):
    a, b = load(model_dir), load(model_dir)
    assert tokenizer_lock(a) is tokenizer_lock(a)
    assert tokenizer_lock(a) is not tokenizer_lock(b)


# ---- the concurrency setting ------------------------------------------------------------------
def test_concurrency_setting(model_dir):
    enc = load(model_dir)
    assert isinstance(enc.concurrency, int) and enc.concurrency >= 1
    assert load(model_dir, 1).concurrency == 1
    for bad in (0, -1):
        with pytest.raises(ValueError, match="concurrency"):
            ftbert.Encoder.from_pretrained(model_dir, concurrency=bad)
    for bad in (1.5, "2"):
        with pytest.raises((TypeError, ValueError), match="concurrency"):
            ftbert.Encoder.from_pretrained(model_dir, concurrency=bad)
