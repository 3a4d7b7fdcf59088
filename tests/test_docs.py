"""The docs: the site builds with warnings as errors, and its options reference is the code's."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from docs.gen_options import (
    ConfigEntry,
    OptionDocError,
    config_entries,
    config_modules,
    expand,
    module_dataclasses,
    render,
    rows,
)

REPO = Path(__file__).resolve().parent.parent
PLUGINS = ("hydra/launcher=furcate", "hydra/sweeper=furcate", "hydra/sweeper=furcate_optuna")
GROUPS = ("hydra/sweeper/sampler", "hydra/sweeper/pruner")


def public_fields(cls: type[object]) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if not f.name.startswith("_") and f.name != "defaults"
    ]


def test_the_reference_lists_every_field_of_every_config_dataclass() -> None:
    entries = config_entries()
    page = "\n".join(render(key, entries) for key in PLUGINS + GROUPS)
    reached = {entry.cls for entry in entries}
    for module in config_modules():
        for cls in module_dataclasses(module):
            if not public_fields(cls):
                continue  # a base class (SamplerConf): only Hydra's _target_
            assert cls in reached, f"{cls.__qualname__} is in no table of the reference"
            for entry in (e for e in entries if e.cls is cls):
                for name in public_fields(cls):
                    assert f"| `{entry.prefix}.{name}` |" in page, (entry.choice, name)


def test_each_row_carries_the_fields_comment_and_default() -> None:
    launcher = render("hydra/launcher=furcate")
    assert (
        "| `hydra.launcher.mlflow.heartbeat_s` | float | `10.0` | seconds between the launcher's "
        "heartbeats on the sweep's run |" in launcher
    )
    assert "| `hydra.launcher.fingerprint_ignore` | list of str | `[]` |" in launcher
    optuna = render("hydra/sweeper=furcate_optuna")
    assert "| `hydra.sweeper.sampler` | config group | `tpe` |" in optuna
    assert "`hydra/sweeper/sampler=NAME`: one of `cmaes`, `grid`" in optuna


# a config module with one documented field; a test adds the fields it needs
MADE_UP_CONF = """
from dataclasses import dataclass

@dataclass
class MadeUpConf:
    # said what it does,
    # over two lines
    documented: int = 1
"""


def _entry_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "") -> ConfigEntry:
    (tmp_path / "made_up_conf.py").write_text(MADE_UP_CONF + extra)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "made_up_conf", raising=False)
    import made_up_conf  # type: ignore[import-not-found]

    cls = made_up_conf.MadeUpConf
    return ConfigEntry("hydra.launcher", "hydra/launcher=x", "hydra/launcher=x", cls, True)


def test_a_plugin_option_without_a_comment_stops_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = _entry_of(tmp_path, monkeypatch, "    bare: float = 2.0\n")
    with pytest.raises(OptionDocError, match=r"hydra\.launcher\.bare .*has no comment above it"):
        rows(entry)


def test_a_comment_over_several_lines_is_one_meaning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [row] = rows(_entry_of(tmp_path, monkeypatch))
    assert (row.key, row.default, row.meaning) == (
        "hydra.launcher.documented",
        "`1`",
        "said what it does, over two lines",
    )


def test_a_details_row_naming_no_option_stops_the_build() -> None:
    page = "<!-- details: hydra/launcher=furcate -->\n| option | meaning |\n|---|---|\n"
    assert "sqlite_wal" in expand(page + "| `mlflow.sqlite_wal` | WAL |\n")
    with pytest.raises(OptionDocError, match="names `jobs_per_gpus`, which is none of its"):
        expand(page + "| `jobs_per_gpus` | typo |\n")


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    options = (site / "reference" / "options" / "index.html").read_text()
    assert "hydra.launcher.mlflow.sqlite_wal" in options
    assert "hydra.sweeper.pruner.n_warmup_steps" in options
    assert "<!-- options:" not in options
    assert not (site / "gen_options.py").exists()


def test_the_readme_starts_with_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (REPO / "README.md").read_text().splitlines()
    commands = [line.strip() for line in readme[:25] if line.startswith("    python3 -m venv")]
    assert len(commands) == 2, commands
    assert commands[0].endswith("python train.py -m batch_size=32,64")
    assert commands[1].endswith("python -m pytest -m 'not gpu' -n 3")
    assert commands[1] in (REPO / ".ci" / "run").read_text()
