"""Files written whole: a reader sees the old file or the new one, with the mode asked for."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from furcate_hydra.atomic import atomic_write_bytes


def test_a_file_is_replaced_whole_with_the_mode_open_would_give(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temp file left


def test_a_private_file_is_never_readable_by_others(tmp_path: Path) -> None:
    # the mode is set before the first byte: no moment where another user could read it
    target = tmp_path / "script.sh"
    atomic_write_bytes(target, b"export SECRET=x\n", durable=False, mode=0o700)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert target.read_bytes() == b"export SECRET=x\n"
