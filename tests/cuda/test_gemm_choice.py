"""The weight GEMM's measured kernel choice (cpp/cuda/gemm/gemm_tuner.h, weight_gemm.cu).

Every candidate the CUDA backend may pick is held to the CPU reference on its own (a wrong
candidate would otherwise surface only when the timing happened to pick it); "auto" runs the
candidate it picked, bit for bit; the pick is shared by every backend of the process; "fixed"
keeps the offline rule; bad modes are refused with a message that names the good ones.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
_ops = pytest.importorskip("ftbert._ops")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not _ops.cuda_backend_built(), reason="this ftbert build has no CUDA backend"),
]

from tests.cuda.test_cuda_ops import FP32_NOISE, check, randn  # noqa: E402

HOPPER_FUSED = _ops.cuda_fused_gemm_built() and torch.cuda.is_available() and \
    torch.cuda.get_device_capability() == (9, 0)


# The epilogues the choice covers: none, bias + erf-GELU (BERT's FFN-in), bias + tanh-GELU and
# bias + ReLU (other checkpoints' FFN-in, which cuBLASLt can fuse).
EPILOGUES = ["identity", "gelu", "gelu_tanh", "relu"]


def reference(cpu, rng, dtype, m, n, k, act):
    a = randn(rng, (m, k), dtype)
    w = randn(rng, (k, n), dtype, scale=k**-0.5)
    bias = randn(rng, (n,), dtype) if act != "identity" else None
    want = cpu.weight_gemm("float32", a, w, bias=bias, act=act)
    bound = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    magnitude = np.abs(cpu.weight_gemm("float32", a, w)) + (np.abs(bias) if bias is not None else 0.0)
    return a, w, bias, want, bound, magnitude


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("act", EPILOGUES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (600, 136, 72), (1000, 264, 200), (4133, 96, 40)])
def test_every_candidate_matches_cpu(gpu, cpu, rng, dtype, act, m, n, k):
    a, w, bias, want, bound, magnitude = reference(cpu, rng, dtype, m, n, k, act)
    names = gpu.weight_gemm_candidates(dtype, m, n, k, act=act)
    assert names[0] == "cublas"
    assert any(x.startswith("cublaslt:") for x in names), names
    assert len(set(names)) == len(names), names
    assert all(x == "cublas" or x.startswith(("cublaslt:", "cublaslt-nows:", "cutlass:"))
               for x in names), names
    cutlass = {"cutlass:64x64", "cutlass:coop_128x256", "cutlass:pingpong_128x128"}
    if HOPPER_FUSED and act == "gelu":
        assert cutlass <= set(names)
    else:
        assert not cutlass & set(names)  # the CUTLASS kernels' epilogue is erf-GELU only
    for name in names:
        got = gpu.weight_gemm_candidate(name, dtype, a, w, bias=bias, act=act)
        try:
            check(got, want, dtype, atol=1.2 * FP32_NOISE * bound + 1e-6, ulps=3,
                  magnitude=magnitude)
        except AssertionError as e:
            raise AssertionError(f"candidate {name}: {e}") from None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("act", ["identity", "gelu"])  # ReLU maps -inf to 0 by definition
def test_every_candidate_keeps_non_finite_rows_non_finite(gpu, cpu, rng, dtype, act):
    # A NaN or inf in the input (a broken upstream) must stay visible to the output's non-finite
    # check whichever kernel the choice picks: the fused epilogues' activation included.
    m, n, k = 700, 136, 72
    a, w, bias, want, _, _ = reference(cpu, rng, dtype, m, n, k, act)
    a = a.copy()
    bad = {3: np.nan, 100: np.inf, 555: -np.inf}
    for row, value in bad.items():
        a[row, 5] = value
    for name in gpu.weight_gemm_candidates(dtype, m, n, k, act=act):
        got = gpu.weight_gemm_candidate(name, dtype, a, w, bias=bias, act=act).astype(np.float32)
        for row in bad:
            assert not np.isfinite(got[row]).any(), (name, row, got[row][:8])
        finite = [r for r in range(m) if r not in bad]
        assert np.isfinite(got[finite]).all(), name


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("act", EPILOGUES)
def test_auto_runs_its_pick_and_shares_it(gpu, cpu, rng, dtype, act):
    m, n, k = 1500, 200, 136  # >= 512 rows: measured
    a, w, bias, want, bound, magnitude = reference(cpu, rng, dtype, m, n, k, act)
    gpu.set_gemm_choice("auto")
    got = gpu.weight_gemm(dtype, a, w, bias=bias, act=act)
    pick = gpu.weight_gemm_pick(dtype, m, n, k, act=act)
    assert pick in gpu.weight_gemm_candidates(dtype, m, n, k, act=act)
    assert np.array_equal(got, gpu.weight_gemm_candidate(pick, dtype, a, w, bias=bias, act=act))
    check(got, want, dtype, atol=1.2 * FP32_NOISE * bound + 1e-6, ulps=3, magnitude=magnitude)
    # Another row count of the same bucket (1,281 to 1,536: gemm_tuner.h's rows_bucket) and
    # another backend: the same pick.
    other = _ops.OpRunner("cuda")
    assert other.weight_gemm_pick(dtype, 1281, n, k, act=act) == pick
    a2 = a[:1281]
    got2 = other.weight_gemm(dtype, a2, w, bias=bias, act=act)
    assert np.array_equal(got2, other.weight_gemm_candidate(pick, dtype, a2, w, bias=bias, act=act))
    # The buckets on either side have not been measured.
    assert gpu.weight_gemm_pick(dtype, 1280, n, k, act=act) == ""
    assert gpu.weight_gemm_pick(dtype, 1537, n, k, act=act) == ""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_no_workspace_candidates_clear_nothing_and_match_cpu(gpu, cpu, rng, dtype):
    # BERT-base's attention output at 4,096 rows: cuBLASLt's algorithms run without a workspace
    # (the memset-free candidates "auto" can pick for graphs) must issue no memset, and compute
    # what the CPU does.
    from torch.profiler import ProfilerActivity, profile

    m, n, k = 4096, 768, 768
    a, w, bias, want, bound, magnitude = reference(cpu, rng, dtype, m, n, k, "identity")
    every = gpu.weight_gemm_candidates(dtype, m, n, k)
    names = [x for x in every if x.startswith("cublaslt-nows:")]
    assert names, every
    for name in names:
        gpu.weight_gemm_candidate(name, dtype, a, w)  # loads the kernel
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = gpu.weight_gemm_candidate(name, dtype, a, w)
            torch.cuda.synchronize()
        memsets = [e.key for e in prof.key_averages() if "memset" in e.key.lower()]
        assert not memsets, (name, memsets)
        check(got, want, dtype, atol=1.2 * FP32_NOISE * bound + 1e-6, ulps=3, magnitude=magnitude)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n,k,act", [(264, 1544, "identity"), (1032, 264, "gelu")])
def test_batch_invariant_picks_give_the_reference_bits_at_every_row_count(gpu, rng, dtype, n, k, act):
    # Under batch_invariant "auto" measures every row bucket, among the kernels whose bits equal
    # the reference's (the one algorithm "fixed" runs at every row count). A long k is where
    # cuBLAS splits k at few rows; a kernel that did, or any other order of the sums, would differ
    # in the rows below. Rows computed at 3,001 rows are the reference for every row count.
    a = randn(rng, (3001, k), dtype)
    w = randn(rng, (k, n), dtype, scale=k**-0.5)
    bias = randn(rng, (n,), dtype) if act != "identity" else None
    gpu.batch_invariant = True
    try:
        gpu.set_gemm_choice("fixed")
        reference = gpu.weight_gemm(dtype, a, w, bias=bias, act=act)
        gpu.set_gemm_choice("auto")
        for m in (1, 7, 130, 700, 3001):
            got = gpu.weight_gemm(dtype, a[:m], w, bias=bias, act=act)  # the bucket's pick (inline)
            gpu.wait_for_tuning()
            pick = gpu.weight_gemm_pick(dtype, m, n, k, act=act)
            assert pick == "cublaslt-invariant" or pick.startswith(("cublaslt-nows:", "cutlass")), pick
            assert np.array_equal(got.view(np.uint32), reference[:m].view(np.uint32)), (m, pick)
    finally:
        gpu.batch_invariant = False
        gpu.set_gemm_choice("auto")


@pytest.mark.skipif(not HOPPER_FUSED, reason="the fused erf-GELU kernels are built for Hopper only")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("choice", ["fixed", "auto"])
def test_batch_invariant_erf_gelu_is_one_fused_kernel(gpu, cpu, rng, dtype, choice):
    # cuBLASLt has no erf-GELU epilogue: its class would add the bias and GELU in a second kernel
    # after rounding the product. Invariant forwards run the fused kernels' class instead, which
    # rounds once: held to float32 here, and one kernel per GEMM at every row count.
    from torch.profiler import ProfilerActivity, profile

    n, k = 1032, 264
    gpu.batch_invariant = True
    gpu.set_gemm_choice(choice)
    try:
        for m in (1, 130, 4100):
            a, w, bias, want, bound, magnitude = reference(cpu, rng, dtype, m, n, k, "gelu")
            gpu.weight_gemm(dtype, a, w, bias=bias, act="gelu")
            gpu.wait_for_tuning()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                got = gpu.weight_gemm(dtype, a, w, bias=bias, act="gelu")
                torch.cuda.synchronize()
            kernels = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
                       and "memcpy" not in e.key.lower() and "memset" not in e.key.lower()]
            assert len(kernels) == 1 and "bias_activation" not in kernels[0], (m, kernels)
            check(got, want, dtype, atol=1.2 * FP32_NOISE * bound + 1e-6, ulps=3, magnitude=magnitude)
    finally:
        gpu.batch_invariant = False
        gpu.set_gemm_choice("auto")


def test_fewer_rows_and_fixed_mode_measure_nothing(gpu, rng):
    n, k = 328, 56
    a = randn(rng, (511, k), "float16")
    w = randn(rng, (k, n), "float16")
    gpu.set_gemm_choice("auto")
    gpu.weight_gemm("float16", a, w)
    assert gpu.weight_gemm_pick("float16", 511, n, k) == ""  # below kTunedMinRows
    gpu.set_gemm_choice("fixed")
    try:
        assert gpu.gemm_choice == "fixed"
        a = randn(rng, (3000, k), "float16")
        got = gpu.weight_gemm("float16", a, w)
        assert gpu.weight_gemm_pick("float16", 3000, n, k) == ""
        assert np.array_equal(got, gpu.weight_gemm_candidate("cublas", "float16", a, w))
    finally:
        gpu.set_gemm_choice("auto")


def test_float32_and_other_activations_have_no_candidates(gpu):
    assert gpu.weight_gemm_candidates("float32", 1024, 64, 64) == []
    assert gpu.weight_gemm_candidates("float16", 0, 64, 64) == []
    assert gpu.weight_gemm_candidates("float16", 1024, 64, 64, act="tanh") == []  # the pooler's


def test_bad_choices_are_refused(gpu, rng):
    with pytest.raises(ValueError, match="'auto' or 'fixed', got 'fastest'"):
        gpu.set_gemm_choice("fastest")
    assert gpu.gemm_choice == "auto"
    a = randn(rng, (64, 32), "float16")
    w = randn(rng, (32, 48), "float16")
    with pytest.raises(ValueError, match="'cutlass:nope' cannot run a float16 \\[64, 32\\] x \\[32, 48\\]"):
        gpu.weight_gemm_candidate("cutlass:nope", "float16", a, w)
    with pytest.raises(ValueError, match="bias must be \\[48\\]"):
        gpu.weight_gemm_candidate("cublas", "float16", a, w, bias=np.zeros(5, np.float32),
                                  act="gelu")
    with pytest.raises(ValueError, match="act 'gelu' without a bias"):
        gpu.weight_gemm_candidate("cublas", "float16", a, w, act="gelu")
    with pytest.raises(ValueError, match="act 'identity' with a bias"):
        gpu.weight_gemm_candidate("cublas", "float16", a, w, bias=np.zeros(48, np.float32))
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        gpu.weight_gemm_candidates("float16", 64, 48, 32, act="swish")
    # The CUTLASS kernels have the erf-GELU epilogue only: no plain or tanh-GELU candidate.
    with pytest.raises(ValueError, match="cannot run"):
        gpu.weight_gemm_candidate("cutlass:coop_128x256", "float16", a, w)
    with pytest.raises(ValueError, match="cannot run .* with bias \\+ gelu_tanh"):
        gpu.weight_gemm_candidate("cutlass:coop_128x256", "float16", a, w,
                                  bias=np.zeros(48, np.float32), act="gelu_tanh")


def test_environment_variable_sets_the_mode_and_is_checked():
    code = "from ftbert import _ops; print(_ops.OpRunner('cuda').gemm_choice)"
    run = lambda value: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], env={**os.environ, "FTBERT_GEMM_CHOICE": value},
        capture_output=True, text=True, timeout=120)
    ok = run("fixed")
    assert ok.returncode == 0 and ok.stdout.strip() == "fixed", ok.stderr
    bad = run("quick")
    assert bad.returncode != 0
    assert "FTBERT_GEMM_CHOICE must be 'auto' or 'fixed', got 'quick'" in bad.stderr
