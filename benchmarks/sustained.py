"""Sustained forwards on a GPU: BERT-base float16 (random init, flash attention, CUDA graphs) run
back to back for some seconds per shape while nvidia-smi samples the SM clock, the power draw and
the clock's throttle reasons, to tell a power-capped forward from one bound by its kernels or their
launches. Per shape it prints the time per forward over the first group of 20 forwards and over
the run's second half, the energy per forward there (NVML's counter), the clock, power (and the board's limit) and throttle reasons there, and the
forward's TFLOP/s (weight GEMMs and attention products) against the tensor cores' dense float16
rate at that clock (Hopper: 4,096 FLOP per multiprocessor per cycle).

With --parts, each shape also runs two parts of its forward alone, back to back for as long and
under the same power limit: the 48 weight GEMMs as plain cuBLAS products (torch.mm in one CUDA
graph, on the model's weights and the activations a HuggingFace forward of the same inputs makes),
and ftbert's 12 attention calls on those QKV products. Their sum is what the forward would take if
it were nothing but its matrix products at cuBLAS's rate and ftbert's attention, with the clock the
power cap leaves them: a floor for the whole forward with these kernels.

--quantization fp8 runs ftbert's forward with e4m3 weight GEMMs (Encoder.quantization) instead;
--batch-invariant sets the Encoder's batch_invariant (default auto: on here, float16 with flash).

    python benchmarks/sustained.py [--shapes 128x128,32x512,1x128] [--seconds 8] [--parts]
                                   [--quantization fp8] [--batch-invariant auto|on|off] [--json FILE]
"""

import argparse
import ctypes
import datetime
import json
import math
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


# --batch-invariant's values: the Encoder's batch_invariant.
INVARIANCE = {"auto": "auto", "on": True, "off": False}


def forward_flops(batch: int, seq: int, layers=12, hidden=768, inter=3072) -> int:
    """The matrix products of one BERT forward: the layers' four weight GEMMs and attention's two."""
    tokens = batch * seq
    gemms = 2 * tokens * hidden * (3 * hidden + hidden + 2 * inter)
    return layers * (gemms + 4 * batch * seq * seq * hidden)


class EnergyMeter:
    """The board's energy counter (NVML's total energy since the driver loaded, in mJ), read
    through libnvidia-ml with ctypes; read() is None where NVML or the counter is missing."""

    def __init__(self, index: int):
        self.device = None
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self.nvml.nvmlInit_v2() != 0:
                return
            device = ctypes.c_void_p()
            if self.nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) != 0:
                return
            self.device = device
            if self.read() is None:
                self.device = None
        except OSError:
            pass

    def read(self) -> int | None:
        if self.device is None:
            return None
        mj = ctypes.c_ulonglong()
        if self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.device, ctypes.byref(mj)) != 0:
            return None
        return mj.value


def joules_per_call(groups, start: float, end: float, calls_per_group: int) -> float | None:
    """Energy per call over the groups ending in [start, end] from (unix time, counter mJ) read
    after each group: the counter's rise from the group before the first one to the last."""
    inside = [i for i, (t, _) in enumerate(groups) if start <= t <= end]
    if not inside or inside[0] == 0 or groups[inside[0] - 1][1] is None or \
            groups[inside[-1]][1] is None:
        return None
    rise_mj = groups[inside[-1]][1] - groups[inside[0] - 1][1]
    return rise_mj / 1000 / (calls_per_group * len(inside))


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


def back_to_back(torch, fn, seconds: float, meter: EnergyMeter | None = None,
                 group_ms: float = 30.0) -> dict:
    """fn() run back to back for `seconds` (after 5 warm-up calls) in groups of at least 20 calls
    and `group_ms`, one group always queued behind the one the host waits for, so that the GPU
    never idles while the host reads the timings and the energy counter: the window, the calls
    made, ms per call over the first group and the median over the run's second half, and (with a
    meter) J per call over that half."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        fn()
    b.record()
    b.synchronize()
    group = max(20, math.ceil(group_ms / max(a.elapsed_time(b) / 5, 1e-3)))
    times = []  # (unix time the host saw a group end, ms per call in it)
    energy = []  # (unix time, counter mJ) read then
    start = time.time()
    energy.append((start, meter.read() if meter else None))
    queued = None
    while True:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(group):
            fn()
        b.record()
        if queued is not None:
            queued[1].synchronize()
            now = time.time()
            times.append((now, queued[0].elapsed_time(queued[1]) / group))
            energy.append((now, meter.read() if meter else None))
        queued = (a, b)
        if time.time() - start >= seconds:
            break
    b.synchronize()
    end = time.time()
    times.append((end, a.elapsed_time(b) / group))
    energy.append((end, meter.read() if meter else None))
    half = start + (end - start) / 2
    second_half = [ms for t, ms in times if t >= half]
    return {"start": start, "end": end, "calls": group * len(times), "first_ms": times[0][1],
            "late_ms": statistics.median(second_half or [times[-1][1]]),
            "late_j": joules_per_call(energy, half, end, group)}


def graphed(torch, body):
    """body() recorded in a CUDA graph (after one eager run on the recording stream, which also
    does the one-time setup): returns the graph's replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        body()
    return graph.replay


def gemm_operands(torch, hf, ids, mask) -> list:
    """(input [rows, in], weight [in, out]) of each weight GEMM of the forward, four a layer
    (fused QKV, attention output, FFN in, FFN out), the inputs those of HF's own forward."""
    inputs = {}
    hooks = []
    for i, layer in enumerate(hf.encoder.layer):
        for role, module in (("qkv", layer.attention.self.query),
                             ("out", layer.attention.output.dense),
                             ("in", layer.intermediate.dense), ("ffn_out", layer.output.dense)):
            def keep(_module, args, _output, key=(i, role)):
                inputs[key] = args[0].reshape(-1, args[0].shape[-1]).clone()
            hooks.append(module.register_forward_hook(keep))
    try:
        hf(input_ids=ids.long(), attention_mask=mask.long())
    finally:
        for h in hooks:
            h.remove()
    operands = []
    for i, layer in enumerate(hf.encoder.layer):
        sa = layer.attention.self
        qkv = torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]).t().contiguous()
        operands += [(inputs[i, "qkv"], qkv),
                     (inputs[i, "out"], layer.attention.output.dense.weight.t().contiguous()),
                     (inputs[i, "in"], layer.intermediate.dense.weight.t().contiguous()),
                     (inputs[i, "ffn_out"], layer.output.dense.weight.t().contiguous())]
    return operands


def parts(torch, hf, batch: int, seq: int, ids, mask, seconds: float, meter) -> list[dict]:
    """The forward's GEMMs alone and its attention alone, each back to back for `seconds`."""
    from ftbert import _ops

    operands = gemm_operands(torch, hf, ids, mask)
    outs = [torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=x.dtype)
            for x, w in operands]

    def gemms():
        for (x, w), o in zip(operands, outs):
            torch.mm(x, w, out=o)

    rows = [{"part": "gemms", **back_to_back(torch, graphed(torch, gemms), seconds, meter)}]
    time.sleep(1.0)
    runner = _ops.OpRunner("cuda")
    cfg = hf.config
    heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    biases = [torch.cat([layer.attention.self.query.bias, layer.attention.self.key.bias,
                         layer.attention.self.value.bias]) for layer in hf.encoder.layer]
    qkvs = outs[0::4]  # the QKV products (bias not added: the kernel adds it)
    mask32 = mask.to(torch.int32).contiguous()
    out = torch.empty(batch, seq, cfg.hidden_size, device=mask.device, dtype=torch.float16)
    workspace = torch.empty(max(1, _ops.attention_workspace_bytes("flash", "float16", batch, seq,
                                                                  heads, head_dim)),
                            device=mask.device, dtype=torch.uint8)
    gemms()

    def attention():
        stream = torch.cuda.current_stream().cuda_stream
        for qkv, bias in zip(qkvs, biases):
            _ops.attention_ptr(runner, "flash", "float16", qkv.data_ptr(), bias.data_ptr(),
                               mask32.data_ptr(), out.data_ptr(), workspace.data_ptr(), batch, seq,
                               heads, head_dim, stream)

    rows.append({"part": "attention",
                 **back_to_back(torch, graphed(torch, attention), seconds, meter)})
    return rows


def run_shape(enc, torch, vocab: int, batch: int, seq: int, seconds: float, meter,
              hf=None) -> dict:
    ids = torch.randint(0, vocab, (batch, seq), device="cuda", dtype=torch.int32)
    mask = torch.ones_like(ids)
    # The shape's GEMMs go to the tuner, which measures them on the GPU beside the forwards and
    # holds the recording back until its picks are in: timed after that, not during it.
    enc(ids, mask)
    enc.wait_for_tuning()
    r = back_to_back(torch, lambda: enc(ids, mask), seconds, meter)
    row = {"batch": batch, "seq": seq, "start": r["start"], "end": r["end"],
           "forwards": r["calls"], "first_ms": r["first_ms"], "late_ms": r["late_ms"],
           "late_j": r["late_j"]}
    if hf is not None:
        time.sleep(1.0)
        row["parts"] = parts(torch, hf, batch, seq, ids, mask, seconds, meter)
    return row


def late_window(r: dict, samples) -> dict | None:
    return window_summary(samples, r["start"] + (r["end"] - r["start"]) / 2, r["end"])


def joules(j: float | None) -> str:
    return f"{j:7.3f}" if j is not None else f"{'-':>7}"


def clock_columns(w: dict | None) -> str:
    if not w:
        return f"{'-':>7} {'-':>5} {'-':>6}"
    return f"{w['sm_mhz']:7.0f} {w['watts']:5.0f} {w['power_limit_w']:6.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="128x128,32x512,1x128")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--parts", action="store_true",
                    help="also run each shape's GEMMs alone and its attention alone")
    ap.add_argument("--quantization", choices=["none", "fp8"], default="none")
    ap.add_argument("--batch-invariant", choices=sorted(INVARIANCE), default="auto")
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
        enc = ftbert.Encoder.from_pretrained(
            d, device="cuda", dtype="float16", attention="flash",
            quantization=None if args.quantization == "none" else args.quantization,
            batch_invariant=INVARIANCE[args.batch_invariant])
        hf = None
        if args.parts:
            hf = BertModel.from_pretrained(d, torch_dtype=torch.float16,
                                           attn_implementation="sdpa").cuda().eval()
        meter = EnergyMeter(index)
        sampler = Sampler(index)
        try:
            for batch, seq in shapes:
                rows.append(run_shape(enc, torch, cfg.vocab_size, batch, seq, args.seconds, meter,
                                      hf))
                time.sleep(1.0)  # a gap between shapes in the clock log
        finally:
            sampler.stop()
    print(f"{props.name}: {len(sampler.samples)} nvidia-smi samples; quantization {args.quantization}, "
          f"batch_invariant {enc.batch_invariant}")
    print(f"{'shape':>8} {'first ms':>9} {'late ms':>9} {'J':>7} {'SM MHz':>7} {'W':>5} "
          f"{'limit':>6} {'TFLOP/s':>8} {'peak@clk':>8}  throttle")
    for r in rows:
        w = late_window(r, sampler.samples)
        r.update(w or {})
        r["tflops"] = forward_flops(r["batch"], r["seq"]) / r["late_ms"] / 1e9
        r["peak_tflops_at_clock"] = (per_cycle * props.multi_processor_count * w["sm_mhz"] / 1e6
                                     if per_cycle and w else None)
        peak = f"{r['peak_tflops_at_clock']:8.0f}" if r["peak_tflops_at_clock"] else f"{'-':>8}"
        print(f"{r['batch']:>3}x{r['seq']:<4} {r['first_ms']:9.3f} {r['late_ms']:9.3f} "
              f"{joules(r['late_j'])} {clock_columns(w)} {r['tflops']:8.1f} {peak}  "
              f"{w['throttle'] if w else 'no samples'}")
    if args.parts:
        print("\nparts alone, per forward's worth (late: over the second half; J: energy per call "
              "there)")
        print(f"{'shape':>8} {'part':>10} {'first ms':>9} {'late ms':>9} {'J':>7} {'SM MHz':>7} "
              f"{'W':>5} {'limit':>6}  throttle")
        for r in rows:
            for p in r["parts"]:
                w = late_window(p, sampler.samples)
                p.update(w or {})
                print(f"{r['batch']:>3}x{r['seq']:<4} {p['part']:>10} {p['first_ms']:9.3f} "
                      f"{p['late_ms']:9.3f} {joules(p['late_j'])} {clock_columns(w)}  "
                      f"{w['throttle'] if w else 'no samples'}")
            r["parts_ms"] = sum(p["late_ms"] for p in r["parts"])
            energies = [p["late_j"] for p in r["parts"]]
            r["parts_j"] = sum(energies) if None not in energies else None
            limit = (w or {}).get("power_limit_w")
            # The parts' energy at the board's limit: the least time the forward can take at that
            # power while doing at least their work at their energy per call.
            r["parts_j_at_limit_ms"] = (r["parts_j"] / limit * 1e3
                                        if r["parts_j"] is not None and limit else None)
            at_limit = (f", their energy at {limit:.0f} W: {r['parts_j_at_limit_ms']:.3f} ms"
                        if r["parts_j_at_limit_ms"] is not None else "")
            print(f"{r['batch']:>3}x{r['seq']:<4} {'sum':>10} {'':>9} {r['parts_ms']:9.3f} "
                  f"{joules(r['parts_j'])}  (forward {r['late_ms']:.3f} ms{at_limit})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "quantization": args.quantization,
                       "batch_invariant": enc.batch_invariant, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
