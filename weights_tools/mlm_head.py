"""The masked-LM head of a *ForMaskedLM checkpoint, read for `Encoder.encode_sparse` (SPLADE).

The converter leaves this head out (hf.py warns that it "is not supported and is left out"), and a
converted directory never holds it; encode_sparse reads it from the HuggingFace directory itself,
with the same weight readers (hf.WeightFiles: safetensors, sharded or not, and weights-only .bin).

What the head computes, as transformers' classes do (BertLMPredictionHead, RobertaLMHead,
DistilBertForMaskedLM, ElectraGeneratorPredictions + generator_lm_head, MPNetLMHead,
ModernBertPredictionHead + decoder):

    logits [T, V] = decoder(LayerNorm(act(dense(hidden [T, H])))) + bias

with the decoder tied to the word embeddings where the checkpoint leaves its weight out (what
transformers saves by default). Each family's names are one MlmHeadNames entry of MLM_HEADS.

    locate_mlm_head(dir)  where the head's tensors are, from the file headers alone (raises
                          MissingHead naming what is missing)
    read_mlm_head(dir)    MlmHead: its tensors in float32, checked (shapes, finite values)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ConversionError
from .families import Family
from .hf import WeightFiles, read_hf_config
from .jsonfile import read_json_object
from .layout import check_finite, fmt_shape
from .reader import is_converted


class MissingHead(ConversionError):
    """A checkpoint directory without the head an output needs (encode_sparse's masked-LM head,
    encode_multivector's projection); the message names the directory and what is missing."""


# The activations a head's transform may name (transformers' ACT2FN names), as torch computes them.
HEAD_ACTIVATIONS = ("gelu", "gelu_python", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "quick_gelu",
                    "relu", "silu", "swish", "tanh")


@dataclass(frozen=True)
class MlmHeadNames:
    """Where one family's masked-LM head lives in its *ForMaskedLM checkpoints (names as saved) and
    what its transform computes."""

    dense: str  # the transform's Linear [E, H]: "<dense>.weight", "<dense>.bias"
    norm: str  # its LayerNorm [E]: "<norm>.weight", "<norm>.bias" (or the legacy gamma / beta)
    decoder: str  # the decoder weight [V, E]; absent: tied to the word embeddings
    # The vocabulary bias [V]: the first of these names the checkpoint has. The decoder's own first:
    # transformers 4 ties it to the head's `bias` (both saved, equal), transformers 5 unties the two
    # along with an untied decoder weight, and the decoder's is the one its forward adds.
    biases: tuple[str, ...]
    # The transform's activation: fixed by the class (RoBERTa's lm_head always runs gelu), or read
    # from config.json's activation_key (default activation_default).
    activation: str | None
    activation_key: str | None = None
    activation_default: str = "gelu"
    eps_key: str | None = "layer_norm_eps"  # None: eps_default, fixed in the class
    eps_default: float = 1e-12
    # Biases the class makes optional (ModernBERT's classifier_bias, norm_bias, decoder_bias): a
    # missing one is zeros. Elsewhere a missing bias is an error.
    optional_biases: bool = False


_ROBERTA_HEAD = MlmHeadNames(dense="lm_head.dense", norm="lm_head.layer_norm", decoder="lm_head.decoder.weight",
                             biases=("lm_head.decoder.bias", "lm_head.bias"), activation="gelu")

# By family name (families.FAMILIES).
MLM_HEADS: dict[str, MlmHeadNames] = {
    "bert": MlmHeadNames(dense="cls.predictions.transform.dense", norm="cls.predictions.transform.LayerNorm",
                         decoder="cls.predictions.decoder.weight",
                         biases=("cls.predictions.decoder.bias", "cls.predictions.bias"),
                         activation=None, activation_key="hidden_act"),
    "roberta": _ROBERTA_HEAD,
    "xlm-roberta": _ROBERTA_HEAD,
    "camembert": _ROBERTA_HEAD,
    "mpnet": _ROBERTA_HEAD,
    "distilbert": MlmHeadNames(dense="vocab_transform", norm="vocab_layer_norm", decoder="vocab_projector.weight",
                               biases=("vocab_projector.bias",), activation=None, activation_key="activation",
                               eps_key=None),
    # ElectraForMaskedLM (the generator): dense [E, H] to the embedding width, then tied [V, E].
    "electra": MlmHeadNames(dense="generator_predictions.dense", norm="generator_predictions.LayerNorm",
                            decoder="generator_lm_head.weight", biases=("generator_lm_head.bias",),
                            activation="gelu"),
    "modernbert": MlmHeadNames(dense="head.dense", norm="head.norm", decoder="decoder.weight", biases=("decoder.bias",),
                               activation=None, activation_key="classifier_activation", eps_key="norm_eps",
                               eps_default=1e-5, optional_biases=True),
}


@dataclass(frozen=True)
class MlmHeadLocation:
    """The head's tensors by role -> their names in the checkpoint (None: zeros, a bias the model
    leaves out), with its sizes and settings; from the headers only."""

    files: WeightFiles
    names: dict[str, str | None]  # dense_weight, dense_bias, norm_weight, norm_bias, decoder_weight, decoder_bias
    hidden: int  # H: the encoder's width
    width: int  # E: the transform's
    vocab: int  # V
    activation: str
    eps: float
    tied: bool  # the decoder weight is the word embeddings'


@dataclass
class MlmHead:
    """A masked-LM head's tensors, float32 on the CPU."""

    dense_weight: torch.Tensor  # [E, H]
    dense_bias: torch.Tensor  # [E]
    norm_weight: torch.Tensor  # [E]
    norm_bias: torch.Tensor  # [E]
    decoder_weight: torch.Tensor  # [V, E]
    decoder_bias: torch.Tensor  # [V]
    activation: str  # one of HEAD_ACTIVATIONS
    eps: float  # the LayerNorm's
    tied: bool  # the decoder weight was the word embeddings'

    @property
    def vocab_size(self) -> int:
        return int(self.decoder_weight.shape[0])


def converted_message(src: Path, what: str) -> str:
    """Why a converted directory cannot give `what`: conversion keeps the encoder (and a
    classification head) only."""
    return (f"{src} is an ftbert-converted directory, which holds the encoder only (ftbert convert leaves "
            f"{what} out): load the HuggingFace checkpoint directory it was converted from instead")


def locate_mlm_head(src) -> MlmHeadLocation:
    """Where the masked-LM head's tensors are in the HuggingFace directory `src`, checked from the
    weight files' headers (names, shapes, dtypes) and config.json. Raises MissingHead for a converted
    directory, a family without a head this module knows, or a checkpoint without the head
    (a bare encoder, a classifier), naming the tensor that is missing; ConversionError for a head that
    is there but malformed."""
    src = Path(src)
    what = "the masked-LM head encode_sparse needs"
    if is_converted(src):
        raise MissingHead(converted_message(src, what))
    family, cfg = read_hf_config(src)
    spec = MLM_HEADS.get(family.name)
    if spec is None:
        raise MissingHead(f"{src}: model_type {family.name!r} has no masked-LM head ftbert reads for encode_sparse "
                          f"(it reads those of {', '.join(MLM_HEADS)})")
    raw = read_json_object(src / "config.json", ConversionError)
    files = WeightFiles(src)
    have = set(files.names())
    arch = _architecture(raw)

    def missing(name: str) -> MissingHead:
        return MissingHead(
            f"{src}: no masked-LM head for encode_sparse: tensor {name!r} is missing from {files.describe()} "
            f"(config.json names {arch or 'no architecture'}); encode_sparse needs a *ForMaskedLM checkpoint "
            "with its head, as SPLADE models are")

    def first(*names: str) -> str | None:
        return next((n for n in names if n in have), None)

    names: dict[str, str | None] = {
        "dense_weight": first(spec.dense + ".weight"),
        "dense_bias": first(spec.dense + ".bias"),
        "norm_weight": first(spec.norm + ".weight", spec.norm + ".gamma"),
        "norm_bias": first(spec.norm + ".bias", spec.norm + ".beta"),
        "decoder_weight": first(spec.decoder),
        "decoder_bias": first(*spec.biases),
    }
    for role, name in (("dense_weight", spec.dense + ".weight"), ("norm_weight", spec.norm + ".weight")):
        if names[role] is None:
            raise missing(name)
    for role, name in (("dense_bias", spec.dense + ".bias"), ("norm_bias", spec.norm + ".bias"),
                       ("decoder_bias", spec.biases[-1])):
        if names[role] is None and not spec.optional_biases:
            raise missing(name)
    tied = names["decoder_weight"] is None
    if tied:
        if raw.get("tie_word_embeddings", True) is False:
            raise missing(spec.decoder)  # untied, so the checkpoint must hold its own decoder
        names["decoder_weight"] = _word_embeddings(family, have)
        if names["decoder_weight"] is None:
            raise missing(spec.decoder)
    hidden, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    dense_shape = files.meta(names["dense_weight"])[1]
    if len(dense_shape) != 2:
        raise ConversionError(f"{files.where(names['dense_weight'])}: tensor {names['dense_weight']!r} has shape "
                              f"{fmt_shape(dense_shape)}, but the masked-LM head's dense weight is a matrix")
    width = int(dense_shape[0])  # E: hidden_size, or ELECTRA's embedding_size
    want = {"dense_weight": (width, hidden), "dense_bias": (width,), "norm_weight": (width,), "norm_bias": (width,),
            "decoder_weight": (vocab, width), "decoder_bias": (vocab,)}
    for role, name in names.items():
        if name is None:
            continue
        dtype, shape = files.meta(name)
        if tuple(shape) != want[role]:
            raise ConversionError(f"{files.where(name)}: tensor {name!r} has shape {fmt_shape(shape)}, but the "
                                  f"masked-LM head needs {fmt_shape(want[role])} (hidden_size {hidden}, vocab_size "
                                  f"{vocab} in config.json)")
        if dtype not in ("float16", "bfloat16", "float32", "float64"):
            raise ConversionError(f"{files.where(name)}: tensor {name!r} has dtype {dtype}, not a float type")
    activation = spec.activation or raw.get(spec.activation_key, spec.activation_default)
    if activation not in HEAD_ACTIVATIONS:
        raise ConversionError(f"{src / 'config.json'}: {spec.activation_key} {activation!r} is not an activation "
                              f"ftbert runs in the masked-LM head ({', '.join(HEAD_ACTIVATIONS)})")
    eps = spec.eps_default if spec.eps_key is None else raw.get(spec.eps_key, spec.eps_default)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ConversionError(f"{src / 'config.json'}: {spec.eps_key} must be a positive number, got {eps!r}")
    return MlmHeadLocation(files=files, names=names, hidden=hidden, width=width, vocab=vocab,
                           activation=activation, eps=float(eps), tied=tied)


def read_mlm_head(src) -> MlmHead:
    """The masked-LM head of the HuggingFace directory `src` (see locate_mlm_head), float32,
    every tensor checked for NaN and infinity."""
    loc = locate_mlm_head(src)

    def read(role: str) -> torch.Tensor:
        name = loc.names[role]
        if name is None:  # a bias the model leaves out
            return torch.zeros(loc.vocab if role == "decoder_bias" else loc.width)
        t = loc.files.get(name).detach().to(device="cpu", dtype=torch.float32, copy=True)
        check_finite(name, t, str(loc.files.where(name)), ConversionError)
        return t

    return MlmHead(**{role: read(role) for role in loc.names}, activation=loc.activation, eps=loc.eps,
                   tied=loc.tied)


def _word_embeddings(family: Family, have: set[str]) -> str | None:
    """The name of the word-embedding table in a checkpoint (the tied decoder's weight)."""
    table = family.weights.embeddings["embeddings.word"]
    return next((p + table for p in (*family.weights.prefixes, "") if p + table in have), None)


def _architecture(raw: dict) -> str | None:
    archs = raw.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
