"""Jina-embeddings-v3 as the hub holds it (jinaai/jina-embeddings-v3, the original custom code):
config.json of model_type "xlm-roberta" with position_embedding_type "rotary", rotary_emb_base and
the lora_* keys, and weights whose Linear and Embedding matrices are torch parametrizations with
per-task LoRA adapters beside them. One task's adapters are merged at load (`task=`, `--task`),
and the result is held to transformers' JinaEmbeddingsV3Model loaded from a copy of the checkpoint
merged here, in float32; every way of asking for a task wrongly is refused by name.

The reference merge mirrors modeling_lora.py's LoRAParametrization.lora_forward:
X + matmul(*swap((B[t], A[t]))).view(X.shape) * alpha / rank, swap exchanging the pair for an
Embedding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ftbert
from tests._models import _require_class, make_rotary_bert
from tests._util import ragged_mask

TOL = 1e-4
TASKS = ["retrieval.query", "retrieval.passage", "text-matching"]
RANK, ALPHA, THETA = 4, 2.0, 5000.0
PARAM = ".parametrizations.weight"  # what torch's register_parametrization puts before its tensors


def _lora_forward(x, a, b, t, embedding):
    """modeling_lora.py's LoRAParametrization.lora_forward(X, current_task=t), dropout off."""
    pair = (a[t], b[t]) if embedding else (b[t], a[t])  # self.swap: fan_in_fan_out for Embedding
    return x + torch.matmul(*pair).view(x.shape) * (ALPHA / RANK)


def _original_checkpoint(path, native, adapters=True, parametrized=True, seed=0):
    """Writes to `path` the original code's checkpoint of the native one at `native` (a
    JinaEmbeddingsV3Model directory): names under "roberta.", every 2-D weight a parametrization
    with random non-zero lora_A / lora_B of len(TASKS) slices (where `adapters`), the original
    config.json keys. Returns {native weight name: (A, B)}."""
    gen = torch.Generator().manual_seed(seed)
    sd, out, lora = load_file(str(native / "model.safetensors")), {}, {}
    for name, w in sd.items():
        if not (name.endswith(".weight") and w.dim() == 2):  # biases and LayerNorms: as they are
            out["roberta." + name] = w
            continue
        base = "roberta." + name[: -len(".weight")]
        out[base + (PARAM + ".original" if parametrized else ".weight")] = w
        if not adapters:
            continue
        rows, cols = w.shape
        if "embeddings" in name:  # an Embedding: A [T, rows, r], B [T, r, dim]
            a_shape, b_shape = (len(TASKS), rows, RANK), (len(TASKS), RANK, cols)
        else:  # a Linear: A [T, r, in], B [T, out, r]
            a_shape, b_shape = (len(TASKS), RANK, cols), (len(TASKS), rows, RANK)
        a = torch.randn(a_shape, generator=gen) * 0.1
        b = torch.randn(b_shape, generator=gen) * 0.1
        out[base + PARAM + ".0.lora_A"], out[base + PARAM + ".0.lora_B"] = a, b
        lora[name] = (a, b)
    path.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((native / "config.json").read_text())
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id",
            "bos_token_id", "eos_token_id", "hidden_dropout_prob", "attention_probs_dropout_prob",
            "initializer_range")
    original = {k: cfg[k] for k in keep}
    original.update(
        architectures=["XLMRobertaModel"], model_type="xlm-roberta", position_embedding_type="rotary",
        rotary_emb_base=THETA, lora_adaptations=TASKS, lora_rank=RANK, lora_alpha=ALPHA, lora_dropout_p=0.0,
        lora_main_params_trainable=False, load_trained_adapters=adapters, use_flash_attn=True,
        task_instructions={t: f"{t}: " for t in TASKS}, emb_pooler=None, truncate_dim=None,
        matryoshka_dimensions=[16, 32, 48], torch_dtype="float32",
        auto_map={"AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA"})
    (path / "config.json").write_text(json.dumps(original, indent=2))
    return lora


def _merged_reference(tmp_path, native, lora, task):
    """transformers' JinaEmbeddingsV3Model from a copy of the native checkpoint with `task`'s
    adapters merged here."""
    import transformers

    t = TASKS.index(task)
    sd = load_file(str(native / "model.safetensors"))
    for name, (a, b) in lora.items():
        sd[name] = _lora_forward(sd[name], a, b, t, embedding="embeddings" in name)
    copy = tmp_path / f"merged-{task}"
    copy.mkdir()
    save_file(sd, str(copy / "model.safetensors"), metadata={"format": "pt"})
    (copy / "config.json").write_text((native / "config.json").read_text())
    return transformers.JinaEmbeddingsV3Model.from_pretrained(copy, attn_implementation="eager").eval()


@pytest.fixture
def jina(tmp_path):
    """(original checkpoint dir, native dir, the adapters by native weight name)."""
    _require_class("JinaEmbeddingsV3Model")
    native = tmp_path / "native"
    make_rotary_bert(native, "jina_embeddings_v3", hidden=48, heads=3, layers=2, theta=THETA, pooler=True, seed=11)
    src = tmp_path / "original"
    return src, native, _original_checkpoint(src, native, seed=12)


def _outputs(enc_or_model, ids, mask):
    if isinstance(enc_or_model, ftbert.Encoder):
        out = enc_or_model(ids, mask)
        return out.last_hidden_state, out.pooler_output
    with torch.no_grad():
        out = enc_or_model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


def _max_error(got, want, mask):
    hidden = np.abs(got[0] - want[0])[mask.astype(bool)].max()  # attended positions
    return max(hidden, np.abs(got[1] - want[1]).max())


def test_each_task_merged_matches_transformers_on_the_merged_weights_and_tasks_differ(tmp_path, rng, jina):
    src, native, lora = jina
    ids = rng.integers(3, 157, (4, 19))
    mask = ragged_mask(rng, 4, 19)
    got = {}
    for task in ("retrieval.query", "text-matching"):
        enc = ftbert.Encoder.from_pretrained(src, task=task)
        # The hub's "xlm-roberta" config runs as Jina's rotary family, its rotary_emb_base the theta.
        assert enc.config["model_type"] == "jina_embeddings_v3"
        assert enc.config["layer"]["rotary_theta"] == THETA
        got[task] = _outputs(enc, ids, mask)
        want = _outputs(_merged_reference(tmp_path, native, lora, task), ids, mask)
        assert _max_error(got[task], want, mask) <= TOL, task
    assert _max_error(got["retrieval.query"], got["text-matching"], mask) > 1e-2


def test_embedding_and_linear_adapters_merge_in_their_own_orientation(jina, wt):
    # Against the formula directly: an Embedding's W + s * A[t] @ B[t], a Linear's W + s * B[t] @ A[t]
    # (the engine keeps Linear weights as [in, out]).
    src, native, lora = jina
    _, tensors = wt.load_hf_checkpoint(src, task="retrieval.passage")
    sd, s = load_file(str(native / "model.safetensors")), ALPHA / RANK
    a, b = lora["embeddings.word_embeddings.weight"]
    want = sd["embeddings.word_embeddings.weight"] + s * a[1] @ b[1]
    assert torch.allclose(tensors["embeddings.word"], want, atol=1e-6)
    a, b = lora["encoder.layers.1.mlp.fc2.weight"]
    want = sd["encoder.layers.1.mlp.fc2.weight"] + s * b[1] @ a[1]
    assert torch.allclose(tensors["layers.1.ffn_out_weight"], want.t(), atol=1e-6)


def test_convert_with_a_task_writes_that_tasks_weights(tmp_path, rng, jina, wt, capsys):
    src, _, _ = jina
    dst = tmp_path / "converted"
    assert wt.main([str(src), str(dst), "--task", "retrieval.passage", "--quiet"]) == 0
    assert "task retrieval.passage" in capsys.readouterr().out
    ids, mask = rng.integers(3, 157, (3, 11)), ragged_mask(rng, 3, 11)
    direct = _outputs(ftbert.Encoder.from_pretrained(src, task="retrieval.passage"), ids, mask)
    converted = _outputs(ftbert.Encoder.from_pretrained(dst), ids, mask)
    assert _max_error(converted, direct, mask) == 0.0
    # A converted directory's weights are fixed: a task there is refused, naming the way to merge one.
    with pytest.raises(ValueError, match=r"task='retrieval.query'.*ftbert-converted.*--task"):
        ftbert.Encoder.from_pretrained(dst, task="retrieval.query")


def test_no_task_for_a_checkpoint_with_adapters_is_refused_listing_the_tasks(jina, wt, tmp_path, capsys):
    src, _, _ = jina
    pattern = r"holds per-task LoRA adapters: name the task.*'retrieval.query', 'retrieval.passage' or 'text-matching'"
    with pytest.raises(wt.ConversionError, match=pattern):
        ftbert.Encoder.from_pretrained(src)
    assert wt.main([str(src), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--task" in err and not (tmp_path / "out").exists()


def test_a_task_the_checkpoint_does_not_list_is_refused_listing_them(jina, wt):
    src, _, _ = jina
    with pytest.raises(wt.ConversionError, match=r"task 'classification' is not one of the checkpoint's "
                       r"lora_adaptations \('retrieval.query', 'retrieval.passage' or 'text-matching'\)"):
        ftbert.Encoder.from_pretrained(src, task="classification")
    with pytest.raises(wt.ConversionError, match="task must be a task name"):
        wt.load_hf_checkpoint(src, task=1)


@pytest.mark.parametrize("parametrized", [False, True])
def test_a_checkpoint_without_adapters_loads_as_the_base_model_and_refuses_a_task(tmp_path, rng, wt, parametrized):
    # The original code's checkpoint saved without adapters (load_trained_adapters false; with its
    # weights plain or still parametrized): the base model, as transformers runs the native one.
    _require_class("JinaEmbeddingsV3Model")
    native = tmp_path / "native"
    hf = make_rotary_bert(native, "jina_embeddings_v3", hidden=48, heads=3, layers=2, theta=THETA, pooler=True,
                          seed=13)
    src = tmp_path / "original"
    _original_checkpoint(src, native, adapters=False, parametrized=parametrized)
    ids, mask = rng.integers(3, 157, (3, 13)), ragged_mask(rng, 3, 13)
    enc = ftbert.Encoder.from_pretrained(src)
    assert _max_error(_outputs(enc, ids, mask), _outputs(hf, ids, mask), mask) <= TOL
    with pytest.raises(wt.ConversionError, match=r"task 'retrieval.query' given, but the checkpoint holds no "
                       r"per-task LoRA adapters.*load it without a task"):
        ftbert.Encoder.from_pretrained(src, task="retrieval.query")


def test_a_task_for_a_family_without_adapters_is_refused(make_checkpoint, wt):
    src, _ = make_checkpoint("model")
    with pytest.raises(wt.ConversionError, match="model_type 'bert' has no per-task adapters"):
        wt.load_hf_checkpoint(src, task="retrieval.query")


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, pattern", [
    ({"lora_rank": 2}, r"word_embeddings.parametrizations.weight.0.lora_A' has shape \[3, 157, 4\], but "
                       r"config.json implies \[3, 157, 2\] \(3 tasks in lora_adaptations, lora_rank 2"),
    ({"lora_adaptations": TASKS[:2]}, r"has shape \[3, .*\], but config.json implies \[2, "),
    ({"lora_adaptations": None}, "lora_adaptations must be a non-empty list of distinct task names"),
    ({"lora_adaptations": ["a", "a", "b"]}, "lora_adaptations must be a non-empty list of distinct"),
    ({"lora_rank": 0}, "lora_rank must be a positive integer, got 0"),
    ({"lora_alpha": "one"}, "lora_alpha must be a finite number"),
    ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved True is not supported"),
    ({"rotary_emb_dim": 8}, "rotary_emb_dim 8 is not the head width"),
])
def test_adapters_or_settings_that_do_not_fit_are_refused_by_name(jina, wt, changes, pattern):
    src, _, _ = jina
    _edit_config(src, **changes)
    with pytest.raises(wt.ConversionError, match=pattern):
        wt.load_hf_checkpoint(src, task="retrieval.query")


def test_a_missing_half_of_an_adapter_is_named(jina, wt):
    src, _, _ = jina
    sd = load_file(str(src / "model.safetensors"))
    gone = "roberta.encoder.layers.0.mixer.out_proj" + PARAM + ".0.lora_B"
    del sd[gone]
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(wt.ConversionError, match=f"missing tensor '{gone}'"):
        wt.load_hf_checkpoint(src, task="retrieval.query")


def test_only_rotary_xlm_roberta_configs_are_jinas(wt):
    # model_type "xlm-roberta" stays XLM-R's (absolute positions, refusing others by name) unless
    # position_embedding_type says "rotary"; family_for(model_type) is unchanged.
    from ftbert.weights_tools.families import family_for_config

    assert family_for_config({"model_type": "xlm-roberta"}).name == "xlm-roberta"
    assert family_for_config({"model_type": "xlm-roberta", "position_embedding_type": "absolute"}).name == "xlm-roberta"
    assert family_for_config({"model_type": "xlm-roberta",
                              "position_embedding_type": "rotary"}).name == "jina_embeddings_v3"
    assert family_for_config({"model_type": "jina_embeddings_v3"}).name == "jina_embeddings_v3"
    assert wt.family_for("xlm-roberta").name == "xlm-roberta"
    assert family_for_config({"model_type": "albert"}) is None
