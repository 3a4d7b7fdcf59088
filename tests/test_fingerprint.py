"""The config fingerprint is stable and sees exactly the keys that matter."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from pathlib import Path

import pytest

from furcate_hydra.store.fingerprint import fingerprint

CONFIG = {
    "batch_size": 32,
    "learning_rate": 1e-3,
    "model": {"hidden_sizes": [64, 32], "dropout": 0.1},
    "data": {"name": "digits", "num_workers": 4, "dir": "/data"},
    "hydra": {"job": {"num": 3}},
}


def test_key_order_and_hydra_node_do_not_matter() -> None:
    reordered = {
        "hydra": {"job": {"num": 99}, "run": {"dir": "elsewhere"}},
        "data": {"dir": "/data", "num_workers": 4, "name": "digits"},
        "model": {"dropout": 0.1, "hidden_sizes": [64, 32]},
        "learning_rate": 0.001,
        "batch_size": 32,
    }
    assert fingerprint(reordered) == fingerprint(CONFIG)
    assert len(fingerprint(CONFIG)) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"batch_size": 64},
        {"batch_size": 32.0},  # a float is not the int it equals
        {"batch_size": True},
        {"learning_rate": 1.0000000000000002e-3},
        {"model": {"hidden_sizes": [32, 64], "dropout": 0.1}},  # list order matters
        {"model": {"hidden_sizes": [64, 32], "dropout": 0.1, "extra": None}},
    ],
)
def test_any_relevant_change_changes_it(change: dict[str, object]) -> None:
    assert fingerprint({**CONFIG, **change}) != fingerprint(CONFIG)


def test_ignored_keys_do_not_count_and_missing_ones_are_skipped() -> None:
    ignore = ["data.num_workers", "data.dir", "not.there"]
    other = {**CONFIG, "data": {"name": "digits", "num_workers": 0, "dir": "/scratch"}}
    assert fingerprint(other, ignore) == fingerprint(CONFIG, ignore)
    assert fingerprint(other) != fingerprint(CONFIG)
    # ignoring must not alter the caller's config
    assert CONFIG["data"] == {"name": "digits", "num_workers": 4, "dir": "/data"}


def test_same_across_processes_and_hash_seeds() -> None:
    code = f"from furcate_hydra.store.fingerprint import fingerprint;print(fingerprint({CONFIG!r}))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("0", "1", "12345")
    }
    assert seen == {fingerprint(CONFIG)}


def test_special_values_are_stable_and_distinct() -> None:
    class Color(enum.Enum):
        RED = 1

    values = [float("nan"), float("inf"), Color.RED, Path("/a/b"), b"\x00\x01", "nan"]
    prints = [fingerprint({"x": value}) for value in values]
    assert len(set(prints)) == len(values)
    assert prints == [fingerprint({"x": value}) for value in values]


def test_unhashable_value_names_its_key() -> None:
    with pytest.raises(TypeError, match=r"<root>\.model\.layer has type object"):
        fingerprint({"model": {"layer": object()}})
