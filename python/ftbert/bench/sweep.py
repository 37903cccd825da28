"""The sweep: device x (batch, seq) x dtype x engine, each timed on the same inputs, with its error
against a float32 reference next to its time. A configuration that fails is recorded and skipped.
"""

from __future__ import annotations

import contextlib
import gc

import torch

from .args import Options
from .models import Model, Peers, hf_attention, hf_peer, make_ftbert, weight_bytes
from .onnx import ONNX_ENGINES, OnnxPeers, make_onnx_fn
from .timing import summarize, time_interleaved

MIB = 1024 * 1024
MEM_SOURCE_FTBERT = ("enc.weight_bytes (as the engine keeps them, quantized or not) + enc.workspace_bytes + "
                     "torch.cuda.max_memory_allocated delta of the forward (outputs)")
MEM_SOURCE_TORCH = "parameter+buffer bytes + torch.cuda.max_memory_allocated delta of the forward"


def cpu_dtype_note(device: str, dtype: str) -> str | None:
    """Why ftbert's rows of `dtype` cannot run on `device` when it is the CPU (None when they can):
    the engine's own reason (float16; bfloat16 without AVX512-BF16)."""
    if device != "cpu":
        return None
    from .. import _C

    return _C.cpu_dtype_unsupported_reason(dtype) or None


def engine_list(opts: Options) -> list[str]:
    """Engine names of one configuration: ftbert-<attention> for each variant, then the peers."""
    out = []
    for e in opts.engines:
        out.extend(f"ftbert-{a}" for a in opts.attentions) if e == "ftbert" else out.append(e)
    return out


def make_inputs(config: dict, batch: int, seq: int, varlen_min: int | None, seed: int) -> dict:
    """Random ids, right-padded mask and zero token types on the CPU (int64), the same for every
    dtype and engine of this (batch, seq)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + batch * 4099 + seq)
    ids = torch.randint(0, int(config["vocab_size"]), (batch, seq), generator=g)
    mask = torch.ones((batch, seq), dtype=torch.int64)
    if varlen_min is not None:
        lengths = torch.randint(min(varlen_min, seq), seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)
        ids = ids * mask  # padding positions hold id 0, as a tokenizer's [PAD] would
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


class ProgressRun:
    """What the multi-part modes (--rerank, --varlen) share: notes said once, a progress task that
    counts their steps (`total()`), and the TF32 setting applied before the first step."""

    def __init__(self, opts: Options, progress=None):
        self.opts = opts
        self.progress = progress
        self.task = None
        self.rows: list[dict] = []
        self.checks: list[dict] = []
        self.notes = opts.notes
        self.interrupted = False

    def total(self) -> int:
        raise NotImplementedError

    def _start(self, name: str) -> None:
        if self.progress is not None:
            self.task = self.progress.add_task(name, total=self.total())
        if self.opts.allow_tf32:
            torch.backends.cuda.matmul.allow_tf32 = True

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _describe(self, what: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=what)

    def _advance(self) -> None:
        if self.progress is not None:
            self.progress.advance(self.task)


@contextlib.contextmanager
def on_device_stream(device: str):
    """GPU: makes `device` current and runs everything (inputs, engines, events) on one dedicated
    torch stream, as a serving process would. All work is then ordered on that one stream whatever
    an engine does with the legacy default stream (handle 0), which torch reports for its default."""
    if not device.startswith("cuda"):
        yield
        return
    with torch.cuda.device(torch.device(device)):
        with torch.cuda.stream(torch.cuda.Stream()):
            yield


@contextlib.contextmanager
def no_tf32():
    """The float32 reference is plain float32 even when --allow-tf32 is on for the engines."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def max_abs_error(out: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor) -> float:
    """max |out - ref| over the valid (mask == 1) positions of last_hidden_state [B, S, H]."""
    return float((out.float() - ref).abs()[valid].max())


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def _free(device: str, collect: bool = True) -> None:
    """Gives memory back: cached torch blocks, and with `collect` whatever a reference cycle (an
    exception's traceback holding tensors) keeps alive; gc is slow with torch loaded, so only then."""
    if collect:
        gc.collect()
    if device.startswith("cuda"):
        try:
            torch.cuda.empty_cache()
        except RuntimeError:  # a sticky CUDA error was already recorded by the row that caused it
            pass


def failed_row(e: Exception, device: str) -> dict:
    """The result row of a configuration that raised (out of memory, a CUDA or engine error): the
    error in one line, and memory given back, so the run goes on with the next configuration."""
    msg = _one_line(e)
    if isinstance(e, torch.cuda.OutOfMemoryError):
        msg = "out of memory: " + msg
    _free(device)
    return {"status": "failed", "error": msg}


class Sweep:
    def __init__(self, opts: Options, model: Model, progress=None):
        self.opts = opts
        self.model = model
        self.peers = Peers(model)
        self.progress = progress
        self.task = None
        self.rows: list[dict] = []
        self.interrupted = False
        self._flash_ok: dict[tuple[str, str], bool] = {}
        self._onnx: OnnxPeers | None = None

    def flash_supported(self, device: str, dtype: str) -> bool:
        """Whether the backend has flash attention for this dtype and the model's head size."""
        key = (device, dtype)
        if key not in self._flash_ok:
            from .. import _ops

            c = self.model.config
            head_dim = int(c["hidden_size"]) // int(c["num_attention_heads"])
            self._flash_ok[key] = bool(_ops.OpRunner(device).supports_attention("flash", dtype, head_dim))
        return self._flash_ok[key]

    def total(self) -> int:
        o = self.opts
        return len(o.devices) * len(o.batches) * len(o.seqs) * len(o.dtypes) * len(engine_list(o))

    def run(self) -> list[dict]:
        if self.progress is not None:
            self.task = self.progress.add_task("sweep", total=self.total())
        if self.opts.allow_tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
        try:
            with torch.inference_mode():
                for device in self.opts.devices:
                    self._run_device(device)
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            if self._onnx is not None:
                self._onnx.close()
        add_speedups(self.rows)
        return self.rows

    def _run_device(self, device: str) -> None:
        with on_device_stream(device):
            for batch in self.opts.batches:
                for seq in self.opts.seqs:
                    self._run_shape(device, batch, seq)
        self.peers.drop_device(device)
        _free(device)

    def _run_shape(self, device: str, batch: int, seq: int) -> None:
        cpu_inputs = make_inputs(self.model.config, batch, seq, self.opts.min_len, self.opts.seed)
        # transformers gets int64 (what its tokenizers return); ftbert gets int32, the engine's
        # input type, so no cast is timed on the zero-copy GPU path.
        hf_in = {k: v.to(device) for k, v in cpu_inputs.items()}
        ft_in = {k: v.to(device=device, dtype=torch.int32) for k, v in cpu_inputs.items()}
        valid = hf_in["attention_mask"].bool()
        tokens = int(cpu_inputs["attention_mask"].sum())
        ref, ref_error = None, None
        try:
            with no_tf32():
                ref_model = self.peers.get(device, "float32", "eager")
                ref = ref_model(**hf_in).last_hidden_state.float()
        except Exception as e:  # the reference failing must not stop the timings
            ref_error = _one_line(e)
            _free(device)
        for dtype in self.opts.dtypes:
            rows, ready = {}, {}
            for engine in engine_list(self.opts):
                if self.progress is not None:
                    what = f"{device} {dtype} b={batch} s={seq} {engine}"
                    self.progress.update(self.task, description=what)
                rows[engine] = {
                    "device": device, "dtype": dtype, "batch": batch, "seq": seq,
                    "varlen_min": self.opts.min_len, "tokens": tokens, "engine": engine,
                }
                prepared = self._prepare(engine, device, dtype, seq, ft_in, hf_in)
                if "status" in prepared:  # skipped, or failed while being built
                    rows[engine].update(prepared)
                    if self.progress is not None:
                        self.progress.advance(self.task)
                else:
                    ready[engine] = prepared
            # Every engine of the configuration timed in turn, round after round: drift on a
            # shared machine falls on all of them alike.
            errors: dict[str, Exception] = {}
            try:
                samples = time_interleaved(
                    {e: p["fn"] for e, p in ready.items()}, device, self.opts.warmup_for(device),
                    self.opts.iters_for(device), on_error=lambda name, e: errors.__setitem__(name, e))
            finally:
                if "hf-compile" in ready:
                    torch._dynamo.reset()
            for engine, prep in ready.items():
                row = rows[engine]
                if engine in errors:
                    row.update(failed_row(errors[engine], device))
                else:
                    row.update(self._finish(engine, device, dtype, batch, prep, samples[engine], hf_in))
                if row["status"] == "ok":
                    if ref is not None:
                        row["max_abs_err"] = max_abs_error(row.pop("_out"), ref, valid)
                    else:
                        row.pop("_out")
                        row["note"] = _join(row.get("note"), f"no reference: {ref_error}")
                if self.progress is not None:
                    self.progress.advance(self.task)
            del ready
            self.rows.extend(rows.values())
            if "hf-compile" in rows:
                _free(device, collect=False)
        del ref
        _free(device, collect=False)

    def _prepare(self, engine, device, dtype, seq, ft_in, hf_in) -> dict:
        """The engine built and ready: {"res": fields so far, "fn": one forward, "runner"}; or a
        finished row (status skipped or failed) when it cannot run here."""
        o = self.opts
        if engine.startswith("ftbert") and (why := cpu_dtype_note(device, dtype)):
            note = f"ftbert's {dtype} rows on cpu are skipped: {why}"
            if note not in o.notes:
                o.notes.append(note)
            return {"status": "skipped", "note": why}
        if engine in ONNX_ENGINES and (device != "cpu" or dtype != "float32"):
            return {"status": "skipped", "note": "onnxruntime rows run on the cpu in float32"}
        if engine == "ftbert-int8" and (device != "cpu" or dtype != "float32"):
            return {"status": "skipped", "note": "ftbert's int8 rows run on the cpu in float32"}
        if engine == "ftbert-fp8" and (device == "cpu" or dtype == "float32"):
            return {"status": "skipped", "note": "ftbert's fp8 rows run on a GPU in float16 or bfloat16"}
        try:
            res: dict = {}
            if engine in ("ftbert-int8", "ftbert-fp8"):
                from .. import _C

                quantization = engine.split("-")[1]
                runner = make_ftbert(self.model, device, dtype, "auto", o.allow_tf32, o.cuda_graphs,
                                     quantization=quantization)
                weights = (f"int8 weights ({_C.cpu_int8_kernel()})" if quantization == "int8"
                           else "fp8 e4m3 weights and activations")
                res["kernel"] = runner.attention_for(ft_in["input_ids"].shape[0], seq) + ", " + weights
                enc = runner
                ids, mask, types = ft_in["input_ids"], ft_in["attention_mask"], ft_in["token_type_ids"]

                def fn():
                    return enc(ids, mask, types).last_hidden_state
            elif engine.startswith("ftbert"):
                attention = engine.split("-", 1)[1]
                if attention == "flash" and not self.flash_supported(device, dtype):
                    c = self.model.config
                    head_dim = int(c["hidden_size"]) // int(c["num_attention_heads"])
                    note = f"flash attention is not supported on {device} in {dtype} at head size {head_dim}"
                    if note not in o.notes:
                        o.notes.append(note)
                    return {"status": "skipped", "note": note}
                runner = make_ftbert(self.model, device, dtype, attention, o.allow_tf32, o.cuda_graphs)
                res["kernel"] = runner.attention_for(ft_in["input_ids"].shape[0], seq)
                enc = runner

                ids, mask, types = ft_in["input_ids"], ft_in["attention_mask"], ft_in["token_type_ids"]

                def fn():
                    return enc(ids, mask, types).last_hidden_state
            elif engine in ONNX_ENGINES:
                runner = self.onnx_peers().session(engine, torch.get_num_threads())
                res["kernel"] = "fused (ORT BERT optimizer)" + (", int8 dynamic" if engine.endswith("int8") else "")
                fn = make_onnx_fn(runner, hf_in)
            else:
                runner = hf_peer(self.peers, self.model, engine, device, dtype, o.compile_mode, hf_in, res)
                model = runner

                def fn():
                    return model(**hf_in).last_hidden_state
            if engine.startswith("ftbert"):
                fn()  # the batch's GEMM shapes go to the tuner: timed once its picks are in use
                runner.wait_for_tuning()
            return {"res": res, "fn": fn, "runner": runner}
        except KeyboardInterrupt:
            raise
        except Exception as e:  # OOM, CUDA or engine errors: record this one, go on with the rest
            return failed_row(e, device)

    def onnx_peers(self) -> OnnxPeers:
        if self._onnx is None:
            self._onnx = OnnxPeers(self.model, self.peers.get("cpu", "float32", "eager"))
        return self._onnx

    def _finish(self, engine, device, dtype, batch, prep, samples, hf_in) -> dict:
        """The row's fields from its samples, and one more forward outside the timed loop: peak
        memory and the output for the error."""
        res, fn, runner = prep["res"], prep["fn"], prep["runner"]
        is_cuda = device.startswith("cuda")
        try:
            res.update(summarize(samples))
            if is_cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            out = fn()
            if is_cuda:
                torch.cuda.synchronize()
                delta = torch.cuda.max_memory_allocated() - base
                if engine.startswith("ftbert"):
                    weights = runner.weight_bytes  # the engine's own: quantized weights counted as kept
                    act = runner.workspace_bytes + delta
                    res["mem_source"] = MEM_SOURCE_FTBERT
                else:
                    weights = weight_bytes(self.peers.get(device, dtype, hf_attention(self.model, engine)))
                    act = delta
                    res["mem_source"] = MEM_SOURCE_TORCH
                res["weights_mib"] = weights / MIB
                res["act_mib"] = act / MIB
                res["peak_mib"] = (weights + act) / MIB
            med_s = res["median_ms"] / 1e3
            res["seq_per_s"] = batch / med_s
            res["tok_per_s"] = int(hf_in["attention_mask"].sum()) / med_s
            res["status"] = "ok"
            res["_out"] = out
            return res
        except KeyboardInterrupt:
            raise
        except Exception as e:
            return failed_row(e, device)


def _join(a: str | None, b: str) -> str:
    return b if not a else f"{a}; {b}"


def add_speedups(rows: list[dict]) -> None:
    """speedup_vs_sdpa = transformers-sdpa's median / this row's median, at the same configuration."""
    sdpa = {
        (r["device"], r["dtype"], r["batch"], r["seq"]): r["median_ms"]
        for r in rows
        if r["engine"] == "hf-sdpa" and r["status"] == "ok"
    }
    for r in rows:
        key = (r["device"], r["dtype"], r["batch"], r["seq"])
        if r["status"] == "ok" and key in sdpa:
            r["speedup_vs_sdpa"] = sdpa[key] / r["median_ms"]
