"""What quantization="fp8" can reach in accuracy, computed on the CPU from a model of its numbers.

  python benchmarks/fp8_accuracy_model.py [--model DIR] [--sentences N] [--skip-bert-base] [--json FILE]

The engine's FP8 GEMM (cpp/cuda/gemm/fp8_gemm.cu) rounds each layer weight to e4m3 with a scale per
output channel (max |w| / 448) and each GEMM's input rows to e4m3 with a scale per token, sums in
float32 and rounds the output to the 16-bit dtype. This script runs transformers' model with every
encoder Linear replaced by exactly that arithmetic (torch's float8_e4m3fn rounding, which the
engine's host rounding matches bit for bit) and everything else in float32, so it shows the error
that e4m3 itself brings, without a GPU:

- the real all-MiniLM-L6-v2 (default: the bundled copy) over N varied sentences (default 4,096,
  `ftbert.bench.varlen.make_sentences`), mean-pooled: cosine against float32 (mean, min) and the
  share of each sentence's 10 nearest neighbours in the corpus that float32 also finds. Rows: the
  16-bit rounding alone, then e4m3 on weights and inputs, on weights only, on inputs only; float16
  and bfloat16. The issue's gate is mean >= 0.9995, min >= 0.998, overlap >= 95%.
- BERT-base's sizes with random weights, 4 x 128 random ids: the max abs error against float64
  of the same 16-bit rounding alone and with e4m3 (the gate: e4m3's at most 4x the former).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

E4M3_MAX = 448.0


def e4m3_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row of x rounded to e4m3 with the scale max |row| / 448, returned dequantized."""
    top = x.abs().amax(-1, keepdim=True)
    scale = torch.where(top > 0, top / E4M3_MAX, torch.ones_like(top))
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


class ModelLinear(torch.nn.Module):
    """A Linear as the engine computes it: operands in `dtype` (then e4m3 where asked), float32
    sums, the output rounded to `dtype`."""

    def __init__(self, lin: torch.nn.Linear, dtype: torch.dtype, weights: bool, inputs: bool):
        super().__init__()
        w = lin.weight.detach().to(dtype).float()  # [out, in]: rows are output channels
        self.w = e4m3_rows(w) if weights else w
        self.b = None if lin.bias is None else lin.bias.detach().to(dtype).float()
        self.dtype, self.inputs = dtype, inputs

    def forward(self, x):
        x = x.to(self.dtype).float()
        if self.inputs:
            x = e4m3_rows(x)
        y = x @ self.w.T
        if self.b is not None:
            y = y + self.b
        return y.to(self.dtype).float()


def modelled(model, dtype, weights: bool, inputs: bool):
    """model with each Linear of its encoder layers replaced (the engine's FP8 GEMMs; the pooler
    and heads stay 16-bit there and float32 here)."""
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and ".layer." in f"{name}.{child_name}":
                setattr(parent, child_name, ModelLinear(child, dtype, weights, inputs))
    return model


def mean_pooled(model, tokenizer, texts, batch=128) -> np.ndarray:
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = np.zeros((len(texts), model.config.hidden_size), np.float32)
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            idx = order[i:i + batch]
            enc = tokenizer([texts[j] for j in idx], padding=True, truncation=True, max_length=128,
                            return_tensors="pt")
            h = model(**enc).last_hidden_state.float()
            m = enc["attention_mask"].unsqueeze(-1).float()
            out[idx] = ((h * m).sum(1) / m.sum(1)).numpy()
    return out


def knn_overlap(x: np.ndarray, y: np.ndarray, k: int = 10) -> float:
    def knn(e):
        e = torch.from_numpy(e / np.linalg.norm(e, axis=1, keepdims=True))
        sim = e @ e.T
        sim.fill_diagonal_(-2.0)
        return sim.topk(k, dim=1).indices.numpy()

    a, b = knn(x), knn(y)
    return float(np.mean([len(set(a[i]) & set(b[i])) / k for i in range(len(a))]))


ROWS = [("16-bit only", False, False), ("fp8", True, True), ("fp8 weights only", True, False),
        ("fp8 inputs only", False, True)]


def minilm_rows(path: Path, sentences: int) -> list[dict]:
    from ftbert.bench.varlen import load_tokenizer, make_sentences

    texts = make_sentences(load_tokenizer(path), sentences, 126, 1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    load = lambda: transformers.AutoModel.from_pretrained(path).float().eval()
    ref = mean_pooled(load(), tokenizer, texts)
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for label, weights, inputs in ROWS:
            e = mean_pooled(modelled(load(), dtype, weights, inputs), tokenizer, texts)
            cos = (ref * e).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(e, axis=1)
            row = {"dtype": str(dtype).removeprefix("torch."), "row": label, "cos_mean": float(cos.mean()),
                   "cos_min": float(cos.min()), "knn10": knn_overlap(ref, e)}
            print(f"{row['dtype']:>9} {label:>17}  cosine mean {row['cos_mean']:.6f} min {row['cos_min']:.6f}  "
                  f"10-NN {100 * row['knn10']:.1f}%", flush=True)
            rows.append(row)
    return rows


def bert_base_row() -> dict:
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False).eval()
    ids = torch.randint(1000, 30000, (4, 128))
    with torch.no_grad():
        ref = model.double()(ids).last_hidden_state
        errors = {}
        for label, fp8 in (("float16", False), ("fp8", True)):
            m = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False).eval()
            m.load_state_dict(model.float().state_dict())
            out = modelled(m, torch.float16, fp8, fp8)(ids).last_hidden_state.double()
            errors[label] = (out - ref).abs().max().item()
    row = {"float16": errors["float16"], "fp8": errors["fp8"], "ratio": errors["fp8"] / errors["float16"]}
    print(f"BERT-base, random weights, 4 x 128: max abs error float16 {row['float16']:.3g}, fp8 {row['fp8']:.3g} "
          f"({row['ratio']:.1f}x; the gate is 4x)", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="all-MiniLM-L6-v2's directory (default: the bundled copy)")
    ap.add_argument("--sentences", type=int, default=4096)
    ap.add_argument("--skip-bert-base", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.sentences < 11:
        ap.error("--sentences must be at least 11 (10 neighbours each)")
    if args.model:
        path = Path(args.model)
    else:
        import ftbert

        path = Path(ftbert.default_model_path())
    result = {"model": str(path), "sentences": args.sentences, "minilm": minilm_rows(path, args.sentences)}
    if not args.skip_bert_base:
        result["bert_base"] = bert_base_row()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
