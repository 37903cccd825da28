"""ONNX Runtime as a CPU peer of `ftbert bench`: the same checkpoint exported to ONNX (torch's
exporter), fused by onnxruntime's BERT optimizer (EmbedLayerNormalization, Attention,
SkipLayerNormalization, BiasGelu), run in float32 (`onnxruntime`) and with int8 dynamic
quantization of its matrix products (`onnxruntime-int8`: per-channel weights, the embeddings
left in float32, as onnxruntime's own guidance gives its best accuracy).

Optional: `pip install 'ftbert[onnx]'`; without them the rows fail saying so. The
export and optimization run once per model and live in a temporary directory for the run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings

import numpy as np
import torch

ONNX_ENGINES = ("onnxruntime", "onnxruntime-int8")
INSTALL_HINT = "pip install 'ftbert[onnx]'"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


class _LastHidden(torch.nn.Module):
    """The transformers model with positional inputs and last_hidden_state out, for the export."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state


class OnnxPeers:
    """onnxruntime sessions of one model (float32 optimized, int8), built on first use and kept."""

    def __init__(self, model, hf_float32):
        self.model = model
        self._hf = hf_float32  # a float32 CPU transformers model with the model's weights
        self._dir: str | None = None
        self._stack = contextlib.ExitStack()
        self._files: dict[str, str] = {}
        self._sessions: dict[tuple[str, int], object] = {}

    def close(self) -> None:
        self._sessions.clear()
        self._stack.close()

    def _path(self, engine: str) -> str:
        if engine in self._files:
            return self._files[engine]
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401  (torch's exporter needs it)
            from onnxruntime.transformers import optimizer
        except ImportError:
            raise RuntimeError(f"{engine} needs onnxruntime: {INSTALL_HINT}") from None
        if self._dir is None:
            self._dir = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="ftbert-onnx-"))
        if "onnxruntime" not in self._files:
            raw = os.path.join(self._dir, "model.onnx")
            ids = torch.zeros((2, 8), dtype=torch.int64)
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # torch.export's exporter: the older TorchScript one traces transformers 5's mask
                # code wrongly (outputs off by >1 at every shape tried).
                # Three distinct tensors: the exporter merges inputs given as one tensor.
                torch.onnx.export(_LastHidden(self._hf).eval(),
                                  (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                                  raw, input_names=list(INPUT_NAMES),
                                  output_names=["last_hidden_state"],
                                  dynamic_shapes=({0: batch, 1: seq},) * 3, dynamo=True,
                                  verbose=False)
            c = self.model.config
            opt = optimizer.optimize_model(raw, model_type="bert",
                                           num_heads=int(c["num_attention_heads"]),
                                           hidden_size=int(c["hidden_size"]), opt_level=0)
            fused = os.path.join(self._dir, "optimized.onnx")
            opt.save_model_to_file(fused)
            self._files["onnxruntime"] = fused
        if engine == "onnxruntime-int8":
            from onnx import TensorProto
            from onnxruntime.quantization import QuantType, quantize_dynamic

            q = os.path.join(self._dir, "int8.onnx")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # The fused graph's contrib ops have no inferred types: say they are float.
                quantize_dynamic(self._files["onnxruntime"], q, weight_type=QuantType.QInt8,
                                 per_channel=True, op_types_to_quantize=["MatMul", "Attention"],
                                 extra_options={"DefaultTensorType": TensorProto.FLOAT})
            self._files[engine] = q
        return self._files[engine]

    def session(self, engine: str, threads: int):
        key = (engine, threads)
        if key not in self._sessions:
            path = self._path(engine)  # says what to install when onnxruntime is missing
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            self._sessions[key] = ort.InferenceSession(path, so,
                                                       providers=["CPUExecutionProvider"])
        return self._sessions[key]


def make_onnx_fn(session, inputs: dict):
    """fn() -> last_hidden_state as a torch tensor, from int64 CPU inputs."""
    feed = {k: np.ascontiguousarray(inputs[k].cpu().numpy().astype(np.int64)) for k in INPUT_NAMES}

    def fn():
        return torch.from_numpy(session.run(None, feed)[0])

    return fn
