"""What a run records: the return value as a tag, the task config as params, MLflow's limits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from furcate_hydra.store import RunStatus, flatten_params
from furcate_hydra.store.params import MAX_KEY, MAX_VALUE
from furcate_hydra.store.run_record import MAX_TAG_VALUE, decode_return_value, encode_return_value


def round_trip(value: Any) -> tuple[str, Any]:
    encoded = encode_return_value(value)
    assert encoded is not None
    return encoded, decode_return_value(encoded)


@pytest.mark.parametrize(
    "value",
    [
        0.25,
        -3,
        "text with ümlauts",
        None,
        True,
        {"loss": 0.5, "history": [1, 2.5, {"epoch": 3}], "best": None},
        [[], {}, "", 0],
    ],
)
def test_json_values_round_trip_as_json(value: Any) -> None:
    encoded, decoded = round_trip(value)
    assert encoded.startswith("json:")
    assert decoded == value
    assert type(decoded) is type(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_round_trip(value: float) -> None:
    encoded, decoded = round_trip(value)
    assert encoded.startswith("json:")
    assert isinstance(decoded, float)
    assert math.isnan(decoded) if math.isnan(value) else decoded == value


def test_nan_nested_in_a_dict_survives() -> None:
    _, decoded = round_trip({"val": [math.nan, 1.0]})
    assert math.isnan(decoded["val"][0]) and decoded["val"][1] == 1.0


@pytest.mark.parametrize(
    "value",
    [
        (0.1, "a"),  # JSON would make it a list
        np.float64(0.125),  # JSON would make it a plain float
        {1: "a", 2: "b"},  # JSON would make the keys strings
        {"nested": (1, 2)},  # a tuple inside an otherwise JSON-able dict
        {"a", "b"},  # not JSON at all
    ],
)
def test_values_json_would_change_come_back_with_their_exact_type(value: Any) -> None:
    encoded, decoded = round_trip(value)
    assert encoded.startswith("pickle:")
    assert decoded == value
    assert type(decoded) is type(value)


def test_a_value_too_large_for_a_tag_is_not_encoded() -> None:
    assert encode_return_value("x" * (MAX_TAG_VALUE + 1)) is None
    assert encode_return_value(list(range(5000))) is None
    # Just under the limit still fits in the tag.
    fits = "x" * (MAX_TAG_VALUE - len('json:""'))
    encoded = encode_return_value(fits)
    assert encoded is not None and len(encoded) == MAX_TAG_VALUE


def test_an_unpicklable_value_is_recorded_as_its_repr() -> None:
    generator = (i for i in range(3))
    encoded = encode_return_value(generator)
    assert encoded is not None and encoded.startswith("repr:<generator object")
    assert decode_return_value(encoded) == repr(generator)
    huge = encode_return_value(Unpicklable())
    assert huge == "repr:" + "U" * (MAX_TAG_VALUE - len("repr:"))


class Unpicklable:
    """Refuses pickling and has a repr longer than any tag."""

    def __reduce__(self) -> str:
        raise TypeError("not picklable")

    def __repr__(self) -> str:
        return "U" * (MAX_TAG_VALUE * 2)


def test_an_unknown_record_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown return-value record 'yaml:x'"):
        decode_return_value("yaml:x")


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("FINISHED", RunStatus.FINISHED),
        ("KILLED", RunStatus.KILLED),
        ("RUNNING", RunStatus.RUNNING),
        ("SCHEDULED", RunStatus.SCHEDULED),
        ("finished", RunStatus.FAILED),
        ("EXPLODED", RunStatus.FAILED),
        ("", RunStatus.FAILED),
    ],
)
def test_run_status_parse_treats_unknown_text_as_failed(text: str, status: RunStatus) -> None:
    assert RunStatus.parse(text) is status


def test_limits_match_mlflows() -> None:
    from mlflow.utils import validation

    assert validation.MAX_TAG_VAL_LENGTH == MAX_TAG_VALUE
    assert validation.MAX_PARAM_VAL_LENGTH == MAX_VALUE
    assert validation.MAX_ENTITY_KEY_LENGTH == MAX_KEY


def test_flatten_params_dots_nested_keys_and_keeps_lists_whole() -> None:
    config = {
        "lr": 0.1,
        "name": "digits",
        "model": {"layers": [64, 32], "act": {"kind": "relu", "slope": None}},
        "flags": {"fast": True},
        "empty": {},
        "nothing": None,
    }
    assert flatten_params(config) == {
        "lr": "0.1",
        "name": "digits",  # a string is not quoted
        "model.layers": "[64, 32]",
        "model.act.kind": "relu",
        "model.act.slope": "null",
        "flags.fast": "true",
        "empty": "{}",
        "nothing": "null",
    }
    assert flatten_params({}) == {}


def test_flatten_params_cuts_long_values_with_a_marker_and_long_keys() -> None:
    flat = flatten_params(
        {"long": "v" * (MAX_VALUE + 1), "exact": "w" * MAX_VALUE, "k" * 300: 1, "nested": {}}
    )
    assert len(flat["long"]) <= MAX_VALUE
    assert flat["long"].endswith("...(truncated)") and flat["long"].startswith("v" * 5000)
    assert flat["exact"] == "w" * MAX_VALUE
    assert flat["k" * MAX_KEY] == "1"
    long_list = flatten_params({"xs": list(range(3000))})["xs"]
    assert len(long_list) <= MAX_VALUE and long_list.endswith("...(truncated)")
