"""Command line and presets of `ftbert bench`: argv (+ an optional preset JSON) -> `Options`.

Precedence: a flag given on the command line, then the preset's value, then the built-in default.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")
ATTENTIONS = ("unfused", "flash", "auto")
# "ftbert" expands to one engine per attention variant; the others are the transformers peers.
ENGINES = ("ftbert", "hf-eager", "hf-sdpa", "hf-compile")
BUILTIN_MODELS = ("minilm", "bert-base")

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
# Options of the latency sweep that mean nothing to --rerank.
SWEEP_ONLY = ("seq", "varlen", "compile")
RERANK_ONLY = ("pairs", "query_len", "doc_len", "tokenizer")

# Keys a preset may set (the option names, with "-" spelt "_").
PRESET_KEYS = (
    "description", "model", "device", "dtype", "batch", "seq", "attention", "engines", "compile",
    "iters", "warmup", "varlen", "seed", "allow_tf32", "no_cuda_graphs",
    "rerank", "pairs", "query_len", "doc_len", "tokenizer",
)


class BenchError(Exception):
    """A problem the user can fix (bad model path, missing device, bad option): one line, exit 2."""


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
    varlen: int | None
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
            "warmup": {d: self.warmup_for(d) for d in self.devices}, "varlen": self.varlen,
            "seed": self.seed, "allow_tf32": self.allow_tf32, "cuda_graphs": self.cuda_graphs,
            "breakdown": self.breakdown, "preset": self.preset,
        }
        if self.rerank:
            del d["seqs"], d["varlen"], d["breakdown"]
            d.update(rerank=True, pairs={dev: self.pairs_for(dev) for dev in self.devices},
                     query_len=self.query_len, doc_len=self.doc_len, tokenizer=self.tokenizer)
        return d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ftbert bench",
        description=(
            "Latency sweep of ftbert next to transformers (eager, sdpa, optionally torch.compile) in "
            "one process on the same inputs: median/p90/p99 latency, sequences/s, tokens/s, peak "
            "memory, speed-up over transformers-sdpa and max abs error against a float32 reference. "
            "Lists take commas or spaces: --batch 1,8,32 or --batch 1 8 32."
        ),
    )
    # Defaults are None so that a preset's value can fill what the command line leaves out.
    p.add_argument("--model", help="minilm (the bundled all-MiniLM-L6-v2, default), bert-base (random "
                   "BERT-base, fixed seed) or a HuggingFace / ftbert-converted checkpoint directory; "
                   "with --rerank: bert-base (default: a random BERT-base cross-encoder) or a "
                   "HuggingFace cross-encoder directory (*ForSequenceClassification, one label)")
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
    p.add_argument("--engines", nargs="+", help="ftbert, hf-eager, hf-sdpa, hf-compile (default: "
                   "ftbert,hf-eager,hf-sdpa); with --rerank: ftbert, hf-eager, hf-sdpa, "
                   "sentence-transformers")
    p.add_argument("--compile", action="store_true", default=None, help="add torch.compile of the "
                   "transformers sdpa model (hf-compile); compiles once per shape and dtype (minutes)")
    p.add_argument("--iters", type=int, help="timed repetitions per configuration (default 100 on "
                   "the GPU, 10 on the CPU)")
    p.add_argument("--warmup", type=int, help="untimed repetitions first (default 10 GPU, 2 CPU)")
    p.add_argument("--varlen", type=int, metavar="MIN", help="variable lengths: each sequence's "
                   "length drawn uniformly in [MIN, seq] (right padding), fixed seed")
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


def parse_options(argv: list[str], cuda_available: bool) -> Options:
    """argv -> Options, checked. Raises BenchError on a bad value (argparse exits on bad syntax)."""
    ns = build_parser().parse_args(argv)
    preset: dict = {}
    preset_path = None
    if ns.preset:
        preset, preset_path = load_preset(ns.preset)

    def pick(attr: str, key: str | None = None):
        v = getattr(ns, attr)
        return v if v is not None else preset.get(key or attr)

    rerank = bool(pick("rerank"))
    if rerank:
        given = [k for k in SWEEP_ONLY if pick(k)] + (["breakdown"] if ns.breakdown else [])
        if given:
            raise BenchError(f"--{given[0].replace('_', '-')} does not apply to --rerank (its pairs are "
                             "--query-len + --doc-len tokens, timed end to end and model only)")
    else:
        given = [k for k in RERANK_ONLY if pick(k) is not None]
        if given:
            raise BenchError(f"--{given[0].replace('_', '-')} only applies with --rerank")
    model = pick("model") or ("bert-base" if rerank else "minilm")
    devices = _devices(pick("device")) if pick("device") is not None else (
        ["cuda:0"] if cuda_available else ["cpu"])
    any_gpu = any(d.startswith("cuda") for d in devices)
    default_dtypes = (["float16"] if rerank else list(DTYPES)) if any_gpu else ["float32"]
    dtypes = (_choices("dtype", pick("dtype"), DTYPES) if pick("dtype") is not None
              else default_dtypes)
    batches = _ints("batch", pick("batch")) if pick("batch") is not None else list(
        RERANK_DEFAULT_BATCHES if rerank else DEFAULT_BATCHES)
    seqs = [] if rerank else (_ints("seq", pick("seq")) if pick("seq") is not None else list(DEFAULT_SEQS))
    attentions = (_choices("attention", pick("attention"), ATTENTIONS) if pick("attention") is not None
                  else ["auto"] if rerank else list(ATTENTIONS))
    if rerank and len(attentions) > 1:
        raise BenchError("--attention: --rerank times one ftbert attention variant, got "
                         f"{', '.join(attentions)}")
    allowed = RERANK_ENGINES if rerank else ENGINES
    engines = (_choices("engines", pick("engines"), allowed) if pick("engines") is not None
               else list(RERANK_DEFAULT_ENGINES if rerank else DEFAULT_ENGINES))
    if pick("compile") and "hf-compile" not in engines:
        engines.append("hf-compile")
    if pick("tokenizer") is not None and model != "bert-base":
        raise BenchError("--tokenizer only applies to --model bert-base: a cross-encoder directory "
                         "brings its own tokenizer")
    pairs = pick("pairs")
    query_len = pick("query_len")
    doc_len = pick("doc_len")
    for what, v in (("pairs", pairs), ("query-len", query_len), ("doc-len", doc_len)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise BenchError(f"--{what} must be an integer of at least 1, got {v!r}")

    iters, warmup = pick("iters"), pick("warmup")
    for what, v, least in (("iters", iters, 1), ("warmup", warmup, 0)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
            raise BenchError(f"--{what} must be an integer of at least {least}, got {v!r}")
    varlen = pick("varlen")
    if varlen is not None:
        if not isinstance(varlen, int) or isinstance(varlen, bool) or varlen < 1:
            raise BenchError(f"--varlen must be a positive integer, got {varlen!r}")
        if varlen > min(seqs):
            raise BenchError(f"--varlen {varlen} is longer than the shortest --seq {min(seqs)}")
    seed = pick("seed")
    seed = 0 if seed is None else seed
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise BenchError(f"--seed must be an integer, got {seed!r}")

    opts = Options(
        model=str(model), devices=devices, dtypes=dtypes, batches=batches, seqs=seqs,
        attentions=attentions, engines=engines, iters=iters, warmup=warmup, varlen=varlen,
        seed=seed, allow_tf32=bool(pick("allow_tf32")), breakdown=bool(ns.breakdown),
        out=Path(ns.out or "bench_results"), name=ns.name, quiet=bool(ns.quiet),
        preset=preset_path, description=preset.get("description"),
        cuda_graphs=not pick("no_cuda_graphs"), rerank=rerank, pairs=pairs,
        query_len=RERANK_DEFAULT_QUERY_LEN if query_len is None else query_len,
        doc_len=RERANK_DEFAULT_DOC_LEN if doc_len is None else doc_len,
        tokenizer=None if pick("tokenizer") is None else str(pick("tokenizer")),
    )
    return opts
