"""Where a fresh process's first encode pass goes, on a GPU (by hand; results in
benchmarks/results/first-call-h100-warmup.txt).

    python benchmarks/first_pass_steps.py MODE MINILM_DIR      MODE: steps, default or nographs

"steps" times each one-time cost on its own first (a pinned copy, the first and second packed
forward, the first pooling, a new shape's first three forwards, a small encode), then every mode
runs encode over 8,192 sentences (ftbert.bench.varlen.make_sentences, seeds 0 and 1) as passes
A, A, B, A, with every forward timed between torch.cuda.synchronize calls. One JSON line.
Run with CUDA_MODULE_LOADING=EAGER to see what lazy kernel loading accounts for.
"""

import json
import sys
import time

import numpy as np


def sync_t(torch, f):
    torch.cuda.synchronize(); t = time.perf_counter(); r = f(); torch.cuda.synchronize()
    return r, round((time.perf_counter() - t) * 1e3, 2)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    t = time.perf_counter()
    import torch, ftbert
    from ftbert import text
    from ftbert.bench.varlen import make_sentences
    res = {"mode": mode, "import_ms": round((time.perf_counter() - t) * 1e3)}
    t = time.perf_counter()
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", cuda_graphs=(mode != "nographs"))
    res["load_ms"] = round((time.perf_counter() - t) * 1e3)
    A = make_sentences(enc.tokenizer, 8192, enc.max_seq_length - 2, 0)
    B = make_sentences(enc.tokenizer, 8192, enc.max_seq_length - 2, 1)
    if mode == "steps":
        _, res["pin_first_ms"] = sync_t(torch, lambda: torch.zeros(4096, dtype=torch.int32).pin_memory())
        _, res["pin_second_ms"] = sync_t(torch, lambda: torch.zeros(4096, dtype=torch.int32).pin_memory())
        ids = torch.randint(1000, 2000, (40,), dtype=torch.int32, device="cuda")
        cu = np.arange(0, 41, 5, dtype=np.int64)
        out, res["fwd1_ms"] = sync_t(torch, lambda: enc.forward_packed(ids, cu))
        _, res["fwd2_ms"] = sync_t(torch, lambda: enc.forward_packed(ids, cu))
        off = torch.from_numpy(cu).cuda()
        _, res["pool1_ms"] = sync_t(torch, lambda: text.pool_packed(out.last_hidden_state, None, off, "mean", True).cpu())
        _, res["pool2_ms"] = sync_t(torch, lambda: text.pool_packed(out.last_hidden_state, None, off, "mean", True).cpu())
        ids2 = torch.randint(1000, 2000, (3000,), dtype=torch.int32, device="cuda")
        cu2 = np.arange(0, 3001, 100, dtype=np.int64)
        _, res["fwd_newshape1_ms"] = sync_t(torch, lambda: enc.forward_packed(ids2, cu2))
        _, res["fwd_newshape2_ms"] = sync_t(torch, lambda: enc.forward_packed(ids2, cu2))
        _, res["fwd_newshape3_ms"] = sync_t(torch, lambda: enc.forward_packed(ids2, cu2))
        _, res["encode_small1_ms"] = sync_t(torch, lambda: enc.encode(["a short sentence"] * 8))
        _, res["encode_small2_ms"] = sync_t(torch, lambda: enc.encode(["a short sentence"] * 8))
    fwd_times = []
    orig = enc.forward_packed
    def timed(*a, **k):
        torch.cuda.synchronize(); t = time.perf_counter(); r = orig(*a, **k); torch.cuda.synchronize()
        fwd_times.append((time.perf_counter() - t) * 1e3); return r
    enc.forward_packed = timed
    for name, texts in (("A1", A), ("A2", A), ("B1", B), ("A3", A)):
        fwd_times.clear()
        _, ms = sync_t(torch, lambda: enc.encode(texts))
        top = sorted(fwd_times, reverse=True)[:4]
        res[name] = f"{ms:.0f} ms ({len(texts)/ms*1e3:.0f}/s) fwd {len(fwd_times)} sum {sum(fwd_times):.0f} ms top {[round(x,1) for x in top]}"
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
