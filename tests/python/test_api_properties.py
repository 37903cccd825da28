"""Property-based tests of `Encoder.__call__`'s input handling (hypothesis).

Inputs are drawn across kinds (numpy arrays, torch tensors, nested lists and tuples, ragged lists,
scalars, strings), every integer width signed and unsigned, bool, float16/bfloat16/32/64, complex,
object and string arrays, layouts (Fortran order, sliced with a step, flipped, broadcast with stride
0, byte-swapped, unaligned, read-only; transposed, sliced, expanded, sparse and nested tensors),
0-D/1-D/3-D and empty shapes, sequences past max_position_embeddings, and values in and out of range
(vocab_size - 1, vocab_size, negatives, beyond int32 and int64, masks of 2, -1, 0.5, NaN, all-zero
rows), mixed kinds and torch devices (CPU, CUDA, another GPU, 'meta').

The oracle below decides from the drawn input alone, by the rules of python/ftbert/inputs.py, which
problems it has. Then the call must either
- raise ValueError or TypeError whose message first names an argument that has one of those problems
  and says what (a pattern per problem), when there is a problem; or
- run, when there is none, and return what the reference returns -- the same values as C-contiguous
  int32 numpy arrays through the same encoder -- within 1e-6, in the documented kind (numpy in ->
  numpy float32; torch in -> torch float32 on the input's device), shaped [B, S, H] and [B, H], all
  finite (all-zero mask rows included), leaving numpy inputs unchanged.
Anything else -- another exception type, a crash, a wrong shape -- fails.

Rules decided here (docs/api.md): bool masks and token types are accepted, bool ids are not;
a float mask is accepted when it holds exactly 0.0/1.0 (-0.0 included), otherwise ValueError; any
integer dtype is accepted, uint64 included, when the values are in range; values beyond int32 are a
ValueError; an all-zero mask row runs and gives finite outputs; 0-D/1-D/3-D, empty and ragged inputs
are ValueErrors; object, string, complex and float ids/types are TypeErrors; numpy (or list) ids
with a torch mask or types, or torch ids with anything but tensors, are TypeErrors; tensors on
'meta' (or any non-CPU, non-CUDA device), or on another GPU than a CUDA encoder's, are ValueErrors;
CPU tensors to a CUDA encoder and CUDA tensors to a CPU encoder run (through host copies).

Seeds: each property is seeded from the run's seed (tests/conftest.py's `rng`), so
FTBERT_TEST_SEED=N replays a run. The number of cases run is printed in the terminal summary
(tests/python/conftest.py's pytest_terminal_summary).
"""

from __future__ import annotations

import collections
import copy
import random
import re
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import ftbert
from ftbert.inputs import device_int32, tensor_to_numpy
from tests._models import make_bert

VOCAB, TYPE_VOCAB, MAX_POS, HIDDEN = 97, 2, 64, 32
NAMES = ("input_ids", "attention_mask", "token_type_ids")

settings.register_profile(
    "ftbert-api",
    deadline=None,
    derandomize=False,
    database=None,  # nothing written into the checkout; a failure prints its reproduction blob
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
PROFILE = settings.get_profile("ftbert-api")

TALLY: collections.Counter = collections.Counter()  # (property, outcome) -> cases, over the module
STARTED = [time.perf_counter()]  # reset when the module's first fixture runs
FINISHED: list = [None]  # set when that fixture is torn down, at the end of the module

GPU = ftbert.cuda_available()
TORCH_DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else []) + (
    ["cuda:1"] if torch.cuda.is_available() and torch.cuda.device_count() > 1 else []
)


# ---- the encoders ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    STARTED[0] = time.perf_counter()
    path = tmp_path_factory.mktemp("bert_api")
    make_bert(path, hidden=HIDDEN, heads=2, layers=1, vocab=VOCAB, max_pos=MAX_POS, type_vocab=TYPE_VOCAB)
    yield path
    FINISHED[0] = time.perf_counter()


@pytest.fixture(
    scope="module",
    params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="no CUDA GPU")])],
)
def enc(request, model_path):
    return ftbert.Encoder.from_pretrained(model_path, device=request.param, dtype="float32")


def run_property(rng, strategy, check, max_examples: int) -> None:
    """Runs `check` on `max_examples` cases drawn from `strategy`, seeded from the run's seed."""

    @seed(int(rng.integers(2**31)))
    @settings(PROFILE, max_examples=max_examples)
    @given(strategy)
    def prop(case):
        check(case)

    prop()


# ---- a drawn argument and what the rules say about it ------------------------------------------
@dataclass
class Arg:
    name: str
    value: object  # what is passed (None: left out)
    container: str  # "numpy", "torch", "list", "other", "none"
    shape: tuple | None = None  # the shape the engine would see (None: not array-like)
    device: str | None = None  # torch tensors
    problems: list = field(default_factory=list)  # [(exception type, message pattern)]
    ref: np.ndarray | None = None  # the int64 values, when the argument is valid

    def snapshot(self):
        if self.container == "numpy":
            return self.value.tobytes()
        if self.container == "list":
            return copy.deepcopy(self.value)
        return None

    def unchanged(self, snap) -> bool:
        if self.container == "numpy":
            return self.value.tobytes() == snap
        if self.container == "list":
            return self.value == snap
        return True


def element_kind(src: np.ndarray, container: str) -> str:
    """The dtype kind the rules see: "int", "bool", "float" or "other"."""
    if container == "list":
        if src.size == 0:
            return "int"  # an empty list has no elements to judge
        if src.dtype == object:
            return "int" if all(isinstance(x, int) and not isinstance(x, bool) for x in src.flat) else "other"
    if src.dtype == object:
        return "other"  # object arrays are rejected, whatever they hold
    if src.dtype == np.bool_:
        return "bool"
    if src.dtype.kind in "iu":  # not np.issubdtype(..., np.integer), which takes timedelta64 in
        return "int"
    if src.dtype.kind == "f":
        return "float"
    return "other"


ALLOWED = {"input_ids": ("int",), "token_type_ids": ("int", "bool"), "attention_mask": ("int", "bool", "float")}


def value_problems(name: str, kind: str, src: np.ndarray, extra_ints=()) -> list:
    if kind not in ALLOWED[name] or (src.size == 0 and not extra_ints) or kind == "bool":
        return []
    if kind == "float":  # attention_mask only
        return [(ValueError, r"must hold only 0 and 1")] if not np.isin(src, (0.0, 1.0)).all() else []
    values = [int(v) for v in src.flat] + list(extra_ints)
    if name == "attention_mask":
        return [(ValueError, r"must hold only 0 and 1")] if any(v not in (0, 1) for v in values) else []
    limit = VOCAB if name == "input_ids" else TYPE_VOCAB
    return [(ValueError, r"out of range")] if any(v < 0 or v >= limit for v in values) else []


def structure_problems(name: str, kind: str, shape: tuple) -> list:
    p = []
    if kind not in ALLOWED[name]:
        p.append((TypeError, r"must hold"))
    if len(shape) != 2:
        p.append((ValueError, r"2-D"))
    if 0 in shape:
        p.append((ValueError, r"empty"))
    return p


# ---- strategies ------------------------------------------------------------------------------
def chooser(draw) -> random.Random:
    """Where the categorical choices (kind, dtype, layout, device...) come from: uniform, which
    st.sampled_from is not when generating (it favours a few options by a factor of up to ~7)."""
    return random.Random(draw(st.integers(0, 2**32 - 1)))


INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
BAD_INTS = {
    "input_ids": [VOCAB, VOCAB + 1, -1, -VOCAB, 127, 255, 2**15, 2**31 - 1, 2**31, 2**32 + 5,
                  -(2**31) - 1, 2**63 - 1, -(2**63), 2**64 - 1],
    "token_type_ids": [TYPE_VOCAB, -1, 255, 2**31, 2**32, 2**64 - 1, -(2**63)],
    "attention_mask": [2, -1, 255, 2**31, 2**32 + 1, 2**64 - 1, -(2**63)],
}
BAD_FLOATS = [0.5, 2.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e-8, -0.0]  # -0.0 is a valid 0
MASK_STYLES = ["ones", "right-pad", "left-pad", "random", "zero-row", "all-zero"]


def valid_ints(name: str, shape: tuple, r: np.random.Generator, style: str) -> np.ndarray:
    if name == "input_ids":
        a = r.integers(0, VOCAB, shape)
        if a.size:
            a.flat[r.integers(0, a.size)] = VOCAB - 1  # the table's last row
        return a
    if name == "token_type_ids":
        return r.integers(0, TYPE_VOCAB, shape)
    a = np.ones(shape, np.int64)
    if len(shape) != 2 or a.size == 0 or style == "ones":
        return a
    B, S = shape
    if style in ("right-pad", "left-pad"):
        for b in range(B):
            n = int(r.integers(0, S + 1))
            if style == "right-pad":
                a[b, n:] = 0
            else:
                a[b, : S - n] = 0
    elif style == "random":
        a = r.integers(0, 2, shape)
    elif style == "zero-row":
        a[int(r.integers(0, B))] = 0
    else:
        a[:] = 0
    return a


@st.composite
def sources(draw, r: random.Random, name: str, shape: tuple, container: str, mode: str):
    """(numpy array of the values, dtype label): what a container is then made from.

    mode "any": every dtype, values in and out of range; "values": the dtypes the argument takes,
    values in and out of range; "valid": the dtypes the argument takes, values in range.
    """
    fill = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    style = r.choice(MASK_STYLES)
    base = np.asarray(valid_ints(name, shape, fill, style))
    if container == "torch":
        labels = [*INT_DTYPES, np.bool_, np.float16, "bfloat16", np.float32, np.float64, np.complex64]
    elif container == "list":
        labels = [np.int64, np.uint64, np.int8, np.bool_, np.float64, np.float16, np.complex128,
                  "obj-int", "obj-str", "obj-none", "str"]
    else:
        labels = [*INT_DTYPES, np.bool_, np.float16, np.float32, np.float64, np.complex64, np.complex128,
                  "obj-int", "obj-str", "obj-none", "str", "timedelta"]
    if mode != "any":
        labels = [lab for lab in labels if _label_kind(lab, container) in ALLOWED[name]]
    # Mixed inputs: integer dtypes twice as often, as they are what runs; valid ones: all alike.
    label = r.choice(labels if mode == "valid" else [lab for lab in labels if lab in INT_DTYPES] + labels)
    bad = 0 if mode == "valid" or base.size == 0 else r.choice([0, 0, 0, 1, 2])
    if label in INT_DTYPES:
        info = np.iinfo(label)
        src = base.astype(label)
        choices = [v for v in BAD_INTS[name] if info.min <= v <= info.max]
        for _ in range(bad):
            if choices:
                src.flat[draw(st.integers(0, src.size - 1))] = r.choice(choices)
        return src, label
    if label == np.bool_:
        return (base % 2).astype(bool), label
    if label in (np.float16, np.float32, np.float64, "bfloat16"):
        src = base.astype(np.float32 if label == "bfloat16" else label)
        for _ in range(bad):
            src.flat[draw(st.integers(0, src.size - 1))] = r.choice(BAD_FLOATS)
        if label == "bfloat16":  # the values bfloat16 holds
            src = torch.from_numpy(src).to(torch.bfloat16).to(torch.float32).numpy()
        return src, label
    if label in (np.complex64, np.complex128):
        return base.astype(label), label
    if label in ("obj-int", "obj-str", "obj-none"):
        src = np.empty(shape, object)
        make = {"obj-int": int, "obj-str": str, "obj-none": lambda v: None}[label]
        for k, v in enumerate(base.flat):
            src.flat[k] = make(int(v))
        return src, label
    if label == "str":
        return base.astype(str), label
    return base.astype("m8[s]"), label


def _label_kind(label, container: str) -> str:
    if label in INT_DTYPES:
        return "int"
    if label == np.bool_:
        return "bool"
    if label in (np.float16, np.float32, np.float64, "bfloat16"):
        return "float"
    if label == "obj-int" and container == "list":
        return "int"
    return "other"


def numpy_layout(src: np.ndarray, layout: str) -> np.ndarray:
    """An array with `src`'s values in the given memory layout."""
    if layout == "fortran":
        return np.asfortranarray(src)
    if layout == "strided" and src.ndim >= 1:
        big = np.zeros(tuple(3 * n + 1 for n in src.shape), src.dtype)
        view = big[tuple(slice(1, None, 3) for _ in src.shape)]
        view[...] = src
        return view
    if layout == "flipped" and src.ndim >= 1:
        return np.flip(np.flip(src).copy())
    if layout == "broadcast" and src.ndim == 2 and src.shape[0] >= 1:
        return np.broadcast_to(src[:1], src.shape)  # stride 0, read-only; the caller re-derives values
    if layout == "byteswapped" and src.dtype.kind in "iufc" and src.dtype.itemsize > 1:
        return src.astype(src.dtype.newbyteorder())
    if layout == "unaligned" and src.dtype.kind in "iufc" and src.dtype.itemsize > 1 and src.size:
        out = np.frombuffer(bytearray(src.nbytes + 1), dtype=src.dtype, count=src.size, offset=1).reshape(src.shape)
        out[...] = src
        return out
    if layout == "readonly":
        out = np.array(src, copy=True)  # 0-d for a numpy scalar source, which has no flags to set
        out.flags.writeable = False
        return out
    return np.ascontiguousarray(src)


@st.composite
def args(draw, r: random.Random, name: str, shape: tuple, container: str, mode: str = "any", device="cpu"):
    """One argument: its value and the problems the rules find in it on its own (see `sources`).

    `device`: where torch tensors go in mode "values"."""
    if container == "none":
        return Arg(name, None, "none")
    if container == "other":
        value = r.choice([5, 1.5, "hello", b"\x01\x02", {"ids": 1}, object()] + ([None] if name == "input_ids" else []))
        return Arg(name, value, "other", problems=[(TypeError, r"torch tensor")])
    if mode == "any":
        variant = r.choice(["2d"] * 14 + ["0d", "1d", "3d", "wrong-2d"])
        if variant == "0d" and container != "list":
            shape = ()
        elif variant in ("0d", "1d"):
            shape = shape[1:]
        elif variant == "3d":
            shape = (*shape, 2)
        elif variant == "wrong-2d" and name != "input_ids":
            shape = (shape[0] + r.choice([1, -1, 0]), shape[1] + r.choice([1, -1]))
            shape = tuple(max(n, 0) for n in shape)
    src, label = draw(sources(r, name, shape, container, mode))
    kind = element_kind(src, container)

    if container == "numpy":
        layouts = ["c", "fortran", "strided", "flipped", "broadcast", "byteswapped", "unaligned", "readonly"]
        value = numpy_layout(src, r.choice(layouts))
        src = np.array(value)  # broadcast repeats row 0
        arg = Arg(name, value, "numpy", shape=src.shape)
        arg.problems = structure_problems(name, kind, src.shape) + value_problems(name, kind, src)
    elif container == "torch":
        if mode == "any":
            device = r.choice(TORCH_DEVICES * 4 + ["meta"])
        elif mode == "valid":  # the encoder's GPU or none: another GPU is a problem for a CUDA encoder
            device = r.choice([d for d in TORCH_DEVICES if d != "cuda:1"])
        layouts = ["contiguous", "transposed", "strided", "expanded", "requires_grad"]
        if mode == "any":
            layouts += ["sparse", "nested"]
        layout = r.choice(layouts)
        if label == "bfloat16":
            t = torch.from_numpy(np.ascontiguousarray(src)).to(torch.bfloat16)
        else:
            t = torch.from_numpy(np.ascontiguousarray(src))
        extra = []
        if layout == "transposed" and t.dim() == 2:
            t = t.t().contiguous().t()
        elif layout == "strided" and t.dim() >= 1:
            big = torch.zeros(tuple(2 * n + 1 for n in t.shape), dtype=t.dtype)
            view = big[tuple(slice(1, None, 2) for _ in t.shape)]
            view.copy_(t)
            t = view
        elif layout == "expanded" and t.dim() == 2 and t.shape[0] >= 1:
            t = t[:1].expand(t.shape)
            src = np.repeat(src[:1], src.shape[0], axis=0)
        elif layout == "requires_grad" and t.is_floating_point():
            t = t.clone().requires_grad_(True)
        elif layout == "sparse" and t.dim() == 2:
            t, device = torch.ones(t.shape, dtype=torch.int64).to_sparse(), "cpu"
            extra = [(TypeError, r"dense")]
        elif layout == "nested" and t.dim() == 2 and t.shape[0] >= 2 and t.shape[1] >= 2:
            with warnings.catch_warnings():  # "nested tensors are a prototype"
                warnings.simplefilter("ignore")
                t, device = torch.nested.nested_tensor([t[0].long(), t[1, :-1].long()]), "cpu"
            extra = [(ValueError, r"ragged|nested")]
        t = t.to(device)
        arg = Arg(name, t, "torch", shape=tuple(src.shape), device=device)
        arg.problems = structure_problems(name, kind, src.shape) + value_problems(name, kind, src) + extra
        if device == "meta":
            arg.problems.append((ValueError, r"meta"))
    else:  # list
        value = src.tolist()
        extra_ints = []
        ragged = False
        if src.ndim >= 1 and r.choice([False] * 3 + [True]):
            value = tuple(tuple(row) if isinstance(row, list) else row for row in value)
        if mode != "valid" and kind == "int" and src.size and r.choice([False] * 6 + [True]):
            huge = r.choice([2**64 + 3, -(2**63) - 7, 2**100])
            value = _replace_first(value, huge)
            extra_ints = [huge]
        if mode == "any" and src.ndim == 2 and min(src.shape) >= 1 and src.shape[0] >= 2 and r.random() < 0.15:
            rows = [list(row) for row in value]
            rows[-1] = rows[-1][:-1]
            value, ragged = rows, True
        arg = Arg(name, value, "list", shape=tuple(src.shape))
        arg.problems = structure_problems(name, kind, src.shape) + value_problems(name, kind, src, extra_ints)
        if src.size == 0 and src.ndim >= 1 and src.shape[0] == 0:
            arg.shape = (0,)  # `[]` reads as a 1-D array
            arg.problems.append((ValueError, r"2-D|empty"))
        if ragged:
            arg.shape = None
            arg.problems.append((ValueError, r"ragged"))
    if not arg.problems:
        arg.ref = src.astype(np.int64)
    return arg


def _replace_first(value, new):
    """`value` (nested lists/tuples) with its first scalar replaced."""
    if isinstance(value, (list, tuple)):
        if not value:
            return value
        first = _replace_first(value[0], new)
        return type(value)([first, *value[1:]])
    return new


@dataclass
class Case:
    ids: Arg
    mask: Arg
    types: Arg
    keywords: bool

    @property
    def args(self):
        return self.ids, self.mask, self.types


@st.composite
def cases(draw, only_valid: bool = False):
    mode = "valid" if only_valid else "any"
    r = chooser(draw)
    B, S = draw(st.integers(1, 5)), draw(st.integers(1, 40))
    # Left to hypothesis, B or S would be 0 in some 40% of cases: empty inputs come here instead.
    if not only_valid and r.random() < 0.1:
        B, S = r.choice([(0, S), (B, 0), (0, 0)])
    if not only_valid and r.random() < 0.1:
        S = r.choice([MAX_POS - 1, MAX_POS, MAX_POS + 1, MAX_POS + 6])
    shape = (B, S)
    c_ids = r.choice(["numpy", "torch", "list"] * 3 + ([] if only_valid else ["other"]))

    def other_container():
        if only_valid:
            same = "torch" if c_ids == "torch" else r.choice(["numpy", "list"])
            return r.choice([same, same, "none"])
        same = c_ids if c_ids != "other" else r.choice(["numpy", "torch", "list"])
        return r.choice([same] * 12 + ["none"] * 4 + ["numpy", "torch", "list", "other"])

    # Mixed cases: each argument clean (valid mode) or not, so one problem at a time comes often,
    # where the oracle is strictest.
    def arg_mode():
        return mode if only_valid else r.choice(["any", "valid", "valid"])

    ids = draw(args(r, "input_ids", shape, c_ids, arg_mode()))
    mask = draw(args(r, "attention_mask", shape, other_container(), arg_mode()))
    types = draw(args(r, "token_type_ids", shape, other_container(), arg_mode()))
    if only_valid and ids.container == "torch":  # one device for all three
        dev = ids.device
        for a in (mask, types):
            if a.container == "torch" and a.device != dev:
                a.value, a.device = a.value.to(dev), dev
    return Case(ids, mask, types, keywords=draw(st.booleans()))


# ---- the oracle ------------------------------------------------------------------------------
def case_problems(enc, case: Case) -> list:
    """[(argument name, exception type, message pattern)] for every problem the input has."""
    probs = [(a.name, exc, rx) for a in case.args for exc, rx in a.problems]
    ids, mask, types = case.args
    for a in (mask, types):
        if a.container == "none":
            continue
        if ids.container == "torch" and a.container != "torch":
            probs.append((a.name, TypeError, r"torch tensor"))
        if ids.container in ("numpy", "list") and a.container == "torch":
            probs.append((a.name, TypeError, r"torch tensor"))
        if ids.container == "torch" and a.container == "torch" and a.device != ids.device:
            probs.append((a.name, ValueError, r"is on"))
        if ids.shape is not None and a.shape is not None and a.shape != ids.shape:
            probs.append((a.name, ValueError, r"shape|2-D|empty"))
    if ids.shape is not None and len(ids.shape) == 2 and ids.shape[1] > MAX_POS:
        probs.append(("input_ids", ValueError, r"max_position_embeddings"))
    if ids.container == "torch" and enc.device.startswith("cuda") and ids.device.startswith("cuda"):
        if ids.device != enc.device:
            probs.append(("input_ids", ValueError, r"encoder runs on"))
    return probs


def first_named(message: str) -> str | None:
    found = [(message.find(n), n) for n in NAMES if n in message]
    return min(found)[1] if found else None


def describe(case: Case) -> str:
    lines = []
    for a in case.args:
        v = a.value
        if isinstance(v, np.ndarray):
            lines.append(f"{a.name}: numpy {v.dtype} shape {v.shape} strides {v.strides} aligned {v.flags.aligned}")
        elif isinstance(v, torch.Tensor):
            layout = v.stride() if v.layout == torch.strided and not v.is_nested else v.layout
            lines.append(f"{a.name}: torch {v.dtype} shape {tuple(v.shape)} {layout} on {v.device}")
        else:
            lines.append(f"{a.name}: {a.container} {v!r:.300}")
    return "\n".join(lines)


def call(enc, case: Case):
    ids, mask, types = (a.value for a in case.args)
    if case.keywords:
        kw = {"input_ids": ids}
        if mask is not None:
            kw["attention_mask"] = mask
        if types is not None:
            kw["token_type_ids"] = types
        return checked(enc, **kw)
    return checked(enc, ids, mask, types)


def checked(enc, *args, **kwargs):
    """A forward whose value errors are all raised by the time it returns: CUDA tensors' values
    are checked on the GPU without waiting (input_check="async"), and synchronize() raises them."""
    out = enc(*args, **kwargs)
    enc.synchronize()
    return out


def check_case(enc, case: Case, tally: str) -> None:
    probs = case_problems(enc, case)
    snaps = [a.snapshot() for a in case.args]
    try:
        out = call(enc, case)
    except (ValueError, TypeError) as e:
        msg = str(e)
        TALLY[tally, type(e).__name__] += 1
        assert probs, f"a valid input was rejected: {type(e).__name__}: {msg}\n{describe(case)}"
        named = first_named(msg)
        assert any(
            named == name and isinstance(e, exc) and re.search(rx, msg) for name, exc, rx in probs
        ), f"{type(e).__name__}: {msg!r} names none of the problems {probs}\n{describe(case)}"
        return
    TALLY[tally, "ran"] += 1
    assert not probs, f"accepted an input with problems {probs}\n{describe(case)}"
    for a, snap in zip(case.args, snaps):
        assert a.unchanged(snap), f"{a.name} was modified in place"
    check_output(enc, case, out)


def check_output(enc, case: Case, out) -> None:
    ids = case.ids
    B, S = ids.shape
    ref_ids = np.ascontiguousarray(ids.ref, dtype=np.int32)
    ref_mask = np.ones((B, S), np.int32) if case.mask.ref is None else np.ascontiguousarray(case.mask.ref, np.int32)
    ref_types = np.zeros((B, S), np.int32) if case.types.ref is None else np.ascontiguousarray(case.types.ref, np.int32)
    # The reference runs from host arrays; CUDA tensors given to a CUDA encoder stay padded under the
    # default padding-free rule where host masks with enough padding are packed (zeros at padding):
    # compare like with like. A CPU encoder copies CUDA tensors to the host first, so the host rule holds.
    on_gpu = ids.container == "torch" and str(ids.device).startswith("cuda") and enc.device.startswith("cuda")
    mode = enc.padding_free
    if on_gpu and mode == "auto":
        enc.padding_free = False
    try:
        want = enc(ref_ids, ref_mask, ref_types)
    finally:
        enc.padding_free = mode
    h, p = out.last_hidden_state, out.pooler_output
    if ids.container == "torch":
        for t in (h, p):
            assert isinstance(t, torch.Tensor) and t.dtype == torch.float32, type(t)
            assert t.device == torch.device(ids.device), (t.device, ids.device)
        h, p = h.detach().cpu().numpy(), p.detach().cpu().numpy()
    else:
        for a in (h, p):
            assert isinstance(a, np.ndarray) and a.dtype == np.float32, (type(a), getattr(a, "dtype", None))
    assert h.shape == (B, S, HIDDEN) and p.shape == (B, HIDDEN), (h.shape, p.shape)
    assert np.isfinite(h).all() and np.isfinite(p).all(), "non-finite outputs"
    np.testing.assert_allclose(h, want.last_hidden_state, rtol=0, atol=1e-6)
    np.testing.assert_allclose(p, want.pooler_output, rtol=0, atol=1e-6)


# ---- the properties --------------------------------------------------------------------------
def test_any_input_runs_like_the_reference_or_names_its_problem(enc, rng):
    run_property(rng, cases(), lambda case: check_case(enc, case, "any input"), max_examples=300)


def test_valid_inputs_of_every_kind_dtype_and_layout_match_the_int32_reference(enc, rng):
    def check(case):
        assert not case_problems(enc, case), describe(case)
        check_case(enc, case, "valid inputs")

    run_property(rng, cases(only_valid=True), check, max_examples=200)


@st.composite
def device_check_cases(draw, device: str):
    """Three 2-D, non-empty tensors of dtypes the arguments take, values in and out of range."""
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 12)))
    r = chooser(draw)
    return Case(*(draw(args(r, name, shape, "torch", "values", device)) for name in NAMES), keywords=False)


def test_device_value_check_agrees_with_the_host_rules(enc, rng):
    # The check torch CUDA inputs get instead of the engine's host check: it must reject exactly
    # what the host path rejects, naming a bad argument, and pass on the same int32 values. Its
    # logic is device-independent, so with a CPU encoder it runs on CPU tensors; with a CUDA
    # encoder on CUDA tensors, and the call then takes the device path.
    def check(case):
        ids, mask, types = (a.value for a in case.args)
        probs = [(a.name, exc, rx) for a in case.args for exc, rx in a.problems]
        try:
            enc._check_device_values(ids, mask, types)
        except ValueError as e:
            TALLY["device check", "ValueError"] += 1
            assert probs, f"device check rejected a valid input: {e}\n{describe(case)}"
            assert any(first_named(str(e)) == n and re.search(rx, str(e)) for n, _, rx in probs), (str(e), probs)
            with pytest.raises(ValueError):  # and the forward rejects it too
                checked(enc, ids, mask, types)
            return
        TALLY["device check", "ran"] += 1
        assert not probs, f"device check accepted an input with problems {probs}\n{describe(case)}"
        checked(enc, ids, mask, types)  # and the forward accepts it too
        for a in case.args:
            on_engine = device_int32(a.value).cpu().numpy()
            np.testing.assert_array_equal(on_engine, tensor_to_numpy(a.name, a.value))
            np.testing.assert_array_equal(on_engine, a.ref.astype(np.int32))

    device = "cuda:0" if enc.device.startswith("cuda") else "cpu"
    run_property(rng, device_check_cases(device), check, max_examples=200)


# ---- the rules, one example each (what the properties above generalise) -------------------------
def _ids(shape=(2, 6)):
    return np.arange(int(np.prod(shape))).reshape(shape) % VOCAB


def _t(a):
    return torch.from_numpy(np.asarray(a))


# (id, make the keyword arguments): each runs, shaped and finite.
ACCEPTED = [
    ("bool-mask", lambda: dict(input_ids=_ids(), attention_mask=np.ones((2, 6), bool))),
    ("bool-types", lambda: dict(input_ids=_ids(), token_type_ids=np.ones((2, 6), bool))),
    ("float-mask-0-1", lambda: dict(input_ids=_ids(), attention_mask=np.array([[1.0] * 6, [1, 1, -0.0, 0, 0, 0]]))),
    ("uint64-ids", lambda: dict(input_ids=_ids().astype(np.uint64))),
    ("all-zero-mask-row",
     lambda: dict(input_ids=_ids().astype(np.uint8), attention_mask=np.array([[1] * 6, [0] * 6]))),
    ("list-ids", lambda: dict(input_ids=_ids().tolist(), attention_mask=np.ones((2, 6), np.int8))),
    ("uint16-tensor-bf16-mask",
     lambda: dict(input_ids=_t(_ids()).to(torch.uint16), attention_mask=torch.ones(2, 6, dtype=torch.bfloat16))),
    ("vocab-1", lambda: dict(input_ids=np.full((2, 6), VOCAB - 1))),
]

# (id, make the keyword arguments, exception, message pattern).
REJECTED = [
    ("bool-ids", lambda: dict(input_ids=_ids().astype(bool)), TypeError,
     r"^input_ids must hold integers, got dtype bool"),
    ("object-ids", lambda: dict(input_ids=_ids().astype(object)), TypeError,
     r"^input_ids must hold integers, got dtype object \(elements of type int"),
    ("none-mask", lambda: dict(input_ids=_ids(), attention_mask=np.full((2, 6), None)), TypeError,
     r"^attention_mask must hold .*got dtype object \(elements of type NoneType"),
    ("str-ids", lambda: dict(input_ids=_ids().astype(str)), TypeError, r"^input_ids must hold integers"),
    ("timedelta-ids", lambda: dict(input_ids=_ids().astype("m8[s]")), TypeError, r"^input_ids must hold integers"),
    ("float-types", lambda: dict(input_ids=_ids(), token_type_ids=np.zeros((2, 6), np.float32)), TypeError,
     r"^token_type_ids must hold"),
    ("complex-mask", lambda: dict(input_ids=_ids(), attention_mask=np.ones((2, 6), np.complex64)), TypeError,
     r"^attention_mask must hold"),
    ("mask-0.5", lambda: dict(input_ids=_ids(), attention_mask=np.full((2, 6), 0.5)), ValueError,
     r"^attention_mask must hold only 0 and 1, got 0.5"),
    ("mask-nan", lambda: dict(input_ids=_ids(), attention_mask=np.full((2, 6), np.nan)), ValueError,
     r"^attention_mask must hold only 0 and 1, got nan"),
    ("mask--1", lambda: dict(input_ids=_ids(), attention_mask=np.full((2, 6), -1)), ValueError,
     r"^attention_mask must hold only 0 and 1"),
    ("mask-2**40", lambda: dict(input_ids=_ids(), attention_mask=np.array([[1] * 5 + [2**40]] * 2)), ValueError,
     r"^attention_mask must hold only 0 and 1, got 1099511627776"),
    ("0-D", lambda: dict(input_ids=np.array(5)), ValueError, r"^input_ids must be 2-D \[batch, seq\], got shape \(\)"),
    ("1-D", lambda: dict(input_ids=_ids((6,))), ValueError, r"^input_ids must be 2-D.*add a batch dimension"),
    ("3-D", lambda: dict(input_ids=_ids((1, 2, 3))), ValueError, r"^input_ids must be 2-D"),
    ("ragged", lambda: dict(input_ids=[[1, 2, 3], [4, 5]]), ValueError, r"^input_ids is a ragged list"),
    ("empty-list", lambda: dict(input_ids=[]), ValueError, r"^input_ids must be 2-D"),
    ("empty-row", lambda: dict(input_ids=[[]]), ValueError, r"^empty input: input_ids has shape \(1, 0\)"),
    ("list-2**64", lambda: dict(input_ids=[[1, 2**64]]), ValueError,
     r"^input_ids holds 18446744073709551616, outside the int32 range"),
    ("list-2**63", lambda: dict(input_ids=[[1, 2**63]]), ValueError, r"^input_ids holds 9223372036854775808"),
    ("uint64-2**40", lambda: dict(input_ids=np.array([[1, 2**40]], np.uint64)), ValueError,
     r"^input_ids holds 1099511627776"),
    ("too-long", lambda: dict(input_ids=_ids((1, MAX_POS + 1))), ValueError,
     r"^input_ids has sequence length 65, which exceeds max_position_embeddings 64"),
    ("numpy-ids-torch-mask", lambda: dict(input_ids=_ids(), attention_mask=torch.ones(2, 6)), TypeError,
     r"^attention_mask is a torch tensor but input_ids is not"),
    ("torch-ids-list-types", lambda: dict(input_ids=_t(_ids()), token_type_ids=[[0] * 6] * 2), TypeError,
     r"^token_type_ids must be a torch tensor like input_ids"),
    ("meta-ids", lambda: dict(input_ids=torch.zeros(2, 6, dtype=torch.long, device="meta")), ValueError,
     r"^input_ids is on the meta device"),
    ("meta-mask", lambda: dict(input_ids=_t(_ids()), attention_mask=torch.ones(2, 6, device="meta")), ValueError,
     r"^attention_mask is on the meta device"),
    ("sparse", lambda: dict(input_ids=_t(_ids()).to_sparse()), TypeError, r"^input_ids must be a dense tensor"),
    ("nested", lambda: dict(input_ids=torch.nested.nested_tensor([torch.arange(3), torch.arange(2)])), ValueError,
     r"^input_ids is a nested \(ragged\) tensor"),
    ("string", lambda: dict(input_ids="hello"), TypeError, r"^input_ids must be a numpy array or torch tensor"),
]


@pytest.mark.parametrize("make", [m for _, m in ACCEPTED], ids=[i for i, _ in ACCEPTED])
def test_rules_accepted(enc, make):
    out = enc(**make())
    h = out.last_hidden_state
    h = h.numpy() if isinstance(h, torch.Tensor) else h
    assert h.shape == (2, 6, HIDDEN) and np.isfinite(h).all()


@pytest.mark.parametrize("make,exc,match", [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED])
def test_rules_rejected(enc, make, exc, match):
    with warnings.catch_warnings():  # "nested tensors are a prototype"
        warnings.simplefilter("ignore")
        kwargs = make()
    with pytest.raises(exc, match=match):
        enc(**kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="no CUDA GPU")
def test_tensors_on_other_devices_than_the_encoder(model_path):
    cpu = ftbert.Encoder.from_pretrained(model_path, device="cpu")
    gpu = ftbert.Encoder.from_pretrained(model_path, device="cuda")
    ids = torch.from_numpy(_ids())
    want = cpu(ids.numpy()).last_hidden_state
    # CUDA tensors to a CPU encoder, CPU tensors to a CUDA encoder: host copies, outputs where the inputs were.
    a = cpu(ids.cuda()).last_hidden_state
    b = gpu(ids).last_hidden_state
    assert a.device.type == "cuda" and b.device.type == "cpu"
    np.testing.assert_allclose(a.cpu().numpy(), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), gpu(ids.numpy()).last_hidden_state, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="^input_ids is on the meta device"):
        gpu(ids.to("meta"))
    # Arguments on different devices, either way round.
    with pytest.raises(ValueError, match=r"^attention_mask is on cpu but input_ids is on cuda:0"):
        gpu(ids.cuda(), torch.ones_like(ids))
    with pytest.raises(ValueError, match=r"^token_type_ids is on cuda:0 but input_ids is on cpu"):
        gpu(ids, None, torch.zeros_like(ids).cuda())
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match=r"^input_ids is on cuda:1 but the encoder runs on cuda:0"):
            gpu(ids.to("cuda:1"))
        c = cpu(ids.to("cuda:1")).last_hidden_state
        assert c.device == torch.device("cuda:1")


def case_count_lines() -> list[str]:
    """How many cases the properties above ran, by outcome: printed at the end of the session by
    tests/python/conftest.py's pytest_terminal_summary (no lines when no case ran)."""
    if not TALLY:
        return []
    elapsed = (FINISHED[0] or time.perf_counter()) - STARTED[0]
    lines = [f"[api properties] {sum(TALLY.values())} cases in {elapsed:.1f} s"]
    for prop in dict.fromkeys(p for p, _ in TALLY):
        counts = ", ".join(f"{TALLY[prop, o]} {o}" for o in ("ran", "ValueError", "TypeError") if TALLY[prop, o])
        lines.append(f"  {prop}: {counts}")
    return lines
