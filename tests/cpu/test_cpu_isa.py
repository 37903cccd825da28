"""The CPU kernels' run-time dispatch: each instruction-set path computes the same ops (forced with
FTBERT_CPU_ISA, as on a CPU without AVX-512 or AVX2), bfloat16 runs on the avx512_bf16 path only
and is refused elsewhere by what is missing, and a bad value is refused by name.

Each case runs in a fresh process: the choice is made once per process.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from ftbert import _ops

# Runs the vectorized ops on odd sizes against float64 references and prints the path taken.
CHECK = textwrap.dedent("""
    import math
    import numpy as np
    from ftbert import _ops
    from tests._util import layernorm64, ragged_mask
    from tests.cpu.test_cpu_ops import ACTS, attention64

    rng = np.random.default_rng(7)
    cpu = _ops.OpRunner("cpu")
    worst = {}
    x = (rng.standard_normal((5, 37)) * 3).astype(np.float32)
    bias = rng.standard_normal(37).astype(np.float32)
    for act in ACTS:
        ref = ACTS[act](x.astype(np.float64) + bias)
        got = cpu.add_bias_activation("float32", x, bias, act)
        worst[act] = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
    res = rng.standard_normal((5, 37)).astype(np.float32)
    gamma, beta = (rng.standard_normal(37).astype(np.float32) for _ in range(2))
    ref = layernorm64(x.astype(np.float64) + bias + res, gamma, beta, 1e-5)
    worst["layernorm"] = np.abs(cpu.add_bias_residual_layernorm("float32", x, res, bias, gamma, beta, 1e-5) - ref).max()
    scores = rng.standard_normal((2, 1, 13, 13)).astype(np.float32)
    mask = ragged_mask(rng, 2, 13)
    e = np.where(mask[:, None, None, :] == 1, np.exp(scores.astype(np.float64) * 0.5), 0.0)
    worst["softmax"] = np.abs(cpu.masked_softmax("float32", scores, mask, 0.5) - e / e.sum(-1, keepdims=True)).max()
    qkv = rng.standard_normal((2, 70, 3 * 2 * 20)).astype(np.float32)
    b3 = rng.standard_normal(120).astype(np.float32)
    mask = ragged_mask(rng, 2, 70)
    ref = attention64(qkv, b3, mask, 2, 0.2)
    worst["attention"] = np.abs(cpu.flash_attention("float32", qkv, b3, mask, 2, 0.2) - ref).max()
    for m, n, k in ((1, 5, 3), (13, 37, 29), (25, 48, 70)):  # every tail of the panel kernel
        a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        ref = a.astype(np.float64) @ w.astype(np.float64)
        worst[f"weight_gemm {m}x{n}x{k}"] = np.abs(cpu.weight_gemm("float32", a, w) - ref).max() / math.sqrt(k)
    bad = {k: float(v) for k, v in worst.items() if not v <= 2e-5}
    print(_ops.cpu_isa(), bad)
""")


def run_with_isa(value):
    env = dict(os.environ, FTBERT_CPU_ISA=value)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300)


ORDER = ["baseline", "avx2", "avx512", "avx512_bf16"]


@pytest.mark.parametrize("isa", ORDER)
def test_each_instruction_set_path_matches_the_references(isa):
    out = run_with_isa(isa)
    assert out.returncode == 0, out.stderr
    chosen, bad = out.stdout.split(" ", 1)
    # A path the CPU lacks is capped to what it has: never a crash, never a wider path.
    assert ORDER.index(chosen) <= ORDER.index(isa)
    assert ORDER.index(chosen) <= ORDER.index(_ops.cpu_isa())
    if isa == "baseline":
        assert chosen == "baseline"
    assert bad.strip() == "{}", f"{chosen}: errors above 2e-5: {bad}"


def test_bad_isa_value_is_refused_by_name():
    env = dict(os.environ, FTBERT_CPU_ISA="avx9000")
    code = "from ftbert import _ops\n_ops.OpRunner('cpu')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "FTBERT_CPU_ISA='avx9000' is not one of avx512_bf16, avx512, avx2, baseline" in out.stderr


# The bfloat16 answer of each path: the reason it cannot run (empty on avx512_bf16) and, where it
# cannot, the error an op gives.
BF16_CHECK = textwrap.dedent("""
    import numpy as np
    from ftbert import _C, _ops
    reason = _C.cpu_dtype_unsupported_reason("bfloat16")
    print(_ops.cpu_isa())
    print(reason)
    cpu = _ops.OpRunner("cpu")
    try:
        cpu.weight_gemm("bfloat16", np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
        print("ran")
    except RuntimeError as e:
        print(e)
""")


@pytest.mark.parametrize("isa", ORDER)
def test_bfloat16_runs_on_the_avx512_bf16_path_only(isa):
    env = dict(os.environ, FTBERT_CPU_ISA=isa)
    out = subprocess.run([sys.executable, "-c", BF16_CHECK], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    chosen, reason, result = out.stdout.splitlines()
    if chosen == "avx512_bf16":
        assert reason == "" and result == "ran"
        return
    if _ops.cpu_isa() == "avx512_bf16":  # the CPU has it: the cap left it out
        assert reason.endswith(f"FTBERT_CPU_ISA={isa} leaves out AVX512-BF16, the instructions the "
                               "CPU backend's bfloat16 GEMMs run on")
    else:
        assert reason.endswith("this CPU lacks AVX512-BF16, the instructions the CPU backend's "
                               "bfloat16 GEMMs run on")
    assert reason.startswith("the CPU backend cannot compute in bfloat16 here: ")
    assert result.startswith(f"{reason} (upload_weight called with bfloat16)")
