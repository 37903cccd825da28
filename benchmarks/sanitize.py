"""Small workloads for compute-sanitizer (run by gpu_check.sh).

  sanitize.py forward  - a small model's forward in float32, float16 and bfloat16, both attentions
  sanitize.py ops      - the softmax (both variants), LayerNorm and flash attention kernels
"""

import sys
import tempfile

import numpy as np
import torch
from transformers import BertConfig, BertModel

import ftbert
from ftbert import _C


def forward() -> None:
    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=301, max_position_embeddings=256)
        BertModel(cfg).save_pretrained(d)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 97, (3, 77))
        mask = np.ones((3, 77), np.int64)
        mask[1, 40:] = 0
        mask[2, :9] = 0
        for dtype in ("float32", "float16", "bfloat16"):
            for attention in ("unfused", "auto"):
                enc = ftbert.Encoder.from_pretrained(d, device="cuda", dtype=dtype, attention=attention)
                out = enc(ids, mask)
                assert np.isfinite(out.last_hidden_state).all()
                print(dtype, attention, enc.attention_for(3, 77), "ok")


def ops() -> None:
    rng = np.random.default_rng(1)
    r = _C.OpRunner("cuda")
    for dtype in ("float32", "float16", "bfloat16"):
        for seq in (7, 129, 1500):  # warp-per-row and block-per-row softmax
            scores = rng.standard_normal((2, 2, seq, seq)).astype(np.float32)
            mask = np.ones((2, seq), np.int32)
            mask[1, seq // 2 :] = 0
            assert np.isfinite(r.masked_softmax(dtype, scores, mask, 0.125)).all()
        for hidden in (48, 768, 1000):
            x = rng.standard_normal((37, hidden)).astype(np.float32)
            v = rng.standard_normal(hidden).astype(np.float32)
            assert np.isfinite(r.add_bias_residual_layernorm(dtype, x, x, v, v, v, 1e-12)).all()
        if dtype != "float32":
            for d in (32, 64, 128):
                qkv = rng.standard_normal((2, 97, 3 * 2 * d)).astype(np.float32)
                mask = np.ones((2, 97), np.int32)
                mask[1, 50:] = 0
                out = r.flash_attention(dtype, qkv, np.zeros(6 * d, np.float32), mask, 2, d**-0.5)
                assert np.isfinite(out).all()
        print(dtype, "ok")


if __name__ == "__main__":
    {"forward": forward, "ops": ops}[sys.argv[1]]()
