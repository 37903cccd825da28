"""Reads a HuggingFace checkpoint directory and re-lays its encoder weights out for the engine.

What is accepted: config.json with a model_type of a family in families.py ("bert", "roberta",
"xlm-roberta", "camembert", "distilbert", "electra"), and weights as model.safetensors, sharded safetensors
(model.safetensors.index.json), pytorch_model.bin or sharded .bin (pytorch_model.bin.index.json).
Names may carry the prefix the family's task models put before the encoder (BertForMaskedLM,
BertForSequenceClassification, ... for BERT; RobertaForMaskedLM, ... for RoBERTa;
DistilBertForMaskedLM, ... for DistilBERT; ElectraForPreTraining, ... for ELECTRA). The head that
config.json's `architectures` names is converted when it is a sequence- or token-classification head
(read_head); any other head is left out with a warning that names it. Every HF weight name and config
key comes from the family's table. A checkpoint with per-task LoRA adapters (the original
Jina-embeddings-v3 code's: families.TaskAdapters) is read with one task's adapters merged into its
weights (read_hf_checkpoint's `task`).
"""

from __future__ import annotations

import math
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from .compressed_tensors import (
    QUANTIZATION_CONFIG,
    Fp8Pair,
    Fp8Scheme,
    is_float8,
    pair_scales,
    parse_quantization_config,
)
from .errors import ConversionError
from .families import ABSOLUTE, Family, KVHeads, Part, family_for_config, supported_model_types
from .fp8 import FP8_DTYPE, bad_scale_count, dequantize
from .jsonfile import read_json, read_json_object
from .layout import (
    CHECKPOINT_QUANTIZATION,
    CONFIG_FILE,
    FP8,
    DISENTANGLED,
    LAYER,
    RELATIVE_BUCKETS,
    FORMAT_NAME,
    FORMAT_VERSION,
    EMBEDDING_SIZE,
    HEAD,
    HEAD_TENSORS,
    INT_KEYS,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    WEIGHTS_FILE,
    check_finite,
    check_hyperparameters,
    check_positions,
    fmt_shape,
)
from .safetensors_header import read_header
from .schema import check_fits, expected_tensors, iter_tensors

Log = Callable[[str], None]

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"

# The dtypes an encoder weight may have in a checkpoint; all are read as float32. An FP8 weight of a
# compressed-tensors checkpoint (compressed_tensors.py) is read as float32 too, times its scale.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_MIN_ITEMSIZE = min(getattr(torch, d).itemsize for d in FLOAT_DTYPES)
_FP8_ITEMSIZE = 1


def _quiet(_: str) -> None:
    pass


# ---- config ---------------------------------------------------------------------------------


# config.json's count of grouped K/V heads: the converter repeats them (families.KVHeads); the
# engine config does not hold it (its attention has one K/V head per query head).
KV_HEADS = "num_key_value_heads"


def read_hf_config(src: Path) -> tuple[Family, dict]:
    """config.json -> (its family, the model hyper-parameters under the engine's keys, the family's
    defaults filled in), checked."""
    path = src / "config.json"
    if not path.is_file():
        raise ConversionError(f"{src}: no config.json (a HuggingFace checkpoint directory needs one)")
    raw = read_json_object(path, ConversionError)
    model_type = raw.get("model_type")
    supported = _choices(supported_model_types())
    if model_type is None:
        raise ConversionError(f"{path}: no model_type (only model_type {supported} is supported)")
    family = family_for_config(raw)
    if family is None:
        raise ConversionError(
            f"{path}: model_type {model_type!r} is not supported (only {supported} can be converted)"
        )
    for key, accepted in family.accepted_values.items():
        value = raw.get(key, accepted[0])
        if value not in accepted:
            raise ConversionError(
                f"{path}: {key} {value!r} is not supported (only {_choices(accepted)})"
            )
    cfg = {key: k.read(raw) for key, k in family.config.items()}
    if family.token_types and cfg["type_vocab_size"] == 0:
        # A model built without a token-type table (GTE's type_vocab_size 0): the converter's zero
        # row, as for a family without token types (_zero_token_types).
        cfg["type_vocab_size"] = 1
    cfg[EMBEDDING_SIZE] = family.embedding_size(raw, cfg["hidden_size"])
    if raw.get(KV_HEADS) is not None:  # read by _source for KVHeads; not an engine key
        cfg[KV_HEADS] = raw[KV_HEADS]
    if family.derive_layer is not None:
        try:
            cfg[LAYER] = family.derive_layer(raw)
        except ValueError as e:
            raise ConversionError(f"{path}: {e}") from None
    layer = cfg.get(LAYER)
    if layer is not None and layer["rotary_dynamic_factor"] > 0:
        # transformers' dynamic rope sets no longest sequence; the engine serves factor × the
        # original positions where the config names fewer.
        served = int(layer["rotary_dynamic_factor"] * layer["rotary_original_positions"])
        cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], served)
    if family.derive_disentangled is not None:
        try:
            cfg[DISENTANGLED] = family.derive_disentangled(raw)
        except ValueError as e:
            raise ConversionError(f"{path}: {e}") from None
    check_hyperparameters(cfg, str(path), ConversionError)
    cfg["layer_norm_eps"] = float(cfg["layer_norm_eps"])
    cfg["position_ids"] = family.position_ids
    pad = cfg["pad_token_id"]
    if family.position_ids == ABSOLUTE and not (_is_int(pad) and 0 <= pad < cfg["vocab_size"]):
        # Absolute positions never read the pad id: a config.json without a usable one (BERT
        # configs with "pad_token_id": null exist) is no reason to refuse the model.
        cfg["pad_token_id"] = family.config["pad_token_id"].default
    check_positions(cfg, str(path), ConversionError)
    return family, cfg


# The architectures (config.json) whose head the engine runs, by class-name suffix.
_HEAD_SUFFIXES = {"ForSequenceClassification": SEQUENCE_CLASSIFICATION,
                  "ForTokenClassification": TOKEN_CLASSIFICATION}
# sentence-transformers' CrossEncoder records the activation it applies to scores as a class path.
_SCORE_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity", "Softmax": "softmax"}


def architecture(src: Path) -> str | None:
    """The model class config.json names (its first `architectures` entry), or None."""
    archs = read_json_object(src / "config.json", ConversionError).get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return None


def read_head(src: Path, family: Family) -> dict | None:
    """The engine config's "head" for the architecture config.json names (layout.HEAD), or None
    when it names no classification head."""
    path = src / "config.json"
    raw = read_json_object(path, ConversionError)
    arch = architecture(src)
    kind = next((k for suffix, k in _HEAD_SUFFIXES.items() if arch and arch.endswith(suffix)), None)
    if kind is None:
        return None
    head = family.head(kind)
    if head is None:  # the family's heads do not run: the encoder alone, with a warning
        return None
    for key, accepted in family.head_accepted_values.items():
        value = raw.get(key, accepted[0])
        if value not in accepted:
            raise ConversionError(f"{path}: {key} {value!r} is not supported for {arch}'s head "
                                  f"(only {_choices(accepted)})")
    labels = _labels(raw, path)
    own_dense = head.dense is not None
    if kind == TOKEN_CLASSIFICATION:
        source = "tokens"
    elif not own_dense:
        source = "pooler"
    else:
        # A pooling key left out means the config class's default (head_accepted_values' first).
        pooling = raw.get(head.pooling_key, family.head_accepted_values.get(head.pooling_key, (None,))[0])
        source = head.pooling_inputs.get(pooling, "first_token") if head.pooling_key else "first_token"
    return {
        "kind": kind,
        "num_labels": len(labels),
        "input": source,
        "activation": head.activation if own_dense else None,
        "norm": head.norm is not None,
        "labels": labels,
        "score_activation": _score_activation(raw, path),
    }


def _labels(raw: dict, path: Path) -> list[str]:
    """The class names by id: id2label (keys "0".."N-1", as transformers saves them), else
    num_labels generic names, else transformers' default of 2."""
    id2label = raw.get("id2label")
    if id2label is None:
        n = raw.get("num_labels", 2)
        if not _is_int(n) or n < 1:
            raise ConversionError(f"{path}: num_labels must be a positive integer, got {n!r}")
        return [f"LABEL_{i}" for i in range(n)]
    if not isinstance(id2label, dict) or not id2label:
        raise ConversionError(f"{path}: id2label must be a non-empty object, got {id2label!r}")
    want = [str(i) for i in range(len(id2label))]
    if sorted(id2label, key=lambda k: (len(k), k)) != want:
        raise ConversionError(
            f"{path}: id2label's keys must be the ids 0..{len(id2label) - 1}, got {sorted(id2label)!r}"
        )
    return [str(id2label[k]) for k in want]


def _score_activation(raw: dict, path: Path) -> str | None:
    """What CrossEncoder applies to the scores, from config.json (null: it says nothing)."""
    st = raw.get("sentence_transformers")
    name = st.get("activation_fn") if isinstance(st, dict) else None
    if name is None:
        name = raw.get("sbert_ce_default_activation_function")  # older sentence-transformers
    if name is None:
        return None
    short = str(name).rsplit(".", 1)[-1]
    if short not in _SCORE_ACTIVATIONS:
        warnings.warn(
            f"{path}: the score activation {name!r} is not one ftbert applies "
            f"({', '.join(_SCORE_ACTIVATIONS)}); predict() returns raw logits unless told otherwise",
            UserWarning, stacklevel=4,
        )
        return None
    return _SCORE_ACTIVATIONS[short]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _choices(values) -> str:
    """The values quoted for a message: 'a', or 'a' or 'b', or 'a', 'b' or 'c'."""
    quoted = [repr(v) for v in values]
    return " or ".join(filter(None, [", ".join(quoted[:-1]), quoted[-1]]))


def read_max_seq_length(src: Path) -> int | None:
    """sentence-transformers' truncation length, or None for a plain HuggingFace directory.

    Older sentence-transformers versions write it as max_seq_length in sentence_bert_config.json;
    newer ones leave it out there and keep it as the tokenizer's model_max_length instead.
    """
    path = src / "sentence_bert_config.json"
    v = _json_key(path, "max_seq_length")
    if v is None and (src / "modules.json").is_file():
        path = src / "tokenizer_config.json"
        v = _json_key(path, "model_max_length")
        # Tokenizers without a limit store a huge sentinel (about 1e30): that, or anything odd in a
        # file that is only a tokenizer hint, means "no limit of its own".
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v < 1 << 31:
            v = None
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConversionError(f"{path}: the maximum sequence length must be a positive integer, got {v!r}")
    return v


def _json_key(path: Path, key: str):
    if not path.is_file():
        return None
    raw = read_json(path, ConversionError)
    return raw.get(key) if isinstance(raw, dict) else None


# ---- weight files ---------------------------------------------------------------------------


class WeightFiles:
    """The tensors of a checkpoint's weight file(s), by name; their dtypes and shapes are known
    from the headers (or the memory-mapped .bin) before any tensor data is read.

    With `scheme` (a compressed-tensors FP8 quantization_config), each F8_E4M3 weight that has its
    weight_scale is handed out as float32 weight * scale, with float32 as its dtype; its scale (and
    zero point) are consumed: not among names(). `dequantized` names those read so far."""

    def __init__(self, src: Path, scheme: Fp8Scheme | None = None):
        self.src = src
        self.kind, self.files = self._find(src)
        self._where: dict[str, Path] = {}  # tensor name -> file holding it
        self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}  # tensor name -> (dtype, shape)
        self._safe: dict[Path, object] = {}  # open safetensors handles
        self._bin: dict[Path, dict] = {}  # loaded .bin state dicts
        for f in self.files:
            for name, meta in self._open(f).items():
                if name in self._where:
                    raise ConversionError(
                        f"{src}: tensor {name!r} is in both {self._where[name].name} and {f.name}"
                    )
                self._where[name] = f
                self._meta[name] = meta
        self.scheme = scheme
        self.dequantized: set[str] = set()
        self._pairs: dict[str, Fp8Pair] = {}
        self._consumed: dict[str, Path] = {}  # scales and zero points: read with their weight only
        if scheme is not None:
            self._pairs = pair_scales(self._meta, scheme, self._where.__getitem__, ConversionError)
            for pair in self._pairs.values():
                for n in filter(None, (pair.scale, pair.zero_point)):
                    self._consumed[n] = self._where.pop(n)

    @staticmethod
    def _find(src: Path) -> tuple[str, list[Path]]:
        if (src / SAFETENSORS_FILE).is_file():
            return "safetensors", [src / SAFETENSORS_FILE]
        if (src / SAFETENSORS_INDEX).is_file():
            return "safetensors", _shards(src, SAFETENSORS_INDEX)
        if (src / BIN_FILE).is_file():
            return "bin", [src / BIN_FILE]
        if (src / BIN_INDEX).is_file():
            return "bin", _shards(src, BIN_INDEX)
        msg = (
            f"{src}: no weight file (looked for {SAFETENSORS_FILE}, {SAFETENSORS_INDEX}, {BIN_FILE}, "
            f"{BIN_INDEX})"
        )
        others = [n for n in ("tf_model.h5", "flax_model.msgpack", "model.ckpt.index") if (src / n).exists()]
        if others:
            msg += f"; found {', '.join(others)}, which cannot be converted (save it with PyTorch first)"
        if (src / CONFIG_FILE).is_file() and (src / WEIGHTS_FILE).is_file():
            msg += "; this looks like an ftbert-converted directory already (load it directly)"
        raise ConversionError(msg)

    def _open(self, f: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Opens one weight file: {tensor name: (dtype, shape)}, with no tensor data read."""
        if self.kind == "bin":
            sd = self._bin[f] = _load_bin(f)
            return {n: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in sd.items()}
        header = read_header(f, ConversionError)
        try:
            from safetensors import safe_open

            self._safe[f] = safe_open(str(f), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types; name the file
            raise ConversionError(f"{f}: cannot be read as safetensors ({e})") from e
        return {n: (t.dtype, t.shape) for n, t in header.items()}

    def names(self) -> list[str]:
        return list(self._where)

    def meta(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(dtype name, shape) of a tensor, without reading it; float32 for a paired FP8 weight,
        which get() dequantizes."""
        dtype, shape = self._meta[name]
        return ("float32", shape) if name in self._pairs else (dtype, shape)

    def has_float8(self) -> bool:
        """Whether any tensor of the files is a float8 one."""
        return any(is_float8(dtype) for dtype, _ in self._meta.values())

    def where(self, name: str) -> Path:
        return self._where.get(name) or self._consumed[name]

    def fp8_refusal(self, name: str, dtype: str) -> str:
        """Why a float8 tensor the reader needs cannot be read (it has no pair)."""
        where = f"{self.where(name)}: tensor {name!r} has dtype {dtype}, which the engine does not take"
        if dtype != FP8_DTYPE:
            return (f"{where} (float8 weights are read only as {FP8_DTYPE}, F8_E4M3, with a weight_scale, from a "
                    "compressed-tensors checkpoint of format 'float-quantized')")
        if self.scheme is None:
            return (f"{where} without a scale: config.json has no {QUANTIZATION_CONFIG} (compressed-tensors, "
                    "format 'float-quantized') to say how it is scaled")
        scale = (name[: -len("weight")] if name.endswith("weight") else name + ".") + "weight_scale"
        return f"{where} without a scale: {scale!r} is not in {self.describe()}"

    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def get(self, name: str) -> torch.Tensor:
        pair = self._pairs.get(name)
        if pair is not None:
            return self._dequantized(pair)
        return self._raw(name)

    def _dequantized(self, pair: Fp8Pair) -> torch.Tensor:
        """weight * weight_scale in float32 (the scale per output row, or one for the tensor)."""
        scale = self._raw(pair.scale)
        bad = bad_scale_count(scale)
        if bad:
            raise ConversionError(f"{self.where(pair.scale)}: tensor {pair.scale!r} holds {bad} scale(s) that "
                                  f"are not finite positive numbers (of {scale.numel()})")
        if pair.zero_point is not None and bool(self._raw(pair.zero_point).ne(0).any()):
            raise ConversionError(f"{self.where(pair.zero_point)}: tensor {pair.zero_point!r} is not all zeros, "
                                  "but the scheme is symmetric (no zero point)")
        self.dequantized.add(pair.weight)
        return dequantize(self._raw(pair.weight), scale)

    def _raw(self, name: str) -> torch.Tensor:
        f = self.where(name)
        if self.kind == "safetensors":
            try:
                return self._safe[f].get_tensor(name)
            except Exception as e:
                raise ConversionError(f"{f}: cannot read tensor {name!r} ({e})") from e
        return self._bin[f][name]

    def describe(self) -> str:
        if len(self.files) == 1:
            return self.files[0].name
        return f"{len(self.files)} {self.kind} shards"


def _shards(src: Path, index_name: str) -> list[Path]:
    path = src / index_name
    index = read_json(path, ConversionError)
    try:
        names = sorted(set(index["weight_map"].values()))
    except (KeyError, TypeError, AttributeError) as e:
        raise ConversionError(f"{path}: not a valid shard index (needs a 'weight_map' object; {e})") from e
    files = []
    for n in names:
        if not isinstance(n, str) or Path(n).name != n:
            raise ConversionError(f"{path}: shard name {n!r} is not a file name in the directory")
        if not (src / n).is_file():
            raise ConversionError(f"{path}: shard {n} is missing")
        files.append(src / n)
    if not files:
        raise ConversionError(f"{path}: the index lists no shards")
    return files


def _load_bin(f: Path) -> dict:
    # weights_only: a .bin is a pickle, and a checkpoint from elsewhere must not run code on load.
    # mmap: the tensors stay in the file until read, so their shapes can be checked first.
    try:
        try:
            sd = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:
            # Files from before torch 1.6 are not zip archives and cannot be memory-mapped.
            sd = torch.load(str(f), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ConversionError(
            f"{f}: refused: torch's weights-only loader found more than plain tensors in this pickle "
            f"({_unpickler_reason(e)}); a full unpickle could run code from the file, so none is "
            "tried (the file may also be damaged; save the weights as safetensors from a copy you trust)"
        ) from e
    except Exception as e:  # torch raises many types for damaged files; name the file
        raise ConversionError(
            f"{f}: cannot be read as a PyTorch weight file; it may be truncated or damaged "
            f"({str(e) or type(e).__name__})"
        ) from e
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ConversionError(f"{f}: expected a dict of tensors (a state_dict)")
    return sd


def _unpickler_reason(e: Exception) -> str:
    """The line of torch's weights-only error that says what was refused, without its advice to
    turn the check off."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    return next((line for line in lines if "unsupported" in line.lower()), lines[-1])


# ---- per-task adapters ----------------------------------------------------------------------


@dataclass(frozen=True)
class _TaskMerge:
    """The task whose LoRA adapters are merged into the weights (families.TaskAdapters)."""

    task: str
    index: int  # its slice along the adapters' dim 0: its place in config.json's task list
    tasks: int  # the adapters' dim 0: how many tasks that list names
    rank: int
    scaling: float  # alpha / rank


def _task_merge(src: Path, family: Family, col: "_Collector", task: str | None) -> _TaskMerge | None:
    """The adapters `task` asks to merge, or None (no task given, and none held). Refused by name: a
    task for a family or a checkpoint without adapters, a task the checkpoint does not list, and no
    task for a checkpoint with adapters: which task the outputs serve is the caller's to say (the
    original code's base weights alone serve none of them)."""
    if task is not None and not isinstance(task, str):
        raise ConversionError(f"task must be a task name (a string) or None, got {task!r}")
    path = src / "config.json"
    a = family.adapters
    if a is None or not col.lora:
        if task is not None:
            what = (f"model_type {family.name!r} has no per-task adapters" if a is None else
                    f"the checkpoint holds no per-task LoRA adapters (no '*{a.lora_a}' tensor in "
                    f"{col.files.describe()})")
            raise ConversionError(f"{src}: task {task!r} given, but {what}; load it without a task")
        return None
    raw = read_json_object(path, ConversionError)
    tasks = raw.get(a.tasks_key)
    if not (isinstance(tasks, list) and tasks and all(isinstance(t, str) for t in tasks)
            and len(set(tasks)) == len(tasks)):
        raise ConversionError(f"{path}: {a.tasks_key} must be a non-empty list of distinct task names "
                              f"(the checkpoint holds per-task LoRA adapters), got {tasks!r}")
    if task is None:
        raise ConversionError(
            f"{src}: the checkpoint holds per-task LoRA adapters: name the task whose adapters are merged "
            f"(task=... when loading, --task with ftbert convert), one of {_choices(tasks)}"
        )
    if task not in tasks:
        raise ConversionError(f"{path}: task {task!r} is not one of the checkpoint's {a.tasks_key} "
                              f"({_choices(tasks)})")
    rank, alpha = a.rank.read(raw), a.alpha.read(raw)
    if not _is_int(rank) or rank < 1:
        raise ConversionError(f"{path}: {a.rank.hf} must be a positive integer, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise ConversionError(f"{path}: {a.alpha.hf} must be a finite number, got {alpha!r}")
    return _TaskMerge(task=task, index=tasks.index(task), tasks=len(tasks), rank=rank, scaling=alpha / rank)


# ---- names and re-layout --------------------------------------------------------------------


def _canonical(name: str, family: Family) -> str:
    """Strips the family's task-model prefix and maps old spellings of names to today's."""
    for prefix in family.weights.prefixes:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    for old, new in family.weights.legacy_suffixes.items():
        if name.endswith(old):
            name = name[: -len(old)] + new
            break
    return name


def _layer_re(family: Family) -> re.Pattern:
    """Matches a canonical per-layer name and captures its layer index."""
    before, after = family.weights.layer_prefix.split("{i}")
    return re.compile("^" + re.escape(before) + r"(\d+)" + re.escape(after))


def _short_list(names: Iterable[str], n: int = 4) -> str:
    names = list(names)
    head = ", ".join(names[:n])
    return head + (f", ... ({len(names)} in all)" if len(names) > n else "")


class _Collector:
    """Hands out checked float32 tensors by canonical HF name and remembers which were used; with
    `merge` set, a weight that has per-task LoRA adapters comes with that task's merged in."""

    def __init__(self, files: WeightFiles, family: Family, num_layers: int):
        self.files = files
        self.by_canonical: dict[str, str] = {}
        self.adapters = family.adapters
        # Canonical name of an adapted weight -> {"lora_a": name, "lora_b": name} in the checkpoint;
        # its parametrized original is in by_canonical under the weight's plain name.
        self.lora: dict[str, dict[str, str]] = {}
        self.lora_used: set[str] = set()
        self.merge: _TaskMerge | None = None  # read_hf_checkpoint sets it once the task is known
        # Lookup tables (the embeddings) keep their adapters swapped (families.TaskAdapters).
        self.tables = frozenset(family.weights.embeddings.values())
        for orig in files.names():
            canon = _canonical(orig, family)
            split = self.adapters.split(canon) if self.adapters is not None else None
            if split is not None:
                canon, part = split
                if part != "original":
                    parts = self.lora.setdefault(canon, {})
                    if part in parts:
                        raise ConversionError(f"{files.src}: tensors {parts[part]!r} and {orig!r} are the same "
                                              "adapter under two names")
                    parts[part] = orig
                    continue
            if canon in self.by_canonical:
                raise ConversionError(
                    f"{files.src}: tensors {self.by_canonical[canon]!r} and {orig!r} are the same "
                    "weight under two names"
                )
            self.by_canonical[canon] = orig
        # A missing tensor is named as the checkpoint would spell it, prefix included.
        self.prefix = next(
            (p for p in family.weights.prefixes if any(n.startswith(p) for n in files.names())), ""
        )
        self.roots = family.roots()
        layer_re = _layer_re(family)
        layers_key = family.config["num_hidden_layers"].hf or "num_hidden_layers"
        for canon, orig in self.by_canonical.items():
            m = layer_re.match(canon)
            if m and int(m.group(1)) >= num_layers:
                raise ConversionError(
                    f"{files.src}: tensor {orig!r} belongs to layer {m.group(1)}, but config.json says "
                    f"{layers_key}={num_layers}"
                )
        self.used: set[str] = set()

    def has(self, canon: str) -> bool:
        return canon in self.by_canonical

    def check(self, canon: str, shape: tuple[int, ...]) -> torch.Tensor:
        """What get() would return, checked from the file headers alone, as a tensor without data."""
        orig = self.by_canonical.get(canon)
        if orig is None:
            # Named as the checkpoint would spell it: the encoder's under the task model's prefix.
            shown = self.prefix + canon if canon.split(".", 1)[0] in self.roots else canon
            raise ConversionError(
                f"{self.files.src}: missing tensor {shown!r} (not in {self.files.describe()})"
            )
        dtype, actual = self.files.meta(orig)
        if actual != tuple(shape):
            raise ConversionError(
                f"{self.files.where(orig)}: tensor {orig!r} has shape {fmt_shape(actual)}, but "
                f"config.json implies {fmt_shape(shape)}"
            )
        self._check_dtype(orig, dtype)
        if self.merge is not None and canon in self.lora:
            self._check_adapters(canon, orig, tuple(shape))
        return torch.empty(shape, device="meta")

    def _check_dtype(self, orig: str, dtype: str) -> None:
        if is_float8(dtype):
            raise ConversionError(self.files.fp8_refusal(orig, dtype))
        if dtype not in FLOAT_DTYPES:
            raise ConversionError(
                f"{self.files.where(orig)}: tensor {orig!r} has dtype {dtype}, which the engine does "
                f"not take (it takes {', '.join(FLOAT_DTYPES)})"
            )

    def _adapter_shapes(self, canon: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """The shapes of a weight's lora_a and lora_b (modeling_lora.py's LoRAParametrization):
        a Linear's A [tasks, rank, in] and B [tasks, out, rank]; an Embedding's swapped, A
        [tasks, rows, rank] and B [tasks, rank, dim]."""
        m, (rows, cols) = self.merge, shape
        if canon in self.tables:
            return {"lora_a": (m.tasks, rows, m.rank), "lora_b": (m.tasks, m.rank, cols)}
        return {"lora_a": (m.tasks, m.rank, cols), "lora_b": (m.tasks, rows, m.rank)}

    def _check_adapters(self, canon: str, orig: str, shape: tuple[int, ...]) -> None:
        """Checks a weight's adapters from the file headers: both there, their shapes and dtypes."""
        parts = self.lora[canon]
        if len(shape) != 2:
            raise ConversionError(f"{self.files.where(orig)}: tensor {orig!r} has LoRA adapters, but the "
                                  f"engine reads it as shape {fmt_shape(shape)}, not a matrix")
        for part, want in self._adapter_shapes(canon, shape).items():
            name = parts.get(part)
            if name is None:
                other = "lora_b" if part == "lora_a" else "lora_a"
                missing = parts[other][: -len(getattr(self.adapters, other))] + getattr(self.adapters, part)
                raise ConversionError(f"{self.files.src}: missing tensor {missing!r} (the other half of "
                                      f"{parts[other]!r}; not in {self.files.describe()})")
            dtype, actual = self.files.meta(name)
            if actual != want:
                raise ConversionError(
                    f"{self.files.where(name)}: tensor {name!r} has shape {fmt_shape(actual)}, but config.json "
                    f"implies {fmt_shape(want)} ({self.merge.tasks} tasks in {self.adapters.tasks_key}, "
                    f"{self.adapters.rank.hf} {self.merge.rank}, for {orig!r} of {fmt_shape(shape)})"
                )
            self._check_dtype(name, dtype)

    def _read(self, orig: str) -> torch.Tensor:
        # A copy: the result must not share memory with a mapped file or with another tensor.
        t = self.files.get(orig).detach().to(device="cpu", dtype=torch.float32, copy=True)
        check_finite(orig, t, str(self.files.where(orig)), ConversionError)
        return t

    def get(self, canon: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor as float32, checked (shape, dtype, finite values); with the merged task's
        adapters added where it has them."""
        self.check(canon, shape)
        t = self._read(self.by_canonical[canon])
        self.used.add(canon)
        if self.merge is not None and canon in self.lora:
            parts, m = self.lora[canon], self.merge
            a, b = (self._read(parts[p])[m.index] for p in ("lora_a", "lora_b"))
            self.lora_used.update(parts.values())
            # LoRAParametrization.lora_forward: W + scaling * (B[t] @ A[t]), the factors swapped for an
            # Embedding (A[t] @ B[t]); merged once here, so the engine runs a plain weight.
            if canon in self.tables:
                t.addmm_(a, b, alpha=m.scaling)
            else:
                t.addmm_(b, a, alpha=m.scaling)
        return t

    def ignored(self) -> list[str]:
        unused_lora = [n for parts in self.lora.values() for n in parts.values() if n not in self.lora_used]
        return [self.by_canonical[c] for c in self.by_canonical if c not in self.used] + unused_lora


def _is_linear(tensor) -> bool:
    """A Linear weight (the projection's too): HF stores it [out, in], the engine [in, out].
    Lookup tables (embeddings, a relative bias) keep HF's [rows, E]."""
    return len(tensor.shape) == 2 and not tensor.table


def _zero_token_types(family: Family, src: Path) -> bool:
    """Whether the checkpoint has no token-type table: a family without token types (DistilBERT),
    or a model config.json builds without one (type_vocab_size 0)."""
    return not family.token_types or read_json_object(src / "config.json", ConversionError).get("type_vocab_size") == 0


def _is_zero_token_types(family: Family, engine_name: str) -> bool:
    """The token-type table of a family without token types (DistilBERT): not in its checkpoints,
    supplied by the converter as zeros."""
    return engine_name == "embeddings.token_type" and not family.token_types


def _progress(engine_name: str, num_layers: int) -> str:
    """The part of the model a tensor belongs to, as the progress lines name it."""
    group, _, rest = engine_name.partition(".")
    if group == "layers":
        return f"layer {int(rest.split('.', 1)[0]) + 1}/{num_layers}"
    return group


def _relayout(get: Callable[[str, tuple], torch.Tensor], family: Family, cfg: dict, has_pooler: bool,
              log: Log, zero_token_types: bool = False) -> dict[str, torch.Tensor]:
    """HF tensors ([out, in] Linear weights, separate Q/K/V) -> engine tensors ([in, out], fused QKV).

    Walks the engine layout (schema.iter_tensors) and takes each tensor's source(s) from the
    family's table. get(canonical HF name, shape) supplies each tensor: _Collector.get, or
    _Collector.check for a dry run on tensors without data that checks every input before any is read.
    """
    out: dict[str, torch.Tensor] = {}
    shown = None
    kind = cfg[HEAD]["kind"] if cfg.get(HEAD) else None
    for tensor in iter_tensors({**cfg, "model_type": family.name, "has_pooler": has_pooler}):
        name, shape = tensor.name, tensor.shape
        part = _progress(name, cfg["num_hidden_layers"])
        if part != shown:
            log(f"  {part}")
            shown = part
        if _is_zero_token_types(family, name) or (zero_token_types and name == "embeddings.token_type"):
            # No token-type embedding in the model: one zero row (type_vocab_size is fixed at 1),
            # which adds nothing to token type 0, the only type the engine then accepts.
            out[name] = torch.zeros(shape, dtype=torch.float32)
            continue
        sources = family.hf_names(name, kind)
        if sources == (None,):  # a bias the model does not have (ModernBERT's head dense): zeros
            out[name] = torch.zeros(shape, dtype=torch.float32)
            continue
        if _is_linear(tensor):
            n_in, n_out = shape
            # [k * out, in] -> [in, k * out]: column block j is source j (for QKV: Q, K, V), which
            # the fused GEMM's output row keeps.
            parts = [_source(get, s, (n_out // len(sources), n_in), cfg) for s in sources]
            out[name] = (parts[0] if len(parts) == 1 else _cat(parts)).t().contiguous()
        elif len(sources) == 1:
            out[name] = _source(get, sources[0], shape, cfg)
        else:
            out[name] = _cat([_source(get, s, (shape[0] // len(sources), *shape[1:]), cfg) for s in sources])
    return out


def _source(get: Callable[[str, tuple], torch.Tensor], source: str | Part | KVHeads, shape: tuple,
            cfg: dict) -> torch.Tensor:
    """One source of an engine tensor, `shape` wide: an HF tensor, a block of one (Part), or grouped
    K/V heads repeated to one per query head (KVHeads; cfg's num_key_value_heads, as config.json
    gave it, or the heads' count)."""
    if isinstance(source, Part):
        whole = get(source.name, (shape[0] * source.of, *shape[1:]))
        return whole.chunk(source.of, dim=0)[source.index]
    if isinstance(source, KVHeads):
        heads = cfg["num_attention_heads"]
        kv = cfg.get(KV_HEADS) or heads
        d = shape[0] // heads
        grouped = get(source.name, (kv * d, *shape[1:]))
        return grouped.reshape(kv, d, *shape[1:]).repeat_interleave(heads // kv, dim=0).reshape(shape)
    return get(source, shape)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat along dim 0; for the dry run's tensors without data, only the shape: torch.cat on
    the meta device imports torch._dynamo on first use (about a second at load)."""
    if parts[0].is_meta:
        return torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), device="meta")
    return torch.cat(parts, dim=0)


def hf_state_dict(family: Family, config: dict,
                  tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of the re-layout: engine tensors -> the state dict of the family's bare encoder
    model (BertModel for BERT), float32, [out, in] Linear weights, Q/K/V split again; with a head,
    the state dict of the task model (BertForSequenceClassification, ...): the encoder's tensors
    under the family's prefix, the head's at the top. Grouped K/V heads (KVHeads) come back one per
    query head: a model with num_key_value_heads = num_attention_heads computes the same."""
    sd: dict[str, torch.Tensor] = {}
    kind = config[HEAD]["kind"] if config.get(HEAD) else None
    for tensor in iter_tensors(config):
        name = tensor.name
        if _is_zero_token_types(family, name):
            continue  # supplied by the converter; the HF model has no such tensor
        t = tensors[name].float()
        if _is_linear(tensor):
            t = t.t()  # [in, k * out] -> [k * out, in]
        sources = family.hf_names(name, kind)
        if sources == (None,):
            continue  # supplied by the converter as zeros
        # A task model keeps its encoder under the family's prefix, its head at the top.
        prefix = family.weights.prefixes[0] if kind and name not in HEAD_TENSORS else ""
        blocks: dict[str, dict[int, torch.Tensor]] = {}
        for source, piece in zip(sources, t.chunk(len(sources), dim=0)):
            if isinstance(source, Part):  # reassembled below, blocks in the HF tensor's order
                blocks.setdefault(prefix + source.name, {})[source.index] = piece
            elif isinstance(source, KVHeads):  # one K/V head per query head, as the engine holds them
                sd[prefix + source.name] = piece.contiguous()
            else:
                sd[prefix + source] = piece.contiguous()
        for hf_name, by_index in blocks.items():
            sd[hf_name] = torch.cat([by_index[i] for i in sorted(by_index)], dim=0).contiguous()
    return sd


def engine_config(family: Family, hf: dict, has_pooler: bool, dtype: str, sha256: str | None,
                  max_seq_length: int | None, head: dict | None = None,
                  checkpoint_quantization: str | None = None) -> dict:
    """The engine config dict (ftbert_config.json's content), keys in the documented order."""
    cfg = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model_type": family.name}
    cfg.update({k: hf[k] for k in INT_KEYS})
    cfg[EMBEDDING_SIZE] = hf[EMBEDDING_SIZE]
    cfg["layer_norm_eps"] = hf["layer_norm_eps"]
    cfg["hidden_act"] = hf["hidden_act"]
    cfg["position_ids"] = hf["position_ids"]
    cfg["pad_token_id"] = hf["pad_token_id"]
    cfg[RELATIVE_BUCKETS] = hf.get(RELATIVE_BUCKETS, 0)
    cfg[LAYER] = hf.get(LAYER)
    cfg[DISENTANGLED] = hf.get(DISENTANGLED)
    cfg["has_pooler"] = has_pooler
    cfg[HEAD] = head
    cfg["dtype"] = dtype
    cfg[CHECKPOINT_QUANTIZATION] = checkpoint_quantization
    cfg["weights_file"] = WEIGHTS_FILE if sha256 is not None else None
    cfg["weights_sha256"] = sha256
    cfg["max_seq_length"] = max_seq_length
    return cfg


def read_hf_checkpoint(src, log: Log = _quiet, task: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(engine config with dtype float32 and no weights file, engine tensors in float32).

    task: for a checkpoint with per-task LoRA adapters (families.TaskAdapters), the task (one of
    its config.json's list) whose adapters are merged into the weights, here, once; required for
    such a checkpoint, refused for any other (_task_merge)."""
    src = Path(src)
    if not src.exists():
        raise ConversionError(f"{src}: no such directory")
    if not src.is_dir():
        raise ConversionError(f"{src}: not a directory (expected a HuggingFace checkpoint directory)")
    family, hf = read_hf_config(src)
    max_seq_length = read_max_seq_length(src)
    scheme = parse_quantization_config(read_json_object(src / "config.json", ConversionError), src / "config.json",
                                       ConversionError)
    files = WeightFiles(src, scheme)
    # No tensor has been read yet, only headers: absurd sizes in config.json fail here, cheaply.
    # Float8 tensors take one byte an element (refused later, by name, where they cannot be read).
    check_fits({**hf, "model_type": family.name, "has_pooler": False}, files.nbytes(),
               _FP8_ITEMSIZE if files.has_float8() else _MIN_ITEMSIZE,
               str(src / "config.json"), files.describe(), ConversionError)
    col = _Collector(files, family, hf["num_hidden_layers"])
    col.merge = _task_merge(src, family, col, task)
    pooler = family.weights.pooler
    has_pooler = bool(pooler) and col.has(pooler["pooler.weight"])
    arch = architecture(src)
    head = read_head(src, family)
    if head is not None and head["input"] == "pooler" and not has_pooler:
        raise ConversionError(
            f"{src}: {arch}'s classifier reads the pooler output, but the checkpoint has no pooler "
            f"(missing {col.prefix + pooler['pooler.weight']!r})"
        )
    hf = {**hf, HEAD: head}
    log(
        f"reading {src} ({files.describe()}): {family.name}, {hf['num_hidden_layers']} layers, hidden "
        f"{hf['hidden_size']}, {hf['num_attention_heads']} heads, intermediate "
        f"{hf['intermediate_size']}, vocab {hf['vocab_size']}, {hf['hidden_act']}, "
        f"pooler {'yes' if has_pooler else 'no'}"
        + (f", embeddings {hf[EMBEDDING_SIZE]} projected to {hf['hidden_size']}"
           if hf[EMBEDDING_SIZE] != hf["hidden_size"] else "")
        + (f", {head['kind'].replace('_', ' ')} head of {head['num_labels']} label(s)" if head else "")
        + (f", the LoRA adapters of task {task!r} merged (scaling {col.merge.scaling:g})" if col.merge else "")
    )
    # A dry run on tensors without data: every input's presence, shape and dtype, before any is read.
    zero_types = _zero_token_types(family, src)
    _relayout(col.check, family, hf, has_pooler, _quiet, zero_types)
    tensors = _relayout(col.get, family, hf, has_pooler, log, zero_types)
    roots = family.roots()
    ignored = [(n, _canonical(n, family)) for n in col.ignored()]
    ignored = [(n, c) for n, c in ignored if c not in family.weights.buffers]
    if ignored:
        outside = [n for n, c in ignored if c.split(".", 1)[0] not in roots]
        inside = [n for n, c in ignored if c.split(".", 1)[0] in roots]
        if outside:
            log(f"  left out {len(outside)} tensor(s) outside the encoder: {_short_list(outside)}")
            # Never silent: a user of a task checkpoint must learn that its head does not run.
            warnings.warn(
                f"{src}: the head of {arch or 'this checkpoint'} is not supported and is left out "
                f"({len(outside)} tensor(s): {_short_list(outside)}); only the encoder runs "
                f"(ftbert runs sequence- and token-classification heads)",
                UserWarning, stacklevel=3,
            )
        if inside:
            log(f"  ignored {len(inside)} unrecognised encoder tensor(s): {_short_list(inside)}")
    if files.dequantized:
        log(f"  {len(files.dequantized)} FP8 weight(s) read as weight * weight_scale (compressed-tensors)")
    config = engine_config(family, hf, has_pooler, "float32", None, max_seq_length, head,
                           FP8 if files.dequantized else None)
    # Guards the re-layout against drifting from the one definition the loader checks.
    assert [(n, tuple(t.shape)) for n, t in tensors.items()] == expected_tensors(config)
    return config, tensors


def finite_after_cast(name: str, t: torch.Tensor, cast: torch.Tensor, dtype: str) -> None:
    """float16 tops out at 65504: a larger weight would become inf; say which tensor and how large."""
    if not torch.isfinite(cast).all():
        peak = float(t.abs().max())
        raise ConversionError(
            f"tensor {name!r} has values up to {peak:.6g} in magnitude, which overflow {dtype} "
            f"(use --dtype float32 or bfloat16)"
        )

