"""The input rules of `Encoder.__call__`: what input_ids, attention_mask and token_type_ids may be.

One home for each rule; `encoder.py` calls these on its host (numpy) and device (torch CUDA) paths.

- Kinds: numpy arrays, torch tensors, or nested lists/tuples of Python numbers. torch input_ids take
  torch attention_mask/token_type_ids on the same device; numpy or list input_ids take numpy arrays
  or lists (a torch tensor beside them is a TypeError). Anything else is a TypeError.
- torch tensors are dense (strided; sparse is a TypeError, nested is a ValueError) and on the CPU or
  a CUDA device (e.g. 'meta' is a ValueError).
- dtypes (the same for numpy and torch): input_ids any integer type, signed or unsigned, 8 to 64 bits;
  token_type_ids integers or bool; attention_mask integers, bool, or floating point holding exactly
  0.0 and 1.0 (as transformers accepts; any other float is a ValueError). Everything else -- bool
  input_ids, float ids or types, complex, object or string arrays -- is a TypeError.
- Shape: 2-D [batch, seq] with batch >= 1 and seq >= 1; mask and types shaped like input_ids. 0-D,
  1-D, 3-D, empty and ragged input are ValueErrors; so is seq past the model's usable length
  (max_position_embeddings; for RoBERTa-style padding_offset positions, max_position_embeddings -
  pad_token_id - 1, since position ids start at pad_token_id + 1).
- Values: input_ids in [0, vocab_size), token_type_ids in [0, type_vocab_size), attention_mask 0 or 1;
  integer values that do not fit int32 are rejected on conversion, the rest by `check_values`, for
  host arrays and device tensors alike (the engine itself only clamps ids). An all-zero mask row is
  allowed (its outputs are finite; they mean nothing).

Every error is a ValueError or TypeError whose message names the argument.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from .weights_tools.layout import seq_limit_text, usable_seq_length

# Which dtype kinds ("int", "bool", "float") each argument takes.
_KINDS = {"input_ids": ("int",), "token_type_ids": ("int", "bool"), "attention_mask": ("int", "bool", "float")}
_WANTED = {
    "input_ids": "integers",
    "token_type_ids": "integers (or bool)",
    "attention_mask": "integers, bool, or floats that are 0.0 or 1.0",
}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _torch():
    import torch

    return torch


def _is_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


# ---- dtypes ----------------------------------------------------------------------------------
def numpy_kind(dtype: np.dtype) -> str:
    # By dtype.kind: numpy files timedelta64 under np.integer, but a duration is no token id.
    return {"b": "bool", "i": "int", "u": "int", "f": "float"}.get(dtype.kind, "other")


@functools.cache  # once per dtype: this runs for every tensor of every forward
def torch_kind(dtype) -> str:
    torch = _torch()
    if dtype == torch.bool:
        return "bool"
    if dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return "int"
    if dtype.is_floating_point:
        return "float"
    return "other"  # complex, quantized, sub-byte integers


def check_dtype(name: str, kind: str, dtype, element_type: type | None = None) -> None:
    """The dtype rule. `element_type`: for object arrays, the type of an element, to name it."""
    if kind in _KINDS[name]:
        return
    got = f"dtype {dtype}"
    if element_type is not None:
        got += f" (elements of type {element_type.__name__}; pass an integer array)"
    raise TypeError(f"{name} must hold {_WANTED[name]}, got {got}")


def mask_message(value) -> str:
    return f"attention_mask must hold only 0 and 1, got {value!r}"


def _int32_message(name: str, value: int) -> str:
    if name == "attention_mask":
        return mask_message(value)
    return f"{name} holds {value}, outside the int32 range (so out of range for any vocabulary)"


def ndim_message(name: str, shape: tuple) -> str:
    hint = " (add a batch dimension, e.g. ids[None])" if len(shape) == 1 else ""
    return f"{name} must be 2-D [batch, seq], got shape {shape}{hint}"


def _check_2d(name: str, shape: tuple) -> None:
    if len(shape) != 2:
        raise ValueError(ndim_message(name, shape))


def _check_not_empty(name: str, shape: tuple) -> None:
    if 0 in shape:
        raise ValueError(f"empty input: {name} has shape {shape}")


def check_shapes(ids_shape, mask_shape, types_shape) -> None:
    if tuple(mask_shape) != tuple(ids_shape):
        raise ValueError(f"attention_mask has shape {tuple(mask_shape)}, expected {tuple(ids_shape)} like input_ids")
    if tuple(types_shape) != tuple(ids_shape):
        raise ValueError(f"token_type_ids has shape {tuple(types_shape)}, expected {tuple(ids_shape)} like input_ids")


def check_seq_length(config: dict, seq: int) -> None:
    if seq > usable_seq_length(config):
        raise ValueError(f"input_ids has sequence length {seq}, which exceeds {seq_limit_text(config)}")


# ---- host inputs: numpy arrays and lists -------------------------------------------------------
def _list_to_array(name: str, value) -> np.ndarray:
    try:
        a = np.asarray(value)
    except ValueError:
        raise ValueError(
            f"{name} is a ragged list: every row must have the same length (pad the rows and pass an "
            "attention_mask)"
        ) from None
    except TypeError as e:
        raise TypeError(f"{name}: a list of numbers was expected ({e})") from None
    if a.size == 0:
        return a.astype(np.int64)  # `[[]]` reads as float64: with no values there is no dtype to judge
    if a.dtype.kind in "fO":
        # Python ints beyond int64 read as float64 or object: keep them integers, to be range-checked.
        items = np.asarray(value, dtype=object)
        if all(isinstance(x, (int, np.integer)) for x in items.flat):
            lo, hi = int(min(items.flat)), int(max(items.flat))
            if lo < _INT32_MIN or hi > _INT32_MAX:
                raise ValueError(_int32_message(name, lo if lo < _INT32_MIN else hi))
            return np.array([int(x) for x in items.flat], dtype=np.int64).reshape(items.shape)
    return a


def as_int_array(name: str, value) -> np.ndarray:
    """A numpy array or nested list -> a C-contiguous, aligned int32 [batch, seq] array, or an error."""
    if isinstance(value, (list, tuple)):
        value = _list_to_array(name, value)
    elif _is_tensor(value):
        raise TypeError(
            f"{name} is a torch tensor but input_ids is not: pass torch tensors for all of them, or "
            "numpy arrays (or lists) for all of them"
        )
    elif not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor (or a nested list), got {type(value).__name__}")
    kind = numpy_kind(value.dtype)
    check_dtype(name, kind, value.dtype, type(value.flat[0]) if value.dtype == object and value.size else None)
    _check_2d(name, value.shape)
    _check_not_empty(name, value.shape)
    if kind == "float":  # attention_mask, as transformers accepts: 1.0/0.0 only
        ok = np.isin(value, (0.0, 1.0))
        if not ok.all():
            raise ValueError(mask_message(value[~ok].flat[0].item()))
    elif kind == "int" and (value.dtype.itemsize > 4 or value.dtype == np.uint32):
        lo, hi = int(value.min()), int(value.max())
        if lo < _INT32_MIN or hi > _INT32_MAX:
            raise ValueError(_int32_message(name, lo if lo < _INT32_MIN else hi))
    out = np.ascontiguousarray(value, dtype=np.int32)
    return out if out.flags.aligned else out.copy()  # the engine reads int32s: they must be aligned


# ---- torch tensors ---------------------------------------------------------------------------
def check_tensor(name: str, t) -> None:
    """The rules every torch tensor argument meets, wherever it then runs."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor like input_ids, got {type(t).__name__}")
    if t.is_nested:
        raise ValueError(f"{name} is a nested (ragged) tensor: pad it to [batch, seq] and pass an attention_mask")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {t.layout} (call .to_dense())")
    check_dtype(name, torch_kind(t.dtype), t.dtype)
    if not (t.is_cuda or t.is_cpu):  # (t.device.type builds a string: ~1 us a call on the hot path)
        raise ValueError(f"{name} is on the {t.device} device: ftbert takes tensors on the CPU or a CUDA device")


def tensor_to_numpy(name: str, t) -> np.ndarray:
    """A torch tensor (after `check_tensor`) -> the int32 array of `as_int_array`."""
    torch = _torch()
    t = t.detach().cpu()
    if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
        t = t.to(torch.float32)  # bfloat16, float8: numpy has no such dtype; float32 holds them exactly
    return as_int_array(name, t.resolve_conj().resolve_neg().numpy())


def _comparable(t):
    """`t` with the same values in a dtype whose comparisons and reductions torch implements."""
    torch = _torch()
    if t.dtype in (torch.bool, torch.uint16, torch.uint32):
        return t.to(torch.int64)
    if t.dtype == torch.uint64:
        return t.view(torch.int64)  # values >= 2**63 read as negative: still out of range
    if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
        return t.to(torch.float32)
    return t


def check_values(config: dict, ids, mask, types, seq: int | None = None) -> int:
    """The value rules (and the usable length), their one home for both paths: input_ids within
    vocab_size, token_type_ids within type_vocab_size, attention_mask 0 or 1. Returns the attended
    tokens (the mask's non-zeros). Packed inputs (Encoder.forward_packed) come as [1, T] rows with
    mask None (every position a token) and `seq`, their longest sequence.

    numpy arrays (host inputs, int32 from as_int_array) are checked with numpy; torch tensors that
    stay on their device (CUDA tensors given to a CUDA encoder, under input_check="sync" or
    padding_free=True) with a few reductions and one small read back (a sync), which brings the
    token count along: packing them then needs no second one. Under input_check="async" the engine
    checks them instead, as it stages them (Backend::stage_inputs), without a read back; its kernels
    clamp ids besides, so a bad value could never read outside the tables.
    """
    check_seq_length(config, ids.shape[1] if seq is None else seq)
    if seq is not None and ids.shape[1] == 0:  # packed inputs of empty sequences only
        return 0
    if isinstance(ids, np.ndarray):
        mask_bad = None if mask is None else (mask != 0) & (mask != 1)
        ids_lo, ids_hi, types_lo, types_hi = (int(v) for v in (ids.min(), ids.max(), types.min(), types.max()))
        tokens = ids.size if mask is None else int(np.count_nonzero(mask))
        mask_any = [mask_bad is not None and bool(mask_bad.any())]
        unsigned = False, False, False
    else:
        torch = _torch()
        if mask is None:
            mask = torch.ones(1, dtype=torch.bool, device=ids.device).expand(ids.shape)
        ids_c, types_c, mask_c = _comparable(ids), _comparable(types), _comparable(mask)
        # torch.stack promotes: all are signed ints here.
        stats = [*torch.aminmax(ids_c), *torch.aminmax(types_c), torch.count_nonzero(mask_c)]
        mask_bad = None if mask.dtype == torch.bool else (mask_c != 0) & (mask_c != 1)
        if mask_bad is not None:
            stats.append(mask_bad.any())
        ids_lo, ids_hi, types_lo, types_hi, tokens, *mask_any = torch.stack(stats).tolist()
        # uint64 values past 2**63 read as negative in _comparable: named as they are.
        unsigned = tuple(t.dtype == torch.uint64 for t in (ids, types, mask))
        mask = mask_c
    for name, lo, hi, limit, is_u64 in (("input_ids", ids_lo, ids_hi, "vocab_size", unsigned[0]),
                                        ("token_type_ids", types_lo, types_hi, "type_vocab_size", unsigned[1])):
        if lo < 0 or hi >= config[limit]:
            value = lo if lo < 0 else hi
            if is_u64 and value < 0:
                value += 2**64
            raise ValueError(f"{name} holds {value}, out of range for {limit} {config[limit]}")
    if mask_any and mask_any[0]:
        value = mask[mask_bad].flatten()[0].item()  # the error path only: one more read back
        if unsigned[2] and value < 0:
            value += 2**64
        raise ValueError(mask_message(value))
    return int(tokens)


@functools.cache
def staged_dtypes() -> frozenset:
    """The torch dtypes whose values the engine stages and checks on the device as they are
    (Backend::stage_inputs: int32, int64, and one-byte unsigned)."""
    torch = _torch()
    return frozenset((torch.int32, torch.int64, torch.uint8, torch.bool))


def device_int32(t):
    """A checked device tensor as the contiguous int32 the engine reads (itself when it is one)."""
    torch = _torch()
    return _comparable(t).to(torch.int32).contiguous()
