"""Task heads on the GPU against transformers' task models in float32 on the CPU: every family's
sequence and token head in float32, float16 and bfloat16, unfused and flash attention, with CUDA
graphs replaying repeated shapes and without (GPU only; skipped without one)."""

import numpy as np
import pytest
import torch

import ftbert
from tests._models import make_model, model_class, widen_head
from tests._util import ragged_mask

# no_tf32: the half-precision peers run on the GPU: their matmuls must not fall back to TF32 either.
pytestmark = [
    pytest.mark.skipif(not ftbert.cuda_available(), reason="needs an NVIDIA GPU and a CUDA build"),
    pytest.mark.usefixtures("no_tf32"),
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HEADS = {"cls": "sequence_classification", "token": "token_classification"}

# name -> make_model arguments: every family with both heads, head dims 32 and 64 (so flash runs),
# odd intermediate sizes, 1, 3 and 5 labels; ELECTRA with and without its projection.
CASES = {
    "bert-cls": dict(family="bert", kind="cls", hidden=64, heads=2, layers=2, num_labels=3, seed=61),
    "bert-token": dict(family="bert", kind="token", hidden=128, heads=2, layers=1, num_labels=5, seed=62),
    "roberta-cls": dict(family="roberta", kind="cls", hidden=128, heads=2, layers=2, num_labels=1, seed=63),
    "roberta-token": dict(family="roberta", kind="token", hidden=64, heads=2, layers=1, num_labels=3, seed=64),
    "xlm-roberta-cls": dict(family="xlm-roberta", kind="cls", hidden=64, heads=2, layers=1, num_labels=5,
                            act="gelu_new", seed=65),
    "xlm-roberta-token": dict(family="xlm-roberta", kind="token", hidden=128, heads=4, layers=2,
                              num_labels=1, seed=66),
    "camembert-cls": dict(family="camembert", kind="cls", hidden=128, heads=4, layers=1, num_labels=3,
                          intermediate=301, seed=67),
    "camembert-token": dict(family="camembert", kind="token", hidden=64, heads=2, layers=2, num_labels=5,
                            seed=68),
    "distilbert-cls": dict(family="distilbert", kind="cls", hidden=64, heads=2, layers=2, num_labels=5,
                           seed=69),
    "distilbert-token": dict(family="distilbert", kind="token", hidden=128, heads=2, layers=1, num_labels=3,
                             act="relu", seed=70),
    "electra-cls": dict(family="electra", kind="cls", hidden=128, heads=4, layers=2, num_labels=3,
                        embedding=64, type_vocab=3, seed=71),
    "electra-token": dict(family="electra", kind="token", hidden=64, heads=2, layers=1, num_labels=5,
                          embedding=64, seed=72),
    "modernbert-cls": dict(family="modernbert", kind="cls", hidden=128, heads=2, layers=3, num_labels=3,
                           seed=73),
    "modernbert-token": dict(family="modernbert", kind="token", hidden=64, heads=1, layers=2, num_labels=5,
                             seed=74),
    # classifier_pooling "mean": the head's dense reads the mean of the tokens.
    "modernbert-mean": dict(family="modernbert", kind="cls", hidden=96, heads=3, layers=2, num_labels=2,
                            seed=75, pooling="mean"),
}


class Case:
    def __init__(self, name, path, hf):
        self.name, self.path, self.hf = name, path, hf
        self.spec = CASES[name]
        self.family, self.kind = self.spec["family"], self.spec["kind"]
        self._peers = {}

    def peer(self, dtype):
        """transformers' own task model in a half dtype on the GPU: the error budget's yardstick."""
        if dtype not in self._peers:
            cls = model_class(self.family, self.kind)
            self._peers[dtype] = cls.from_pretrained(self.path, dtype=DTYPES[dtype],
                                                     attn_implementation="sdpa").cuda().eval()
        return self._peers[dtype]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    spec = dict(CASES[request.param])
    pooling = spec.pop("pooling", None)
    hf = make_model(path, **spec)
    if pooling is not None:
        hf.config.classifier_pooling = pooling
    widen_head(hf)
    hf.save_pretrained(path)
    yield Case(request.param, path, hf)
    torch.cuda.empty_cache()


def make_inputs(rng, case, batch, seq, left):
    """CUDA (input_ids, attention_mask, token_type_ids or None): pad_token_id exactly where the mask
    is 0 (transformers counts RoBERTa positions from the ids); token types where the family has them."""
    config = case.hf.config
    pad = config.pad_token_id
    ids = rng.integers(0, config.vocab_size - 1, (batch, seq))
    ids += ids >= pad
    mask = ragged_mask(rng, batch, seq, left=left)
    ids[mask == 0] = pad
    types = rng.integers(0, config.type_vocab_size, (batch, seq)) if case.family in ("bert", "electra") else None
    as_cuda = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    return as_cuda(ids.astype(np.int64)), as_cuda(mask), as_cuda(types)


def run_hf(model, ids, mask, types):
    """(last hidden state, logits) of a transformers task model, on the model's device, in float32."""
    device = next(model.parameters()).device
    kwargs = {} if types is None else {"token_type_ids": types.to(device)}
    with torch.no_grad():
        out = model(ids.to(device), attention_mask=mask.to(device), output_hidden_states=True, **kwargs)
    return out.hidden_states[-1].float().cpu(), out.logits.float().cpu()


def errors(case, hidden, logits, ref_hidden, ref_logits, mask, packed=False):
    """Max abs errors (hidden over real tokens; logits over every row for a sequence head, which
    reads token 0 whatever the mask says, over real tokens for a token head). packed: the forward
    ran packed (batch_invariant), so a sequence head read each row's first real token."""
    valid = mask.bool().cpu()
    e_h = (hidden.float().cpu() - ref_hidden).abs()[valid].max().item()
    d = (logits.float().cpu() - ref_logits).abs()
    if case.kind == "cls" and case.spec.get("pooling") != "mean" and (packed or case.family == "modernbert"):
        # A left-padded row's token 0 is a pad. Packed, there is no such row to read. ModernBERT's
        # sliding window may leave it without a real key: transformers weighs every key alike
        # there, ftbert gives zeros (test_head_parity.py). Those rows are compared nowhere here.
        d = d[valid[:, 0]] if valid[:, 0].any() else d[:0]
    e_l = (d if case.kind == "cls" else d[valid]).max().item() if d.numel() else 0.0
    return e_h, e_l


def encoder(case, dtype, attention, graphs):
    enc = ftbert.Encoder.from_pretrained(case.path, device="cuda", dtype=dtype, cuda_graphs=graphs)
    enc.attention = attention
    assert enc.head == HEADS[case.kind] and enc.num_labels == case.spec["num_labels"]
    return enc


def calls(rng, case, enc, batch=3, seq=37):
    """Three forwards of one shape (op by op; recorded and replayed; replayed where graphs are on),
    fresh inputs each, left padding in the second: [(inputs, output)]."""
    done = []
    for left in (False, True, False):
        ids, mask, types = make_inputs(rng, case, batch, seq, left)
        out = enc(ids, mask, types)
        assert out.logits.is_cuda and out.logits.dtype == out.last_hidden_state.dtype
        want = (batch, case.spec["num_labels"]) if case.kind == "cls" else (batch, seq, case.spec["num_labels"])
        assert tuple(out.logits.shape) == want
        assert torch.isfinite(out.logits).all() and torch.isfinite(out.last_hidden_state).all()
        done.append(((ids, mask, types), out))
    assert enc.recorded_shapes == (1 if enc.cuda_graphs else 0)
    return done


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
def test_float32_matches_transformers(case, rng, graphs):
    enc = encoder(case, "float32", "unfused", graphs)
    for (ids, mask, types), out in calls(rng, case, enc):
        ref_h, ref_l = run_hf(case.hf, ids, mask, types)
        e_h, e_l = errors(case, out.last_hidden_state, out.logits, ref_h, ref_l, mask)
        assert e_h <= 1e-4, f"{case.name}: hidden {e_h:.2e}"
        assert e_l <= 1e-4, f"{case.name}: logits {e_l:.2e}"


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "no-graphs"])
@pytest.mark.parametrize("attention", ["unfused", "flash"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_error_within_twice_transformers(case, rng, dtype, attention, graphs):
    # The bound of the GPU model tests: ftbert's error against float32 at most twice transformers'
    # own in the same dtype, plus a floor: 1e-3 for the hidden state (values O(1)), as there. Each
    # error is the largest over all three forwards. A sequence head gives one row of logits per
    # sequence, and the largest error over a handful of rows is mostly luck (either engine can land
    # within a rounding of the reference): a batch of 48 sequences makes the maxima comparable.
    # The logits' floor is four roundings of the largest logit in the dtype.
    enc = encoder(case, dtype, attention, graphs)
    batch = 48 if case.kind == "cls" else 3
    assert enc.attention_for(batch, 37) == attention
    eps = torch.finfo(DTYPES[dtype]).eps
    ours, theirs, largest = [0.0, 0.0], [0.0, 0.0], 0.0
    for (ids, mask, types), out in calls(rng, case, enc, batch=batch):
        assert out.logits.dtype == DTYPES[dtype]
        ref_h, ref_l = run_hf(case.hf, ids, mask, types)
        peer_h, peer_l = run_hf(case.peer(dtype), ids, mask, types)
        got = errors(case, out.last_hidden_state, out.logits, ref_h, ref_l, mask, packed=enc.batch_invariant)
        ours = [max(a, b) for a, b in zip(ours, got)]
        theirs = [max(a, b) for a, b in zip(theirs, errors(case, peer_h, peer_l, ref_h, ref_l, mask))]
        largest = max(largest, ref_l.abs().max().item())
    floors = (1e-3, max(1e-3, 2 * eps * largest))
    for what, e_ours, e_theirs, floor in zip(("hidden", "logits"), ours, theirs, floors):
        assert e_ours <= 2 * e_theirs + floor, (
            f"{case.name} {what}: ftbert {e_ours:.3e} vs transformers {e_theirs:.3e} (floor {floor:.1e})")


def test_numpy_and_cpu_inputs_follow_the_documented_rule(case, rng):
    # padding_free's rule, which batch_invariant (packing every forward) overrides.
    enc = ftbert.Encoder.from_pretrained(case.path, device="cuda", dtype="float16", batch_invariant=False)
    ids, mask, types = make_inputs(rng, case, 2, 9, left=True)
    host = [None if a is None else a.cpu() for a in (ids, mask, types)]
    on_gpu = enc(ids, mask, types).logits
    out_np = enc(*[None if a is None else a.numpy() for a in host]).logits
    assert isinstance(out_np, np.ndarray) and out_np.dtype == np.float16
    out_cpu = enc(*host).logits
    assert out_cpu.device.type == "cpu" and out_cpu.dtype == torch.float16
    np.testing.assert_array_equal(out_cpu.numpy(), out_np)
    # Host masks run padding-free where the default rule says so (CUDA tensors stay padded): the
    # same values at every attended position, and zeros at padding. The random mask may hold too
    # little padding for the rule; then the host result is the padded one.
    real = host[1].numpy().astype(bool)
    if out_np.ndim == 3 and enc.padding_free_for(*real.shape, int(real.sum())):
        np.testing.assert_allclose(out_np[real], on_gpu.cpu().numpy()[real], rtol=1e-2, atol=2e-3)
        assert not out_np[~real].any()
        enc.padding_free = False
        out_np = enc(*[None if a is None else a.numpy() for a in host]).logits
    np.testing.assert_array_equal(out_np, on_gpu.cpu().numpy())
    bf = ftbert.Encoder.from_pretrained(case.path, device="cuda", dtype="bfloat16", batch_invariant=False)
    assert bf(*[None if a is None else a.numpy() for a in host]).logits.dtype == np.float32  # numpy has no bfloat16
