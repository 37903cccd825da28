"""quantization="int8" on the CPU: the int8 weight GEMM against a numpy model of the same
quantization (per output channel weights, per row asymmetric activations, exact integer sums) at
odd sizes, with and without bias and activation; batch invariance; every family through it; the
accuracy gate on the real all-MiniLM-L6-v2 (embedding cosine against float32); the settings it
refuses."""

import numpy as np
import pytest

import ftbert
from ftbert import _C, _ops
from tests._invariance import VOCAB, check_invariance
from tests._models import make_model, minilm_path


def quantized_reference(a: np.ndarray, w: np.ndarray, bias, act: str) -> np.ndarray:
    """What the int8 GEMM computes, in numpy: float64 except where the engine rounds to float32."""
    f = np.float32
    top = np.abs(w).max(0).astype(f)
    sw = top / f(127)
    inv_w = np.where(top > 0, f(127) / np.where(top > 0, top, 1), f(0)).astype(f)
    qw = np.rint(w * inv_w).astype(np.int64)
    lo, hi = a.min(1).astype(f), a.max(1).astype(f)
    t = (hi - lo) / f(255)
    inv_a = np.where(hi > lo, f(255) / np.where(hi > lo, hi - lo, 1), f(0)).astype(f)
    qa = np.rint(np.clip((a - lo[:, None]) * inv_a[:, None], 0, 255)).astype(np.int64)
    s = (qa @ qw).astype(np.float64)
    y = (s * t[:, None] + lo[:, None].astype(np.float64) * qw.sum(0)) * sw
    if bias is not None:
        y = y + bias
    return _gelu(y) if act == "gelu" else y


def _gelu(x):
    import torch

    return torch.nn.functional.gelu(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("m, k, n", [(1, 5, 3), (7, 384, 1536), (33, 1536, 384), (13, 70, 49), (200, 129, 33)])
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias+gelu"])
def test_int8_gemm_is_the_quantized_product(rng, m, k, n, epilogue):
    r = _ops.OpRunner("cpu")
    r.quantization = "int8"
    assert r.quantization == "int8"
    a = (rng.standard_normal((m, k)) + rng.uniform(-1, 1)).astype(np.float32)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    w[:, 0] = 0.0  # an all-zero column: scale 0
    bias = None if epilogue == "none" else rng.standard_normal(n).astype(np.float32)
    act = "gelu" if epilogue == "bias+gelu" else "identity"
    got = r.weight_gemm("float32", a, w, bias=bias, act=act)
    want = quantized_reference(a, w, bias, act)
    scale = np.abs(want).max() + 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)
    # And within quantization error of the float product.
    exact = a.astype(np.float64) @ w + (0 if bias is None else bias)
    if act == "gelu":
        exact = _gelu(exact)
    assert np.abs(got - exact).max() <= 0.05 * np.abs(exact).max() + 1e-3


def test_a_constant_row_is_exact(rng):
    r = _ops.OpRunner("cpu")
    r.quantization = "int8"
    a = np.full((3, 64), 0.75, np.float32)  # no range: scale 0, every value the row's low
    w = (rng.standard_normal((64, 20)) * 0.05).astype(np.float32)
    got = r.weight_gemm("float32", a, w)
    np.testing.assert_allclose(got, quantized_reference(a, w, None, "identity"), rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module", params=["bert", "roberta", "mpnet", "modernbert", "electra"])
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    kind = "token" if request.param == "electra" else "cls"
    hf = make_model(path, request.param, kind, hidden=64, heads=2, layers=2, vocab=VOCAB, num_labels=3, seed=9)
    return request.param, kind, path, hf.config.pad_token_id or 0


def test_every_family_runs_int8_close_to_float32(family, rng):
    name, kind, path, pad = family
    f32 = ftbert.Encoder.from_pretrained(path)
    q8 = ftbert.Encoder.from_pretrained(path, quantization="int8")
    assert q8.quantization == "int8" and f32.quantization is None
    ids = rng.integers(3, VOCAB, (3, 41))
    mask = np.ones_like(ids)
    mask[1, 30:] = 0
    ids[mask == 0] = pad
    a, b = f32(ids, mask).last_hidden_state, q8(ids, mask).last_hidden_state
    rows = mask.astype(bool)
    cos = (a * b).sum(-1)[rows] / np.linalg.norm(a, axis=-1)[rows] / np.linalg.norm(b, axis=-1)[rows]
    assert cos.min() > 0.98, f"{name}: cosine {cos.min()}"


def test_int8_is_batch_invariant(family):
    name, kind, path, pad = family
    enc = ftbert.Encoder.from_pretrained(path, quantization="int8", padding_free=True)
    left_ok = name in ("roberta", "mpnet")
    check_invariance(enc, kind, pad, left_ok=left_ok, first_token_always=True, examples=6)


def test_accuracy_gate_on_minilm():
    # The gate: embedding cosine against float32, mean >= 0.995 and min >= 0.99, over
    # varied sentences (benchmarks/cpu_int8.py runs it over 4,096).
    from pathlib import Path

    from ftbert.bench.varlen import load_tokenizer, make_sentences

    path = minilm_path()
    texts = make_sentences(load_tokenizer(Path(path)), 512, 126, 1)
    f32 = ftbert.Encoder.from_pretrained(path).encode(texts)
    q8 = ftbert.Encoder.from_pretrained(path, quantization="int8").encode(texts)
    cos = (f32 * q8).sum(1) / np.linalg.norm(f32, axis=1) / np.linalg.norm(q8, axis=1)
    assert cos.mean() >= 0.995 and cos.min() >= 0.99, (cos.mean(), cos.min())


def test_settings_it_refuses(tmp_path):
    make_model(tmp_path, "bert", "cls", hidden=64, heads=2, layers=1, vocab=VOCAB, num_labels=3, seed=2)
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        ftbert.Encoder.from_pretrained(tmp_path, quantization="int4")
    if not _C.cpu_dtype_unsupported_reason("bfloat16"):
        with pytest.raises(ValueError, match="float32 activations"):
            ftbert.Encoder.from_pretrained(tmp_path, dtype="bfloat16", quantization="int8")
    r = _ops.OpRunner("cpu")
    with pytest.raises(ValueError, match="unknown quantization"):
        r.quantization = "fp4"
    # fp8 is the GPU's: refused on the CPU, by the encoder and by the op alike.
    with pytest.raises(ValueError, match="compute capability 9.0"):
        ftbert.Encoder.from_pretrained(tmp_path, quantization="fp8")
    r.quantization = "fp8"
    with pytest.raises(ValueError, match="not on the CPU"):
        r.weight_gemm("float32", np.ones((2, 16), np.float32), np.ones((16, 16), np.float32))


AVX2_CHECK = """
import json, sys
import numpy as np
sys.path.insert(0, ROOT)
from ftbert import _C, _ops
from tests.cpu.test_cpu_int8 import quantized_reference
rng = np.random.default_rng(SEED)
worst = 0.0
for m, k, n in ((1, 5, 3), (2, 64, 32), (3, 64, 17), (13, 70, 49), (33, 1536, 384), (7, 384, 1536)):
    for bias, act in ((False, "identity"), (True, "identity"), (True, "gelu")):
        r = _ops.OpRunner("cpu")
        r.quantization = "int8"
        a = (rng.standard_normal((m, k)) + rng.uniform(-1, 1)).astype(np.float32)
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) if bias else None
        got = r.weight_gemm("float32", a, w, bias=b, act=act)
        want = quantized_reference(a, w, b, act)
        worst = max(worst, float(np.abs(got - want).max() / (np.abs(want).max() + 1.0)))
print(json.dumps(dict(kernel=_C.cpu_int8_kernel(), dot=_C.cpu_has_int8_dot_product(), worst=worst)))
"""


def test_the_avx2_kernel_is_the_quantized_product(rng):
    # CPUs without VNNI (FTBERT_CPU_ISA=avx2 here) run the AVX2 kernel: 16-bit products summed
    # exactly in 32 bits, so the same quantized product as the others, at 1 to 33 rows (its tiles
    # of 2 and the last row alone), one and two panels, k up to 1,536.
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    code = AVX2_CHECK.replace("ROOT", repr(root)).replace("SEED", str(int(rng.integers(1 << 30))))
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, FTBERT_CPU_ISA="avx2"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["kernel"] == "portable":  # FTBERT_CPU_ISA caps at what the CPU has
        pytest.skip("this CPU has no AVX2: the portable kernel runs")
    assert out["kernel"] == "avx2" and out["dot"] is False  # 16-bit products: no faster than float32
    assert out["worst"] < 2e-5, out


@pytest.mark.parametrize("isa, kernel", [("baseline", "portable"), ("avx2", "avx2")])
def test_a_kernel_slower_than_float32_is_named_in_a_warning(tmp_path, isa, kernel):
    import os
    import subprocess
    import sys

    make_model(tmp_path, "bert", "cls", hidden=64, heads=2, layers=1, vocab=VOCAB, num_labels=3, seed=2)
    code = (f"import ftbert, numpy as np; e = ftbert.Encoder.from_pretrained({str(tmp_path)!r}, "
            "quantization='int8'); print(e(np.ones((1, 5), np.int64)).last_hidden_state.shape, "
            "ftbert._C.cpu_int8_kernel())")
    env = dict(os.environ, FTBERT_CPU_ISA=isa)
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    if kernel not in done.stdout:  # FTBERT_CPU_ISA caps at what the CPU has
        pytest.skip(f"this CPU has no {isa}: {done.stdout.strip()}")
    assert f"runs the {kernel} kernel" in done.stderr and "(1, 5, 64)" in done.stdout
    if _C.cpu_has_int8_dot_product():
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ftbert.Encoder.from_pretrained(tmp_path, quantization="int8")


def test_every_int8_kernel_of_this_cpu_gives_the_same_bits(tmp_path, rng):
    # AMX, VNNI, AVX2 and the portable kernel sum exactly, and share the epilogue of their
    # instruction set: with AMX left out (FTBERT_CPU_AMX=0) the GEMM gives the same bits.
    import os
    import subprocess
    import sys

    a = (rng.standard_normal((45, 200)) + 0.3).astype(np.float32)
    w = (rng.standard_normal((200, 70)) * 0.05).astype(np.float32)
    b = rng.standard_normal(70).astype(np.float32)
    np.save(tmp_path / "a.npy", a), np.save(tmp_path / "w.npy", w), np.save(tmp_path / "b.npy", b)
    code = ("import numpy as np; from ftbert import _C, _ops; r = _ops.OpRunner('cpu'); r.quantization = 'int8'; "
            f"d = {str(tmp_path)!r}; "
            "c = r.weight_gemm('float32', np.load(d + '/a.npy'), np.load(d + '/w.npy'), bias=np.load(d + '/b.npy'), act='gelu'); "
            "np.save(d + '/c.npy', c); print(_C.cpu_int8_kernel())")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, FTBERT_CPU_AMX="0"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() in ("vnni", "avx2", "portable")
    r = _ops.OpRunner("cpu")
    r.quantization = "int8"
    here = r.weight_gemm("float32", a, w, bias=b, act="gelu")
    if _C.cpu_int8_kernel() == "portable" or done.stdout.strip() == _C.cpu_int8_kernel():
        pytest.skip(f"one int8 kernel on this CPU ({_C.cpu_int8_kernel()}): nothing to compare")
    np.testing.assert_array_equal(here, np.load(tmp_path / "c.npy"))
