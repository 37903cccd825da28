"""Small tokenizers of the three kinds BERT-family checkpoints ship, built offline with the
`tokenizers` library (trained on `tests._vocab` texts) and saved as the family's transformers fast
tokenizer, so that `AutoTokenizer.from_pretrained(dir)` -- and with it `Encoder.tokenizer` and
sentence-transformers -- load them from a random checkpoint's directory:

- write_wordpiece_tokenizer: BERT's kind ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4; pairs
  "[CLS] A [SEP] B [SEP]" with token type 1 on the second text and its [SEP]);
- write_bpe_tokenizer: RoBERTa's byte-level BPE (<s> 0, <pad> 1, </s> 2, <unk> 3, <mask> last;
  pairs "<s> A </s></s> B </s>");
- write_unigram_tokenizer: XLM-R's kind, a Unigram model over Metaspace pieces (the same special
  tokens as RoBERTa).

Each takes `max_vocab`, the model's vocab_size, and asserts every id it can produce fits below it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tests._vocab import LETTERS, WORDS, random_texts

WORDPIECE_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# RoBERTa's and XLM-R's first four ids; <mask> goes last, as in the released vocabularies.
ROBERTA_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]
# Printable ASCII: the byte-level alphabet is cut to these so the vocabulary stays tiny (the full
# one alone is 256 ids). Bytes outside it are dropped by the BPE, as RobertaTokenizer rebuilds it.
ASCII = [chr(c) for c in range(32, 127)]


def _corpus(seed: int, n: int = 400) -> list[str]:
    # Every letter in both cases and the punctuation random_texts uses, then sentences of words.
    alphabet = " ".join(LETTERS + [c.upper() for c in LETTERS] + list(".,!?"))
    return [alphabet, " ".join(WORDS)] + random_texts(np.random.default_rng(seed), n)


def _check_vocab(tok: Tokenizer, max_vocab: int, what: str) -> None:
    size = tok.get_vocab_size(with_added_tokens=True)
    top = max(tok.get_vocab(with_added_tokens=True).values())
    assert size <= max_vocab and top < max_vocab, (
        f"{what}: {size} tokens (largest id {top}) do not fit a vocab_size of {max_vocab}"
    )


def write_wordpiece_tokenizer(path: Path, max_vocab: int, model_max_length: int = 512,
                              tokenizer_class: str = "BertTokenizer", seed: int = 0):
    """Trains a lower-casing WordPiece vocabulary of at most `max_vocab` ids and saves it into
    `path` as `tokenizer_class` (transformers' BertTokenizer, DistilBertTokenizer or
    ElectraTokenizer: the class decides whether token_type_ids come back). Returns the
    transformers tokenizer."""
    import transformers

    assert max_vocab >= 60, "a WordPiece vocabulary needs room for the specials and the letters"
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        _corpus(seed),
        trainers.WordPieceTrainer(vocab_size=max_vocab, special_tokens=WORDPIECE_SPECIAL, show_progress=False),
    )
    vocab = tok.get_vocab()
    assert [vocab[t] for t in WORDPIECE_SPECIAL] == list(range(len(WORDPIECE_SPECIAL)))
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    _check_vocab(tok, max_vocab, "WordPiece")
    hf = getattr(transformers, tokenizer_class)(tokenizer_object=tok, model_max_length=model_max_length)
    hf.save_pretrained(path)
    return hf


def _with_roberta_specials(tok: Tokenizer, max_vocab: int, what: str) -> None:
    tok.add_special_tokens(["<mask>"])
    vocab = tok.get_vocab(with_added_tokens=True)
    assert [vocab[t] for t in ROBERTA_SPECIAL] == [0, 1, 2, 3], what
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    _check_vocab(tok, max_vocab, what)


def write_bpe_tokenizer(path: Path, max_vocab: int, model_max_length: int = 512, seed: int = 0):
    """Trains a byte-level BPE (printable-ASCII alphabet, merges up to `max_vocab` ids with
    <mask>) and saves it into `path` as transformers' RobertaTokenizer. Returns that tokenizer."""
    from transformers import RobertaTokenizer

    assert max_vocab >= len(ASCII) + 6, "the byte-level alphabet and the specials need 101 ids"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        _corpus(seed),
        trainers.BpeTrainer(
            vocab_size=max_vocab - 1,  # <mask> is added after training
            special_tokens=ROBERTA_SPECIAL,
            initial_alphabet=ASCII,
            show_progress=False,
        ),
    )
    _with_roberta_specials(tok, max_vocab, "byte-level BPE")
    hf = RobertaTokenizer(tokenizer_object=tok, model_max_length=model_max_length)
    hf.save_pretrained(path)
    return hf


def write_unigram_tokenizer(path: Path, max_vocab: int, model_max_length: int = 512, seed: int = 0):
    """Trains a Unigram model (Metaspace pieces, "▁" marking a word start) of at most `max_vocab`
    ids with <mask>, and saves it into `path` as transformers' XLMRobertaTokenizer. Returns that
    tokenizer."""
    from transformers import XLMRobertaTokenizer

    assert max_vocab >= 80, "a Unigram vocabulary needs room for the specials and both cases' letters"
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Replace(Regex(" {2,}"), " ")  # as XLM-R's own
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        _corpus(seed),
        trainers.UnigramTrainer(
            vocab_size=max_vocab - 1,
            special_tokens=ROBERTA_SPECIAL,
            unk_token="<unk>",
            show_progress=False,
        ),
    )
    _with_roberta_specials(tok, max_vocab, "Unigram")
    hf = XLMRobertaTokenizer(tokenizer_object=tok, model_max_length=model_max_length)
    hf.save_pretrained(path)
    return hf


WRITERS = {"wordpiece": write_wordpiece_tokenizer, "bpe": write_bpe_tokenizer, "unigram": write_unigram_tokenizer}
