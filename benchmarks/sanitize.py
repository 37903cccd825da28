"""Small workloads for compute-sanitizer (run by gpu_check.sh).

  sanitize.py forward  - a small model's forward with a sequence or a token classification head, in
                         float32, float16 and bfloat16, both attentions, op by op and replayed as a
                         CUDA graph
  sanitize.py ops      - the softmax (both variants), the residual LayerNorm (block and warp per
                         row, and after a k-split GEMM), the embedding LayerNorm (both kernels,
                         padded and packed, the RoBERTa family's counted positions), both flash
                         attention kernels and the Hopper CUTLASS GEMMs
  sanitize.py mpnet [1] - a small MPNet's forward (the relative position bias in the unfused softmax
                         and the portable flash kernel), float32, float16 and bfloat16, padded and
                         packed, a mask with holes, op by op and replayed (1: float16 flash only)
  sanitize.py modernbert [1] - a small ModernBERT's forward (rotary, the gated activation, the
                         pre-LayerNorm residual step, sliding windows in both attention kernels),
                         float32, float16 and bfloat16, padded and packed (and forward_packed), a
                         mask with holes, op by op and replayed (1: float16 flash only)
  sanitize.py rotary [1] - small NomicBERT (also with dynamic rope scaling), GTE,
                         Jina-embeddings-v3 and EuroBERT forwards (rotary post-LayerNorm layers,
                         SwiGLU, the RMSNorm ops), as mpnet's
  sanitize.py deberta [1|2] - a small DeBERTa-v3's forward (the disentangled terms: their batched
                         GEMMs, disentangled_scores in the unfused path and the flash kernel's
                         kTerms tiles; 201 tokens past the 32 log buckets and the clamped ends),
                         as mpnet's
  sanitize.py invariant - batch_invariant=True: a small BERT with a sequence head and a small
                         ModernBERT, float16 and bfloat16, a ragged batch op by op and replayed,
                         from host arrays and from CUDA tensors (the reference GEMMs and the
                         measured ones of their class, the LayerNorm's one form, the fixed
                         attention kernels, the packed layout over every position)
  sanitize.py fp8      - quantization="fp8" (Hopper): a small BERT whose FFN goes to e4m3 and one
                         whose 301-wide FFN stays 16-bit, float16 and bfloat16, batch invariant
                         and not, eager, recorded and replayed
  sanitize.py threads [N] - one encoder called from 4 threads, each on its own stream, graphs on,
                         concurrency 1 and 2, float16 unfused and flash, N forwards (24): every
                         output equal to the sequential one
"""

import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from transformers import BertConfig, BertModel

import ftbert
from ftbert import _ops


def forward() -> None:
    # A classifier on the pooler (sequence head) and one per token: the heads' GEMMs with odd label
    # counts and first_token_dense run under the sanitizer too.
    from transformers import BertForSequenceClassification, BertForTokenClassification

    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        sizes = dict(vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=301, max_position_embeddings=256)
        dirs = {"sequence": os.path.join(d, "sequence"), "token": os.path.join(d, "token")}
        BertForSequenceClassification(BertConfig(**sizes, num_labels=3)).save_pretrained(dirs["sequence"])
        BertForTokenClassification(BertConfig(**sizes, num_labels=5)).save_pretrained(dirs["token"])
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 97, (3, 77))
        mask = np.ones((3, 77), np.int64)
        mask[1, 40:] = 0
        mask[2, :9] = 0
        for head, path in dirs.items():
            for dtype in ("float32", "float16", "bfloat16"):
                for attention in ("unfused", "auto"):
                    for packed in (False, True):  # padding-free: host packing, bucketed recordings
                        enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype,
                                                             attention=attention, padding_free=packed)
                        out = enc(ids, mask)
                        assert np.isfinite(out.last_hidden_state).all() and np.isfinite(out.logits).all()
                        # Batch invariance (on by default in 16 bits) measures every row bucket's
                        # GEMMs; a shape is recorded once its picks are in.
                        enc._native.wait_for_tuning()
                        for _ in range(2):  # recorded as a CUDA graph, then replayed
                            again = enc(ids, mask)
                            np.testing.assert_array_equal(again.last_hidden_state, out.last_hidden_state)
                            np.testing.assert_array_equal(again.logits, out.logits)
                        assert enc.recorded_shapes == 1
                        if packed:  # device inputs: packed on the device, the count read back
                            dev = enc(torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda())
                            assert torch.isfinite(dev.last_hidden_state).all()
                        print(head, dtype, attention, enc.attention_for(3, 77), "packed" if packed else "padded", "ok")


def fp8() -> None:
    # quantization="fp8" (Hopper): the row quantization kernel and cuBLASLt's e4m3 GEMMs with each
    # epilogue, eager and recorded, batch invariant and not; a 301-wide FFN stays 16-bit beside them.
    from transformers import BertForSequenceClassification

    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        for inter in (512, 301):
            path = os.path.join(d, str(inter))
            BertForSequenceClassification(BertConfig(
                vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=inter, max_position_embeddings=256, num_labels=3)).save_pretrained(path)
            rng = np.random.default_rng(0)
            ids = rng.integers(0, 97, (3, 77))
            mask = np.ones((3, 77), np.int64)
            mask[1, 40:] = 0
            for dtype in ("float16", "bfloat16"):
                for invariant in (False, True):
                    enc = ftbert.Encoder.from_pretrained(path, device="cuda", dtype=dtype, quantization="fp8",
                                                         batch_invariant=invariant)
                    outs = [enc(ids, mask)]
                    # The 16-bit GEMMs beside the e4m3 ones (pooler, head, the 301-wide FFN) are
                    # measured first: a shape is recorded once its picks are in.
                    enc._native.wait_for_tuning()
                    outs += [enc(ids, mask) for _ in range(2)]  # recorded, replayed
                    for o in outs[1:]:
                        np.testing.assert_array_equal(o.last_hidden_state, outs[0].last_hidden_state)
                    assert np.isfinite(outs[0].last_hidden_state).all()
                    print("fp8", inter, dtype, "invariant" if invariant else "default", "ok")


def _family_forwards(name: str, model, pad: int, quick: int) -> None:
    """`model` saved, then forwards of a batch with right and left padding and a hole inside a
    sequence (where a relative bias or a window counts padded positions), in each dtype, attention
    path and layout, op by op and replayed; quick 1: float16 on the default (flash) attention only;
    quick 2: that, packed only, one forward op by op and one forward_packed (racecheck, which
    slows the fused attention most, then fits a few minutes)."""
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        rng = np.random.default_rng(0)
        ids = rng.integers(3, 97, (3, 201))
        mask = np.ones((3, 201), np.int64)
        mask[1, 150:] = 0
        mask[2, :9] = 0
        mask[2, 60:70] = 0
        ids[mask == 0] = pad
        for dtype in ("float16",) if quick else ("float32", "float16", "bfloat16"):
            for attention in ("auto",) if quick else ("unfused", "auto"):
                for packed in (True,) if quick >= 2 else (False, True):
                    enc = ftbert.Encoder.from_pretrained(d, device="cuda", dtype=dtype, attention=attention,
                                                         padding_free=packed)
                    if quick >= 2:  # every kernel of the forward once, nothing repeated
                        assert np.isfinite(enc(ids, mask).last_hidden_state).all()
                        flat, cu = ids[mask == 1], np.concatenate([[0], np.cumsum(mask.sum(1))])
                        assert np.isfinite(enc.forward_packed(flat, cu).last_hidden_state).all()
                        print(name, dtype, enc.attention_for(3, 201), "packed, once ok")
                        continue
                    enc(ids, mask)
                    # The measured GEMM choice may switch a pick once its background timing of a
                    # new shape ends: the reference is taken after that.
                    enc._native.wait_for_tuning()
                    out = enc(ids, mask)
                    assert np.isfinite(out.last_hidden_state).all()
                    for _ in range(2):
                        again = enc(ids, mask)
                        np.testing.assert_array_equal(again.last_hidden_state, out.last_hidden_state)
                    print(name, dtype, enc.attention_for(3, 201), "packed" if packed else "padded", "ok")
                    if packed:  # the same tokens given packed, from host arrays and CUDA tensors
                        flat, cu = ids[mask == 1], np.concatenate([[0], np.cumsum(mask.sum(1))])
                        for x in (flat, torch.from_numpy(flat).cuda()):
                            hidden = enc.forward_packed(x, cu).last_hidden_state
                            assert bool(torch.isfinite(torch.as_tensor(hidden)).all())
                        print(name, dtype, enc.attention_for(3, 201), "forward_packed ok")


def mpnet(quick: int = 0) -> None:
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(0)
    model = MPNetModel(MPNetConfig(vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=301, max_position_embeddings=300))
    _family_forwards("mpnet", model, pad=1, quick=quick)


def modernbert(quick: int = 0) -> None:
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    model = ModernBertModel(ModernBertConfig(
        vocab_size=97, hidden_size=128, num_hidden_layers=3, num_attention_heads=2, intermediate_size=301,
        max_position_embeddings=512, local_attention=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2))
    _family_forwards("modernbert", model, pad=0, quick=quick)


def rotary(quick: int = 0) -> None:
    import transformers

    small = dict(vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=301, max_position_embeddings=512)
    # The dynamic one scales its sequences past 128 positions (the batch's longest is 201).
    dynamic = dict(pad_token_id=0, max_position_embeddings=128,
                   rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 2.0})
    for name, stem, extra in (("nomic_bert", "NomicBert", dict(pad_token_id=0)),
                              ("nomic_bert dynamic rope", "NomicBert", dynamic),
                              ("gte", "Gte", dict(pad_token_id=1)),
                              ("jina_embeddings_v3", "JinaEmbeddingsV3", dict(pad_token_id=1)),
                              ("eurobert", "EuroBert", dict(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                                            mask_token_id=3))):
        if getattr(transformers, stem + "Config", None) is None:
            print(name, "skipped: transformers", transformers.__version__, "has no", stem + "Config")
            continue
        torch.manual_seed(0)
        config = getattr(transformers, stem + "Config")(**{**small, **extra})
        model = getattr(transformers, stem + "Model")(config)
        _family_forwards(name, model, pad=extra["pad_token_id"], quick=quick)


def deberta(quick: int = 0) -> None:
    from transformers import DebertaV2Config, DebertaV2Model

    torch.manual_seed(0)
    # v3's settings (no token types, no absolute positions); 32 buckets over 64 relative positions,
    # so that _family_forwards' 201 tokens read every bucket.
    model = DebertaV2Model(DebertaV2Config(
        vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=301,
        max_position_embeddings=512, type_vocab_size=0, relative_attention=True, position_buckets=32,
        max_relative_positions=64, pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
        position_biased_input=False, pad_token_id=0))
    _family_forwards("deberta", model, pad=0, quick=quick)


def invariant() -> None:
    from transformers import (BertForSequenceClassification, DebertaV2Config, DebertaV2Model, ModernBertConfig,
                              ModernBertModel)

    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        BertForSequenceClassification(BertConfig(
            vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=301, max_position_embeddings=256, num_labels=3)).save_pretrained(d + "/bert")
        ModernBertModel(ModernBertConfig(
            vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=301,
            max_position_embeddings=512, local_attention=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            cls_token_id=1, sep_token_id=2)).save_pretrained(d + "/modernbert")
        DebertaV2Model(DebertaV2Config(  # its term tables from the ordered batched GEMM
            vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=301,
            max_position_embeddings=512, type_vocab_size=0, relative_attention=True, position_buckets=32,
            max_relative_positions=64, pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
            position_biased_input=False, pad_token_id=0)).save_pretrained(d + "/deberta")
        rng = np.random.default_rng(0)
        ids = rng.integers(3, 97, (5, 133))
        mask = np.zeros((5, 133), np.int64)
        for b, n in enumerate((133, 7, 90, 1, 64)):
            mask[b, :n] = 1
        for name in ("bert", "modernbert", "deberta"):
            for dtype in ("float16", "bfloat16"):
                enc = ftbert.Encoder.from_pretrained(f"{d}/{name}", device="cuda", dtype=dtype,
                                                     batch_invariant=True)
                out = enc(ids, mask)
                for _ in range(2):  # recorded, then replayed
                    np.testing.assert_array_equal(enc(ids, mask).last_hidden_state, out.last_hidden_state)
                alone = enc(ids[2:3, :90], mask[2:3, :90])
                np.testing.assert_array_equal(alone.last_hidden_state[0], out.last_hidden_state[2, :90])
                # CUDA tensors: small batches run over every position, nothing read back.
                ids_d, mask_d = torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()
                out_d = enc(ids_d, mask_d).last_hidden_state
                for _ in range(2):
                    assert torch.equal(enc(ids_d, mask_d).last_hidden_state, out_d)
                alone_d = enc(ids_d[2:3, :90], mask_d[2:3, :90]).last_hidden_state
                assert torch.equal(alone_d[0], out_d[2, :90])
                print("invariant", name, dtype, "ok")


def threads(cases_n: int = 24) -> None:
    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=97, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=301, max_position_embeddings=256)
        BertModel(cfg).save_pretrained(d)
        rng = np.random.default_rng(2)
        shapes = [(2, 33), (3, 64), (1, 100)]
        cases = []
        for i in range(cases_n):
            b, s = shapes[i % len(shapes)]
            mask = np.ones((b, s), np.int64)
            mask[-1, rng.integers(1, s + 1):] = 0
            cases.append((torch.from_numpy(rng.integers(0, 97, (b, s))).cuda(), torch.from_numpy(mask).cuda()))
        # Half the runs padding-free (device inputs: packed on each caller's stream, T read back).
        for attention, concurrency, packed in (("unfused", 1, False), ("unfused", 2, True),
                                               ("flash", 1, True), ("flash", 2, False)):
            enc = ftbert.Encoder.from_pretrained(d, device="cuda", dtype="float16", attention=attention,
                                                 concurrency=concurrency, padding_free=packed)
            want = [enc(ids, mask).last_hidden_state.cpu() for ids, mask in cases]
            streams = [torch.cuda.Stream() for _ in range(4)]

            def run(i):
                s = streams[i % 4]
                with torch.cuda.stream(s):
                    ids, mask = cases[i]
                    ids, mask = ids.clone(), mask.clone()  # made on this stream
                    out = enc(ids, mask).last_hidden_state
                    got = out.cpu()  # waits for this stream only
                return got

            with ThreadPoolExecutor(4) as ex:
                got = list(ex.map(run, range(len(cases))))
            bad = sum(not torch.equal(a, b) for a, b in zip(want, got))
            assert bad == 0, f"{bad} of {len(cases)} outputs differ ({attention}, concurrency {concurrency})"
            print("threads", attention, concurrency, "packed" if packed else "padded", "ok")


def ops() -> None:
    rng = np.random.default_rng(1)
    r = _ops.OpRunner("cuda")
    for dtype in ("float32", "float16", "bfloat16"):
        for seq in (7, 129, 1500):  # warp-per-row and block-per-row softmax
            scores = rng.standard_normal((2, 2, seq, seq)).astype(np.float32)
            mask = np.ones((2, seq), np.int32)
            mask[1, seq // 2 :] = 0
            assert np.isfinite(r.masked_softmax(dtype, scores, mask, 0.125)).all()
        for rows, hidden in ((37, 48), (37, 768), (37, 1000), (300, 768), (4100, 768), (4097, 130)):
            # A block per row, and from 128 rows a warp per row.
            x = rng.standard_normal((rows, hidden)).astype(np.float32)
            v = rng.standard_normal(hidden).astype(np.float32)
            assert np.isfinite(r.add_bias_residual_layernorm(dtype, x, x, v, v, v, 1e-12)).all()
        # The embedding: a warp per row where the row fits 4 vectors a lane (48; 768 in 16 bits),
        # else a block (768 in float32; 1030); padded and packed rows, positions counted past pad
        # ids.
        for hidden in (48, 768, 1030):
            ids = rng.integers(0, 50, (3, 77)).astype(np.int32)
            ids[0, :20] = 1
            tt = rng.integers(0, 2, (3, 77)).astype(np.int32)
            tables = [rng.standard_normal(shape).astype(np.float32)
                      for shape in ((50, hidden), (79, hidden), (2, hidden), (hidden,), (hidden,))]
            mask = np.ones((3, 77), np.int32)
            mask[1, 40:] = 0
            for kwargs in ({}, {"position_pad_id": 1}, {"position_pad_id": 1, "mask": mask}):
                assert np.isfinite(r.embed_layernorm(dtype, ids, tt, *tables, 1e-12, **kwargs)).all()
        # k split 4 and 2 ways. The unsplit path is weight_gemm + the LayerNorm above; at 300 rows
        # racecheck reported hazards inside cuBLAS's own nvjet_sm90 32x64 GEMM kernel (480, none
        # in ftbert's kernels), which is not ours to judge, so this workload leaves it out.
        for m, k in ((37, 3072), (37, 768)):
            a = rng.standard_normal((m, k)).astype(np.float32)
            w = (rng.standard_normal((k, 768)) / k**0.5).astype(np.float32)
            res = rng.standard_normal((m, 768)).astype(np.float32)
            v = rng.standard_normal(768).astype(np.float32)
            assert np.isfinite(r.dense_residual_layernorm(dtype, a, w, v, res, v, v)).all()
        if dtype != "float32":
            # Both flash kernels (on Hopper, head dims 64 and 128 run the warpgroup-MMA ones
            # unless FTBERT_FLASH_PORTABLE is set); right, left and full padding.
            for portable in ("0", "1"):
                os.environ["FTBERT_FLASH_PORTABLE"] = portable
                for d in (32, 64, 128):
                    qkv = rng.standard_normal((3, 197, 3 * 2 * d)).astype(np.float32)
                    mask = np.ones((3, 197), np.int32)
                    mask[0, 150:] = 0
                    mask[1, :60] = 0
                    mask[2, :] = 0
                    bias = rng.standard_normal(6 * d).astype(np.float32)
                    out = r.flash_attention(dtype, qkv, bias, mask, 2, d**-0.5)
                    assert np.isfinite(out).all() and not out[2].any()
                    # Packed (cu_seqlens): an empty sequence, a short one, a long one.
                    packed = r.flash_attention(dtype, qkv, bias, mask, 2, d**-0.5, packed=True)
                    assert packed.shape == (int(mask.sum()), 2 * d) and np.isfinite(packed).all()
            os.environ.pop("FTBERT_FLASH_PORTABLE")
            # The row moves around packed forwards, and the unfused path's packed ops.
            x = rng.standard_normal((3, 197, 96)).astype(np.float32)
            assert r.transpose_heads(dtype, x.reshape(3, 197, 2, 48).transpose(0, 2, 1, 3).copy(), mask=mask).shape == (int(mask.sum()), 96)
            qkv = rng.standard_normal((3, 197, 288)).astype(np.float32)
            q, k, v = r.add_qkv_bias_transpose(dtype, qkv, np.zeros(288, np.float32), 2, mask=mask)
            assert not v[2].any()
            rows = r.unpack_rows(dtype, x.reshape(-1, 96)[: int(mask.sum())], mask)
            assert not rows[2].any()
            assert not r.clear_rows_past_tokens(dtype, x.reshape(-1, 96)[: int(mask.sum()) + 5], mask)[-5:].any()
            w = rng.standard_normal((96, 5)).astype(np.float32)
            assert np.isfinite(r.first_token_dense(dtype, x, w, np.zeros(5, np.float32), "tanh", mask=mask)).all()
            cu, index = r.pack_sequences(mask)
            assert cu[-1] == mask.sum() and (index[cu[-1]:] == -1).all()
            # The Hopper CUTLASS GEMMs where this build has them (every tiling the measured choice
            # times, plain (up to 128 rows) and with the bias + erf-GELU epilogue).
            a = rng.standard_normal((120, 72)).astype(np.float32)
            w = (rng.standard_normal((72, 136)) / 72**0.5).astype(np.float32)
            cutlass = []
            for act, b in (("identity", None), ("gelu", rng.standard_normal(136).astype(np.float32))):
                for name in r.weight_gemm_candidates(dtype, 120, 136, 72, act=act):
                    if name.startswith("cutlass"):
                        assert np.isfinite(r.weight_gemm_candidate(name, dtype, a, w, bias=b, act=act)).all()
                        cutlass.append(name)
            print(dtype, "CUTLASS GEMMs:", ", ".join(cutlass) or "none in this build")
        print(dtype, "ok")


if __name__ == "__main__":
    {"forward": forward, "ops": ops, "mpnet": mpnet, "modernbert": modernbert, "rotary": rotary,
     "deberta": deberta, "invariant": invariant, "threads": threads, "fp8": fp8}[sys.argv[1]](*map(int, sys.argv[2:]))
