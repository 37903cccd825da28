"""Reads a HuggingFace BERT checkpoint directory and re-lays its encoder weights out for the engine.

What is accepted: config.json with model_type "bert", and weights as model.safetensors, sharded
safetensors (model.safetensors.index.json), pytorch_model.bin or sharded .bin
(pytorch_model.bin.index.json). Names may carry the "bert." prefix of the task models
(BertForMaskedLM, BertForSequenceClassification, ...); task heads are ignored.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Callable, Iterable

import torch

from .errors import ConversionError
from .jsonfile import read_json, read_json_object
from .layout import (
    CONFIG_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    INT_KEYS,
    WEIGHTS_FILE,
    check_finite,
    check_fits,
    check_hyperparameters,
    expected_tensors,
    fmt_shape,
)
from .safetensors_header import read_header

Log = Callable[[str], None]

# BertConfig's defaults, used as transformers uses them when config.json leaves a key out.
HF_DEFAULTS = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
}

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"

# The dtypes an encoder weight may have in a checkpoint; all are read as float32.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_MIN_ITEMSIZE = min(getattr(torch, d).itemsize for d in FLOAT_DTYPES)

# Tensors of the encoder namespace that are buffers, not weights.
_BUFFERS = {"embeddings.position_ids", "embeddings.token_type_ids"}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.")
_PREFIX = "bert."


def _quiet(_: str) -> None:
    pass


# ---- config ---------------------------------------------------------------------------------


def read_hf_config(src: Path) -> dict:
    """config.json -> the model hyper-parameters (HF defaults filled in), checked."""
    path = src / "config.json"
    if not path.is_file():
        raise ConversionError(f"{src}: no config.json (a HuggingFace checkpoint directory needs one)")
    raw = read_json_object(path, ConversionError)
    model_type = raw.get("model_type")
    if model_type is None:
        raise ConversionError(f"{path}: no model_type (only model_type 'bert' is supported)")
    if model_type != "bert":
        raise ConversionError(
            f"{path}: model_type {model_type!r} is not supported (only 'bert' can be converted)"
        )
    # Relative position embeddings change attention itself; converting would silently mis-compute.
    pos_type = raw.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ConversionError(
            f"{path}: position_embedding_type {pos_type!r} is not supported (only 'absolute')"
        )
    cfg = {key: raw.get(key, default) for key, default in HF_DEFAULTS.items()}
    check_hyperparameters(cfg, str(path), ConversionError)
    cfg["layer_norm_eps"] = float(cfg["layer_norm_eps"])
    return cfg


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
    from the headers (or the memory-mapped .bin) before any tensor data is read."""

    def __init__(self, src: Path):
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
        """(dtype name, shape) of a tensor, without reading it."""
        return self._meta[name]

    def where(self, name: str) -> Path:
        return self._where[name]

    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def get(self, name: str) -> torch.Tensor:
        f = self._where[name]
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


# ---- names and re-layout --------------------------------------------------------------------


def _canonical(name: str) -> str:
    """Strips the task models' "bert." prefix and maps old LayerNorm.gamma/beta to weight/bias."""
    if name.startswith(_PREFIX):
        name = name[len(_PREFIX) :]
    if name.endswith("LayerNorm.gamma"):
        name = name[: -len("gamma")] + "weight"
    elif name.endswith("LayerNorm.beta"):
        name = name[: -len("beta")] + "bias"
    return name


def _is_encoder(name: str) -> bool:
    return name.split(".", 1)[0] in ("embeddings", "encoder", "pooler")


def _short_list(names: Iterable[str], n: int = 4) -> str:
    names = list(names)
    head = ", ".join(names[:n])
    return head + (f", ... ({len(names)} in all)" if len(names) > n else "")


class _Collector:
    """Hands out checked float32 tensors by canonical HF name and remembers which were used."""

    def __init__(self, files: WeightFiles, num_layers: int):
        self.files = files
        self.by_canonical: dict[str, str] = {}
        for orig in files.names():
            canon = _canonical(orig)
            if canon in self.by_canonical:
                raise ConversionError(
                    f"{files.src}: tensors {self.by_canonical[canon]!r} and {orig!r} are the same "
                    "weight under two names"
                )
            self.by_canonical[canon] = orig
        self.uses_prefix = any(n.startswith(_PREFIX) for n in files.names())
        for canon, orig in self.by_canonical.items():
            m = _LAYER_RE.match(canon)
            if m and int(m.group(1)) >= num_layers:
                raise ConversionError(
                    f"{files.src}: tensor {orig!r} belongs to layer {m.group(1)}, but config.json says "
                    f"num_hidden_layers={num_layers}"
                )
        self.used: set[str] = set()

    def has(self, canon: str) -> bool:
        return canon in self.by_canonical

    def check(self, canon: str, shape: tuple[int, ...]) -> torch.Tensor:
        """What get() would return, checked from the file headers alone, as a tensor without data."""
        orig = self.by_canonical.get(canon)
        if orig is None:
            shown = (_PREFIX if self.uses_prefix else "") + canon
            raise ConversionError(
                f"{self.files.src}: missing tensor {shown!r} (not in {self.files.describe()})"
            )
        dtype, actual = self.files.meta(orig)
        if actual != tuple(shape):
            raise ConversionError(
                f"{self.files.where(orig)}: tensor {orig!r} has shape {fmt_shape(actual)}, but "
                f"config.json implies {fmt_shape(shape)}"
            )
        if dtype not in FLOAT_DTYPES:
            raise ConversionError(
                f"{self.files.where(orig)}: tensor {orig!r} has dtype {dtype}, which the engine does "
                f"not take (it takes {', '.join(FLOAT_DTYPES)})"
            )
        return torch.empty(shape, device="meta")

    def get(self, canon: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor as float32, checked (shape, dtype, finite values)."""
        self.check(canon, shape)
        orig = self.by_canonical[canon]
        # A copy: the result must not share memory with a mapped file or with another tensor.
        t = self.files.get(orig).detach().to(device="cpu", dtype=torch.float32, copy=True)
        check_finite(orig, t, str(self.files.where(orig)), ConversionError)
        self.used.add(canon)
        return t

    def ignored(self) -> list[str]:
        return [self.by_canonical[c] for c in self.by_canonical if c not in self.used]


def _relayout(get: Callable[[str, tuple], torch.Tensor], cfg: dict, has_pooler: bool,
              log: Log) -> dict[str, torch.Tensor]:
    """HF tensors ([out, in] Linear weights, separate Q/K/V) -> engine tensors ([in, out], fused QKV).

    get(canonical HF name, shape) supplies each tensor: _Collector.get, or _Collector.check for a dry
    run on tensors without data that checks every input before any is read.
    """
    H, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    V, P, T = cfg["vocab_size"], cfg["max_position_embeddings"], cfg["type_vocab_size"]
    out: dict[str, torch.Tensor] = {}
    log("  embeddings")
    out["embeddings.word"] = get("embeddings.word_embeddings.weight", (V, H))
    out["embeddings.position"] = get("embeddings.position_embeddings.weight", (P, H))
    out["embeddings.token_type"] = get("embeddings.token_type_embeddings.weight", (T, H))
    out["embeddings.ln_gamma"] = get("embeddings.LayerNorm.weight", (H,))
    out["embeddings.ln_beta"] = get("embeddings.LayerNorm.bias", (H,))

    def linear_t(prefix: str, n_out: int, n_in: int) -> torch.Tensor:
        return get(prefix + ".weight", (n_out, n_in)).t().contiguous()  # [in, out]

    for i in range(L):
        log(f"  layer {i + 1}/{L}")
        p = f"encoder.layer.{i}."
        a = p + "attention."
        q = get(a + "self.query.weight", (H, H))  # [H_out, H_in]
        k = get(a + "self.key.weight", (H, H))
        v = get(a + "self.value.weight", (H, H))
        # [3H, H] -> [H, 3H]: column block 0 is Q, 1 is K, 2 is V, which the QKV GEMM output keeps.
        out[f"layers.{i}.qkv_weight"] = torch.cat([q, k, v], dim=0).t().contiguous()
        out[f"layers.{i}.qkv_bias"] = torch.cat(
            [get(a + f"self.{n}.bias", (H,)) for n in ("query", "key", "value")]
        )
        out[f"layers.{i}.attn_out_weight"] = linear_t(a + "output.dense", H, H)
        out[f"layers.{i}.attn_out_bias"] = get(a + "output.dense.bias", (H,))
        out[f"layers.{i}.attn_ln_gamma"] = get(a + "output.LayerNorm.weight", (H,))
        out[f"layers.{i}.attn_ln_beta"] = get(a + "output.LayerNorm.bias", (H,))
        out[f"layers.{i}.ffn_in_weight"] = linear_t(p + "intermediate.dense", I, H)
        out[f"layers.{i}.ffn_in_bias"] = get(p + "intermediate.dense.bias", (I,))
        out[f"layers.{i}.ffn_out_weight"] = linear_t(p + "output.dense", H, I)
        out[f"layers.{i}.ffn_out_bias"] = get(p + "output.dense.bias", (H,))
        out[f"layers.{i}.ffn_ln_gamma"] = get(p + "output.LayerNorm.weight", (H,))
        out[f"layers.{i}.ffn_ln_beta"] = get(p + "output.LayerNorm.bias", (H,))
    if has_pooler:
        log("  pooler")
        out["pooler.weight"] = linear_t("pooler.dense", H, H)
        out["pooler.bias"] = get("pooler.dense.bias", (H,))
    return out


def engine_config(hf: dict, has_pooler: bool, dtype: str, sha256: str | None,
                  max_seq_length: int | None) -> dict:
    """The engine config dict (ftbert_config.json's content), keys in the documented order."""
    cfg = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model_type": "bert"}
    cfg.update({k: hf[k] for k in INT_KEYS})
    cfg["layer_norm_eps"] = hf["layer_norm_eps"]
    cfg["hidden_act"] = hf["hidden_act"]
    cfg["has_pooler"] = has_pooler
    cfg["dtype"] = dtype
    cfg["weights_file"] = WEIGHTS_FILE if sha256 is not None else None
    cfg["weights_sha256"] = sha256
    cfg["max_seq_length"] = max_seq_length
    return cfg


def read_hf_checkpoint(src, log: Log = _quiet) -> tuple[dict, dict[str, torch.Tensor]]:
    """(engine config with dtype float32 and no weights file, engine tensors in float32)."""
    src = Path(src)
    if not src.exists():
        raise ConversionError(f"{src}: no such directory")
    if not src.is_dir():
        raise ConversionError(f"{src}: not a directory (expected a HuggingFace checkpoint directory)")
    hf = read_hf_config(src)
    max_seq_length = read_max_seq_length(src)
    files = WeightFiles(src)
    # No tensor has been read yet, only headers: absurd sizes in config.json fail here, cheaply.
    check_fits({**hf, "has_pooler": False}, files.nbytes(), _MIN_ITEMSIZE, str(src / "config.json"),
               files.describe(), ConversionError)
    col = _Collector(files, hf["num_hidden_layers"])
    has_pooler = col.has("pooler.dense.weight")
    log(
        f"reading {src} ({files.describe()}): {hf['num_hidden_layers']} layers, hidden "
        f"{hf['hidden_size']}, {hf['num_attention_heads']} heads, intermediate "
        f"{hf['intermediate_size']}, vocab {hf['vocab_size']}, {hf['hidden_act']}, "
        f"pooler {'yes' if has_pooler else 'no'}"
    )
    # A dry run on tensors without data: every input's presence, shape and dtype, before any is read.
    _relayout(col.check, hf, has_pooler, _quiet)
    tensors = _relayout(col.get, hf, has_pooler, log)
    ignored = [n for n in col.ignored() if _canonical(n) not in _BUFFERS]
    if ignored:
        outside = [n for n in ignored if not _is_encoder(_canonical(n))]
        inside = [n for n in ignored if _is_encoder(_canonical(n))]
        if outside:
            log(f"  ignored {len(outside)} tensor(s) outside the encoder: {_short_list(outside)}")
        if inside:
            log(f"  ignored {len(inside)} unrecognised encoder tensor(s): {_short_list(inside)}")
    config = engine_config(hf, has_pooler, "float32", None, max_seq_length)
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

