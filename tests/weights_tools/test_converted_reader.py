"""read_converted on damaged or inconsistent directories: always a FormatError that says what is
wrong, never a crash or a silently wrong tensor."""

from __future__ import annotations

import hashlib
import json
import random
import struct

import pytest
import torch

from tests.weights_tools._converted import rewrite_config, rewrite_weights


@pytest.fixture
def converted(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("cls")
    return wt.convert_checkpoint(src, tmp_path / "out", progress=False)


def test_intact_directory_reads_and_is_converted(wt, converted):
    assert wt.is_converted(converted)
    config, tensors = wt.read_converted(converted)
    assert [(n, tuple(t.shape)) for n, t in tensors.items()] == wt.expected_tensors(config)


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.999])
def test_truncated_weights_file_is_reported_as_corrupted(wt, converted, keep):
    path = converted / "ftbert_weights.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(wt.FormatError, match=r"corrupted or truncated \(sha256 mismatch"):
        wt.read_converted(converted)


def test_flipped_bytes_in_weights_are_reported_as_corrupted(wt, converted):
    path = converted / "ftbert_weights.safetensors"
    data = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    pos = random.randrange(8 + header_len, len(data))  # in tensor data: safetensors alone would not notice
    data[pos] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(wt.FormatError, match="corrupted or truncated"):
        wt.read_converted(converted)


def test_unparsable_weights_with_matching_checksum_is_a_format_error(wt, converted):
    path = converted / "ftbert_weights.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"not a header"
    path.write_bytes(bytes(data))
    rewrite_config(converted, weights_sha256=hashlib.sha256(bytes(data)).hexdigest())
    with pytest.raises(wt.FormatError, match="cannot be read as safetensors"):
        wt.read_converted(converted)


def test_missing_config_is_a_format_error_and_not_converted(wt, converted):
    (converted / "ftbert_config.json").unlink()
    assert not wt.is_converted(converted)
    with pytest.raises(wt.FormatError, match="no ftbert_config.json"):
        wt.read_converted(converted)


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null"])
def test_config_that_is_not_a_json_object_is_a_format_error(wt, converted, text):
    (converted / "ftbert_config.json").write_text(text)
    assert wt.is_converted(converted)  # routed to read_converted, which explains
    with pytest.raises(wt.FormatError, match="ftbert_config.json"):
        wt.read_converted(converted)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        ({"format": "gguf"}, "format is 'gguf'"),
        ({"format_version": 3}, r"format_version 3 is not supported \(this ftbert reads versions 1 and 2"),
        ({"format_version": 2.0}, "format_version 2.0 is not supported"),
        ({"format_version": True}, "format_version True is not supported"),
        ({"hidden_size": 0}, "hidden_size must be a positive integer"),
        ({"num_attention_heads": 5}, "not divisible"),
        ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu'"),
        ({"dtype": "int8"}, "dtype 'int8'"),
        ({"weights_file": "../ftbert_weights.safetensors"}, "weights_file must be a file name"),
        ({"weights_sha256": "abc"}, "weights_sha256 must be 64"),
        ({"max_seq_length": -3}, "max_seq_length must be"),
        ({"has_pooler": "yes"}, "has_pooler must be true or false"),
    ],
)
def test_bad_config_values_are_format_errors(wt, converted, changes, pattern):
    rewrite_config(converted, **changes)
    with pytest.raises(wt.FormatError, match=pattern):
        wt.read_converted(converted)


def test_missing_config_key_is_named(wt, converted):
    path = converted / "ftbert_config.json"
    cfg = json.loads(path.read_text())
    del cfg["layer_norm_eps"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(wt.FormatError, match="missing key.*layer_norm_eps"):
        wt.read_converted(converted)


def test_missing_weights_file_is_a_format_error(wt, converted):
    (converted / "ftbert_weights.safetensors").unlink()
    with pytest.raises(wt.FormatError, match="weights file missing"):
        wt.read_converted(converted)


def test_declared_dtype_must_match_the_stored_one(wt, converted):
    rewrite_config(converted, dtype="bfloat16")
    with pytest.raises(wt.FormatError, match="'embeddings.word' is float32.*declares dtype bfloat16"):
        wt.read_converted(converted)


def test_tensor_of_wrong_shape_is_named(wt, converted):
    rewrite_weights(converted, lambda sd: sd.__setitem__("layers.1.ffn_in_weight", torch.zeros(80, 48)))
    pattern = r"'layers.1.ffn_in_weight' has shape \[80, 48\], expected \[48, 80\]"
    with pytest.raises(wt.FormatError, match=pattern):
        wt.read_converted(converted)


def test_missing_and_unexpected_tensors_are_named(wt, converted):
    rewrite_weights(converted, lambda sd: sd.pop("layers.0.qkv_bias"))
    with pytest.raises(wt.FormatError, match="missing tensor 'layers.0.qkv_bias'"):
        wt.read_converted(converted)
    rewrite_weights(converted, lambda sd: sd.__setitem__("layers.0.qkv_bias", torch.zeros(144)))
    wt.read_converted(converted)
    # A pooler (or head) the config does not declare is as wrong as a missing one.
    rewrite_config(converted, has_pooler=False, head=None)
    with pytest.raises(wt.FormatError, match="unexpected tensor.*classifier.out_bias, classifier.out_weight, "
                                             "pooler.bias, pooler.weight"):
        wt.read_converted(converted)
