"""The measured GEMM choice off the request path (cpp/cuda/gemm/gemm_tuner.h): a shape met untuned
runs the fixed rule at once while the tuner's own thread measures it, a later call runs the pick;
no timing ever runs on a caller's thread; picks persist in the cache file and a later process
measures nothing; a corrupt or foreign cache file is ignored with a warning and replaced; two
processes writing the cache at once lose nothing; recordings made before a pick landed are made
anew; the tuner waits while forwards keep the device busy; FTBERT_GEMM_TUNING=inline makes
forwards wait for their picks.

Each case runs in a process of its own (the picks are process-wide), with the default background
tuning (the suite's conftest.py sets "inline" for every other test) and a cache folder of its own. A
process takes 5-15 s to start (torch, CUDA), hence few of them.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ftbert
from tests._models import make_bert

pytestmark = pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build")

TIMEOUT = 300


def run(code: str, cache: Path, tuning: str = "background", check: bool = True, **env):
    """Runs `code` in a fresh Python; returns (the JSON its last stdout line holds, its stderr)."""
    environ = {**os.environ, "FTBERT_CACHE_DIR": str(cache), "FTBERT_GEMM_TUNING": tuning,
               "FTBERT_GEMM_CHOICE": "auto", **env}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=TIMEOUT)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else None), done.stderr


def start(code: str, cache: Path, **env) -> subprocess.Popen:
    environ = {**os.environ, "FTBERT_CACHE_DIR": str(cache), "FTBERT_GEMM_TUNING": "background",
               "FTBERT_GEMM_CHOICE": "auto", **env}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cache_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("gemm-picks-*.txt"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # Aligned widths (n, k multiples of 8): every candidate, CUTLASS's included, can run.
    path = tmp_path_factory.mktemp("bert-tuning")
    make_bert(path, hidden=128, heads=2, layers=2, intermediate=512, vocab=211, seed=11)
    return path


# Forwards at these batches of 128 tokens: each a row bucket of its own (4 and 8: 512 and 1,024
# rows; 12: 1,536; 40: 5,120), so every one of them meets its GEMMs untuned in a fresh process.
FORWARDS = """
import json, sys
import numpy as np
import ftbert

def forwards(enc, batches, seed):
    rng = np.random.default_rng(seed)
    outs = []
    for b in batches:
        ids = rng.integers(0, 211, size=(b, 128), dtype=np.int32)
        outs.append(enc(ids, np.ones_like(ids)).last_hidden_state)
    return outs
"""


def test_an_untuned_shape_runs_the_rule_at_once_and_its_pick_later(tmp_path, rng):
    seed = int(rng.integers(1 << 30))
    out, _ = run(f"""
        import json
        import numpy as np
        from ftbert import _ops
        g = _ops.OpRunner("cuda")
        g.set_gemm_choice("auto")
        rng = np.random.default_rng({seed})
        m, n, k = 1500, 200, 136
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) * k ** -0.5).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        first = g.weight_gemm("float16", a, w, bias=bias, act="gelu")
        counters = g.tuning_counters
        rule = g.weight_gemm_candidate("cublas", "float16", a, w, bias=bias, act="gelu")
        g.wait_for_tuning()
        pick = g.weight_gemm_pick("float16", m, n, k, act="gelu")
        later = g.weight_gemm("float16", a, w, bias=bias, act="gelu")
        ran = g.weight_gemm_candidate(pick, "float16", a, w, bias=bias, act="gelu") if pick else None
        print(json.dumps(dict(
            first_is_rule=bool(np.array_equal(first, rule)),
            pick=pick, candidates=g.weight_gemm_candidates("float16", m, n, k, act="gelu"),
            later_is_pick=ran is not None and bool(np.array_equal(later, ran)),
            after=g.tuning_counters)))
        """, tmp_path)
    # 1,500 rows of a bias + erf-GELU GEMM: the fixed rule is cuBLAS + the op (gemm_sm90.h).
    assert out["first_is_rule"]
    assert out["pick"] in out["candidates"]
    assert out["later_is_pick"]
    assert out["after"]["measured"] >= 1
    assert out["after"]["on_caller"] == 0
    assert len(cache_files(tmp_path)) == 1


OP_PICKS = """
import json
import numpy as np
from ftbert import _ops
g = _ops.OpRunner("cuda")
g.set_gemm_choice("auto")
rng = np.random.default_rng(SEED)
out = []
# BERT-base's GEMMs at 8,192 rows, where cuBLASLt's algorithms and the CUTLASS kernels are often
# faster than the rule, and a narrow one.
for n, k, act in ((2304, 768, "identity"), (768, 768, "identity"), (3072, 768, "gelu"),
                  (768, 3072, "identity"), (200, 136, "identity")):
    m = 8192
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) * k ** -0.5).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if act != "identity" else None
    g.weight_gemm("float16", a, w, bias=bias, act=act)
    g.wait_for_tuning()
    pick = g.weight_gemm_pick("float16", m, n, k, act=act)
    got = g.weight_gemm("float16", a, w, bias=bias, act=act)
    ran = g.weight_gemm_candidate(pick, "float16", a, w, bias=bias, act=act)
    out.append([pick, bool(np.array_equal(got, ran))])
print(json.dumps(dict(picks=out, counters=g.tuning_counters)))
"""


def test_picks_read_from_the_cache_run_the_kernels_measured(tmp_path, rng):
    # A second process finds every pick in the file (cuBLASLt's algorithms included, stored as
    # they are) and runs each as the candidate of that name, bit for bit.
    code = OP_PICKS.replace("SEED", str(int(rng.integers(1 << 30))))
    first, _ = run(code, tmp_path)
    second, err = run(code, tmp_path)
    assert "warning" not in err, err
    assert first["counters"]["measured"] == 5 and second["counters"]["measured"] == 0
    assert second["counters"]["loaded"] == 5
    assert [p for p, _ in second["picks"]] == [p for p, _ in first["picks"]]
    assert all(same for _, same in first["picks"] + second["picks"]), (first, second)


def test_forwards_never_time_and_a_later_process_reuses_the_picks(tmp_path, model_dir):
    code = FORWARDS + f"""
enc = ftbert.Encoder.from_pretrained({str(model_dir)!r}, device="cuda", dtype="float16")
loaded = enc.gemm_tuning
forwards(enc, [4, 8, 12, 40], 1)  # meets each bucket; the tuner measures
early = enc.gemm_tuning
enc._native.wait_for_tuning()
outs = forwards(enc, [4, 8, 12, 40], 2)  # the picks
np.savez({str(tmp_path)!r} + ("/second.npz" if loaded["loaded"] else "/first.npz"), *outs)
print(json.dumps(dict(loaded=loaded, early=early, done=enc.gemm_tuning)))
"""
    first, err = run(code, tmp_path)
    assert first["loaded"]["loaded"] == 0 and first["loaded"]["measured"] == 0
    assert first["early"]["on_caller"] == 0
    assert first["done"]["on_caller"] == 0
    # Up to four GEMMs a layer (QKV, attention output, FFN in, FFN out) at four buckets.
    assert first["done"]["measured"] >= 8, first
    assert first["done"]["cache_writes"] == first["done"]["measured"]
    assert len(cache_files(tmp_path)) == 1, "ignoring" + err

    second, err = run(code, tmp_path)
    assert "warning" not in err, err
    assert second["loaded"]["loaded"] == first["done"]["measured"]
    assert second["done"]["measured"] == 0  # nothing left to measure
    a = np.load(tmp_path / "first.npz")
    b = np.load(tmp_path / "second.npz")
    for key in a.files:  # the same kernels: the same bits
        assert np.array_equal(a[key], b[key]), key


def persisted_picks_code(model_dir, out_dir, **load) -> str:
    """A process that loads the model with `load`, runs forwards of 1, 4 and 12 sequences, waits for
    the tuner, runs them again and saves those outputs to out_dir as first.npz (it measured),
    second.npz (it loaded picks) or fixed.npz (FTBERT_GEMM_CHOICE=fixed); prints the counters."""
    return FORWARDS.replace("import json, sys", "import json, os, sys") + f"""
enc = ftbert.Encoder.from_pretrained({str(model_dir)!r}, device="cuda", dtype="float16", **{load!r})
loaded = enc.gemm_tuning
forwards(enc, [1, 4, 12], 1)
enc.wait_for_tuning()
outs = forwards(enc, [1, 4, 12], 2)
name = "/fixed.npz" if os.environ["FTBERT_GEMM_CHOICE"] == "fixed" else (
    "/second.npz" if loaded["loaded"] else "/first.npz")
np.savez({str(out_dir)!r} + name, *outs)
print(json.dumps(dict(loaded=loaded, done=enc.gemm_tuning)))
"""


def test_batch_invariant_picks_persist_and_keep_the_bits(tmp_path, model_dir):
    # Batch-invariant forwards measure their own picks (among kernels with the reference's bits),
    # under keys of their own in the same cache file; a later process loads them and computes the
    # same bits, as does a process that measures nothing ("fixed": the reference everywhere).
    code = persisted_picks_code(model_dir, tmp_path, batch_invariant=True)
    first, err = run(code, tmp_path)
    assert first["done"]["measured"] >= 4, first
    text = cache_files(tmp_path)[0].read_text()
    assert ",invariant" in text, text[:2000]
    second, err = run(code, tmp_path)
    assert "warning" not in err, err
    assert second["loaded"]["loaded"] == first["done"]["measured"]
    assert second["done"]["measured"] == 0
    fixed, _ = run(code, tmp_path / "none", FTBERT_GEMM_CHOICE="fixed")
    assert fixed["done"]["measured"] == 0
    a, b, c = (np.load(tmp_path / f) for f in ("first.npz", "second.npz", "fixed.npz"))
    for key in a.files:
        assert np.array_equal(a[key], b[key]) and np.array_equal(a[key], c[key]), key


def _hopper() -> bool:
    import torch
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.skipif(not _hopper(), reason="quantization 'fp8' needs compute capability 9.0+")
@pytest.mark.parametrize("invariant", [True, False])
def test_fp8_picks_are_measured_persist_and_keep_the_bits(tmp_path, model_dir, invariant):
    # FP8 GEMMs are measured among cuBLASLt's FP8 algorithms under keys of their own (",fp8"); a
    # later process loads the picks and computes the same bits. Under batch invariance every
    # bucket is measured and any pick gives the reference's bits, as "fixed" (no measurement)
    # computes them.
    code = persisted_picks_code(model_dir, tmp_path, batch_invariant=invariant, quantization="fp8")
    first, err = run(code, tmp_path)
    assert "failed" not in err, err
    text = cache_files(tmp_path)[0].read_text()
    fp8_keys = [line for line in text.splitlines() if ",fp8" in line]
    # bert's four weight GEMMs at 512 and 1,536 rows, and under invariance at 128 rows too
    assert len(fp8_keys) >= (12 if invariant else 8), text[:3000]
    assert all((",invariant,fp8" in line) == invariant for line in fp8_keys), fp8_keys
    second, err = run(code, tmp_path)
    assert "warning" not in err, err
    assert second["loaded"]["loaded"] == first["done"]["measured"]
    assert second["done"]["measured"] == 0
    a, b = (np.load(tmp_path / f) for f in ("first.npz", "second.npz"))
    for key in a.files:
        assert np.array_equal(a[key], b[key]), key
    if invariant:
        run(code, tmp_path / "none", FTBERT_GEMM_CHOICE="fixed")
        c = np.load(tmp_path / "fixed.npz")
        for key in a.files:
            assert np.array_equal(a[key], c[key]), key


COUNT_PICKS = FORWARDS + """
enc = ftbert.Encoder.from_pretrained(sys.argv[1], device="cuda", dtype="float16")
batches = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 and sys.argv[2] else []
forwards(enc, batches, 3)
enc._native.wait_for_tuning()
print(json.dumps(enc.gemm_tuning))
"""


def count_picks(model_dir, cache, batches=(), **kw):
    code = COUNT_PICKS.replace("sys.argv[1]", repr(str(model_dir))).replace(
        "sys.argv[2]", repr(",".join(map(str, batches)))).replace("len(sys.argv) > 2", "True")
    return run(code, cache, **kw)


def damaged(data: bytes, damage: str, rng) -> bytes:
    data = bytearray(data)
    if damage == "flipped byte":
        i = int(rng.integers(len(data) // 3, len(data) - 2))
        data[i] = ord("x") if data[i] != ord("x") else ord("y")
    elif damage == "truncated":
        data = data[: int(rng.integers(len(data) // 2, len(data) - 1))]
    elif damage == "garbage":
        data = bytearray(rng.integers(0, 256, size=500, dtype=np.uint8).tobytes())
    else:  # "foreign": the same file measured under another driver, valid but not ours
        text = data.decode()
        assert "driver " in text
        data = bytearray(text.replace("driver ", "driver 1", 1).encode())
    return bytes(data)


def test_a_damaged_or_foreign_cache_file_is_ignored_with_a_warning(tmp_path, model_dir, rng):
    made, _ = count_picks(model_dir, tmp_path, [4, 8])
    assert made["measured"] > 0
    (path,) = cache_files(tmp_path)
    good = path.read_bytes()
    for damage in ("flipped byte", "truncated", "garbage", "foreign"):
        path.write_bytes(damaged(good, damage, rng))
        again, err = count_picks(model_dir, tmp_path, [4, 8])
        assert "warning" in err and str(path) in err, (damage, err)
        assert again["loaded"] == 0, damage
        assert again["measured"] == made["measured"], damage  # measured anew, written back whole
    reread, err = count_picks(model_dir, tmp_path)
    assert "warning" not in err, err
    assert reread["loaded"] == made["measured"]


def test_two_processes_tuning_at_once_lose_no_pick(tmp_path, model_dir):
    code = COUNT_PICKS.replace("sys.argv[1]", repr(str(model_dir))).replace("len(sys.argv) > 2", "True")
    one = start(code.replace("sys.argv[2]", repr("4,8,12")), tmp_path)
    two = start(code.replace("sys.argv[2]", repr("16,24,40,64")), tmp_path)
    outs = []
    for p in (one, two):
        stdout, stderr = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert all(o["measured"] > 0 for o in outs)
    both, err = count_picks(model_dir, tmp_path)
    assert "warning" not in err, err
    assert both["loaded"] == outs[0]["measured"] + outs[1]["measured"]  # disjoint row buckets


def test_recordings_made_before_a_pick_lands_are_made_anew(tmp_path, model_dir):
    out, _ = run(FORWARDS + f"""
enc = ftbert.Encoder.from_pretrained({str(model_dir)!r}, device="cuda", dtype="float16")
rng = np.random.default_rng(5)
ids = rng.integers(0, 211, size=(8, 128), dtype=np.int32)
mask = np.ones_like(ids)
for _ in range(3):
    enc(ids, mask)  # the second records the forward, with the rule's kernels
recorded = enc.recorded_shapes
enc._native.wait_for_tuning()
first = enc(ids, mask).last_hidden_state  # the picks landed: the recording went, op by op now
after_landing = enc.recorded_shapes
for _ in range(2):
    replayed = enc(ids, mask).last_hidden_state
rerecorded = enc.recorded_shapes
enc.cuda_graphs = False
plain = enc(ids, mask).last_hidden_state
print(json.dumps(dict(recorded=recorded, after_landing=after_landing, rerecorded=rerecorded,
                      same=bool(np.array_equal(first, replayed) and np.array_equal(first, plain)))))
""", tmp_path)
    assert out["recorded"] == 1
    assert out["after_landing"] == 0
    assert out["rerecorded"] == 1
    assert out["same"]


def test_inline_tuning_makes_the_first_forward_wait_for_its_picks(tmp_path, model_dir):
    out, _ = run(FORWARDS + f"""
enc = ftbert.Encoder.from_pretrained({str(model_dir)!r}, device="cuda", dtype="float16")
rng = np.random.default_rng(6)
ids = rng.integers(0, 211, size=(12, 128), dtype=np.int32)
first = enc(ids, np.ones_like(ids)).last_hidden_state
counters = enc.gemm_tuning
enc._native.wait_for_tuning()
second = enc(ids, np.ones_like(ids)).last_hidden_state
print(json.dumps(dict(counters=counters, same=bool(np.array_equal(first, second)),
                      recorded=enc.recorded_shapes)))
""", tmp_path, tuning="inline")
    assert out["counters"]["measured"] >= 2  # before the first forward returned (QKV, FFN in, ...)
    assert out["counters"]["on_caller"] == 0  # still on the tuner's thread
    assert out["same"]


def test_the_callers_device_synchronize_works_while_the_tuner_measures(tmp_path, model_dir):
    # The tuner runs beside the caller's own CUDA work: nothing it does may make that fail (a graph
    # capture in progress on its thread would refuse torch.cuda.synchronize() in the caller's).
    out, _ = run(FORWARDS + f"""
import time
import torch
enc = ftbert.Encoder.from_pretrained({str(model_dir)!r}, device="cuda", dtype="float16")
forwards(enc, [4, 8, 12, 16, 24, 40, 64], 8)  # shapes for the tuner
x = torch.randn(256, 256, device="cuda")
syncs, end = 0, time.perf_counter() + 3.0
while time.perf_counter() < end:
    x = x @ x.T / 256
    torch.cuda.synchronize()
    syncs += 1
enc._native.wait_for_tuning()
print(json.dumps(dict(syncs=syncs, counters=enc.gemm_tuning)))
""", tmp_path)
    assert out["syncs"] > 100
    assert out["counters"]["measured"] >= 8


def test_forwards_across_a_landing_run_the_rule_or_the_picks_never_a_mix(tmp_path, model_dir):
    # Four threads forward the same batch while the picks land: each result is the rule's (the
    # first forward's) or the picks' (the last one's). A forward that ran some GEMMs by the rule and
    # others by the picks, or a replay of a recording made before the landing beside an op-by-op
    # forward after it, would give a third result.
    out, _ = run(FORWARDS + f"""
import hashlib, threading
enc = ftbert.Encoder.from_pretrained({str(model_dir)!r}, device="cuda", dtype="float16",
                                     concurrency=4)
rng = np.random.default_rng(9)
ids = rng.integers(0, 211, size=(40, 128), dtype=np.int32)
mask = np.ones_like(ids)
digest = lambda out: hashlib.sha256(out.last_hidden_state.tobytes()).hexdigest()
first = digest(enc(ids, mask))  # meets its buckets untuned: the rule
seen, errors = [], []
def work():
    # The tuner waits while forwards keep the device busy (kBusyGrace): forward until it has
    # measured, then 20 more, so that picks land while the threads run.
    import time
    deadline, more = time.monotonic() + 60, 20
    try:
        while more > 0 and time.monotonic() < deadline:
            seen.append(digest(enc(ids, mask)))
            if enc.gemm_tuning["measured"] > 0:
                more -= 1
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
enc._native.wait_for_tuning()
last = digest(enc(ids, mask))
print(json.dumps(dict(first=first, last=last, seen=sorted(set(seen)), errors=errors,
                      measured=enc.gemm_tuning["measured"])))
""", tmp_path)
    assert not out["errors"], out["errors"]
    assert out["measured"] > 0
    assert set(out["seen"]) <= {out["first"], out["last"]}, out


def test_the_tuner_waits_while_forwards_keep_the_device_busy(tmp_path, model_dir):
    # Forwards back to back for a second, meeting new shapes: the tuner times none of them then
    # (it waits for a quiet device, or for kBusyGrace into a busy stretch), and all once asked to.
    out, _ = run(FORWARDS + f"""
import time
enc = ftbert.Encoder.from_pretrained({str(model_dir)!r}, device="cuda", dtype="float16")
rng = np.random.default_rng(12)
batches = [rng.integers(0, 211, size=(b, 128), dtype=np.int32) for b in (4, 8, 12, 16, 24, 40)]
gaps, end, last = [], time.perf_counter() + 1.0, None
while time.perf_counter() < end:
    for ids in batches:
        start = time.perf_counter()
        if last is not None:
            gaps.append(start - last)
        enc(ids, np.ones_like(ids))
        last = time.perf_counter()
during = enc.gemm_tuning
enc._native.wait_for_tuning()
print(json.dumps(dict(during=during, after=enc.gemm_tuning, longest_gap_ms=1e3 * max(gaps))))
""", tmp_path)
    if out["longest_gap_ms"] >= 15:  # the quiet window is 20 ms: the host paused the loop
        pytest.skip(f"the forwards left a gap of {out['longest_gap_ms']:.1f} ms; the test needs them back to back")
    assert out["during"]["measured"] == 0, out
    assert out["after"]["measured"] >= 4, out  # the row buckets of 512 rows and more
    assert out["after"]["on_caller"] == 0


def test_a_cache_that_cannot_be_written_warns_once_and_the_picks_still_serve(tmp_path, model_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out, err = count_picks(model_dir, tmp_path, [4, 8, 12], FTBERT_CACHE_DIR=str(blocker / "cache"))
    assert out["measured"] >= 8 and out["cache_writes"] == 0
    assert err.count("cannot store") == 1, err


def test_a_bad_tuning_mode_is_refused_by_name(tmp_path):
    _, err = run("""
        import ftbert, numpy as np
        from ftbert import _ops
        _ops.OpRunner("cuda")
        """, tmp_path, tuning="eager", check=False)
    assert "FTBERT_GEMM_TUNING must be 'background' or 'inline', got 'eager'" in err


def test_ftbert_tune_fills_the_cache_for_later_processes(tmp_path, model_dir):
    env = {**os.environ, "FTBERT_CACHE_DIR": str(tmp_path)}
    env.pop("FTBERT_GEMM_TUNING", None)
    cmd = [sys.executable, "-m", "ftbert", "tune", str(model_dir), "--max-tokens", "1536"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr
    assert "shapes measured" in first.stdout and " 0 shapes measured" not in first.stdout, first.stdout
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert " 0 shapes measured" in again.stdout, again.stdout
    assert " 0 found in the cache" not in again.stdout, again.stdout
    out, _ = count_picks(model_dir, tmp_path, [4, 8, 12])  # 512 to 1,536 rows: all tuned
    assert out["measured"] == 0 and out["loaded"] > 0
