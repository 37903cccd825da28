"""Small random-initialised HuggingFace checkpoints (BERT, the RoBERTa family, DistilBERT, ELECTRA)
for tests."""

from pathlib import Path

import torch
from transformers import BertConfig, BertModel


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
    **save_kwargs,
) -> BertModel:
    """Saves a random BertModel to `path` (safetensors by default) and returns it in eval mode."""
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden - 3,  # odd on purpose
        max_position_embeddings=max_pos,
        type_vocab_size=type_vocab,
        hidden_act=act,
        attn_implementation="eager",
    )
    model = BertModel(cfg).eval()
    _perturb_layer_norms(model)
    model.save_pretrained(path, **save_kwargs)
    return model


# model_type -> the transformers classes of that RoBERTa-family model: (config, bare encoder, task
# models by kind). All keep the encoder under `roberta.` in their task models.
ROBERTA_FAMILY = {
    "roberta": ("RobertaConfig", "RobertaModel", "Roberta"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", "XLMRoberta"),
    "camembert": ("CamembertConfig", "CamembertModel", "Camembert"),
}
TASK_SUFFIXES = {"mlm": "ForMaskedLM", "cls": "ForSequenceClassification", "choice": "ForMultipleChoice"}


def roberta_classes(family: str, kind: str = "model"):
    """(config class, model class) of a RoBERTa-family model; kind "model" (the bare encoder),
    "mlm", "cls" or "choice" (the task models)."""
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
    **save_kwargs,
):
    """Saves a random RoBERTa-family model to `path` and returns it in eval mode.

    family: "roberta", "xlm-roberta" or "camembert". kind: "model" (RobertaModel & co., with a
    pooler unless pooler=False), "mlm", "cls" or "choice" (task models; only ForMultipleChoice keeps
    a pooler). The defaults are those of the released checkpoints (max_position_embeddings 514,
    pad_token_id 1, one token type, eps 1e-5), at a tiny size with an odd intermediate size.
    """
    torch.manual_seed(seed)
    config_cls, model_cls = roberta_classes(family, kind)
    cfg = config_cls(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden - 3,  # odd on purpose
        max_position_embeddings=max_pos,
        type_vocab_size=type_vocab,
        hidden_act=act,
        layer_norm_eps=eps,
        pad_token_id=pad,
        bos_token_id=0 if pad != 0 else 2,
        eos_token_id=2 if pad != 2 else 0,
        attn_implementation="eager",
    )
    model = (model_cls(cfg, add_pooling_layer=pooler) if kind == "model" else model_cls(cfg)).eval()
    _perturb_layer_norms(model)
    model.save_pretrained(path, **save_kwargs)
    return model


DISTILBERT_KINDS = {"model": "DistilBertModel", "mlm": "DistilBertForMaskedLM",
                    "cls": "DistilBertForSequenceClassification"}


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
    **save_kwargs,
):
    """Saves a random DistilBERT model to `path` and returns it in eval mode. kind: "model"
    (DistilBertModel), "mlm" or "cls" (task models: the encoder under `distilbert.`, heads ignored
    by the converter). DistilBERT has no token types and no pooler; LayerNorm eps is 1e-12."""
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
    )
    model = getattr(transformers, DISTILBERT_KINDS[kind])(cfg).eval()
    _fill_biases(model)
    _perturb_layer_norms(model)
    model.save_pretrained(path, **save_kwargs)
    return model


ELECTRA_KINDS = {"model": "ElectraModel", "pretrain": "ElectraForPreTraining",
                 "cls": "ElectraForSequenceClassification"}


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
    **save_kwargs,
):
    """Saves a random ELECTRA discriminator to `path` and returns it in eval mode. kind: "model"
    (ElectraModel), "pretrain" (ElectraForPreTraining) or "cls" (ElectraForSequenceClassification):
    the encoder under `electra.`, heads ignored by the converter. embedding: embedding_size; when it
    differs from hidden, transformers adds `embeddings_project` (Linear embedding -> hidden)."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.ElectraConfig(
        vocab_size=vocab,
        embedding_size=embedding,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden - 3,  # odd on purpose
        max_position_embeddings=max_pos,
        type_vocab_size=type_vocab,
        hidden_act=act,
        attn_implementation="eager",
    )
    model = getattr(transformers, ELECTRA_KINDS[kind])(cfg).eval()
    _fill_biases(model)  # the projection's too
    _perturb_layer_norms(model)
    model.save_pretrained(path, **save_kwargs)
    return model


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
