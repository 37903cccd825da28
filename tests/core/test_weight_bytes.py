"""Model::weight_bytes (cpp/core/models/*.cpp), read as Encoder.weight_bytes: every uploaded tensor
in the layout the backend keeps it in (the CPU's weight panels pad n to 16 columns, int8 panels
hold a byte per weight), and the buffers an architecture derives from its weights at load."""

import pytest

import ftbert
from ftbert import _C
from ftbert.weights_tools import load_hf_checkpoint
from ftbert.weights_tools.schema import engine_config, iter_tensors
from tests._models import make_model

PANEL = 16  # the CPU GEMM's panel width: a weight's n is padded to it


def _sizes(path):
    """(bytes per element -> (the non-GEMM tensors' elements, the GEMM weights' elements, the
    GEMM weights' padded columns times k)), from the engine's own tensor list."""
    config, _ = load_hf_checkpoint(path)
    plain = gemm = padding = 0
    for t in iter_tensors(engine_config(config)):
        count = 1
        for d in t.shape:
            count *= d
        if t.gemm_weight:
            k, n = t.shape
            gemm += count
            padding += k * (-n % PANEL) + n  # at most one more row of k (bfloat16 pairs)
        else:
            plain += count
    return plain, gemm, padding


@pytest.fixture(scope="module")
def odd_bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert-bytes")
    make_model(path, "bert", "cls", hidden=40, heads=2, layers=2, intermediate=72, seed=3)
    return path


def test_float32_counts_every_tensor_as_the_cpu_keeps_it(odd_bert):
    plain, gemm, padding = _sizes(odd_bert)
    got = ftbert.Encoder.from_pretrained(odd_bert, device="cpu", dtype="float32").weight_bytes
    assert 4 * (plain + gemm) <= got <= 4 * (plain + gemm + padding)
    assert got > 4 * (plain + gemm)  # 40 and 72 columns are padded to 48 and 80


@pytest.mark.skipif(bool(_C.cpu_dtype_unsupported_reason("bfloat16")),
                    reason="bfloat16 needs AVX512-BF16 on this CPU")
def test_bfloat16_counts_two_bytes_an_element(odd_bert):
    plain, gemm, padding = _sizes(odd_bert)
    got = ftbert.Encoder.from_pretrained(odd_bert, device="cpu", dtype="bfloat16").weight_bytes
    assert 2 * (plain + gemm) <= got <= 2 * (plain + gemm + padding)


def test_int8_counts_a_byte_a_weight_plus_its_scales(odd_bert):
    plain, gemm, _ = _sizes(odd_bert)
    f32 = ftbert.Encoder.from_pretrained(odd_bert, device="cpu", dtype="float32").weight_bytes
    got = ftbert.Encoder.from_pretrained(odd_bert, device="cpu", quantization="int8").weight_bytes
    # float32 for the rest, a byte per (padded) weight and per-column floats for the GEMMs
    assert 4 * plain + gemm <= got < f32


def test_derived_buffers_count_too(tmp_path):
    # ModernBERT keeps rotary tables and zero biases it makes at load beside its tensors.
    make_model(tmp_path, "modernbert", "model", hidden=48, heads=3, layers=2, seed=5)
    plain, gemm, padding = _sizes(tmp_path)
    got = ftbert.Encoder.from_pretrained(tmp_path, device="cpu", dtype="float32").weight_bytes
    assert got > 4 * (plain + gemm + padding)
