"""Broken and hostile checkpoints: every one is refused with a ValueError subclass that names the file
(and the tensor or config key at fault), before any large allocation, and nothing in a checkpoint
runs as code."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import pickle
import re
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

REPO_ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = "ftbert_weights.safetensors"
CONFIG = "ftbert_config.json"


# ---- helpers ----------------------------------------------------------------------------------


@contextlib.contextmanager
def bounded_memory(extra: int = 1 << 30):
    """Caps the address space at what the process maps now plus `extra`: an allocation sized by a
    hostile file then fails at once (MemoryError) instead of swapping or hanging the run."""
    if not sys.platform.startswith("linux"):
        yield
        return
    import resource

    status = Path("/proc/self/status").read_text()
    mapped = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1)) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + extra
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the cap is Linux-only")
def test_bounded_memory_turns_a_large_allocation_into_an_error():
    with bounded_memory(), pytest.raises((MemoryError, RuntimeError)):
        torch.empty(8 << 30, dtype=torch.uint8).fill_(1)
    torch.empty(64 << 20, dtype=torch.uint8).fill_(1)  # and the cap is lifted afterwards


@contextlib.contextmanager
def raises(error, tmp_path: Path, *patterns: str, names=()):
    """pytest.raises(error), and the message must name every path in `names` and match every
    pattern once the test's temporary directory is cut out of it: that directory is named after the
    test, and its name must not be what satisfies a pattern."""
    with pytest.raises(error) as e:
        yield e
    msg = str(e.value)
    for path in names:
        assert str(path) in msg, f"{path} not named in {msg!r}"
    detail = msg.replace(str(tmp_path), "<tmp>")
    for p in patterns:
        assert re.search(p, detail), f"{p!r} not in {detail!r}"


def split(path: Path) -> tuple[dict, bytes]:
    """(header, data) of a safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join(header: dict | bytes, data: bytes) -> bytes:
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(hb)) + hb + data


def tensors_in_file_order(header: dict) -> list[str]:
    names = [n for n in header if n != "__metadata__"]
    return sorted(names, key=lambda n: header[n]["data_offsets"][0])


def edit_json(path: Path, **changes) -> None:
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def reseal(out: Path) -> None:
    """Records the weights file's current checksum, so the check under test is the one that fires."""
    edit_json(out / CONFIG, weights_sha256=hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest())


def poison(t: torch.Tensor, rng, count: int) -> torch.Tensor:
    """t with `count` distinct random elements set to NaN, +inf or -inf."""
    t = t.clone()
    flat = t.view(-1)
    for i in rng.choice(flat.numel(), size=count, replace=False):
        flat[int(i)] = float(rng.choice([float("nan"), float("inf"), float("-inf")]))
    return t


def pick(rng, items):
    items = list(items)
    return items[int(rng.integers(len(items)))]


def encoder_names(names) -> list[str]:
    return [n for n in names if n.split(".")[0] in ("embeddings", "encoder", "pooler")]


def load_state(path: Path) -> dict:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    return torch.load(str(path), weights_only=True)


def save_state(sd: dict, path: Path) -> None:
    if path.suffix == ".safetensors":
        save_file(sd, str(path))
    else:
        torch.save(sd, str(path))


@pytest.fixture(params=["hf", "converted"])
def target(request, wt, make_checkpoint, tmp_path):
    """A safetensors file that one of the two readers loads: path, load(), its error type, and
    seal() to run after editing the file (a converted directory re-records its checksum)."""
    src, _ = make_checkpoint("model")
    if request.param == "hf":
        return SimpleNamespace(
            path=src / "model.safetensors",
            load=lambda: wt.load_hf_checkpoint(src),
            error=wt.ConversionError,
            seal=lambda: None,
            tmp=tmp_path,
        )
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    return SimpleNamespace(
        path=out / WEIGHTS,
        load=lambda: wt.read_converted(out),
        error=wt.FormatError,
        seal=lambda: reseal(out),
        tmp=tmp_path,
    )


def refuses(target, blob: bytes, *patterns: str) -> None:
    """Writes blob as the target's file; loading must raise its error naming the file and matching
    every pattern."""
    target.path.write_bytes(blob)
    target.seal()
    with bounded_memory(), raises(target.error, target.tmp, *patterns, names=[target.path]):
        target.load()


# ---- 1. truncated files ------------------------------------------------------------------------


def _cut_in(region: str, size: int, header_len: int, rng) -> int:
    start, stop = {
        "length_prefix": (0, 8),
        "json_header": (8, 8 + header_len),
        "header_end": (8 + header_len, 8 + header_len + 1),
        "data": (8 + header_len + 1, size - 1),
        "last_byte": (size - 1, size),
    }[region]
    return int(rng.integers(start, stop))


REGIONS = ["length_prefix", "json_header", "header_end", "data", "last_byte"]


@pytest.mark.parametrize("layout", ["safetensors", "sharded"])
@pytest.mark.parametrize("region", REGIONS)
def test_truncated_hf_safetensors_is_an_error_naming_the_file(wt, make_checkpoint, tmp_path, rng, layout,
                                                               region):
    src, _ = make_checkpoint("model", layout)
    path = pick(rng, sorted(src.glob("*.safetensors")))
    data = path.read_bytes()
    cut = _cut_in(region, len(data), struct.unpack("<Q", data[:8])[0], rng)
    path.write_bytes(data[:cut])
    with bounded_memory(), raises(wt.ConversionError, tmp_path, "truncated", names=[path]):
        wt.load_hf_checkpoint(src)


def test_truncated_pytorch_bin_is_an_error_naming_the_file(wt, make_checkpoint, tmp_path, rng):
    src, _ = make_checkpoint("model", "bin")
    path = src / "pytorch_model.bin"
    data = path.read_bytes()
    for cut in [0, 4, len(data) - 1, *rng.integers(4, len(data), size=6)]:
        path.write_bytes(data[: int(cut)])
        with bounded_memory(), raises(wt.ConversionError, tmp_path, "truncated or damaged", names=[path]):
            wt.load_hf_checkpoint(src)


def test_truncated_converted_weights_are_an_error_naming_the_file(wt, make_checkpoint, tmp_path, rng):
    src, _ = make_checkpoint("cls")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    path = out / WEIGHTS
    data = path.read_bytes()
    path.write_bytes(data[: int(rng.integers(len(data)))])
    with raises(wt.FormatError, tmp_path, "truncated", names=[path]):
        wt.read_converted(out)


# ---- 2. damaged and hostile safetensors headers ------------------------------------------------


def test_tensor_whose_offsets_run_past_the_end_of_the_file_is_named(target, rng):
    header, data = split(target.path)
    name = pick(rng, tensors_in_file_order(header))
    begin = header[name]["data_offsets"][0]
    header[name]["data_offsets"] = [begin, len(data) + 4 * int(rng.integers(1, 1000))]
    refuses(target, join(header, data), re.escape(repr(name)), "past its end")


def test_offsets_inconsistent_with_shape_and_dtype_are_named(target, rng):
    header, data = split(target.path)
    name = pick(rng, tensors_in_file_order(header))
    header[name]["shape"][0] += int(rng.integers(1, 5))
    refuses(target, join(header, data), re.escape(repr(name)), r"needs \d+ bytes, but its data_offsets")


def test_overlapping_tensors_are_named(target, rng):
    header, data = split(target.path)
    names = tensors_in_file_order(header)
    # Two tensors of one shape and dtype, the later pointed at the earlier's bytes: each entry is
    # well-formed on its own, only the pair is wrong.
    by_kind: dict[tuple, list[str]] = {}
    for n in names:
        by_kind.setdefault((header[n]["dtype"], tuple(header[n]["shape"])), []).append(n)
    a, b = sorted(pick(rng, [v for v in by_kind.values() if len(v) > 1])[:2], key=names.index)
    header[b]["data_offsets"] = list(header[a]["data_offsets"])
    refuses(target, join(header, data), "overlap", re.escape(repr(a)), re.escape(repr(b)))


def test_bytes_that_belong_to_no_tensor_are_refused(target, rng):
    header, data = split(target.path)
    refuses(target, join(header, data + bytes(int(rng.integers(1, 64)))), "belong to no tensor")


@pytest.mark.parametrize("prefix", [2**60, 2**64 - 1, 100_000_001])
def test_huge_header_length_prefix_is_refused_without_reading_it(target, prefix):
    data = target.path.read_bytes()
    refuses(target, struct.pack("<Q", prefix) + data[8:], "over the limit")


def test_header_length_past_the_end_of_the_file_is_truncation(target, rng):
    data = target.path.read_bytes()
    n = len(data) - 8 + int(rng.integers(1, 1000))
    refuses(target, struct.pack("<Q", n) + data[8:], "truncated")


@pytest.mark.parametrize(
    "raw, pattern",
    [
        (None, "not valid JSON"),  # random bytes
        (b'{"a": {"dtype": "F32",', "not valid JSON"),
        (b"[1, 2, 3]", "not an object"),
        (b'"header"', "not an object"),
        (b'{"__metadata__": {"format": 1}}', "__metadata__"),
    ],
    ids=["random-bytes", "cut-json", "list", "string", "metadata-not-strings"],
)
def test_header_that_is_not_a_json_object_is_refused(target, rng, raw, pattern):
    _, data = split(target.path)
    if raw is None:
        raw = b"\xff" + rng.integers(0, 256, size=200, dtype="uint8").tobytes()
    refuses(target, join(raw, data), pattern)


def test_tensor_named_twice_in_the_header_is_refused(target, rng):
    header, data = split(target.path)
    name = pick(rng, tensors_in_file_order(header))
    text = json.dumps(header)
    entry = json.dumps({name: header[name]})[1:-1]
    refuses(target, join((text[:-1] + ", " + entry + "}").encode(), data), "twice", re.escape(repr(name)))


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda e: e.update(dtype="XX"), "unknown dtype 'XX'"),
        (lambda e: e.update(dtype=7), "unknown dtype 7"),
        (lambda e: e["shape"].__setitem__(0, -e["shape"][0]), "non-negative integers"),
        (lambda e: e["shape"].__setitem__(0, float(e["shape"][0])), "non-negative integers"),
        (lambda e: e.update(shape=True), "non-negative integers"),
        (lambda e: e.update(data_offsets=e["data_offsets"][::-1]), "begin <= end"),
        (lambda e: e.update(data_offsets=[0]), r"\[begin, end\]"),
        (lambda e: e.pop("data_offsets"), "needs dtype, shape and data_offsets"),
    ],
    ids=["unknown-dtype", "dtype-not-string", "negative-dim", "float-dim", "bool-shape", "reversed",
         "one-offset", "no-offsets"],
)
def test_malformed_header_entry_is_named(target, rng, edit, pattern):
    header, data = split(target.path)
    name = pick(rng, tensors_in_file_order(header))
    if header[name]["data_offsets"][0] == header[name]["data_offsets"][1]:
        pytest.skip("an empty tensor")  # reversing its offsets changes nothing
    edit(header[name])
    refuses(target, join(header, data), pattern, re.escape(repr(name)))


def test_shape_of_astronomical_size_fails_fast(target, rng):
    header, data = split(target.path)
    name = pick(rng, tensors_in_file_order(header))
    header[name]["shape"] = [2**62 + int(rng.integers(1000))] * 60_000
    start = time.perf_counter()
    refuses(target, join(header, data), re.escape(repr(name)), "needs more than")
    # Multiplying the dimensions out takes tens of seconds; stopping at the file size takes none.
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float8_e4m3fn])
def test_hf_encoder_weight_of_a_dtype_the_engine_does_not_take_is_named(wt, make_checkpoint, tmp_path, rng,
                                                                        dtype):
    src, _ = make_checkpoint("model")
    path = src / "model.safetensors"
    sd = load_file(str(path))
    name = pick(rng, encoder_names(sd))
    sd[name] = sd[name].to(dtype)
    save_file(sd, str(path))
    short = str(dtype).removeprefix("torch.")
    pattern = f"{re.escape(repr(name))} has dtype {short}, which the engine does not take"
    with raises(wt.ConversionError, tmp_path, pattern, names=[path]):
        wt.load_hf_checkpoint(src)


def test_tensor_outside_the_encoder_may_have_any_dtype(wt, make_checkpoint, rng):
    src, _ = make_checkpoint("cls")
    path = src / "model.safetensors"
    sd = load_file(str(path))
    sd["classifier.label_ids"] = torch.from_numpy(rng.integers(0, 9, size=7))
    save_file(sd, str(path))
    config, tensors = wt.load_hf_checkpoint(src)
    assert [(n, tuple(t.shape)) for n, t in tensors.items()] == wt.expected_tensors(config)


def test_converted_tensor_of_another_dtype_than_declared_is_named(wt, make_checkpoint, tmp_path, rng):
    src, _ = make_checkpoint("model")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    sd = load_file(str(out / WEIGHTS))
    name = pick(rng, sd)
    sd[name] = sd[name].to(torch.int32)
    save_file(sd, str(out / WEIGHTS))
    reseal(out)
    with raises(wt.FormatError, tmp_path, f"{re.escape(repr(name))} is int32, but {CONFIG} declares"):
        wt.read_converted(out)


def test_read_header_accepts_no_file_that_safetensors_refuses(wt, make_checkpoint, tmp_path, rng):
    """Random damage to the length prefix and header: read_header either refuses the file with the
    given error or returns exactly what safetensors then reads."""
    read_header = importlib.import_module(wt.__name__ + ".safetensors_header").read_header
    src, _ = make_checkpoint("model")
    original = (src / "model.safetensors").read_bytes()
    header_end = 8 + struct.unpack("<Q", original[:8])[0]
    path = tmp_path / "fuzz.safetensors"
    accepted = 0
    for _ in range(300):
        blob = bytearray(original)
        for _ in range(int(rng.integers(1, 4))):
            blob[int(rng.integers(header_end))] = int(rng.integers(256))
        if rng.random() < 0.2:
            blob = blob[: int(rng.integers(len(blob)))]
        path.write_bytes(bytes(blob))
        try:
            info = read_header(path, wt.ConversionError)
        except wt.ConversionError as e:
            assert str(path) in str(e)
            continue
        accepted += 1
        with safe_open(str(path), framework="pt") as f:
            assert sorted(f.keys()) == sorted(info)
            for name, t in info.items():
                got = f.get_tensor(name)
                assert (str(got.dtype).removeprefix("torch."), tuple(got.shape)) == (t.dtype, t.shape)
    assert accepted < 300  # the damage was seen at all


# ---- 3. NaN and infinity in weights ------------------------------------------------------------


@pytest.mark.parametrize("layout", ["safetensors", "bin"])
def test_non_finite_hf_weight_is_named_with_its_count(wt, make_checkpoint, tmp_path, rng, layout):
    src, _ = make_checkpoint("model", layout)
    path = src / ("model.safetensors" if layout == "safetensors" else "pytorch_model.bin")
    sd = load_state(path)
    name = pick(rng, encoder_names(sd))
    count = int(rng.integers(1, min(6, sd[name].numel()) + 1))
    sd[name] = poison(sd[name], rng, count)
    save_state(sd, path)
    pattern = re.escape(f"{name!r} holds {count} NaN or infinite value(s)")
    with raises(wt.ConversionError, tmp_path, pattern, names=[path]):
        wt.load_hf_checkpoint(src)


def test_non_finite_converted_weight_is_named_with_its_count(wt, make_checkpoint, tmp_path, rng):
    src, _ = make_checkpoint("cls")
    out = wt.convert_checkpoint(src, tmp_path / "out", dtype="bfloat16", progress=False)
    sd = load_file(str(out / WEIGHTS))
    name = pick(rng, sd)
    count = int(rng.integers(1, min(6, sd[name].numel()) + 1))
    sd[name] = poison(sd[name], rng, count)
    save_file(sd, str(out / WEIGHTS))
    reseal(out)
    pattern = re.escape(f"{name!r} holds {count} NaN or infinite value(s)")
    with raises(wt.FormatError, tmp_path, pattern, names=[out / WEIGHTS]):
        wt.read_converted(out)


# ---- 4. impossible sizes in the config ---------------------------------------------------------

NAN, INF = float("nan"), float("inf")

BAD_CONFIG_VALUES = [
    ("hidden_size", 0, "hidden_size must be a positive integer"),
    ("num_hidden_layers", -1, "num_hidden_layers must be a positive integer"),
    ("num_attention_heads", 7, "not divisible by num_attention_heads 7"),
    ("type_vocab_size", 2**31, r"type_vocab_size must be a positive integer \(at most 2147483647\)"),
    ("hidden_size", 10**30, "hidden_size must be a positive integer"),
    ("hidden_size", 48.0, r"hidden_size must be a positive integer.*got 48\.0"),
    ("num_hidden_layers", True, "num_hidden_layers must be a positive integer.*got True"),
    ("vocab_size", "101", "vocab_size must be a positive integer.*got '101'"),
    ("intermediate_size", None, "intermediate_size must be a positive integer.*got None"),
    ("layer_norm_eps", 0, "layer_norm_eps must be a positive number"),
    ("layer_norm_eps", -1e-12, "layer_norm_eps must be a positive number"),
    ("layer_norm_eps", NAN, "layer_norm_eps must be a positive number"),
    ("layer_norm_eps", INF, "layer_norm_eps must be a positive number"),
    ("layer_norm_eps", 1e-60, "layer_norm_eps must be a positive number float32 can hold"),
    ("layer_norm_eps", "1e-12", "layer_norm_eps must be a positive number"),
]
# Sizes that pass every per-key check but that the weight files could never hold.
ABSURD_SIZES = [
    ("vocab_size", 10**9, r"embeddings\.word \[1000000000, 48\]"),
    ("max_position_embeddings", 10**9, r"embeddings\.position \[1000000000, 48\]"),
    ("intermediate_size", 10**9, "layers of"),
    ("num_hidden_layers", 10**7, "10000000 layers of"),
]


def _ids(cases):
    return [f"{k}={v!r}"[:40] for k, v, _ in cases]


@pytest.mark.parametrize("key, value, pattern", BAD_CONFIG_VALUES, ids=_ids(BAD_CONFIG_VALUES))
def test_impossible_hf_config_value_is_named(wt, make_checkpoint, tmp_path, key, value, pattern):
    src, _ = make_checkpoint("model")
    edit_json(src / "config.json", **{key: value})
    with bounded_memory(), raises(wt.ConversionError, tmp_path, pattern, names=[src / "config.json"]):
        wt.load_hf_checkpoint(src)


@pytest.mark.parametrize("key, value, pattern", BAD_CONFIG_VALUES[:5] + BAD_CONFIG_VALUES[9:12],
                         ids=_ids(BAD_CONFIG_VALUES[:5] + BAD_CONFIG_VALUES[9:12]))
def test_impossible_converted_config_value_is_named(wt, make_checkpoint, tmp_path, key, value, pattern):
    src, _ = make_checkpoint("model")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    edit_json(out / CONFIG, **{key: value})
    with bounded_memory(), raises(wt.FormatError, tmp_path, pattern, names=[out / CONFIG]):
        wt.read_converted(out)


@pytest.mark.parametrize("key, value, largest", ABSURD_SIZES, ids=_ids(ABSURD_SIZES))
def test_config_sizes_the_weight_files_cannot_hold_fail_before_allocating(
    wt, make_checkpoint, tmp_path, key, value, largest
):
    src, _ = make_checkpoint("model")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    edit_json(src / "config.json", **{key: value})
    edit_json(out / CONFIG, **{key: value})
    for load, error, where in [
        (lambda: wt.load_hf_checkpoint(src), wt.ConversionError, src / "config.json"),
        (lambda: wt.read_converted(out), wt.FormatError, out / CONFIG),
    ]:
        patterns = (f"{key}={value}", largest, "a size in the config is wrong")
        with bounded_memory(), raises(error, tmp_path, *patterns, names=[where]):
            load()


def test_config_shapes_are_checked_before_any_tensor_is_read(wt, hf, make_checkpoint, tmp_path, rng):
    """A NaN in the first tensor read and a size mismatch in a later one: the mismatch is reported,
    so every shape was checked (from the header) before the first tensor's data was read."""
    layout = pick(rng, ["safetensors", "bin"])
    src, _ = make_checkpoint("model", layout)
    path = src / ("model.safetensors" if layout == "safetensors" else "pytorch_model.bin")
    sd = load_state(path)
    first = hf.hf_name("embeddings.word")
    sd[first] = poison(sd[first], rng, 1)
    save_state(sd, path)
    edit_json(src / "config.json", intermediate_size=81)
    later = re.escape(hf.hf_name("layers.0.ffn_in_weight"))
    pattern = rf"'{later}' has shape \[80, 48\].*implies \[81, 48\]"
    with raises(wt.ConversionError, tmp_path, pattern, names=[path]) as e:
        wt.load_hf_checkpoint(src)
    assert "NaN" not in str(e.value)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json", CONFIG])
def test_oversized_json_file_is_refused_without_reading_it(wt, make_checkpoint, tmp_path, name):
    src, _ = make_checkpoint("model", "sharded")
    if name == CONFIG:
        src = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    with open(src / name, "r+b") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB of zeros after the JSON, no disk used
    load = wt.read_converted if name == CONFIG else wt.load_hf_checkpoint
    error = wt.FormatError if name == CONFIG else wt.ConversionError
    with bounded_memory(), raises(error, tmp_path, "too large for a JSON file", names=[src / name]):
        load(src)


def test_parameter_count_agrees_with_expected_tensors(wt, rng):
    parameter_count = importlib.import_module(wt.__name__ + ".schema").parameter_count
    for _ in range(20):
        heads = int(rng.integers(1, 5))
        config = {
            "vocab_size": int(rng.integers(1, 500)),
            "hidden_size": heads * int(rng.integers(1, 20)),
            "num_hidden_layers": int(rng.integers(1, 5)),
            "num_attention_heads": heads,
            "intermediate_size": int(rng.integers(1, 100)),
            "max_position_embeddings": int(rng.integers(1, 100)),
            "type_vocab_size": int(rng.integers(1, 4)),
            "layer_norm_eps": 1e-12,
            "hidden_act": "gelu",
            "has_pooler": bool(rng.integers(2)),
        }
        want = sum(int(torch.Size(s).numel()) for _, s in wt.expected_tensors(config))
        assert parameter_count(config)[0] == want


# ---- 5. checksum -------------------------------------------------------------------------------


def test_checksum_mismatch_names_the_weights_file(wt, make_checkpoint, tmp_path, rng):
    src, _ = make_checkpoint("model")
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    path = out / WEIGHTS
    data = bytearray(path.read_bytes())
    data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    path.write_bytes(bytes(data))
    with raises(wt.FormatError, tmp_path, "corrupted or truncated \\(sha256 mismatch", names=[path]):
        wt.read_converted(out)


# ---- 6. nothing in a checkpoint runs as code ---------------------------------------------------


class _RunsCode:
    """Unpickling this calls exec(), which writes the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


@pytest.mark.parametrize("form", ["torch_save", "plain_pickle", "one_shard"])
def test_pickle_that_would_run_code_is_refused_and_runs_nothing(wt, make_checkpoint, tmp_path, form):
    src, _ = make_checkpoint("model", "bin_sharded" if form == "one_shard" else "bin")
    marker = tmp_path / "marker"
    path = sorted(src.glob("pytorch_model*.bin"))[-1]
    sd = torch.load(str(path), weights_only=True)
    sd[next(iter(sd))] = _RunsCode(marker)
    if form == "plain_pickle":
        path.write_bytes(pickle.dumps(sd, protocol=2))  # the protocol torch.save writes
    else:
        torch.save(sd, str(path))
    with raises(wt.ConversionError, tmp_path, "refused: torch's weights-only loader", names=[path]):
        wt.load_hf_checkpoint(src)
    assert not marker.exists()


def _add_custom_code(src: Path, marker: Path) -> None:
    """A config.json that asks for the checkpoint's own Python code, as trust_remote_code models do."""
    (src / "custom_bert.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    edit_json(
        src / "config.json",
        auto_map={"AutoConfig": "custom_bert.Config", "AutoModel": "custom_bert.Model"},
        trust_remote_code=True,
    )


def test_custom_code_named_by_config_is_ignored(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model")
    marker = tmp_path / "marker"
    _add_custom_code(src, marker)
    config, tensors = wt.load_hf_checkpoint(src)
    wt.read_converted(wt.convert_checkpoint(src, tmp_path / "out", progress=False))
    assert tensors and not marker.exists()


def test_tokenizer_code_named_by_the_checkpoint_never_runs(ftbert, make_checkpoint, tmp_path, monkeypatch):
    # A converted directory whose tokenizer files ask for the checkpoint's own code: loading the
    # tokenizer must refuse, not run it (nor ask on stdin, which a "y" would answer).
    src, _ = make_checkpoint("model")
    out = ftbert.convert_checkpoint(src, tmp_path / "out", progress=False)
    marker = tmp_path / "marker"
    (out / "custom_tok.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (out / "config.json").write_text(json.dumps({"model_type": "custom-tok", "auto_map": {
        "AutoTokenizer": ["custom_tok.Tokenizer", None]}}))
    (out / "tokenizer_config.json").write_text(json.dumps({"auto_map": {
        "AutoTokenizer": ["custom_tok.Tokenizer", None]}}))
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))
    enc = ftbert.Encoder.from_pretrained(out)
    with pytest.raises(ValueError, match="tokenizer"):
        enc.tokenizer
    assert not marker.exists()


def test_package_source_never_trusts_remote_code_or_full_unpickling():
    sources = [*(REPO_ROOT / "weights_tools").glob("*.py"), *(REPO_ROOT / "python/ftbert").rglob("*.py")]
    assert sources
    for f in sources:
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"trust_remote_code\s*=\s*True", text), f
        assert not re.search(r"weights_only\s*=\s*False", text), f
        assert "pickle.load" not in text, f


# ---- 7. end to end through ftbert.Encoder.from_pretrained --------------------------------------


@pytest.fixture
def ftbert():
    return pytest.importorskip("ftbert")


def test_encoder_loads_the_intact_checkpoint(ftbert, make_checkpoint):
    src, _ = make_checkpoint("model")
    assert ftbert.Encoder.from_pretrained(src).hidden_size == 48


def test_encoder_reports_a_truncated_checkpoint_as_a_value_error_naming_the_file(ftbert, make_checkpoint,
                                                                                 tmp_path, rng):
    src, _ = make_checkpoint("model")
    path = src / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: int(rng.integers(len(data)))])
    with raises(ValueError, tmp_path, "cannot be read as safetensors", names=[path]) as e:
        ftbert.Encoder.from_pretrained(src)
    assert isinstance(e.value, ftbert.ConversionError)


def test_encoder_reports_an_altered_converted_directory_naming_the_file(ftbert, make_checkpoint, tmp_path,
                                                                        rng):
    src, _ = make_checkpoint("model")
    out = ftbert.convert_checkpoint(src, tmp_path / "out", progress=False)
    path = out / WEIGHTS
    data = bytearray(path.read_bytes())
    data[int(rng.integers(len(data)))] ^= 0x10
    path.write_bytes(bytes(data))
    with raises(ValueError, tmp_path, "sha256 mismatch", names=[path]) as e:
        ftbert.Encoder.from_pretrained(out)
    assert isinstance(e.value, ftbert.FormatError)


def test_encoder_refuses_code_in_a_pickle_and_runs_none(ftbert, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model", "bin")
    marker = tmp_path / "marker"
    path = src / "pytorch_model.bin"
    sd = torch.load(str(path), weights_only=True)
    sd["extra"] = _RunsCode(marker)
    torch.save(sd, str(path))
    with raises(ftbert.ConversionError, tmp_path, "refused", names=[path]):
        ftbert.Encoder.from_pretrained(src)
    assert not marker.exists()


def test_encoder_ignores_custom_code_named_by_config(ftbert, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model")
    marker = tmp_path / "marker"
    _add_custom_code(src, marker)
    ftbert.Encoder.from_pretrained(src)
    assert not marker.exists()


def test_encoder_refuses_non_finite_weights_and_absurd_sizes(ftbert, make_checkpoint, tmp_path, rng):
    src, _ = make_checkpoint("model")
    path = src / "model.safetensors"
    sd = load_file(str(path))
    name = pick(rng, encoder_names(sd))
    sd[name] = poison(sd[name], rng, 1)
    save_file(sd, str(path))
    with raises(ftbert.ConversionError, tmp_path, f"{re.escape(repr(name))} holds 1 NaN or infinite",
                names=[path]):
        ftbert.Encoder.from_pretrained(src)
    edit_json(src / "config.json", vocab_size=10**9)
    with bounded_memory(), raises(ftbert.ConversionError, tmp_path, "vocab_size=1000000000",
                                  names=[src / "config.json"]):
        ftbert.Encoder.from_pretrained(src)
