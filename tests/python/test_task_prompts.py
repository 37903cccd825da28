"""Jina-embeddings-v3's task instructions in `Encoder.encode`: loaded with `task=`, a checkpoint
whose config.json has `task_instructions` gets that task's instruction before every text, as the
original code's encode(task=...) puts it there (modeling_lora.py, XLMRobertaLoRA.encode:
`sentences = [self._task_instructions[task] + s for s in sentences]`); an explicit `prompt` wins
over it. Held to transformers' JinaEmbeddingsV3Model, mean-pooled and normalized as the original
code's encode pools, on the instruction and text tokenized together.

The checkpoint is a tiny random one in the hub's layout (the original code's config and weight
names, one LoRA adapter per task); its lora_B are zero, so every task's merged weights are the
base model's and the native model is the reference for any task (the merge itself:
tests/weights_tools/test_jina_lora.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ftbert
from tests._models import _require_class, make_rotary_bert
from tests._tokenizers import write_unigram_tokenizer
from tests._vocab import random_texts

VOCAB = 157
TASKS = ["retrieval.query", "retrieval.passage", "text-matching"]
INSTRUCTIONS = {"retrieval.query": "Represent the query for retrieving evidence documents: ",
                "retrieval.passage": "Represent the document for retrieval: ", "text-matching": ""}
RANK = 4
TOL = 1e-5


def _original_checkpoint(src, native, **config_changes):
    """The hub's layout of the native checkpoint at `native`: names under "roberta.", each 2-D
    weight a parametrization with per-task lora_A (random) and lora_B (zero), the original config
    keys with `config_changes` applied (None removes a key)."""
    sd, out = load_file(str(native / "model.safetensors")), {}
    for name, w in sd.items():
        if not (name.endswith(".weight") and w.dim() == 2):
            out["roberta." + name] = w
            continue
        base = "roberta." + name[: -len(".weight")] + ".parametrizations.weight"
        out[base + ".original"] = w
        rows, cols = w.shape
        embedding = "embeddings" in name  # A [T, rows, r], B [T, r, cols]; a Linear's A [T, r, in], B [T, out, r]
        out[base + ".0.lora_A"] = torch.randn((len(TASKS), rows, RANK) if embedding else (len(TASKS), RANK, cols))
        out[base + ".0.lora_B"] = torch.zeros((len(TASKS), RANK, cols) if embedding else (len(TASKS), rows, RANK))
    src.mkdir(parents=True, exist_ok=True)
    save_file(out, str(src / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((native / "config.json").read_text())
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id",
            "bos_token_id", "eos_token_id")
    original = {k: cfg[k] for k in keep}
    original.update(architectures=["XLMRobertaModel"], model_type="xlm-roberta", position_embedding_type="rotary",
                    rotary_emb_base=10000.0, lora_adaptations=TASKS, lora_rank=RANK, lora_alpha=1.0,
                    lora_dropout_p=0.0, load_trained_adapters=True, task_instructions=INSTRUCTIONS)
    for key, value in config_changes.items():
        if value is None:
            original.pop(key, None)
        else:
            original[key] = value
    (src / "config.json").write_text(json.dumps(original))
    write_unigram_tokenizer(src, VOCAB, model_max_length=512)


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    """(the native directory, its JinaEmbeddingsV3Model, a factory of original checkpoints)."""
    _require_class("JinaEmbeddingsV3Model")
    root = tmp_path_factory.mktemp("jina")
    native = root / "native"
    model = make_rotary_bert(native, "jina_embeddings_v3", hidden=48, heads=3, layers=2, vocab=VOCAB, seed=5)
    write_unigram_tokenizer(native, VOCAB, model_max_length=512)
    made = {}

    def original(**changes):
        key = json.dumps(changes, sort_keys=True)
        if key not in made:
            made[key] = root / f"original-{len(made)}"
            _original_checkpoint(made[key], native, **changes)
        return made[key]

    return native, model.eval(), original


def reference(model, tok, texts) -> np.ndarray:
    """The original code's encode on `texts` as given: mean over the attended tokens, normalized."""
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    mask = batch["attention_mask"][..., None].to(hidden.dtype)
    mean = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1).numpy()


@pytest.mark.parametrize("task", ["retrieval.query", "retrieval.passage"])
def test_a_task_with_an_instruction_puts_it_before_every_text(jina, rng, task):
    _, model, original = jina
    enc = ftbert.Encoder.from_pretrained(original(), task=task)
    assert enc.task == task and enc.task_instruction == INSTRUCTIONS[task]
    texts = random_texts(rng, 5)
    got = enc.encode(texts)
    np.testing.assert_allclose(got, reference(model, enc.tokenizer, [INSTRUCTIONS[task] + t for t in texts]),
                               rtol=0, atol=TOL)
    # Without the instruction the embeddings are others: the test above could not pass without it.
    assert np.abs(got - reference(model, enc.tokenizer, texts)).max() > 1e-2
    np.testing.assert_allclose(enc.encode(texts[0]), got[:1], rtol=0, atol=1e-6)  # one str


def test_an_explicit_prompt_wins_over_the_tasks_instruction(jina, rng):
    _, model, original = jina
    enc = ftbert.Encoder.from_pretrained(original(), task="retrieval.query")
    texts = random_texts(rng, 4)
    np.testing.assert_allclose(enc.encode(texts, prompt=""), reference(model, enc.tokenizer, texts),
                               rtol=0, atol=TOL)
    np.testing.assert_allclose(enc.encode(texts, prompt="query: "),
                               reference(model, enc.tokenizer, ["query: " + t for t in texts]), rtol=0, atol=TOL)


@pytest.mark.parametrize("task, changes", [("text-matching", {}),  # an empty instruction
                                           ("retrieval.query", {"task_instructions": None}),  # none at all
                                           ("retrieval.query", {"task_instructions": {"text-matching": "x: "}})])
def test_no_instruction_for_the_task_leaves_the_texts_as_they_are(jina, rng, task, changes):
    _, model, original = jina
    enc = ftbert.Encoder.from_pretrained(original(**changes), task=task)
    assert enc.task_instruction is None
    texts = random_texts(rng, 3)
    np.testing.assert_allclose(enc.encode(texts), reference(model, enc.tokenizer, texts), rtol=0, atol=TOL)


def test_a_model_loaded_without_a_task_adds_nothing(jina, rng):
    native, model, _ = jina
    enc = ftbert.Encoder.from_pretrained(native)
    assert enc.task is None and enc.task_instruction is None
    texts = random_texts(rng, 3)
    np.testing.assert_allclose(enc.encode(texts), reference(model, enc.tokenizer, texts), rtol=0, atol=TOL)
    np.testing.assert_allclose(enc.encode(texts, prompt="query: "),
                               reference(model, enc.tokenizer, ["query: " + t for t in texts]), rtol=0, atol=TOL)


def test_task_instructions_that_are_not_strings_are_refused_at_load(jina):
    _, _, original = jina
    with pytest.raises(ValueError, match="task_instructions must map task names to strings"):
        ftbert.Encoder.from_pretrained(original(task_instructions={"retrieval.query": 3}), task="retrieval.query")


def test_bad_prompts_and_texts_are_named(jina):
    _, _, original = jina
    enc = ftbert.Encoder.from_pretrained(original(), task="retrieval.query")
    with pytest.raises(TypeError, match="prompt must be a str or None, got int"):
        enc.encode(["a text"], prompt=3)
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):  # not hidden behind the instruction
        enc.encode(["a text", 3])


def test_a_server_started_with_a_task_puts_its_instruction_before_every_text(jina, rng):
    # /v1/embeddings and TEI's /embed give what encode gives (the instruction first) unless the
    # request names a prompt; token ids are the caller's and get nothing.
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'ftbert[serve]')")
    import httpx

    from tests.serving._helpers import serve

    _, _, original = jina
    path = original()
    enc = ftbert.Encoder.from_pretrained(path, task="retrieval.query")
    texts = random_texts(rng, 3)
    want, plain = enc.encode(texts), enc.encode(texts, prompt="")
    assert np.abs(want - plain).max() > 1e-2
    with serve(path, task="retrieval.query") as server:
        openai = httpx.post(server.url + "/v1/embeddings", json={"input": texts}, timeout=60).json()
        got = np.array([row["embedding"] for row in openai["data"]], np.float32)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        tei = np.array(httpx.post(server.url + "/embed", json={"inputs": texts}, timeout=60).json(), np.float32)
        np.testing.assert_allclose(tei, want, rtol=0, atol=1e-5)
        ids = [enc.tokenizer(t)["input_ids"] for t in texts]
        by_ids = httpx.post(server.url + "/v1/embeddings", json={"input": ids}, timeout=60).json()
        got = np.array([row["embedding"] for row in by_ids["data"]], np.float32)
        np.testing.assert_allclose(got, plain, rtol=0, atol=1e-5)


def test_workers_fronts_put_the_instruction_too(jina, rng):
    # The fronts have no encoder: the instruction comes with the engine's description.
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'ftbert[serve]')")
    from tests.serving.test_workers import WorkersServer

    _, _, original = jina
    path = original()
    enc = ftbert.Encoder.from_pretrained(path, task="retrieval.passage")
    texts = random_texts(rng, 2)
    server = WorkersServer(path, "--task", "retrieval.passage", workers=2)
    try:
        got = np.array(server.client.post("/embed", json={"inputs": texts}).json(), np.float32)
    finally:
        server.stop()
    np.testing.assert_allclose(got, enc.encode(texts), rtol=0, atol=1e-5)
    assert np.abs(got - enc.encode(texts, prompt="")).max() > 1e-2  # the instruction made a difference
