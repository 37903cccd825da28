"""One CUDA Encoder called from many threads at once, each on its own torch CUDA stream or all on one:
every result equals the result of the same call made alone, for every dtype, attention kernel,
CUDA graphs on and off, `concurrency` 1 and 4, torch CUDA and numpy inputs, and encode(); and each
caller's outputs are ready on its own stream as soon as the call returns (GPU only).

Results are compared bit for bit: a forward's kernels depend only on the encoder's settings and the
input shape, never on which session, stream or thread runs it, and replays equal op-by-op runs (see
test_cuda_graphs.py). A mismatch message says whether it looks like rounding (a different kernel
was chosen) or another forward's data (a race). The CPU side of the contract is
tests/core/test_concurrency.py.
"""


import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert
from tests._util import run_in_threads, ragged_mask
from tests._vocab import random_texts, write_vocab

pytestmark = pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build")

VOCAB = 211
TIMEOUT = 120  # seconds for any one thread: a deadlock fails the test instead of hanging the run
# Only to label a mismatch in the message: below this it looks like rounding, above like a race.
ROUNDING = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    # Head dim 64: flash attention runs in float16 and bfloat16.
    path = tmp_path_factory.mktemp("bert-small")
    make_bert(path, hidden=128, heads=2, layers=2, vocab=VOCAB, seed=5)
    write_vocab(path, VOCAB)  # a tokenizer, for encode()
    return path


@pytest.fixture(scope="module")
def bert768_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert-768")
    make_bert(path, hidden=768, heads=12, layers=2, intermediate=3072, vocab=VOCAB, seed=768)
    return path


def load(path, dtype, concurrency=None, **kwargs):
    if concurrency is not None:
        kwargs["concurrency"] = concurrency
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, **kwargs)
    if concurrency is not None:
        assert enc.concurrency == concurrency
    return enc


def in_threads(n, work):
    return run_in_threads(n, work, TIMEOUT)


def make_call(rng, batch, seq, kind, left=None):
    """Arguments of one call. kind: "int64" (torch CUDA, bool mask), "int32" (torch CUDA int32, which
    the engine reads in place), "numpy" (host arrays: copied in and out by the engine) or
    "cpu-torch" (torch CPU tensors: the host path, outputs back as CPU tensors)."""
    left = bool(rng.integers(2)) if left is None else left
    ids = rng.integers(0, VOCAB, (batch, seq))
    mask = ragged_mask(rng, batch, seq, left=left)
    types = rng.integers(0, 2, (batch, seq))
    if kind == "numpy":
        return ids, mask, types
    if kind == "cpu-torch":
        return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)
    if kind == "int32":
        return tuple(torch.from_numpy(a.astype(np.int32)).cuda() for a in (ids, mask, types))
    return torch.from_numpy(ids).cuda(), torch.from_numpy(mask).bool().cuda(), torch.from_numpy(types).cuda()


def describe(call):
    ids = call[0]
    where = "numpy" if isinstance(ids, np.ndarray) else f"torch {ids.device.type} {ids.dtype}"
    return f"{tuple(ids.shape)}, {where}"


def consume(out):
    """What a caller does with the outputs on its own stream right after the call, before any sync:
    copies and sums them there. Returns (hidden copy, pooled copy, per-sequence sums)."""
    h, p = out.last_hidden_state, out.pooler_output
    if isinstance(h, np.ndarray):
        return h, p, None
    return h.clone(), p.clone(), h.float().sum(dim=(1, 2))


def assert_same(got, ref, what, dtype):
    for name, a, b in zip(("last_hidden_state", "pooler_output"), got, ref):
        if isinstance(a, np.ndarray):
            a, b = torch.from_numpy(a.astype(np.float32)), torch.from_numpy(b.astype(np.float32))
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {name} {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        if torch.equal(a, b):
            continue
        diff = (a.float() - b.float()).abs()
        worst = diff.max().item()
        looks = (f"rounding-level (<= {ROUNDING[dtype]:g}: a different kernel?)" if worst <= ROUNDING[dtype]
                 else "not rounding: another forward's data or unfinished work?")
        bad_rows = torch.nonzero(diff.reshape(diff.shape[0], -1).amax(dim=1) > 0).flatten().tolist()
        raise AssertionError(
            f"{what}: {name} differs from the one-at-a-time result in {int((diff > 0).sum())} of "
            f"{diff.numel()} values (sequences {bad_rows}), max |diff| {worst:.3e}, {looks}"
        )


def check_sums(sums, ref_hidden, what):
    """The per-sequence sums a caller took on its stream right after the call, against the
    reference's: outputs read before they were written differ by a good part of their size."""
    ref = ref_hidden.float()
    want, size = ref.sum(dim=(1, 2)), ref.abs().sum(dim=(1, 2))
    bad = (sums - want).abs() > 1e-4 * size + 1e-3
    assert not bad.any(), f"{what}: sums taken on the caller's stream {sums[bad].tolist()}, expected {want[bad].tolist()}"


# ---- (a) the reported failure -----------------------------------------------------------------
@pytest.mark.parametrize("concurrency", [None, 1, 4], ids=lambda c: f"concurrency={c or 'default'}")
def test_bert768_float16_four_threads_on_own_streams(bert768_dir, rng, concurrency):
    # As reported: BERT (2 layers, hidden 768, 12 heads) in float16 with CUDA graphs on, 4 threads
    # each inside `with torch.cuda.stream(torch.cuda.Stream())`, 80 forwards of 4 x 96 tokens with
    # ragged masks; 11 of the 80 outputs came back wrong.
    enc = load(bert768_dir, "float16", concurrency)
    assert enc.cuda_graphs
    threads, calls = 4, [make_call(rng, 4, 96, "int64") for _ in range(80)]
    ref = [enc(*c) for c in calls]
    torch.cuda.synchronize()

    def work(t):
        got = []
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for i in range(t, len(calls), threads):
                got.append((i, consume(enc(*calls[i]))))
        stream.synchronize()
        return got

    wrong = []
    for results in in_threads(threads, work):
        for i, (h, p, sums) in results:
            try:
                assert_same((h, p), (ref[i].last_hidden_state, ref[i].pooler_output), f"forward {i}", "float16")
            except AssertionError as e:
                wrong.append(str(e))
            else:
                # The sum ran on the caller's stream right after the call: it must have seen the outputs.
                check_sums(sums, ref[i].last_hidden_state, f"forward {i}")
    assert not wrong, f"{len(wrong)} of {len(calls)} outputs wrong; first: {wrong[0]}"
    assert enc.recorded_shapes >= 1


# ---- (b) every setting, mixed shapes, mixed input kinds ------------------------------------------
SHAPES = [(1, 1), (1, 7), (2, 33), (3, 128), (4, 64), (8, 16)]
KINDS = ["int64", "int32", "numpy", "cpu-torch"]
SETTINGS = [("float32", "unfused"), ("float16", "unfused"), ("float16", "flash"),
            ("bfloat16", "unfused"), ("bfloat16", "flash")]


def mixed_calls(rng, n):
    # Each shape several times, so that with graphs on they are recorded and then replayed.
    return [make_call(rng, *SHAPES[i % len(SHAPES)], KINDS[(i // len(SHAPES)) % len(KINDS)]) for i in range(n)]


def reference(path, dtype, attention, graphs, calls):
    """One-at-a-time results of `calls`, from an encoder of their own with the same settings."""
    enc = load(path, dtype, attention=attention, cuda_graphs=graphs)
    ref = []
    for c in calls:
        out = enc(*c)
        ref.append((out.last_hidden_state, out.pooler_output))
    torch.cuda.synchronize()
    return ref


def run_and_check(enc, calls, ref, dtype, threads, stream_for, per_thread=10):
    """threads threads, thread t on stream_for(t) (None: torch's default stream), each making
    per_thread calls, every call made by several threads in different orders."""

    def work(t):
        stream = stream_for(t)
        got = []
        order = [(t * 5 + 7 * k) % len(calls) for k in range(per_thread)]
        with torch.cuda.stream(stream):  # None: a no-op, the thread stays on the default stream
            for i in order:
                got.append((i, consume(enc(*calls[i]))))
        (stream or torch.cuda.current_stream()).synchronize()
        return got

    n = 0
    for t, results in enumerate(in_threads(threads, work)):
        for i, (h, p, sums) in results:
            assert_same((h, p), ref[i], f"thread {t}, call {i} ({describe(calls[i])})", dtype)
            if sums is not None:
                check_sums(sums, ref[i][0], f"thread {t}, call {i}")
            n += 1
    assert n == threads * per_thread


@pytest.mark.parametrize("concurrency", [1, 4], ids=lambda c: f"concurrency={c}")
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
@pytest.mark.parametrize("dtype,attention", SETTINGS, ids=[f"{d}-{a}" for d, a in SETTINGS])
def test_eight_threads_on_own_streams(small_dir, rng, dtype, attention, graphs, concurrency):
    calls = mixed_calls(rng, 24)
    ref = reference(small_dir, dtype, attention, graphs, calls)
    # A fresh encoder: its sessions grow their workspaces and record their graphs under load.
    enc = load(small_dir, dtype, concurrency, attention=attention, cuda_graphs=graphs)
    streams = [torch.cuda.Stream() for _ in range(8)]
    run_and_check(enc, calls, ref, dtype, 8, lambda t: streams[t])
    assert (enc.recorded_shapes > 0) == graphs
    assert enc.recorded_shapes <= 128 * concurrency  # Session::kMaxRecordings a session


@pytest.mark.parametrize("concurrency", [1, 4], ids=lambda c: f"concurrency={c}")
@pytest.mark.parametrize("where", ["one-side-stream", "default-stream", "two-threads-per-stream"])
def test_threads_sharing_streams(small_dir, rng, where, concurrency):
    calls = mixed_calls(rng, 24)
    ref = reference(small_dir, "float16", "unfused", True, calls)
    enc = load(small_dir, "float16", concurrency, attention="unfused")
    side = [torch.cuda.Stream() for _ in range(4)]
    stream_for = {
        "one-side-stream": lambda t: side[0],
        "default-stream": lambda t: None,
        "two-threads-per-stream": lambda t: side[t // 2],
    }[where]
    run_and_check(enc, calls, ref, "float16", 8, stream_for)


# ---- (b2) the newer architectures: relative bias (MPNet), rotary and sliding windows (ModernBERT) --
@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    from tests._models import make_modernbert, make_mpnet

    dirs = {"mpnet": tmp_path_factory.mktemp("mpnet"), "modernbert": tmp_path_factory.mktemp("modernbert")}
    # Head dim 64 (flash runs); ModernBERT's window of 16 is far shorter than the longest calls.
    make_mpnet(dirs["mpnet"], hidden=128, heads=2, layers=2, vocab=VOCAB, seed=11)
    make_modernbert(dirs["modernbert"], hidden=128, heads=2, layers=3, vocab=VOCAB, window=16, every=2, seed=12)
    return dirs


@pytest.mark.parametrize("concurrency", [1, 4], ids=lambda c: f"concurrency={c}")
@pytest.mark.parametrize("dtype,attention", [("float16", "flash"), ("bfloat16", "flash"), ("float32", "unfused")])
@pytest.mark.parametrize("family", ["mpnet", "modernbert"])
def test_families_eight_threads_on_own_streams(family_dirs, rng, family, dtype, attention, concurrency):
    shapes = [(1, 5), (2, 33), (3, 128), (4, 64), (8, 16), (2, 200)]
    calls = []
    for i in range(24):
        batch, seq = shapes[i % len(shapes)]
        ids = rng.integers(3, VOCAB, (batch, seq))
        mask = ragged_mask(rng, batch, seq, left=bool(i % 2))
        if i % 3 == 0:
            calls.append((ids, mask))
        else:
            calls.append(tuple(torch.from_numpy(a).cuda() for a in (ids, mask)))
    path = family_dirs[family]
    alone = load(path, dtype, attention=attention)
    ref = [alone(*c).last_hidden_state for c in calls]
    torch.cuda.synchronize()
    enc = load(path, dtype, concurrency, attention=attention)
    streams = [torch.cuda.Stream() for _ in range(8)]

    def work(t):
        got = []
        with torch.cuda.stream(streams[t]):
            for k in range(10):
                i = (t * 5 + 7 * k) % len(calls)
                h = enc(*calls[i]).last_hidden_state
                got.append((i, h if isinstance(h, np.ndarray) else h.clone()))
        streams[t].synchronize()
        return got

    for t, results in enumerate(in_threads(8, work)):
        for i, h in results:
            a = torch.as_tensor(np.asarray(h, dtype=np.float32) if isinstance(h, np.ndarray) else h).float()
            b = torch.as_tensor(np.asarray(ref[i], dtype=np.float32) if isinstance(ref[i], np.ndarray)
                                else ref[i]).float()
            assert torch.equal(a, b), (f"{family} thread {t}, call {i}: differs from the call made alone, "
                                       f"max |diff| {(a - b).abs().max().item():.3e}")


# ---- (c) encode() -----------------------------------------------------------------------------------
@pytest.mark.parametrize("concurrency", [1, 4], ids=lambda c: f"concurrency={c}")
def test_encode_from_eight_threads(small_dir, rng, concurrency):
    enc = load(small_dir, "float16", concurrency)
    threads = 8
    texts = [random_texts(rng, int(rng.integers(4, 24))) for _ in range(threads)]
    kwargs = [dict(pooling=("mean", "cls", "pooler")[t % 3], batch_size=int(rng.integers(2, 9)))
              for t in range(threads)]
    ref = [enc.encode(texts[t], **kwargs[t]) for t in range(threads)]
    streams = [torch.cuda.Stream() for _ in range(threads // 2)]

    def work(t):
        # Half the threads on streams of their own, half on torch's default stream.
        with torch.cuda.stream(streams[t] if t < len(streams) else None):
            return [enc.encode(texts[t], **kwargs[t]) for _ in range(2)]

    for t, results in enumerate(in_threads(threads, work)):
        for got in results:
            np.testing.assert_array_equal(got, ref[t], err_msg=f"thread {t}")


# ---- (d) stream order when the GPU lags behind the callers ---------------------------------------
@pytest.mark.parametrize("concurrency", [1, 4], ids=lambda c: f"concurrency={c}")
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_outputs_are_ordered_on_each_callers_stream(small_dir, rng, monkeypatch, graphs, concurrency):
    # Each caller's inputs come from work still queued on its stream (behind a GPU sleep), and it
    # reads the outputs on that stream right after the call. The device input check (a sync per
    # call) is switched off so that the host runs ahead and the streams stay busy: a forward that
    # started before its inputs were written, or ran in a session whose previous forward (on
    # another stream) had not finished, or left its outputs unwritten when the caller's stream
    # reached them, gives wrong values. Two threads call with numpy inputs in between.
    calls = [make_call(rng, *SHAPES[2 + i % 4], "int32" if i % 2 else "int64") for i in range(16)]
    host_calls = [make_call(rng, *SHAPES[2 + i % 4], "numpy") for i in range(4)]
    ref = reference(small_dir, "float16", "unfused", graphs, calls + host_calls)
    enc = load(small_dir, "float16", concurrency, attention="unfused", cuda_graphs=graphs)
    monkeypatch.setattr(enc, "_check_device_values", lambda *args: None, raising=False)
    threads, rounds = 8, 12
    streams = [torch.cuda.Stream() for _ in range(threads)]
    sleeps = rng.integers(20_000, 400_000, (threads, rounds)).tolist()  # GPU clock cycles: ~10-200 us

    def work(t):
        got = []
        if t >= threads - 2:  # host inputs: copied in on the engine's own stream, waited for
            for k in range(rounds):
                i = (t + k) % len(host_calls)
                got.append((len(calls) + i, consume(enc(*host_calls[i]))))
            return got
        with torch.cuda.stream(streams[t]):
            for k in range(rounds):
                i = (3 * t + k) % len(calls)
                torch.cuda._sleep(sleeps[t][k])  # a slow producer
                args = tuple(a.clone() for a in calls[i])  # written only once the sleep is over
                out = enc(*args)
                del args  # freed on this stream: torch may hand the memory to this stream's next tensors
                got.append((i, consume(out)))
        streams[t].synchronize()
        return got

    all_calls = calls + host_calls
    for t, results in enumerate(in_threads(threads, work)):
        for i, (h, p, sums) in results:
            assert_same((h, p), ref[i], f"thread {t}, call {i} ({describe(all_calls[i])})", "float16")
            if sums is not None:
                check_sums(sums, ref[i][0], f"thread {t}, call {i}")
