"""Bad input raises a Python exception that says what is wrong, and the process lives on."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    make_bert(path, hidden=32, heads=2, layers=1, vocab=50, max_pos=16, type_vocab=2)
    return ftbert.Encoder.from_pretrained(path)


def ids_of(shape, high=50):
    return np.random.default_rng(0).integers(0, high, shape)


@pytest.mark.parametrize("to_torch", [False, True], ids=["numpy", "torch"])
@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda: dict(input_ids=ids_of((2, 5)) + 50), ValueError, "out of range for vocab_size 50"),
        (lambda: dict(input_ids=-ids_of((2, 5)) - 1), ValueError, "out of range"),
        (lambda: dict(input_ids=ids_of((2, 17))), ValueError, "exceeds max_position_embeddings 16"),
        (lambda: dict(input_ids=ids_of((2, 5)), attention_mask=np.ones((2, 4), np.int64)), ValueError,
         r"attention_mask has shape \(2, 4\)"),
        (lambda: dict(input_ids=ids_of((2, 5)), token_type_ids=np.zeros((3, 5), np.int64)), ValueError,
         r"token_type_ids has shape \(3, 5\)"),
        (lambda: dict(input_ids=ids_of((2, 5)), token_type_ids=np.full((2, 5), 2)), ValueError,
         "out of range for type_vocab_size 2"),
        (lambda: dict(input_ids=ids_of((2, 5)), attention_mask=np.full((2, 5), 3)), ValueError,
         "must hold only 0 and 1, got 3"),
        (lambda: dict(input_ids=ids_of((2, 5)).astype(np.float32)), TypeError, "must hold integers"),
        (lambda: dict(input_ids=np.zeros((0, 5), np.int64)), ValueError, "empty"),
        (lambda: dict(input_ids=np.zeros((2, 0), np.int64)), ValueError, "empty"),
        (lambda: dict(input_ids=ids_of((5,))), ValueError, "must be 2-D.*add a batch dimension"),
        (lambda: dict(input_ids=ids_of((2, 3, 4))), ValueError, "must be 2-D"),
        (lambda: dict(input_ids=np.array([[1, 2**40]])), ValueError, "int32 range|out of range"),
    ],
    ids=[
        "id-too-large", "id-negative", "too-long", "mask-shape", "types-shape", "type-too-large",
        "mask-values", "float-ids", "empty-batch", "empty-seq", "1-D", "3-D", "int64-overflow",
    ],
)
def test_bad_input_raises_and_process_lives_on(enc, to_torch, make, exc, match):
    kwargs = make()
    if to_torch:
        kwargs = {k: torch.from_numpy(np.asarray(v)) for k, v in kwargs.items()}
    with pytest.raises(exc, match=match):
        enc(**kwargs)
    # The encoder still works after the error.
    out = enc(ids_of((1, 4)))
    assert np.isfinite(out.last_hidden_state).all()


def test_non_array_input_is_a_type_error(enc):
    with pytest.raises(TypeError, match="numpy array or torch tensor"):
        enc("hello")


def test_mixed_kinds_are_rejected(enc):
    with pytest.raises(TypeError, match="torch tensor like input_ids"):
        enc(torch.zeros((1, 3), dtype=torch.long), attention_mask=np.ones((1, 3)))


def test_cpu_backend_rejects_float16(tmp_path):
    make_bert(tmp_path, hidden=32, heads=2, layers=1)
    with pytest.raises(ValueError, match="the CPU backend computes in float32 and bfloat16 only, not float16"):
        ftbert.Encoder.from_pretrained(tmp_path, dtype="float16")


def test_cpu_bfloat16_loads_or_names_what_is_missing(tmp_path):
    # Where it cannot run, before the checkpoint is read: the engine's reason (AVX512-BF16 missing,
    # or left out by FTBERT_CPU_ISA; tests/cpu/test_cpu_isa.py forces both on the ops).
    make_bert(tmp_path, hidden=32, heads=2, layers=1)
    reason = ftbert.encoder._C.cpu_dtype_unsupported_reason("bfloat16")
    if reason:
        assert "AVX512-BF16" in reason
        with pytest.raises(ValueError, match=re.escape(reason)):
            ftbert.Encoder.from_pretrained(tmp_path, device="cpu", dtype="bfloat16")
    else:
        enc = ftbert.Encoder.from_pretrained(tmp_path, device="cpu", dtype="bfloat16")
        assert enc.dtype == "bfloat16"


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU flags from /proc/cpuinfo")
def test_cpu_bf16_detection_agrees_with_the_kernel():
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    want = "avx512_bf16" in flags
    assert ftbert.encoder._C.cpu_has_bf16_instructions() is want


def test_unknown_options_are_named(tmp_path):
    make_bert(tmp_path, hidden=32, heads=2, layers=1)
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        ftbert.Encoder.from_pretrained(tmp_path, dtype="fp8")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        ftbert.Encoder.from_pretrained(tmp_path, device="tpu")
    with pytest.raises(ValueError, match="unknown attention 'fast'"):
        ftbert.Encoder.from_pretrained(tmp_path, attention="fast")


def test_missing_model_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ftbert.Encoder.from_pretrained(tmp_path / "nope")
    with pytest.raises(ValueError, match="neither an ftbert-converted directory"):
        ftbert.Encoder.from_pretrained(tmp_path)


def test_cuda_graphs_must_be_a_bool(enc, tmp_path):
    with pytest.raises(TypeError, match="cuda_graphs must be True or False, got 'yes'"):
        enc.cuda_graphs = "yes"
    assert enc.cuda_graphs is True
    with pytest.raises(TypeError, match="cuda_graphs must be True or False, got 1"):
        ftbert.Encoder.from_pretrained(tmp_path, cuda_graphs=1)
    enc.cuda_graphs = False
    assert enc.cuda_graphs is False
    enc.cuda_graphs = True


def test_input_check_must_be_async_or_sync(enc, tmp_path):
    assert enc.input_check == "async"
    with pytest.raises(ValueError, match=r"input_check must be 'async' or 'sync', got 'lazy'"):
        ftbert.Encoder.from_pretrained(tmp_path, input_check="lazy")
    with pytest.raises(ValueError, match=r"input_check must be 'async' or 'sync', got True"):
        enc.input_check = True
    assert enc.input_check == "async"
    enc.input_check = "sync"
    assert enc.input_check == "sync"
    enc.input_check = "async"
    enc.synchronize()  # nothing pending on the CPU: returns


def test_cpu_attention_auto_takes_the_fused_kernel_and_unfused_can_be_forced(enc):
    assert enc.attention == "auto"
    assert enc.attention_for(1, 8) == "flash"
    enc.attention = "unfused"
    assert enc.attention_for(1, 8) == "unfused"
    enc.attention = "flash"
    assert enc.attention_for(1, 8) == "flash"
    enc.attention = "auto"


@pytest.mark.skipif(ftbert.cuda_available(), reason="a GPU is present")
def test_cuda_without_gpu_or_cuda_build_raises_clearly(tmp_path):
    make_bert(tmp_path, hidden=32, heads=2, layers=1)
    with pytest.raises(RuntimeError, match="no CUDA|not available"):
        ftbert.Encoder.from_pretrained(tmp_path, device="cuda")


def test_float_mask_of_zeros_and_ones_is_accepted_like_transformers(enc):
    ids = ids_of((2, 6))
    mask = np.ones((2, 6), np.int64)
    mask[1, 3:] = 0
    a = enc(ids, mask).last_hidden_state
    b = enc(ids, mask.astype(np.float32)).last_hidden_state
    np.testing.assert_array_equal(a, b)
    # A float mask is a valid dtype for attention_mask, so other float values are a ValueError (as
    # an integer mask holding 2 is), on the host and on the GPU alike.
    with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1, got 0.5"):
        enc(ids, mask * 0.5)


@pytest.mark.parametrize(
    "ids,types,mask,match",
    [
        ([[1, 50, 2]], None, None, "input_ids holds 50, out of range for vocab_size 50"),
        ([[1, -4, 2]], None, None, "input_ids holds -4, out of range for vocab_size 50"),
        ([[1, 2, 3]], [[0, 2, 0]], None, "token_type_ids holds 2, out of range for type_vocab_size 2"),
        ([[1, 2, 3]], None, [[1, 2, 0]], "attention_mask must hold only 0 and 1"),
        ([[1, 2, 3]], None, [[1.0, 0.5, 0.0]], "attention_mask must hold only 0 and 1"),
    ],
)
def test_device_input_check_names_the_bad_value(enc, ids, types, mask, match):
    # The check torch CUDA inputs get (one read back instead of a host copy); its logic is
    # device-independent, so it is exercised here on CPU tensors.
    ids = torch.tensor(ids)
    types = torch.zeros_like(ids) if types is None else torch.tensor(types)
    mask = torch.ones_like(ids) if mask is None else torch.tensor(mask)
    with pytest.raises(ValueError, match=match):
        enc._check_device_values(ids, mask, types)
    enc._check_device_values(torch.ones_like(ids), torch.ones_like(ids).bool(), torch.zeros_like(ids))
