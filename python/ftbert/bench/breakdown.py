"""Per-op breakdown of one ftbert forward on the GPU: where the time goes, by op.

torch.profiler (CUDA activity only) records every kernel the forward launches; kernel names are
grouped into the engine's ops (see `classify`). The GEMMs that run between the QKV split and the
head merge are the unfused attention's batched GEMMs (QKᵀ and PV) and are counted apart
("attention_gemm"), found by launch order, since cuBLAS names them like any other GEMM.

The CPU backend runs a whole forward inside one C++ call that the profiler cannot see into, so the
breakdown needs a GPU; `ftbert bench --breakdown --device cpu` says so and exits.
"""

from __future__ import annotations

import re
import warnings

import torch

from .args import Options
from .models import Model, make_ftbert
from .sweep import make_inputs, on_device_stream
from .timing import summarize, time_forward

# (category, where to look, substrings of the lower-cased name), first match wins. "own" is the
# kernel's own name (`short_name`), "full" the whole signature. GEMMs go first and by the full name:
# cuBLAS/CUTLASS hide the GEMM in a template argument (cutlass::Kernel2<..._gemm_...>) and may name
# an epilogue ("..._gelu"), which must not pull a GEMM into the activation op.
_RULES = (
    ("memcpy/memset", "full", ("memcpy", "memset")),
    ("gemm", "full", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "splitkreduce")),
    ("embed_layernorm", "own", ("embed",)),
    ("flash_attention", "own", ("flash",)),
    ("masked_softmax", "own", ("softmax",)),
    ("add_qkv_bias_transpose", "own", ("qkv",)),
    ("transpose_heads", "own", ("transpose",)),
    ("add_bias_residual_layernorm", "own", ("layernorm", "layer_norm")),
    ("add_bias_activation", "own", ("gelu", "activation")),
    # torch's own kernels in the forward: the input checks (value ranges) and any dtype casts.
    ("torch (input checks)", "full", ("at::native", "elementwise", "reduce_kernel")),
)


def short_name(name: str) -> str:
    """'void ns::(anonymous namespace)::foo_kernel<__half, 3>(args)' -> 'foo_kernel'."""
    s = name.strip()
    if s.lower().startswith(("memcpy", "memset")):
        return s
    s = s.replace("(anonymous namespace)::", "")
    if s.startswith("void "):
        s = s[5:]
    s = re.split(r"[<(]", s, maxsplit=1)[0]
    return s.rsplit("::", 1)[-1].strip() or name


def classify(name: str) -> str:
    """The op a kernel belongs to (see _RULES); "other" when no rule knows it."""
    full, own = name.lower(), short_name(name).lower()
    for category, where, keys in _RULES:
        text = full if where == "full" else own
        if any(k in text for k in keys):
            return category
    return "other"


def label_in_order(names: list[str]) -> list[str]:
    """Categories of kernels in launch order; GEMMs between add_qkv_bias_transpose and
    transpose_heads become "attention_gemm"."""
    out, inside = [], False
    for n in names:
        c = classify(n)
        if c == "add_qkv_bias_transpose":
            inside = True
        elif c == "transpose_heads":
            inside = False
        out.append("attention_gemm" if inside and c == "gemm" else c)
    return out


def aggregate(kernels: list[tuple[str, float]], forwards: int) -> dict:
    """[(kernel name, microseconds)] in launch order over `forwards` forwards -> per-op and
    per-kernel totals per forward, shares of the kernel time."""
    labels = label_in_order([n for n, _ in kernels])
    total_us = sum(us for _, us in kernels)
    ops: dict[str, dict] = {}
    per_kernel: dict[tuple[str, str], dict] = {}
    for (name, us), op in zip(kernels, labels):
        o = ops.setdefault(op, {"op": op, "us": 0.0, "launches": 0})
        o["us"] += us
        o["launches"] += 1
        short = short_name(name)
        k = per_kernel.setdefault((op, short), {"op": op, "kernel": short, "us": 0.0, "launches": 0})
        k["us"] += us
        k["launches"] += 1

    def finish(d):
        return {
            **{k: v for k, v in d.items() if k not in ("us", "launches")},
            "ms_per_forward": d["us"] / 1e3 / forwards,
            "launches_per_forward": d["launches"] / forwards,
            "share": d["us"] / total_us if total_us else 0.0,
        }

    return {
        "kernel_ms_per_forward": total_us / 1e3 / forwards,
        "ops": sorted((finish(o) for o in ops.values()), key=lambda d: -d["ms_per_forward"]),
        "kernels": sorted((finish(k) for k in per_kernel.values()), key=lambda d: -d["ms_per_forward"]),
    }


def profile_kernels(fn, forwards: int) -> list[tuple[str, float]]:
    """(name, µs) of every GPU activity in `forwards` calls of fn(), in start order."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        # torch warns that a profiler without a schedule keeps one cycle: exactly what is wanted.
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(forwards):
                fn()
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    return [(e.name, float(e.time_range.elapsed_us())) for e in events]


def breakdown_quantization(opts: Options) -> str:
    """The quantization the breakdown profiles: fp8 where --quantization fp8 (or the ftbert-fp8
    engine) asked for it, else none (int8 runs on the CPU, which the breakdown does not profile)."""
    return "fp8" if "ftbert-fp8" in opts.engines else "none"


def run_breakdown(opts: Options, model: Model) -> dict:
    """Profiles ftbert at the first device/dtype/batch/seq/attention of the options, quantized as
    breakdown_quantization says."""
    device = next(d for d in opts.devices if d.startswith("cuda"))
    quantization = breakdown_quantization(opts)
    dtype, batch, seq, attention = opts.dtypes[0], opts.batches[0], opts.seqs[0], opts.attentions[0]
    inputs = make_inputs(model.config, batch, seq, opts.min_len, opts.seed)
    with on_device_stream(device), torch.inference_mode():
        if opts.allow_tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
        enc = make_ftbert(model, device, dtype, attention, opts.allow_tf32, opts.cuda_graphs,
                          quantization=quantization)
        ids, mask, types = (inputs[k].to(device=device, dtype=torch.int32)
                            for k in ("input_ids", "attention_mask", "token_type_ids"))

        def fn():
            return enc(ids, mask, types)

        fn()  # the GEMM shapes go to the tuner: timed and profiled once its picks are in use
        enc.wait_for_tuning()
        samples = time_forward(fn, device, opts.warmup_for(device), opts.iters_for(device))
        timing = summarize(samples)
        # Profiling slows launches a little; a modest count keeps the trace small.
        forwards = max(1, min(opts.iters_for(device), 20))
        kernels = profile_kernels(fn, forwards)
        kernel_name = enc.attention_for(batch, seq)
    result = aggregate(kernels, forwards)
    gap = timing["median_ms"] - result["kernel_ms_per_forward"]
    result.update({
        "config": {"device": device, "dtype": dtype, "quantization": quantization, "batch": batch,
                   "seq": seq, "attention": attention, "kernel": kernel_name,
                   "varlen_min": opts.min_len,
                   "tokens": int(inputs["attention_mask"].sum())},
        "forward_ms": timing,
        "forwards_profiled": forwards,
        # Time the GPU is not running a kernel of this forward: launch latency (what CUDA graphs,
        # on unless --no-cuda-graphs, win back), the host-side input check, Python.
        "gap_ms_per_forward": gap,
    })
    return result


def print_breakdown(console, result: dict) -> None:
    from rich.table import Table

    c = result["config"]
    fwd = result["forward_ms"]["median_ms"]
    t = Table(
        title=(f"ftbert per-op breakdown: {c['device']} {c['dtype']}"
               f"{'' if c.get('quantization', 'none') == 'none' else ' ' + c['quantization']} "
               f"batch {c['batch']} seq {c['seq']} "
               f"attention {c['attention']} ({c['kernel']}); forward median {fwd:.3f} ms"),
        title_justify="left", header_style="bold",
    )
    for name in ("op", "ms / forward", "launches / forward", "% of kernel time", "% of forward"):
        t.add_column(name, justify="left" if name == "op" else "right")
    for o in result["ops"]:
        t.add_row(o["op"], f"{o['ms_per_forward']:.4f}", f"{o['launches_per_forward']:.0f}",
                  f"{100 * o['share']:.1f}", f"{100 * o['ms_per_forward'] / fwd:.1f}")
    t.add_row("[dim]kernels, all[/]", f"{result['kernel_ms_per_forward']:.4f}", "", "100.0",
              f"{100 * result['kernel_ms_per_forward'] / fwd:.1f}")
    t.add_row("[dim]gaps (launch, host, idle)[/]", f"{result['gap_ms_per_forward']:.4f}", "", "",
              f"{100 * result['gap_ms_per_forward'] / fwd:.1f}")
    console.print(t)
    k = Table(title="top kernels", title_justify="left", header_style="bold")
    for name in ("kernel", "op", "ms / forward", "launches / forward", "% of kernel time"):
        k.add_column(name, justify="left" if name in ("kernel", "op") else "right")
    for d in result["kernels"][:15]:
        k.add_row(d["kernel"][:60], d["op"], f"{d['ms_per_forward']:.4f}",
                  f"{d['launches_per_forward']:.0f}", f"{100 * d['share']:.1f}")
    console.print(k)
