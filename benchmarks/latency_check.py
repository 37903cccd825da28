"""Short latency check on a GPU: BERT-base (12 layers, hidden 768, random init) in float16, ftbert
(unfused and flash attention; flash also with CUDA graphs off) next to transformers (sdpa and eager)
in the same process, with each engine's error against the float32 reference next to its time, and
the GPU's two ceilings.

    python benchmarks/latency_check.py [--json FILE] [--shapes 1x128,32x128,32x512]
"""

import argparse
import json
import tempfile

import torch
from transformers import BertConfig, BertModel

import ftbert


def time_ms(fn, warmup=20, iters=100):
    """Median milliseconds of fn() on the GPU, with CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def ceilings():
    """Measured tensor-core rate (fp16 GEMM, TFLOP/s) and memory bandwidth (copy, GB/s)."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    t = time_ms(lambda: a @ b, warmup=3, iters=10)
    x = torch.randn(1 << 28, device="cuda", dtype=torch.float16)  # 512 MiB
    y = torch.empty_like(x)
    tc = time_ms(lambda: y.copy_(x), warmup=3, iters=10)
    return 2 * n**3 / t / 1e9, 2 * x.numel() * 2 / tc / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--shapes", default="1x128,8x128,32x128,32x512")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    tflops, gbps = ceilings()
    print(f"device: {torch.cuda.get_device_name()}  ceilings: fp16 GEMM {tflops:.0f} TFLOP/s, copy {gbps:.0f} GB/s")

    torch.manual_seed(0)
    cfg = BertConfig()  # BERT-base: 12 layers, hidden 768, 12 heads, intermediate 3072
    rows = []
    with tempfile.TemporaryDirectory() as d:
        BertModel(cfg).save_pretrained(d)
        ref_model = BertModel.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).cuda().eval()
        peers = {
            "transformers-sdpa": BertModel.from_pretrained(d, attn_implementation="sdpa", dtype=torch.float16).cuda().eval(),
            "transformers-eager": BertModel.from_pretrained(d, attn_implementation="eager", dtype=torch.float16).cuda().eval(),
        }
        enc = ftbert.Encoder.from_pretrained(d, device="cuda", dtype="float16")
        for batch, seq in shapes:
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
            mask = torch.ones_like(ids)
            with torch.no_grad():
                ref = ref_model(ids, attention_mask=mask).last_hidden_state
                for name, m in peers.items():
                    out = m(ids, attention_mask=mask).last_hidden_state
                    ms = time_ms(lambda: m(ids, attention_mask=mask))
                    rows.append(dict(engine=name, batch=batch, seq=seq, ms=ms,
                                     err=(out.float() - ref).abs().max().item()))
            for attention, graphs in (("unfused", True), ("flash", False), ("flash", True)):
                enc.attention, enc.cuda_graphs = attention, graphs
                out = enc(ids, mask).last_hidden_state
                ms = time_ms(lambda: enc(ids, mask))
                rows.append(dict(engine=f"ftbert-{attention}" + ("" if graphs else "-no-graphs"),
                                 batch=batch, seq=seq, ms=ms, err=(out.float() - ref).abs().max().item()))
    # GEMM FLOPs of one forward, to say how far from the tensor-core ceiling each time is.
    for r in rows:
        tokens = r["batch"] * r["seq"]
        flops = 12 * (2 * tokens * 768 * (3 * 768 + 768 + 2 * 3072) + 4 * r["batch"] * r["seq"] ** 2 * 768)
        r["tflops"] = flops / r["ms"] / 1e9
        base = next(x for x in rows if x["engine"] == "transformers-sdpa" and x["batch"] == r["batch"] and x["seq"] == r["seq"])
        r["speedup_vs_sdpa"] = base["ms"] / r["ms"]
    print(f"\n{'engine':<20} {'batch':>5} {'seq':>5} {'median ms':>10} {'TFLOP/s':>8} {'vs sdpa':>8} {'max err':>9}")
    for r in rows:
        print(f"{r['engine']:<20} {r['batch']:>5} {r['seq']:>5} {r['ms']:>10.3f} {r['tflops']:>8.1f} "
              f"{r['speedup_vs_sdpa']:>7.2f}x {r['err']:>9.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "ceiling_tflops": tflops,
                       "ceiling_gbps": gbps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
