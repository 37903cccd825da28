"""What batch_invariant=True costs per family, on a GPU.

  python benchmarks/batch_invariance_families.py [MODEL ...]

Each of ftbert.bench.models' random models (its checkpoint's sizes) in float16, full batches of
1 x 128, 32 x 128 and 32 x 512 as CUDA tensors, CUDA graphs on: the median of 7 timed blocks of
10 forwards (CUDA events), off and on alternating block by block after a warm-up, and their
ratio; and whether batch_invariant="auto" turns it on for the model."""
import statistics, sys, tempfile
from pathlib import Path
import torch, ftbert
from ftbert.bench.models import make_random_model

names = sys.argv[1:] or ["bert-base", "mpnet-base", "modernbert-base", "nomic-bert-base", "jina-v3", "eurobert-210m"]
for name in names:
    try:
        path = make_random_model(name, Path(tempfile.mkdtemp()))
    except Exception as e:  # noqa: BLE001
        print(f"{name}: cannot build: {type(e).__name__}: {e}"[:200], flush=True)
        continue
    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", batch_invariant=False)
    auto = ftbert.Encoder.from_pretrained(path, device="cuda", dtype="float16", batch_invariant="auto").batch_invariant
    cells = []
    for b, s in ((1, 128), (32, 128), (32, 512)):
        ids = torch.randint(1000, 20000, (b, s), device="cuda")
        mask = torch.ones_like(ids)
        for on in (False, True):
            enc.batch_invariant = on
            for _ in range(8):
                enc(ids, mask)
        enc._native.wait_for_tuning()
        t = {False: [], True: []}
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        for _ in range(7):
            for on in (False, True):
                enc.batch_invariant = on
                for _ in range(3):
                    enc(ids, mask)
                ev[0].record()
                for _ in range(10):
                    enc(ids, mask)
                ev[1].record(); ev[1].synchronize()
                t[on].append(ev[0].elapsed_time(ev[1]) / 10)
        off, on = statistics.median(t[False]), statistics.median(t[True])
        cells.append(f"{b}x{s} {off:.3f}/{on:.3f} ({on / off:.3f})")
    print(f"{name:16} auto={auto!s:5} " + "  ".join(cells), flush=True)
