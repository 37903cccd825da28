"""Attention kernels at BERT shapes and at head dim 128: ftbert's fused flash kernel, ftbert's
unfused path and torch's scaled_dot_product_attention, in float16 and bfloat16.

Run on a GPU machine:
    python benchmarks/kernels/bench_attention.py [--reps 200] [--json bench_attention.json]

What each row times (median over --reps launches, CUDA events, after warm-up, L2 flushed before
every launch unless --no-flush):
  ftbert flash       one kernel: reads qkv [B, S, 3H] + bias, writes [B, S, H] (on Hopper, head
                     dims 64 and 128 run the warpgroup-MMA kernels of flash_sm90.cu)
  flash portable     the same with FTBERT_FLASH_PORTABLE=1: flash.cu's mma.sync kernel
  ftbert unfused     bias+transpose, batched QKᵀ, masked softmax, batched PV, transpose back
  torch sdpa         q/k/v already split and biased, [B, heads, S, d] contiguous; excludes the
                     bias add and both transposes that the ftbert rows include
  torch sdpa auto    the same, with torch's own backend choice (on Hopper it may pick a backend
                     that uses the newer wgmma tensor-core instructions)
  torch sdpa+split   the "torch sdpa" call plus the bias add, the head split and the merge back to
                     [B, S, H]: the same work as the ftbert rows
The ftbert rows get an all-ones key mask (it is read); torch gets none, so its flash backend applies.
TFLOP/s counts the two matrix products only: 4 * B * heads * S * S * d.
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys

import torch

SHAPES = [  # name, batch, seq, heads, head_dim
    ("bert-base", 32, 128, 12, 64),
    ("bert-base", 32, 512, 12, 64),
    ("bert-base", 1, 128, 12, 64),
    ("minilm", 32, 128, 12, 32),
    ("d128", 32, 128, 8, 128),  # the third head dim the fused kernel takes (hidden 1024)
    ("d128", 32, 512, 8, 128),
]
TORCH_DTYPE = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def sdpa_flash_context():
    """Context selecting torch's flash backend, or None where this torch has no selector."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    return lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])


@contextlib.contextmanager
def env_var(name, value):
    """Sets an environment variable for the duration of the block."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def time_ms(fn, reps, warmup, flush):
    """Median milliseconds of fn() over `reps` launches, each between its own pair of events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()  # evict the inputs from L2, as a layer's other work would
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def bench_shape(_ops, runner, name, B, S, heads, d, dtype, args, flush):
    td = TORCH_DTYPE[dtype]
    H = heads * d
    scale = 1.0 / math.sqrt(d)
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, S, 3 * H, device="cuda", dtype=td, generator=gen)
    bias = torch.randn(3 * H, device="cuda", dtype=td, generator=gen) * 0.1
    mask = torch.ones(B, S, device="cuda", dtype=torch.int32)
    stream = torch.cuda.current_stream().cuda_stream

    # torch's inputs: split and biased once, outside the timed region (the "sdpa" row).
    qkv_b = (qkv + bias).view(B, S, 3, heads, d)
    q, k, v = (qkv_b[:, :, i].transpose(1, 2).contiguous() for i in range(3))

    def sdpa_call(q_, k_, v_):
        return torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, scale=scale)

    def sdpa():
        return sdpa_call(q, k, v)

    def sdpa_split():
        x = (qkv + bias).view(B, S, 3, heads, d)
        o = sdpa_call(*(x[:, :, i].transpose(1, 2) for i in range(3)))
        return o.transpose(1, 2).reshape(B, S, H)

    # torch's flash backend where it takes this shape, else whatever torch picks. The context is
    # entered once around the timing loop: entering it per call costs host time that would
    # show up between the events of a short kernel.
    torch_ctx, sdpa_backend = contextlib.nullcontext, "torch's choice"
    select = sdpa_flash_context()
    if select is not None:
        try:
            with select():
                sdpa_split()
            torch_ctx, sdpa_backend = select, "flash"
        except RuntimeError:
            pass

    with torch_ctx():
        reference = sdpa().transpose(1, 2).reshape(B, S, H).float()
    flops = 4.0 * B * heads * S * S * d
    rows = []

    def record(method, fn, merged, note="", ctx=contextlib.nullcontext):
        """Checks fn's output (merged(fn()) -> [B, S, H]) against torch's, then times fn."""
        try:
            with ctx():
                diff = (merged(fn()).float() - reference).abs().max().item()
        except RuntimeError as e:  # a kind this build or dtype does not support
            rows.append(dict(method=method, ms=None, tflops=None, max_abs_diff=None,
                             note=str(e).splitlines()[0][:80]))
            return
        with ctx():
            ms = time_ms(fn, args.reps, args.warmup, flush)
        rows.append(dict(method=method, ms=ms, tflops=flops / (ms * 1e-3) / 1e12,
                         max_abs_diff=diff, note=note))

    # "flash portable": FTBERT_FLASH_PORTABLE=1, flash.cu's mma.sync kernel; it differs from
    # "ftbert flash" only where the Hopper kernels (flash_sm90.cu) apply: head dims 64 and 128 on
    # sm_90.
    for method, kind in (("ftbert flash", "flash"), ("flash portable", "flash"),
                         ("ftbert unfused", "unfused")):
        out = torch.empty(B, S, H, device="cuda", dtype=td)
        try:
            ws_bytes = _ops.attention_workspace_bytes(kind, dtype, B, S, heads, d)
        except RuntimeError as e:
            rows.append(dict(method=method, ms=None, tflops=None, max_abs_diff=None,
                             note=str(e).splitlines()[0][:80]))
            continue
        ws = torch.empty(max(ws_bytes, 1), device="cuda", dtype=torch.uint8)

        def run(kind=kind, out=out, ws=ws):
            _ops.attention_ptr(runner, kind, dtype, qkv.data_ptr(), bias.data_ptr(), mask.data_ptr(),
                             out.data_ptr(), ws.data_ptr(), B, S, heads, d, stream)

        portable = method == "flash portable"
        ctx = (lambda: env_var("FTBERT_FLASH_PORTABLE", "1")) if portable else contextlib.nullcontext
        record(method, run, lambda _, out=out: out, ctx=ctx)
    record("torch sdpa", sdpa, lambda o: o.transpose(1, 2).reshape(B, S, H),
           note="reference; q/k/v pre-split, no bias/transpose", ctx=torch_ctx)
    record("torch sdpa auto", sdpa, lambda o: o.transpose(1, 2).reshape(B, S, H),
           note="q/k/v pre-split; torch's default backend choice")
    record("torch sdpa+split", sdpa_split, lambda o: o, note="incl. bias add, split, merge",
           ctx=torch_ctx)
    for r in rows:
        if r["method"] in ("torch sdpa", "torch sdpa+split"):
            r["note"] = f"{r['note']}; backend {sdpa_backend}"
        r.update(shape=name, batch=B, seq=S, heads=heads, head_dim=d, dtype=dtype)
    return rows


def fmt(v, spec, width):
    return format(v, spec) if v is not None else "n/a".rjust(width)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"], choices=TORCH_DTYPE)
    ap.add_argument("--no-flush", action="store_true", help="keep inputs warm in L2")
    ap.add_argument("--json", default="bench_attention.json", help="where to write the results")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("bench_attention needs a CUDA GPU")
    from ftbert import _ops

    runner = _ops.OpRunner("cuda")
    props = torch.cuda.get_device_properties(0)
    flush = None
    if not args.no_flush:
        l2 = getattr(props, "L2_cache_size", 64 << 20)
        flush = torch.empty(2 * l2, device="cuda", dtype=torch.uint8)

    print(f"device: {props.name}, torch {torch.__version__}, reps {args.reps}, "
          f"L2 {'warm' if args.no_flush else 'flushed'}")
    header = (f"{'shape':<10} {'B':>3} {'S':>4} {'h':>3} {'d':>4} {'dtype':<9} {'method':<17} "
              f"{'ms':>8} {'TFLOP/s':>8} {'vs flash':>8} {'max|diff|':>10}  note")
    print(header)
    print("-" * len(header))
    results = []
    for dtype in args.dtypes:
        for name, B, S, heads, d in SHAPES:
            rows = bench_shape(_ops, runner, name, B, S, heads, d, dtype, args, flush)
            flash_ms = next((r["ms"] for r in rows if r["method"] == "ftbert flash"), None)
            for r in rows:
                rel = r["ms"] / flash_ms if r["ms"] and flash_ms else None
                print(f"{name:<10} {B:>3} {S:>4} {heads:>3} {d:>4} {dtype:<9} {r['method']:<17} "
                      f"{fmt(r['ms'], '8.4f', 8)} {fmt(r['tflops'], '8.1f', 8)} {fmt(rel, '7.2f', 7)}x "
                      f"{fmt(r['max_abs_diff'], '10.2e', 10)}  {r['note']}")
            print()
            results.extend(rows)

    meta = dict(device=props.name, torch=torch.__version__, reps=args.reps, warmup=args.warmup,
                l2_flushed=not args.no_flush,
                flops="4*B*heads*S*S*d", time="median ms per call, CUDA events")
    with open(args.json, "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
