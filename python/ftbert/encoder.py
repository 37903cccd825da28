"""The Python face of the engine: `Encoder.from_pretrained(...)`, `enc(input_ids, ...)`, `enc.encode(texts)`.

Rules for inputs and outputs:
- Inputs are numpy arrays or torch tensors of integers, shaped [batch, seq] (lists are accepted too).
  Outputs come back in the same kind: numpy in -> numpy out, torch in -> torch out.
- torch tensors on the encoder's GPU run without host copies, on torch's current stream; outputs are
  torch tensors on that GPU in the encoder's dtype.
- torch tensors on the CPU given to a CUDA encoder (and numpy arrays) are copied to the GPU and the
  outputs copied back: torch CPU tensors (encoder dtype) or numpy arrays (float32; float16 for a float16
  encoder; a bfloat16 encoder's values widened to float32 exactly). A CPU encoder given CUDA tensors runs on copies and returns tensors on the inputs' GPU.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ._native import _C, ensure_cuda_libraries
from .inputs import (
    as_int_array, check_seq_length, check_shapes, check_tensor, check_values, device_int32,
    mask_message, ndim_message, staged_dtypes, tensor_to_numpy,
)
from .weights_tools import (MissingHead, is_converted, load_hf_checkpoint, locate_mlm_head, locate_projection,
                            read_converted, read_mlm_head, read_projection)
from .weights_tools.errors import ConversionError
from .weights_tools.extra_heads import PYLATE_SETTINGS, ColbertSettings, read_colbert_settings
from .weights_tools.schema import engine_config
from .weights_tools.layout import usable_seq_length
# text.py and cross_encoder.py take an Encoder and import this module for its type only.
from .cross_encoder import predict as predict_pairs
from .cross_encoder import rank as rank_documents
from .text import (DEFAULT_MAX_BATCH_TOKENS, PREFETCH, _cut, _in_background, _longest_first, _tokenize,
                   encode_texts, forward_packed_batch, pool_packed, tokenizer_lock, warm_up_token_counts)
from .tokenization import load_text_tokenizer, load_transformers_tokenizer

DTYPES = ("float32", "float16", "bfloat16")
# Forwards that may run at once, by device kind. The CPU backend's GEMMs and row loops already use
# every core, so a second forward would only compete for them.
DEFAULT_CONCURRENCY = {"cpu": 1, "cuda": 1}
MAX_CONCURRENCY = 64
# warm_up_batches records single-sequence batches up to this many tokens; longer ones spend far
# longer in their kernels than in launching them.
RECORDED_SINGLE_LENGTH = 512
NONFINITE = ("warn", "raise", "ignore")
ATTENTIONS = ("auto", "unfused", "flash")
QUANTIZATIONS = (None, "int8", "fp8")
# The outputs that run a head of their own after the encoder, in torch (encode_sparse,
# encode_multivector), and what each needs from the checkpoint.
SPARSE, MULTIVECTOR = "sparse", "multivector"
OUTPUT_HEADS = {SPARSE: "masked-LM head (encode_sparse)", MULTIVECTOR: "token projection (encode_multivector)"}
# encode_sparse's default chunk: as many tokens as keep one chunk's logits [tokens, vocab] within
# this many values (256 MiB in float32: 2,198 tokens of BERT's 30,522-word vocabulary, 268 of
# XLM-R's 250,002), at most SPARSE_CHUNK_MAX_TOKENS.
SPARSE_CHUNK_VALUES = 1 << 26
SPARSE_CHUNK_MAX_TOKENS = 4096


@dataclass
class EncoderOutput:
    last_hidden_state: Any  # [B, S, H]
    pooler_output: Any  # [B, H], or None when the checkpoint has no pooler
    # The task head's scores before any activation: [B, num_labels] (sequence classification) or
    # [B, S, num_labels] (token classification); None without a head.
    logits: Any = None


def _torch():
    import torch

    return torch


def _current_stream_handle(index: int) -> int:
    """The handle of torch's current CUDA stream on device `index`, which forwards are enqueued on.

    torch.cuda.current_stream() builds a Stream object per call (~5 us, a noticeable share of a
    batch-1 forward's host time); torch's own generated code reads the raw handle instead
    (torch._C._cuda_getCurrentRawStream), and so does this, falling back to the public call where
    that is missing."""
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream


def _parse_device(device: str) -> tuple[str, int]:
    device = str(device)
    if device == "cpu":
        return "cpu", 0
    if device == "cuda":
        return "cuda", 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return "cuda", int(device[5:])
    raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def _check_cuda_available(index: int) -> None:
    if not _C.cuda_backend_built():
        raise RuntimeError(
            "device='cuda' is not available: this build of ftbert has no CUDA backend "
            "(it was built on a machine without nvcc and cuBLAS); reinstall on a machine with the "
            "CUDA toolkit, or use device='cpu'"
        )
    ensure_cuda_libraries()


class Encoder:
    """A BERT-family encoder running on the ftbert engine."""

    def __init__(self, native: "_C.Encoder", config: dict, device: str, path: Path | None = None):
        self._native = native
        self._nonfinite = "warn"
        self._input_check = "async"
        self.config = config
        self.device = device
        self.path = path
        self._tokenizer = None
        self._text_tok = None
        # encode_sparse's masked-LM head and encode_multivector's projection, by OUTPUT_HEADS kind:
        # read from the checkpoint directory on first use, kept on the device in the encoder's dtype.
        self._heads: dict[str, Any] = {}
        self._heads_lock = threading.Lock()
        # Set by from_pretrained for a checkpoint loaded with a task (Jina-embeddings-v3's adapters).
        self.task: str | None = None
        self._task_instruction: str | None = None
        self._ignores_st_length: bool | None = None  # max_seq_length's PyLate case, looked up once
        # Read by every forward of CUDA tensors, so looked up once: at batch 1 the host's work
        # before the launch adds to the latency one for one (docs/performance.md, "Kernel choices").
        kind, index = _parse_device(device)
        self._cuda_index = index if kind == "cuda" else -1
        self._hidden = int(config["hidden_size"])
        self._packs_always = False  # whether every forward runs packed: _note_packing keeps it
        self._note_packing()
        self._batch_invariant_mode = bool(native.batch_invariant)  # from_pretrained sets its mode
        self._disentangled = config.get("disentangled") is not None  # DeBERTa
        self._out_dtype = None  # the torch dtype of outputs, once torch is imported

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        device: str = "cpu",
        dtype: str = "float32",
        attention: str = "auto",
        allow_tf32: bool = False,
        cuda_graphs: bool = True,
        concurrency: int | None = None,
        nonfinite: str = "warn",
        padding_free="auto",
        input_check: str = "async",
        warmup: bool | None = None,
        batch_invariant="auto",
        quantization: str | None = None,
        task: str | None = None,
    ) -> "Encoder":
        """Loads a HuggingFace checkpoint directory (a family of weights_tools/families.py, with its
        classification head if it has one) or an ftbert-converted one.

        device: "cpu", "cuda" or "cuda:N". dtype: "float32", "float16" or "bfloat16" (CPU: float32,
        and bfloat16 where the CPU has AVX512-BF16).
        attention: "auto", "unfused" or "flash" (see `Encoder.attention`). allow_tf32: let float32
        GEMMs use TF32 tensor cores on the GPU (faster, about 1e-3 relative error; off by default).
        cuda_graphs: replay repeated input shapes as CUDA graphs (see `Encoder.cuda_graphs`).
        concurrency: how many forwards may run at once (see `Encoder.concurrency`).
        nonfinite: what a NaN or Inf in the output does: "warn", "raise" or "ignore" (see
        `Encoder.nonfinite`). padding_free: "auto", True or False (see `Encoder.padding_free`).
        input_check: "async" or "sync", how the values of CUDA tensors are checked (see
        `Encoder.input_check`). warmup: run `warm_up()` before returning, so that the first calls
        do not pay the process's one-time costs; None (the default) warms a GPU encoder and not a
        CPU one, unless FTBERT_WARMUP says "1" or "0" for every load. batch_invariant: "auto"
        (the default), True or False: each sequence's outputs the same bits whatever it is batched
        with; "auto" turns it on where it runs on the fast kernels (see `Encoder.batch_invariant`).
        quantization: None, "int8" (CPU, float32 activations): the weight GEMMs on int8 weights
        per output channel and int8 activations per token, or "fp8" (a GPU of compute capability
        9.0 or later, float16/bfloat16 activations): the same on e4m3 (see `Encoder.quantization`).
        task: for a HuggingFace checkpoint with per-task LoRA adapters (Jina-embeddings-v3 as the hub
        holds it), the task whose adapters are merged into the weights once, here (one of its
        config.json's lora_adaptations); required for such a checkpoint, refused for any other.
        `encode` then puts the task's instruction (config.json's task_instructions) before each
        text, as the original code's encode(task=...) does (see `task_instruction`).
        """
        _check_bool("cuda_graphs", cuda_graphs)
        if warmup is not None:
            _check_bool("warmup", warmup)
        _check_batch_invariant(batch_invariant)
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantization!r}: expected None, 'int8' or 'fp8'")
        _check_padding_free(padding_free)
        _check_input_check(input_check)
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"model path {str(path)!r} does not exist")
        if not path.is_dir():
            raise ValueError(f"model path {str(path)!r} is not a directory")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}: expected one of {', '.join(ATTENTIONS)}")
        _check_nonfinite(nonfinite)
        kind, index = _parse_device(device)
        warm = _default_warmup(kind) if warmup is None else bool(warmup)
        if kind == "cpu" and (reason := _C.cpu_dtype_unsupported_reason(dtype)):
            raise ValueError(reason)
        if kind == "cuda":
            _check_cuda_available(index)
        if is_converted(path):
            if task is not None:
                # A converted directory's weights are fixed: any adapters were merged at conversion.
                raise ValueError(f"task={task!r}: {str(path)!r} is ftbert-converted; a task's adapters are "
                                 "merged when converting (ftbert convert SRC DST --task TASK)")
            config, tensors = read_converted(path)
        elif (path / "config.json").exists():
            config, tensors = load_hf_checkpoint(path, task=task)
        else:
            raise ValueError(
                f"{str(path)!r} is neither an ftbert-converted directory (ftbert_config.json) nor a "
                "HuggingFace checkpoint (config.json)"
            )
        weights = {name: _host_tensor(t) for name, t in tensors.items()}
        native = _C.Encoder(engine_config(config), weights, f"{kind}:{index}" if kind == "cuda" else "cpu",
                            dtype, quantization or "none")
        del weights, tensors
        native.attention = attention
        native.padding_free = padding_free
        native.graphs = bool(cuda_graphs)
        native.concurrency = _check_concurrency(DEFAULT_CONCURRENCY[kind] if concurrency is None else concurrency)
        if allow_tf32:
            native.set_allow_tf32(True)
        if quantization == "int8" and not _C.cpu_has_int8_dot_product():
            warnings.warn(
                f"quantization='int8' runs the {_C.cpu_int8_kernel()} kernel on this CPU (no "
                "AVX512-VNNI, or FTBERT_CPU_ISA below avx512_bf16): exact, but slower than float32 here",
                RuntimeWarning, stacklevel=2)
        enc = cls(native, config, f"{kind}:{index}" if kind == "cuda" else "cpu", path)
        enc._nonfinite = nonfinite
        enc._input_check = input_check
        enc.batch_invariant = batch_invariant
        if task is not None:
            enc.task = task
            enc._task_instruction = _task_instruction(path, task)
        if warm:
            enc.warm_up()
        return enc

    # ---- properties ------------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return self._native.dtype

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def head(self) -> str | None:
        """The task head that runs after the encoder: "sequence_classification" (logits per
        sequence, from token 0), "token_classification" (logits per token), or None."""
        head = self.config.get("head")
        return None if head is None else head["kind"]

    @property
    def num_labels(self) -> int | None:
        """The width of `logits` (None without a head)."""
        head = self.config.get("head")
        return None if head is None else int(head["num_labels"])

    @property
    def labels(self) -> list[str] | None:
        """The head's class names by id (the checkpoint's id2label), or None without a head."""
        head = self.config.get("head")
        return None if head is None else list(head["labels"])

    @property
    def attention(self) -> str:
        """"auto" (flash where supported and measured faster, else unfused), "unfused" or "flash"."""
        return self._native.attention

    @attention.setter
    def attention(self, mode: str) -> None:
        if mode not in ATTENTIONS:
            raise ValueError(f"unknown attention {mode!r}: expected one of {', '.join(ATTENTIONS)}")
        self._native.attention = mode
        self._apply_batch_invariant()

    def attention_for(self, batch: int, seq: int) -> str:
        """The attention kernel the selector runs for this shape: "flash" or "unfused"."""
        return self._native.attention_for(batch, seq)

    @property
    def input_check(self) -> str:
        """How the values of CUDA tensors given to a CUDA encoder are checked: "async" (default) or
        "sync". The rules are the same everywhere (input_ids < vocab_size, token_type_ids <
        type_vocab_size, attention_mask 0 or 1); host inputs are always checked at the call.

        "async": the kernel that copies the inputs into the engine's buffers checks them as it
        goes, and the call returns without waiting for the GPU. A bad value is computed as 0 (it
        never reads outside a table), and its ValueError (naming the argument and the value) is
        raised by the encoder's next forward, before that forward runs, or by
        `Encoder.synchronize()`. Forwards that wait anyway (nonfinite="raise", padding_free=True)
        raise it at once. Tensors of int32, int64, uint8 or bool are read as they are; other dtypes
        are checked as under "sync".
        "sync": a few reductions and one small read back (a wait for the GPU) before the forward;
        a bad value raises at the call itself.
        """
        return self._input_check

    @input_check.setter
    def input_check(self, mode: str) -> None:
        self._input_check = _check_input_check(mode)

    def synchronize(self) -> None:
        """Waits for this encoder's forwards on the GPU to finish, then raises the ValueError of a
        bad CUDA-tensor input value that an `input_check="async"` forward met, if any (see
        `Encoder.input_check`). A no-op on the CPU."""
        self._native.synchronize()
        self._raise_bad_input(earlier=False)

    def _raise_bad_input(self, earlier: bool) -> None:
        bad = self._native.take_bad_input()
        if bad is None:
            return
        name, value = bad
        if name == "attention_mask":
            message = mask_message(value)
        else:
            limit = "vocab_size" if name == "input_ids" else "type_vocab_size"
            message = f"{name} holds {value}, out of range for {limit} {self.config[limit]}"
        if earlier:
            message = (f"an earlier forward's inputs were bad: {message} (the values of CUDA tensors "
                       "are checked on the GPU without waiting for it; that forward computed 0 in "
                       "the bad value's place, and this call did not run; input_check='sync' raises "
                       "at the call itself)")
        raise ValueError(message)

    @property
    def padding_free(self):
        """Padding-free execution: only the attended tokens are computed, packed one sequence after
        another (every GEMM, LayerNorm and activation on [tokens, H]; attention per sequence), and
        the outputs are the same at every attended position, zeros at padding.

        "auto" (the default) packs a batch when at least 10% of its positions are padding. Host
        masks (numpy arrays, CPU tensors, or CUDA tensors given to a CPU encoder) are counted on
        the host; CUDA tensors given to a CUDA encoder are counted on the GPU with one small read
        back (a wait for the caller's stream up to the inputs), from 4,096 positions and 2
        sequences on, smaller ones staying padded. Auto stays padded too where packing would change
        a first-token output (a pooler or sequence head, with a sequence whose position 0 is padding:
        padded, that position is the first token, as in transformers; packed, the first real token
        is). True packs every batch (CUDA tensors: counted in the same read back as their value
        check), False none. A call given `padded=True` (`Encoder.__call__`) runs padded whatever
        this says, and changes it for no other call.
        """
        return self._native.padding_free

    @padding_free.setter
    def padding_free(self, mode) -> None:
        self._native.padding_free = _check_padding_free(mode)
        self._apply_batch_invariant()
        self._note_packing()

    @property
    def quantization(self) -> str | None:
        """How the weights are kept (set at load): None (in `dtype`), or "int8" on the CPU: each weight
        matrix's columns as int8 with a float32 scale each (symmetric, from the largest magnitude),
        each GEMM's input rows quantized likewise per token as the GEMM starts, the products summed
        exactly in int32 and scaled back, with the bias and activation, in float32. Embeddings,
        LayerNorms, attention, pooler and heads stay float32. Its error against float32 and its
        speed: docs/performance.md ("CPU int8").

        "fp8" on a GPU of compute capability 9.0 (Hopper) or later, in float16 or bfloat16: the
        layers' weight matrices in e4m3 with a float32 scale per output channel (max |w| / 448),
        each GEMM's input rows in e4m3 with a scale per token, computed as the GEMM starts; the
        products summed in fp32 by cuBLASLt, scaled back, bias and activation added (erf-GELU as
        its tanh form, within 4.7e-4), rounded once to `dtype`. Embeddings, LayerNorms, attention, pooler and heads stay 16-bit; a weight whose
        sides are not multiples of 16 stays 16-bit too. Its error and speed: docs/performance.md
        ("FP8 on the GPU")."""
        q = self._native.quantization
        return None if q == "none" else q

    @property
    def batch_invariant(self) -> bool:
        """Whether each sequence's outputs are bit-identical whatever it is batched with: the other
        sequences, its padding (amount and side), its place in the batch, padded or packed input,
        CUDA graphs, the thread and stream, and between processes on the same device and build.
        Set "auto" (the default of from_pretrained), True or False; this reads what forwards do now.

        "auto" turns it on where it runs on the fast kernels: a GPU encoder in float16 or bfloat16
        whose attention is not "unfused", whose `padding_free` is not False and, for a DeBERTa,
        whose attention computes the disentangled terms itself (head dim 64; what it costs, per
        family: docs/performance.md, "Batch invariance on the GPU"). Elsewhere auto leaves it off:
        float32, the unfused attention and DeBERTa's term tables (other head dims, or
        FTBERT_DEBERTA_TERM_TABLES=1) would run on an ordered kernel, correct but far slower;
        padding_free=False asks for padded forwards; the CPU's kernels are invariant either way.
        Auto follows later changes of `attention` and `padding_free`; True and False stay as set.

        On, every batch runs packed (a pooled or sequence-classification output is taken at each
        sequence's first real token even under left padding, where transformers takes the padding
        at position 0) and, on a GPU, on kernels whose bits never depend on the row count: GEMMs
        that never split k (each weight's reference kernel, or a faster one checked to give its
        bits), one LayerNorm form, one attention kernel per head dim; other products (float32, the
        unfused attention, DeBERTa's term tables) on an ordered kernel of plain fp32 FMAs (docs/api.md).
        Settable at any time; forwards that start after the change follow it.

        A call given `padded=True` (`Encoder.__call__`; encode_multivector's ColBERT queries whose
        [MASK] rows nobody attends to) runs padded even so, on the same kernels: the rows of masked
        positions exist only in a padded forward. Its sequences' bits still do not depend on the
        other sequences in the batch or their place there, for the same padded length and mask of
        their own (every op runs per row or per sequence on those kernels), but they are not a
        packed forward's bits, nor promised across padded lengths."""
        return self._native.batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, mode) -> None:
        self._batch_invariant_mode = _check_batch_invariant(mode)
        self._apply_batch_invariant()
        self._note_packing()

    def _apply_batch_invariant(self) -> None:
        """Sets the engine's switch from the mode ("auto" decides from the current settings)."""
        mode = self._batch_invariant_mode
        if mode == "auto":
            mode = (self._cuda_index >= 0 and self.dtype in ("float16", "bfloat16")
                    and self._native.attention != "unfused" and self._native.padding_free is not False
                    and (not self._disentangled or self._native.terms_in_attention))
        self._native.batch_invariant = bool(mode)

    def _note_packing(self) -> None:
        """Caches whether every forward needs the token count on the host (padding_free=True),
        which each forward of CUDA tensors reads; called by whatever changes the setting. Batch
        invariance packs every forward too, but the engine counts on the device or runs over every
        position (ForwardArgs::packed_over_all_rows)."""
        self._packs_always = self._native.padding_free is True

    def padding_free_for(self, batch: int, seq: int, tokens: int) -> bool:
        """Whether a host batch of `tokens` attended tokens in [batch, seq] (every sequence starting
        with a token) runs packed."""
        return self._native.padding_free_for(batch, seq, tokens)

    @property
    def cuda_graphs(self) -> bool:
        """Whether repeated input shapes replay as CUDA graphs (on by default; GPU only).

        The second forward of a (batch, seq) shape records the model's kernels as a CUDA graph; it
        and every later forward of that shape launch the graph instead of 8-12 kernels per layer,
        which cuts small batches' latency (BERT-base, batch 1 x 128 on an H100: 0.79 ms against
        1.38 ms). Outputs are the same, bit for bit. Up to 128 shapes
        are kept (least recently used first out); `recorded_shapes` says how many are held.
        Setting False frees them. On the CPU it changes nothing.
        """
        return self._native.graphs

    @cuda_graphs.setter
    def cuda_graphs(self, on: bool) -> None:
        _check_bool("cuda_graphs", on)
        self._native.graphs = bool(on)

    @property
    def concurrency(self) -> int:
        """How many forwards may run at once, each in a workspace of its own (settable).

        Any number of threads may call the encoder, each on its own CUDA stream or the same one;
        every result equals the one-at-a-time result. Up to `concurrency` forwards run at once,
        each with its own workspace, CUDA-graph cache, stream and cuBLAS handle (created when
        first needed); further callers wait for one to free up. With 1, forwards from different
        streams run one after the other on the GPU. Each extra workspace costs device memory: it
        grows to the largest batch x seq it has run.
        """
        return self._native.concurrency

    @concurrency.setter
    def concurrency(self, n: int) -> None:
        self._native.concurrency = _check_concurrency(n)

    @property
    def nonfinite(self) -> str:
        """What a NaN or Inf in `last_hidden_state` does: "warn" (default), "raise" or "ignore".

        The last LayerNorm kernel flags a non-finite output as it writes it (no extra pass).
        Outputs on the host (numpy, CPU tensors) are checked for each forward: "warn" emits a
        RuntimeWarning, "raise" raises `ftbert.NonFiniteError` (outputs are lost). Outputs left
        on the GPU are not waited for: "warn" reports the flag at a later forward, once the GPU
        has set it; "raise" waits for each forward to finish (a sync) and raises at once. float16
        activations overflow past 65504; the message names bfloat16 as the remedy.
        """
        return self._nonfinite

    @nonfinite.setter
    def nonfinite(self, mode: str) -> None:
        self._nonfinite = _check_nonfinite(mode)

    @property
    def recorded_shapes(self) -> int:
        """How many input shapes have a recorded CUDA graph now (see `cuda_graphs`)."""
        return self._native.recorded_shapes

    @property
    def graph_counts(self) -> dict[str, int]:
        """The forwards run with `cuda_graphs` on, since the encoder was made, by what each did:
        {"replayed": a held recording, "recorded": a new one (a shape's second forward, which
        also runs it), "op_by_op": a shape's first forward, or none could be recorded}. Traffic
        whose shapes rarely repeat shows few replays and many recordings. All 0 on the CPU."""
        replayed, recorded, op_by_op = self._native.graph_counts
        return {"replayed": replayed, "recorded": recorded, "op_by_op": op_by_op}

    @property
    def workspace_bytes(self) -> int:
        return self._native.workspace_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of device (or, on the CPU, host) memory the weights take in the engine: each
        tensor in the layout it is kept in (compute dtype; e4m3 or int8 with their scales where
        `quantization` applies) and what the architecture derives from them at load."""
        return self._native.weight_bytes

    def wait_for_tuning(self) -> None:
        """Returns once the GEMM tuner has measured every shape this encoder's forwards have met
        so far, their picks in use (at once on the CPU and in float32, where nothing is measured).
        The tuner times its candidates on the same GPU while forwards go on; a benchmark waits
        here after a first forward so that what it times is the forward a warmed-up server runs."""
        self._native.wait_for_tuning()

    def tune(self, max_tokens: int = 16384, progress=None) -> dict:
        """Measures the GEMM kernels of every token count from 512 to `max_tokens` now, rather than
        when forwards first meet them, and waits until the picks are in use and written to the
        cache (`FTBERT_CACHE_DIR`, default ~/.cache/ftbert), where later processes on the same GPU,
        driver and libraries find them. What `ftbert tune` runs. Only CUDA float16/bfloat16
        encoders under the measured GEMM choice (FTBERT_GEMM_CHOICE=auto, the default) measure
        anything. Returns the tuner's counters ("measured", "loaded", "cache_writes", "on_caller").
        progress(done, total), when given, is called after each forward.

        One padded forward per multiple of 128 tokens (full sequences of 128, or of the model's
        limit where that is shorter) reaches every row bucket of the choice; each forward runs at
        once with the fixed rule while the tuner measures its shapes on a thread of its own."""
        _check_positive_int("max_tokens", max_tokens)
        if not self.device.startswith("cuda") or self.dtype == "float32":
            return self.gemm_tuning  # one kernel per shape: nothing to measure
        seq = min(128, usable_seq_length(self.config))
        first = -(-512 // seq)  # fewer rows are never measured
        batches = list(range(first, max(first, max_tokens // seq) + 1))
        rng = np.random.default_rng(0)
        vocab = int(self.config["vocab_size"])
        for i, batch in enumerate(batches):
            ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int32)
            self(ids, np.ones_like(ids))
            if progress is not None:
                progress(i + 1, len(batches))
        self.wait_for_tuning()
        return dict(self._native.tuning_counters)

    def warm_up(self, max_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> None:
        """Pays a process's one-time costs now rather than in the first calls: packed forwards at
        every GEMM row bucket up to `max_tokens` tokens (four an octave: the kernels each size
        picks are set up on first use, and on a GPU CUDA loads them then), at each sequence length
        up to the model's limit (the attention kernels chosen by length), a padded one, and the
        pooling `encode` runs after them. The default covers `encode`'s batches. On the CPU, which
        loads no kernels, a small packed forward or two and the padded one.
        `from_pretrained` calls it for a GPU encoder by default, and `ftbert serve` for every
        encoder; what it saves is measured in
        docs/performance.md ("First calls"). The checkpoint's tokenizer.json is loaded and one
        text encoded; a tokenizer that fails to load is left for `encode` to report. A GPU's GEMM
        shapes met here are measured in the background as any forward's are (see `tune`)."""
        _check_positive_int("max_tokens", max_tokens)
        torch = _torch()
        limit = usable_seq_length(self.config)
        device = torch.device(self.device)
        pad = int(self.config.get("pad_token_id") or 0)

        def packed(tokens: int, seq: int) -> None:
            lengths = [seq] * (tokens // seq) + ([tokens % seq] if tokens % seq else [])
            cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            ids = torch.full((tokens,), pad, dtype=torch.int32, device=device)
            out = self.forward_packed(ids, cu)
            offsets = torch.from_numpy(cu).to(device)
            for pooling in ("mean", "cls"):
                pool_packed(out.last_hidden_state, None, offsets, pooling, True).cpu()

        if not self.device.startswith("cuda"):
            # The CPU loads no kernels: its one-time costs are the thread pool and the workspace.
            for tokens in sorted({min(16, max_tokens), min(256, max_tokens)}):
                packed(tokens, min(128, limit))
        else:
            for tokens in warm_up_token_counts(max_tokens):
                packed(tokens, min(128, limit))
            seq = 32
            while seq < limit:
                packed(min(max_tokens, 4 * seq), seq)
                seq *= 2
            packed(min(max_tokens, limit), min(max_tokens, limit))
        ids = torch.full((2, 16), pad, dtype=torch.int64, device=device)
        self(ids, torch.ones_like(ids)).last_hidden_state.cpu()
        if self.path is not None and (Path(self.path) / "tokenizer.json").is_file():
            try:
                with tokenizer_lock(self):
                    self._text_tokenizer()
            except Exception:  # encode raises it at its first use, where it matters
                return
            self.encode(["warm up"])  # the tokenizer's threads and encode's own first steps

    def warm_up_batches(self, max_tokens: int = DEFAULT_MAX_BATCH_TOKENS, max_sequences: int = 256,
                        max_length: int | None = None) -> int:
        """Readies this encoder, after `warm_up`, for the packed batches a server's batcher
        forms: at most `max_sequences` sequences of at most `max_length` tokens (default: the
        model's limit) whose count x longest is within `max_tokens`. What `ftbert serve` runs
        before it answers ready, so that its first requests pay nothing a shape's first forwards
        pay:
        - the workspace is grown once to what the largest such batch takes (at its recorded shape,
          `forward_packed`, under the fused attention), since growing it later drops every CUDA
          graph recorded before;
        - the GEMM tuner finishes the shapes met so far (`wait_for_tuning`): its new picks would
          drop them too;
        - with `cuda_graphs` on, the shape of every single-sequence batch up to
          RECORDED_SINGLE_LENGTH tokens that runs the fused attention (a power-of-two length and a
          bucket of rows: 14 shapes up to 512) is recorded, and each is replayed once to check
          that it is held.
        Batches of several sequences are recorded at their second meeting under traffic, as any
        shape is. On the CPU, where nothing is recorded, the workspace is grown to every such
        batch without running one (the pages it takes are touched then, not in the first large
        batch). Returns how many single-sequence shapes replayed at the check (all of them but
        where a recording cannot be made); 0 on the CPU or with `cuda_graphs` off."""
        _check_positive_int("max_tokens", max_tokens)
        _check_positive_int("max_sequences", max_sequences)
        model_limit = limit = usable_seq_length(self.config)
        if max_length is not None:
            _check_positive_int("max_length", max_length, " or None")
            limit = min(limit, max_length)
        if not self.device.startswith("cuda"):
            # Longest first: the workspace's largest buffers (rows, attention scratch) are then
            # taken once, and only the small per-sequence ones grow as the count does.
            for longest in range(limit, 0, -1):
                count = max(1, min(max_sequences, max_tokens // longest))
                self._native.reserve_workspace(count, longest, count * longest)
            return 0
        from .text import forward_packed_batch, pack_sequences

        torch = _torch()
        gpu = torch.device(self.device)
        pad = np.int32(self.config.get("pad_token_id") or 0)

        def run(lengths) -> None:
            batch = pack_sequences([np.full(n, pad, np.int32) for n in lengths], [None] * len(lengths))
            res, _ = forward_packed_batch(self, batch, gpu)
            torch.cuda.current_stream(gpu).synchronize()
            del res

        # The batcher takes a first input whatever its length, then more while count x longest fits.
        # The fused attention's batches run at their recorded shape: the largest ones (none larger
        # in every dimension) are run. The unfused one's run at their own: those with the most
        # sequences, positions and attention scores.
        largest: dict[tuple, int] = {}
        exact: dict[str, tuple[int, int]] = {}
        for longest in range(1, limit + 1):
            count = max(1, min(max_sequences, max_tokens // longest))
            largest[_C.recorded_packed_shape(count, longest, count * longest, model_limit)] = longest
            for key, size in (("sequences", count), ("positions", count * longest),
                              ("scores", count * longest * longest)):
                if size > exact.get(key, (0, 0))[0]:
                    exact[key] = (size, longest)
        front = [s for s in largest if not any(o != s and all(a >= b for a, b in zip(o, s)) for o in largest)]
        for longest in sorted({largest[s] for s in front} | {longest for _, longest in exact.values()}):
            run([longest] * max(1, min(max_sequences, max_tokens // longest)))
        self.wait_for_tuning()
        if not self.cuda_graphs:
            return 0

        singles: dict[tuple, int] = {}
        for length in range(1, min(limit, RECORDED_SINGLE_LENGTH) + 1):
            # The unfused attention runs each length at its own shape: too many to record them all.
            if self.attention_for(1, length) != "unfused":
                singles[_C.recorded_packed_shape(1, length, length, model_limit)] = length
        # Each shape's first forward runs op by op and meets its GEMM sizes: the tuner's picks for
        # them, which would drop what was recorded before, come before any recording.
        for length in singles.values():
            run([length])
        self.wait_for_tuning()
        held = 0
        for _ in range(3):  # picks that changed all the same dropped recordings: record again
            for length in singles.values():
                run([length])  # recorded here, or (dropped: seen afresh) at the next
                run([length])
            before = self.graph_counts["replayed"]
            for length in singles.values():
                run([length])
            held = self.graph_counts["replayed"] - before
            if held == len(singles):
                break
            self.wait_for_tuning()
        return held

    @property
    def gemm_tuning(self) -> dict:
        """The measured GEMM choice's counters for this process and device (see `tune`): shapes
        "measured" by the tuner, picks "loaded" from the cache file, "cache_writes", and
        "on_caller" (timings that ran on a forward's own thread: 0 by design). Empty on the CPU."""
        return dict(self._native.tuning_counters)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Encoder(layers={c['num_hidden_layers']}, hidden={c['hidden_size']}, "
            f"heads={c['num_attention_heads']}, device={self.device!r}, dtype={self.dtype!r}, "
            f"attention={self.attention!r})"
        )

    # ---- forward ---------------------------------------------------------------------------
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *, padded: bool = False) -> EncoderOutput:
        """Runs the encoder. See the module docstring for the input/output rules.

        padded: run this call padded whatever `padding_free` and `batch_invariant` say, so that
        every position's row is computed: a masked position's attends to the sequence's attended
        tokens, as in transformers (a packed forward gives zeros there). Other calls, on this
        thread or any other, keep the encoder's setting."""
        _check_bool("padded", padded)
        return self._forward(self._padded_inputs(input_ids, attention_mask, token_type_ids), bool(padded))

    def forward_packed(self, input_ids, cu_seqlens, token_type_ids=None) -> EncoderOutput:
        """Runs sequences given packed, one after another with no padding (FlashAttention's varlen
        convention): sequence b is input_ids[cu_seqlens[b]:cu_seqlens[b + 1]].

        input_ids, token_type_ids: [T] (numpy, a list, or torch tensors, on the encoder's GPU or the
        CPU); cu_seqlens: [B + 1] offsets, 0 first and T last, on the host (a list, numpy or a CPU
        tensor: the shapes of the work depend on it). Returns packed outputs: last_hidden_state
        [T, H] and token logits [T, N] in input order; pooler_output [B, H] and sequence logits
        [B, N] per sequence (an empty sequence's are those of a zero first token). Runs packed
        whatever `padding_free` says, on the inputs as they are: no padded batch is built. The
        values of CUDA tensors are checked as `input_check` says.
        """
        return self._forward(self._packed_inputs(input_ids, cu_seqlens, token_type_ids))

    def _padded_inputs(self, input_ids, attention_mask, token_type_ids) -> "_Inputs":
        """`__call__`'s arguments, checked, as the one forward takes them."""
        torch = _torch()
        if not isinstance(input_ids, torch.Tensor):
            ids = as_int_array("input_ids", input_ids)
            mask = np.ones_like(ids) if attention_mask is None else as_int_array("attention_mask", attention_mask)
            types = np.zeros_like(ids) if token_type_ids is None else as_int_array("token_type_ids", token_type_ids)
            check_shapes(ids.shape, mask.shape, types.shape)
            check_values(self.config, ids, mask, types)
            return _Inputs(ids, mask, types, None, _from_native_numpy)
        tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        for name, t in tensors.items():
            if t is not None:
                check_tensor(name, t)
        # get_device(): the CUDA index, -1 on the CPU, without building a torch.device (~1 us each).
        where = input_ids.get_device()
        for name, t in tensors.items():
            if t is not None and t.get_device() != where:
                raise ValueError(f"{name} is on {t.device} but input_ids is on {input_ids.device}")
        if input_ids.dim() != 2:
            raise ValueError(ndim_message("input_ids", tuple(input_ids.shape)))
        shape = tuple(input_ids.shape)
        mask, types = attention_mask, token_type_ids
        if mask is None:
            mask = torch.ones(shape, dtype=torch.int32, device=input_ids.device)
        if types is None:
            types = torch.zeros(shape, dtype=torch.int32, device=input_ids.device)
        check_shapes(shape, tuple(mask.shape), tuple(types.shape))
        if self._cuda_index >= 0 and where >= 0:
            if where != self._cuda_index:
                raise ValueError(
                    f"input_ids is on {input_ids.device} but the encoder runs on {self.device}: move the "
                    f"inputs there (.to({self.device!r})), or pass CPU tensors"
                )
            return _Inputs(input_ids, mask, types, None, None, on_device=True)
        ids, mask, types = (tensor_to_numpy(name, t) for name, t in
                            (("input_ids", input_ids), ("attention_mask", mask), ("token_type_ids", types)))
        check_shapes(ids.shape, mask.shape, types.shape)
        check_values(self.config, ids, mask, types)
        return _Inputs(ids, mask, types, None, _to_torch(input_ids.device))

    def _packed_inputs(self, input_ids, cu_seqlens, token_type_ids) -> "_Inputs":
        """forward_packed's arguments, checked, as the one forward takes them."""
        torch = _torch()
        cu = _host_offsets(cu_seqlens)
        is_torch = isinstance(input_ids, torch.Tensor)
        if is_torch:
            check_tensor("input_ids", input_ids)
            if token_type_ids is not None:
                check_tensor("token_type_ids", token_type_ids)
                if token_type_ids.device != input_ids.device:
                    raise ValueError(f"token_type_ids is on {token_type_ids.device} but input_ids is on "
                                     f"{input_ids.device}")
        else:
            input_ids = _packed_host_ids("input_ids", input_ids)
            if isinstance(token_type_ids, torch.Tensor):
                raise TypeError("token_type_ids is a torch tensor but input_ids is not: pass both as "
                                "torch tensors, or both as numpy arrays or lists")
            if token_type_ids is not None:
                token_type_ids = _packed_host_ids("token_type_ids", token_type_ids)
        if input_ids.ndim != 1:
            raise ValueError(f"input_ids must be 1-D [tokens] for forward_packed, got shape {tuple(input_ids.shape)}")
        T = int(input_ids.shape[0])
        if int(cu[-1]) != T:
            raise ValueError(f"cu_seqlens ends at {int(cu[-1])} but input_ids has {T} tokens")
        if token_type_ids is not None and tuple(token_type_ids.shape) != (T,):
            raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)}, expected ({T},) like input_ids")
        if T >= 2**31:
            raise ValueError(f"input_ids has {T} tokens: a packed forward takes fewer than 2**31")
        cu32 = cu.astype(np.int32)
        if is_torch and input_ids.device.type == "cuda":
            if self._cuda_index >= 0 and input_ids.get_device() == self._cuda_index:
                return _Inputs(input_ids, None, token_type_ids, cu32, None, on_device=True)
            raise ValueError(f"input_ids is on {input_ids.device} but the encoder runs on {self.device}")
        back = _from_native_numpy
        if is_torch:
            back = _to_torch(input_ids.device)
            input_ids = tensor_to_numpy("input_ids", input_ids[None])[0]
            if token_type_ids is not None:
                token_type_ids = tensor_to_numpy("token_type_ids", token_type_ids[None])[0]
        types = np.zeros(T, np.int32) if token_type_ids is None else token_type_ids
        inputs = _Inputs(input_ids, None, types, cu32, back)
        check_values(self.config, input_ids[None], None, types[None], seq=inputs.seq)
        return inputs

    def _forward(self, inputs: "_Inputs", padded: bool = False) -> EncoderOutput:
        """The one forward every entry reaches: host arrays through the engine's host entries, the
        results as the caller's kind (`inputs.back`); CUDA tensors through `_forward_on_device`.
        padded: the engine's per-call padded forward (padded inputs only)."""
        if inputs.on_device:
            return self._forward_on_device(inputs, padded)
        if inputs.packed:
            out = self._native.forward_packed_host(inputs.ids, inputs.types, inputs.cu_seqlens)
        else:
            out = self._native.forward_host(inputs.ids, inputs.mask, inputs.types, False, padded)
        hidden, pooled, logits, nonfinite, earlier = out
        self._report_nonfinite(nonfinite, earlier)
        return EncoderOutput(*(None if a is None else inputs.back(a) for a in (hidden, pooled, logits)))

    def _forward_on_device(self, inputs: "_Inputs", padded: bool = False) -> EncoderOutput:
        """CUDA tensors in, CUDA tensors out on the caller's stream. The engine stages and checks
        int32/int64/uint8/bool values itself (input_check="async"); padding_free=True needs the
        token count (unless the call runs `padded`), which the host-side check reads back with the
        values."""
        ids, mask, types, B, S = inputs.ids, inputs.mask, inputs.types, inputs.batch, inputs.seq
        if B == 0 or S == 0:
            raise ValueError(f"empty input: input_ids has shape {tuple(ids.shape)}")
        self._raise_bad_input(earlier=True)
        kinds = staged_dtypes()
        staged = (self._input_check == "async" and (inputs.packed or padded or not self._packs_always)
                  and all(t is None or t.dtype in kinds for t in (ids, mask, types)))
        tokens = -1  # not counted
        if staged:
            check_seq_length(self.config, S)
            ids, mask, types = (None if t is None else t.contiguous() for t in (ids, mask, types))
        else:
            if inputs.packed:
                T = ids.shape[0]
                check_values(self.config, ids[None], None,
                             ids.new_zeros(1).expand(1, T) if types is None else types[None], seq=S)
            else:
                tokens = self._check_device_values(ids, mask, types)
            ids, mask, types = (None if t is None else device_int32(t) for t in (ids, mask, types))
        hidden, pooled, logits = self._device_outputs(
            ids.device, B, S, packed_tokens=ids.shape[0] if inputs.packed else None)
        outputs = (hidden.data_ptr(), 0 if pooled is None else pooled.data_ptr(),
                   0 if logits is None else logits.data_ptr(), _current_stream_handle(self._cuda_index),
                   self._nonfinite == "raise")
        # Positional: keyword arguments cost the binding ~5 us a call.
        if inputs.packed:
            nonfinite, earlier = self._native.forward_packed_device(
                ids.data_ptr(), 0 if types is None else types.data_ptr(), inputs.cu_seqlens, *outputs,
                ids.element_size(), 4 if types is None else types.element_size())
        else:
            nonfinite, earlier = self._native.forward_device(
                ids.data_ptr(), mask.data_ptr(), types.data_ptr(), B, S, *outputs,
                tokens, False,  # tokens, packed_outputs
                ids.element_size(), mask.element_size(), types.element_size(), padded)
        if self._nonfinite == "raise":  # the forward has finished: its own bad values are known
            self._raise_bad_input(earlier=False)
        self._report_nonfinite(nonfinite, earlier)
        # The int32 copies were made on this same stream, so torch's allocator cannot hand their
        # memory to other work before the engine has read them.
        return EncoderOutput(hidden, pooled, logits)

    def _device_outputs(self, device, B: int, S: int, packed_tokens: int | None = None):
        """Empty output tensors on `device`: last_hidden_state [B, S, H] ([T, H] for packed_tokens
        T), pooler_output [B, H] or None, logits per sequence [B, N] or per token, or None."""
        torch = _torch()
        if self._out_dtype is None:
            self._out_dtype = getattr(torch, self.dtype)
        dtype, H = self._out_dtype, self._hidden
        per_token = (B, S) if packed_tokens is None else (packed_tokens,)
        hidden = torch.empty((*per_token, H), dtype=dtype, device=device)
        pooled = torch.empty((B, H), dtype=dtype, device=device) if self.config["has_pooler"] else None
        logits = None
        if self.head is not None:
            token_rows = per_token if self.head == "token_classification" else (B,)
            logits = torch.empty((*token_rows, self.num_labels), dtype=dtype, device=device)
        return hidden, pooled, logits

    def _report_nonfinite(self, now: bool, earlier: bool) -> None:
        if self._nonfinite == "ignore" or not (now or earlier):
            return
        what = "this forward's last_hidden_state" if now else "the last_hidden_state of a recent forward"
        if self.dtype == "float16":
            why = (
                "float16 activations overflowed (float16 ends at 65504); load the model with "
                "dtype='bfloat16', which has float32's range"
            )
        else:
            why = f"the checkpoint's weights or the inputs drive {self.dtype} activations out of range"
        message = f"{what} holds NaN or Inf: {why}"
        if self._nonfinite == "raise" and now:
            raise NonFiniteError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _check_device_values(self, ids, mask, types) -> int:
        """The value check of CUDA tensors; returns the attended tokens (read back with it, so
        padding_free=True packs them without a second wait)."""
        return check_values(self.config, ids, mask, types)

    # ---- text ------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        """The checkpoint's tokenizer (transformers' fast tokenizer), loaded on first use."""
        if self._tokenizer is None:
            if self.path is None:
                raise ValueError("this encoder was not loaded from a directory with a tokenizer")
            self._tokenizer = load_transformers_tokenizer(self.path)
        return self._tokenizer

    def _text_tokenizer(self):
        """What encode() tokenizes with: the checkpoint's tokenizer.json read directly where that
        gives transformers' ids (tokenization.py; milliseconds to load, no transformers import),
        else `tokenizer`. Loaded once; the caller holds tokenizer_lock (text.py)."""
        if self._text_tok is None:
            self._text_tok = load_text_tokenizer(self.path, self.max_seq_length) or self.tokenizer
        return self._text_tok

    @property
    def max_seq_length(self) -> int:
        """Truncation length for `encode`: the sentence-transformers setting, else the model's limit
        (max_position_embeddings; for RoBERTa-style position ids, max_position_embeddings -
        pad_token_id - 1: 512 for RoBERTa's 514). A PyLate ColBERT checkpoint's setting is not read:
        PyLate rewrites it on every call (query_length or document_length, less its marker) and
        saves whichever it set last, so it is no limit of the model."""
        limit = usable_seq_length(self.config)
        st = self.config.get("max_seq_length")
        if st and self._ignores_st_length is None:
            self._ignores_st_length = self.path is not None and _is_pylate_colbert(self.path)
        return min(int(st), limit) if st and not self._ignores_st_length else limit

    def encode(
        self,
        texts: str | Sequence[str],
        pooling: str | None = None,
        normalize: bool = True,
        batch_size: int = 256,
        max_batch_tokens: int = 16384,
        long_texts: str = "truncate",
        chunk_overlap: int = 32,
        prompt: str | None = None,
    ) -> np.ndarray:
        """Embeds texts (a list of str, or one str). Returns float32 numpy [N, H], row i for texts[i].

        The texts are tokenized without padding and truncated at `max_seq_length`, ordered longest
        first, and cut into batches of at most `batch_size` sequences and `max_batch_tokens` tokens,
        counted as sequences x the longest one (what the engine's workspace for the batch holds;
        the real token count is at most that). A text longer than `max_batch_tokens` runs alone.
        Each batch runs packed, as `forward_packed` does: only the real tokens are computed. A
        background thread tokenizes the next batches while a forward runs; it has ended when
        `encode` returns or raises.
        pooling: "mean" (over each text's tokens), "cls" (its first token) or "pooler" (the pooler
        output); default: what the checkpoint's sentence-transformers config says, else "mean".
        normalize: scale each row to unit L2 norm. Any number of threads may call it at once.
        long_texts: "truncate" (default) cuts a text at `max_seq_length`; "chunk" embeds a longer
        text in windows of that length (special tokens included) that share `chunk_overlap`
        tokens with the next, each pooled, combined by their mean weighted by each window's tokens,
        then normalized (the tokenizer runs before the first forward, not in the background).
        prompt: text put before each text, as sentence-transformers' encode(prompt=...) does. None
        (the default) puts `task_instruction` there, where the encoder was loaded with a task whose
        config.json has one; an explicit prompt wins over it ("" puts nothing).
        """
        if prompt is not None and not isinstance(prompt, str):
            raise TypeError(f"encode: prompt must be a str or None, got {type(prompt).__name__}")
        prompt = self._task_instruction if prompt is None else prompt
        if prompt:
            # Texts that are not str stay as they are, for encode_texts to name them.
            texts = [prompt + texts] if isinstance(texts, str) else [
                prompt + t if isinstance(t, str) else t for t in texts]
        return encode_texts(self, texts, pooling=pooling, normalize=normalize, batch_size=batch_size,
                            max_batch_tokens=max_batch_tokens, long_texts=long_texts,
                            chunk_overlap=chunk_overlap)

    @property
    def task_instruction(self) -> str | None:
        """What `encode` puts before each text unless given a prompt: the instruction of the task the
        encoder was loaded with (config.json's task_instructions[task], Jina-embeddings-v3's), or
        None (no task, or a checkpoint without task_instructions or with an empty one for it)."""
        return self._task_instruction

    def predict(self, pairs, batch_size: int = 32, activation="auto"):
        """Scores text pairs with the sequence-classification head, as sentence-transformers'
        `CrossEncoder.predict` does: float32 numpy, [N] for one label, else [N, num_labels].

        pairs: a list of (text, text) pairs (or one pair), tokenized as the checkpoint's tokenizer
        pairs them. activation: "auto" (the checkpoint's choice, else sigmoid for one label and
        none for more), "sigmoid", "softmax", "identity", None, or a callable on a torch tensor.
        """
        return predict_pairs(self, pairs, batch_size=batch_size, activation=activation)

    def rank(self, query: str, documents: Sequence[str], top_k: int | None = None,
             return_documents: bool = False, batch_size: int = 32, activation="auto") -> list[dict]:
        """Orders `documents` by their score against `query` (a one-label cross-encoder):
        [{"corpus_id": i, "score": s[, "text": documents[i]]}, ...], best first, `top_k` of them."""
        return rank_documents(self, query, documents, top_k=top_k, return_documents=return_documents,
                              batch_size=batch_size, activation=activation)

    # ---- sparse (SPLADE) and multi-vector (ColBERT) outputs ---------------------------------
    def encode_sparse(self, texts: str | Sequence[str], top_k: int | None = None, batch_size: int = 256,
                      max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
                      chunk_tokens: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """SPLADE sparse vectors of texts (a list of str, or one str), from a *ForMaskedLM
        checkpoint's masked-LM head: per text (indices int64 [n], values float32 [n]), the vocabulary
        entries of log(1 + relu(logits)) max-pooled over the text's tokens (special tokens included,
        as SPLADE pools the attended positions) that are not zero, sorted by index.

        top_k: keep the k largest values of each text (ties at the k-th broken by the lower index),
        still sorted by index. Tokenized, truncated and batched as `encode` (batch_size,
        max_batch_tokens). The head runs in torch on the encoder's device, in float32 for a float32
        encoder and in its dtype otherwise, on `chunk_tokens` tokens at a time (default: as many as
        keep a chunk's logits within 2**26 values, at most 4,096), with a running max per text in
        float32: no batch's [tokens, vocab] logits are ever held at once. The head is read from the
        HuggingFace directory on first use (weights_tools/mlm_head.py); a directory without one,
        or a converted one, raises `MissingHead` (a ValueError) saying what is missing."""
        top_k = _check_optional_count("encode_sparse: top_k", top_k)
        chunk_tokens = _check_optional_count("encode_sparse: chunk_tokens", chunk_tokens)
        self._output_head(SPARSE)  # a checkpoint without the head fails before any tokenizing
        return self._per_text(texts, "encode_sparse", batch_size, max_batch_tokens,
                              lambda hidden, cu: self.sparse_from_packed(hidden, cu, top_k, chunk_tokens))

    def encode_multivector(self, texts: str | Sequence[str], normalize: bool = True, batch_size: int = 256,
                           max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
                           is_query: bool = False) -> list[np.ndarray]:
        """ColBERT multi-vectors of texts (a list of str, or one str): per text a float32 array
        [n_tokens, dim], the final hidden state of each of its tokens (special tokens included)
        through the checkpoint's projection (colbert-ir's `linear.weight`, or the Dense module(s)
        modules.json names, as PyLate saves them), each row scaled to unit L2 norm (`normalize`).

        is_query: encode the texts as queries (True) or documents (False, the default), as the
        checkpoint's own implementation does (colbert-ir's queryFromText / docFromText, PyLate's
        encode(is_query=...)), with the settings its files hold (artifact.metadata, PyLate's
        config_sentence_transformers.json; weights_tools/extra_heads.py, ColbertSettings): the
        query or document marker token inserted after the first token, texts cut at
        query_maxlen / doc_maxlen; queries padded with [MASK] tokens up to query_maxlen, which
        the other tokens attend to only where the checkpoint says so (their rows are kept either
        way; unattended, they run in padded forwards of their own, `__call__`'s padded=True, under
        batch_invariant too); a document's skiplist tokens (colbert-ir's
        mask_punctuation, PyLate's skiplist_words) left out of its vectors. A checkpoint without
        such settings gets its texts as they are, tokenized, truncated and batched as `encode`
        (a warning, once, names what is missing).

        The projection runs in torch on the encoder's device (in its dtype; rows normalized in
        float32); it is read from the HuggingFace directory on first use. A directory without one,
        or a converted one, raises `MissingHead` (a ValueError) saying what is missing."""
        _check_bool("normalize", normalize)
        _check_bool("is_query", is_query)
        self._output_head(MULTIVECTOR)
        colbert = self.colbert_inputs()
        if colbert is None:
            return self._per_text(texts, "encode_multivector", batch_size, max_batch_tokens,
                                  lambda hidden, cu: self.multivector_from_packed(hidden, cu, normalize))
        texts = _check_texts(texts, "encode_multivector")
        _check_batch_limits("encode_multivector", batch_size, max_batch_tokens)
        lock = tokenizer_lock(self)
        with lock:
            sequences = colbert.build(self.tokenizer, texts, bool(is_query))
        return self.multivector_from_sequences(sequences, normalize, batch_size, max_batch_tokens)

    def colbert_inputs(self) -> "ColbertInputs | None":
        """How encode_multivector prepares queries and documents for this checkpoint (its ColBERT
        settings), or None where it holds none (warned once)."""
        if self.path is None:
            return None
        return colbert_inputs_for(self.path, usable_seq_length(self.config))

    def multivector_from_sequences(self, sequences: Sequence["ColbertSequence"], normalize: bool = True,
                                   batch_size: int = 256,
                                   max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> list[np.ndarray]:
        """encode_multivector's rows of sequences built by `ColbertInputs.build`: those whose tokens
        all attend to each other in packed forwards (longest first, batched as encode), those with
        unattended [MASK] tokens in padded forwards (padded=True: whatever padding_free and
        batch_invariant say, other calls untouched) of at most batch_size sequences and
        max_batch_tokens positions; each sequence's `keep` rows."""
        _check_batch_limits("multivector_from_sequences", batch_size, max_batch_tokens)
        torch = _torch()
        gpu = torch.device(self.device) if self.device.startswith("cuda") else None
        out: list = [None] * len(sequences)
        packed = [i for i, s in enumerate(sequences) if s.attended == len(s.ids)]
        if packed:
            lengths = np.array([len(sequences[i].ids) for i in packed], dtype=np.int64)
            ids = np.concatenate([sequences[i].ids for i in packed]).astype(np.int32, copy=False)
            types = None
            if sequences[packed[0]].types is not None:
                types = np.concatenate([sequences[i].types for i in packed]).astype(np.int32, copy=False)
            whole = _longest_first(np.asarray(packed, dtype=np.int64), ids, types, lengths)
            for batch in _cut([whole], max_batch_tokens, batch_size):
                res, _ = forward_packed_batch(self, batch, gpu)
                rows = self.multivector_from_packed(res.last_hidden_state, batch.cu_seqlens, normalize)
                for i, row in zip(batch.index.tolist(), rows):
                    out[i] = row
        padded = [i for i, s in enumerate(sequences) if s.attended < len(s.ids)]
        if padded:
            for S in sorted({len(sequences[i].ids) for i in padded}):
                same = [i for i in padded if len(sequences[i].ids) == S]
                per = max(1, min(batch_size, max_batch_tokens // S))
                for start in range(0, len(same), per):
                    group = [sequences[i] for i in same[start : start + per]]
                    for i, row in zip(same[start : start + per], self._padded_rows(group, S, normalize, gpu)):
                        out[i] = row
        return [row if s.keep is None else row[s.keep] for row, s in zip(out, sequences)]

    def _padded_rows(self, group: list["ColbertSequence"], S: int, normalize: bool, gpu) -> list[np.ndarray]:
        """The projected rows of equally long sequences, run as one padded batch [B, S] whose mask
        holds each one's attended tokens: every row computed, masked ones attending to the others."""
        torch = _torch()
        ids = np.stack([s.ids for s in group]).astype(np.int32, copy=False)
        mask = (np.arange(S)[None, :] < np.array([s.attended for s in group])[:, None]).astype(np.int32)
        types = np.zeros_like(ids) if group[0].types is None else np.stack([s.types for s in group]).astype(np.int32)
        if gpu is not None:  # CUDA tensors in: the hidden states stay on the GPU for the projection
            ids, mask, types = (torch.from_numpy(a).to(gpu) for a in (ids, mask, types))
        hidden = self(ids, mask, types, padded=True).last_hidden_state  # [B, S, H]
        cu = np.arange(len(group) + 1, dtype=np.int64) * S
        return self.multivector_from_packed(hidden.reshape(len(group) * S, self._hidden), cu, normalize)

    def sparse_from_packed(self, hidden, cu_seqlens, top_k: int | None = None,
                           chunk_tokens: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """encode_sparse's rows from a packed forward's output: hidden [T, H] (`last_hidden_state`
        of `forward_packed`, numpy or torch), cu_seqlens [B + 1] host offsets. Returns B (indices,
        values) pairs."""
        top_k = _check_optional_count("top_k", top_k)
        chunk_tokens = _check_optional_count("chunk_tokens", chunk_tokens)
        head = self._output_head(SPARSE)
        hidden, cu = _packed_hidden(hidden, cu_seqlens, self._hidden)
        chunk = chunk_tokens or default_sparse_chunk(head.vocab_size)
        return _sparse_rows(_sparse_max(head, hidden, cu, chunk), top_k)

    def multivector_from_packed(self, hidden, cu_seqlens, normalize: bool = True) -> list[np.ndarray]:
        """encode_multivector's rows from a packed forward's output: hidden [T, H] (numpy or
        torch), cu_seqlens [B + 1] host offsets. Returns B float32 arrays [tokens of b, dim]."""
        head = self._output_head(MULTIVECTOR)
        hidden, cu = _packed_hidden(hidden, cu_seqlens, self._hidden)
        torch = _torch()
        with torch.inference_mode():
            out = head(hidden).float()  # [T, dim]
            if normalize:
                out = torch.nn.functional.normalize(out, p=2, dim=1)
            return np.split(out.cpu().numpy(), cu[1:-1])

    def unavailable_reason(self, kind: str) -> str | None:
        """Why this encoder cannot give `kind` output ("sparse": encode_sparse, "multivector":
        encode_multivector), or None when it can: checked from the checkpoint's configs and weight
        file headers, nothing read or loaded (what `ftbert serve` answers a route with)."""
        if kind not in OUTPUT_HEADS:
            raise ValueError(f"unknown output kind {kind!r}: expected one of {', '.join(OUTPUT_HEADS)}")
        if kind in self._heads:
            return None
        if self.path is None:
            return f"this encoder was not loaded from a directory, so it has no {OUTPUT_HEADS[kind]}"
        try:
            (locate_mlm_head if kind == SPARSE else locate_projection)(self.path)
        except ValueError as e:  # MissingHead, ConversionError: the reason, as loading would raise it
            return str(e)
        return None

    def load_output_head(self, kind: str) -> None:
        """Reads the head of `kind` ("sparse", "multivector") now, as the first encode_sparse /
        encode_multivector would (`ftbert serve` does it at start); raises MissingHead without one."""
        if kind not in OUTPUT_HEADS:
            raise ValueError(f"unknown output kind {kind!r}: expected one of {', '.join(OUTPUT_HEADS)}")
        self._output_head(kind)

    def _output_head(self, kind: str):
        """The head of an OUTPUT_HEADS kind, read from the checkpoint directory once and kept on the
        device (_MlmHead, _Projection); raises MissingHead where the checkpoint has none."""
        head = self._heads.get(kind)
        if head is not None:
            return head
        with self._heads_lock:  # threads arriving together read it once
            head = self._heads.get(kind)
            if head is None:
                if self.path is None:
                    raise MissingHead(f"this encoder was not loaded from a directory, so it has no "
                                      f"{OUTPUT_HEADS[kind]}")
                torch = _torch()
                device, dtype = torch.device(self.device), getattr(torch, self.dtype)
                if kind == SPARSE:
                    head = _MlmHead(read_mlm_head(self.path), device, dtype)
                else:
                    head = _Projection(read_projection(self.path), device, dtype)
                self._heads[kind] = head
        return head

    def _per_text(self, texts, what: str, batch_size: int, max_batch_tokens: int, rows_of) -> list:
        """encode's pipeline (tokenize in the background, longest first, batches within the budget,
        packed forwards) with rows_of(last_hidden_state [T, H], cu_seqlens [B + 1] numpy) giving
        each batch's B results; returns them in the caller's order."""
        texts = _check_texts(texts, what)
        _check_batch_limits(what, batch_size, max_batch_tokens)
        lock = tokenizer_lock(self)
        with lock:
            tok = self._text_tokenizer()
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batches = _cut(_tokenize(tok, lock, texts, order, self.max_seq_length), max_batch_tokens, batch_size)
        gpu = _torch().device(self.device) if self.device.startswith("cuda") else None
        out: list = [None] * len(texts)
        with _in_background(batches, PREFETCH) as ready:
            for batch in ready:
                res, _ = forward_packed_batch(self, batch, gpu)
                for i, row in zip(batch.index.tolist(), rows_of(res.last_hidden_state, batch.cu_seqlens)):
                    out[i] = row
        return out


# ---- argument and input conversion helpers --------------------------------------------------
class NonFiniteError(FloatingPointError):
    """The encoder's output holds NaN or Inf (raised when `Encoder.nonfinite` is "raise")."""


@dataclass
class _Inputs:
    """One forward's inputs, checked: padded ([B, S] ids, mask, types) or packed ([T] ids and types,
    `cu_seqlens` [B + 1] int32 on the host, no mask); numpy arrays for the engine's host entries, or
    the caller's CUDA tensors (`on_device`). `back` turns a host output into the caller's kind."""
    ids: Any
    mask: Any
    types: Any
    cu_seqlens: np.ndarray | None
    back: Any
    on_device: bool = False

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def batch(self) -> int:
        return len(self.cu_seqlens) - 1 if self.packed else int(self.ids.shape[0])

    @property
    def seq(self) -> int:
        """The longest sequence (a packed batch's, at least 1)."""
        return max(1, int(np.diff(self.cu_seqlens).max())) if self.packed else int(self.ids.shape[1])


def _to_torch(device):
    """A host output as a torch tensor on `device` (the inputs' device)."""
    torch = _torch()

    def back(a: np.ndarray):
        # bfloat16 bits viewed as torch's bfloat16: no conversion pass. A torch CPU op over the
        # outputs would wake torch's intra-op threads, which then spin beside the engine's own
        # threads through the next forward (docs/performance.md, "bfloat16 with torch CPU tensors").
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 \
            else torch.from_numpy(a)
        return t if device.type == "cpu" else t.to(device)

    return back


def _check_nonfinite(mode) -> str:
    if mode not in NONFINITE:
        raise ValueError(f"unknown nonfinite {mode!r}: expected one of {', '.join(NONFINITE)}")
    return mode


def _check_input_check(mode):
    if mode not in ("async", "sync"):
        raise ValueError(f"input_check must be 'async' or 'sync', got {mode!r}")
    return mode


def _check_padding_free(mode):
    if isinstance(mode, (bool, np.bool_)):
        return bool(mode)
    if mode != "auto":
        raise ValueError(f"padding_free must be 'auto', True or False, got {mode!r}")
    return mode


def _packed_host_ids(name: str, value) -> np.ndarray:
    """A 1-D numpy array or flat list of ids -> int32 [T], checked as as_int_array checks rows."""
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, (list, tuple, np.ndarray)) for v in value):
            raise ValueError(f"{name} must be 1-D [tokens] for forward_packed, got a nested list")
        value = [list(value)]
    elif isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"{name} must be 1-D [tokens] for forward_packed, got shape {value.shape}")
        value = value[None, :]
    else:
        raise TypeError(f"{name} must be a numpy array, a list or a torch tensor, got {type(value).__name__}")
    return as_int_array(name, value)[0]


def _host_offsets(cu_seqlens) -> np.ndarray:
    """cu_seqlens (a list, numpy array or CPU tensor) -> int64 numpy offsets, checked."""
    torch = _torch()
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.device.type != "cpu":
            raise ValueError(
                f"cu_seqlens is on {cu_seqlens.device}: pass it on the host (a list, numpy array or CPU "
                "tensor), since the shapes of the work depend on it"
            )
        cu_seqlens = cu_seqlens.numpy()
    cu = np.asarray(cu_seqlens)
    if cu.dtype == object or not (np.issubdtype(cu.dtype, np.integer) or cu.dtype == bool) or cu.dtype == bool:
        raise TypeError(f"cu_seqlens must hold integers, got dtype {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries [B + 1], got shape {cu.shape}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu[0])}")
    if (np.diff(cu) < 0).any():
        raise ValueError("cu_seqlens must not decrease (sequence lengths are its differences)")
    return cu


def _check_concurrency(n) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"concurrency must be an integer, got {n!r}")
    if not 1 <= n <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be between 1 and {MAX_CONCURRENCY}, got {n}")
    return int(n)


def _default_warmup(kind: str) -> bool:
    """from_pretrained's warmup=None: FTBERT_WARMUP ("1" or "0") where set, else a GPU's first calls
    are warmed (their one-time costs are most of a first pass) and the CPU's, which load no
    kernels, are not."""
    value = os.environ.get("FTBERT_WARMUP", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"FTBERT_WARMUP must be '0' or '1' (or unset), got {value!r}")
    return value == "1" if value else kind == "cuda"


def _check_positive_int(name: str, value, or_else: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{or_else}, got {value!r}")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _check_batch_invariant(mode):
    """mode as stored: "auto", True or False (a TypeError names anything else)."""
    if isinstance(mode, str) and mode == "auto":
        return "auto"
    if isinstance(mode, (bool, np.bool_)):
        return bool(mode)
    raise TypeError(f'batch_invariant must be "auto", True or False, got {mode!r}')


def _from_native_numpy(a: np.ndarray) -> np.ndarray:
    # bfloat16 comes back as its bits (numpy has no bfloat16): widen to float32 exactly.
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def _host_tensor(t) -> tuple[np.ndarray, str]:
    """A torch tensor from the weight reader -> (numpy array, stored dtype name) for the engine."""
    torch = _torch()
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    if t.dtype == torch.float16:
        return t.numpy(), "float16"
    if t.dtype == torch.float32:
        return t.numpy(), "float32"
    raise ValueError(f"weights: unsupported tensor dtype {t.dtype}")


# ---- prompts and ColBERT's inputs ----------------------------------------------------------------
def _task_instruction(path: Path, task: str) -> str | None:
    """config.json's task_instructions[task] (what Jina-embeddings-v3's encode(task=...) puts before
    each text), None where there is none or it is empty."""
    cfg_path = Path(path) / "config.json"
    try:
        raw = json.loads(cfg_path.read_text("utf-8"))
    except (OSError, ValueError):  # load_hf_checkpoint has read it already: not reached in practice
        return None
    instructions = raw.get("task_instructions") if isinstance(raw, dict) else None
    if instructions is None:
        return None
    if not isinstance(instructions, dict) or not all(isinstance(v, str) for v in instructions.values()):
        raise ConversionError(f"{cfg_path}: task_instructions must map task names to strings")
    return instructions.get(task) or None


def _is_pylate_colbert(path: Path) -> bool:
    """Whether config_sentence_transformers.json holds PyLate's ColBERT settings."""
    try:
        raw = json.loads((Path(path) / PYLATE_SETTINGS).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and ("query_prefix" in raw or "document_prefix" in raw)


@dataclass
class ColbertSequence:
    """One text as a ColBERT checkpoint's own implementation gives it to the encoder."""

    ids: np.ndarray  # int32 [L]
    types: np.ndarray | None  # int32 [L], or None where the tokenizer gives none
    # The first `attended` tokens attend to one another; the rest (a query's [MASK] padding that
    # the checkpoint does not attend to) attend to those and are attended by none.
    attended: int
    keep: np.ndarray | None  # bool [L]: the tokens whose vectors are returned; None: all


class ColbertInputTooLong(ValueError):
    """A text longer than the query or document length, where truncation was refused."""

    def __init__(self, index: int, tokens: int, limit: int):
        self.index, self.tokens, self.limit = index, tokens, limit
        super().__init__(f"texts[{index}] has {tokens} tokens, more than the {limit} ColBERT takes")


class ColbertInputs:
    """The queries and documents of one ColBERT checkpoint (its ColbertSettings) as token ids, built
    as its implementation builds them: colbert-ir's QueryTokenizer / DocTokenizer.tensorize and
    ColBERT.query / doc (colbert/modeling/), PyLate's ColBERT.tokenize and encode
    (pylate/models/colbert.py). One per checkpoint directory and process (colbert_inputs_for);
    build holds no lock of its own: its callers hold the tokenizer's lock (threads that build first
    at once may each look the ids up, the same ones)."""

    def __init__(self, settings: ColbertSettings, limit: int):
        s = settings
        for key, length in (("query", s.query_length), ("document", s.document_length)):
            if length > limit:
                raise ConversionError(f"{s.source}: the {key} length {length} is more than the model's {limit} "
                                      "positions")
            if length < 3:
                raise ConversionError(f"{s.source}: the {key} length {length} leaves no room for a text")
        self.settings = s
        self._resolved = None  # (marker id by is_query, mask id, skiplist ids): the tokenizer's, on first build

    def _resolve(self, tok):
        s = self.settings
        vocab = tok.get_vocab()
        names = ({True: "query_token_id", False: "doc_token_id"} if s.layout == "colbert-ir"
                 else {True: "query_prefix", False: "document_prefix"})
        markers = {}
        for is_query, token in ((True, s.query_marker), (False, s.document_marker)):
            if token is not None and token not in vocab:
                # PyLate would add it as a new token with a new, untrained embedding row.
                raise ValueError(f"{s.source}: {names[is_query]} {token!r} is not a token of the checkpoint's "
                                 "tokenizer, so it cannot be inserted as the marker")
            markers[is_query] = None if token is None else int(vocab[token])
        mask = tok.mask_token_id
        if s.query_expansion and mask is None:
            raise ValueError(f"{s.source}: queries are padded with the mask token, but the checkpoint's tokenizer "
                             "has none")
        skip = set()
        for word in s.skiplist:
            if s.skiplist_by_first_piece:
                pieces = tok.encode(word, add_special_tokens=False)
                if pieces:
                    skip.add(int(pieces[0]))
            else:
                token_id = tok.convert_tokens_to_ids(word)
                if token_id is not None:
                    skip.add(int(token_id))
        self._resolved = (markers, mask, np.array(sorted(skip), dtype=np.int64))

    def build(self, tok, texts: list[str], is_query: bool, truncate: bool = True,
              side: str = "right") -> list[ColbertSequence]:
        """The texts as queries or documents, tokenized by `tok` (the checkpoint's transformers
        tokenizer; the caller holds its lock). truncate=False raises ColbertInputTooLong for a text
        past the length instead of cutting it; side "left" cuts a text's start."""
        if self._resolved is None:
            self._resolve(tok)
        markers, mask_id, skip = self._resolved
        s = self.settings
        marker = markers[is_query]
        length = s.query_length if is_query else s.document_length
        room = length - 1 if marker is not None else length  # the marker goes in after truncation
        if s.strip:
            texts = [t.strip() for t in texts]
        if s.lowercase:
            texts = [t.lower() for t in texts]
        options = {"truncation": True, "max_length": room} if truncate else {}
        before = getattr(tok, "truncation_side", "right")
        if side != before:
            tok.truncation_side = side
        try:
            encoded = tok(texts, return_attention_mask=False, **options)
        finally:
            if side != before:
                tok.truncation_side = before
        all_types = encoded.get("token_type_ids")
        out = []
        for i, ids in enumerate(encoded["input_ids"]):
            if len(ids) > room:
                raise ColbertInputTooLong(i, len(ids), room)
            types = None if all_types is None else list(all_types[i])
            if marker is not None:  # after the first token ([CLS]), of token type 0
                ids = [*ids[:1], marker, *ids[1:]]
                types = None if types is None else [*types[:1], 0, *types[1:]]
            attended = len(ids)
            if is_query and s.query_expansion:
                pad = length - len(ids)
                ids = [*ids, *[mask_id] * pad]
                types = None if types is None else [*types, *[0] * pad]
                if s.attend_to_expansion:
                    attended = length
            ids = np.asarray(ids, dtype=np.int32)
            keep = None
            if not is_query and len(skip):
                keep = ~np.isin(ids, skip)
            out.append(ColbertSequence(ids, None if types is None else np.asarray(types, dtype=np.int32),
                                       attended, keep))
        return out


_COLBERT_INPUTS: dict[str, "ColbertInputs | None"] = {}
_COLBERT_INPUTS_LOCK = threading.Lock()


def colbert_inputs_for(path, limit: int) -> ColbertInputs | None:
    """The ColbertInputs of the checkpoint at `path` (read once per process), or None where it holds
    no ColBERT settings: a UserWarning, the first time, says what is missing and that texts then go
    in as they are. `limit`: the model's usable length."""
    key = str(Path(path).resolve())
    with _COLBERT_INPUTS_LOCK:
        if key in _COLBERT_INPUTS:
            return _COLBERT_INPUTS[key]
        settings, missing = read_colbert_settings(path)
        inputs = None if settings is None else ColbertInputs(settings, limit)
        _COLBERT_INPUTS[key] = inputs
    if inputs is None:
        warnings.warn(f"encode_multivector: no ColBERT settings, so no query or document marker is inserted, "
                      f"no query is padded with [MASK] and texts go in as they are: {missing}",
                      UserWarning, stacklevel=4)
    return inputs


# ---- the output heads (encode_sparse, encode_multivector), run in torch ----------------------
def _check_texts(texts, what: str) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError(f"{what}: no texts given")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{what}: texts[{i}] is {type(t).__name__}, expected str")
    return texts


def _check_batch_limits(what: str, batch_size, max_batch_tokens) -> None:
    for name, value in (("batch_size", batch_size), ("max_batch_tokens", max_batch_tokens)):
        if value is None:
            raise TypeError(f"{what}: {name} must be a positive integer, got None")
        _check_optional_count(f"{what}: {name}", value)


def _check_optional_count(name: str, value) -> int | None:
    """None, or a positive int (named `name` in the error)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer or None, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def default_sparse_chunk(vocab_size: int) -> int:
    """encode_sparse's tokens per chunk of the masked-LM head (see SPARSE_CHUNK_VALUES)."""
    return max(1, min(SPARSE_CHUNK_MAX_TOKENS, SPARSE_CHUNK_VALUES // max(1, vocab_size)))


def _packed_hidden(hidden, cu_seqlens, width: int):
    """(hidden as a torch tensor [T, H], cu_seqlens as int64 numpy [B + 1]), checked."""
    torch = _torch()
    hidden = torch.as_tensor(hidden)
    if isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = cu_seqlens.cpu().numpy()
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if hidden.dim() != 2 or hidden.shape[1] != width:
        raise ValueError(f"hidden must be [tokens, {width}] (a packed last_hidden_state), got {tuple(hidden.shape)}")
    if cu.ndim != 1 or len(cu) < 2 or cu[0] != 0 or cu[-1] != hidden.shape[0] or (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens must be [B + 1] non-decreasing offsets from 0 to {hidden.shape[0]} "
                         f"(hidden's tokens), got {cu.tolist()[:8]}")
    return hidden, cu


_TANH_GELU = lambda F, x: F.gelu(x, approximate="tanh")  # noqa: E731
# A head's activation by name (transformers' ACT2FN names, sentence-transformers' Dense's), on x.
_ACTIVATIONS_BY_NAME = {
    "gelu": lambda F, x: F.gelu(x),
    "gelu_python": lambda F, x: F.gelu(x),
    "gelu_new": _TANH_GELU,
    "gelu_pytorch_tanh": _TANH_GELU,
    "gelu_fast": _TANH_GELU,
    "quick_gelu": lambda F, x: x * (1.702 * x).sigmoid(),
    "relu": lambda F, x: F.relu(x),
    "silu": lambda F, x: F.silu(x),
    "swish": lambda F, x: F.silu(x),
    "tanh": lambda F, x: x.tanh(),
    "sigmoid": lambda F, x: x.sigmoid(),
    "identity": lambda F, x: x,
}


class _MlmHead:
    """A masked-LM head (weights_tools.mlm_head.MlmHead) on the encoder's device and in its dtype:
    logits [c, V] = decoder(LayerNorm(act(dense(x [c, H])))) + bias, as transformers computes them."""

    def __init__(self, head, device, dtype):
        put = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
        self.dense_weight, self.dense_bias = put(head.dense_weight), put(head.dense_bias)  # [E, H], [E]
        self.norm_weight, self.norm_bias = put(head.norm_weight), put(head.norm_bias)  # [E], [E]
        self.decoder_weight, self.decoder_bias = put(head.decoder_weight), put(head.decoder_bias)  # [V, E], [V]
        self.activation, self.eps, self.dtype = head.activation, head.eps, dtype
        self.vocab_size = head.vocab_size

    def logits(self, x):
        F = _torch().nn.functional
        x = _ACTIVATIONS_BY_NAME[self.activation](F, F.linear(x.to(self.dtype), self.dense_weight, self.dense_bias))
        x = F.layer_norm(x, self.norm_weight.shape, self.norm_weight, self.norm_bias, self.eps)
        return F.linear(x, self.decoder_weight, self.decoder_bias)


class _Projection:
    """A token projection (weights_tools.extra_heads.TokenProjection) on the encoder's device and in
    its dtype: x [T, H] -> [T, dim] through each layer's act(x @ W.T + b)."""

    def __init__(self, projection, device, dtype):
        self.layers = [(layer.weight.to(device=device, dtype=dtype),  # [out, in]
                        None if layer.bias is None else layer.bias.to(device=device, dtype=dtype),  # [out]
                        layer.activation) for layer in projection.layers]
        self.dtype, self.dim, self.source = dtype, projection.dim, projection.source

    def __call__(self, x):
        F = _torch().nn.functional
        x = x.to(self.dtype)
        for weight, bias, activation in self.layers:
            x = _ACTIVATIONS_BY_NAME[activation](F, F.linear(x, weight, bias))
        return x


def _sparse_max(head: _MlmHead, hidden, cu: np.ndarray, chunk: int):
    """SPLADE's pooling: max over each sequence's tokens of log(1 + relu(logits)), float32 [B, V] on
    the hidden states' device. hidden [T, H] packed, cu [B + 1] its offsets. The head runs on `chunk`
    tokens at a time; each chunk's per-sequence max (over the part of each sequence inside it) is
    folded into the running max, so at most [chunk, V] logits exist at once."""
    torch = _torch()
    B, T = len(cu) - 1, int(cu[-1])
    out = torch.zeros((B, head.vocab_size), dtype=torch.float32, device=hidden.device)
    starts, ends = cu[:-1], cu[1:]
    with torch.inference_mode():
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            # Each sequence's tokens inside [t0, t1): the first and last sequences may be cut.
            lengths = np.clip(ends, t0, t1) - np.clip(starts, t0, t1)
            inside = np.flatnonzero(lengths)
            b0, b1 = int(inside[0]), int(inside[-1]) + 1
            act = head.logits(hidden[t0:t1]).relu_().log1p_()  # [c, V], in the head's dtype
            # The max is exact in any dtype, so only the running max needs float32 for the output.
            part = torch.segment_reduce(act, "max", lengths=torch.as_tensor(lengths[b0:b1], device=act.device),
                                        unsafe=True, initial=0)  # [b1 - b0, V]; empty sequences 0
            out[b0:b1] = torch.maximum(out[b0:b1], part.float())
    return out


def _sparse_rows(pooled, top_k: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row of pooled [B, V] (float32, >= 0) as its non-zero (indices int64, values float32),
    sorted by index; with top_k, its k largest (keep_top_k)."""
    torch = _torch()
    B, V = pooled.shape
    if top_k is not None and top_k < V:
        # Cut on the device to what ties at the k-th value leave, so little crosses to the host.
        kth = pooled.topk(top_k, dim=1).values[:, -1:]
        pooled = torch.where(pooled >= kth, pooled, torch.zeros((), dtype=pooled.dtype, device=pooled.device))
    where = pooled.nonzero()  # [N, 2], row-major order: rows ascending, indices ascending in each
    values = pooled[where[:, 0], where[:, 1]].cpu().numpy()
    where = where.cpu().numpy()
    splits = np.cumsum(np.bincount(where[:, 0], minlength=B))[:-1]
    rows = [(i.astype(np.int64), v.astype(np.float32))
            for i, v in zip(np.split(where[:, 1], splits), np.split(values, splits))]
    return rows if top_k is None else [keep_top_k(i, v, top_k) for i, v in rows]


def keep_top_k(indices: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of a sparse row sorted by index (ties broken by the lower index), still
    sorted by index."""
    if len(values) <= k:
        return indices, values
    keep = np.sort(np.lexsort((indices, -values))[:k])
    return indices[keep], values[keep]
