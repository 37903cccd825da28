"""The tokenizer `Encoder.encode` runs where it can: the checkpoint's tokenizer.json read by the
`tokenizers` library itself, the same Rust tokenizer transformers' fast tokenizers wrap.

Loading it costs milliseconds; `AutoTokenizer.from_pretrained` first imports transformers, which
took seconds at a first call (benchmarks/results/first-call-h100-rerun.txt). It is used only where
it gives transformers' ids: a tokenizer.json next to a tokenizer_config.json whose tokenizer class
is one of KNOWN_CLASSES, whose settings that transformers would apply over the file agree with it
(BERT's lower-casing, accent stripping and Chinese-character splitting; a byte-level pre-tokenizer's
add_prefix_space), and none of the settings transformers' fast classes add on top of the file
(add_bos_token, add_eos_token). Anything else falls back to `Encoder.tokenizer` (transformers).
tests/python/test_tokenization.py holds the two equal on every family's kind of tokenizer.
"""

from __future__ import annotations

import json
import re
from itertools import chain
from pathlib import Path

import numpy as np

from ._native import _C

# transformers' fast tokenizer classes (and their slow names, which load the fast one) that build
# nothing beyond tokenizer.json at encode time, for the families ftbert runs.
KNOWN_CLASSES = frozenset({
    "BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast",
    "ElectraTokenizer", "ElectraTokenizerFast", "MPNetTokenizer", "MPNetTokenizerFast",
    "RobertaTokenizer", "RobertaTokenizerFast", "XLMRobertaTokenizer", "XLMRobertaTokenizerFast",
    "CamembertTokenizer", "CamembertTokenizerFast", "PreTrainedTokenizerFast",
})
# tokenizer_config.json keys that make transformers change the file's tokenizer at load.
_ADDS_TOKENS = ("add_bos_token", "add_eos_token")
# The BertNormalizer settings the BERT-style classes re-apply from tokenizer_config.json:
# config key -> (normalizer key, the class's default).
_BERT_NORMALIZER = {"do_lower_case": ("lowercase", True), "strip_accents": ("strip_accents", None),
                    "tokenize_chinese_chars": ("handle_chinese_chars", True)}
_BERT_STYLE = ("Bert", "DistilBert", "Electra", "MPNet")


class TextTokenizer:
    """Single texts -> token ids, truncated at max_length, no padding; callable like the fast
    tokenizer is in text.py: tok(texts, truncation=True, max_length=n, return_attention_mask=False)."""

    def __init__(self, tokenizer, max_length: int):
        self._tok = tokenizer
        self._max_length = max_length
        # Without the offsets, which nothing here reads: converting them to character offsets took
        # ~20% of tokenizing a 250-word text (tokenizers 0.20 and later; the same ids).
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    @property
    def backend(self):
        """The `tokenizers.Tokenizer` itself (its truncation set at the loaded max_length)."""
        return self._tok

    def __call__(self, texts, truncation=True, max_length=None, return_attention_mask=False) -> dict:
        if not truncation or max_length != self._max_length:
            raise ValueError("this tokenizer truncates at the length it was loaded for only")
        encodings = self._encode_batch(list(texts))
        out = {"input_ids": [e.ids for e in encodings]}
        types = [e.type_ids for e in encodings]
        if any(any(t) for t in types):  # single texts give type 0 throughout in every family's template
            out["token_type_ids"] = types
        return out

    def flat(self, texts) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """The texts' ids one after another: (ids int32 [T], type ids int32 [T] or None where all
        are 0, lengths int64 [n]). No list of ids outlives its own sequence, so a large batch
        leaves nothing for the garbage collector to promote (docs/performance.md, "The garbage
        collector")."""
        encodings = self._encode_batch(list(texts))
        lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
        total = int(lengths.sum())
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int32, count=total)
        types = np.fromiter(chain.from_iterable(e.type_ids for e in encodings), dtype=np.int32,
                            count=total)
        return ids, (types if types.any() else None), lengths


def load_transformers_tokenizer(directory: str | Path):
    """The checkpoint's tokenizer as transformers loads it (a fast tokenizer), never running a
    checkpoint's own code; a ValueError names the folder when none loads."""
    from transformers import AutoTokenizer

    try:
        # trust_remote_code=False: a checkpoint's auto_map must never run its own code (left
        # unset, transformers asks on stdin, and a "y" runs it).
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # transformers raises several types here
        raise ValueError(f"no usable tokenizer in {str(directory)!r}: {e}") from e


def load_text_tokenizer(directory: str | Path | None, max_length: int) -> TextTokenizer | None:
    """The checkpoint's tokenizer.json as a TextTokenizer, or None where transformers must load it
    (see the module docstring)."""
    if directory is None:
        return None
    d = Path(directory)
    try:
        config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        text = (d / "tokenizer.json").read_text(encoding="utf-8")
        spec = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not isinstance(spec, dict):
        return None
    cls = config.get("tokenizer_class")
    if cls not in KNOWN_CLASSES or any(config.get(k) for k in _ADDS_TOKENS):
        return None
    if cls.startswith(_BERT_STYLE) and not _bert_normalizer_agrees(config, spec.get("normalizer")):
        return None
    if "add_prefix_space" in config and not _prefix_space_agrees(config["add_prefix_space"],
                                                                spec.get("pre_tokenizer")):
        return None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(text)  # the file as it is: writing the parsed dict back cost more
    except Exception:  # a file the installed tokenizers cannot read: transformers decides
        return None
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return TextTokenizer(tok, max_length)


def server_tokenizer(directory: str | Path | None, max_length: int, transformers_tokenizer):
    """The `tokenizers.Tokenizer` the servers tokenize single texts with: the checkpoint's
    tokenizer.json (load_text_tokenizer) where its pipeline is `transformers_tokenizer`'s too
    (same_pipeline); None where they must keep to transformers'."""
    fast = load_text_tokenizer(directory, max_length)
    if fast is None or not same_pipeline(fast.backend, transformers_tokenizer):
        return None
    return fast.backend


def same_pipeline(tokenizer, transformers_tokenizer) -> bool:
    """Whether a tokenizers.Tokenizer read from the file normalizes, pre-tokenizes and adds special
    tokens as transformers' tokenizer of the same folder does. Where transformers builds a class's
    pipeline itself rather than reading the file's (XLMRobertaTokenizer in transformers 5 drops the
    file's normalizer and splits on whitespace first), the two give different ids for some texts
    (tabs, line breaks): a caller that has both uses the file's only when this holds."""
    backend = getattr(transformers_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    ours, theirs = json.loads(tokenizer.to_str()), json.loads(backend.to_str())
    return all(ours.get(k) == theirs.get(k) for k in ("normalizer", "pre_tokenizer", "post_processor"))


def _bert_normalizer_agrees(config: dict, normalizer) -> bool:
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        return False
    for key, (field, default) in _BERT_NORMALIZER.items():
        if config.get(key, default) != normalizer.get(field, default):
            return False
    return True


def _prefix_space_agrees(add_prefix_space, pre_tokenizer) -> bool:
    """Whether every ByteLevel / Metaspace pre-tokenizer of the file already does what the
    config's add_prefix_space says (transformers rewrites them otherwise)."""
    parts = [pre_tokenizer] if isinstance(pre_tokenizer, dict) else []
    if parts and parts[0].get("type") == "Sequence":
        parts = parts[0].get("pretokenizers", [])
    for p in parts:
        if p.get("type") == "ByteLevel" and p.get("add_prefix_space") != add_prefix_space:
            return False
        if p.get("type") == "Metaspace" and (p.get("prepend_scheme") != "never") != add_prefix_space:
            return False
    return True


# What BertNormalizer's clean_text does to ASCII: the control characters go, except \t \n \r, which
# become spaces (it drops before it maps, so \v and \f, controls that are also whitespace, go).
_ASCII_CONTROLS = re.compile("[\x00-\x1f\x7f]")
_ASCII_CLEAN = {c: None for c in (*range(0, 9), 11, 12, *range(14, 32), 127)} | {9: 32, 10: 32, 13: 32}


class AsciiShortcut:
    """A BertNormalizer tokenizer's ids for ASCII texts, normalized in Python rather than by the
    normalizer: for ASCII, BertNormalizer only drops control characters, turns \\t \\n \\r into
    spaces and (if it lowercases) lowercases; Chinese characters and accents are not ASCII. The
    same tokenizer without its normalizer then takes the normalized text: a 250-word text 227
    against 134 us, a short one 22 against 18 (one process, tokenizers 0.22). A text with a
    character that starts an added token ([CLS], [MASK]...) is not taken: those match on the text
    as given, before the normalizer, which lowercasing it here would change. `tokenizer`'s
    truncation is the caller's to set on `bare` as well."""

    def __init__(self, tokenizer, lowercase: bool, spec: dict | None = None):
        from tokenizers import Tokenizer

        self.bare = Tokenizer.from_str(tokenizer.to_str())
        self.bare.normalizer = None
        self._lowercase = lowercase
        self._refused = frozenset(t.content[:1] for t in tokenizer.get_added_tokens_decoder().values()
                                  if t.content)
        # The whole tokenizer here (AsciiWordPieces) where it is a WordPiece behind BertPreTokenizer, else None.
        self.word_pieces = AsciiWordPieces.of(spec, lowercase) if spec is not None else None

    @classmethod
    def of(cls, tokenizer) -> "AsciiShortcut | None":
        """The shortcut for `tokenizer` (a tokenizers.Tokenizer), or None where its normalizer is
        not a BertNormalizer that cleans the text."""
        try:
            spec = json.loads(tokenizer.to_str())
        except (AttributeError, ValueError):
            return None
        norm = spec.get("normalizer") if isinstance(spec, dict) else None
        if not isinstance(norm, dict) or norm.get("type") != "BertNormalizer" or not norm.get("clean_text"):
            return None
        return cls(tokenizer, bool(norm.get("lowercase")), spec)

    def normalized(self, text: str) -> str | None:
        """`text` as the normalizer leaves it, or None where the shortcut does not take it."""
        if not text.isascii() or any(c in text for c in self._refused):
            return None
        if _ASCII_CONTROLS.search(text) is not None:
            text = text.translate(_ASCII_CLEAN)
        return text.lower() if self._lowercase else text


class AsciiWordPieces:
    """A BERT tokenizer's ids for texts AsciiShortcut has normalized, in one C++ call a text
    (`_C.WordPieces`, cpp/serving/word_pieces.h): the text split as BertPreTokenizer splits ASCII
    (runs of letters and digits; each other character alone; spaces dropped), each word's
    WordPiece pieces (greedy longest match, the continuation prefix after the first, the unknown
    token for a word with no match or longer than the model's limit), cached by word, then the
    post-processor's special tokens and the truncation. A 250-word text takes a fraction of the
    Rust tokenizer's time for one text at a time (the call's fixed cost and the Encoding it
    builds), which is how the server's fronts tokenize. Built only for a WordPiece model behind
    BertPreTokenizer whose post-processor adds tokens around a single text (BertProcessing,
    RobertaProcessing, or a TemplateProcessing of that shape) or nothing."""

    # The most characters one call takes: past it, the Rust tokenizer, which spreads a batch over
    # the cores and lets other threads run (this call holds the GIL throughout).
    MOST_CHARS = 1 << 16

    def __init__(self, vocab: dict, unk: int, prefix: str, max_chars: int, lowercase: bool,
                 before: list[int], after: list[int]):
        self._native = _C.WordPieces(vocab, unk, prefix, max_chars, lowercase, before, after)

    @classmethod
    def of(cls, spec: dict, lowercase: bool) -> "AsciiWordPieces | None":
        model, pre = spec.get("model") or {}, spec.get("pre_tokenizer")
        if model.get("type") != "WordPiece" or not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer":
            return None
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or model.get("unk_token") not in vocab:
            return None
        around = _single_specials(spec.get("post_processor"))
        if around is None:
            return None
        return cls(vocab, vocab[model["unk_token"]], model.get("continuing_subword_prefix", "##"),
                   model.get("max_input_chars_per_word", 100), lowercase, *around)

    def takes(self, texts: list[str]) -> bool:
        """Whether one call should tokenize `texts` here (see MOST_CHARS)."""
        return sum(map(len, texts)) <= self.MOST_CHARS

    def ids(self, text: str, max_length: int | None = None, side: str = "right",
            special_tokens: bool = True) -> list[int]:
        """`text`'s ids (AsciiShortcut.normalized's text), at most max_length of them (specials
        included), cut from `side` ("right" or "left") as the tokenizer's truncation cuts."""
        return self._native.ids(text, -1 if max_length is None else max_length, side == "left", special_tokens)


def _single_specials(post) -> tuple[list[int], list[int]] | None:
    """The ids a post-processor puts before and after a single text, or None for one of another
    shape."""
    if post is None:
        return [], []
    kind = post.get("type")
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [post["cls"][1]], [post["sep"][1]]
    if kind != "TemplateProcessing":
        return None
    before, after, seen = [], [], False
    for item in post.get("single", []):
        if "Sequence" in item:
            if seen or item["Sequence"].get("id") != "A":
                return None
            seen = True
        elif "SpecialToken" in item:
            token = post.get("special_tokens", {}).get(item["SpecialToken"].get("id"))
            if token is None:
                return None
            (after if seen else before).extend(token["ids"])
        else:
            return None
    return (before, after) if seen else None
