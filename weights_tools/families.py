"""The HuggingFace model families the converter reads, one table each.

A family is data: which `model_type` values it serves, how its config.json keys map onto the engine's
config keys (with the defaults of its transformers config class), and where each engine tensor comes
from in its checkpoints. hf.py reads every checkpoint through this table and the bench / tests build
their names from it, so a family's weight names are spelled here and nowhere else.

Engine-side names ("embeddings.word", "layers.{i}.qkv_weight", ...) are the converted format's own,
defined in layout.py; the tables below map each of them to HuggingFace names.

Heads: each family names the tensors of its sequence- and token-classification heads
(*ForSequenceClassification, *ForTokenClassification); hf.py picks one by config.json's
`architectures`.

Filled in: BERT, RoBERTa with its two descendants XLM-RoBERTa and CamemBERT (RoBERTa's table,
copied for the other two with their own model_type and their config class's vocab_size default),
DistilBERT (other config keys, other weight names, no token types, no pooler), and ELECTRA's
discriminator (BERT's names under "electra.", embeddings of embedding_size projected to hidden_size
by `embeddings_project`, no pooler), and MPNet (its own architecture unit: BERT's layers plus a
relative position bias table), and ModernBERT (its own unit: pre-LayerNorm, rotary, gated MLP,
sliding windows; its heads with a norm of their own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .._native import _C
from .layout import (
    ABSOLUTE,
    DISENTANGLED,
    EMBEDDING_SIZE,
    FINAL_NORM_TENSORS,
    HEAD_ACTIVATIONS,
    HEAD_DENSE_TENSORS,
    HEAD_NORM_TENSORS,
    HEAD_OUT_TENSORS,
    HEAD_TENSORS,
    INT_KEYS,
    LAYER,
    PADDING_OFFSET,
    PROJECTION_TENSORS,
    POSITION_SCHEMES,
    RELATIVE_BIAS_TENSORS,
    RELATIVE_BUCKETS,
    SEQUENCE_CLASSIFICATION,
    check_format,
)

# Position-id schemes (the engine config's "position_ids"; layout.POSITION_SCHEMES). ABSOLUTE: token
# t sits at position t, padding or not (BERT, DistilBERT, ELECTRA). PADDING_OFFSET: a token whose id
# is not pad_token_id sits at pad_token_id + (the number of such tokens up to and including it), a
# pad token at pad_token_id (RoBERTa and its descendants; transformers'
# create_position_ids_from_input_ids), so a model's usable length is
# max_position_embeddings - pad_token_id - 1 (layout.usable_seq_length). Defined in layout.py, which
# the converted reader shares; re-exported here as the tables' vocabulary.
__all__ = ["ABSOLUTE", "PADDING_OFFSET", "Key", "Projection", "WeightNames", "SequenceHead", "TokenHead",
           "Family", "FAMILIES",
           "BERT", "ROBERTA", "XLM_ROBERTA", "CAMEMBERT", "DISTILBERT", "ELECTRA", "MPNET", "MODERNBERT", "NOMIC_BERT", "GTE",
           "JINA_EMBEDDINGS_V3", "EUROBERT", "DEBERTA_V2", "Part", "KVHeads", "TaskAdapters", "family_for", "family_for_config",
           "supported_model_types", "check_engine_config"]


@dataclass(frozen=True)
class Key:
    """Where one engine config value comes from."""

    hf: str | None  # the config.json key; None where the family fixes the value (DistilBERT's eps)
    default: Any  # what the family's transformers config class uses when config.json leaves it out
    # Other config.json keys the config class maps onto this one (its attribute_map: DistilBERT's
    # hidden_size -> dim), or the original code's names for it (NomicBERT's n_embd); where present
    # they win over `hf`, as in transformers.
    aliases: tuple[str, ...] = ()
    # Values of those keys that mean another of the engine's (NomicBERT's original
    # activation_function "swiglu": its gated MLP's "silu").
    values: Mapping[Any, Any] = field(default_factory=lambda: MappingProxyType({}))

    def read(self, raw: Mapping[str, Any]) -> Any:
        """The value a config.json dict gives this key."""
        if self.hf is None:
            return self.default
        for name in (*self.aliases, self.hf):
            if name in raw:
                v = raw[name]
                return self.values.get(v, v) if isinstance(v, str) else v
        return self.default


@dataclass(frozen=True)
class Projection:
    """A Linear between the embeddings and the first layer, for embeddings narrower than hidden_size
    (ELECTRA's `embeddings_project`, present only when embedding_size != hidden_size, as in
    transformers). The engine's embeddings.project_weight [E, H] is the transpose of `weight`."""

    size: Key  # the embedding width's config key (ELECTRA: embedding_size, default 128)
    weight: str  # HF name of its [hidden, embedding] weight
    bias: str

    def hf_names(self) -> Mapping[str, str]:
        """Engine projection tensor (layout.PROJECTION_TENSORS) -> HF name."""
        return MappingProxyType(dict(zip(PROJECTION_TENSORS, (self.weight, self.bias))))


@dataclass(frozen=True)
class SequenceHead:
    """A sequence-classification head (the family's *ForSequenceClassification), read from token 0:
    `dense` + `activation`, then `out` (num_labels wide). BERT's dense is its pooler (dense None: the
    classifier reads the pooler output); the others have a dense of their own in the head."""

    # HF (weight, bias) of the head's own dense; None: the pooler. A bias of None: the dense has
    # none (the converter supplies zeros).
    dense: tuple[str, str | None] | None
    activation: str | None  # after the own dense (layout.HEAD_ACTIVATIONS); None with the pooler
    out: tuple[str, str]  # HF (weight, bias) of the [num_labels, hidden] output Linear
    norm: str | None = None  # HF name of a bias-free LayerNorm's weight after the activation
    # The config.json key that chooses where the own dense reads (ModernBERT's and EuroBERT's
    # classifier_pooling; None: always token 0), and its values that read elsewhere than token 0
    # -> the engine head's input: "mean" (the mean of the sequence's tokens), "late_mean" (the
    # dense and activation on every token, then their mean: EuroBERT's "late").
    pooling_key: str | None = None
    pooling_inputs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({"mean": "mean"}))

    def hf_names(self) -> Mapping[str, str | None]:
        """Engine head tensor (layout.HEAD_TENSORS) -> HF name (None: zeros)."""
        names = dict(zip(HEAD_OUT_TENSORS, self.out))
        if self.dense is not None:
            names.update(zip(HEAD_DENSE_TENSORS, self.dense))
        if self.norm is not None:
            names[HEAD_NORM_TENSORS[0]] = self.norm
        return MappingProxyType(names)


@dataclass(frozen=True)
class TokenHead:
    """A token-classification head (*ForTokenClassification): one Linear on every token, after (where
    `dense` is given: ModernBERT) a dense, its activation and a norm of its own on every token."""

    out: tuple[str, str]  # HF (weight, bias) of the [num_labels, hidden] Linear
    dense: tuple[str, str | None] | None = None  # as SequenceHead's
    activation: str | None = None
    norm: str | None = None

    def hf_names(self) -> Mapping[str, str | None]:
        names = dict(zip(HEAD_OUT_TENSORS, self.out))
        if self.dense is not None:
            names.update(zip(HEAD_DENSE_TENSORS, self.dense))
        if self.norm is not None:
            names[HEAD_NORM_TENSORS[0]] = self.norm
        return MappingProxyType(names)


@dataclass(frozen=True)
class Part:
    """Block `index` of `of` equal blocks along dim 0 of the HF tensor `name`: one fused tensor that
    feeds the engine in another order (GTE's up_gate_proj [up | gate] -> the engine's [gate | up])."""

    name: str
    index: int
    of: int

    def __radd__(self, prefix: str) -> "Part":
        return Part(prefix + self.name, self.index, self.of)


@dataclass(frozen=True)
class TaskAdapters:
    """Per-task LoRA adapters saved beside the weights, as Jina-embeddings-v3's original code
    (modeling_lora.py of jinaai/xlm-roberta-flash-implementation) saves them: every Linear and
    Embedding weight of the encoder is a torch parametrization, saved as `<module>` + `original`
    (the weight itself: the parametrization's forward returns it unchanged) beside `<module>` +
    `lora_a` / `lora_b`, which hold one slice per task along dim 0, in the order of config.json's
    `tasks_key` list. Task t's weight, scaling = alpha / rank (LoRAParametrization.lora_forward):
    a Linear's W [out, in] + scaling * B[t] [out, r] @ A[t] [r, in]; an Embedding's (stored
    fan_in_fan_out, its A and B swapped) W [rows, dim] + scaling * A[t] [rows, r] @ B[t] [r, dim]."""

    original: str  # name ending of a parametrized weight (the module's "weight" otherwise)
    lora_a: str  # name endings of the adapters
    lora_b: str
    tasks_key: str  # config.json's list of task names
    rank: Key
    alpha: Key

    def split(self, name: str) -> tuple[str, str] | None:
        """(the weight's plain name, "original" / "lora_a" / "lora_b") for a parametrization
        tensor's name, None for any other name."""
        for part in ("original", "lora_a", "lora_b"):
            ending = getattr(self, part)
            if name.endswith(ending):
                return name[: -len(ending)] + ".weight", part
        return None


@dataclass(frozen=True)
class KVHeads:
    """An HF K or V projection of grouped heads (config.json's num_key_value_heads below
    num_attention_heads): each of its heads repeated for the query heads that read it, as
    transformers' repeat_kv does (query head h reads K/V head h // (heads / kv_heads)). The engine
    then runs one K/V head per query head: the same function, with the K/V GEMMs that much wider."""

    name: str

    def __radd__(self, prefix: str) -> "KVHeads":
        return KVHeads(prefix + self.name)


@dataclass(frozen=True)
class WeightNames:
    """Engine tensor -> HuggingFace tensor name(s), names as the bare encoder model stores them."""

    # Prefixes the task models (ForMaskedLM, ForSequenceClassification, ...) put before the encoder.
    prefixes: tuple[str, ...]
    # Engine embedding tensor -> HF name.
    embeddings: Mapping[str, str]
    # What precedes every per-layer name; {i} is the layer index.
    layer_prefix: str
    # Engine per-layer tensor (cpp/core/weights.cpp's table) -> HF name(s) after layer_prefix. Several names are
    # fused in order, stacked on the output dimension (Q | K | V). None: a bias the family does not
    # have (the converter supplies zeros).
    layer: Mapping[str, str | tuple[str, ...]]
    # Engine pooler tensor -> HF name; absent from a checkpoint whose task model has no pooler.
    pooler: Mapping[str, str]
    # Buffers the encoder saves beside its weights; not weights, never converted.
    buffers: tuple[str, ...] = ()
    # Old spellings still found in checkpoints: name ending -> today's ending.
    legacy_suffixes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Engine tensors of the model beyond the embeddings and the pooler -> HF name: MPNet's relative
    # position bias table (layout.RELATIVE_BIAS_TENSORS), ModernBERT's final norm
    # (layout.FINAL_NORM_TENSORS).
    model: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def hf_names(self, engine_name: str) -> tuple[str, ...]:
        """The HF tensor(s) an engine tensor is made of, unprefixed, in fusing order."""
        if engine_name in self.embeddings:
            return (self.embeddings[engine_name],)
        if engine_name in self.model:
            return (self.model[engine_name],)
        if engine_name in self.pooler:
            return (self.pooler[engine_name],)
        _, index, suffix = engine_name.split(".", 2)  # "layers.{i}.{suffix}"
        names = self.layer[suffix]
        if names is None:  # a bias the family does not have: zeros
            return (None,)
        prefix = self.layer_prefix.format(i=int(index))
        return tuple(prefix + n for n in ((names,) if isinstance(names, str) else names))

    def roots(self) -> frozenset[str]:
        """The first name components of the encoder's tensors ("embeddings", "encoder", "pooler"):
        what a checkpoint holds outside them belongs to a task head."""
        names = [*self.embeddings.values(), self.layer_prefix, *self.pooler.values(), *self.buffers,
                 *self.model.values()]
        return frozenset(n.split(".", 1)[0] for n in names)


@dataclass(frozen=True)
class Family:
    """Everything the converter needs to know about one family's HuggingFace checkpoints."""

    name: str
    model_types: tuple[str, ...]  # config.json model_type values this table reads
    # The engine's architecture unit that runs the family (cpp/core/models/<architecture>.cpp;
    # ftbert._C.architectures() lists those of a build).
    architecture: str
    # Engine config key -> its source. The engine keys are layout.INT_KEYS, layer_norm_eps,
    # hidden_act and pad_token_id; the order is the order they are read and checked in.
    config: Mapping[str, Key]
    # config.json keys whose other values change what the model computes in ways the engine does not
    # implement -> the values accepted, the first being the default (relative positions, say).
    accepted_values: Mapping[str, tuple[Any, ...]]
    weights: WeightNames
    position_ids: str  # ABSOLUTE or PADDING_OFFSET: the engine config's "position_ids"
    # Whether the model adds a token-type embedding. Without one (DistilBERT) the table names no
    # token-type tensor, type_vocab_size is fixed at 1, and the converter supplies a zero [1, H] table:
    # adding it changes nothing, and token type ids other than 0 fail the engine's input check.
    token_types: bool
    projection: Projection | None  # embeddings -> hidden projection (ELECTRA), None without one
    # The task heads conversion runs, by the architectures suffix config.json names them with; None
    # where the engine runs none of the family's (its task checkpoints load their encoder only).
    sequence_head: SequenceHead | None
    token_head: TokenHead | None
    # The engine config's "layer" (layout.LAYER) from a config.json dict, for a family whose layer is
    # not BERT's post-LayerNorm one (ModernBERT); raises ValueError naming a setting the engine does
    # not run. None: BERT's layer.
    derive_layer: Callable[[Mapping[str, Any]], dict] | None = None
    # As accepted_values, checked only when a head is converted (settings of the task model alone:
    # ModernBERT's classifier_pooling, which bare checkpoints carry too).
    head_accepted_values: Mapping[str, tuple[Any, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # Per-task LoRA adapters its checkpoints may hold (Jina-embeddings-v3's original code), merged
    # for the task named at load; None: the family has none.
    adapters: TaskAdapters | None = None
    # The engine config's "disentangled" (layout.DISENTANGLED) from a config.json dict, for a family
    # with DeBERTa's disentangled attention; raises ValueError naming a setting the engine does not
    # run. None: the family has none.
    derive_disentangled: Callable[[Mapping[str, Any]], dict] | None = None
    # config.json files of another model_type that are this family's: (model_type, the values of
    # other keys that tell them apart), such as the original Jina code's "xlm-roberta" with
    # position_embedding_type "rotary". family_for_config looks at these before model_type alone.
    original_configs: tuple[tuple[str, Mapping[str, Any]], ...] = ()

    @property
    def relative_bias(self) -> bool:
        """Whether the family's attention adds a relative position bias (its engine config then has
        relative_attention_num_buckets > 0)."""
        return RELATIVE_BIAS_TENSORS[0] in self.weights.model

    def head(self, kind: str) -> SequenceHead | TokenHead | None:
        """The head of a kind (layout.HEAD_KINDS)."""
        return self.sequence_head if kind == SEQUENCE_CLASSIFICATION else self.token_head

    def hf_names(self, engine_name: str, head: str | None = None) -> tuple[str, ...]:
        """The HF tensor(s) an engine tensor is made of, unprefixed, in fusing order: the weight
        table's, the projection's for embeddings.project_*, and the head's (of kind `head`) for
        classifier.*."""
        if self.projection is not None and engine_name in PROJECTION_TENSORS:
            return (self.projection.hf_names()[engine_name],)
        if engine_name in HEAD_TENSORS:
            if head is None:
                raise KeyError(f"{engine_name} belongs to a head: name its kind")
            return (self.head(head).hf_names()[engine_name],)
        return self.weights.hf_names(engine_name)

    def roots(self) -> frozenset[str]:
        """The first name components of the encoder's tensors (WeightNames.roots, and the
        projection's: ELECTRA's "embeddings_project")."""
        extra = () if self.projection is None else (self.projection.weight, self.projection.bias)
        return self.weights.roots() | {n.split(".", 1)[0] for n in extra}

    def embedding_size(self, raw: Mapping[str, Any], hidden_size: int) -> Any:
        """The embedding width a config.json dict gives (the engine's "embedding_size"): the
        projection's key, or hidden_size in a family without one."""
        return hidden_size if self.projection is None else self.projection.size.read(raw)


def _frozen(d: dict) -> Mapping:
    return MappingProxyType(d)


BERT = Family(
    name="bert",
    model_types=("bert",),
    architecture="bert",
    # BertConfig's defaults (BERT-base).
    config=_frozen({
        "vocab_size": Key("vocab_size", 30522),
        "hidden_size": Key("hidden_size", 768),
        "num_hidden_layers": Key("num_hidden_layers", 12),
        "num_attention_heads": Key("num_attention_heads", 12),
        "intermediate_size": Key("intermediate_size", 3072),
        "max_position_embeddings": Key("max_position_embeddings", 512),
        "type_vocab_size": Key("type_vocab_size", 2),
        "layer_norm_eps": Key("layer_norm_eps", 1e-12),
        "hidden_act": Key("hidden_act", "gelu"),
        # Unused by ABSOLUTE positions; recorded all the same (see hf.read_hf_config).
        "pad_token_id": Key("pad_token_id", 0),
    }),
    # Relative position embeddings change attention itself; converting would silently mis-compute.
    # A decoder (is_decoder) attends causally: the engine's attention is bidirectional only.
    accepted_values=_frozen({"position_embedding_type": ("absolute",), "is_decoder": (False,)}),
    weights=WeightNames(
        prefixes=("bert.",),
        embeddings=_frozen({
            "embeddings.word": "embeddings.word_embeddings.weight",
            "embeddings.position": "embeddings.position_embeddings.weight",
            "embeddings.token_type": "embeddings.token_type_embeddings.weight",
            "embeddings.ln_gamma": "embeddings.LayerNorm.weight",
            "embeddings.ln_beta": "embeddings.LayerNorm.bias",
        }),
        layer_prefix="encoder.layer.{i}.",
        layer=_frozen({
            "qkv_weight": (
                "attention.self.query.weight",
                "attention.self.key.weight",
                "attention.self.value.weight",
            ),
            "qkv_bias": ("attention.self.query.bias", "attention.self.key.bias", "attention.self.value.bias"),
            "attn_out_weight": "attention.output.dense.weight",
            "attn_out_bias": "attention.output.dense.bias",
            "attn_ln_gamma": "attention.output.LayerNorm.weight",
            "attn_ln_beta": "attention.output.LayerNorm.bias",
            "ffn_in_weight": "intermediate.dense.weight",
            "ffn_in_bias": "intermediate.dense.bias",
            "ffn_out_weight": "output.dense.weight",
            "ffn_out_bias": "output.dense.bias",
            "ffn_ln_gamma": "output.LayerNorm.weight",
            "ffn_ln_beta": "output.LayerNorm.bias",
        }),
        pooler=_frozen({"pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}),
        buffers=("embeddings.position_ids", "embeddings.token_type_ids"),
        # TensorFlow-era checkpoints name LayerNorm's parameters gamma and beta.
        legacy_suffixes=_frozen({"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}),
    ),
    position_ids=ABSOLUTE,
    token_types=True,
    projection=None,
    sequence_head=SequenceHead(dense=None, activation=None, out=("classifier.weight", "classifier.bias")),
    token_head=TokenHead(out=("classifier.weight", "classifier.bias")),
)

# RoBERTa: BERT's encoder under BERT's weight names, with other defaults, the prefix "roberta." in its
# task models, and position ids that count from the pad id. Its checkpoints hold a one-row
# token-type table (type_vocab_size 1), taken as it is. RobertaModel has a pooler unless built with
# add_pooling_layer=False, as every task model but ForMultipleChoice is; its classification heads
# read token 0 without one.
ROBERTA = Family(
    name="roberta",
    model_types=("roberta",),
    architecture="bert",
    # RobertaConfig's defaults: the class's, not roberta-base's config.json (which sets
    # max_position_embeddings 514, type_vocab_size 1, layer_norm_eps 1e-5): a key left out of
    # config.json means what transformers makes of it.
    config=_frozen({
        **BERT.config,
        "vocab_size": Key("vocab_size", 50265),
        "pad_token_id": Key("pad_token_id", 1),
    }),
    accepted_values=BERT.accepted_values,
    weights=replace(BERT.weights, prefixes=("roberta.",)),
    position_ids=PADDING_OFFSET,
    token_types=True,
    projection=None,
    # RobertaClassificationHead: dense, tanh, out_proj on token 0 (<s>).
    sequence_head=SequenceHead(
        dense=("classifier.dense.weight", "classifier.dense.bias"),
        activation="tanh",
        out=("classifier.out_proj.weight", "classifier.out_proj.bias"),
    ),
    token_head=BERT.token_head,
)

# XLMRobertaConfig and CamembertConfig keep BertConfig's vocab_size default (30522); everything else
# is RoBERTa's, including the "roberta." prefix of their task models (base_model_prefix).
def _roberta_with_bert_vocab(name: str) -> Family:
    return replace(ROBERTA, name=name, model_types=(name,),
                   config=_frozen({**ROBERTA.config, "vocab_size": Key("vocab_size", 30522)}))


XLM_ROBERTA = _roberta_with_bert_vocab("xlm-roberta")
CAMEMBERT = _roberta_with_bert_vocab("camembert")

# DistilBERT: BERT's post-LayerNorm encoder under other config keys (dim, n_layers, n_heads,
# hidden_dim, activation) and other weight names, with no token-type embedding and no pooler.
# LayerNorm eps is fixed at 1e-12 in the modules (no config key). Positions are absolute, 0..S-1,
# whatever the padding. `sinusoidal_pos_embds` only changes how transformers initialises the position
# table: the table is an ordinary parameter, saved in the checkpoint, and read from it like a learned
# one. Task models (ForMaskedLM, ForSequenceClassification, ...) keep the encoder under "distilbert.";
# their classification heads are the table's; the others (vocab_*, qa_outputs) are left out.
DISTILBERT = Family(
    name="distilbert",
    model_types=("distilbert",),
    architecture="bert",
    # DistilBertConfig's defaults (distilbert-base).
    config=_frozen({
        "vocab_size": Key("vocab_size", 30522),
        "hidden_size": Key("dim", 768, aliases=("hidden_size",)),
        "num_hidden_layers": Key("n_layers", 6, aliases=("num_hidden_layers",)),
        "num_attention_heads": Key("n_heads", 12, aliases=("num_attention_heads",)),
        "intermediate_size": Key("hidden_dim", 4 * 768),
        "max_position_embeddings": Key("max_position_embeddings", 512),
        "type_vocab_size": Key(None, 1),  # no token-type embedding: the converter's zero row
        "layer_norm_eps": Key(None, 1e-12),  # nn.LayerNorm(dim, eps=1e-12) in every module
        "hidden_act": Key("activation", "gelu"),
        # Unused by ABSOLUTE positions; recorded all the same (see hf.read_hf_config).
        "pad_token_id": Key("pad_token_id", 0),
    }),
    # Attention is always bidirectional (DistilBertConfig has no decoder mode); positions always
    # absolute. Nothing in config.json changes the computation beyond the keys above.
    accepted_values=_frozen({}),
    weights=WeightNames(
        prefixes=("distilbert.",),
        embeddings=_frozen({
            "embeddings.word": "embeddings.word_embeddings.weight",
            "embeddings.position": "embeddings.position_embeddings.weight",
            "embeddings.ln_gamma": "embeddings.LayerNorm.weight",
            "embeddings.ln_beta": "embeddings.LayerNorm.bias",
        }),
        layer_prefix="transformer.layer.{i}.",
        layer=_frozen({
            "qkv_weight": ("attention.q_lin.weight", "attention.k_lin.weight", "attention.v_lin.weight"),
            "qkv_bias": ("attention.q_lin.bias", "attention.k_lin.bias", "attention.v_lin.bias"),
            "attn_out_weight": "attention.out_lin.weight",
            "attn_out_bias": "attention.out_lin.bias",
            "attn_ln_gamma": "sa_layer_norm.weight",
            "attn_ln_beta": "sa_layer_norm.bias",
            "ffn_in_weight": "ffn.lin1.weight",
            "ffn_in_bias": "ffn.lin1.bias",
            "ffn_out_weight": "ffn.lin2.weight",
            "ffn_out_bias": "ffn.lin2.bias",
            "ffn_ln_gamma": "output_layer_norm.weight",
            "ffn_ln_beta": "output_layer_norm.bias",
        }),
        pooler=_frozen({}),
        # Not persistent in today's transformers; older checkpoints saved it.
        buffers=("embeddings.position_ids",),
    ),
    position_ids=ABSOLUTE,
    token_types=False,
    projection=None,
    # pre_classifier, ReLU, classifier on token 0.
    sequence_head=SequenceHead(
        dense=("pre_classifier.weight", "pre_classifier.bias"),
        activation="relu",
        out=("classifier.weight", "classifier.bias"),
    ),
    token_head=TokenHead(out=("classifier.weight", "classifier.bias")),
)


# ELECTRA (the discriminator: ElectraModel, ElectraForPreTraining, ElectraForSequenceClassification,
# ...): BERT's encoder under BERT's names and the prefix "electra.", absolute positions and token
# types, but embeddings of embedding_size (word, position, token-type tables and their LayerNorm),
# then `embeddings_project`, a Linear(embedding_size -> hidden_size) that ElectraModel only builds
# when the two differ. ElectraModel has no pooler; the classification heads are the table's, the
# others (discriminator_predictions, generator_*) are left out.
ELECTRA = Family(
    name="electra",
    model_types=("electra",),
    architecture="bert",
    # ElectraConfig's defaults (electra-small-discriminator's sizes).
    config=_frozen({
        **BERT.config,
        "hidden_size": Key("hidden_size", 256),
        "num_attention_heads": Key("num_attention_heads", 4),
        "intermediate_size": Key("intermediate_size", 1024),
    }),
    accepted_values=BERT.accepted_values,
    weights=replace(BERT.weights, prefixes=("electra.",), pooler=_frozen({})),
    position_ids=ABSOLUTE,
    token_types=True,
    projection=Projection(
        size=Key("embedding_size", 128),
        weight="embeddings_project.weight",
        bias="embeddings_project.bias",
    ),
    # ElectraClassificationHead: RoBERTa's, with (erf) GELU where RoBERTa has tanh.
    sequence_head=SequenceHead(
        dense=("classifier.dense.weight", "classifier.dense.bias"),
        activation="gelu",
        out=("classifier.out_proj.weight", "classifier.out_proj.bias"),
    ),
    token_head=BERT.token_head,
)


# MPNet: BERT's post-LayerNorm encoder under other weight names (attention.attn.{q,k,v,o}), with a
# relative position bias shared by every layer (encoder.relative_attention_bias, [buckets, heads],
# looked up by the bucket of each key's distance from the query), RoBERTa's position ids from the
# pad id, and no token types (MPNetEmbeddings has no token-type table). MPNetModel has a pooler;
# MPNetForSequenceClassification reads token 0 through RoBERTa's head (dense, tanh, out_proj) and
# ForTokenClassification has a Linear on every token; both keep the encoder under "mpnet.".
MPNET = Family(
    name="mpnet",
    model_types=("mpnet",),
    architecture="mpnet",
    # MPNetConfig's defaults (mpnet-base's config.json sets max_position_embeddings 514).
    config=_frozen({
        "vocab_size": Key("vocab_size", 30527),
        "hidden_size": Key("hidden_size", 768),
        "num_hidden_layers": Key("num_hidden_layers", 12),
        "num_attention_heads": Key("num_attention_heads", 12),
        "intermediate_size": Key("intermediate_size", 3072),
        "max_position_embeddings": Key("max_position_embeddings", 512),
        "type_vocab_size": Key(None, 1),  # no token-type embedding: the converter's zero row
        "layer_norm_eps": Key("layer_norm_eps", 1e-12),
        "hidden_act": Key("hidden_act", "gelu"),
        "pad_token_id": Key("pad_token_id", 1),
        RELATIVE_BUCKETS: Key(RELATIVE_BUCKETS, 32),
    }),
    # MPNetConfig has no decoder mode and no position-embedding switch.
    accepted_values=_frozen({}),
    weights=WeightNames(
        prefixes=("mpnet.",),
        embeddings=_frozen({
            "embeddings.word": "embeddings.word_embeddings.weight",
            "embeddings.position": "embeddings.position_embeddings.weight",
            "embeddings.ln_gamma": "embeddings.LayerNorm.weight",
            "embeddings.ln_beta": "embeddings.LayerNorm.bias",
        }),
        layer_prefix="encoder.layer.{i}.",
        layer=_frozen({
            "qkv_weight": ("attention.attn.q.weight", "attention.attn.k.weight", "attention.attn.v.weight"),
            "qkv_bias": ("attention.attn.q.bias", "attention.attn.k.bias", "attention.attn.v.bias"),
            "attn_out_weight": "attention.attn.o.weight",
            "attn_out_bias": "attention.attn.o.bias",
            "attn_ln_gamma": "attention.LayerNorm.weight",
            "attn_ln_beta": "attention.LayerNorm.bias",
            "ffn_in_weight": "intermediate.dense.weight",
            "ffn_in_bias": "intermediate.dense.bias",
            "ffn_out_weight": "output.dense.weight",
            "ffn_out_bias": "output.dense.bias",
            "ffn_ln_gamma": "output.LayerNorm.weight",
            "ffn_ln_beta": "output.LayerNorm.bias",
        }),
        pooler=_frozen({"pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}),
        buffers=("embeddings.position_ids",),
        model=_frozen({RELATIVE_BIAS_TENSORS[0]: "encoder.relative_attention_bias.weight"}),
    ),
    position_ids=PADDING_OFFSET,
    token_types=False,
    projection=None,
    sequence_head=ROBERTA.sequence_head,
    token_head=BERT.token_head,
)


def _modernbert_layer(raw: Mapping[str, Any]) -> dict:
    """The engine's "layer" from a ModernBERT config.json, as ModernBertConfig reads it: the rotary
    thetas from rope_parameters (today's configs) or global_rope_theta / local_rope_theta (older
    ones; defaults 160000 and 10000), the half window local_attention // 2 (ModernBertConfig's
    sliding_window), and which layers are global: layer_types when given, else every
    global_attn_every_n_layers-th (default 3) from layer 0."""
    layers = raw.get("num_hidden_layers", 22)
    rope = raw.get("rope_parameters") or {}
    thetas = {}
    for kind, old_key, default in (("full_attention", "global_rope_theta", 160000.0),
                                   ("sliding_attention", "local_rope_theta", 10000.0)):
        params = rope.get(kind) or {}
        rope_type = params.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"rope_parameters.{kind}.rope_type {rope_type!r} is not supported (only 'default')")
        thetas[kind] = params.get("rope_theta", raw.get(old_key, default))
    if raw.get("rope_scaling") is not None:
        raise ValueError(f"rope_scaling {raw['rope_scaling']!r} is not supported (only none)")
    every = raw.get("global_attn_every_n_layers", 3)
    types = raw.get("layer_types")
    if types is not None:
        pattern = ["sliding_attention" if i % every else "full_attention" for i in range(len(types))]
        if not isinstance(types, list) or len(types) != layers or types != pattern:
            raise ValueError(f"layer_types {types!r} is not every {every}-th layer global from layer 0, "
                             "the only pattern the engine runs")
    local = raw.get("local_attention", 128)
    if not isinstance(local, int) or isinstance(local, bool) or local < 2:
        raise ValueError(f"local_attention must be an integer of at least 2, got {local!r}")
    return {"rotary_theta": thetas["full_attention"], "local_rotary_theta": thetas["sliding_attention"],
            "local_window": local // 2, "global_every": every, "gated_mlp": True, "rotary_scale": 1.0,
            "rotary_dynamic_factor": 0.0, "rotary_original_positions": 0}


# ModernBERT (ModernBertModel; answerdotai/ModernBERT-base, Alibaba-NLP/gte-modernbert-base,
# nomic-ai/modernbert-embed-base): its own architecture unit. Pre-LayerNorm layers (layer 0 reads the
# embeddings' norm), a fused Wqkv, rotary positions with a global and a local theta, a sliding
# window of local_attention // 2 on either side in all but every global_attn_every_n_layers-th
# layer, a GeGLU MLP (Wi gives [input | gate]), a final norm; no position table, no token types, no
# biases and no LayerNorm betas by default (other settings are refused). Task models keep the
# encoder under "model."; their heads are a dense without bias, GELU and a norm, then the
# classifier, on token 0 or the mean of the tokens (classifier_pooling "cls" or "mean"), or on every
# token.
MODERNBERT = Family(
    name="modernbert",
    model_types=("modernbert",),
    architecture="modernbert",
    # ModernBertConfig's defaults (ModernBERT-base).
    config=_frozen({
        "vocab_size": Key("vocab_size", 50368),
        "hidden_size": Key("hidden_size", 768),
        "num_hidden_layers": Key("num_hidden_layers", 22),
        "num_attention_heads": Key("num_attention_heads", 12),
        "intermediate_size": Key("intermediate_size", 1152),
        "max_position_embeddings": Key("max_position_embeddings", 8192),
        "type_vocab_size": Key(None, 1),  # no token-type embedding: the converter's zero row
        "layer_norm_eps": Key("norm_eps", 1e-5),
        "hidden_act": Key("hidden_activation", "gelu"),
        # Unused by ABSOLUTE positions (rotary ones count 0..S-1); recorded all the same.
        "pad_token_id": Key("pad_token_id", 50283),
    }),
    accepted_values=_frozen({"attention_bias": (False,), "mlp_bias": (False,), "norm_bias": (False,)}),
    weights=WeightNames(
        prefixes=("model.",),
        embeddings=_frozen({
            "embeddings.word": "embeddings.tok_embeddings.weight",
            "embeddings.ln_gamma": "embeddings.norm.weight",
        }),
        layer_prefix="layers.{i}.",
        layer=_frozen({
            "attn_ln_gamma": "attn_norm.weight",
            "qkv_weight": "attn.Wqkv.weight",
            "attn_out_weight": "attn.Wo.weight",
            "ffn_ln_gamma": "mlp_norm.weight",
            "ffn_in_weight": "mlp.Wi.weight",
            "ffn_out_weight": "mlp.Wo.weight",
        }),
        pooler=_frozen({}),
        model=_frozen({FINAL_NORM_TENSORS[0]: "final_norm.weight"}),
    ),
    position_ids=ABSOLUTE,
    token_types=False,
    projection=None,
    sequence_head=SequenceHead(dense=("head.dense.weight", None), activation="gelu",
                               out=("classifier.weight", "classifier.bias"), norm="head.norm.weight",
                               pooling_key="classifier_pooling"),
    token_head=TokenHead(out=("classifier.weight", "classifier.bias"), dense=("head.dense.weight", None),
                         activation="gelu", norm="head.norm.weight"),
    derive_layer=_modernbert_layer,
    head_accepted_values=_frozen({"classifier_pooling": ("cls", "mean"), "classifier_activation": ("gelu",),
                                  "classifier_bias": (False,)}),
)


def _rotary_layer(default_theta: float, gated: bool) -> Callable[[Mapping[str, Any]], dict]:
    """derive_layer of a rotary_bert family: the theta from rope_parameters (transformers 5's
    configs), rope_theta or rotary_emb_base (older ones), default_theta when none says; every layer
    global. The default rope type is run, and the dynamic one (dynamic NTK: rope_parameters, or an
    older config's rope_scaling, {"rope_type": "dynamic", "factor": f}), whose original length is
    max_position_embeddings, as transformers reads it. The other scaled ones (YaRN, longrope, ...)
    are refused by name."""

    def derive(raw: Mapping[str, Any]) -> dict:
        rope = raw.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = raw.get("rope_scaling")
        if rope_type == "default" and isinstance(scaling, Mapping) \
                and scaling.get("rope_type", scaling.get("type")) == "dynamic":
            rope, rope_type = {**rope, **scaling}, "dynamic"
        elif scaling is not None:
            raise ValueError(f"rope_scaling {scaling!r} is not supported (only none or type 'dynamic')")
        if rope_type not in ("default", "dynamic"):
            raise ValueError(f"rope_parameters.rope_type {rope_type!r} is not supported (only 'default' or "
                             "'dynamic')")
        # rotary_emb_base: the original NomicBERT / Jina code's name for it.
        theta = rope.get("rope_theta", raw.get("rope_theta", raw.get("rotary_emb_base", default_theta)))
        hidden = raw.get("hidden_size", raw.get("n_embd", 768))
        heads = raw.get("num_attention_heads", raw.get("n_head", 12))
        head_dim = raw.get("head_dim")
        if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0 \
                and head_dim != hidden // heads:
            raise ValueError(f"head_dim {head_dim!r} is not hidden_size / num_attention_heads "
                             f"({hidden // heads}), the only head width the engine runs")
        layer = {"rotary_theta": theta, "local_rotary_theta": theta, "local_window": 0, "global_every": 1,
                 "gated_mlp": gated, "rotary_scale": 1.0, "rotary_dynamic_factor": 0.0,
                 "rotary_original_positions": 0}
        if rope_type == "dynamic":
            original = raw.get("max_position_embeddings", raw.get("n_positions"))
            layer.update(_dynamic_rope(rope.get("factor"), original, "rope_parameters.factor"))
        return layer
    return derive


def _dynamic_rope(factor: Any, original: Any, name: str) -> dict:
    """The "layer" keys of dynamic NTK rope scaling by `factor` past `original` positions."""
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor < math.inf:
        raise ValueError(f"{name} must be a positive number, got {factor!r}")
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise ValueError(f"dynamic rope scaling needs the original positions as a positive integer, got "
                         f"{original!r}")
    return {"rotary_dynamic_factor": float(factor), "rotary_original_positions": original}


def _nomic_layer(raw: Mapping[str, Any]) -> dict:
    """The engine's "layer" of a NomicBERT config.json: _rotary_layer's, and the original code's
    dynamic NTK scaling where rotary_scaling_factor is set (past max_trained_positions, 2048 by
    default; nomic-embed-text-v1.5's way to 8,192 tokens)."""
    layer = _rotary_layer(1000.0, gated=True)(raw)
    factor = raw.get("rotary_scaling_factor")
    if factor is None:
        return layer
    if layer["rotary_dynamic_factor"]:
        raise ValueError("rotary_scaling_factor and a dynamic rope_parameters both scale the rope: keep one")
    return {**layer, **_dynamic_rope(factor, raw.get("max_trained_positions", 2048), "rotary_scaling_factor")}


# The rotary post-LayerNorm families (architecture rotary_bert): BERT's post-LayerNorm layer with
# rotary positions (transformers' rotate_half convention, positions 0..S-1 of the padded row) in
# place of the position table. Their checkpoints keep the weight names of the models' original code
# (transformers 5 maps them at load and writes them back at save: conversion_mapping.py): a fused
# QKV, a post-attention and a post-MLP LayerNorm under names of their own. Biases a family has not
# are zeros from the converter.
def _rotary_config(defaults: dict) -> Mapping[str, Key]:
    """The engine config keys of a rotary_bert family, from its config class's `defaults`."""
    return _frozen({k: Key(k, defaults[k]) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act", "pad_token_id")})


# NomicBERT (NomicBertModel; nomic-ai/nomic-embed-text-v1.5): no biases in attention or the SwiGLU
# MLP (fc12 the gate, fc11 the up projection), LayerNorms with biases. NomicBertModel has no pooler
# unless built with add_pooling_layer (ForSequenceClassification is, and reads it); task models keep
# the encoder under "nomic_bert.". The hub's checkpoints keep the original code's config keys
# (n_embd, n_layer, n_head, n_inner, n_positions, layer_norm_epsilon, activation_function,
# rotary_emb_base): read as aliases, and its switches other than the ones run refused by name.
_NOMIC_ALIASES = {"hidden_size": ("n_embd",), "num_hidden_layers": ("n_layer",), "num_attention_heads": ("n_head",),
                  "intermediate_size": ("n_inner",), "max_position_embeddings": ("n_positions",),
                  "layer_norm_eps": ("layer_norm_epsilon",), "hidden_act": ("activation_function",)}
NOMIC_BERT = Family(
    name="nomic_bert",
    model_types=("nomic_bert",),
    architecture="rotary_bert",
    # NomicBertConfig's defaults.
    config=_frozen({
        key: Key(k.hf, k.default, aliases=_NOMIC_ALIASES.get(key, ()),
               values={"swiglu": "silu"} if key == "hidden_act" else {})
        for key, k in _rotary_config(dict(
            vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072, max_position_embeddings=2048, type_vocab_size=2, layer_norm_eps=1e-12,
            hidden_act="silu", pad_token_id=0)).items()
    }),
    accepted_values=_frozen({"rotary_emb_fraction": (1.0,), "rotary_emb_interleaved": (False,),
                             "qkv_proj_bias": (False,),
                             "mlp_fc1_bias": (False,), "mlp_fc2_bias": (False,), "prenorm": (False,),
                             "parallel_block": (False,), "use_rms_norm": (False,), "causal": (False,)}),
    weights=WeightNames(
        prefixes=("nomic_bert.",),
        embeddings=_frozen({
            "embeddings.word": "embeddings.word_embeddings.weight",
            "embeddings.token_type": "embeddings.token_type_embeddings.weight",
            "embeddings.ln_gamma": "emb_ln.weight",
            "embeddings.ln_beta": "emb_ln.bias",
        }),
        layer_prefix="encoder.layers.{i}.",
        layer=_frozen({
            "qkv_weight": "attn.Wqkv.weight",
            "qkv_bias": None,
            "attn_out_weight": "attn.out_proj.weight",
            "attn_out_bias": None,
            "attn_ln_gamma": "norm1.weight",
            "attn_ln_beta": "norm1.bias",
            "ffn_in_weight": ("mlp.fc12.weight", "mlp.fc11.weight"),
            "ffn_in_bias": None,
            "ffn_out_weight": "mlp.fc2.weight",
            "ffn_out_bias": None,
            "ffn_ln_gamma": "norm2.weight",
            "ffn_ln_beta": "norm2.bias",
        }),
        pooler=_frozen({"pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}),
    ),
    position_ids=ABSOLUTE,
    token_types=True,
    projection=None,
    sequence_head=BERT.sequence_head,
    token_head=BERT.token_head,
    derive_layer=_nomic_layer,
)

def _gte_layer(raw: Mapping[str, Any]) -> dict:
    """The engine's "layer" of a GTE config.json: transformers' (rope_parameters, default rope) or
    the original code's "new" one (rope_theta, and rope_scaling {"type": "ntk", "factor": f}: the
    frequencies of theta * f divided by f^(2/d), d the head width)."""
    scaling = raw.get("rope_scaling")
    if scaling is None or raw.get("model_type") != "new":
        return _rotary_layer(160000.0, gated=True)(raw)
    if not isinstance(scaling, Mapping) or scaling.get("type") != "ntk":
        raise ValueError(f"rope_scaling {scaling!r} is not supported (only none or type 'ntk')")
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
        raise ValueError(f"rope_scaling.factor must be a positive number, got {factor!r}")
    layer = _rotary_layer(160000.0, gated=True)({**raw, "rope_scaling": None})
    head_dim = raw.get("hidden_size", 768) // raw.get("num_attention_heads", 12)
    return {**layer, "rotary_theta": layer["rotary_theta"] * factor,
            "local_rotary_theta": layer["rotary_theta"] * factor, "rotary_scale": factor ** (2.0 / head_dim)}


# GTE (GteModel; Alibaba's gte-multilingual-base and gte-*-en-v1.5, whose checkpoints say
# model_type "new", the original code's): biases in attention and on the MLP's down projection;
# up_gate_proj holds [up | gate] without a bias (the engine's FFN-in is [gate | up]); heads as
# NomicBERT's. The "new" settings other than these are refused by name; a type_vocab_size of 0 (no
# token-type table) gets the converter's zero row.
GTE = Family(
    name="gte",
    model_types=("gte", "new"),
    architecture="rotary_bert",
    config=_rotary_config(dict(vocab_size=250048, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                               intermediate_size=3072, max_position_embeddings=8192, type_vocab_size=1,
                               layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=1)),
    accepted_values=_frozen({"layer_norm_type": ("layer_norm",), "position_embedding_type": ("rope",),
                             "pack_qkv": (True,), "logn_attention_scale": (False,),
                             "logn_attention_clip1": (False,)}),
    weights=WeightNames(
        prefixes=("gte.", "new."),
        embeddings=_frozen({
            "embeddings.word": "embeddings.word_embeddings.weight",
            "embeddings.token_type": "embeddings.token_type_embeddings.weight",
            "embeddings.ln_gamma": "embeddings.LayerNorm.weight",
            "embeddings.ln_beta": "embeddings.LayerNorm.bias",
        }),
        layer_prefix="encoder.layer.{i}.",
        layer=_frozen({
            "qkv_weight": "attention.qkv_proj.weight",
            "qkv_bias": "attention.qkv_proj.bias",
            "attn_out_weight": "attention.o_proj.weight",
            "attn_out_bias": "attention.o_proj.bias",
            "attn_ln_gamma": "attn_ln.weight",
            "attn_ln_beta": "attn_ln.bias",
            "ffn_in_weight": (Part("mlp.up_gate_proj.weight", 1, 2), Part("mlp.up_gate_proj.weight", 0, 2)),
            "ffn_in_bias": None,
            "ffn_out_weight": "mlp.down_proj.weight",
            "ffn_out_bias": "mlp.down_proj.bias",
            "ffn_ln_gamma": "mlp_ln.weight",
            "ffn_ln_beta": "mlp_ln.bias",
        }),
        pooler=_frozen({"pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}),
    ),
    position_ids=ABSOLUTE,
    token_types=True,
    projection=None,
    sequence_head=BERT.sequence_head,
    token_head=BERT.token_head,
    derive_layer=_gte_layer,
)


def _jina_layer(raw: Mapping[str, Any]) -> dict:
    """The engine's "layer" of a Jina-embeddings-v3 config.json: _rotary_layer's (default theta
    20000; the original code's rotary_emb_base read as the theta), plain MLP. The original code's
    rotary_emb_dim (default the head width) is refused by name when it rotates fewer dimensions."""
    hidden, heads = raw.get("hidden_size", 1024), raw.get("num_attention_heads", 16)
    dim = raw.get("rotary_emb_dim")
    if dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0 \
            and dim != hidden / heads:
        raise ValueError(f"rotary_emb_dim {dim!r} is not the head width ({hidden // heads}): a partial "
                         "rotary is not supported")
    return _rotary_layer(20000.0, gated=False)(raw)


# Jina-embeddings-v3 (JinaEmbeddingsV3Model, as transformers runs it natively): XLM-R's layer with
# rotary positions counted 0..S-1, biases everywhere, BERT's MLP (fc1, act, fc2); a pooler; task
# models keep the encoder under "roberta." with RoBERTa's heads. The hub's checkpoint
# (jinaai/jina-embeddings-v3) is the original code's: config.json says model_type "xlm-roberta" with
# position_embedding_type "rotary" (original_configs) and the same keys (rotary_emb_base the theta),
# and its weights carry per-task LoRA adapters (TaskAdapters; their defaults XLMRobertaFlashConfig's),
# merged for the task named at load. Other keys left out take JinaEmbeddingsV3Config's defaults.
JINA_EMBEDDINGS_V3 = Family(
    name="jina_embeddings_v3",
    model_types=("jina_embeddings_v3",),
    architecture="rotary_bert",
    config=_rotary_config(dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                               intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
                               layer_norm_eps=1e-5, hidden_act="gelu", pad_token_id=1)),
    # The original code's rotary settings other than the ones run (flash-attn's RotaryEmbedding:
    # interleaved pairs, xPos scaling).
    accepted_values=_frozen({"position_embedding_type": ("rotary",), "rotary_emb_interleaved": (False,),
                             "rotary_emb_scale_base": (None,)}),
    weights=WeightNames(
        prefixes=("roberta.",),
        embeddings=NOMIC_BERT.weights.embeddings,
        layer_prefix="encoder.layers.{i}.",
        layer=_frozen({
            "qkv_weight": "mixer.Wqkv.weight",
            "qkv_bias": "mixer.Wqkv.bias",
            "attn_out_weight": "mixer.out_proj.weight",
            "attn_out_bias": "mixer.out_proj.bias",
            "attn_ln_gamma": "norm1.weight",
            "attn_ln_beta": "norm1.bias",
            "ffn_in_weight": "mlp.fc1.weight",
            "ffn_in_bias": "mlp.fc1.bias",
            "ffn_out_weight": "mlp.fc2.weight",
            "ffn_out_bias": "mlp.fc2.bias",
            "ffn_ln_gamma": "norm2.weight",
            "ffn_ln_beta": "norm2.bias",
        }),
        pooler=_frozen({"pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}),
    ),
    position_ids=ABSOLUTE,
    token_types=True,
    projection=None,
    sequence_head=ROBERTA.sequence_head,
    token_head=BERT.token_head,
    derive_layer=_jina_layer,
    adapters=TaskAdapters(original=".parametrizations.weight.original",
                          lora_a=".parametrizations.weight.0.lora_A", lora_b=".parametrizations.weight.0.lora_B",
                          tasks_key="lora_adaptations", rank=Key("lora_rank", 4), alpha=Key("lora_alpha", 1)),
    original_configs=(("xlm-roberta", _frozen({"position_embedding_type": "rotary"})),),
)


def _eurobert_layer(raw: Mapping[str, Any]) -> dict:
    """The engine's "layer" of a EuroBERT config.json: its rope (as _rotary_layer's, default theta
    10000), gated. Grouped K/V heads are read as KVHeads (repeated at conversion): their count
    must divide num_attention_heads."""
    heads = raw.get("num_attention_heads", 12)
    kv = raw.get("num_key_value_heads")
    if kv is not None and not (isinstance(kv, int) and not isinstance(kv, bool) and 0 < kv <= heads
                               and heads % kv == 0):
        raise ValueError(f"num_key_value_heads {kv!r} does not divide num_attention_heads {heads!r} into "
                         "groups of query heads")
    layer = _rotary_layer(10000.0, gated=True)(raw)
    if layer["rotary_dynamic_factor"]:
        raise ValueError("rope_type 'dynamic' is not supported by EuroBERT's architecture (only 'default')")
    return layer


# EuroBERT (EuroBertModel; EuroBERT/EuroBERT-210m ...): a Llama-style bidirectional encoder with its
# own architecture unit. Word embeddings without a norm, pre-RMSNorm layers (input_layernorm,
# post_attention_layernorm), separate q/k/v/o projections (grouped K/V heads repeated to one per
# query head at conversion: KVHeads) and a SwiGLU MLP (gate, up, down), no biases (attention_bias
# / mlp_bias true are refused), a final norm; no position table, no token types.
# Task models keep the encoder under "model."; the sequence head is a dense, GELU and the
# classifier on token 0 or the mean of the tokens (classifier_pooling "bos" or "mean"), or the
# mean of the per-token logits ("late", the default), the token head a Linear on every token.
EUROBERT = Family(
    name="eurobert",
    model_types=("eurobert",),
    architecture="eurobert",
    # EuroBertConfig's defaults.
    config=_frozen({
        "vocab_size": Key("vocab_size", 128256),
        "hidden_size": Key("hidden_size", 768),
        "num_hidden_layers": Key("num_hidden_layers", 12),
        "num_attention_heads": Key("num_attention_heads", 12),
        "intermediate_size": Key("intermediate_size", 3072),
        "max_position_embeddings": Key("max_position_embeddings", 8192),
        "type_vocab_size": Key(None, 1),  # no token-type embedding: the converter's zero row
        "layer_norm_eps": Key("rms_norm_eps", 1e-5),
        "hidden_act": Key("hidden_act", "silu"),
        "pad_token_id": Key("pad_token_id", 128001),
    }),
    accepted_values=_frozen({"attention_bias": (False,), "mlp_bias": (False,)}),
    weights=WeightNames(
        prefixes=("model.",),
        embeddings=_frozen({"embeddings.word": "embed_tokens.weight"}),
        layer_prefix="layers.{i}.",
        layer=_frozen({
            "attn_ln_gamma": "input_layernorm.weight",
            "qkv_weight": ("self_attn.q_proj.weight", KVHeads("self_attn.k_proj.weight"),
                           KVHeads("self_attn.v_proj.weight")),
            "attn_out_weight": "self_attn.o_proj.weight",
            "ffn_ln_gamma": "post_attention_layernorm.weight",
            "ffn_in_weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
            "ffn_out_weight": "mlp.down_proj.weight",
        }),
        pooler=_frozen({}),
        model=_frozen({FINAL_NORM_TENSORS[0]: "norm.weight"}),
    ),
    position_ids=ABSOLUTE,
    token_types=False,
    projection=None,
    sequence_head=SequenceHead(dense=("dense.weight", "dense.bias"), activation="gelu",
                               out=("classifier.weight", "classifier.bias"), pooling_key="classifier_pooling",
                               pooling_inputs=_frozen({"mean": "mean", "late": "late_mean"})),
    token_head=BERT.token_head,
    derive_layer=_eurobert_layer,
    head_accepted_values=_frozen({"classifier_pooling": ("late", "bos", "mean")}),
)


def _deberta_disentangled(raw: Mapping[str, Any]) -> dict:
    """The engine's "disentangled" from a DeBERTa-v2 config.json, as DisentangledSelfAttention and
    DebertaV2Encoder read it (getattr defaults where DebertaV2Config has none): pos_att_type as a
    "|"-separated string or a list, max_relative_positions < 1 meaning max_position_embeddings,
    norm_rel_ebd "layer_norm" or "none". What the engine does not run is refused by name: no
    relative attention, separate position projections (share_att_key false), the convolution
    layer (conv_kernel_size), an embedding projection (embedding_size != hidden_size), a head width
    of its own (attention_head_size)."""
    if raw.get("relative_attention", False) is not True:
        raise ValueError("relative_attention false (DeBERTa without disentangled attention) is not "
                         "supported")
    if raw.get("share_att_key", False) is not True:
        raise ValueError("share_att_key false (separate relative position projections) is not supported")
    if raw.get("conv_kernel_size", 0):
        raise ValueError(f"conv_kernel_size {raw['conv_kernel_size']!r} (the convolution after layer 0) "
                         "is not supported")
    hidden, heads = raw.get("hidden_size", 1536), raw.get("num_attention_heads", 24)
    if raw.get("embedding_size", hidden) != hidden:
        raise ValueError(f"embedding_size {raw['embedding_size']!r} != hidden_size {hidden!r} (an "
                         "embedding projection) is not supported")
    size = raw.get("attention_head_size")
    if size is not None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0 \
            and size * heads != hidden:
        raise ValueError(f"attention_head_size {size!r} is not hidden_size / num_attention_heads "
                         f"({hidden // heads})")
    types = raw.get("pos_att_type") or []
    if isinstance(types, str):
        types = [t.strip() for t in types.lower().split("|")]
    if not isinstance(types, list) or not set(types) <= {"c2p", "p2c"} or not types:
        raise ValueError(f"pos_att_type {raw.get('pos_att_type')!r} is not supported (one or both of "
                         "'c2p', 'p2c')")
    norms = [x.strip() for x in str(raw.get("norm_rel_ebd", "none")).lower().split("|")]
    if not set(norms) <= {"none", "layer_norm"}:
        raise ValueError(f"norm_rel_ebd {raw['norm_rel_ebd']!r} is not supported ('layer_norm' or 'none')")
    reach = raw.get("max_relative_positions", -1)
    if isinstance(reach, int) and reach < 1:
        reach = raw.get("max_position_embeddings", 512)
    buckets = raw.get("position_buckets", -1)
    return {"position_buckets": buckets,
            "max_relative_positions": reach, "c2p": "c2p" in types, "p2c": "p2c" in types,
            "position_table": bool(raw.get("position_biased_input", True)),
            "norm": "layer_norm" in norms}


# DeBERTa-v2 and v3 (DebertaV2Model; microsoft/deberta-v3-base, mDeBERTa, the NLI / zero-shot /
# prompt-injection classifiers, mxbai-rerank-v1): its own architecture unit. BERT's post-LayerNorm
# layers (query_proj / key_proj / value_proj) whose attention adds the disentangled terms from the
# encoder's relative embeddings (and their LayerNorm); absolute positions only where
# position_biased_input, token types only where type_vocab_size > 0 (v3: neither). No pooler in the
# bare model; ForSequenceClassification's ContextPooler (dense + pooler_hidden_act on token 0) is
# the head's own dense, then its classifier; ForTokenClassification a Linear on every token. Task
# models keep the encoder under "deberta.".
DEBERTA_V2 = Family(
    name="deberta-v2",
    model_types=("deberta-v2",),
    architecture="deberta",
    # DebertaV2Config's defaults (deberta-v2-xlarge's sizes).
    config=_frozen({
        "vocab_size": Key("vocab_size", 128100),
        "hidden_size": Key("hidden_size", 1536),
        "num_hidden_layers": Key("num_hidden_layers", 24),
        "num_attention_heads": Key("num_attention_heads", 24),
        "intermediate_size": Key("intermediate_size", 6144),
        "max_position_embeddings": Key("max_position_embeddings", 512),
        "type_vocab_size": Key("type_vocab_size", 0),
        "layer_norm_eps": Key("layer_norm_eps", 1e-7),
        "hidden_act": Key("hidden_act", "gelu"),
        # Unused by ABSOLUTE positions; recorded all the same.
        "pad_token_id": Key("pad_token_id", 0),
    }),
    accepted_values=_frozen({}),
    weights=WeightNames(
        prefixes=("deberta.",),
        embeddings=_frozen({
            "embeddings.word": "embeddings.word_embeddings.weight",
            "embeddings.position": "embeddings.position_embeddings.weight",
            "embeddings.token_type": "embeddings.token_type_embeddings.weight",
            "embeddings.ln_gamma": "embeddings.LayerNorm.weight",
            "embeddings.ln_beta": "embeddings.LayerNorm.bias",
        }),
        layer_prefix="encoder.layer.{i}.",
        layer=_frozen({
            **BERT.weights.layer,
            "qkv_weight": ("attention.self.query_proj.weight", "attention.self.key_proj.weight",
                           "attention.self.value_proj.weight"),
            "qkv_bias": ("attention.self.query_proj.bias", "attention.self.key_proj.bias",
                         "attention.self.value_proj.bias"),
        }),
        pooler=_frozen({}),
        buffers=("embeddings.position_ids",),
        model=_frozen({"encoder.rel_embeddings": "encoder.rel_embeddings.weight",
                       "encoder.rel_ln_gamma": "encoder.LayerNorm.weight",
                       "encoder.rel_ln_beta": "encoder.LayerNorm.bias"}),
    ),
    position_ids=ABSOLUTE,
    token_types=True,
    projection=None,
    sequence_head=SequenceHead(dense=("pooler.dense.weight", "pooler.dense.bias"), activation="gelu",
                               out=("classifier.weight", "classifier.bias")),
    token_head=TokenHead(out=("classifier.weight", "classifier.bias")),
    head_accepted_values=_frozen({"pooler_hidden_act": ("gelu",)}),
    derive_disentangled=_deberta_disentangled,
)


def _probe_config(family: Family) -> dict:
    """A tiny engine config of the family's architecture with every optional tensor present."""
    config = dict(vocab_size=8, hidden_size=4, num_hidden_layers=2, num_attention_heads=1,
                  intermediate_size=4, max_position_embeddings=8, type_vocab_size=2,
                  layer_norm_eps=1e-12, hidden_act="gelu", has_pooler=bool(family.weights.pooler),
                  position_ids=family.position_ids, pad_token_id=0, architecture=family.architecture)
    if family.relative_bias:
        config[RELATIVE_BUCKETS] = 8
    if family.derive_layer is not None:
        config[LAYER] = family.derive_layer({"num_hidden_layers": 2})
    if family.derive_disentangled is not None:
        # Every optional tensor: the position table and the relative embeddings' norm.
        config[DISENTANGLED] = dict(position_buckets=4, max_relative_positions=8, c2p=True, p2c=True,
                                    position_table=True, norm=True)
    return config


def _engine_names(family: Family) -> dict[str, set[str]]:
    """The engine's tensor names for the family's architecture (cpp/core/weights.cpp, through the
    bound module), by part: "embeddings", "layer" (a layer past the first, unprefixed),
    "pooler" and "model" (the rest: a relative bias table, a final norm)."""
    names = [n for n, *_ in _C.expected_tensors(_probe_config(family))]
    parts = {"embeddings": set(), "layer": set(), "pooler": set(), "model": set()}
    for n in names:
        if n.startswith("layers.1."):
            parts["layer"].add(n[len("layers.1."):])
        elif n.startswith("embeddings.") and n not in PROJECTION_TENSORS:
            parts["embeddings"].add(n)
        elif n.startswith("pooler."):
            parts["pooler"].add(n)
        elif not n.startswith(("layers.", "classifier.")) and n not in PROJECTION_TENSORS:
            parts["model"].add(n)
    return parts


def _check(family: Family) -> Family:
    """Refuses a table that does not cover the engine layout exactly: a gap would otherwise surface
    only when a checkpoint of that family is converted."""
    w = family.weights
    want_keys = {*INT_KEYS, "layer_norm_eps", "hidden_act", "pad_token_id",
                 *([RELATIVE_BUCKETS] if family.relative_bias else [])}
    if not (isinstance(family.architecture, str) and family.architecture.isidentifier()):
        raise AssertionError(f"family {family.name!r}: architecture {family.architecture!r} must name "
                             "an architecture unit")
    engine = _engine_names(family)
    want_embeddings = {n for n in engine["embeddings"] if family.token_types or n != "embeddings.token_type"}
    want_layer = engine["layer"]
    problems = []
    if set(family.config) != want_keys:
        problems.append(f"config keys {sorted(family.config)} != {sorted(want_keys)}")
    if set(w.embeddings) != want_embeddings:
        problems.append(f"embeddings {sorted(w.embeddings)} != {sorted(want_embeddings)}")
    if set(w.layer) != want_layer:
        problems.append(f"layer tensors {sorted(w.layer)} != {sorted(want_layer)}")
    if set(w.model) != engine["model"]:
        problems.append(f"model tensors {sorted(w.model)} != the engine's {sorted(engine['model'])}")
    if w.pooler and set(w.pooler) != engine["pooler"]:
        problems.append(f"pooler {sorted(w.pooler)} != {sorted(engine['pooler'])}")
    head = family.sequence_head
    if (head is None) != (family.token_head is None):
        problems.append("a family runs both heads or neither")
    if head is not None and head.dense is None and not w.pooler:
        problems.append("a sequence head without a dense of its own reads the pooler: it needs one")
    if head is not None and (head.dense is None) != (head.activation is None):
        problems.append("a sequence head's own dense and its activation come together")
    for h in (head, family.token_head):
        if h is not None and h.activation not in (None, *HEAD_ACTIVATIONS):
            problems.append(f"unknown head activation {h.activation!r}")
        if h is not None and h.norm is not None and h.dense is None:
            problems.append("a head's norm follows its own dense")
    if family.token_head is not None and (family.token_head.dense is None) != (family.token_head.activation is None):
        problems.append("a token head's own dense and its activation come together")
    if family.position_ids not in POSITION_SCHEMES:
        problems.append(f"unknown position-id scheme {family.position_ids!r}")
    if not family.token_types and family.config["type_vocab_size"] != Key(None, 1):
        problems.append("without token types, type_vocab_size is fixed at 1 (the converter's zero row)")
    if family.position_ids == PADDING_OFFSET and family.config["pad_token_id"].hf is None:
        problems.append("padding_offset positions count from config.json's pad_token_id: it needs a key")
    if family.projection is not None and family.projection.size.hf is None:
        problems.append("a projection's width comes from config.json: it needs a key")
    if family.name not in family.model_types:
        problems.append("the family's name is the model_type the engine config records: it must be one")
    a = family.adapters
    if a is not None and (a.rank.hf is None or a.alpha.hf is None
                          or len({a.original, a.lora_a, a.lora_b}) != 3):
        problems.append("adapters need config keys for rank and alpha, and three distinct name endings")
    if problems:
        raise AssertionError(f"family {family.name!r}: " + "; ".join(problems))
    return family


# Family name -> table.
FAMILIES: Mapping[str, Family] = _frozen({
    f.name: _check(f) for f in (BERT, ROBERTA, XLM_ROBERTA, CAMEMBERT, DISTILBERT, ELECTRA, MPNET, MODERNBERT,
                                NOMIC_BERT, GTE, JINA_EMBEDDINGS_V3, EUROBERT, DEBERTA_V2)
})

_BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}
if len(_BY_MODEL_TYPE) != sum(len(f.model_types) for f in FAMILIES.values()):
    raise AssertionError("a model_type is claimed by two families")
# (model_type, marks, family) of the original code's configs (Family.original_configs).
_ORIGINAL_CONFIGS = [(t, marks, f) for f in FAMILIES.values() for t, marks in f.original_configs]
for _i, (_t, _marks, _f) in enumerate(_ORIGINAL_CONFIGS):
    if not isinstance(_t, str) or not _marks or _t in _f.model_types:
        raise AssertionError(f"family {_f.name!r}: an original config names another model_type and the "
                             "values that mark it")
    if any(t == _t and dict(m) == dict(_marks) for t, m, _ in _ORIGINAL_CONFIGS[:_i]):
        raise AssertionError(f"model_type {_t!r} with {dict(_marks)} is claimed twice")


def check_engine_config(cfg: Any, where: str, error: Callable[[str], Exception]) -> None:
    """Checks a whole ftbert_config.json (after its format and version were checked): the format
    (layout.check_format), then that its values fit its model_type's family."""
    check_format(cfg, where, error)
    family = family_for(cfg["model_type"])
    if family is None:
        raise error(
            f"{where}: model_type {cfg['model_type']!r} is not supported (expected one of "
            f"{', '.join(map(repr, FAMILIES))})"
        )
    model = repr(cfg["model_type"])
    if cfg["position_ids"] != family.position_ids:
        raise error(f"{where}: position_ids {cfg['position_ids']!r} is not what model_type {model} "
                    f"uses ({family.position_ids!r})")
    if not family.token_types and cfg["type_vocab_size"] != 1:
        raise error(f"{where}: type_vocab_size {cfg['type_vocab_size']!r} is not what model_type {model} has "
                    "(1: it has no token-type embedding, only a zero row)")
    if family.projection is None and cfg[EMBEDDING_SIZE] != cfg["hidden_size"]:
        raise error(f"{where}: embedding_size {cfg[EMBEDDING_SIZE]!r} is not what model_type {model} has "
                    f"(its embeddings are hidden_size {cfg['hidden_size']!r} wide: it has no embedding projection)")
    if (family.derive_layer is not None) != (cfg[LAYER] is not None):
        has = "has" if family.derive_layer is not None else "has no"
        raise error(f"{where}: {LAYER} {cfg[LAYER]!r} does not fit model_type {model}, whose layer {has} "
                    "such settings")
    if (family.derive_disentangled is not None) != (cfg[DISENTANGLED] is not None):
        has = "has" if family.derive_disentangled is not None else "has no"
        raise error(f"{where}: {DISENTANGLED} {cfg[DISENTANGLED]!r} does not fit model_type {model}, which {has} "
                    "disentangled attention")
    if family.relative_bias != (cfg[RELATIVE_BUCKETS] > 0):
        has = "has" if family.relative_bias else "has no"
        raise error(f"{where}: {RELATIVE_BUCKETS} {cfg[RELATIVE_BUCKETS]!r} does not fit model_type {model}, "
                    f"which {has} relative position bias")
    if not family.weights.pooler and cfg["has_pooler"] is True:
        raise error(f"{where}: has_pooler is true, but model_type {model} has no pooler")


def family_for(model_type: Any) -> Family | None:
    """The family that reads a config.json `model_type`, or None (for any value, a non-string too)."""
    return _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None


def family_for_config(raw: Mapping[str, Any]) -> Family | None:
    """The family that reads a config.json dict: the one whose original_configs mark it (model_type
    and the values of other keys: the original Jina code's "xlm-roberta" with rotary positions),
    else family_for(its model_type)."""
    model_type = raw.get("model_type")
    for t, marks, family in _ORIGINAL_CONFIGS:
        if model_type == t and all(k in raw and raw[k] == v for k, v in marks.items()):
            return family
    return family_for(model_type)


def supported_model_types() -> tuple[str, ...]:
    return tuple(_BY_MODEL_TYPE)
