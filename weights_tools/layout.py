"""The engine's side of the format: file names, the config keys, and the tensors a config implies.

Kept apart from the HuggingFace reader so that the loader (read_converted) and the converter agree on
one definition. The tensors a config implies are the engine's (schema.py).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
from pathlib import Path
from typing import Any, Callable

import torch

from .._native import _C

FORMAT_NAME = "ftbert"

# The engine config's record of FP8 weights in the checkpoint that was read: null, or FP8 (its layer
# weights were e4m3 with scales, handed out as float32 q * s). An optional key of ftbert_config.json,
# written after "dtype" by FP8 conversions only; reader.read_config fills in null where it is absent
# (weights_tools/fp8.py: which tensors, and how).
CHECKPOINT_QUANTIZATION = "checkpoint_quantization"
FP8 = "fp8"
QUANTIZATIONS = (FP8,)

FORMAT_VERSION = 2  # what the converter writes
READABLE_VERSIONS = (1, 2)  # what read_converted reads (version 1: reader._upgrade_version_1)
CONFIG_FILE = "ftbert_config.json"
WEIGHTS_FILE = "ftbert_weights.safetensors"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

# HF `hidden_act` values the engine implements (see cpp/include/ftbert/config.h).
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# Position-id schemes, the engine config's "position_ids". ABSOLUTE: token t sits at position t,
# padding or not (BERT). PADDING_OFFSET: a token whose id is not pad_token_id sits at
# pad_token_id + (the number of such tokens up to and including it), a pad token at pad_token_id
# (RoBERTa and its descendants; transformers' create_position_ids_from_input_ids, computed from
# input_ids, not from the attention mask).
ABSOLUTE = "absolute"
PADDING_OFFSET = "padding_offset"
POSITION_SCHEMES = (ABSOLUTE, PADDING_OFFSET)

# The engine config's keys as the engine reads them (cpp/core/config.cpp), in file order: (object ("" at
# the top level, else the object key holding it), name, type, required, written in the file). The key
# lists below are taken from it.
ENGINE_KEYS: tuple[tuple[str, str, str, bool, bool], ...] = tuple(map(tuple, _C.engine_config_keys()))


def _engine_keys(obj: str = "", type_: str | None = None, required: bool | None = None) -> tuple[str, ...]:
    return tuple(name for o, name, t, req, in_file in ENGINE_KEYS
                 if o == obj and in_file and type_ in (None, t) and required in (None, req))


# Hyper-parameters copied from config.json; all must be positive integers.
INT_KEYS = _engine_keys(type_="int", required=True)

# The width of the embedding tables: hidden_size, except in a family with a projection (ELECTRA's
# embedding_size), whose tables are narrower (or wider) and projected to hidden_size before the first
# layer. A positive integer like INT_KEYS, but not a config.json key of every family: the family table
# says where it comes from (families.Projection). Version-2 files written before it existed lack it
# and mean hidden_size (reader.read_config fills it in).
EMBEDDING_SIZE = "embedding_size"

# Rows of a relative position bias table shared by every layer's attention (MPNet), 0 for a family
# without one. A table has at least RELATIVE_BUCKETS_LOOKED_UP rows: transformers' MPNet looks up
# that many buckets (relative_position_bucket's default) whatever the table's size. Files written
# before the key existed have no such table (reader.read_config fills in 0).
RELATIVE_BUCKETS = "relative_attention_num_buckets"
RELATIVE_BUCKETS_LOOKED_UP = 32

# A layer with rotary positions, where BERT's one with a position table does not apply: null, or an
# object with
#   rotary_theta: the rotary positions' theta of the global-attention layers (a positive number);
#   local_rotary_theta: that of the sliding-window layers;
#   local_window: a sliding-window layer attends keys within this distance (|j - i| <= it; 0: no
#     sliding-window layers);
#   global_every: layer i attends globally when i % global_every == 0 (a positive integer);
#   gated_mlp: the FFN-in gives two halves, act(first) * second (true), or is BERT's act(x W + b);
#   rotary_scale: the rope's frequencies are divided by it (1: none; linear and fixed-NTK rope
#     scaling, a positive number);
#   rotary_dynamic_factor, rotary_original_positions: dynamic NTK rope scaling (transformers'
#     rope_type "dynamic"): a sequence longer than the original positions turns with a theta grown
#     with its length by the factor (0 and 0: none; else a positive number and a positive integer).
# The family's architecture unit says the rest: ModernBERT's is pre-LayerNorm without biases or
# LayerNorm betas and with a final norm; rotary_bert's is BERT's post-LayerNorm layer (the tensor
# list is the bound module's). Files written before the key existed hold BERT's layer
# (reader.read_config fills in null); layers written before gated_mlp existed are gated, and those
# before rotary_scale or rotary_dynamic_factor unscaled.
LAYER = "layer"
LAYER_KEYS = _engine_keys(LAYER)

# DeBERTa's disentangled attention: null, or an object with
#   position_buckets: distances past position_buckets / 2 share log buckets (<= 0: none, each
#     distance its own relative embedding up to max_relative_positions);
#   max_relative_positions: the buckets' reach (a positive integer);
#   c2p, p2c: whether the content->position and position->content terms are added;
#   position_table: whether the absolute position table is added to the embeddings too
#     (position_biased_input);
#   norm: whether the relative embeddings are LayerNorm'd (norm_rel_ebd "layer_norm").
# Files written before the key existed have none (reader.read_config fills in null).
DISENTANGLED = "disentangled"
DISENTANGLED_KEYS = _engine_keys(DISENTANGLED)

# The task head above the encoder: null, or an object with these keys (check_head):
#   kind: SEQUENCE_CLASSIFICATION (logits [B, num_labels] from token 0) or TOKEN_CLASSIFICATION
#     (logits [B, S, num_labels] from every token);
#   num_labels: a positive integer;
#   input: where a sequence head reads: "pooler" (the pooler output: BERT), "first_token" (token 0
#     through the head's own dense and activation: the others) or "mean" (the mean of the
#     sequence's tokens through that dense: ModernBERT's classifier_pooling "mean") or "late_mean"
#     (that dense and activation on every token, then their mean: EuroBERT's "late"); "tokens" for a
#     token head;
#   activation: that own dense's activation (HEAD_ACTIVATIONS), null otherwise; a token head with
#     an activation has a dense of its own too, on every token (ModernBERT's);
#   norm: true where a bias-free LayerNorm follows that activation (ModernBERT's head), else false;
#   labels: the class names by id (config.json's id2label), num_labels of them;
#   score_activation: what sentence-transformers applies to the scores (SCORE_ACTIVATIONS, from
#     config.json's sentence_transformers.activation_fn), or null where the checkpoint says nothing.
# Files written before heads existed lack the key and mean null, and heads written before "norm"
# existed mean false (reader.read_config fills both in).
HEAD = "head"
SEQUENCE_CLASSIFICATION = "sequence_classification"
TOKEN_CLASSIFICATION = "token_classification"
HEAD_KINDS = (SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION)
# The engine reads the first keys; labels and score_activation are the Python Encoder's.
HEAD_KEYS = (*_engine_keys(HEAD), "labels", "score_activation")
HEAD_INPUTS = {SEQUENCE_CLASSIFICATION: ("pooler", "first_token", "mean", "late_mean"),
               TOKEN_CLASSIFICATION: ("tokens",)}
HEAD_ACTIVATIONS = ("tanh", "gelu", "relu")
SCORE_ACTIVATIONS = ("sigmoid", "identity", "softmax")

# Every key of ftbert_config.json, in the order it is written: the engine's between the format's and
# the weights'.
CONFIG_KEYS = (
    "format",
    "format_version",
    "model_type",
    *_engine_keys(),
    "dtype",
    "weights_file",
    "weights_sha256",
    "max_seq_length",
)
# Not among them: CHECKPOINT_QUANTIZATION, written after "dtype" only by FP8 conversions (a file
# without it stores no tensor as FP8, as every conversion before FP8 files); read back as null.

# Engine tensor names the family tables map HF names onto (the full list of each architecture's
# tensors, with their shapes, is the engine's own: cpp/core/weights.cpp, read through schema.py).
# The relative position bias table [relative_attention_num_buckets, num_attention_heads] (MPNet).
RELATIVE_BIAS_TENSORS = ("encoder.relative_attention_bias",)
# ModernBERT's final norm.
FINAL_NORM_TENSORS = ("final_norm.gamma",)
# The embeddings -> hidden projection (ELECTRA, where embedding_size != hidden_size).
PROJECTION_TENSORS = ("embeddings.project_weight", "embeddings.project_bias")
# The head's: its own dense, its norm's gamma, its output Linear.
HEAD_DENSE_TENSORS = ("classifier.dense_weight", "classifier.dense_bias")
HEAD_NORM_TENSORS = ("classifier.norm_gamma",)
HEAD_OUT_TENSORS = ("classifier.out_weight", "classifier.out_bias")
HEAD_TENSORS = (*HEAD_DENSE_TENSORS, *HEAD_NORM_TENSORS, *HEAD_OUT_TENSORS)

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

# The engine holds every size in a C++ int.
MAX_SIZE = 2**31 - 1


def embedding_size(config: dict) -> int:
    """The embedding tables' width: config["embedding_size"], or hidden_size where it is absent."""
    return int(config.get(EMBEDDING_SIZE, config["hidden_size"]))


def usable_seq_length(config: dict) -> int:
    """The longest input the model takes: max_position_embeddings, less pad_token_id + 1 for
    padding_offset positions, whose first real token sits at pad_token_id + 1 (RoBERTa: 514 - 2)."""
    P = int(config["max_position_embeddings"])
    if config.get("position_ids", ABSOLUTE) == PADDING_OFFSET:
        return P - int(config["pad_token_id"]) - 1
    return P


def seq_limit_text(config: dict) -> str:
    """usable_seq_length as a message names it, with where it comes from."""
    P = int(config["max_position_embeddings"])
    if config.get("position_ids", ABSOLUTE) == PADDING_OFFSET:
        pad = int(config["pad_token_id"])
        return (f"the usable length {P - pad - 1} (max_position_embeddings {P} - pad_token_id {pad} "
                "- 1: position ids start at pad_token_id + 1)")
    return f"max_position_embeddings {P}"


def check_finite(name: str, t: torch.Tensor, where: str, error: Callable[[str], Exception]) -> None:
    """A NaN or infinity in a weight poisons every output it reaches; refuse it at load."""
    finite = torch.isfinite(t)
    if not finite.all():
        bad = t.numel() - int(finite.sum())
        raise error(f"{where}: tensor {name!r} holds {bad} NaN or infinite value(s) (of {t.numel()})")


def fmt_shape(shape) -> str:
    """[48, 144] rather than torch.Size([48, 144]) or (48,)."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks so large checkpoints need no extra memory."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _is_int(v: Any) -> bool:
    # JSON true/false load as bool, which Python counts as int; a hyper-parameter never is one.
    return isinstance(v, int) and not isinstance(v, bool)


def check_hyperparameters(cfg: dict, where: str, error: Callable[[str], Exception]) -> None:
    """Checks the model hyper-parameters (shared by the HF reader and the converted-file reader);
    cfg holds embedding_size (both readers fill it in before)."""
    for key in (*INT_KEYS, EMBEDDING_SIZE):
        v = cfg.get(key)
        if not _is_int(v) or not 0 < v <= MAX_SIZE:
            raise error(f"{where}: {key} must be a positive integer (at most {MAX_SIZE}), got {v!r}")
    if cfg["hidden_size"] % cfg["num_attention_heads"] != 0:
        raise error(
            f"{where}: hidden_size {cfg['hidden_size']} is not divisible by "
            f"num_attention_heads {cfg['num_attention_heads']}"
        )
    check_layer(cfg.get(LAYER), where, error)
    check_disentangled(cfg.get(DISENTANGLED), where, error)
    R = cfg.get(RELATIVE_BUCKETS, 0)
    if not _is_int(R) or not (R == 0 or RELATIVE_BUCKETS_LOOKED_UP <= R <= MAX_SIZE):
        raise error(f"{where}: {RELATIVE_BUCKETS} must be 0 (no relative position bias) or an integer "
                    f"from {RELATIVE_BUCKETS_LOOKED_UP} (the buckets the attention looks up) to "
                    f"{MAX_SIZE}, got {R!r}")
    eps = cfg.get("layer_norm_eps")
    # The engine computes in float32: an eps that rounds to 0 or overflows there is no eps at all.
    if (not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps)
            or not 0 < _as_float32(eps) < math.inf):
        raise error(f"{where}: layer_norm_eps must be a positive number float32 can hold, got {eps!r}")
    act = cfg.get("hidden_act")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise error(
            f"{where}: hidden_act {act!r} is not supported by the engine "
            f"(supported: {', '.join(ACTIVATIONS)})"
        )


def check_layer(layer: Any, where: str, error: Callable[[str], Exception]) -> None:
    """Checks the engine config's LAYER value: null, or its object."""
    if layer is None:
        return
    if not isinstance(layer, dict) or set(layer) != set(LAYER_KEYS):
        raise error(f"{where}: {LAYER} must be null or an object with the keys {', '.join(LAYER_KEYS)}, "
                    f"got {layer!r}")
    for key in ("rotary_theta", "local_rotary_theta", "rotary_scale"):
        v = layer[key]
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                or not 0 < _as_float32(v) < math.inf):
            raise error(f"{where}: {LAYER}.{key} must be a positive number, got {v!r}")
    v = layer["global_every"]
    if not _is_int(v) or not 0 < v <= MAX_SIZE:
        raise error(f"{where}: {LAYER}.global_every must be a positive integer, got {v!r}")
    v = layer["local_window"]
    if not _is_int(v) or not 0 <= v <= MAX_SIZE:
        raise error(f"{where}: {LAYER}.local_window must be a non-negative integer, got {v!r}")
    if not isinstance(layer["gated_mlp"], bool):
        raise error(f"{where}: {LAYER}.gated_mlp must be true or false, got {layer['gated_mlp']!r}")
    factor, original = layer["rotary_dynamic_factor"], layer["rotary_original_positions"]
    if (not isinstance(factor, (int, float)) or isinstance(factor, bool) or not math.isfinite(factor)
            or not 0 <= _as_float32(factor) < math.inf):
        raise error(f"{where}: {LAYER}.rotary_dynamic_factor must be 0 (none) or a positive number, got {factor!r}")
    if not _is_int(original) or not 0 <= original <= MAX_SIZE or (factor > 0) != (original > 0):
        raise error(f"{where}: {LAYER}.rotary_original_positions must be a positive integer with a "
                    f"rotary_dynamic_factor and 0 without, got {original!r} (factor {factor!r})")


def check_disentangled(value: Any, where: str, error: Callable[[str], Exception]) -> None:
    """Checks the engine config's DISENTANGLED value: null, or its object."""
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != set(DISENTANGLED_KEYS):
        raise error(f"{where}: {DISENTANGLED} must be null or an object with the keys "
                    f"{', '.join(DISENTANGLED_KEYS)}, got {value!r}")
    buckets, reach = value["position_buckets"], value["max_relative_positions"]
    if not _is_int(buckets) or buckets == 1 or buckets > MAX_SIZE:
        raise error(f"{where}: {DISENTANGLED}.position_buckets must be an integer, at least 2 or at "
                    f"most 0 (none), got {buckets!r}")
    if not _is_int(reach) or not 0 < reach <= MAX_SIZE:
        raise error(f"{where}: {DISENTANGLED}.max_relative_positions must be a positive integer, got {reach!r}")
    if buckets > 0 and reach <= buckets // 2 + 1:
        raise error(f"{where}: {DISENTANGLED}.max_relative_positions {reach} must exceed position_buckets / 2 + 1 "
                    f"({buckets // 2 + 1}) for the log buckets")
    for key in ("c2p", "p2c", "position_table", "norm"):
        if not isinstance(value[key], bool):
            raise error(f"{where}: {DISENTANGLED}.{key} must be true or false, got {value[key]!r}")
    if not (value["c2p"] or value["p2c"]):
        raise error(f"{where}: {DISENTANGLED} adds neither term (c2p and p2c both false)")


def check_positions(cfg: dict, where: str, error: Callable[[str], Exception]) -> None:
    """Checks position_ids and pad_token_id (after check_hyperparameters)."""
    scheme = cfg.get("position_ids")
    if scheme not in POSITION_SCHEMES:
        schemes = " or ".join(map(repr, POSITION_SCHEMES))
        raise error(f"{where}: position_ids must be {schemes}, got {scheme!r}")
    pad, V, P = cfg.get("pad_token_id"), cfg["vocab_size"], cfg["max_position_embeddings"]
    if not _is_int(pad) or not 0 <= pad < V:
        raise error(
            f"{where}: pad_token_id must be an integer from 0 to vocab_size - 1 ({V - 1}), got {pad!r}"
        )
    if scheme == PADDING_OFFSET and pad + 1 >= P:
        raise error(
            f"{where}: pad_token_id {pad} leaves no usable position: position ids start at "
            f"pad_token_id + 1 = {pad + 1}, but max_position_embeddings is {P}"
        )
    layer = cfg.get(LAYER)
    if isinstance(layer, dict) and layer.get("rotary_original_positions", 0) > P:
        raise error(f"{where}: {LAYER}.rotary_original_positions {layer['rotary_original_positions']} is more than "
                    f"the max_position_embeddings {P} the model serves")


def _as_float32(x: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.inf


def check_format(cfg: Any, where: str, error: Callable[[str], Exception]) -> None:
    """Checks a whole ftbert_config.json as the format defines it (after its format and version were
    checked): every key there, each value in range. That the values fit the model_type's family is
    families.check_engine_config's to check (the family tables build on this module)."""
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise error(f"{where}: missing key(s) {', '.join(missing)}")
    check_hyperparameters(cfg, where, error)
    check_positions(cfg, where, error)
    if not isinstance(cfg["has_pooler"], bool):
        raise error(f"{where}: has_pooler must be true or false, got {cfg['has_pooler']!r}")
    check_head(cfg, where, error)
    if cfg["dtype"] not in DTYPES:
        raise error(f"{where}: dtype {cfg['dtype']!r} is not one of {', '.join(DTYPES)}")
    quant = cfg.get(CHECKPOINT_QUANTIZATION)
    if quant is not None and (not isinstance(quant, str) or quant not in QUANTIZATIONS):
        raise error(f"{where}: {CHECKPOINT_QUANTIZATION} must be null or one of "
                    f"{', '.join(map(repr, QUANTIZATIONS))}, got {quant!r}")
    wf = cfg["weights_file"]
    # A bare file name: the directory must be self-contained, and a path could point anywhere.
    if not isinstance(wf, str) or not wf or Path(wf).name != wf or wf in (".", ".."):
        raise error(f"{where}: weights_file must be a file name inside the directory, got {wf!r}")
    sha = cfg["weights_sha256"]
    if not isinstance(sha, str) or not _SHA256_RE.match(sha):
        raise error(f"{where}: weights_sha256 must be 64 lowercase hex digits, got {sha!r}")
    msl = cfg["max_seq_length"]
    if msl is not None and (not _is_int(msl) or msl <= 0):
        raise error(f"{where}: max_seq_length must be a positive integer or null, got {msl!r}")


def check_head(cfg: dict, where: str, error: Callable[[str], Exception]) -> None:
    """Checks the engine config's "head" (see HEAD): null, or an object whose values agree with each
    other and with the rest of the config."""
    head = cfg.get(HEAD)
    if head is None:
        return
    if not isinstance(head, dict):
        raise error(f"{where}: head must be null or an object, got {head!r}")
    keys = set(head)
    if keys != set(HEAD_KEYS):
        missing, extra = sorted(set(HEAD_KEYS) - keys), sorted(keys - set(HEAD_KEYS))
        what = "; ".join(filter(None, [missing and f"missing {', '.join(missing)}",
                                       extra and f"unknown {', '.join(extra)}"]))
        raise error(f"{where}: head: {what} (expected keys {', '.join(HEAD_KEYS)})")
    kind = head["kind"]
    if kind not in HEAD_KINDS:
        raise error(f"{where}: head.kind must be one of {', '.join(map(repr, HEAD_KINDS))}, got {kind!r}")
    n = head["num_labels"]
    if not _is_int(n) or not 0 < n <= MAX_SIZE:
        raise error(f"{where}: head.num_labels must be a positive integer, got {n!r}")
    inputs = HEAD_INPUTS[kind]
    if head["input"] not in inputs:
        raise error(f"{where}: head.input for a {kind} head must be {' or '.join(map(repr, inputs))}, "
                    f"got {head['input']!r}")
    if head["input"] == "pooler" and cfg["has_pooler"] is not True:
        raise error(f"{where}: head.input is 'pooler', but has_pooler is {cfg['has_pooler']!r}")
    act = head["activation"]
    if head["input"] in ("first_token", "mean", "late_mean"):
        if act not in HEAD_ACTIVATIONS:
            raise error(f"{where}: head.activation must be one of {', '.join(map(repr, HEAD_ACTIVATIONS))} "
                        f"for input {head['input']!r}, got {act!r}")
    elif head["input"] == "tokens":
        if act not in (None, *HEAD_ACTIVATIONS):
            raise error(f"{where}: head.activation must be null or one of "
                        f"{', '.join(map(repr, HEAD_ACTIVATIONS))} for input 'tokens', got {act!r}")
    elif act is not None:
        raise error(f"{where}: head.activation must be null for input {head['input']!r}, got {act!r}")
    if not isinstance(head["norm"], bool) or (head["norm"] and act is None):
        raise error(f"{where}: head.norm must be true or false, and true only after a dense with an "
                    f"activation, got {head['norm']!r}")
    labels = head["labels"]
    if (not isinstance(labels, list) or len(labels) != n
            or not all(isinstance(x, str) for x in labels)):
        raise error(f"{where}: head.labels must be a list of num_labels ({n}) strings, got {labels!r}")
    score = head["score_activation"]
    if score is not None and score not in SCORE_ACTIVATIONS:
        raise error(f"{where}: head.score_activation must be null or one of "
                    f"{', '.join(map(repr, SCORE_ACTIVATIONS))}, got {score!r}")
