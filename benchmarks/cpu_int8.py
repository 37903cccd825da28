"""quantization="int8" on the CPU against float32: the accuracy gate and encode's speed.

  python benchmarks/cpu_int8.py [--model DIR] [--sentences N] [--json FILE]

The real all-MiniLM-L6-v2 (default: the bundled copy) embeds N varied sentences (default 4,096,
`ftbert.bench.varlen.make_sentences`) in float32 and with int8 weights, one process: the cosine of
each sentence's two embeddings (mean and min), how many of each sentence's 10 nearest neighbours in
the corpus the two agree on, and each encode's time (the better of two passes). The CPU's flags
that matter (AVX-512, VNNI, AMX, BF16) and the int8 kernel that ran (FTBERT_CPU_AMX=0 leaves AMX
out) are printed with them. Kernel speed against peers is
`ftbert bench --engines ftbert ftbert-int8 onnxruntime onnxruntime-int8`.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import ftbert
from ftbert import _C
from ftbert.bench import cpu_summary
from ftbert.bench.varlen import load_tokenizer, make_sentences

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def cpu_flags() -> str:
    return cpu_summary(FLAGS)


def timed_encode(enc, texts) -> tuple[np.ndarray, float]:
    best, out = float("inf"), None
    for _ in range(2):
        t0 = time.perf_counter()
        out = enc.encode(texts)
        best = min(best, time.perf_counter() - t0)
    return out, best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--sentences", type=int, default=4096)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    path = args.model or str(ftbert.default_model_path())
    texts = make_sentences(load_tokenizer(Path(path)), args.sentences, 126, 0)
    f32, t32 = timed_encode(ftbert.Encoder.from_pretrained(path), texts)
    q8, t8 = timed_encode(ftbert.Encoder.from_pretrained(path, quantization="int8"), texts)
    cos = (f32 * q8).sum(1) / np.linalg.norm(f32, axis=1) / np.linalg.norm(q8, axis=1)
    sims = [e @ e.T for e in (f32, q8)]
    for s in sims:
        np.fill_diagonal(s, -np.inf)
    near = [np.argsort(-s, axis=1)[:, :10] for s in sims]
    overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(*near)]))
    res = {"cpu": cpu_flags(), "int8_kernel": _C.cpu_int8_kernel(),
           "sentences": len(texts), "cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
           "knn10_overlap": overlap, "encode_float32_s": t32, "encode_int8_s": t8}
    print(f"CPU: {res['cpu']} (int8 kernel: {res['int8_kernel']})")
    print(f"all-MiniLM-L6-v2, {len(texts)} sentences: cosine int8 vs float32 mean {res['cos_mean']:.5f}, "
          f"min {res['cos_min']:.5f}; 10 nearest neighbours shared {overlap:.1%}")
    print(f"encode: float32 {t32:.2f} s, int8 {t8:.2f} s ({t32 / t8:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
