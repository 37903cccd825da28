"""encode()'s tokenizer read straight from tokenizer.json (python/ftbert/tokenization.py) against
transformers' fast tokenizer of the same directory: the same ids for every kind of tokenizer the
families ship, long texts truncated alike; and the cases where transformers would change the file
at load, which must fall back to it."""

import json
import shutil
from pathlib import Path

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


# ---- AsciiShortcut: ASCII texts past a BertNormalizer without running it ------------------------
def _ascii_texts(rng, n=3000):
    # Words, capitals, punctuation and every ASCII control character, \t \n \r \v \f among them;
    # some texts carry the specials' spelling, which the shortcut must leave to the tokenizer.
    pool = [chr(c) for c in range(128)]
    words = ["the", "Quick", "BROWN", "fox's", "jumps,", "over?!", "a", "lazy-dog", "[CLS]", "[mask]", "x"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.integers(0, 25)):
            r = rng.random()
            parts.append(words[rng.integers(len(words))] if r < 0.6 else pool[rng.integers(len(pool))])
        out.append(("" if rng.random() < 0.5 else " ").join(parts))
    return out + ["", " ", "\t\n\r", "\x0b\x0c", "[MASK]", "Héllo"]


def _bert_tokenizer(tmp_path, source: str):
    """A BertNormalizer + WordPiece tokenizers.Tokenizer: MiniLM's, or the test suite's (cased or not)."""
    from tokenizers import Tokenizer, normalizers

    if source == "minilm":
        return Tokenizer.from_file(str(Path(minilm_path()) / "tokenizer.json"))
    write_wordpiece_tokenizer(tmp_path, 200)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    if source == "wordpiece-cased":
        tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    return tok


@pytest.mark.parametrize("source", ["minilm", "wordpiece", "wordpiece-cased"])
def test_ascii_shortcut_gives_the_normalizers_ids(tmp_path, rng, source):
    from ftbert.tokenization import AsciiShortcut

    tok = _bert_tokenizer(tmp_path, source)
    short = AsciiShortcut.of(tok)
    assert short is not None
    taken = 0
    for text in _ascii_texts(rng):
        normalized = short.normalized(text)
        if normalized is None:  # not ASCII, or a special's first character in it
            assert not text.isascii() or "[" in text
            continue
        taken += 1
        assert short.bare.encode(normalized).ids == tok.encode(text).ids, repr(text)
    assert taken > 500  # most texts take the shortcut


def _wordpiece_texts(rng, n=800):
    # _ascii_texts' mix plus made-up words (pieces, or the unknown token) and over-long ones.
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    made_up = ["".join(letters[i] for i in rng.integers(0, len(letters), rng.integers(1, 16))) for _ in range(200)]
    made_up += ["ab" * 51, "x" * 100, "unbelievably", "doesn't"]
    out = []
    for text in _ascii_texts(rng, n):
        words = [made_up[rng.integers(len(made_up))] for _ in range(rng.integers(0, 6))]
        out.append(" ".join([text, *words]) if rng.random() < 0.7 else text)
    return out


@pytest.mark.parametrize("source", ["minilm", "wordpiece", "wordpiece-cased"])
def test_ascii_word_pieces_give_the_tokenizers_ids(tmp_path, rng, source):
    from ftbert.tokenization import AsciiShortcut

    tok = _bert_tokenizer(tmp_path, source)
    tok.no_padding()
    short = AsciiShortcut.of(tok)
    pieces = short.word_pieces
    assert pieces is not None
    unknown, split = tok.token_to_id("[UNK]"), 0
    for text in _wordpiece_texts(rng):
        normalized = short.normalized(text)
        if normalized is None:
            continue
        tok.no_truncation()
        want = tok.encode(text).ids
        assert pieces.ids(normalized) == want, repr(text)
        assert pieces.ids(normalized, special_tokens=False) == tok.encode(text, add_special_tokens=False).ids
        split += unknown in want or any(tok.id_to_token(i).startswith("##") for i in want)
        for max_length in (1, 2, 3, 9, 40):
            for side in ("right", "left"):
                tok.enable_truncation(max_length=max_length, direction=side)
                assert pieces.ids(normalized, max_length, side) == tok.encode(text).ids, (repr(text), max_length, side)
    assert split > 100  # the unknown token and continuation pieces were exercised


def test_ascii_word_pieces_need_wordpiece_behind_bert_pre_tokenizer(tmp_path):
    from tokenizers import Tokenizer, pre_tokenizers, processors

    from ftbert.tokenization import AsciiShortcut

    write_wordpiece_tokenizer(tmp_path, 200)
    path = str(tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(path)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert AsciiShortcut.of(tok) is not None and AsciiShortcut.of(tok).word_pieces is None
    tok = Tokenizer.from_file(path)
    tok.post_processor = processors.ByteLevel()
    assert AsciiShortcut.of(tok).word_pieces is None
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP] $A", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    assert AsciiShortcut.of(tok).word_pieces is None
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    assert AsciiShortcut.of(tok).word_pieces is not None


def test_ascii_shortcut_needs_a_cleaning_bert_normalizer(tmp_path):
    from tokenizers import Tokenizer, normalizers

    from ftbert.tokenization import AsciiShortcut

    write_bpe_tokenizer(tmp_path / "bpe", 150)
    assert AsciiShortcut.of(Tokenizer.from_file(str(tmp_path / "bpe" / "tokenizer.json"))) is None
    write_wordpiece_tokenizer(tmp_path / "wp", 200)
    tok = Tokenizer.from_file(str(tmp_path / "wp" / "tokenizer.json"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=False)
    assert AsciiShortcut.of(tok) is None


def test_word_pieces_stay_right_past_the_word_cache(rng):
    # More distinct words than the cache keeps (65,536): it starts again and the ids stay right.
    # Letters as first pieces and as "##" continuations, so each word's ids are known.
    from ftbert.tokenization import AsciiWordPieces

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "?": 3}
    vocab.update({c: 4 + i for i, c in enumerate(letters)})
    vocab.update({"##" + c: 30 + i for i, c in enumerate(letters)})
    pieces = AsciiWordPieces(vocab, 0, "##", 5, True, [1], [2])
    codes = rng.choice(26 ** 4, 70_000, replace=False)
    words = ["".join(letters[(int(n) // 26 ** k) % 26] for k in range(4)) for n in codes]
    for start in range(0, len(words), 7_000):
        chunk = words[start:start + 7_000]
        want = [1]
        for w in chunk:
            want += [vocab[w[0]]] + [vocab["##" + c] for c in w[1:]] + [3]
        assert pieces.ids(" ".join(w + "?" for w in chunk)) == want + [2]
    assert pieces.ids("abcdef e\u00e9") == [1, 0, vocab["e"], 0, 2]  # too long; no piece for é
