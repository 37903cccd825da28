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

# Keys a preset may set (the option names, with "-" spelt "_").
PRESET_KEYS = (
    "description", "model", "device", "dtype", "batch", "seq", "attention", "engines", "compile",
    "iters", "warmup", "varlen", "seed", "allow_tf32", "no_cuda_graphs",
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

    def iters_for(self, device: str) -> int:
        return self.iters if self.iters is not None else DEFAULT_ITERS[device.split(":")[0]]

    def warmup_for(self, device: str) -> int:
        return self.warmup if self.warmup is not None else DEFAULT_WARMUP[device.split(":")[0]]

    def as_dict(self) -> dict:
        return {
            "model": self.model, "devices": self.devices, "dtypes": self.dtypes,
            "batches": self.batches, "seqs": self.seqs, "attentions": self.attentions,
            "engines": self.engines, "iters": {d: self.iters_for(d) for d in self.devices},
            "warmup": {d: self.warmup_for(d) for d in self.devices}, "varlen": self.varlen,
            "seed": self.seed, "allow_tf32": self.allow_tf32, "cuda_graphs": self.cuda_graphs,
            "breakdown": self.breakdown, "preset": self.preset,
        }


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
                   "BERT-base, fixed seed) or a HuggingFace / ftbert-converted checkpoint directory")
    p.add_argument("--preset", help="a preset name (shipped: serving, minilm, varlen, compile, "
                   "quick, cpu; or ./benchmarks/presets/NAME.json) or a JSON file path")
    p.add_argument("--device", nargs="+", help="cuda, cuda:N and/or cpu (default: cuda when there is "
                   "a GPU and a CUDA build, else cpu)")
    p.add_argument("--dtype", nargs="+", help="float32, float16, bfloat16 (default: all three on the "
                   "GPU, float32 on the CPU)")
    p.add_argument("--batch", nargs="+", help="batch sizes (default 1,8,32)")
    p.add_argument("--seq", nargs="+", help="sequence lengths (default 32,128,512)")
    p.add_argument("--attention", nargs="+", help="ftbert attention variants: unfused, flash, auto "
                   "(default: all three)")
    p.add_argument("--engines", nargs="+", help="ftbert, hf-eager, hf-sdpa, hf-compile (default: "
                   "ftbert,hf-eager,hf-sdpa)")
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

    model = pick("model") or "minilm"
    devices = _devices(pick("device")) if pick("device") is not None else (
        ["cuda:0"] if cuda_available else ["cpu"])
    any_gpu = any(d.startswith("cuda") for d in devices)
    dtypes = (_choices("dtype", pick("dtype"), DTYPES) if pick("dtype") is not None
              else list(DTYPES) if any_gpu else ["float32"])
    batches = _ints("batch", pick("batch")) if pick("batch") is not None else list(DEFAULT_BATCHES)
    seqs = _ints("seq", pick("seq")) if pick("seq") is not None else list(DEFAULT_SEQS)
    attentions = (_choices("attention", pick("attention"), ATTENTIONS) if pick("attention") is not None
                  else list(ATTENTIONS))
    engines = (_choices("engines", pick("engines"), ENGINES) if pick("engines") is not None
               else list(DEFAULT_ENGINES))
    if pick("compile") and "hf-compile" not in engines:
        engines.append("hf-compile")

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
        cuda_graphs=not pick("no_cuda_graphs"),
    )
    return opts
