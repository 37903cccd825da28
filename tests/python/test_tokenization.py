"""encode()'s tokenizer read straight from tokenizer.json (python/ftbert/tokenization.py) against
transformers' fast tokenizer of the same directory: the same ids for every kind of tokenizer the
families ship, long texts truncated alike; and the cases where transformers would change the file
at load, which must fall back to it."""

import json
import shutil

import numpy as np
import pytest

import ftbert
from ftbert.tokenization import TextTokenizer, load_text_tokenizer
from tests._models import make_bert, make_roberta, minilm_path
from tests._tokenizers import write_bpe_tokenizer, write_unigram_tokenizer, write_wordpiece_tokenizer
from tests._vocab import random_texts

KINDS = {
    "wordpiece": lambda p: write_wordpiece_tokenizer(p, 200),
    "wordpiece-distilbert": lambda p: write_wordpiece_tokenizer(p, 200, tokenizer_class="DistilBertTokenizer"),
    "bpe": lambda p: write_bpe_tokenizer(p, 150),
    "unigram": lambda p: write_unigram_tokenizer(p, 150),
}


def texts(rng, n=60):
    # Mixed lengths, odd spacing, accents, capitals, an empty-looking one, and long ones to truncate.
    base = random_texts(rng, n)
    return base + ["  Héllo   WORLD  ", "ça va?", "x", " ".join(base[:30])]


def transformers_ids(tok, batch, max_length):
    return tok(batch, truncation=True, max_length=max_length, return_attention_mask=False)["input_ids"]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("max_length", [8, 64])
def test_the_same_ids_as_transformers(tmp_path, rng, kind, max_length):
    hf_tok = KINDS[kind](tmp_path)
    direct = load_text_tokenizer(tmp_path, max_length)
    assert isinstance(direct, TextTokenizer)
    batch = texts(rng)
    got = direct(batch, truncation=True, max_length=max_length)
    assert got["input_ids"] == transformers_ids(hf_tok, batch, max_length)
    assert max(len(i) for i in got["input_ids"]) == max_length  # the long ones were cut


def test_the_real_minilm_tokenizer(rng):
    from transformers import AutoTokenizer

    path = minilm_path()
    direct = load_text_tokenizer(path, 256)
    assert direct is not None
    batch = texts(rng, 200)
    hf_tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert direct(batch, truncation=True, max_length=256)["input_ids"] == transformers_ids(hf_tok, batch, 256)


def _edit(path, name, **changes):
    f = path / name
    data = json.loads(f.read_text())
    data.update(changes)
    f.write_text(json.dumps(data))


@pytest.mark.parametrize("change", [
    {"do_lower_case": False},  # the file lower-cases: transformers would rebuild its normalizer
    {"strip_accents": True},
    {"tokenizer_class": "SomeOtherTokenizer"},
    {"add_eos_token": True},
])
def test_settings_transformers_applies_over_the_file_fall_back(tmp_path, change):
    write_wordpiece_tokenizer(tmp_path, 200)
    _edit(tmp_path, "tokenizer_config.json", **change)
    assert load_text_tokenizer(tmp_path, 32) is None


def test_a_prefix_space_the_file_does_not_add_falls_back(tmp_path):
    write_bpe_tokenizer(tmp_path, 150)
    _edit(tmp_path, "tokenizer_config.json", add_prefix_space=True)
    assert load_text_tokenizer(tmp_path, 32) is None


def test_no_tokenizer_json_falls_back(tmp_path):
    write_wordpiece_tokenizer(tmp_path, 200)
    (tmp_path / "tokenizer.json").unlink()
    assert load_text_tokenizer(tmp_path, 32) is None
    assert load_text_tokenizer(None, 32) is None


def test_a_different_length_is_refused(tmp_path):
    write_wordpiece_tokenizer(tmp_path, 200)
    direct = load_text_tokenizer(tmp_path, 32)
    with pytest.raises(ValueError, match="truncates at the length it was loaded for"):
        direct(["a b"], truncation=True, max_length=16)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_encode_gives_what_the_transformers_tokenizer_gives(tmp_path, rng, monkeypatch, family):
    # The same embeddings, bit for bit, through either tokenizer.
    if family == "bert":
        make_bert(tmp_path, vocab=211, seed=3)
        write_wordpiece_tokenizer(tmp_path, 211)
    else:
        make_roberta(tmp_path, vocab=151, seed=3)
        write_bpe_tokenizer(tmp_path, 151)
    batch = texts(rng, 40)
    enc = ftbert.Encoder.from_pretrained(tmp_path)
    direct = enc.encode(batch)
    assert isinstance(enc._text_tokenizer(), TextTokenizer)
    copy = tmp_path.parent / (tmp_path.name + "-hf")
    shutil.copytree(tmp_path, copy)
    monkeypatch.setattr("ftbert.encoder.load_text_tokenizer", lambda *a: None)
    enc_hf = ftbert.Encoder.from_pretrained(copy)
    np.testing.assert_array_equal(enc_hf.encode(batch), direct)
    assert not isinstance(enc_hf._text_tokenizer(), TextTokenizer)
