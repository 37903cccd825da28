"""HuggingFace -> ftbert weight converter and the reader of converted directories.

    convert_checkpoint(src, dst, dtype)   writes a converted directory (see FORMAT.md)
    read_converted(dir)                   (config, tensors) of a converted directory, fully checked
    load_hf_checkpoint(src)               (config, float32 tensors) straight from a HF directory
    is_converted(dir), expected_tensors(config), main(argv) (the `ftbert convert` command)
    FAMILIES, family_for(model_type)      the model families read, with their HF names (families.py)
    read_mlm_head(src), read_projection(src)  the heads encode_sparse and encode_multivector run, read
                                          from a HF directory (mlm_head.py, extra_heads.py); MissingHead
"""

from .cli import main
from .convert import convert_checkpoint, load_hf_checkpoint
from .errors import ConversionError, FormatError
from .extra_heads import TokenProjection, locate_projection, read_projection
from .families import FAMILIES, Family, family_for
from .layout import CONFIG_FILE, DTYPES, FORMAT_VERSION, WEIGHTS_FILE
from .mlm_head import MissingHead, MlmHead, locate_mlm_head, read_mlm_head
from .reader import is_converted, read_converted
from .schema import expected_tensors

__all__ = [
    "ConversionError",
    "FormatError",
    "MissingHead",
    "MlmHead",
    "TokenProjection",
    "locate_mlm_head",
    "read_mlm_head",
    "locate_projection",
    "read_projection",
    "load_hf_checkpoint",
    "convert_checkpoint",
    "read_converted",
    "is_converted",
    "expected_tensors",
    "main",
    "FAMILIES",
    "Family",
    "family_for",
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "FORMAT_VERSION",
    "DTYPES",
]
