"""DeBERTa-v3-base with its disentangled terms computed inside the flash kernel against the term
tables, and against BERT-base, on a GPU machine:

    python benchmarks/deberta_terms.py [--shapes 1x128,1x512,32x128,32x512] [--dtype float16]

Random weights of the real sizes (ftbert.bench.models), full-length sequences, CUDA graphs, flash
attention. First the error of each DeBERTa variant against transformers in float32 on the GPU
(8 x 512, last_hidden_state, max |diff|), then per shape the three encoders interleaved (inline,
tables, BERT-base, three rounds): 20 warm-up forwards, then 5 bursts of 20 timed with CUDA events;
the median ms per forward of all rounds. Last, one 32 x 512 forward of each DeBERTa variant under
torch.profiler (graphs off): the attention kernel's time per forward, all kernels' time, and
the rate of the attention kernel's QKᵀ and PV products alone (4·B·S²·H FLOPs a layer).
The inline encoder is the default at head dim 64; FTBERT_DEBERTA_TERM_TABLES=1 at load gives the
tables.
"""

import argparse
import os
import pathlib
import statistics
import tempfile

import torch

from ftbert.bench.models import load_model, make_ftbert, make_random_model
from ftbert.bench.sweep import make_inputs, on_device_stream


def encoder(model, dtype, tables, graphs=True):
    os.environ["FTBERT_DEBERTA_TERM_TABLES"] = "1" if tables else "0"
    return make_ftbert(model, "cuda:0", dtype, "flash", False, graphs)


def device_inputs(model, b, s):
    x = make_inputs(model.config, b, s, None, 0)
    return tuple(x[k].to("cuda:0", torch.int32) for k in ("input_ids", "attention_mask", "token_type_ids"))


def time_bursts(enc, inputs):
    for _ in range(20):
        enc(*inputs)
    torch.cuda.synchronize()
    ms = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            enc(*inputs)
        stop.record()
        torch.cuda.synchronize()
        ms.append(start.elapsed_time(stop) / 20)
    return ms


def errors(model, path, dtype):
    import transformers

    hf = transformers.DebertaV2Model.from_pretrained(path).to("cuda:0").eval()
    ids, mask, types = device_inputs(model, 8, 512)
    with torch.no_grad():
        ref = hf(input_ids=ids.long(), attention_mask=mask.long()).last_hidden_state
        peer = hf.to(getattr(torch, dtype))(input_ids=ids.long(), attention_mask=mask.long())
    own = (peer.last_hidden_state.float() - ref).abs().max().item()
    out = {"transformers " + dtype: own}
    for name, tables in (("inline", False), ("tables", True)):
        got = encoder(model, dtype, tables)(ids, mask, types).last_hidden_state.float()
        out[name] = (got - ref).abs().max().item()
    return out


def profile(model, dtype, tables, layers, hidden):
    enc = encoder(model, dtype, tables, graphs=False)
    inputs = device_inputs(model, 32, 512)
    for _ in range(3):
        enc(*inputs)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            enc(*inputs)
        torch.cuda.synchronize()
    attention = total = 0.0
    for e in prof.key_averages():
        total += e.device_time_total
        if "flash_attention_kernel" in e.key:
            attention += e.device_time_total
    attention_ms = attention / 5 / 1e3
    flops = 4 * 32 * 512 * 512 * hidden * layers  # QKᵀ and PV of every layer
    return attention_ms, total / 5 / 1e3, flops / (attention_ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x128,1x512,32x128,32x512")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp())
    deberta_path = make_random_model("deberta-v3-base", tmp / "deberta")
    deberta = load_model("deberta-v3-base", deberta_path)
    bert = load_model("bert-base", make_random_model("bert-base", tmp / "bert"))
    print(f"{torch.cuda.get_device_name(0)}, {args.dtype}", flush=True)
    with on_device_stream("cuda:0"), torch.inference_mode():
        for name, err in errors(deberta, deberta_path, args.dtype).items():
            print(f"error vs transformers float32, 8 x 512: {name} {err:.4f}", flush=True)
        print(f"{'shape':>8} {'inline':>8} {'tables':>8} {'bert':>8} {'tables/inline':>13} "
              f"{'inline/bert':>11}", flush=True)
        for spec in args.shapes.split(","):
            b, s = (int(x) for x in spec.split("x"))
            runs = {"inline": (deberta, False), "tables": (deberta, True), "bert": (bert, False)}
            encs = {k: encoder(m, args.dtype, t) for k, (m, t) in runs.items()}
            inputs = {k: device_inputs(m, b, s) for k, (m, _) in runs.items()}
            ms = {k: [] for k in runs}
            for _ in range(3):
                for k in runs:
                    ms[k] += time_bursts(encs[k], inputs[k])
            med = {k: statistics.median(v) for k, v in ms.items()}
            print(f"{spec:>8} {med['inline']:8.3f} {med['tables']:8.3f} {med['bert']:8.3f} "
                  f"{med['tables'] / med['inline']:13.2f} {med['inline'] / med['bert']:11.2f}",
                  flush=True)
            del encs
        c = deberta.config
        for name, tables in (("inline", False), ("tables", True)):
            att, total, rate = profile(deberta, args.dtype, tables, c["num_hidden_layers"],
                                       c["hidden_size"])
            print(f"32 x 512 {name}: attention kernel {att:.3f} ms a forward ({rate:.0f} TFLOP/s on "
                  f"QKᵀ and PV alone) of {total:.3f} ms of kernels", flush=True)


if __name__ == "__main__":
    main()
