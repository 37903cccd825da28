"""A WordPiece vocabulary for the tiny random checkpoints of `tests._models.make_bert`, so that
`Encoder.tokenizer` and `Encoder.encode` work on them offline (transformers builds a BERT tokenizer
from vocab.txt alone), and random texts made of its words."""

from pathlib import Path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
WORDS = (
    "the of and to in is was he for it with as his on be at by this had not are but from or have an "
    "they which one you were her all she there would their we him been has when who will more no if "
    "out so said what up its about into than them can only other new some could time these two may "
    "then do first any my now such like our over man me even most made after also did many before "
    "must through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three"
).split()


def write_vocab(path: Path, vocab_size: int = 211) -> list[str]:
    """Writes vocab.txt (at most `vocab_size` entries, so every id fits the model) into `path`."""
    vocab = SPECIAL + LETTERS + ["##" + c for c in LETTERS] + [".", ",", "!", "?"]
    vocab += [w for w in dict.fromkeys(WORDS) if w not in vocab][: vocab_size - len(vocab)]
    (Path(path) / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return vocab


def random_texts(rng, n: int, max_words: int = 40) -> list[str]:
    """`n` sentences of 1..max_words words: vocabulary words, now and then one split into pieces."""
    texts = []
    for _ in range(n):
        k = int(rng.integers(1, max_words + 1))
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), k)]
        if rng.random() < 0.3:
            words.append("zq" + "".join(LETTERS[i] for i in rng.integers(0, 26, 5)))  # word pieces
        texts.append(" ".join(words).capitalize() + str(rng.choice([".", "!", "?", ""])))
    return texts
