"""The input rules of `Encoder.__call__`: what input_ids, attention_mask and token_type_ids may be.

One home for each rule; `encoder.py` calls these on its host (numpy) and device (torch CUDA) paths.
"""

from __future__ import annotations

import numpy as np


def _torch():
    import torch

    return torch


def ndim_message(name: str, shape: tuple) -> str:
    hint = " (add a batch dimension, e.g. ids[None])" if len(shape) == 1 else ""
    return f"{name} must be 2-D [batch, seq], got shape {shape}{hint}"


def as_int_array(name: str, value) -> np.ndarray:
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(value).__name__}")
    if value.dtype == np.bool_:
        value = value.astype(np.int32)
    if name == "attention_mask" and np.issubdtype(value.dtype, np.floating) and np.isin(value, (0.0, 1.0)).all():
        value = value.astype(np.int32)  # a float 1.0/0.0 mask, as transformers accepts
    if not np.issubdtype(value.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
    if value.ndim != 2:
        raise ValueError(ndim_message(name, value.shape))
    if value.size == 0:
        raise ValueError(f"empty input: {name} has shape {value.shape}")
    if value.dtype.itemsize > 4 or value.dtype == np.uint32:
        lo, hi = int(value.min()), int(value.max())
        if lo < -(2**31) or hi >= 2**31:
            raise ValueError(f"{name} holds {lo if lo < -(2**31) else hi}, outside the int32 range")
    return np.ascontiguousarray(value, dtype=np.int32)


def int_tensor_to_numpy(name: str, t) -> np.ndarray:
    torch = _torch()
    if t.dtype == torch.bool:
        t = t.to(torch.int32)
    return as_int_array(name, t.detach().cpu().numpy())


def check_shapes(ids_shape, mask_shape, types_shape) -> None:
    if tuple(mask_shape) != tuple(ids_shape):
        raise ValueError(f"attention_mask has shape {tuple(mask_shape)}, expected {tuple(ids_shape)} like input_ids")
    if tuple(types_shape) != tuple(ids_shape):
        raise ValueError(f"token_type_ids has shape {tuple(types_shape)}, expected {tuple(ids_shape)} like input_ids")


def check_device_values(config: dict, ids, mask, types) -> None:
    """Checks torch inputs that stay on their device (CUDA tensors given to a CUDA encoder).

    A few reductions and one small read back (a sync); the kernels clamp anyway, so a bad id can
    never read outside the tables.
    """
    torch = _torch()
    c = config
    if ids.shape[1] > c["max_position_embeddings"]:
        raise ValueError(
            f"sequence length {ids.shape[1]} exceeds max_position_embeddings {c['max_position_embeddings']}"
        )
    stats = [*torch.aminmax(ids), *torch.aminmax(types)]
    if mask.is_floating_point():
        stats.append(((mask != 0) & (mask != 1)).any())
    elif mask.dtype != torch.bool:
        lo, hi = torch.aminmax(mask)
        stats.append((lo < 0) | (hi > 1))
    ids_lo, ids_hi, types_lo, types_hi, *mask_bad = torch.stack(stats).tolist()
    for name, lo, hi, limit in (("input_ids", ids_lo, ids_hi, "vocab_size"),
                                ("token_type_ids", types_lo, types_hi, "type_vocab_size")):
        if lo < 0 or hi >= c[limit]:
            raise ValueError(f"{name} holds {int(lo if lo < 0 else hi)}, out of range for {limit} {c[limit]}")
    if mask_bad and mask_bad[0]:
        raise ValueError("attention_mask must hold only 0 and 1")
