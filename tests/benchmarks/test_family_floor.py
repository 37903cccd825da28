"""benchmarks/family_floor.py: the floor's GEMM shapes come from the engine's own weight tensors
(a gated FFN-in is twice as wide), and a weight that does not fit its input width is named."""

import importlib.util
from pathlib import Path

import pytest
import torch

_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def family_floor():
    import sys

    sys.path.insert(0, str(_DIR))  # it imports sustained.py beside it
    try:
        spec = importlib.util.spec_from_file_location("family_floor", _DIR / "family_floor.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(_DIR))
    return module


@pytest.mark.parametrize("model_class, config_class, gated", [
    ("BertModel", "BertConfig", False),
    ("NomicBertModel", "NomicBertConfig", True),
])
def test_gemm_shapes_follow_the_engine_weights(family_floor, tmp_path, model_class, config_class, gated):
    import transformers

    from ftbert.bench.models import load_model
    from tests._models import _require_class

    _require_class(model_class)
    H, I = 48, 80  # odd sizes: nothing lines up by accident
    config = getattr(transformers, config_class)(hidden_size=H, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=I, vocab_size=97)
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).save_pretrained(tmp_path)
    model = load_model("tiny", tmp_path)
    dims = family_floor.gemm_dims(model.config, model.tensors)
    assert dims == [(H, 3 * H), (H, H), (H, 2 * I if gated else I), (I, H)]


def test_a_weight_that_does_not_fit_its_input_is_named(family_floor):
    config = {"hidden_size": 8, "intermediate_size": 12}
    tensors = {"layers.0.qkv_weight": torch.zeros(8, 24), "layers.0.attn_out_weight": torch.zeros(8, 8),
               "layers.0.ffn_in_weight": torch.zeros(8, 12), "layers.0.ffn_out_weight": torch.zeros(13, 8)}
    with pytest.raises(SystemExit, match=r"layers\.0\.ffn_out_weight has 104 elements, not a multiple of its "
                                         r"input width 12"):
        family_floor.gemm_dims(config, tensors)


@pytest.mark.parametrize("argv, message", [
    (["--models", "bert-base,bogus"], r"--models: unknown \['bogus'\]; the bench's models are .*nomic-bert-base"),
    (["--shape", "32by512"], r"--shape: expected BATCHxSEQ such as 32x512, got '32by512'"),
])
def test_bad_arguments_are_named(family_floor, argv, message):
    with pytest.raises(SystemExit, match=message):
        family_floor.main(argv)


def test_without_a_gpu_it_says_so(family_floor):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit, match="times a CUDA GPU; torch sees none here"):
        family_floor.main(["--models", "bert-base"])
