"""How far a family's float16 forward can go on this GPU: ftbert's forward, transformers' sdpa
forward and the forward's matrix products alone, each run back to back, per model of the bench's
random models (real sizes, fixed seed) at one shape.

The matrix products alone are each layer's weight GEMMs at the shapes of the engine's own weight
tensors (QKV, attention output, FFN in, FFN out) as torch.mm (cuBLAS) on random float16 operands,
and attention as torch's flash sdpa over [B, heads, S, d], all layers in one CUDA graph. A forward
that did nothing else at these kernels' rate would take that long, so sdpa ÷ that time is the most
any float16 engine built on them can be faster than transformers' sdpa forward: where it is under
a target ratio, the target is out of reach without less work per FLOP (FP8).

Per row: the first group's ms per call (a burst, as `ftbert bench` times) and the median over the
run's second half (sustained, at the power cap), with the energy per call there (NVML).

    python benchmarks/family_floor.py [--models nomic-bert-base,jina-v3] [--shape 32x512]
                                      [--seconds 4] [--json FILE]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from sustained import EnergyMeter, Sampler, back_to_back, graphed, late_window

ROLES = ("qkv_weight", "attn_out_weight", "ffn_in_weight", "ffn_out_weight")


def gemm_dims(config: dict, tensors: dict) -> list[tuple[int, int]]:
    """(in, out) of each layer's four weight GEMMs, from the engine's layer-0 weight tensors."""
    H, I = config["hidden_size"], config["intermediate_size"]
    ins = {"qkv_weight": H, "attn_out_weight": H, "ffn_in_weight": H, "ffn_out_weight": I}
    dims = []
    for role in ROLES:
        numel = tensors[f"layers.0.{role}"].numel()
        if numel % ins[role]:
            raise SystemExit(f"layers.0.{role} has {numel} elements, not a multiple of its input "
                             f"width {ins[role]}")
        dims.append((ins[role], numel // ins[role]))
    return dims


def matmul_floor(torch, config: dict, tensors: dict, batch: int, seq: int):
    """The forward's weight GEMMs and attention products alone, as one CUDA graph's replay."""
    F = torch.nn.functional
    rows, layers = batch * seq, config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    d = config["hidden_size"] // heads
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=gen) * 0.05

    dims = gemm_dims(config, tensors)
    ops = []
    for _ in range(layers):
        for k, n in dims:
            x, w = rand(rows, k), rand(k, n)
            ops.append((x, w, torch.empty(rows, n, device="cuda", dtype=torch.float16)))
    q, k, v = (rand(batch, heads, seq, d) for _ in range(3))

    def body():
        for i, (x, w, o) in enumerate(ops):
            torch.mm(x, w, out=o)
            if i % 4 == 0:  # after each layer's QKV
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v)

    flops = layers * (2 * rows * sum(k * n for k, n in dims) + 4 * batch * seq * seq * config["hidden_size"])
    return graphed(torch, body), flops


def run_model(name: str, batch: int, seq: int, seconds: float, meter, torch) -> dict:
    import transformers

    import ftbert
    from ftbert.bench.models import RANDOM_MODELS, load_model, make_random_model

    model_class = RANDOM_MODELS[name][0]
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        path = make_random_model(name, Path(tmp) / name)
        engine = load_model(name, path)
        config = engine.config
        ids = torch.randint(5, min(config["vocab_size"], 30000), (batch, seq), device="cuda",
                            dtype=torch.int32)
        mask = torch.ones_like(ids)
        row = {"model": name, "batch": batch, "seq": seq, "layers": config["num_hidden_layers"],
               "hidden": config["hidden_size"], "gemm_dims": gemm_dims(config, engine.tensors)}

        enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16")
        enc(ids, mask)
        enc.wait_for_tuning()
        row["ftbert"] = back_to_back(torch, lambda: enc(ids, mask), seconds, meter)
        del enc
        torch.cuda.empty_cache()
        time.sleep(1.0)

        floor, flops = matmul_floor(torch, config, engine.tensors, batch, seq)
        row["flops"] = flops
        row["floor"] = back_to_back(torch, floor, seconds, meter)
        del floor
        torch.cuda.empty_cache()
        time.sleep(1.0)

        hf = getattr(transformers, model_class).from_pretrained(
            path, dtype=torch.float16, attn_implementation="sdpa").cuda().eval()
        ids64, mask64 = ids.long(), mask.long()
        row["sdpa"] = back_to_back(torch, lambda: hf(input_ids=ids64, attention_mask=mask64),
                                   seconds, meter)
        del hf
        torch.cuda.empty_cache()
        time.sleep(1.0)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="nomic-bert-base,jina-v3")
    ap.add_argument("--shape", default="32x512")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch

    from ftbert.bench.models import RANDOM_MODELS

    names = args.models.split(",")
    unknown = [n for n in names if n not in RANDOM_MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; the bench's models are {', '.join(RANDOM_MODELS)}")
    try:
        batch, seq = (int(v) for v in args.shape.split("x"))
    except ValueError:
        raise SystemExit(f"--shape: expected BATCHxSEQ such as 32x512, got {args.shape!r}") from None
    if not torch.cuda.is_available():
        raise SystemExit("family_floor.py times a CUDA GPU; torch sees none here")
    index = torch.cuda.current_device()
    meter, sampler = EnergyMeter(index), Sampler(index)
    rows = []
    try:
        for name in names:
            rows.append(run_model(name, batch, seq, args.seconds, meter, torch))
            print(f"{name} done", flush=True)
    finally:
        sampler.stop()
    print(f"\n{torch.cuda.get_device_name(index)}, float16, {batch} x {seq}; ms per forward: "
          "burst (first group) / sustained (second half's median); J per forward sustained")
    print(f"{'model':>16} {'part':>7} {'burst':>8} {'sust.':>8} {'J':>6} {'W':>5} {'TFLOP/s':>8}"
          f" {'sdpa÷':>6}")
    for r in rows:
        for part in ("floor", "ftbert", "sdpa"):
            p = r[part]
            w = late_window(p, sampler.samples) or {}
            p.update(w)
            ratio = r["sdpa"]["late_ms"] / p["late_ms"]
            j = f"{p['late_j']:6.2f}" if p.get("late_j") is not None else f"{'-':>6}"
            watts = f"{w['watts']:5.0f}" if w else f"{'-':>5}"
            print(f"{r['model']:>16} {part:>7} {p['first_ms']:8.3f} {p['late_ms']:8.3f} {j} {watts} "
                  f"{r['flops'] / p['late_ms'] / 1e9:8.1f} {ratio:6.2f}")
    print("sdpa÷ of the floor row: the most a float16 engine on these kernels can be faster than "
          "sdpa; TFLOP/s counts the floor's products in every row")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
