"""Command line and presets of `ftbert bench`: argv (+ an optional preset JSON) -> `Options`.

Precedence: a flag given on the command line, then the preset's value, then the built-in default.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")
ATTENTIONS = ("unfused", "flash", "auto")
# "ftbert" expands to one engine per attention variant; the others are the transformers peers and
# ONNX Runtime (CPU, float32 fused and int8; optional, bench/onnx.py).
ENGINES = ("ftbert", "ftbert-int8", "ftbert-fp8", "hf-eager", "hf-sdpa", "hf-compile", "onnxruntime", "onnxruntime-int8")
# torch.compile's modes for hf-compile ("default": torch.compile's own default).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
BUILTIN_MODELS = ("minilm", "bert-base", "mpnet-base", "modernbert-base", "nomic-bert-base", "gte-base",
                  "jina-v3", "eurobert-210m", "deberta-v3-base")

DEFAULT_BATCHES = [1, 8, 32]
DEFAULT_SEQS = [32, 128, 512]
DEFAULT_ENGINES = ["ftbert", "hf-eager", "hf-sdpa"]
# Repetitions per configuration: a GPU forward takes milliseconds, a CPU one up to seconds.
DEFAULT_ITERS = {"cuda": 100, "cpu": 10}
DEFAULT_WARMUP = {"cuda": 10, "cpu": 2}

# --rerank: pairs/s of a cross-encoder, end to end (text in, scores out) and model only.
RERANK_ENGINES = ("ftbert", "hf-eager", "hf-sdpa", "sentence-transformers")
RERANK_DEFAULT_ENGINES = ["ftbert", "hf-sdpa", "sentence-transformers"]
RERANK_DEFAULT_BATCHES = [32]
# Pairs per timed pass: 16 batches of 32 on the GPU; a BERT-base pass over 512 pairs of 275 tokens
# takes tens of seconds on a CPU, so fewer there.
RERANK_DEFAULT_PAIRS = {"cuda": 512, "cpu": 64}
RERANK_DEFAULT_QUERY_LEN = 16
RERANK_DEFAULT_DOC_LEN = 256
# One repetition is a whole pass over the pairs (tens of milliseconds on the GPU), not one forward.
RERANK_ITERS = {"cuda": 10, "cpu": 3}
RERANK_WARMUP = {"cuda": 2, "cpu": 1}
# --varlen: ragged batches run padded, padding-free and as the full batch, next to transformers,
# and Encoder.encode of mixed-length texts next to sentence-transformers.
VARLEN_ENGINES = ("ftbert-padded", "ftbert-padding-free", "ftbert-auto", "ftbert-forward-packed",
                  "ftbert-full", "hf-eager", "hf-sdpa", "hf-compile")
VARLEN_DEFAULT_ENGINES = ["ftbert-padded", "ftbert-padding-free", "ftbert-forward-packed",
                          "ftbert-full", "hf-sdpa"]
VARLEN_PARTS = ("model", "encode")
# BATCHxSEQ:MIN-MAX, lengths uniform in [MIN, MAX] (tokens, or a percentage of SEQ). The GPU's are
# the padding-free issue's three; the CPU's are small enough for a BERT-base run in minutes.
VARLEN_DEFAULT_CASES = {
    "cuda": ["16x512:20%-100%", "32x128:8-128", "32x384:1-384"],
    "cpu": ["2x64:20%-100%", "4x32:2-32", "4x48:1-48"],
}
VARLEN_DEFAULT_SENTENCES = {"cuda": 4096, "cpu": 256}
# Timed passes of the encode part (each over all the sentences), after one untimed pass.
VARLEN_PASSES = {"cuda": 5, "cpu": 2}
ST_DEFAULT_BATCH = 32  # SentenceTransformer.encode's own default batch_size

# Options of the latency sweep that mean nothing to --rerank, and those of each mode.
SWEEP_ONLY = ("seq", "min_len", "compile", "compile_mode", "quantization")
RERANK_ONLY = ("pairs", "query_len", "doc_len", "tokenizer")
VARLEN_ONLY = ("cases", "parts", "sentences", "encode_model", "st_batch", "passes")

# Keys a preset may set (the option names, with "-" spelt "_").
PRESET_KEYS = (
    "description", "model", "device", "dtype", "batch", "seq", "attention", "engines", "compile",
    "compile_mode", "quantization",
    "iters", "warmup", "min_len", "seed", "allow_tf32", "no_cuda_graphs",
    "rerank", "pairs", "query_len", "doc_len", "tokenizer",
    "varlen", "cases", "parts", "sentences", "encode_model", "st_batch", "passes",
)
OLD_VARLEN = ("--varlen is now the ragged-batch benchmark (a mode, without a value); the latency "
              "sweep's lengths uniform in [MIN, seq] are --min-len MIN (preset key min_len)")


class BenchError(Exception):
    """A problem the user can fix (bad model path, missing device, bad option): one line, exit 2."""


@dataclass(frozen=True)
class Case:
    """One ragged batch of --varlen: `batch` sequences right-padded to `seq` positions, each of a
    length drawn uniformly from the integers in [lo, hi]."""

    batch: int
    seq: int
    lo: int
    hi: int
    spec: str  # as given, e.g. "16x512:20%-100%"

    @property
    def shape(self) -> str:
        return f"{self.batch}x{self.seq}"

    @property
    def lengths(self) -> str:
        return f"[{self.lo}, {self.hi}]"


_CASE = re.compile(r"^(\d+)x(\d+)(?::([0-9.]+%?)-([0-9.]+%?))?$")


def parse_case(spec: str) -> Case:
    """"BxS:MIN-MAX" -> Case. MIN and MAX are token counts, or percentages of S ("20%": the
    lengths are then whole numbers within [0.2 S, ...]); "BxS" alone means lengths in [1, S]."""
    m = _CASE.match(spec.strip().lower())
    if not m:
        raise BenchError(f"--cases: {spec!r} is not BATCHxSEQ:MIN-MAX (e.g. 16x512:20%-100% or "
                         "32x128:8-128; MIN and MAX in tokens or in % of SEQ)")
    batch, seq = int(m.group(1)), int(m.group(2))
    if batch < 1 or seq < 1:
        raise BenchError(f"--cases: {spec!r}: batch and seq must be at least 1")

    def length(text: str | None, default: int, up: bool) -> int:
        if text is None:
            return default
        try:
            if text.endswith("%"):
                pct = float(text[:-1])
                if not 0 < pct <= 100:
                    raise BenchError(f"--cases: {spec!r}: {text} is not a percentage in (0, 100]")
                v = pct * seq / 100
                return math.ceil(v - 1e-9) if up else math.floor(v + 1e-9)
            return int(text)
        except ValueError:
            raise BenchError(f"--cases: {spec!r}: {text!r} is neither a token count nor a "
                             "percentage such as 20%") from None

    lo, hi = length(m.group(3), 1, True), length(m.group(4), seq, False)
    if lo < 1:
        raise BenchError(f"--cases: {spec!r}: the shortest length must be at least 1 token, got {lo}")
    if hi > seq:
        raise BenchError(f"--cases: {spec!r}: the longest length {hi} is past seq {seq}")
    if lo > hi:
        raise BenchError(f"--cases: {spec!r}: no whole length in [{lo}, {hi}]")
    return Case(batch, seq, lo, hi, spec.strip())


@dataclass
class Options:
    model: str
    devices: list[str]
    dtypes: list[str]
    batches: list[int]
    seqs: list[int]
    attentions: list[str]
    engines: list[str]
    iters: int | None  # None: DEFAULT_ITERS for the device
    warmup: int | None
    min_len: int | None  # the sweep's lengths uniform in [min_len, seq] (None: every length seq)
    seed: int
    allow_tf32: bool
    breakdown: bool
    out: Path
    name: str | None
    quiet: bool
    preset: str | None = None
    description: str | None = None
    notes: list[str] = field(default_factory=list)
    cuda_graphs: bool = True
    rerank: bool = False
    pairs: int | None = None  # None: RERANK_DEFAULT_PAIRS for the device
    query_len: int = RERANK_DEFAULT_QUERY_LEN
    doc_len: int = RERANK_DEFAULT_DOC_LEN
    tokenizer: str | None = None  # tokenizer files of --rerank --model bert-base (None: bundled MiniLM's)
    varlen: bool = False
    cases: list[Case] | None = None  # None: VARLEN_DEFAULT_CASES for the device
    parts: list[str] = field(default_factory=lambda: list(VARLEN_PARTS))
    sentences: int | None = None  # None: VARLEN_DEFAULT_SENTENCES for the device
    encode_model: str | None = None  # None: the bundled all-MiniLM-L6-v2, else $FTBERT_MINILM_FP16
    st_batch: int = ST_DEFAULT_BATCH
    passes: int | None = None  # None: VARLEN_PASSES for the device
    compile_mode: str = "default"  # torch.compile's mode for hf-compile (COMPILE_MODES)

    def cases_for(self, device: str) -> list[Case]:
        if self.cases is not None:
            return self.cases
        return [parse_case(s) for s in VARLEN_DEFAULT_CASES[device.split(":")[0]]]

    def sentences_for(self, device: str) -> int:
        if self.sentences is not None:
            return self.sentences
        return VARLEN_DEFAULT_SENTENCES[device.split(":")[0]]

    def passes_for(self, device: str) -> int:
        return self.passes if self.passes is not None else VARLEN_PASSES[device.split(":")[0]]

    def iters_for(self, device: str) -> int:
        table = RERANK_ITERS if self.rerank else DEFAULT_ITERS
        return self.iters if self.iters is not None else table[device.split(":")[0]]

    def warmup_for(self, device: str) -> int:
        table = RERANK_WARMUP if self.rerank else DEFAULT_WARMUP
        return self.warmup if self.warmup is not None else table[device.split(":")[0]]

    def pairs_for(self, device: str) -> int:
        return self.pairs if self.pairs is not None else RERANK_DEFAULT_PAIRS[device.split(":")[0]]

    def as_dict(self) -> dict:
        d = {
            "model": self.model, "devices": self.devices, "dtypes": self.dtypes,
            "batches": self.batches, "seqs": self.seqs, "attentions": self.attentions,
            "engines": self.engines, "iters": {d: self.iters_for(d) for d in self.devices},
            "warmup": {d: self.warmup_for(d) for d in self.devices}, "min_len": self.min_len,
            "seed": self.seed, "allow_tf32": self.allow_tf32, "cuda_graphs": self.cuda_graphs,
            "breakdown": self.breakdown, "preset": self.preset,
        }
        if self.rerank:
            del d["seqs"], d["min_len"], d["breakdown"]
            d.update(rerank=True, pairs={dev: self.pairs_for(dev) for dev in self.devices},
                     query_len=self.query_len, doc_len=self.doc_len, tokenizer=self.tokenizer)
        if self.varlen:
            del d["batches"], d["seqs"], d["min_len"], d["breakdown"]
            d.update(varlen=True, parts=self.parts,
                     cases={dev: [c.spec for c in self.cases_for(dev)] for dev in self.devices},
                     sentences={dev: self.sentences_for(dev) for dev in self.devices},
                     passes={dev: self.passes_for(dev) for dev in self.devices},
                     encode_model=self.encode_model, st_batch=self.st_batch)
        return d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ftbert bench",
        description=(
            "Latency sweep of ftbert next to transformers (eager, sdpa, optionally torch.compile) in "
            "one process on the same inputs: median/p90/p99 latency, sequences/s, tokens/s, peak "
            "memory, speed-up over transformers-sdpa and max abs error against a float32 reference. "
            "--rerank and --varlen run other benchmarks instead (their options are grouped below). "
            "Lists take commas or spaces: --batch 1,8,32 or --batch 1 8 32."
        ),
    )
    # Defaults are None so that a preset's value can fill what the command line leaves out.
    p.add_argument("--model", help="minilm (the bundled all-MiniLM-L6-v2, default), bert-base, "
                   "mpnet-base, modernbert-base, nomic-bert-base, gte-base, jina-v3, eurobert-210m or "
                   "deberta-v3-base (random weights of the real sizes, fixed seed) or a "
                   "HuggingFace / "
                   "ftbert-converted checkpoint directory; "
                   "with --rerank: bert-base (default: a random BERT-base cross-encoder) or a "
                   "HuggingFace cross-encoder directory (*ForSequenceClassification, one label); "
                   "with --varlen: the model of its ragged batches (default bert-base)")
    p.add_argument("--preset", help="a preset name (shipped: serving, minilm, varlen, compile, "
                   "quick, cpu, rerank; or ./benchmarks/presets/NAME.json) or a JSON file path")
    p.add_argument("--device", nargs="+", help="cuda, cuda:N and/or cpu (default: cuda when there is "
                   "a GPU and a CUDA build, else cpu)")
    p.add_argument("--dtype", nargs="+", help="float32, float16, bfloat16 (default: all three on the "
                   "GPU, float32 on the CPU)")
    p.add_argument("--batch", nargs="+", help="batch sizes (default 1,8,32)")
    p.add_argument("--seq", nargs="+", help="sequence lengths (default 32,128,512)")
    p.add_argument("--attention", nargs="+", help="ftbert attention variants: unfused, flash, auto "
                   "(default: all three)")
    p.add_argument("--engines", nargs="+", help="ftbert, ftbert-int8 (cpu, float32), ftbert-fp8 (cuda, float16/bfloat16), hf-eager, hf-sdpa, hf-compile, onnxruntime, "
                   "onnxruntime-int8 (default: ftbert,hf-eager,hf-sdpa; the onnxruntime rows run on "
                   "the cpu and need pip install 'ftbert[onnx]'); with --rerank: ftbert, hf-eager, hf-sdpa, "
                   "sentence-transformers; with --varlen: the rows of each ragged batch, from "
                   f"{', '.join(VARLEN_ENGINES)} (default: {','.join(VARLEN_DEFAULT_ENGINES)})")
    p.add_argument("--quantization", choices=["int8", "fp8"], help="add ftbert's rows with that "
                   "quantization (the ftbert-int8 or ftbert-fp8 engine): int8 on the cpu in float32, "
                   "fp8 on a GPU of compute capability 9.0+ in float16/bfloat16")
    p.add_argument("--compile", action="store_true", default=None, help="add torch.compile of the "
                   "transformers sdpa model (hf-compile); compiles once per shape and dtype (minutes)")
    p.add_argument("--compile-mode", help="torch.compile mode of hf-compile: "
                   f"{', '.join(COMPILE_MODES)} (default: default; max-autotune tunes its GEMMs and "
                   "records CUDA graphs, minutes per shape)")
    p.add_argument("--iters", type=int, help="timed repetitions per configuration (default 100 on "
                   "the GPU, 10 on the CPU)")
    p.add_argument("--warmup", type=int, help="untimed repetitions first (default 10 GPU, 2 CPU)")
    p.add_argument("--min-len", type=int, metavar="MIN", help="ragged batches in the sweep: each "
                   "sequence's length drawn uniformly in [MIN, seq] (right padding), fixed seed")
    p.add_argument("--seed", type=int, help="seed of the random inputs (default 0)")
    p.add_argument("--allow-tf32", action="store_true", default=None, help="let float32 GEMMs use "
                   "TF32 in ftbert and torch (the float32 reference never does)")
    p.add_argument("--no-cuda-graphs", action="store_true", default=None, help="run ftbert's "
                   "forwards op by op instead of replaying each repeated shape as a CUDA graph")
    p.add_argument("--breakdown", action="store_true", help="per-op breakdown of one ftbert "
                   "configuration (the first batch, seq, dtype and attention) with torch.profiler; "
                   "needs a GPU")
    r = p.add_argument_group(
        "reranking (--rerank)",
        "Pairs/s of a cross-encoder scoring (query, document) pairs: ftbert's Encoder.predict next to "
        "transformers (tokenizer + forward + activation) and sentence-transformers' CrossEncoder.predict, "
        "each end to end (texts in, scores out) and model only (pre-tokenized batches, forward only), "
        "after a check that the scores agree. Defaults: --model bert-base, --batch 32, float16 on the "
        "GPU (float32 on the CPU), --attention auto, --engines ftbert,hf-sdpa,sentence-transformers "
        "(hf-eager also runs), --iters 10 --warmup 2 (CPU 3 and 1), one repetition being a pass over "
        "all the pairs.")
    r.add_argument("--rerank", action="store_true", default=None, help="run the reranking benchmark "
                   "instead of the latency sweep")
    r.add_argument("--pairs", type=int, help="pairs per timed pass (default 512 on the GPU, 64 on the CPU)")
    r.add_argument("--query-len", type=int, help="tokens per query, special tokens not counted "
                   f"(default {RERANK_DEFAULT_QUERY_LEN})")
    r.add_argument("--doc-len", type=int, help="tokens per document, special tokens not counted "
                   f"(default {RERANK_DEFAULT_DOC_LEN}); pairs longer than the model's limit are "
                   "truncated, as the cross-encoder truncates them")
    r.add_argument("--tokenizer", metavar="DIR", help="with --model bert-base: a directory with a BERT "
                   "uncased tokenizer (vocab.txt is enough; default: the bundled all-MiniLM-L6-v2's)")
    v = p.add_argument_group(
        "ragged batches (--varlen)",
        "Two parts, in one process. model: for each case (--cases), one batch of random ids with "
        "random lengths, right-padded, timed as ftbert padded (padding_free=False), ftbert "
        "padding-free (padding_free=True), ftbert forward_packed (the same tokens packed), ftbert on "
        "the full batch (every length SEQ: the 1.0 of time_vs_full) and transformers sdpa on the "
        "padded batch (--compile adds torch.compile), the rows interleaved round by round, after a "
        "check of every output against a float32 transformers reference (max abs error over the "
        "attended tokens; the run stops when padding-free strays). encode: Encoder.encode(texts) "
        "of mixed-length sentences next to sentence-transformers' encode, sentences/s, after a "
        "cosine check of the two embeddings. Defaults: --model bert-base, float16 on the GPU "
        "(float32 on the CPU), --attention auto, --iters 100 --warmup 10 (CPU 10 and 2), the "
        "bundled all-MiniLM-L6-v2 for encode. Writes JSON, CSV and a bar chart (PNG).")
    v.add_argument("--varlen", action="store_true", default=None, help="run the ragged-batch "
                   "benchmark instead of the latency sweep")
    # argparse %-formats help texts: the defaults' percent signs are doubled.
    cases = {k: ",".join(v).replace("%", "%%") for k, v in VARLEN_DEFAULT_CASES.items()}
    v.add_argument("--cases", nargs="+", metavar="BxS:MIN-MAX", help="the ragged batches: BATCHxSEQ "
                   "with lengths uniform in [MIN, MAX], in tokens or %% of SEQ (default on the GPU: "
                   f"{cases['cuda']}; on the CPU: {cases['cpu']})")
    v.add_argument("--parts", nargs="+", help="model and/or encode (default both)")
    v.add_argument("--sentences", type=int, help="sentences of the encode part (default "
                   f"{VARLEN_DEFAULT_SENTENCES['cuda']} on the GPU, {VARLEN_DEFAULT_SENTENCES['cpu']} "
                   "on the CPU): word counts log-normal (median 16, a long tail), clipped to the "
                   "model's maximum length")
    v.add_argument("--encode-model", metavar="DIR", help="the encode part's sentence-transformers "
                   "checkpoint (default: the bundled all-MiniLM-L6-v2, else $FTBERT_MINILM_FP16)")
    v.add_argument("--st-batch", type=int, help="sentence-transformers' encode batch_size (default "
                   f"{ST_DEFAULT_BATCH}, its own default)")
    v.add_argument("--passes", type=int, help="timed passes over the sentences per engine, after "
                   "an untimed one that checks the embeddings and one that warms up (default "
                   f"{VARLEN_PASSES['cuda']} on the GPU, {VARLEN_PASSES['cpu']} on the CPU)")
    p.add_argument("--out", help="folder for the JSON, CSV and PNG files (default ./bench_results)")
    p.add_argument("--name", help="file name stem of the outputs (default MODEL-DEVICE-TIMESTAMP)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    return p


def _split(values) -> list[str]:
    """["1,8", "32"] or "1,8,32" or [1, 8] -> ["1", "8", "32"]."""
    if isinstance(values, (str, int)):
        values = [values]
    out: list[str] = []
    for v in values:
        out.extend(s.strip() for s in str(v).split(",") if s.strip())
    return out


def _ints(what: str, values) -> list[int]:
    out = []
    for s in _split(values):
        try:
            n = int(s)
        except ValueError:
            raise BenchError(f"--{what}: {s!r} is not an integer") from None
        if n < 1:
            raise BenchError(f"--{what}: {n} must be at least 1")
        out.append(n)
    if not out:
        raise BenchError(f"--{what}: no values given")
    return list(dict.fromkeys(out))  # drop repeats, keep order


def _choices(what: str, values, allowed) -> list[str]:
    out = _split(values)
    for s in out:
        if s not in allowed:
            raise BenchError(f"--{what}: unknown value {s!r} (expected {', '.join(allowed)})")
    if not out:
        raise BenchError(f"--{what}: no values given")
    return list(dict.fromkeys(out))


def _devices(values) -> list[str]:
    out = []
    for s in _split(values):
        if s == "cuda":
            s = "cuda:0"
        if s != "cpu" and not (s.startswith("cuda:") and s[5:].isdigit()):
            raise BenchError(f"--device: unknown device {s!r} (expected cpu, cuda or cuda:N)")
        out.append(s)
    if not out:
        raise BenchError("--device: no values given")
    return list(dict.fromkeys(out))


# The presets that ship with the package (installed beside this file).
SHIPPED_PRESETS = Path(__file__).resolve().parent / "presets"


def preset_dirs() -> list[Path]:
    """Where preset names are looked up: ./benchmarks/presets (your own), then the shipped ones."""
    dirs = [Path.cwd() / "benchmarks" / "presets"]
    if SHIPPED_PRESETS not in dirs:
        dirs.append(SHIPPED_PRESETS)
    return dirs


def load_preset(name: str) -> tuple[dict, str]:
    """A preset's settings and the file they came from."""
    path = Path(name)
    if not (path.suffix == ".json" or "/" in name) or not path.is_file():
        found = [d / f"{name}.json" for d in preset_dirs() if (d / f"{name}.json").is_file()]
        if not found:
            known = sorted({f.stem for d in preset_dirs() if d.is_dir() for f in d.glob("*.json")})
            where = ", ".join(str(d) for d in preset_dirs())
            raise BenchError(
                f"unknown preset {name!r}: not a JSON file and not in {where} "
                f"(known: {', '.join(known) or 'none'})"
            )
        path = found[0]
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BenchError(f"preset {str(path)!r} is not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise BenchError(f"preset {str(path)!r} must hold a JSON object")
    unknown = sorted(set(data) - set(PRESET_KEYS))
    if unknown:
        raise BenchError(f"preset {str(path)!r}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(PRESET_KEYS)})")
    return data, str(path)


def _old_varlen(argv: list[str]) -> None:
    """`--varlen 16` (the sweep's option before --varlen became a mode) gets a message that says
    what to write instead, not argparse's "unrecognized arguments: 16"."""
    for i, a in enumerate(argv):
        if a.startswith("--varlen="):
            raise BenchError(OLD_VARLEN)
        if a == "--varlen" and i + 1 < len(argv) and argv[i + 1].lstrip("-").isdigit():
            raise BenchError(OLD_VARLEN)


def _count(what: str, v, least: int = 1):
    """An integer option (None: not given) of at least `least`."""
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
        raise BenchError(f"--{what} must be an integer of at least {least}, got {v!r}")
    return v


def parse_options(argv: list[str], cuda_available: bool) -> Options:
    """argv -> Options, checked. Raises BenchError on a bad value (argparse exits on bad syntax)."""
    _old_varlen(argv)
    ns = build_parser().parse_args(argv)
    preset: dict = {}
    preset_path = None
    if ns.preset:
        preset, preset_path = load_preset(ns.preset)
        if "varlen" in preset and not isinstance(preset["varlen"], bool):
            raise BenchError(f"preset {preset_path!r}: \"varlen\": {preset['varlen']!r}: {OLD_VARLEN}")

    def pick(attr: str, key: str | None = None):
        v = getattr(ns, attr)
        return v if v is not None else preset.get(key or attr)

    rerank = bool(pick("rerank"))
    varlen = bool(pick("varlen"))
    if rerank and varlen:
        raise BenchError("--rerank and --varlen are separate benchmarks: run one at a time")
    if rerank:
        given = [k for k in SWEEP_ONLY if pick(k)] + (["breakdown"] if ns.breakdown else [])
        if given:
            raise BenchError(f"--{given[0].replace('_', '-')} does not apply to --rerank (its pairs are "
                             "--query-len + --doc-len tokens, timed end to end and model only)")
    elif varlen:
        given = ([k for k in ("batch", "seq", "min_len") if pick(k) is not None]
                 + (["breakdown"] if ns.breakdown else []) + [k for k in RERANK_ONLY if pick(k) is not None])
        if given:
            raise BenchError(f"--{given[0].replace('_', '-')} does not apply to --varlen (its batches "
                             "are --cases BATCHxSEQ:MIN-MAX, its texts --sentences)")
    else:
        given = [k for k in RERANK_ONLY if pick(k) is not None]
        if given:
            raise BenchError(f"--{given[0].replace('_', '-')} only applies with --rerank")
    if not varlen:
        given = [k for k in VARLEN_ONLY if pick(k) is not None]
        if given:
            raise BenchError(f"--{given[0].replace('_', '-')} only applies with --varlen")
    mode = rerank or varlen  # a benchmark of one setting, not a grid
    model = pick("model") or ("bert-base" if mode else "minilm")
    devices = _devices(pick("device")) if pick("device") is not None else (
        ["cuda:0"] if cuda_available else ["cpu"])
    any_gpu = any(d.startswith("cuda") for d in devices)
    default_dtypes = (["float16"] if mode else list(DTYPES)) if any_gpu else ["float32"]
    dtypes = (_choices("dtype", pick("dtype"), DTYPES) if pick("dtype") is not None
              else default_dtypes)
    batches = [] if varlen else _ints("batch", pick("batch")) if pick("batch") is not None else list(
        RERANK_DEFAULT_BATCHES if rerank else DEFAULT_BATCHES)
    seqs = [] if mode else (_ints("seq", pick("seq")) if pick("seq") is not None else list(DEFAULT_SEQS))
    attentions = (_choices("attention", pick("attention"), ATTENTIONS) if pick("attention") is not None
                  else ["auto"] if mode else list(ATTENTIONS))
    if mode and len(attentions) > 1:
        raise BenchError(f"--attention: --{'rerank' if rerank else 'varlen'} times one ftbert attention "
                         f"variant, got {', '.join(attentions)}")
    allowed = RERANK_ENGINES if rerank else VARLEN_ENGINES if varlen else ENGINES
    defaults = RERANK_DEFAULT_ENGINES if rerank else VARLEN_DEFAULT_ENGINES if varlen else DEFAULT_ENGINES
    engines = (_choices("engines", pick("engines"), allowed) if pick("engines") is not None
               else list(defaults))
    if pick("compile") and "hf-compile" not in engines:
        engines.append("hf-compile")
    if (quantization := pick("quantization")) is not None:
        if quantization not in ("int8", "fp8"):
            raise BenchError(f"--quantization: {quantization!r} is not one of int8, fp8")
        if f"ftbert-{quantization}" not in engines:
            engines.append(f"ftbert-{quantization}")
    compile_mode = pick("compile_mode")
    if compile_mode is not None:
        if compile_mode not in COMPILE_MODES:
            raise BenchError(f"--compile-mode: {compile_mode!r} is not one of {', '.join(COMPILE_MODES)}")
        if "hf-compile" not in engines:
            raise BenchError("--compile-mode applies to the hf-compile engine: add --compile (or "
                             "hf-compile to --engines)")
    if pick("tokenizer") is not None and model != "bert-base":
        raise BenchError("--tokenizer only applies to --model bert-base: a cross-encoder directory "
                         "brings its own tokenizer")
    pairs = _count("pairs", pick("pairs"))
    query_len = _count("query-len", pick("query_len"))
    doc_len = _count("doc-len", pick("doc_len"))

    iters = _count("iters", pick("iters"))
    warmup = _count("warmup", pick("warmup"), 0)
    min_len = _count("min-len", pick("min_len"))
    if min_len is not None and min_len > min(seqs):
        raise BenchError(f"--min-len {min_len} is longer than the shortest --seq {min(seqs)}")
    seed = pick("seed")
    seed = 0 if seed is None else seed
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise BenchError(f"--seed must be an integer, got {seed!r}")

    cases = None
    if pick("cases") is not None:
        specs = _split(pick("cases"))
        if not specs:
            raise BenchError("--cases: no values given")
        cases = list(dict.fromkeys(parse_case(c) for c in specs))
    parts = (_choices("parts", pick("parts"), VARLEN_PARTS) if pick("parts") is not None
             else list(VARLEN_PARTS))
    st_batch = _count("st-batch", pick("st_batch"))
    encode_model = pick("encode_model")
    if encode_model is not None and "encode" not in parts:
        raise BenchError("--encode-model applies to the encode part, and --parts leaves it out")

    opts = Options(
        model=str(model), devices=devices, dtypes=dtypes, batches=batches, seqs=seqs,
        attentions=attentions, engines=engines, iters=iters, warmup=warmup, min_len=min_len,
        seed=seed, allow_tf32=bool(pick("allow_tf32")), breakdown=bool(ns.breakdown),
        out=Path(ns.out or "bench_results"), name=ns.name, quiet=bool(ns.quiet),
        preset=preset_path, description=preset.get("description"),
        cuda_graphs=not pick("no_cuda_graphs"), rerank=rerank, pairs=pairs,
        query_len=RERANK_DEFAULT_QUERY_LEN if query_len is None else query_len,
        doc_len=RERANK_DEFAULT_DOC_LEN if doc_len is None else doc_len,
        tokenizer=None if pick("tokenizer") is None else str(pick("tokenizer")),
        varlen=varlen, cases=cases, parts=parts, sentences=_count("sentences", pick("sentences")),
        encode_model=None if encode_model is None else str(encode_model),
        st_batch=ST_DEFAULT_BATCH if st_batch is None else st_batch,
        passes=_count("passes", pick("passes")),
        compile_mode=compile_mode or "default",
    )
    return opts
