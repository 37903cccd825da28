"""Shared helpers for the tests."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def ragged_mask(rng, batch, seq, left=False, min_len=1):
    """[B, S] int32 1/0 mask with random lengths; left=True pads on the left."""
    lens = rng.integers(min_len, seq + 1, size=batch)
    lens[0] = seq  # one full row keeps the longest length in play
    mask = np.zeros((batch, seq), dtype=np.int32)
    for b, n in enumerate(lens):
        if left:
            mask[b, seq - n :] = 1
        else:
            mask[b, :n] = 1
    return mask


def run_in_threads(n, work, timeout):
    """Runs work(t) for t in 0..n-1, one thread each, released together; returns the results in order
    and re-raises the first exception a thread raised (none waits longer than `timeout` seconds)."""
    start = threading.Barrier(n)

    def run(t):
        start.wait(timeout=timeout)
        return work(t)

    with ThreadPoolExecutor(n) as ex:
        futures = [ex.submit(run, t) for t in range(n)]
        return [f.result(timeout=timeout) for f in futures]


def assert_threads_match_sequential(enc, rng, vocab_size, max_len, threads=4):
    """Eight batches of random lengths through `enc` one at a time, then from `threads` threads at
    once: each threaded call's last_hidden_state must equal its sequential one exactly (forwards
    hold no Python lock; each must still get its own, correct result)."""
    batches = [rng.integers(0, vocab_size, (3, int(n))) for n in rng.integers(20, max_len, 8)]
    expected = [enc(ids).last_hidden_state for ids in batches]
    with ThreadPoolExecutor(threads) as pool:
        got = list(pool.map(lambda ids: enc(ids).last_hidden_state, batches))
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)


# LayerNorm in float64: the reference of the CPU ops tests.
def layernorm64(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _as_float64(x):
    """x as a float64 numpy array (exactly: every float dtype widens to float64 without rounding);
    a torch tensor may be on any device and of any dtype, bfloat16 included."""
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().double().cpu().numpy()
    return np.asarray(x).astype(np.float64)


def max_error(got, want, relative=False):
    """max |got - want| computed in float64 (0.0 for empty arrays), after checking the shapes agree;
    relative=True divides it by max(1, max |want|), a bound for values of any magnitude."""
    got, want = _as_float64(got), _as_float64(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if got.size == 0:
        return 0.0
    err = float(np.abs(got - want).max())
    return err / max(1.0, float(np.abs(want).max())) if relative else err


def assert_close(got, want, tol, what="", *, relative=False):
    """Asserts that got (numpy arrays, lists or torch tensors) equals want within `tol`: the same
    shape, only finite values in got, and max_error(got, want, relative) <= tol. `what` names the
    compared output in the failure message.

    The finiteness check only makes the message clear: a NaN or an infinity in got would give a NaN
    or infinite error, which fails the tolerance anyway."""
    prefix = f"{what}: " if what else ""
    got, want = _as_float64(got), _as_float64(want)
    assert got.shape == want.shape, f"{prefix}shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{prefix}non-finite values"
    err = max_error(got, want, relative)
    kind = "max error relative to max(1, |want|)" if relative else "max abs error"
    assert err <= tol, f"{prefix}{kind} {err:.3e} > {tol:.3g}"


def padded_ids(rng, config, batch, seq, style):
    """(ids, mask) int numpy [batch, seq] for a transformers `config`: ids above the specials (3 on),
    the pad id exactly where the mask is 0. style: "right" or "left" padding (ragged_mask), or
    "holes" (padding inside the sequences too; every sequence keeps its first token)."""
    ids = rng.integers(3, config.vocab_size, (batch, seq))
    if style == "holes":
        mask = (rng.random((batch, seq)) > 0.25).astype(np.int32)
        mask[:, 0] = 1
    else:
        mask = ragged_mask(rng, batch, seq, left=style == "left")
    ids[mask == 0] = config.pad_token_id
    return ids, mask

