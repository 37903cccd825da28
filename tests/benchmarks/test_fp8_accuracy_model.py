"""benchmarks/fp8_accuracy_model.py, the CPU model of quantization="fp8": its e4m3 rounding per row,
the Linear it puts in place of the encoder's, the nearest-neighbour overlap and its arguments."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "fp8_accuracy_model.py"
_spec = importlib.util.spec_from_file_location("fp8_accuracy_model", _PATH)
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)

# Every finite non-negative e4m3 value, from its bit patterns (0x7f is NaN).
E4M3 = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double()


def test_rows_are_scaled_so_that_each_largest_magnitude_is_448(rng):
    x = torch.from_numpy(rng.standard_normal((7, 45)) * rng.uniform(0.01, 100, (7, 1))).float()
    x[3] = 0.0  # an all-zero row stays zero
    q = model.e4m3_rows(x).double()
    top = x.abs().amax(1, keepdim=True).double()
    # 448 x (top / 448) in float32: top to a rounding or two
    assert torch.allclose(q.abs().amax(1, keepdim=True), top, rtol=3e-7, atol=0)
    scaled = (q / torch.where(top > 0, top / 448, 1.0)).abs()
    # every value on e4m3's grid once scaled, and the nearest grid point to the scaled input
    on_grid = (scaled.reshape(-1, 1) - E4M3.reshape(1, -1)).abs().amin(1)
    assert on_grid.max() < 1e-4
    want = (x.double().abs() / torch.where(top > 0, top / 448, 1.0)).reshape(-1, 1)
    nearest = E4M3[(want - E4M3.reshape(1, -1)).abs().argmin(1)]
    assert torch.allclose(scaled.reshape(-1), nearest, rtol=1e-5, atol=1e-6)
    assert torch.equal(q[3], torch.zeros(45, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_linear_without_e4m3_is_the_16_bit_product(rng, dtype):
    lin = torch.nn.Linear(37, 23)
    x = torch.from_numpy(rng.standard_normal((5, 37))).float()
    plain = model.ModelLinear(lin, dtype, weights=False, inputs=False)(x)
    want = x.to(dtype).float() @ lin.weight.detach().to(dtype).float().T + lin.bias.detach().to(dtype).float()
    assert torch.equal(plain, want.to(dtype).float())
    fp8 = model.ModelLinear(lin, dtype, weights=True, inputs=True)(x)
    exact = x @ lin.weight.detach().T + lin.bias.detach()
    # e4m3 moves the product, within its precision (3 mantissa bits, on both sides)
    assert 0 < (fp8 - exact).abs().max() <= 0.25 * exact.abs().max()


def test_modelled_replaces_only_the_encoder_layers_linears():
    import transformers

    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=48, vocab_size=99)
    m = model.modelled(transformers.BertModel(config), torch.float16, True, True)
    replaced = [n for n, mod in m.named_modules() if isinstance(mod, model.ModelLinear)]
    assert len(replaced) == 2 * 6 and all(".layer." in n for n in replaced)
    assert isinstance(m.pooler.dense, torch.nn.Linear)


def test_knn_overlap(rng):
    x = rng.standard_normal((40, 8)).astype(np.float32)
    assert model.knn_overlap(x, x, 10) == 1.0
    y = rng.standard_normal((40, 8)).astype(np.float32)
    assert model.knn_overlap(x, y, 10) < 0.6


def test_too_few_sentences_is_refused():
    with pytest.raises(SystemExit):
        model.main(["--sentences", "10"])
