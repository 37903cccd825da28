"""Format version 2 (position_ids, pad_token_id, the family's model_type, embedding_size), the
version-2 directories written before embedding_size existed (read as hidden_size), and the version-1
directories written before version 2, which still load as the BERTs they are."""

from __future__ import annotations

import pytest
import torch

from tests.weights_tools._converted import read_config, rewrite_config


@pytest.fixture
def convert(wt, make_checkpoint, tmp_path):
    """convert(family="bert", kind="cls") -> the converted directory."""

    def run(family: str = "bert", kind: str = "cls"):
        src, _ = make_checkpoint(kind, family=family)
        return wt.convert_checkpoint(src, tmp_path / f"out-{family}", progress=False)

    return run


def _as_version_1(out):
    """What the converter wrote before version 2: no position_ids, no pad_token_id (and no
    embedding_size)."""
    rewrite_config(out, format_version=1, position_ids=..., pad_token_id=..., embedding_size=...)


@pytest.mark.parametrize("family", ["bert", "roberta", "electra"])
def test_written_config_is_version_2_with_keys_in_order(wt, convert, family):
    from importlib import import_module

    layout = import_module(wt.__name__ + ".layout")
    stored = read_config(convert(family))
    assert tuple(stored) == layout.CONFIG_KEYS
    assert stored["format_version"] == wt.FORMAT_VERSION == 2
    assert stored["model_type"] == family
    scheme = {"bert": "absolute", "roberta": "padding_offset", "electra": "absolute"}[family]
    assert (stored["position_ids"], stored["pad_token_id"]) == (scheme, {"roberta": 1}.get(family, 0))
    # Written for every family: hidden_size where there is no projection (conftest's ELECTRA: 32).
    assert stored["embedding_size"] == {"electra": 32}.get(family, stored["hidden_size"])


def test_version_1_directory_reads_as_bert_with_absolute_positions(wt, convert):
    out = convert("bert")
    config2, tensors2 = wt.read_converted(out)
    _as_version_1(out)
    config1, tensors1 = wt.read_converted(out)
    assert config1["format_version"] == 1  # what the file is
    assert {**config1, "format_version": 2} == config2
    assert list(config1) == list(config2)  # the added keys in their documented place
    assert list(tensors1) == list(tensors2)
    assert all(torch.equal(tensors1[n], tensors2[n]) for n in tensors1)


def test_version_1_may_spell_out_what_it_implies(wt, convert):
    out = convert("bert")
    rewrite_config(out, format_version=1)  # position_ids "absolute", pad_token_id 0 kept
    config, _ = wt.read_converted(out)
    assert (config["position_ids"], config["pad_token_id"]) == ("absolute", 0)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        ({"model_type": "roberta"}, "model_type 'roberta' is not supported in format_version 1"),
        ({"position_ids": "padding_offset"},
         "format_version 1 implies position_ids 'absolute', but the file says 'padding_offset'"),
        ({"pad_token_id": 1}, "format_version 1 implies pad_token_id 0, but the file says 1"),
        ({"pad_token_id": False}, "format_version 1 implies pad_token_id 0, but the file says False"),
        ({"model_type": ...}, r"missing key\(s\) model_type"),
    ],
)
def test_version_1_contradicting_itself_is_refused(wt, convert, changes, pattern):
    out = convert("bert")
    _as_version_1(out)
    rewrite_config(out, **changes)
    with pytest.raises(wt.FormatError, match=pattern):
        wt.read_converted(out)


def test_roberta_converted_as_version_1_is_refused(wt, convert):
    # A RoBERTa read as version 1 would get BERT's positions: wrong numbers, so an error instead.
    out = convert("roberta")
    _as_version_1(out)
    with pytest.raises(wt.FormatError, match="model_type 'roberta' is not supported in format_version 1"):
        wt.read_converted(out)


@pytest.mark.parametrize(
    "family, changes, pattern",
    [
        ("bert", {"position_ids": ...}, r"missing key\(s\) position_ids"),
        ("roberta", {"pad_token_id": ...}, r"missing key\(s\) pad_token_id"),
        ("bert", {"position_ids": "relative_key"},
         "position_ids must be 'absolute' or 'padding_offset', got 'relative_key'"),
        ("roberta", {"position_ids": "absolute"},
         "position_ids 'absolute' is not what model_type 'roberta' uses \\('padding_offset'\\)"),
        ("bert", {"position_ids": "padding_offset"},
         "position_ids 'padding_offset' is not what model_type 'bert' uses \\('absolute'\\)"),
        ("roberta", {"pad_token_id": None}, "pad_token_id must be an integer .* got None"),
        ("roberta", {"pad_token_id": -1}, "pad_token_id must be an integer .* got -1"),
        ("bert", {"pad_token_id": 101}, r"pad_token_id must be an integer from 0 to vocab_size - 1 \(100\)"),
        ("roberta", {"pad_token_id": "1"}, "pad_token_id must be an integer .* got '1'"),
        ("roberta", {"pad_token_id": 40}, "pad_token_id 40 leaves no usable position"),
        ("roberta", {"model_type": "albert"},
         "model_type 'albert' is not supported \\(expected one of 'bert', 'roberta', 'xlm-roberta', "
         "'camembert', 'distilbert', 'electra', 'mpnet', 'modernbert', 'nomic_bert', 'gte', "
         "'jina_embeddings_v3', 'eurobert', 'deberta-v2'\\)"),
        ("bert", {"embedding_size": 32},
         "embedding_size 32 is not what model_type 'bert' has \\(its embeddings are hidden_size 48 wide"),
        ("distilbert", {"embedding_size": 96}, "embedding_size 96 is not what model_type 'distilbert' has"),
        ("electra", {"embedding_size": 0},
         r"embedding_size must be a positive integer \(at most 2147483647\), got 0"),
        ("electra", {"embedding_size": 32.0}, "embedding_size must be a positive integer .* got 32.0"),
        ("electra", {"embedding_size": None}, "embedding_size must be a positive integer .* got None"),
        # E == H: no projection, and tables of hidden_size, more than the file (32 wide) holds.
        ("electra", {"embedding_size": 48}, r"embedding_size=48\) imply .* a size in the config is wrong"),
        ("electra", {"embedding_size": 16},
         "tensor 'embeddings.word' has shape \\[101, 32\\], expected \\[101, 16\\]"),
        ("distilbert", {"type_vocab_size": 2},
         "type_vocab_size 2 is not what model_type 'distilbert' has \\(1: it has no token-type embedding"),
        ("distilbert", {"has_pooler": True}, "has_pooler is true, but model_type 'distilbert' has no pooler"),
        ("distilbert", {"position_ids": "padding_offset"},
         "position_ids 'padding_offset' is not what model_type 'distilbert' uses \\('absolute'\\)"),
        ("bert", {"model_type": ["bert"]}, "model_type \\['bert'\\] is not supported"),
    ],
)
def test_bad_version_2_values_are_format_errors(wt, convert, family, changes, pattern):
    out = convert(family)
    rewrite_config(out, **changes)
    with pytest.raises(wt.FormatError, match=pattern):
        wt.read_converted(out)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_version_2_without_embedding_size_reads_as_hidden_size(wt, convert, family):
    # Version-2 directories written before the key existed: embeddings of hidden_size, the key
    # filled in on read, in its place in the key order.
    out = convert(family)
    written, tensors = wt.read_converted(out)
    rewrite_config(out, embedding_size=...)
    config, again = wt.read_converted(out)
    assert config == written and list(config) == list(written)
    assert config["embedding_size"] == config["hidden_size"] == 48
    assert list(again) == list(tensors) and all(torch.equal(again[n], tensors[n]) for n in tensors)


def test_electra_without_embedding_size_is_refused_by_its_shapes(wt, convert):
    # A projected ELECTRA needs the key: read as hidden_size, its tables are the wrong width.
    out = convert("electra")
    rewrite_config(out, embedding_size=...)
    with pytest.raises(wt.FormatError, match=r"embedding_size=48\) imply .* a size in the config is wrong"):
        wt.read_converted(out)


def test_electra_converted_as_version_1_is_refused(wt, convert):
    out = convert("electra")
    _as_version_1(out)
    with pytest.raises(wt.FormatError, match="model_type 'electra' is not supported in format_version 1"):
        wt.read_converted(out)


@pytest.mark.parametrize("model_type", ["xlm-roberta", "camembert"])
def test_one_family_member_may_be_relabelled_as_another(wt, convert, model_type):
    # The three RoBERTa model_types share layout and positions: the label is what the config says.
    out = convert("roberta")
    rewrite_config(out, model_type=model_type)
    config, _ = wt.read_converted(out)
    assert config["model_type"] == model_type


def test_pad_token_id_leaving_one_position_reads(wt, convert):
    out = convert("roberta")  # max_position_embeddings 41
    rewrite_config(out, pad_token_id=39)
    config, _ = wt.read_converted(out)
    assert config["pad_token_id"] == 39
