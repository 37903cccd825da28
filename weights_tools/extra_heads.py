"""The per-token projection of a ColBERT checkpoint, read for `Encoder.encode_multivector`.

Two layouts hold it:
- colbert-ir's (colbertv2.0 and its fine-tunes): `linear.weight` [dim, H] (no bias) in the
  checkpoint's own weight file, beside the encoder's `bert.` tensors (config.json names HF_ColBERT);
- sentence-transformers / PyLate's: a Dense module in a subfolder that modules.json names (e.g.
  `1_Dense/`), its config.json (in_features, out_features, bias, activation_function) and weights
  (`model.safetensors` or `pytorch_model.bin`: `linear.weight` [out, in], `linear.bias`). Several
  Dense modules in a row are applied in order. A Dense module that follows a Pooling module acts on
  the pooled sentence embedding (sentence-transformers' Dense), not on tokens: it is not a ColBERT
  projection.

    locate_projection(dir)  where the projection's layers are, from headers and configs alone
    read_projection(dir)    TokenProjection: its layers' tensors in float32, checked
    read_colbert_settings(dir)  ColbertSettings: how queries and documents are marked, cut, padded
                            and filtered before and after the encoder, as the checkpoint's own
                            implementation reads them (None where the checkpoint says nothing)

The settings, per layout:
- colbert-ir: `artifact.metadata` (ColBERTConfig's JSON, maybe under "config"), read as
  colbert-ir's ColBERTConfig.load_from_checkpoint does, its defaults where a key is absent
  (colbert/infra/config/settings.py): query_token_id "[unused0]", doc_token_id "[unused1]",
  query_maxlen 32, doc_maxlen 220, attend_to_mask_tokens false, mask_punctuation true.
- PyLate: config_sentence_transformers.json's query_prefix, document_prefix, query_length,
  document_length, do_query_expansion, attend_to_expansion_tokens, skiplist_words, read as
  pylate/models/colbert.py does, its defaults where a key is absent ("[Q] ", "[D] ", 32, 180,
  true, false, string.punctuation); sentence_bert_config.json's do_lower_case.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ConversionError
from .hf import WeightFiles, read_hf_config
from .jsonfile import read_json, read_json_object
from .layout import check_finite, fmt_shape
from .mlm_head import MissingHead, converted_message
from .reader import is_converted

# The weight names of the colbert-ir layout, in the checkpoint's own weight file.
COLBERT_LINEAR = "linear.weight"
COLBERT_LINEAR_BIAS = "linear.bias"
# sentence-transformers' Dense activation_function (a class path) -> what the layer applies. Dense
# writes torch.nn.modules.activation.Tanh by default; PyLate's Identity.
DENSE_ACTIVATIONS = {"Identity": "identity", "Tanh": "tanh", "ReLU": "relu", "GELU": "gelu", "Sigmoid": "sigmoid"}


@dataclass(frozen=True)
class _LayerLocation:
    files: WeightFiles
    weight: str  # [out, in]
    bias: str | None  # [out]; None: no bias
    activation: str  # a DENSE_ACTIVATIONS value
    where: str  # for messages: the folder or file it was read from


@dataclass
class DenseLayer:
    """One projection layer, float32 on the CPU: activation(x @ weight.T + bias)."""

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None  # [out], or None
    activation: str  # a DENSE_ACTIVATIONS value


@dataclass
class TokenProjection:
    """The layers each token's final hidden state goes through, in order, and where they came from."""

    layers: list[DenseLayer]
    source: str

    @property
    def dim(self) -> int:
        return int(self.layers[-1].weight.shape[0])


def locate_projection(src) -> list[_LayerLocation]:
    """The projection's layers in the HuggingFace directory `src`, checked from headers and
    configs (shapes chain from the encoder's hidden_size). Raises MissingHead for a converted
    directory or a checkpoint without one, naming where it looked; ConversionError for one that is
    there but malformed."""
    src = Path(src)
    if is_converted(src):
        raise MissingHead(converted_message(src, "the token projection encode_multivector needs"))
    _, cfg = read_hf_config(src)
    layers = _dense_modules(src)
    if not layers:
        files = WeightFiles(src)
        have = set(files.names())
        if COLBERT_LINEAR not in have:
            raise MissingHead(
                f"{src}: no token projection for encode_multivector: neither a Dense module in modules.json "
                f"(PyLate / sentence-transformers ColBERT) nor a {COLBERT_LINEAR!r} tensor beside the encoder in "
                f"{files.describe()} (colbert-ir's ColBERT); this is not a ColBERT checkpoint")
        bias = COLBERT_LINEAR_BIAS if COLBERT_LINEAR_BIAS in have else None
        layers = [_LayerLocation(files, COLBERT_LINEAR, bias, "identity", str(files.where(COLBERT_LINEAR)))]
    width = int(cfg["hidden_size"])
    for layer in layers:
        _, shape = layer.files.meta(layer.weight)
        if len(shape) != 2 or shape[1] != width:
            raise ConversionError(f"{layer.files.where(layer.weight)}: tensor {layer.weight!r} has shape "
                                  f"{fmt_shape(shape)}, but the projection's input is {width} wide (expected "
                                  f"[out, {width}])")
        if layer.bias is not None and tuple(layer.files.meta(layer.bias)[1]) != (shape[0],):
            raise ConversionError(f"{layer.files.where(layer.bias)}: tensor {layer.bias!r} has shape "
                                  f"{fmt_shape(layer.files.meta(layer.bias)[1])}, expected [{shape[0]}]")
        for name in filter(None, (layer.weight, layer.bias)):
            dtype = layer.files.meta(name)[0]
            if dtype not in ("float16", "bfloat16", "float32", "float64"):
                raise ConversionError(f"{layer.files.where(name)}: tensor {name!r} has dtype {dtype}, not a float type")
        width = int(shape[0])
    return layers


def read_projection(src) -> TokenProjection:
    """The token projection of the HuggingFace directory `src` (see locate_projection), float32,
    every tensor checked for NaN and infinity."""
    located = locate_projection(src)

    def read(files: WeightFiles, name: str) -> torch.Tensor:
        t = files.get(name).detach().to(device="cpu", dtype=torch.float32, copy=True)
        check_finite(name, t, str(files.where(name)), ConversionError)
        return t

    layers = [DenseLayer(read(x.files, x.weight), None if x.bias is None else read(x.files, x.bias), x.activation)
              for x in located]
    return TokenProjection(layers, ", ".join(x.where for x in located))


def _dense_modules(src: Path) -> list[_LayerLocation]:
    """The Dense modules modules.json lists before any Pooling module (token-level projections),
    in order; [] without modules.json or without such a module."""
    path = src / "modules.json"
    if not path.is_file():
        return []
    modules = read_json(path, ConversionError)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConversionError(f"{path}: expected a list of module objects")
    layers: list[_LayerLocation] = []
    pooled = None
    for m in sorted(modules, key=lambda m: m.get("idx", 0) if isinstance(m.get("idx"), int) else 0):
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            pooled = m.get("path")
        elif kind == "Dense":
            if pooled is not None:
                if layers:
                    break  # the token-level ones came first: a sentence-level Dense after pooling is not ours
                raise MissingHead(
                    f"{src}: no token projection for encode_multivector: modules.json's Dense module "
                    f"{m.get('path')!r} follows the Pooling module {pooled!r}, so it projects the pooled sentence "
                    "embedding, not tokens (a sentence-transformers embedder, not a ColBERT checkpoint)")
            layers.append(_dense_layer(src, path, m))
    return layers


def _dense_layer(src: Path, modules_path: Path, module: dict) -> _LayerLocation:
    rel = module.get("path")
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise ConversionError(f"{modules_path}: a Dense module's path must be a folder inside the checkpoint, "
                              f"got {rel!r}")
    folder = src / rel
    if not folder.is_dir():
        raise MissingHead(f"{src}: modules.json names the Dense module {rel!r}, but the folder {folder} is missing")
    config_path = folder / "config.json"
    config = read_json_object(config_path, ConversionError) if config_path.is_file() else {}
    act_path = config.get("activation_function", "torch.nn.modules.activation.Tanh")  # Dense's default
    activation = DENSE_ACTIVATIONS.get(str(act_path).rsplit(".", 1)[-1])
    if activation is None:
        raise ConversionError(f"{config_path}: activation_function {act_path!r} is not one ftbert applies "
                              f"({', '.join(DENSE_ACTIVATIONS)})")
    files = WeightFiles(folder)
    have = set(files.names())
    if COLBERT_LINEAR not in have:
        raise MissingHead(f"{src}: the Dense module {rel!r} has no {COLBERT_LINEAR!r} tensor in {files.describe()}")
    bias = COLBERT_LINEAR_BIAS if COLBERT_LINEAR_BIAS in have else None
    if config.get("bias", bias is not None) and bias is None:
        raise ConversionError(f"{config_path} says bias true, but {files.describe()} in {folder} has no "
                              f"{COLBERT_LINEAR_BIAS!r}")
    return _LayerLocation(files, COLBERT_LINEAR, bias, activation, str(folder))


# ---- ColBERT's query and document settings ------------------------------------------------------
COLBERT_IR_SETTINGS = "artifact.metadata"
PYLATE_SETTINGS = "config_sentence_transformers.json"
# colbert-ir's ColBERTConfig defaults (TokenizerSettings, DocSettings, QuerySettings), applied to the
# keys an artifact.metadata leaves out.
COLBERT_IR_DEFAULTS = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 32,
                       "doc_maxlen": 220, "attend_to_mask_tokens": False, "mask_punctuation": True}
# PyLate's ColBERT.__init__ defaults for what its config_sentence_transformers.json leaves out.
PYLATE_DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32, "document_length": 180,
                   "do_query_expansion": True, "attend_to_expansion_tokens": False,
                   "skiplist_words": list(string.punctuation)}


@dataclass(frozen=True)
class ColbertSettings:
    """How a ColBERT checkpoint's own implementation prepares queries and documents.

    Each text is tokenized with the special tokens, cut at length - 1 where a marker is inserted
    (after the first token, [CLS]), else at length; a query with `query_expansion` is then padded
    to query_length with the tokenizer's mask token, which the encoder attends to only with
    `attend_to_expansion` (its hidden states are computed and kept either way). A document's
    tokens in the skiplist are dropped from its vectors."""

    layout: str  # "colbert-ir" or "pylate"
    source: str  # the file the settings were read from
    query_marker: str | None  # the token inserted after a query's first token; None: none
    document_marker: str | None
    query_length: int
    document_length: int
    query_expansion: bool
    attend_to_expansion: bool
    skiplist: tuple[str, ...]  # documents' tokens left out of their vectors
    # How a skiplist word becomes an id: colbert-ir takes the first id of the word's tokenization
    # (tok.encode(word, add_special_tokens=False)[0]), PyLate the word looked up as one token
    # (tok.convert_tokens_to_ids(word), the unknown token's id where it is none).
    skiplist_by_first_piece: bool
    strip: bool  # PyLate tokenizes through sentence-transformers' Transformer, which strips each text
    lowercase: bool  # ... and lowercases it where sentence_bert_config.json says do_lower_case


def colbert_layout(src) -> str:
    """Which implementation a ColBERT checkpoint's projection belongs to: "pylate" where modules.json
    names a Dense module for tokens, else "colbert-ir" (its `linear.weight`)."""
    return "pylate" if _dense_modules(Path(src)) else "colbert-ir"


def read_colbert_settings(src) -> tuple[ColbertSettings | None, str]:
    """(settings, "") of the ColBERT checkpoint `src`, or (None, what is missing) where it holds no
    settings file of its layout: artifact.metadata (colbert-ir) or config_sentence_transformers.json
    with query_prefix / document_prefix (PyLate). A settings file that is there but holds a value of
    the wrong kind raises ConversionError naming the file and the key."""
    src = Path(src)
    if colbert_layout(src) == "colbert-ir":
        path = src / COLBERT_IR_SETTINGS
        if not path.is_file():
            return None, (f"{src} has no {COLBERT_IR_SETTINGS} (colbert-ir's settings: query_token_id, doc_token_id, "
                          "query_maxlen, doc_maxlen, attend_to_mask_tokens, mask_punctuation)")
        raw = read_json_object(path, ConversionError)
        # ColBERTConfig.from_path takes the "config" object where the file nests one.
        if isinstance(raw.get("config"), dict):
            raw = raw["config"]
        get = _settings_reader(path, raw, COLBERT_IR_DEFAULTS)
        return ColbertSettings(
            layout="colbert-ir", source=str(path), query_marker=get("query_token_id", str),
            document_marker=get("doc_token_id", str), query_length=get("query_maxlen", int),
            document_length=get("doc_maxlen", int), query_expansion=True,  # colbert-ir always pads queries
            attend_to_expansion=get("attend_to_mask_tokens", bool),
            skiplist=tuple(string.punctuation) if get("mask_punctuation", bool) else (),
            skiplist_by_first_piece=True, strip=False, lowercase=False), ""
    path = src / PYLATE_SETTINGS
    raw = read_json_object(path, ConversionError) if path.is_file() else {}
    if "query_prefix" not in raw and "document_prefix" not in raw:
        return None, (f"{src}: {PYLATE_SETTINGS} {'has no' if path.is_file() else 'is missing, so no'} "
                      "query_prefix / document_prefix (PyLate's settings, with query_length, document_length, "
                      "do_query_expansion, attend_to_expansion_tokens, skiplist_words)")
    get = _settings_reader(path, raw, PYLATE_DEFAULTS)
    expansion = get("do_query_expansion", bool)
    skiplist = get("skiplist_words", list)
    if not all(isinstance(w, str) for w in skiplist):
        raise ConversionError(f"{path}: skiplist_words must be a list of strings")
    st_config = src / "sentence_bert_config.json"
    lowercase = read_json_object(st_config, ConversionError).get("do_lower_case") if st_config.is_file() else False
    return ColbertSettings(
        layout="pylate", source=str(path),
        # PyLate inserts no marker for an empty prefix.
        query_marker=get("query_prefix", str) or None, document_marker=get("document_prefix", str) or None,
        query_length=get("query_length", int), document_length=get("document_length", int),
        query_expansion=expansion,
        # PyLate attends to no expansion token where it expands none.
        attend_to_expansion=expansion and get("attend_to_expansion_tokens", bool),
        skiplist=tuple(skiplist), skiplist_by_first_piece=False, strip=True, lowercase=bool(lowercase)), ""


def _settings_reader(path: Path, raw: dict, defaults: dict):
    """get(key, kind): raw[key] checked to be of `kind` (a positive int for int), the default where
    the key is absent or null (PyLate reads null as not set; colbert-ir would fail on it)."""

    def get(key: str, kind: type):
        value = raw.get(key)
        if value is None:
            return defaults[key]
        ok = isinstance(value, kind) and not (kind is int and (isinstance(value, bool) or value < 1))
        if not ok:
            want = {int: "a positive integer", bool: "true or false", str: "a string", list: "a list"}[kind]
            raise ConversionError(f"{path}: {key} must be {want}, got {value!r}")
        return value

    return get
