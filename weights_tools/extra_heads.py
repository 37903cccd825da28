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
"""

from __future__ import annotations

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
