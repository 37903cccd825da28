"""The RoBERTa family (roberta, xlm-roberta, camembert), DistilBERT and ELECTRA on the CPU against
transformers in float32 (max abs error <= 1e-4): position ids counted from the pad id over the non-pad
input_ids, the usable length max_position_embeddings - pad_token_id - 1, DistilBERT's absolute
positions, missing token types and pooler, ELECTRA's narrow embeddings and their projection, task
checkpoints, converted directories, and version-1 conversions (BERT) that must still load. Every
family's parity at several shapes and paddings, bare and with heads, is test_head_parity.py's,
driven by the family tables."""

import json

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_bert, make_distilbert, make_electra, make_roberta, write_roberta_tokenizer
from tests._util import ragged_mask

TOL = 1e-4
# Task checkpoints here (masked LM, pre-training) load their encoder; that their head is left out
# with a warning is tested in test_head_parity.py.
pytestmark = pytest.mark.filterwarnings("ignore:.*is not supported and is left out:UserWarning")

# name -> make_roberta arguments: small odd sizes (head dims 16 and 32, odd intermediate sizes,
# vocabularies near 150), with and without a pooler; "roberta-pad3" moves the pad id (and so every
# position) and shortens the table so the limit is cheap to reach.
MODELS = {
    "roberta": dict(family="roberta", hidden=64, heads=4, layers=2, vocab=151, seed=1),
    "xlm-roberta": dict(family="xlm-roberta", hidden=48, heads=3, layers=1, vocab=149, pooler=False,
                        act="gelu_new", seed=2),
    "camembert": dict(family="camembert", hidden=64, heads=2, layers=2, vocab=157, intermediate=131,
                      seed=3),
    "roberta-pad3": dict(family="roberta", hidden=48, heads=2, layers=2, vocab=150, pad=3, max_pos=40,
                         seed=4),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model_pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_roberta(path, **MODELS[request.param])
    return hf, ftbert.Encoder.from_pretrained(path)


def make_inputs(rng, config, batch, seq, padding):
    """input_ids with pad_token_id exactly where the mask is 0 (transformers counts positions from
    the ids), and no pad id elsewhere. padding: "none" (full rows), "right" or "left"."""
    pad, vocab = config.pad_token_id, config.vocab_size
    ids = rng.integers(0, vocab - 1, (batch, seq))
    ids += ids >= pad  # every id but the pad id
    if padding == "none":
        mask = np.ones((batch, seq), np.int32)
    else:
        mask = ragged_mask(rng, batch, seq, left=padding == "left")
    ids[mask == 0] = pad
    return ids.astype(np.int64), mask


def backbone(hf):
    return getattr(hf, hf.base_model_prefix, hf)


def reference(hf, ids, mask):
    with torch.no_grad():
        return backbone(hf)(torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long())


def assert_parity(hf, out, ids, mask):
    ref = reference(hf, ids, mask)
    assert np.isfinite(out.last_hidden_state).all()  # padded rows too
    valid = mask.astype(bool)
    err_h = np.abs(out.last_hidden_state - ref.last_hidden_state.numpy())[valid].max()
    assert err_h <= TOL, f"hidden {err_h:.2e}"
    if ref.pooler_output is None:
        assert out.pooler_output is None
    else:
        # The pooler reads token 0, a pad token in left-padded rows: its position is pad_token_id.
        err_p = np.abs(out.pooler_output - ref.pooler_output.numpy()).max()
        assert err_p <= TOL, f"pooler {err_p:.2e}"


def test_config_records_the_family_and_its_positions(model_pair):
    hf, enc = model_pair
    c = enc.config
    assert c["model_type"] == hf.config.model_type
    assert c["position_ids"] == "padding_offset" and c["pad_token_id"] == hf.config.pad_token_id
    assert c["type_vocab_size"] == 1  # RoBERTa's one-row token-type table, kept as it is
    assert c["has_pooler"] is (backbone(hf).pooler is not None)


def test_usable_length_runs_and_one_more_token_is_refused(model_pair, rng):
    hf, enc = model_pair
    P, pad = hf.config.max_position_embeddings, hf.config.pad_token_id
    limit = P - pad - 1
    assert enc.max_seq_length == limit
    ids, mask = make_inputs(rng, hf.config, 2, limit, "left")  # row 0 full: position P - 1 is used
    assert_parity(hf, enc(ids, mask), ids, mask)
    longer = np.concatenate([ids, ids[:, :1]], axis=1)
    pattern = f"sequence length {limit + 1}, which exceeds the usable length {limit} "
    with pytest.raises(ValueError, match=pattern):
        enc(longer)
    with pytest.raises(ValueError, match=pattern):
        enc(torch.from_numpy(longer))


def test_sentence_transformers_length_is_capped_at_the_usable_length(model_pair):
    hf, enc = model_pair
    limit = hf.config.max_position_embeddings - hf.config.pad_token_id - 1
    enc.config["max_seq_length"] = limit + 50
    try:
        assert enc.max_seq_length == limit
        enc.config["max_seq_length"] = 5
        assert enc.max_seq_length == 5
    finally:
        enc.config["max_seq_length"] = None


def test_positions_come_from_the_ids_not_the_mask(model_pair, rng):
    # A pad id under mask 1 sits at position pad_token_id in transformers (and does not advance the
    # count for the tokens after it): the engine counts from input_ids as well.
    hf, enc = model_pair
    ids, mask = make_inputs(rng, hf.config, 3, 20, "right")
    ids[:, [2, 5]] = hf.config.pad_token_id
    mask[:, :6] = 1
    assert_parity(hf, enc(ids, mask), ids, mask)


@pytest.mark.parametrize(
    "family, kind",
    [("roberta", "mlm"), ("roberta", "cls"), ("xlm-roberta", "cls"), ("camembert", "cls"),
     ("camembert", "choice")],
)
def test_task_checkpoints_load_their_encoder(tmp_path, rng, family, kind):
    # ForMaskedLM / ForSequenceClassification have no pooler and a head (ignored, as for BERT);
    # ForMultipleChoice keeps the pooler.
    hf = make_roberta(tmp_path, family=family, kind=kind, hidden=48, heads=2, layers=1, vocab=153, seed=5)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.config["has_pooler"] is (kind == "choice")
    ids, mask = make_inputs(rng, hf.config, 3, 11, "left")
    assert_parity(hf, enc(ids, mask), ids, mask)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "camembert"])
def test_converted_directory_runs_as_the_hf_directory(tmp_path, rng, family):
    src = tmp_path / "hf"
    hf = make_roberta(src, family=family, hidden=48, heads=3, layers=2, vocab=151, seed=6)
    out = ftbert.convert_checkpoint(src, tmp_path / "converted", progress=False)
    config, _ = ftbert.weights_tools.read_converted(out)
    stored = json.loads((out / "ftbert_config.json").read_text())
    assert stored["format_version"] == 2 and stored["model_type"] == family
    assert (stored["position_ids"], stored["pad_token_id"]) == ("padding_offset", 1)
    from_hf = ftbert.Encoder.from_pretrained(src)
    from_converted = ftbert.Encoder.from_pretrained(out)
    assert {k: v for k, v in from_hf.config.items() if not k.startswith("weights_")} == {
        k: v for k, v in config.items() if not k.startswith("weights_")
    }
    ids, mask = make_inputs(rng, hf.config, 3, 17, "left")
    a, b = from_hf(ids, mask), from_converted(ids, mask)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    np.testing.assert_array_equal(a.pooler_output, b.pooler_output)
    assert_parity(hf, b, ids, mask)


def test_version_1_conversion_still_loads_as_bert(tmp_path, rng):
    # A BERT converted before format version 2: no position_ids, no pad_token_id.
    src = tmp_path / "hf"
    hf = make_bert(src, hidden=48, heads=2, layers=1, vocab=101, max_pos=64, seed=7)
    out = ftbert.convert_checkpoint(src, tmp_path / "converted", progress=False)
    path = out / "ftbert_config.json"
    v2 = json.loads(path.read_text())
    v1 = {k: v for k, v in v2.items() if k not in ("position_ids", "pad_token_id")}
    path.write_text(json.dumps({**v1, "format_version": 1}))
    enc = ftbert.Encoder.from_pretrained(out)
    assert enc.config["format_version"] == 1
    assert (enc.config["position_ids"], enc.config["pad_token_id"]) == ("absolute", 0)
    assert enc.max_seq_length == 64
    ids = rng.integers(0, 101, (2, 64))
    mask = ragged_mask(rng, 2, 64, left=True)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    out = enc(ids, mask)
    valid = mask.astype(bool)
    assert np.abs(out.last_hidden_state - ref.last_hidden_state.numpy())[valid].max() <= TOL
    assert np.abs(out.pooler_output - ref.pooler_output.numpy()).max() <= TOL
    with pytest.raises(ValueError, match="sequence length 65, which exceeds max_position_embeddings 64"):
        enc(np.zeros((1, 65), np.int64))


def test_encode_truncates_at_the_usable_length_and_matches_transformers(tmp_path):
    # Through the checkpoint's own tokenizer, which pads with <pad> (id 1): a text past 512 tokens
    # is cut at 512, not at max_position_embeddings 514, and mean pooling matches transformers'.
    hf = make_roberta(tmp_path, hidden=48, heads=2, layers=1, vocab=151, seed=8)
    tok = write_roberta_tokenizer(tmp_path)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    texts = ["a short one", "hello world " * 60, "x"]  # the long one: 720 tokens
    got = enc.encode(texts, pooling="mean", normalize=False)
    batch = tok(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 512
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).float()
    want = ((hidden * m).sum(1) / m.sum(1)).numpy()
    assert np.abs(got - want).max() <= TOL


# ---- DistilBERT ----------------------------------------------------------------------------------

# name -> make_distilbert arguments: dims 48 and 64, 2 to 4 heads (head dims 12 to 32), one or two
# layers, odd FFN sizes and vocabularies; "distilbert-short" has a short position table so its limit
# is cheap to reach, and sinusoidal positions (the table is still the checkpoint's).
DISTILBERT_MODELS = {
    "distilbert": dict(dim=64, heads=4, layers=2, vocab=163, seed=11),
    "distilbert-48": dict(dim=48, heads=3, layers=1, hidden_dim=97, vocab=149, act="relu", seed=12),
    "distilbert-short": dict(dim=48, heads=2, layers=2, hidden_dim=131, vocab=157, max_pos=40,
                             sinusoidal=True, seed=13),
}


@pytest.fixture(scope="module", params=list(DISTILBERT_MODELS))
def distilbert_pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_distilbert(path, **DISTILBERT_MODELS[request.param])
    return hf, ftbert.Encoder.from_pretrained(path)


def assert_distilbert_parity(hf, out, ids, mask):
    ref = reference(hf, ids, mask).last_hidden_state.numpy()
    assert np.isfinite(out.last_hidden_state).all()
    valid = mask.astype(bool)
    err = np.abs(out.last_hidden_state - ref)[valid].max()
    assert err <= TOL, f"hidden {err:.2e}"
    assert out.pooler_output is None


def test_distilbert_config_has_no_token_types_and_no_pooler(distilbert_pair):
    hf, enc = distilbert_pair
    c = enc.config
    assert c["model_type"] == "distilbert" and c["position_ids"] == "absolute"
    assert (c["type_vocab_size"], c["has_pooler"], c["layer_norm_eps"]) == (1, False, 1e-12)
    assert (c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["intermediate_size"]) == (
        hf.config.dim, hf.config.n_heads, hf.config.n_layers, hf.config.hidden_dim)
    assert enc.max_seq_length == hf.config.max_position_embeddings


def test_distilbert_token_type_zero_is_accepted_and_others_refused(distilbert_pair, rng):
    hf, enc = distilbert_pair
    ids, mask = make_inputs(rng, hf.config, 2, 9, "right")
    tt = np.zeros_like(ids)
    assert_distilbert_parity(hf, enc(ids, mask, tt), ids, mask)
    tt[0, 3] = 1
    with pytest.raises(ValueError, match="type"):
        enc(ids, mask, tt)


def test_distilbert_full_length_runs_and_one_more_token_is_refused(tmp_path, rng):
    hf = make_distilbert(tmp_path, **DISTILBERT_MODELS["distilbert-short"])
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    P = hf.config.max_position_embeddings
    ids, mask = make_inputs(rng, hf.config, 2, P, "left")
    assert_distilbert_parity(hf, enc(ids, mask), ids, mask)
    with pytest.raises(ValueError, match=f"sequence length {P + 1}, which exceeds max_position_embeddings {P}"):
        enc(np.concatenate([ids, ids[:, :1]], axis=1))


@pytest.mark.parametrize("kind", ["mlm", "cls"])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_distilbert_task_checkpoints_load_their_encoder(tmp_path, rng, kind, padding):
    # ForMaskedLM's vocab_* and ForSequenceClassification's pre_classifier / classifier are ignored.
    hf = make_distilbert(tmp_path, kind=kind, dim=48, heads=4, layers=1, hidden_dim=101, vocab=151, seed=14)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.config["has_pooler"] is False and enc.config["model_type"] == "distilbert"
    ids, mask = make_inputs(rng, hf.config, 3, 13, padding)
    assert_distilbert_parity(hf, enc(ids, mask), ids, mask)


def test_distilbert_converted_directory_runs_as_the_hf_directory(tmp_path, rng):
    src = tmp_path / "hf"
    hf = make_distilbert(src, kind="cls", dim=64, heads=2, layers=2, vocab=151, seed=15)
    out = ftbert.convert_checkpoint(src, tmp_path / "converted", progress=False)
    config, tensors = ftbert.weights_tools.read_converted(out)
    stored = json.loads((out / "ftbert_config.json").read_text())
    assert stored["format_version"] == 2 and stored["model_type"] == "distilbert"
    assert (stored["position_ids"], stored["type_vocab_size"], stored["has_pooler"]) == ("absolute", 1, False)
    assert not tensors["embeddings.token_type"].any()
    from_hf = ftbert.Encoder.from_pretrained(src)
    from_converted = ftbert.Encoder.from_pretrained(out)
    assert {k: v for k, v in from_hf.config.items() if not k.startswith("weights_")} == {
        k: v for k, v in config.items() if not k.startswith("weights_")
    }
    ids, mask = make_inputs(rng, hf.config, 3, 17, "left")
    a, b = from_hf(ids, mask), from_converted(ids, mask)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    assert a.pooler_output is None and b.pooler_output is None
    assert_distilbert_parity(hf, b, ids, mask)


# ---- ELECTRA -------------------------------------------------------------------------------------

# name -> make_electra arguments: embeddings narrower than the encoder (32 -> 64, 16 -> 48: the
# projection), and as wide ("electra-equal": no embeddings_project in transformers, none in the
# engine); 2 to 4 heads, one or two layers, odd FFN sizes and vocabularies, three token types;
# "electra-short" has a short position table so its limit is cheap to reach.
ELECTRA_MODELS = {
    "electra": dict(embedding=32, hidden=64, heads=4, layers=2, intermediate=131, vocab=173, seed=21),
    "electra-equal": dict(embedding=48, hidden=48, heads=3, layers=1, intermediate=97, vocab=151,
                          act="gelu_new", seed=22),
    "electra-short": dict(embedding=16, hidden=48, heads=2, layers=2, intermediate=101, vocab=157,
                          max_pos=40, type_vocab=3, seed=23),
}


@pytest.fixture(scope="module", params=list(ELECTRA_MODELS))
def electra_pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_electra(path, **ELECTRA_MODELS[request.param])
    return hf, ftbert.Encoder.from_pretrained(path)


def electra_inputs(rng, config, batch, seq, padding):
    """(input_ids, attention_mask, token_type_ids): ELECTRA's positions are absolute, so the ids
    under the mask are any; token types are drawn from the whole table."""
    ids, mask = make_inputs(rng, config, batch, seq, padding)
    return ids, mask, rng.integers(0, config.type_vocab_size, (batch, seq)).astype(np.int64)


def assert_electra_parity(hf, out, ids, mask, types=None):
    kwargs = {} if types is None else {"token_type_ids": torch.from_numpy(types)}
    with torch.no_grad():
        ref = backbone(hf)(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(), **kwargs)
    assert np.isfinite(out.last_hidden_state).all()
    valid = mask.astype(bool)
    err = np.abs(out.last_hidden_state - ref.last_hidden_state.numpy())[valid].max()
    assert err <= TOL, f"hidden {err:.2e}"
    assert out.pooler_output is None  # ElectraModel has no pooler


def test_electra_without_token_types_reads_type_zero(electra_pair, rng):
    hf, enc = electra_pair
    ids, mask, _ = electra_inputs(rng, hf.config, 3, 12, "right")
    assert_electra_parity(hf, enc(ids, mask), ids, mask)


def test_electra_config_records_the_embedding_size(electra_pair):
    hf, enc = electra_pair
    c, h = enc.config, hf.config
    assert c["model_type"] == "electra" and c["position_ids"] == "absolute" and c["has_pooler"] is False
    assert (c["embedding_size"], c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"],
            c["intermediate_size"], c["type_vocab_size"]) == (
        h.embedding_size, h.hidden_size, h.num_attention_heads, h.num_hidden_layers, h.intermediate_size,
        h.type_vocab_size)
    assert hasattr(backbone(hf), "embeddings_project") is (h.embedding_size != h.hidden_size)
    assert enc.max_seq_length == h.max_position_embeddings


def test_electra_full_length_runs_and_one_more_token_is_refused(tmp_path, rng):
    hf = make_electra(tmp_path, **ELECTRA_MODELS["electra-short"])
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    P = hf.config.max_position_embeddings
    ids, mask, types = electra_inputs(rng, hf.config, 2, P, "left")
    assert_electra_parity(hf, enc(ids, mask, types), ids, mask, types)
    pattern = f"sequence length {P + 1}, which exceeds max_position_embeddings {P}"
    with pytest.raises(ValueError, match=pattern):
        enc(np.concatenate([ids, ids[:, :1]], axis=1))


@pytest.mark.parametrize("kind", ["pretrain", "cls"])
@pytest.mark.parametrize("embedding", [32, 48])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_electra_task_checkpoints_load_their_encoder(tmp_path, rng, kind, embedding, padding):
    # ForPreTraining's discriminator_predictions and ForSequenceClassification's classifier are
    # ignored; the encoder under "electra." is read, projection and all.
    hf = make_electra(tmp_path, kind=kind, embedding=embedding, hidden=48, heads=4, layers=1, intermediate=101,
                      vocab=151, seed=24)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    assert enc.config["has_pooler"] is False and enc.config["model_type"] == "electra"
    assert enc.config["embedding_size"] == embedding
    ids, mask, types = electra_inputs(rng, hf.config, 3, 13, padding)
    assert_electra_parity(hf, enc(ids, mask, types), ids, mask, types)


@pytest.mark.parametrize("embedding", [32, 64])
def test_electra_converted_directory_runs_as_the_hf_directory(tmp_path, rng, embedding):
    src = tmp_path / "hf"
    hf = make_electra(src, kind="pretrain", embedding=embedding, hidden=64, heads=2, layers=2, vocab=151,
                      seed=25)
    out = ftbert.convert_checkpoint(src, tmp_path / "converted", progress=False)
    config, tensors = ftbert.weights_tools.read_converted(out)
    stored = json.loads((out / "ftbert_config.json").read_text())
    assert stored["format_version"] == 2 and stored["model_type"] == "electra"
    assert (stored["embedding_size"], stored["hidden_size"], stored["has_pooler"]) == (embedding, 64, False)
    names = list(tensors)
    if embedding != 64:
        assert names[5:7] == ["embeddings.project_weight", "embeddings.project_bias"]
        assert tensors["embeddings.project_weight"].shape == (embedding, 64)
    else:
        assert not any("project" in n for n in names)
    from_hf = ftbert.Encoder.from_pretrained(src)
    from_converted = ftbert.Encoder.from_pretrained(out)
    assert {k: v for k, v in from_hf.config.items() if not k.startswith("weights_")} == {
        k: v for k, v in config.items() if not k.startswith("weights_")
    }
    ids, mask, types = electra_inputs(rng, hf.config, 3, 17, "left")
    a, b = from_hf(ids, mask, types), from_converted(ids, mask, types)
    np.testing.assert_array_equal(a.last_hidden_state, b.last_hidden_state)
    assert a.pooler_output is None and b.pooler_output is None
    assert_electra_parity(hf, b, ids, mask, types)


def test_version_2_bert_without_embedding_size_still_loads(tmp_path, rng):
    # Converted before "embedding_size" existed: read as hidden_size, computed as before.
    src = tmp_path / "hf"
    hf = make_bert(src, hidden=48, heads=2, layers=1, vocab=101, seed=26)
    out = ftbert.convert_checkpoint(src, tmp_path / "converted", progress=False)
    path = out / "ftbert_config.json"
    cfg = json.loads(path.read_text())
    del cfg["embedding_size"]
    path.write_text(json.dumps(cfg))
    enc = ftbert.Encoder.from_pretrained(out)
    assert enc.config["embedding_size"] == 48 and enc.config["format_version"] == 2
    ids = rng.integers(0, 101, (2, 20))
    mask = ragged_mask(rng, 2, 20, left=False)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    got = enc(ids, mask)
    valid = mask.astype(bool)
    assert np.abs(got.last_hidden_state - ref.last_hidden_state.numpy())[valid].max() <= TOL
    assert np.abs(got.pooler_output - ref.pooler_output.numpy()).max() <= TOL
