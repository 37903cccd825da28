"""benchmarks/sustained.py's parts that need no GPU: reading nvidia-smi's samples, the summary of
a time window, the throttle reasons' names and the forward's FLOP count."""

import datetime
import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "sustained.py"
_spec = importlib.util.spec_from_file_location("sustained", _PATH)
sustained = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sustained)


def smi_line(when: datetime.datetime, mhz, watts, limit, reasons):
    return f"{when.strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {mhz}, {watts}, {limit}, {reasons}"


def test_reads_a_sample_line_in_local_time():
    when = datetime.datetime(2026, 11, 24, 17, 30, 19, 53000)
    t, mhz, watts, limit, reasons = sustained.parse_smi_line(
        smi_line(when, 1530, 692.41, 700.00, "0x0000000000000004"))
    assert t == pytest.approx(when.timestamp(), abs=1e-3)
    assert (mhz, watts, limit, reasons) == (1530.0, 692.41, 700.0, 4)


@pytest.mark.parametrize("line", ["", "timestamp, clocks.sm", "not a date, 1, 2, 3, 0x0",
                                  "2026/11/24 17:30:19.053, [N/A], 70.8, 700, 0x1"])
def test_lines_that_are_not_samples_are_skipped(line):
    assert sustained.parse_smi_line(line) is None


def test_throttle_reasons_are_named():
    assert sustained.decode_reasons(0) == "none"
    assert sustained.decode_reasons(0x4) == "power cap"
    assert sustained.decode_reasons(0x44) == "power cap, hardware thermal"


def test_window_summary_takes_medians_of_the_samples_inside():
    start = 1000.0
    samples = [(start + i * 0.2, 1500.0 + (i % 3), 690.0 + i, 700.0, 0x4 if i >= 5 else 0x1)
               for i in range(20)]
    w = sustained.window_summary(samples, start + 0.95, start + 3.05)  # samples 5..15
    assert w["samples"] == 11
    assert w["sm_mhz"] == 1501.0
    assert w["watts"] == 700.0
    assert w["power_limit_w"] == 700.0
    assert w["throttle"] == "power cap"
    assert sustained.window_summary(samples, start + 10, start + 11) is None


def test_forward_flops_counts_the_gemms_and_attention():
    # One layer of hidden 4, intermediate 8, one sequence of 2 tokens, counted by hand:
    # QKV 2*2*4*12 + out 2*2*4*4 + FFN 2*(2*2*4*8) = 192 + 64 + 256; attention 4*1*2*2*4 = 64.
    assert sustained.forward_flops(1, 2, layers=1, hidden=4, inter=8) == 192 + 64 + 256 + 64
    base = sustained.forward_flops(32, 512)
    assert base == 12 * (2 * 16384 * 768 * (4 * 768 + 2 * 3072) + 4 * 32 * 512 * 512 * 768)


def test_gemm_operands_are_the_forwards_products_without_bias():
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=40, vocab_size=50, max_position_embeddings=16)
    hf = BertModel(cfg).eval()
    ids = torch.randint(0, 50, (2, 5), dtype=torch.int32)
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        operands = sustained.gemm_operands(torch, hf, ids, mask)
        assert [(tuple(x.shape), tuple(w.shape)) for x, w in operands] == \
            [((10, 24), (24, 72)), ((10, 24), (24, 24)), ((10, 24), (24, 40)),
             ((10, 40), (40, 24))] * 2
        # Layer 1's FFN-in input is layer 1's attention LayerNorm output, taken from the forward.
        layer = hf.encoder.layer[1]
        x, w = operands[6]
        want = layer.intermediate.dense(x) - layer.intermediate.dense.bias
        torch.testing.assert_close(x @ w, want)
        # The QKV weight is query, key and value side by side.
        x, w = operands[4]
        sa = layer.attention.self
        torch.testing.assert_close((x @ w)[:, 24:48], sa.key(x) - sa.key.bias)
        # Layer 0's QKV input is the embeddings' output.
        emb = hf.embeddings(input_ids=ids.long())
        torch.testing.assert_close(operands[0][0], emb.reshape(10, 24))


def test_joules_per_call_is_the_counters_rise_over_the_window():
    groups = [(100.0, 5_000), (101.0, 7_000), (102.0, 9_500), (103.0, 12_500), (104.0, 15_000)]
    # Groups ending at 102, 103 and 104: from the counter after the group at 101.
    assert sustained.joules_per_call(groups, 101.5, 104.0, 20) == pytest.approx(8.0 / 60)
    assert sustained.joules_per_call(groups, 110.0, 120.0, 20) is None  # no group inside
    assert sustained.joules_per_call(groups, 99.0, 101.0, 20) is None  # no reading before
    unread = [(t, None) for t, _ in groups]
    assert sustained.joules_per_call(unread, 101.5, 104.0, 20) is None
