"""The engine's side of the format: file names, the config keys, and the tensors a config implies.

Kept apart from the HuggingFace reader so that the loader (read_converted) and the converter agree on
one definition; cpp/core/weights.cpp holds the C++ twin of `expected_tensors`.
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

FORMAT_NAME = "ftbert"
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
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")

# Position-id schemes, the engine config's "position_ids". ABSOLUTE: token t sits at position t,
# padding or not (BERT). PADDING_OFFSET: a token whose id is not pad_token_id sits at
# pad_token_id + (the number of such tokens up to and including it), a pad token at pad_token_id
# (RoBERTa and its descendants; transformers' create_position_ids_from_input_ids, computed from
# input_ids, not from the attention mask).
ABSOLUTE = "absolute"
PADDING_OFFSET = "padding_offset"
POSITION_SCHEMES = (ABSOLUTE, PADDING_OFFSET)

# Hyper-parameters copied from config.json; all must be positive integers.
INT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)

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

# ModernBERT's layer, where BERT's post-LayerNorm one does not apply: null, or an object with
#   rotary_theta: the rotary positions' theta of the global-attention layers (a positive number);
#   local_rotary_theta: that of the sliding-window layers;
#   local_window: a sliding-window layer attends keys within this distance (|j - i| <= it; > 0);
#   global_every: layer i attends globally when i % global_every == 0 (a positive integer).
# Such a model is pre-LayerNorm with a gated MLP ([input | gate] FFN-in, act(input) * gate), no
# position table, no biases and no LayerNorm betas, and a final norm (the tensor list below).
# Files written before the key existed hold BERT's layer (reader.read_config fills in null).
LAYER = "layer"
LAYER_KEYS = ("rotary_theta", "local_rotary_theta", "local_window", "global_every")

# The task head above the encoder: null, or an object with these keys (check_head):
#   kind: SEQUENCE_CLASSIFICATION (logits [B, num_labels] from token 0) or TOKEN_CLASSIFICATION
#     (logits [B, S, num_labels] from every token);
#   num_labels: a positive integer;
#   input: where a sequence head reads: "pooler" (the pooler output: BERT) or "first_token" (token 0
#     through the head's own dense and activation: the others); "tokens" for a token head;
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
HEAD_KEYS = ("kind", "num_labels", "input", "activation", "norm", "labels", "score_activation")
HEAD_INPUTS = {SEQUENCE_CLASSIFICATION: ("pooler", "first_token"), TOKEN_CLASSIFICATION: ("tokens",)}
HEAD_ACTIVATIONS = ("tanh", "gelu", "relu")
SCORE_ACTIVATIONS = ("sigmoid", "identity", "softmax")

# Every key of ftbert_config.json, in the order it is written.
CONFIG_KEYS = (
    "format",
    "format_version",
    "model_type",
    *INT_KEYS,
    EMBEDDING_SIZE,
    "layer_norm_eps",
    "hidden_act",
    "position_ids",
    "pad_token_id",
    RELATIVE_BUCKETS,
    LAYER,
    "has_pooler",
    HEAD,
    "dtype",
    "weights_file",
    "weights_sha256",
    "max_seq_length",
)

# The tensors of a converted directory: these, then LAYER_TENSORS for each layer as
# "layers.{i}.<name>", then the pooler's when the model has one.
EMBEDDING_TENSORS = (
    "embeddings.word",
    "embeddings.position",
    "embeddings.token_type",
    "embeddings.ln_gamma",
    "embeddings.ln_beta",
)
POOLER_TENSORS = ("pooler.weight", "pooler.bias")
# The relative position bias table [relative_attention_num_buckets, num_attention_heads], after the
# embeddings (and projection), only when the config has one. A lookup table like the embeddings,
# kept in HF's layout.
RELATIVE_BIAS_TENSORS = ("encoder.relative_attention_bias",)
# A model with ModernBERT's layer (LAYER): its embeddings (no position table, no beta), its layers'
# (no biases, no betas; layer 0 has no pre-attention norm), then the final norm.
MODERN_EMBEDDING_TENSORS = ("embeddings.word", "embeddings.token_type", "embeddings.ln_gamma")
MODERN_LAYER_TENSORS = ("attn_ln_gamma", "qkv_weight", "attn_out_weight", "ffn_ln_gamma",
                        "ffn_in_weight", "ffn_out_weight")
FINAL_NORM_TENSORS = ("final_norm.gamma",)
# The embeddings -> hidden projection, right after embeddings.ln_beta, only when embedding_size !=
# hidden_size: [E, H] ([in, out], like every matrix) and [H].
PROJECTION_TENSORS = ("embeddings.project_weight", "embeddings.project_bias")
# The head's, after the pooler's: its own dense ([H, H], [H]; where the head has an activation),
# its norm's gamma ([H]; "norm" true), then its output Linear ([H, num_labels], [num_labels]).
HEAD_DENSE_TENSORS = ("classifier.dense_weight", "classifier.dense_bias")
HEAD_NORM_TENSORS = ("classifier.norm_gamma",)
HEAD_OUT_TENSORS = ("classifier.out_weight", "classifier.out_bias")
HEAD_TENSORS = (*HEAD_DENSE_TENSORS, *HEAD_NORM_TENSORS, *HEAD_OUT_TENSORS)

LAYER_TENSORS = (
    "qkv_weight",
    "qkv_bias",
    "attn_out_weight",
    "attn_out_bias",
    "attn_ln_gamma",
    "attn_ln_beta",
    "ffn_in_weight",
    "ffn_in_bias",
    "ffn_out_weight",
    "ffn_out_bias",
    "ffn_ln_gamma",
    "ffn_ln_beta",
)

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

# The engine holds every size in a C++ int.
MAX_SIZE = 2**31 - 1


def expected_tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors an engine config implies, as (name, shape), embeddings first (with the projection
    to hidden_size when embedding_size differs from it), then layers in order, then the pooler, then
    the head's.

    Matrices are [in, out] (the transpose of nn.Linear's [out, in]). A config without
    "embedding_size" has embeddings of hidden_size.
    """
    return list(iter_expected_tensors(config))


def iter_expected_tensors(config: dict):
    """expected_tensors one at a time: a reader can stop at the first mismatch without building the
    whole list, which an absurd num_hidden_layers would make huge."""
    V = int(config["vocab_size"])
    H = int(config["hidden_size"])
    I = int(config["intermediate_size"])  # noqa: E741 (the FFN inner size, as in the docs)
    if config.get(LAYER) is not None:
        yield from _modern_tensors(config, V, H, I)
        return
    P = int(config["max_position_embeddings"])
    T = int(config["type_vocab_size"])
    E = embedding_size(config)
    embedding_shapes = {
        "embeddings.word": (V, E),
        "embeddings.position": (P, E),
        "embeddings.token_type": (T, E),
        "embeddings.ln_gamma": (E,),
        "embeddings.ln_beta": (E,),
    }
    yield from ((name, embedding_shapes[name]) for name in EMBEDDING_TENSORS)
    if E != H:
        projection_shapes = {"embeddings.project_weight": (E, H), "embeddings.project_bias": (H,)}
        yield from ((name, projection_shapes[name]) for name in PROJECTION_TENSORS)
    R = int(config.get(RELATIVE_BUCKETS, 0))
    if R > 0:
        yield RELATIVE_BIAS_TENSORS[0], (R, int(config["num_attention_heads"]))
    layer_shapes = {
        "qkv_weight": (H, 3 * H),
        "qkv_bias": (3 * H,),
        "attn_out_weight": (H, H),
        "attn_out_bias": (H,),
        "attn_ln_gamma": (H,),
        "attn_ln_beta": (H,),
        "ffn_in_weight": (H, I),
        "ffn_in_bias": (I,),
        "ffn_out_weight": (I, H),
        "ffn_out_bias": (H,),
        "ffn_ln_gamma": (H,),
        "ffn_ln_beta": (H,),
    }
    for i in range(int(config["num_hidden_layers"])):
        yield from ((f"layers.{i}.{name}", layer_shapes[name]) for name in LAYER_TENSORS)
    if config["has_pooler"]:
        pooler_shapes = {"pooler.weight": (H, H), "pooler.bias": (H,)}
        yield from ((name, pooler_shapes[name]) for name in POOLER_TENSORS)
    yield from head_tensors(config, H)


def head_tensors(config: dict, H: int):
    """The head's tensors a config implies (see HEAD_TENSORS), as (name, shape)."""
    head = config.get(HEAD)
    if head is None:
        return
    N = int(head["num_labels"])
    if head["activation"] is not None:
        yield from zip(HEAD_DENSE_TENSORS, ((H, H), (H,)))
    if head.get("norm"):
        yield HEAD_NORM_TENSORS[0], (H,)
    yield from zip(HEAD_OUT_TENSORS, ((H, N), (N,)))


def _modern_tensors(config: dict, V: int, H: int, I: int):  # noqa: E741
    """iter_expected_tensors for ModernBERT's layer (see MODERN_LAYER_TENSORS)."""
    yield from zip(MODERN_EMBEDDING_TENSORS, ((V, H), (int(config["type_vocab_size"]), H), (H,)))
    shapes = {"attn_ln_gamma": (H,), "qkv_weight": (H, 3 * H), "attn_out_weight": (H, H),
              "ffn_ln_gamma": (H,), "ffn_in_weight": (H, 2 * I), "ffn_out_weight": (I, H)}
    for i in range(int(config["num_hidden_layers"])):
        for name in MODERN_LAYER_TENSORS[1 if i == 0 else 0:]:
            yield f"layers.{i}.{name}", shapes[name]
    yield FINAL_NORM_TENSORS[0], (H,)
    yield from head_tensors(config, H)


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


def _numel(shape) -> int:
    return math.prod(int(d) for d in shape)


def parameter_count(config: dict) -> tuple[int, str]:
    """(number of parameters the config implies, what holds most of them), computed from the sizes
    alone: one layer's tensors times the layer count, never a list as long as the model."""
    L = int(config["num_hidden_layers"])
    one = expected_tensors({**config, "num_hidden_layers": 1})
    layer = sum(_numel(s) for n, s in one if n.startswith("layers."))
    parts = [(_numel(s), f"{n} {fmt_shape(s)}") for n, s in one if not n.startswith("layers.")]
    parts.append((L * layer, f"{L} layers of {layer} parameters"))
    return sum(p for p, _ in parts), max(parts)[1]


def check_fits(config: dict, available: int, itemsize: int, where: str, files: str,
               error: Callable[[str], Exception]) -> None:
    """Refuses a config whose tensors need more bytes than the weight files hold.

    Runs before any tensor is read: an absurd size in the config (vocab_size 10**9, say) fails
    here, naming the sizes, instead of in an allocation or a loop over the model's tensors.
    """
    count, largest = parameter_count(config)
    need = count * itemsize
    if need > available:
        keys = [*INT_KEYS, *([EMBEDDING_SIZE] if EMBEDDING_SIZE in config else [])]
        sizes = ", ".join(f"{k}={config[k]}" for k in keys)
        raise error(
            f"{where}: the sizes it declares ({sizes}) imply {count} parameters, at least "
            f"{human_size(need)}, but the weight files ({files}) hold only {human_size(available)} "
            f"(most of it would be {largest}); a size in the config is wrong"
        )


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
    for key in ("rotary_theta", "local_rotary_theta"):
        v = layer[key]
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                or not 0 < _as_float32(v) < math.inf):
            raise error(f"{where}: {LAYER}.{key} must be a positive number, got {v!r}")
    for key in ("local_window", "global_every"):
        v = layer[key]
        if not _is_int(v) or not 0 < v <= MAX_SIZE:
            raise error(f"{where}: {LAYER}.{key} must be a positive integer, got {v!r}")


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
    if head["input"] == "first_token":
        if act not in HEAD_ACTIVATIONS:
            raise error(f"{where}: head.activation must be one of {', '.join(map(repr, HEAD_ACTIVATIONS))} "
                        f"for input 'first_token', got {act!r}")
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
