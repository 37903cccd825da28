"""The engine config's keys (cpp/core/config.cpp): one table the engine reads through and the
converter writes by (weights_tools/layout.py asks the bound module for it)."""

import json

import pytest

from ftbert import _C
from ftbert.weights_tools import convert_checkpoint, layout
from ftbert.weights_tools.schema import engine_config
from tests._models import family_kinds, make_model

KEYS = [tuple(k) for k in _C.engine_config_keys()]


@pytest.fixture(scope="module", params=family_kinds(("model", "cls", "token")),
                ids=lambda fk: "-".join(fk))
def converted(request, tmp_path_factory):
    family, kind = request.param
    hf = tmp_path_factory.mktemp(f"{family}-{kind}-hf")
    make_model(hf, family, kind, hidden=40, heads=2, layers=2, intermediate=56)
    out = tmp_path_factory.mktemp(f"{family}-{kind}-ft")
    convert_checkpoint(hf, out, progress=False)
    return json.loads((out / layout.CONFIG_FILE).read_text())


def present(config: dict, obj: str, name: str) -> bool:
    where = config if not obj else config.get(obj)
    return isinstance(where, dict) and where.get(name) is not None


def without(config: dict, obj: str, name: str) -> dict:
    config = json.loads(json.dumps(config))
    del (config[obj] if obj else config)[name]
    return config


def test_the_file_holds_the_engine_keys_in_the_engine_order(converted):
    engine = [name for obj, name, _, _, in_file in KEYS if not obj and in_file]
    stored = [k for k in converted if k in engine]
    assert stored == engine
    assert layout.CONFIG_KEYS == ("format", "format_version", "model_type", *engine, "dtype",
                                  "weights_file", "weights_sha256", "max_seq_length")
    for obj in ("layer", "head"):
        if converted[obj] is not None:
            inside = [name for o, name, *_ in KEYS if o == obj]
            assert [k for k in converted[obj] if k in inside] == inside


def test_every_required_key_is_needed_and_named(converted):
    config = engine_config(converted)
    _C.expected_tensors(config)  # complete: no error
    checked = 0
    for obj, name, _, required, _ in KEYS:
        if not required or not present(config, obj, name):
            continue
        where = f" in '{obj}'" if obj else ""
        with pytest.raises(ValueError, match=f"config: missing key '{name}'{where}"):
            _C.expected_tensors(without(config, obj, name))
        checked += 1
    assert checked >= 9  # the hyper-parameters, layer_norm_eps, hidden_act, has_pooler at least


@pytest.mark.parametrize("key,value,what", [
    ("hidden_size", "40", "an integer"),
    ("hidden_size", True, "an integer"),
    ("hidden_size", 40.0, "an integer"),
    ("layer_norm_eps", "1e-12", "a number"),
    ("hidden_act", 3, "a string"),
    ("has_pooler", 1, "true or false"),
    ("head", [1], "an object"),
])
def test_a_value_of_the_wrong_type_is_refused_by_name(converted, key, value, what):
    config = {**engine_config(converted), key: value}
    with pytest.raises(ValueError, match=f"config: {key} must be {what}, got "):
        _C.expected_tensors(config)


def test_a_size_past_the_engines_int_is_refused(converted):
    with pytest.raises(ValueError, match="config: vocab_size 4294967301 does not fit in a 32-bit int"):
        _C.expected_tensors({**engine_config(converted), "vocab_size": 2**32 + 5})


def test_the_keys_the_engine_types_match_what_the_converter_writes(converted):
    kinds = {"int": int, "number": (int, float), "string": str, "bool": bool, "object": dict}
    for obj, name, typ, _, in_file in KEYS:
        if in_file and present(converted, obj, name):
            value = (converted[obj] if obj else converted)[name]
            assert isinstance(value, kinds[typ]) and (typ == "bool") == isinstance(value, bool), (name, value)
