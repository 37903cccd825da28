"""Conversion round trips: every input layout and model kind, every stored dtype, and the layout of
the converted tensors checked against what the HuggingFace modules compute."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

LAYOUTS = ("safetensors", "sharded", "bin", "bin_sharded")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_roundtrip_is_exact_for_every_input_layout(wt, hf, make_checkpoint, tmp_path, layout):
    src, model = make_checkpoint("model", layout)
    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    config, tensors = wt.read_converted(out)
    ref = hf.reference_tensors(model)
    assert list(tensors) == [n for n, _ in wt.expected_tensors(config)]
    assert set(tensors) == set(ref)
    for name, t in tensors.items():
        assert t.dtype == torch.float32, name
        assert torch.equal(t, ref[name]), name


@pytest.mark.parametrize("kind, has_pooler", [("model", True), ("mlm", False), ("cls", True)])
def test_task_models_convert_their_encoder_and_pooler_only_when_present(
    wt, hf, make_checkpoint, tmp_path, kind, has_pooler
):
    src, model = make_checkpoint(kind)
    from safetensors import safe_open

    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        prefixed = any(k.startswith(hf.family.weights.prefixes[0]) for k in f.keys())
    assert prefixed == (kind != "model")  # the task models keep the encoder under the prefix
    if kind == "mlm":  # a head the engine does not run is left out, with a word
        with pytest.warns(UserWarning, match="ForMaskedLM is not supported and is left out"):
            out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    else:
        out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    config, tensors = wt.read_converted(out)
    assert config["has_pooler"] is has_pooler
    assert ("pooler.weight" in tensors) is has_pooler
    ref = hf.reference_tensors(model)
    if kind == "cls":  # BERT's classifier reads the pooler output: only its output Linear is its own
        assert config["head"]["kind"] == "sequence_classification" and config["head"]["input"] == "pooler"
        assert "classifier.out_weight" in ref and "classifier.dense_weight" not in ref
    assert set(tensors) == set(ref)
    for name, t in tensors.items():
        assert torch.equal(t, ref[name]), name


@pytest.mark.parametrize("dtype, unit_roundoff", [("float16", 2.0**-11), ("bfloat16", 2.0**-8)])
def test_half_dtypes_are_within_one_rounding_of_float32(
    wt, hf, make_checkpoint, tmp_path, dtype, unit_roundoff
):
    src, model = make_checkpoint("cls", "sharded")
    out = wt.convert_checkpoint(src, tmp_path / "out", dtype=dtype, progress=False)
    config, tensors = wt.read_converted(out)
    assert config["dtype"] == dtype
    ref = hf.reference_tensors(model)
    smallest_subnormal = {"float16": 2.0**-24, "bfloat16": 2.0**-133}[dtype]
    for name, t in tensors.items():
        assert t.dtype == getattr(torch, dtype), name
        r = ref[name].double()
        err = (t.double() - r).abs()
        bound = torch.clamp(r.abs() * unit_roundoff, min=smallest_subnormal / 2)
        assert bool((err <= bound).all()), f"{name}: max error {float((err - bound).max())} past rounding"


def test_load_hf_checkpoint_gives_expected_tensors_in_float32(wt, hf, make_checkpoint, tmp_path):
    src, model = make_checkpoint("mlm", "bin")
    config, tensors = wt.load_hf_checkpoint(src)
    assert [(n, tuple(t.shape)) for n, t in tensors.items()] == wt.expected_tensors(config)
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors.values())
    assert config["dtype"] == "float32" and config["weights_file"] is None
    # Same content as a written conversion, apart from where the weights live.
    conv_config, conv = wt.read_converted(wt.convert_checkpoint(src, tmp_path / "out", progress=False))
    assert {k: v for k, v in conv_config.items() if not k.startswith("weights_")} == {
        k: v for k, v in config.items() if not k.startswith("weights_")
    }
    for name in tensors:
        assert torch.equal(tensors[name], conv[name]), name


def test_config_carries_the_hf_hyperparameters(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model", hidden_act="gelu_new", layer_norm_eps=3e-7)
    out = wt.convert_checkpoint(src, tmp_path / "out", dtype="bfloat16", progress=False)
    stored = json.loads((out / "ftbert_config.json").read_text())
    hf_cfg = json.loads((src / "config.json").read_text())
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
                "hidden_act"):
        assert stored[key] == hf_cfg[key], key
    assert stored["format"] == "ftbert" and stored["format_version"] == 2
    assert stored["model_type"] == "bert"
    assert (stored["position_ids"], stored["pad_token_id"]) == ("absolute", hf_cfg["pad_token_id"])
    assert stored["dtype"] == "bfloat16" and stored["max_seq_length"] is None
    assert len(stored["weights_sha256"]) == 64
    assert (out / "config.json").read_text() == (src / "config.json").read_text()


def test_qkv_columns_reproduce_the_hf_query_key_value_projections(wt, hf, make_checkpoint):
    src, model = make_checkpoint("model")
    config, t = wt.load_hf_checkpoint(src)
    H = config["hidden_size"]
    x = torch.randn(7, H, dtype=torch.float64)  # [M, H]
    for i, layer in enumerate(hf.backbone(model).encoder.layer):
        s = layer.attention.self
        y = x @ t[f"layers.{i}.qkv_weight"].double() + t[f"layers.{i}.qkv_bias"].double()  # [M, 3H]
        for j, lin in enumerate((s.query, s.key, s.value)):
            want = x @ lin.weight.double().T + lin.bias.double()  # HF: X · Wᵀ + b
            torch.testing.assert_close(y[:, j * H : (j + 1) * H], want, rtol=1e-12, atol=1e-12)


def _forward_from_converted(config, t, ids, mask, types):
    """A float64 BERT forward written against the engine's layout ([in, out] matrices, fused QKV)."""
    t = {k: v.double() for k, v in t.items()}
    H, heads = config["hidden_size"], config["num_attention_heads"]
    d, eps = H // heads, config["layer_norm_eps"]
    act = {
        "gelu": lambda v: F.gelu(v),
        "gelu_new": lambda v: F.gelu(v, approximate="tanh"),
        "gelu_pytorch_tanh": lambda v: F.gelu(v, approximate="tanh"),
        "relu": F.relu,
    }[config["hidden_act"]]
    B, S = ids.shape
    x = t["embeddings.word"][ids] + t["embeddings.position"][:S][None] + t["embeddings.token_type"][types]
    x = F.layer_norm(x, (H,), t["embeddings.ln_gamma"], t["embeddings.ln_beta"], eps)  # [B, S, H]
    key_masked = (mask == 0)[:, None, None, :]  # [B, 1, 1, S]
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        qkv = x @ t[p + "qkv_weight"] + t[p + "qkv_bias"]  # [B, S, 3H]
        q, k, v = (z.view(B, S, heads, d).transpose(1, 2) for z in qkv.split(H, dim=-1))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # [B, heads, S, S]
        probs = scores.masked_fill(key_masked, float("-inf")).softmax(-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, S, H)
        x = F.layer_norm(ctx @ t[p + "attn_out_weight"] + t[p + "attn_out_bias"] + x, (H,),
                         t[p + "attn_ln_gamma"], t[p + "attn_ln_beta"], eps)
        h = act(x @ t[p + "ffn_in_weight"] + t[p + "ffn_in_bias"])  # [B, S, I]
        x = F.layer_norm(h @ t[p + "ffn_out_weight"] + t[p + "ffn_out_bias"] + x, (H,),
                         t[p + "ffn_ln_gamma"], t[p + "ffn_ln_beta"], eps)
    pooled = None
    if config["has_pooler"]:
        pooled = torch.tanh(x[:, 0] @ t["pooler.weight"] + t["pooler.bias"])  # [B, H]
    return x, pooled


@pytest.mark.parametrize("kind, act", [("model", "gelu"), ("cls", "gelu_new"), ("mlm", "relu")])
def test_converted_weights_reproduce_the_hf_encoder_forward(wt, hf, make_checkpoint, tmp_path, kind, act):
    src, model = make_checkpoint(kind, "sharded", hidden_act=act)
    config, t = wt.read_converted(wt.convert_checkpoint(src, tmp_path / "out", progress=False))
    B, S = 3, 13
    ids = torch.randint(0, config["vocab_size"], (B, S))
    types = torch.randint(0, config["type_vocab_size"], (B, S))
    lengths = torch.tensor([S, 1, 8])  # ragged, one row with a single real token
    mask = (torch.arange(S)[None] < lengths[:, None]).long()
    enc = hf.backbone(model).double()
    with torch.no_grad():
        want = enc(input_ids=ids, attention_mask=mask, token_type_ids=types)
    got_hidden, got_pooled = _forward_from_converted(config, t, ids, mask, types)
    valid = mask.bool()
    torch.testing.assert_close(got_hidden[valid], want.last_hidden_state[valid], rtol=1e-9, atol=1e-9)
    if config["has_pooler"]:
        torch.testing.assert_close(got_pooled, want.pooler_output, rtol=1e-9, atol=1e-9)
    else:
        assert got_pooled is None and kind == "mlm"


def test_old_layernorm_gamma_beta_names_are_accepted(wt, hf, make_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    src, model = make_checkpoint("mlm")
    sd = load_file(str(src / "model.safetensors"))
    renamed = {}
    for k, v in sd.items():
        for old, new in hf.family.weights.legacy_suffixes.items():
            if k.endswith(new):
                k = k[: -len(new)] + old
        renamed[k] = v
    assert any(k.endswith(tuple(hf.family.weights.legacy_suffixes)) for k in renamed)
    save_file(renamed, str(src / "model.safetensors"))
    _, tensors = wt.read_converted(wt.convert_checkpoint(src, tmp_path / "out", progress=False))
    ref = hf.reference_tensors(model)
    for name, t in tensors.items():
        assert torch.equal(t, ref[name]), name


def _st_modules():
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer
    return Transformer, Pooling, Normalize


def test_sentence_transformers_directory_keeps_tokenizer_pooling_and_max_seq_length(wt, hf, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertTokenizerFast

    Transformer, Pooling, Normalize = _st_modules()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = specials + [f"w{i}" for i in range(hf.TINY["vocab_size"] - len(specials))]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    hf_dir = tmp_path / "bert"
    hf.save_checkpoint(hf.build_model("model"), hf_dir)
    BertTokenizerFast.from_pretrained(str(tmp_path / "vocab")).save_pretrained(hf_dir)
    st = SentenceTransformer(
        modules=[
            Transformer(str(hf_dir), max_seq_length=17),
            Pooling(hf.TINY["hidden_size"], pooling_mode="cls"),
            Normalize(),
        ],
        device="cpu",
    )
    src = tmp_path / "st"
    st.save(str(src))
    assert (src / "modules.json").is_file() and (src / "1_Pooling").is_dir()

    out = wt.convert_checkpoint(src, tmp_path / "out", progress=False)
    config, _ = wt.read_converted(out)
    assert config["max_seq_length"] == 17
    copied = [p.relative_to(src) for p in src.rglob("*") if p.is_file()]
    for rel in copied:
        if rel.name in ("model.safetensors", "README.md"):
            assert not (out / rel).exists(), rel
        else:
            assert (out / rel).read_bytes() == (src / rel).read_bytes(), rel
    assert (out / "1_Pooling" / "config.json").is_file()
    # The converted directory alone is enough for the tokenizer.
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok("w3 w7")["input_ids"] == [2, 8, 12, 3]

    # The older sentence-transformers layout keeps the length in sentence_bert_config.json.
    (src / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 23, "do_lower_case": False}))
    config, _ = wt.read_converted(wt.convert_checkpoint(src, tmp_path / "out2", progress=False))
    assert config["max_seq_length"] == 23


def test_plain_hf_directory_has_no_max_seq_length(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model")
    (src / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 9}))
    config, _ = wt.load_hf_checkpoint(src)
    assert config["max_seq_length"] is None


def test_reconverting_into_the_same_directory_replaces_the_output(wt, make_checkpoint, tmp_path):
    src, _ = make_checkpoint("model")
    out = tmp_path / "out"
    wt.convert_checkpoint(src, out, progress=False)
    config, tensors = wt.read_converted(wt.convert_checkpoint(src, out, dtype="float16", progress=False))
    assert config["dtype"] == "float16"
    assert all(t.dtype == torch.float16 for t in tensors.values())
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "ftbert_config.json", "ftbert_weights.safetensors"]


def test_interrupted_conversion_leaves_no_weights_file_and_no_config(
    wt, make_checkpoint, tmp_path, monkeypatch
):
    import importlib

    convert_mod = importlib.import_module(wt.__name__ + ".convert")
    src, _ = make_checkpoint("model")
    out = tmp_path / "out"
    wt.convert_checkpoint(src, out, progress=False)  # an earlier, complete conversion

    def dies_halfway(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 1000)
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_mod, "save_file", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        wt.convert_checkpoint(src, out, dtype="float16", progress=False)
    assert not wt.is_converted(out)
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    # The earlier weights file is untouched (renames are all or nothing), but without its config
    # the directory no longer counts as converted.
    with pytest.raises(wt.FormatError, match="ftbert_config.json"):
        wt.read_converted(out)


def test_progress_prints_a_line_per_layer_and_nothing_when_off(wt, make_checkpoint, tmp_path, capsys):
    src, _ = make_checkpoint("model", num_hidden_layers=3)
    wt.convert_checkpoint(src, tmp_path / "a", progress=False)
    assert capsys.readouterr().out == ""
    wt.convert_checkpoint(src, tmp_path / "b", dtype="float16", progress=True)
    out = capsys.readouterr().out
    for i in (1, 2, 3):
        assert f"layer {i}/3" in out
    assert "pooler" in out and "float16" in out and str(tmp_path / "b") in out
