"""Small random-initialised HuggingFace BERT checkpoints for tests."""

from pathlib import Path

import torch
from transformers import BertConfig, BertModel


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
    # Random-init LayerNorm is gamma=1, beta=0: perturb so the test sees the real parameters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, **save_kwargs)
    return model
