"""What the GPU family tests (test_cuda_mpnet.py, test_cuda_modernbert.py) share: CUDA inputs with
right/left padding or holes, transformers' outputs on the model's device, the masked error."""

import torch

from tests._util import padded_ids


def cuda_inputs(rng, hf, batch, seq, style):
    """(ids, mask) CUDA tensors of tests._util.padded_ids for the model's config."""
    ids, mask = padded_ids(rng, hf.config, batch, seq, style)
    return torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()


def run_hf(model, ids, mask):
    """(final hidden states, logits or None) of a transformers model, float32 on the CPU: a bare
    model's last_hidden_state, a task model's last hidden state."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(ids.to(device), attention_mask=mask.to(device).long(), output_hidden_states=True)
    hidden = getattr(out, "last_hidden_state", None)
    hidden = out.hidden_states[-1] if hidden is None else hidden
    logits = getattr(out, "logits", None)
    return hidden.float().cpu(), None if logits is None else logits.float().cpu()


def masked_error(out, ref, mask):
    """Largest |out - ref| over the attended positions."""
    return (out.float().cpu() - ref).abs()[mask.bool().cpu()].max().item()
