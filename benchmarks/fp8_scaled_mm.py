"""BERT-base's four weight GEMMs (n, k) at 128, 4,096 and 16,384 rows through torch alone: float16
torch.mm against e4m3 torch._scaled_mm with row-wise scales (fast accumulation off and on) and with
tensor-wise scales, bfloat16 out; the row quantization in torch ops; the max abs error against
float32. ms per call, CUDA-event medians of 40. What cuBLASLt's and CUTLASS's FP8 kernels do on this
GPU apart from ftbert (needs compute capability 8.9+).

    python benchmarks/fp8_scaled_mm.py
"""

import statistics

import torch


def timeit(fn, reps=40) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def quantize_rows(x):
    """[r, k] -> e4m3 rows and their [r, 1] scales (largest magnitude / 448)."""
    s = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (x.float() / s).to(torch.float8_e4m3fn), s


def main() -> None:
    torch.manual_seed(0)
    print(torch.__version__, torch.cuda.get_device_name())
    print(f"{'m':>6} {'n':>5} {'k':>5} {'fp16':>8} {'row':>8} {'row+fast':>8} {'tensor':>8} {'tens+fast':>9} "
          f"{'quant':>7} | err fp16 row row+fast")
    for m in (128, 4096, 16384):
        for n, k in ((2304, 768), (768, 768), (3072, 768), (768, 3072)):
            x = torch.randn(m, k, device="cuda")
            w = torch.randn(n, k, device="cuda") / k ** 0.5
            ref = x @ w.t()
            xh, wh = x.half(), w.half()
            wq, ws = quantize_rows(w)
            xq, xs = quantize_rows(xh)
            one = torch.ones((), device="cuda")

            def row(fast):
                return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)

            def tensor(fast):
                return torch._scaled_mm(xq, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)

            times = [timeit(lambda: xh @ wh.t()), timeit(lambda: row(False)), timeit(lambda: row(True)),
                     timeit(lambda: tensor(False)), timeit(lambda: tensor(True)), timeit(lambda: quantize_rows(xh))]
            errors = [((xh @ wh.t()).float() - ref).abs().max().item(), (row(False).float() - ref).abs().max().item(),
                      (row(True).float() - ref).abs().max().item()]
            print(f"{m:6d} {n:5d} {k:5d} " + " ".join(f"{t:8.4f}" for t in times) + " | "
                  + " ".join(f"{e:.2e}" for e in errors), flush=True)


if __name__ == "__main__":
    main()
