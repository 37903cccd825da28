"""Sustained forwards on a GPU: BERT-base float16 (random init, flash attention, CUDA graphs) run
back to back for some seconds per shape while nvidia-smi samples the SM clock, the power draw and
the clock's throttle reasons, to tell a power-capped forward from one bound by its kernels or their
launches. Per shape it prints the time per forward over the first 20 forwards and over the run's
second half, the clock, power (and the board's limit) and throttle reasons there, and the
forward's TFLOP/s (weight GEMMs and attention products) against the tensor cores' dense float16
rate at that clock (Hopper: 4,096 FLOP per multiprocessor per cycle).

    python benchmarks/sustained.py [--shapes 128x128,32x512,1x128] [--seconds 8] [--json FILE]
"""

import argparse
import datetime
import json
import statistics
import subprocess
import tempfile
import threading
import time

SMI_FIELDS = "timestamp,clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active"
# nvidia-smi's clocks_throttle_reasons bits (NVML's nvmlClocksEventReasons).
THROTTLE_REASONS = {
    0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown",
    0x10: "sync boost", 0x20: "software thermal", 0x40: "hardware thermal",
    0x80: "power brake", 0x100: "display clocks",
}
# Dense float16 tensor-core FLOP per multiprocessor per cycle, by compute capability.
TENSOR_FLOP_PER_SM_CYCLE = {(9, 0): 4096}


def parse_smi_line(line: str):
    """(unix time, SM MHz, W, power limit W, reasons bitmask) of one nvidia-smi CSV line
    (noheader, nounits), or None for a line that is not a sample. The timestamp is local time."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return t, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)
    except ValueError:
        return None


def decode_reasons(mask: int) -> str:
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    return ", ".join(names) if names else "none"


def window_summary(samples, start: float, end: float) -> dict | None:
    """Medians of the samples taken in [start, end]; None when there are none."""
    inside = [s for s in samples if start <= s[0] <= end]
    if not inside:
        return None
    reasons = statistics.mode(s[4] for s in inside)
    return {"samples": len(inside), "sm_mhz": statistics.median(s[1] for s in inside),
            "watts": statistics.median(s[2] for s in inside),
            "power_limit_w": statistics.median(s[3] for s in inside),
            "throttle": decode_reasons(reasons)}


def forward_flops(batch: int, seq: int, layers=12, hidden=768, inter=3072) -> int:
    """The matrix products of one BERT forward: the layers' four weight GEMMs and attention's two."""
    tokens = batch * seq
    gemms = 2 * tokens * hidden * (3 * hidden + hidden + 2 * inter)
    return layers * (gemms + 4 * batch * seq * seq * hidden)


class Sampler:
    """nvidia-smi sampling the GPU every `period_ms` in the background, lines kept as they come."""

    def __init__(self, index: int, period_ms: int = 200):
        self.proc = subprocess.Popen(
            ["nvidia-smi", "-i", str(index), f"--query-gpu={SMI_FIELDS}",
             "--format=csv,noheader,nounits", "-lms", str(period_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.samples = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            sample = parse_smi_line(line)
            if sample is not None:
                self.samples.append(sample)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.reader.join(timeout=10)


def run_shape(enc, torch, vocab: int, batch: int, seq: int, seconds: float) -> dict:
    ids = torch.randint(0, vocab, (batch, seq), device="cuda", dtype=torch.int32)
    mask = torch.ones_like(ids)
    for _ in range(5):
        enc(ids, mask)
    torch.cuda.synchronize()
    times = []  # (unix time at the end of a group, ms per forward in it)
    start = time.time()
    while time.time() - start < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            enc(ids, mask)
        b.record()
        b.synchronize()
        times.append((time.time(), a.elapsed_time(b) / 20))
    end = time.time()
    second_half = [ms for t, ms in times if t >= start + (end - start) / 2]
    return {"batch": batch, "seq": seq, "start": start, "end": end,
            "forwards": 20 * len(times), "first_ms": times[0][1],
            "late_ms": statistics.median(second_half or [times[-1][1]])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x128,32x512,1x128")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    from transformers import BertConfig, BertModel

    import ftbert

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    per_cycle = TENSOR_FLOP_PER_SM_CYCLE.get((props.major, props.minor))
    cfg = BertConfig()
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as d, torch.inference_mode():
        BertModel(cfg).save_pretrained(d)
        enc = ftbert.Encoder.from_pretrained(d, device="cuda", dtype="float16", attention="flash")
        sampler = Sampler(index)
        try:
            for batch, seq in shapes:
                rows.append(run_shape(enc, torch, cfg.vocab_size, batch, seq, args.seconds))
                time.sleep(1.0)  # a gap between shapes in the clock log
        finally:
            sampler.stop()
    print(f"{props.name}: {len(sampler.samples)} nvidia-smi samples")
    print(f"{'shape':>8} {'first ms':>9} {'late ms':>9} {'SM MHz':>7} {'W':>5} {'limit':>6} "
          f"{'TFLOP/s':>8} {'peak@clk':>8}  throttle")
    for r in rows:
        w = window_summary(sampler.samples, r["start"] + (r["end"] - r["start"]) / 2, r["end"])
        r.update(w or {})
        r["tflops"] = forward_flops(r["batch"], r["seq"]) / r["late_ms"] / 1e9
        r["peak_tflops_at_clock"] = (per_cycle * props.multi_processor_count * w["sm_mhz"] / 1e6
                                     if per_cycle and w else None)
        peak = f"{r['peak_tflops_at_clock']:8.0f}" if r["peak_tflops_at_clock"] else f"{'-':>8}"
        clock = (f"{w['sm_mhz']:7.0f} {w['watts']:5.0f} {w['power_limit_w']:6.0f}" if w
                 else f"{'-':>7} {'-':>5} {'-':>6}")
        print(f"{r['batch']:>3}x{r['seq']:<4} {r['first_ms']:9.3f} {r['late_ms']:9.3f} {clock} "
              f"{r['tflops']:8.1f} {peak}  {w['throttle'] if w else 'no samples'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
