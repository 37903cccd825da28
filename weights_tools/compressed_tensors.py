"""FP8 checkpoints in the compressed-tensors format (what llm-compressor writes, e.g. its FP8_DYNAMIC
scheme), read as float32.

config.json's `quantization_config` says how the weights were quantized: `quant_method`
"compressed-tensors", `format` "float-quantized" (the top level's, or a config group's own), and
`config_groups` whose `weights` are 8-bit float, symmetric, static, per output channel ("channel")
or per tensor ("tensor"). Each quantized Linear X then stores `X.weight` as F8_E4M3 [out, in] and
`X.weight_scale` in a float dtype, [out, 1] per channel or [1] per tensor; its value is
weight * weight_scale. This module checks that config (parse_quantization_config) and pairs each
such weight with its scale from the file headers (pair_scales); hf.WeightFiles then hands out
the products. Anything else compressed-tensors can describe (int or 4-bit weights, groups or blocks,
static activation scales, output or KV-cache quantization, sparsity, transforms) is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .fp8 import FP8_DTYPE
from .layout import fmt_shape

QUANTIZATION_CONFIG = "quantization_config"
QUANT_METHOD = "compressed-tensors"
FLOAT_QUANTIZED = "float-quantized"
# The weight strategies read, and the scale shape each implies for a weight of `rows` outputs.
STRATEGIES = ("channel", "tensor")
WEIGHT_SCALE = "weight_scale"  # X.weight's scale is X.weight_scale
WEIGHT_ZERO_POINT = "weight_zero_point"  # a symmetric scheme's zero point: zeros where present
_SCALE_DTYPES = ("float16", "bfloat16", "float32", "float64")
_FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


@dataclass(frozen=True)
class Fp8Scheme:
    """What a checked quantization_config allows: the weight strategies its groups use."""

    strategies: frozenset = field(default_factory=frozenset)


@dataclass(frozen=True)
class Fp8Pair:
    """An F8_E4M3 weight, its scale and (where stored) its zero point, by checkpoint name."""

    weight: str
    scale: str
    zero_point: str | None


def is_float8(dtype: str) -> bool:
    return dtype in _FLOAT8_DTYPES


def parse_quantization_config(raw: dict, path: Path, error: Callable[[str], Exception]) -> Fp8Scheme | None:
    """config.json's quantization_config, checked: None where there is none, the scheme where it is
    a compressed-tensors FP8 one ftbert reads exactly; refused by name otherwise."""
    qc = raw.get(QUANTIZATION_CONFIG)
    if qc is None:
        return None
    where = f"{path}: {QUANTIZATION_CONFIG}"
    if not isinstance(qc, dict):
        raise error(f"{where} must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise error(f"{where}.quant_method {method!r} is not supported (ftbert reads quantized checkpoints "
                    f"only in the {QUANT_METHOD!r} format, with FP8 weights: {FLOAT_QUANTIZED!r})")
    for key, what in (("kv_cache_scheme", "KV-cache quantization"), ("transform_config", "weight transforms"),
                      ("sparsity_config", "sparse compression")):
        value = qc.get(key)
        if key == "sparsity_config" and isinstance(value, dict) and value.get("format") in (None, "dense"):
            value = None  # a dense "sparsity" record compresses nothing
        if value:
            raise error(f"{where}.{key} is set ({what}), which ftbert does not apply; only FP8 weights "
                        "with per-channel or per-tensor scales are read")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise error(f"{where}.config_groups must be a non-empty object, got {groups!r}")
    top_format = qc.get("format")
    strategies = set()
    for name, group in groups.items():
        g = f"{where}.config_groups.{name}"
        if not isinstance(group, dict):
            raise error(f"{g} must be an object (a preset name's list of targets is not read), got {group!r}")
        fmt = group.get("format") or top_format
        if fmt != FLOAT_QUANTIZED:
            raise error(f"{g}: format {fmt!r} is not supported (ftbert reads {FLOAT_QUANTIZED!r}: FP8 "
                        "weights with their scales)")
        strategies.add(_check_weights(group.get("weights"), f"{g}.weights", error))
        _check_input_activations(group.get("input_activations"), f"{g}.input_activations", error)
        if group.get("output_activations") is not None:
            raise error(f"{g}.output_activations is set (output quantization), which ftbert does not apply")
    return Fp8Scheme(frozenset(strategies))


def _check_weights(w, where: str, error: Callable[[str], Exception]) -> str:
    """A group's weight arguments: 8-bit float, symmetric, static, channel or tensor; its strategy."""
    if not isinstance(w, dict):
        raise error(f"{where} must be an object (a group that quantizes no weights is not read), got {w!r}")
    num_bits, kind = w.get("num_bits", 8), w.get("type", "int")
    if kind != "float" or num_bits != 8:
        raise error(f"{where}: {num_bits!r}-bit {kind!r} weights are not supported (ftbert reads 8-bit "
                    "'float' weights: float8 e4m3)")
    if w.get("symmetric", True) is not True:
        raise error(f"{where}: asymmetric weights (symmetric false) are not supported (FP8 scales are symmetric)")
    if w.get("dynamic", False) is not False:
        raise error(f"{where}: dynamic {w.get('dynamic')!r} weights are not supported (ftbert reads static "
                    "weight scales stored with the weights)")
    if w.get("actorder") not in (None, False):
        raise error(f"{where}: actorder {w.get('actorder')!r} is not supported")
    strategy, group_size = w.get("strategy"), w.get("group_size")
    if strategy is None:  # compressed-tensors infers it from group_size
        strategy = {None: "tensor", -1: "channel"}.get(group_size, "group")
    if strategy not in STRATEGIES or group_size not in (None, -1) or w.get("block_structure") is not None:
        shown = strategy if group_size in (None, -1) else f"{strategy} (group_size {group_size})"
        raise error(f"{where}: strategy {shown!r} is not supported (ftbert reads per-output-channel "
                    "'channel' or per-tensor 'tensor' scales; group and block scales are not read)")
    return strategy


def _check_input_activations(a, where: str, error: Callable[[str], Exception]) -> None:
    """None (weights only) or dynamic: computed while the model runs, so nothing in the checkpoint
    (ftbert quantizes activations itself, per token, only under quantization "fp8")."""
    if a is None:
        return
    if not isinstance(a, dict):
        raise error(f"{where} must be an object or null, got {a!r}")
    if a.get("dynamic") is not True:
        raise error(f"{where}: static activation scales (dynamic {a.get('dynamic', False)!r}) are not supported: "
                    "the model was calibrated to input_scale tensors that ftbert does not apply "
                    "(it reads weights-only or dynamic-activation schemes such as FP8_DYNAMIC)")


def pair_scales(meta: dict[str, tuple[str, tuple[int, ...]]], scheme: Fp8Scheme, where: Callable[[str], Path],
                error: Callable[[str], Exception]) -> dict[str, Fp8Pair]:
    """{weight name: its Fp8Pair} for every F8_E4M3 `X.weight` that has `X.weight_scale`, from the
    headers (meta: name -> (dtype, shape)), each scale's dtype and shape checked against the scheme's
    strategies. An F8 tensor without a scale is left out here: the reader refuses it if it uses it."""
    pairs = {}
    for name, (dtype, shape) in meta.items():
        if dtype != FP8_DTYPE or not name.endswith("weight"):
            continue
        base = name[: -len("weight")]
        scale = base + WEIGHT_SCALE
        if scale not in meta:
            continue
        if len(shape) != 2:
            raise error(f"{where(name)}: tensor {name!r} is FP8 of shape {fmt_shape(shape)}; an FP8 weight "
                        "must be a matrix [out, in]")
        s_dtype, s_shape = meta[scale]
        if s_dtype not in _SCALE_DTYPES:
            raise error(f"{where(scale)}: tensor {scale!r} has dtype {s_dtype}; a weight scale must be one of "
                        f"{', '.join(_SCALE_DTYPES)}")
        expected = _scale_shapes(shape[0], scheme.strategies)
        if tuple(s_shape) not in expected:
            shown = " or ".join(f"{fmt_shape(s)} ({k})" for s, k in expected.items())
            raise error(f"{where(scale)}: tensor {scale!r} has shape {fmt_shape(s_shape)}, but {name!r} of "
                        f"{fmt_shape(shape)} under strategy {_choices(sorted(scheme.strategies))} needs {shown}")
        zp = base + WEIGHT_ZERO_POINT
        if zp in meta:
            z_dtype, z_shape = meta[zp]
            if tuple(z_shape) != tuple(s_shape) or is_float8(z_dtype):
                raise error(f"{where(zp)}: tensor {zp!r} is {z_dtype} {fmt_shape(z_shape)}; a symmetric "
                            f"scheme's zero point must be zeros shaped as its scale {fmt_shape(s_shape)}")
        pairs[name] = Fp8Pair(name, scale, zp if zp in meta else None)
    return pairs


def _scale_shapes(rows: int, strategies) -> dict[tuple[int, ...], str]:
    """The scale shapes compressed-tensors writes for a weight of `rows` outputs, by strategy."""
    shapes: dict[tuple[int, ...], str] = {}
    if "channel" in strategies:
        shapes[(rows, 1)] = "channel"
    if "tensor" in strategies:
        shapes.setdefault((1,), "tensor")
        shapes.setdefault((), "tensor")
    return shapes


def _choices(values) -> str:
    return " or ".join(repr(v) for v in values)
