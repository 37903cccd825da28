"""Fixtures for the converter tests: the package under test (`wt`) and tiny random HF checkpoints.

HF tensor names come from the family tables (`wt.family_for(model_type)`, through `hf_name`), never
spelled here or in the tests. Checkpoints are BERT unless a test asks for another family
(`make_checkpoint(..., family="roberta")`).

`wt` is the installed `ftbert.weights_tools`: the converter reads each architecture's tensors from
the engine's own table (weights_tools/schema.py), so it needs the built package.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import ftbert.weights_tools as wt_module

BERT = wt_module.family_for("bert")

# Small, with odd sizes everywhere: head_dim 16, I not a multiple of H, V and P odd.
TINY = dict(
    vocab_size=101,
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=80,
    max_position_embeddings=41,
    type_vocab_size=3,
)
KINDS = ("model", "mlm", "cls")  # BertModel, BertForMaskedLM, BertForSequenceClassification
# model_type -> the transformers class-name stem of its models (RobertaModel, XLMRobertaForMaskedLM, ...).
FAMILY_CLASSES = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert",
                  "distilbert": "DistilBert", "electra": "Electra", "mpnet": "MPNet",
                  "modernbert": "ModernBert", "nomic_bert": "NomicBert", "gte": "Gte",
                  "jina_embeddings_v3": "JinaEmbeddingsV3", "eurobert": "EuroBert",
                  "deberta-v2": "DebertaV2"}
# TINY under DistilBertConfig's own keys (no token types: type_vocab_size has no key there).
DISTILBERT_KEYS = {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                   "intermediate_size": "hidden_dim", "hidden_act": "activation", "type_vocab_size": None}
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")
# ELECTRA's embeddings are narrower than TINY's hidden_size 48 unless a test says otherwise, so the
# projection (embeddings_project) is there.
ELECTRA_EMBEDDING_SIZE = 32
_KIND_SUFFIX = {"model": "Model", "mlm": "ForMaskedLM", "cls": "ForSequenceClassification",
                "choice": "ForMultipleChoice", "pretrain": "ForPreTraining"}
LAYOUTS = ("safetensors", "sharded", "bin", "bin_sharded")


@pytest.fixture(scope="session")
def wt():
    return wt_module


@pytest.fixture(autouse=True)
def _seed_from_run(rng):
    """torch and `random` draw from the run's seed too (tests/conftest.py), so FTBERT_TEST_SEED
    replays a failing run."""
    seed = int(rng.integers(2**31))
    torch.manual_seed(seed)
    random.seed(seed)


def backbone(model):
    """The encoder (BertModel, RobertaModel, ...) inside a task model (or the model itself)."""
    return getattr(model, model.base_model_prefix, model)


def hf_name(engine_name: str, part: int = 0, kind: str = "model", family: str = "bert") -> str:
    """The checkpoint name of an engine tensor's source (the part-th of a fused one: 0, 1, 2 are Q,
    K, V), as a model of `kind` saves it: the task models keep the encoder under the family's prefix."""
    table = wt_module.family_for(family)
    name = table.weights.hf_names(engine_name)[part]
    return name if kind == "model" else table.weights.prefixes[0] + name


def reference_tensors(model) -> dict[str, torch.Tensor]:
    """The engine tensors, built from the HF modules' attributes, not from the family table's names:
    an independent oracle, so a wrong entry in the table fails the round-trip tests. A
    sequence-classification model's head is included."""
    ref = _encoder_reference(model)
    classifier = getattr(model, "classifier", None)
    name = type(model).__name__
    if name.endswith(("ForSequenceClassification", "ForTokenClassification")):
        pre = getattr(model, "pre_classifier", None)  # DistilBERT
        modern = getattr(model, "head", None)  # ModernBERT: dense (no bias), act, norm
        own = getattr(model, "dense", None)  # EuroBERT: dense, GELU, then the classifier
        if getattr(model, "pooler", None) is not None:  # DeBERTa's ContextPooler: dense, GELU
            own = model.pooler.dense
        dense, out = (pre, classifier) if pre is not None else (modern.dense, classifier) if modern is not None else (
            (own, classifier) if own is not None else
            (classifier.dense, classifier.out_proj) if hasattr(classifier, "out_proj") else (None, classifier))
        if dense is not None:
            ref["classifier.dense_weight"] = dense.weight.detach().T.contiguous()
            ref["classifier.dense_bias"] = (dense.bias.detach() if dense.bias is not None
                                            else torch.zeros(dense.weight.shape[0]))
        if modern is not None:
            ref["classifier.norm_gamma"] = modern.norm.weight.detach()
        ref["classifier.out_weight"] = out.weight.detach().T.contiguous()
        ref["classifier.out_bias"] = out.bias.detach()
    return ref


def _encoder_reference(model) -> dict[str, torch.Tensor]:
    m = backbone(model)
    if hasattr(m, "embed_tokens"):  # EuroBERT
        return _eurobert_reference(m)
    e = m.embeddings
    if hasattr(m, "transformer"):  # DistilBERT
        return _distilbert_reference(m)
    if hasattr(m, "final_norm"):  # ModernBERT
        return _modernbert_reference(m)
    if hasattr(m, "rotary_emb"):  # NomicBERT, GTE, Jina-embeddings-v3
        return _rotary_bert_reference(m)
    if hasattr(m.encoder, "relative_attention_bias"):  # MPNet
        return _mpnet_reference(m)
    if hasattr(m.encoder, "rel_embeddings"):  # DeBERTa-v2
        return _deberta_reference(m)
    ref = {
        "embeddings.word": e.word_embeddings.weight,
        "embeddings.position": e.position_embeddings.weight,
        "embeddings.token_type": e.token_type_embeddings.weight,
        "embeddings.ln_gamma": e.LayerNorm.weight,
        "embeddings.ln_beta": e.LayerNorm.bias,
    }
    for i, layer in enumerate(m.encoder.layer):
        s = layer.attention.self
        p = f"layers.{i}."
        ref[p + "qkv_weight"] = torch.cat([s.query.weight.T, s.key.weight.T, s.value.weight.T], dim=1)
        ref[p + "qkv_bias"] = torch.cat([s.query.bias, s.key.bias, s.value.bias])
        ref.update(_bert_layer_after_attention(layer, p))
    project = getattr(m, "embeddings_project", None)  # ELECTRA with embedding_size != hidden_size
    if project is not None:
        ref = {**{k: v for k, v in ref.items() if k.startswith("embeddings.")},
               "embeddings.project_weight": project.weight.T, "embeddings.project_bias": project.bias,
               **{k: v for k, v in ref.items() if not k.startswith("embeddings.")}}
    if getattr(m, "pooler", None) is not None:  # ElectraModel has none
        ref["pooler.weight"] = m.pooler.dense.weight.T
        ref["pooler.bias"] = m.pooler.dense.bias
    return {k: v.detach().float().contiguous() for k, v in ref.items()}


def _modernbert_reference(m) -> dict[str, torch.Tensor]:
    """reference_tensors for a ModernBertModel: word table, a zero token-type row, the embeddings'
    norm; per layer the pre-attention norm (from layer 1), Wqkv, Wo, the pre-MLP norm, Wi, Wo; the
    final norm. No biases, no betas."""
    e = m.embeddings
    ref = {
        "embeddings.word": e.tok_embeddings.weight,
        "embeddings.token_type": torch.zeros(1, e.tok_embeddings.weight.shape[1]),
        "embeddings.ln_gamma": e.norm.weight,
    }
    for i, layer in enumerate(m.layers):
        p = f"layers.{i}."
        if i > 0:
            ref[p + "attn_ln_gamma"] = layer.attn_norm.weight
        ref[p + "qkv_weight"] = layer.attn.Wqkv.weight.T
        ref[p + "attn_out_weight"] = layer.attn.Wo.weight.T
        ref[p + "ffn_ln_gamma"] = layer.mlp_norm.weight
        ref[p + "ffn_in_weight"] = layer.mlp.Wi.weight.T
        ref[p + "ffn_out_weight"] = layer.mlp.Wo.weight.T
    ref["final_norm.gamma"] = m.final_norm.weight
    return {k: v.detach().float().contiguous() for k, v in ref.items()}


def _eurobert_reference(m) -> dict[str, torch.Tensor]:
    """reference_tensors for a EuroBertModel: word table, a zero token-type row; per layer the two
    RMSNorms, Q|K|V fused, o_proj, FFN-in [gate | up], down_proj; the final norm. No biases."""
    w = m.embed_tokens.weight
    ref = {"embeddings.word": w, "embeddings.token_type": torch.zeros(1, w.shape[1])}
    for i, layer in enumerate(m.layers):
        a, mlp = layer.self_attn, layer.mlp
        p = f"layers.{i}."
        ref[p + "attn_ln_gamma"] = layer.input_layernorm.weight
        ref[p + "qkv_weight"] = torch.cat([a.q_proj.weight.T, a.k_proj.weight.T, a.v_proj.weight.T], dim=1)
        ref[p + "attn_out_weight"] = a.o_proj.weight.T
        ref[p + "ffn_ln_gamma"] = layer.post_attention_layernorm.weight
        ref[p + "ffn_in_weight"] = torch.cat([mlp.gate_proj.weight.T, mlp.up_proj.weight.T], dim=1)
        ref[p + "ffn_out_weight"] = mlp.down_proj.weight.T
    ref["final_norm.gamma"] = m.norm.weight
    return {k: v.detach().float().contiguous() for k, v in ref.items()}


def _rotary_bert_reference(m) -> dict[str, torch.Tensor]:
    """reference_tensors for the rotary post-LayerNorm models (NomicBertModel, GteModel,
    JinaEmbeddingsV3Model), from transformers' modules: no position table; Q|K|V fused; zeros for
    the biases a model has not; a gated MLP's FFN-in is [gate | up], BERT's MLP is fc1."""
    e = m.embeddings

    def bias(linear):
        return linear.bias if linear.bias is not None else torch.zeros(linear.weight.shape[0])

    ref = {
        "embeddings.word": e.word_embeddings.weight,
        "embeddings.token_type": e.token_type_embeddings.weight,
        "embeddings.ln_gamma": e.LayerNorm.weight,
        "embeddings.ln_beta": e.LayerNorm.bias,
    }
    for i, layer in enumerate(m.layers):
        a, mlp = layer.self_attn, layer.mlp
        p = f"layers.{i}."
        ref[p + "qkv_weight"] = torch.cat([a.q_proj.weight.T, a.k_proj.weight.T, a.v_proj.weight.T], dim=1)
        ref[p + "qkv_bias"] = torch.cat([bias(a.q_proj), bias(a.k_proj), bias(a.v_proj)])
        ref[p + "attn_out_weight"] = a.o_proj.weight.T
        ref[p + "attn_out_bias"] = bias(a.o_proj)
        ref[p + "attn_ln_gamma"] = layer.post_attention_layernorm.weight
        ref[p + "attn_ln_beta"] = layer.post_attention_layernorm.bias
        if hasattr(mlp, "gate_proj"):
            ref[p + "ffn_in_weight"] = torch.cat([mlp.gate_proj.weight.T, mlp.up_proj.weight.T], dim=1)
            ref[p + "ffn_in_bias"] = torch.cat([bias(mlp.gate_proj), bias(mlp.up_proj)])
            out = mlp.down_proj
        else:
            ref[p + "ffn_in_weight"] = mlp.fc1.weight.T
            ref[p + "ffn_in_bias"] = bias(mlp.fc1)
            out = mlp.fc2
        ref[p + "ffn_out_weight"] = out.weight.T
        ref[p + "ffn_out_bias"] = bias(out)
        ref[p + "ffn_ln_gamma"] = layer.post_mlp_layernorm.weight
        ref[p + "ffn_ln_beta"] = layer.post_mlp_layernorm.bias
    if getattr(m, "pooler", None) is not None:
        ref["pooler.weight"] = m.pooler.dense.weight.T
        ref["pooler.bias"] = m.pooler.dense.bias
    return {k: v.detach().float().contiguous() for k, v in ref.items()}


def _bert_layer_after_attention(layer, p: str) -> dict[str, torch.Tensor]:
    """A BERT-named layer's tensors after Q|K|V (attention.output, intermediate, output), under
    the engine's names with prefix p."""
    o = layer.attention.output
    return {p + "attn_out_weight": o.dense.weight.T, p + "attn_out_bias": o.dense.bias,
            p + "attn_ln_gamma": o.LayerNorm.weight, p + "attn_ln_beta": o.LayerNorm.bias,
            p + "ffn_in_weight": layer.intermediate.dense.weight.T, p + "ffn_in_bias": layer.intermediate.dense.bias,
            p + "ffn_out_weight": layer.output.dense.weight.T, p + "ffn_out_bias": layer.output.dense.bias,
            p + "ffn_ln_gamma": layer.output.LayerNorm.weight, p + "ffn_ln_beta": layer.output.LayerNorm.bias}


def _deberta_reference(m) -> dict[str, torch.Tensor]:
    """reference_tensors for a DebertaV2Model: the position table only where position_biased_input,
    a zero token-type row where it has no table, the relative embeddings and their norm after the
    embeddings, attention under attention.self.{query,key,value}_proj; BERT's layer otherwise."""
    e = m.embeddings
    ref = {"embeddings.word": e.word_embeddings.weight}
    if e.position_biased_input:
        ref["embeddings.position"] = e.position_embeddings.weight
    ref["embeddings.token_type"] = (e.token_type_embeddings.weight if e.token_type_embeddings is not None
                                    else torch.zeros(1, e.word_embeddings.weight.shape[1]))
    ref["embeddings.ln_gamma"] = e.LayerNorm.weight
    ref["embeddings.ln_beta"] = e.LayerNorm.bias
    ref["encoder.rel_embeddings"] = m.encoder.rel_embeddings.weight
    if "layer_norm" in m.encoder.norm_rel_ebd:
        ref["encoder.rel_ln_gamma"] = m.encoder.LayerNorm.weight
        ref["encoder.rel_ln_beta"] = m.encoder.LayerNorm.bias
    for i, layer in enumerate(m.encoder.layer):
        s = layer.attention.self
        p = f"layers.{i}."
        ref[p + "qkv_weight"] = torch.cat([s.query_proj.weight.T, s.key_proj.weight.T, s.value_proj.weight.T],
                                          dim=1)
        ref[p + "qkv_bias"] = torch.cat([s.query_proj.bias, s.key_proj.bias, s.value_proj.bias])
        ref.update(_bert_layer_after_attention(layer, p))
    return {k: v.detach().float().contiguous() for k, v in ref.items()}


def _mpnet_reference(m) -> dict[str, torch.Tensor]:
    """reference_tensors for an MPNetModel: no token-type table (the engine's is one zero row), the
    relative bias table after the embeddings, attention under attention.attn.{q,k,v,o}."""
    e = m.embeddings
    ref = {
        "embeddings.word": e.word_embeddings.weight,
        "embeddings.position": e.position_embeddings.weight,
        "embeddings.token_type": torch.zeros(1, e.word_embeddings.weight.shape[1]),
        "embeddings.ln_gamma": e.LayerNorm.weight,
        "embeddings.ln_beta": e.LayerNorm.bias,
        "encoder.relative_attention_bias": m.encoder.relative_attention_bias.weight,
    }
    for i, layer in enumerate(m.encoder.layer):
        a = layer.attention.attn
        p = f"layers.{i}."
        ref[p + "qkv_weight"] = torch.cat([a.q.weight.T, a.k.weight.T, a.v.weight.T], dim=1)
        ref[p + "qkv_bias"] = torch.cat([a.q.bias, a.k.bias, a.v.bias])
        ref[p + "attn_out_weight"] = a.o.weight.T
        ref[p + "attn_out_bias"] = a.o.bias
        ref[p + "attn_ln_gamma"] = layer.attention.LayerNorm.weight
        ref[p + "attn_ln_beta"] = layer.attention.LayerNorm.bias
        ref[p + "ffn_in_weight"] = layer.intermediate.dense.weight.T
        ref[p + "ffn_in_bias"] = layer.intermediate.dense.bias
        ref[p + "ffn_out_weight"] = layer.output.dense.weight.T
        ref[p + "ffn_out_bias"] = layer.output.dense.bias
        ref[p + "ffn_ln_gamma"] = layer.output.LayerNorm.weight
        ref[p + "ffn_ln_beta"] = layer.output.LayerNorm.bias
    if getattr(m, "pooler", None) is not None:
        ref["pooler.weight"] = m.pooler.dense.weight.T
        ref["pooler.bias"] = m.pooler.dense.bias
    return {k: v.detach().float().contiguous() for k, v in ref.items()}


def _distilbert_reference(m) -> dict[str, torch.Tensor]:
    """reference_tensors for a DistilBertModel: no token-type table in the model (the engine's is one
    zero row), no pooler."""
    e = m.embeddings
    ref = {
        "embeddings.word": e.word_embeddings.weight,
        "embeddings.position": e.position_embeddings.weight,
        "embeddings.token_type": torch.zeros(1, e.word_embeddings.weight.shape[1]),
        "embeddings.ln_gamma": e.LayerNorm.weight,
        "embeddings.ln_beta": e.LayerNorm.bias,
    }
    for i, layer in enumerate(m.transformer.layer):
        a, f = layer.attention, layer.ffn
        p = f"layers.{i}."
        ref[p + "qkv_weight"] = torch.cat([a.q_lin.weight.T, a.k_lin.weight.T, a.v_lin.weight.T], dim=1)
        ref[p + "qkv_bias"] = torch.cat([a.q_lin.bias, a.k_lin.bias, a.v_lin.bias])
        ref[p + "attn_out_weight"] = a.out_lin.weight.T
        ref[p + "attn_out_bias"] = a.out_lin.bias
        ref[p + "attn_ln_gamma"] = layer.sa_layer_norm.weight
        ref[p + "attn_ln_beta"] = layer.sa_layer_norm.bias
        ref[p + "ffn_in_weight"] = f.lin1.weight.T
        ref[p + "ffn_in_bias"] = f.lin1.bias
        ref[p + "ffn_out_weight"] = f.lin2.weight.T
        ref[p + "ffn_out_bias"] = f.lin2.bias
        ref[p + "ffn_ln_gamma"] = layer.output_layer_norm.weight
        ref[p + "ffn_ln_beta"] = layer.output_layer_norm.bias
    return {k: v.detach().float().contiguous() for k, v in ref.items()}


def model_classes(family: str, kind: str = "model"):
    """(config class, model class) of a family's model of `kind` ("model", "mlm", "cls", "choice", and
    "pretrain": ElectraForPreTraining)."""
    import transformers

    stem = FAMILY_CLASSES[family]
    if getattr(transformers, stem + "Config", None) is None:
        pytest.skip(f"transformers {transformers.__version__} has no {stem}Config")
    return getattr(transformers, stem + "Config"), getattr(transformers, stem + _KIND_SUFFIX[kind])


def build_model(kind: str = "model", family: str = "bert", **overrides):
    """A random model of the family and kind; every parameter random (HF's init zeroes biases, which
    would hide a bias placed in the wrong slot)."""
    config_cls, cls = model_classes(family, kind)
    values = {**TINY, **overrides}
    if family == "electra":
        values.setdefault("embedding_size", ELECTRA_EMBEDDING_SIZE)
    if family == "distilbert":
        values = {DISTILBERT_KEYS.get(k, k): v for k, v in values.items()}
        values.pop(None, None)
    config = config_cls(**values)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model.eval()


def save_checkpoint(model, path: Path, layout: str = "safetensors") -> Path:
    """Saves as HF does: safetensors (single or sharded) via save_pretrained; .bin with torch.save
    and, when sharded, an index in HF's layout (recent transformers no longer write .bin files)."""
    path.mkdir(parents=True, exist_ok=True)
    if layout == "safetensors":
        model.save_pretrained(path)
    elif layout == "sharded":
        model.save_pretrained(path, max_shard_size="20KB")
        assert (path / "model.safetensors.index.json").is_file()
    elif layout in ("bin", "bin_sharded"):
        model.config.architectures = [type(model).__name__]  # as save_pretrained records it
        model.config.save_pretrained(path)
        sd = model.state_dict()
        if layout == "bin":
            torch.save(sd, path / "pytorch_model.bin")
        else:
            names = list(sd)
            parts = [names[k::3] for k in range(3)]
            weight_map = {}
            for k, part in enumerate(parts):
                fname = f"pytorch_model-{k + 1:05d}-of-{len(parts):05d}.bin"
                torch.save({n: sd[n].clone() for n in part}, path / fname)
                weight_map.update({n: fname for n in part})
            (path / "pytorch_model.bin.index.json").write_text(
                json.dumps({"metadata": {}, "weight_map": weight_map})
            )
    else:
        raise ValueError(layout)
    return path


# config.json's quantization_config as llm-compressor writes it for its FP8_DYNAMIC scheme: weights
# 8-bit float, static, per output channel; activations dynamic per token (nothing stored for them).
def fp8_quantization_config(strategy: str = "channel", ignore=("classifier",)) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True,
                            "dynamic": False, "group_size": None, "block_structure": None, "actorder": None,
                            "observer": "minmax", "observer_kwargs": {}},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                      "dynamic": True, "group_size": None, "block_structure": None,
                                      "actorder": None, "observer": None, "observer_kwargs": {}},
                "output_activations": None,
                "format": "float-quantized",
            }
        },
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "global_compression_ratio": None,
    }


def save_fp8_checkpoint(model, path: Path, strategy: str = "channel", scale_dtype=torch.bfloat16,
                        rest_dtype=None, layout: str = "safetensors", ignore=("classifier",)):
    """Saves `model` as a compressed-tensors FP8 checkpoint (what llm-compressor's FP8 schemes
    write): each nn.Linear's weight, except those under `ignore`, as float8_e4m3fn [out, in] with
    X.weight_scale = max|w| / 448 in `scale_dtype`, per output row ([out, 1], "channel") or for the
    whole tensor ([1], "tensor"); the other tensors in `rest_dtype` (default: as they are).

    Returns (path, dequantized): `dequantized` is a copy of the model holding what the checkpoint
    means (weight * weight_scale, the other tensors through rest_dtype), the oracle of the readers."""
    import copy

    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ref = copy.deepcopy(model)
    ref_sd = ref.state_dict()
    quantized = set()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or any(name.split(".")[0] == i for i in ignore):
            continue
        w = module.weight.detach().float()
        top = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax().reshape(1)
        scale = (top / 448.0).to(scale_dtype)
        q = (w / scale.float()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        sd[name + ".weight"] = q
        sd[name + ".weight_scale"] = scale
        quantized.add(name + ".weight")
        with torch.no_grad():
            ref_sd[name + ".weight"].copy_(q.float() * scale.float())
    for k, v in sd.items():
        if k not in quantized and not k.endswith("weight_scale") and rest_dtype is not None and v.is_floating_point():
            sd[k] = v.to(rest_dtype)
            with torch.no_grad():
                ref_sd[k].copy_(sd[k].float())
    path.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"] = fp8_quantization_config(strategy, ignore)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    sd = {k: v.contiguous() for k, v in sd.items()}
    if layout == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    elif layout == "bin":
        torch.save(sd, path / "pytorch_model.bin")
    else:
        raise ValueError(layout)
    return path, ref.eval()


@pytest.fixture
def make_checkpoint(tmp_path):
    """make_checkpoint(kind, layout, family="bert", **config overrides) -> (directory, model)."""
    count = [0]

    def make(kind: str = "model", layout: str = "safetensors", family: str = "bert", **overrides):
        count[0] += 1
        model = build_model(kind, family, **overrides)
        return save_checkpoint(model, tmp_path / f"hf{count[0]}", layout), model

    return make


@pytest.fixture(scope="session")
def hf():
    """The helpers above, for tests (a conftest is not importable as a module in every import mode)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        TINY=TINY,
        family=BERT,
        ROBERTA_FAMILY=ROBERTA_FAMILY,
        model_classes=model_classes,
        hf_name=hf_name,
        backbone=backbone,
        reference_tensors=reference_tensors,
        build_model=build_model,
        save_checkpoint=save_checkpoint,
        save_fp8_checkpoint=save_fp8_checkpoint,
        fp8_quantization_config=fp8_quantization_config,
    )
