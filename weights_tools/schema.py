"""The tensors an engine config implies, as the engine itself defines them.

cpp/core/weights.cpp holds the one table of each architecture's tensors (names, shapes, which are
lookup tables); the loader uploads by it, and the converter and the reader of converted
directories ask it here, through the bound module, rather than keep a list of their own.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, NamedTuple

from .._native import _C
from .families import family_for, supported_model_types
from .layout import EMBEDDING_SIZE, INT_KEYS, fmt_shape, human_size


class Tensor(NamedTuple):
    name: str
    shape: tuple[int, ...]
    table: bool  # a lookup table (embeddings, a relative bias): rows as HF stores them
    gemm_weight: bool  # a matrix only Backend::weight_gemm multiplies (what quantization applies to)


def engine_config(config: dict) -> dict:
    """`config` with the architecture unit its family runs (the family table names it; a config
    without model_type is BERT's, as conversions before families were)."""
    family = family_for(config.get("model_type", "bert"))
    if family is None:
        raise ValueError(f"model_type {config.get('model_type')!r} is not one ftbert runs "
                         f"(supported: {', '.join(supported_model_types())})")
    return {**config, "architecture": family.architecture}


def iter_tensors(config: dict) -> Iterator[Tensor]:
    """The tensors in file order: the embeddings (and projection, relative bias), each layer's,
    then the pooler's, the final norm and the head's. The engine is asked for at most two layers
    (layer 0 may differ from the rest) and the others follow their pattern, so a reader can stop
    at the first mismatch however many layers a config claims."""
    layers = int(config["num_hidden_layers"])
    asked = min(layers, 2)
    specs = [Tensor(n, tuple(s), t, g) for n, s, t, g in
             _C.expected_tensors(engine_config({**config, "num_hidden_layers": asked}))]
    in_layer = [t.name.startswith("layers.") for t in specs]
    first = in_layer.index(True) if any(in_layer) else len(specs)
    last = len(in_layer) - in_layer[::-1].index(True) if any(in_layer) else first
    patterns = [[t for t in specs[first:last] if t.name.startswith(f"layers.{i}.")] for i in range(asked)]
    yield from specs[:first]
    for i in range(layers):
        k = min(i, asked - 1)
        for t in patterns[k]:
            yield t._replace(name=f"layers.{i}." + t.name[len(f"layers.{k}."):])
    yield from specs[last:]


def iter_expected_tensors(config: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor, as iter_tensors."""
    return ((t.name, t.shape) for t in iter_tensors(config))


def expected_tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors an engine config implies, as (name, shape), in file order. Matrices are
    [in, out] (the transpose of nn.Linear's); a config without "embedding_size" has embeddings of
    hidden_size."""
    return list(iter_expected_tensors(config))


def parameter_count(config: dict) -> tuple[int, str]:
    """(number of parameters the config implies, what holds most of them), computed from the sizes
    alone: one layer's tensors times the layer count, never a list as long as the model."""
    L = int(config["num_hidden_layers"])
    one = expected_tensors({**config, "num_hidden_layers": 1})
    layer = sum(math.prod(s) for n, s in one if n.startswith("layers."))
    parts = [(math.prod(s), f"{n} {fmt_shape(s)}") for n, s in one if not n.startswith("layers.")]
    parts.append((L * layer, f"{L} layers of {layer} parameters"))
    return sum(p for p, _ in parts), max(parts)[1]


def check_fits(config: dict, available: int, itemsize: int, where: str, files: str,
               error: Callable[[str], Exception]) -> None:
    """Refuses a config whose tensors need more bytes than the weight files hold.

    Runs before any tensor is read: an absurd size in the config (vocab_size 10**9, say) fails
    here, naming the sizes, instead of in an allocation or a loop over the model's tensors.
    """
    count, largest = parameter_count(config)
    need = count * itemsize
    if need > available:
        keys = [*INT_KEYS, *([EMBEDDING_SIZE] if EMBEDDING_SIZE in config else [])]
        sizes = ", ".join(f"{k}={config[k]}" for k in keys)
        raise error(
            f"{where}: the sizes it declares ({sizes}) imply {count} parameters, at least "
            f"{human_size(need)}, but the weight files ({files}) hold only {human_size(available)} "
            f"(most of it would be {largest}); a size in the config is wrong"
        )
