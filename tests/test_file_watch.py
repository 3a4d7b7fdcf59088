"""The live-edit watcher sees content changes once, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

from furcate_hydra.sweeping.file_watch import FileWatcher


def test_a_content_change_is_seen_once(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n")
    watcher = FileWatcher(path)
    assert not watcher.changed()
    path.write_text("a: 2\n")
    assert watcher.changed()
    assert not watcher.changed()


def test_touching_or_rewriting_the_same_text_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n")
    watcher = FileWatcher(path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    path.write_text("a: 1\n")
    assert not watcher.changed()


def test_save_by_rename_counts_once_the_new_file_is_there(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n")
    watcher = FileWatcher(path)
    path.unlink()  # an editor between removing the old file and renaming the new one
    assert not watcher.changed()
    new = tmp_path / "config.yaml.tmp"
    new.write_text("a: 3\n")
    new.replace(path)
    assert watcher.changed()
