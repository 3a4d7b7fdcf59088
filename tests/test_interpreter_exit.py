"""The tests' exit hook (``interpreter_exit/sitecustomize.py``): what the processes the tests
start still do at exit, and what they skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HOOK = Path(__file__).parent / "interpreter_exit"


def run(code: str, pythonpath: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_process_the_tests_start_loads_the_hook() -> None:
    done = run("import sitecustomize; print(sitecustomize.__file__)", os.environ["PYTHONPATH"])
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == HOOK / "sitecustomize.py"


def test_exit_handlers_still_run_and_only_unreachable_cycles_go_uncollected(
    tmp_path: Path,
) -> None:
    code = f"""
import atexit, pathlib
out = pathlib.Path({str(tmp_path)!r})
atexit.register(lambda: (out / "handler").write_text("ran"))
class Cycle:
    def __del__(self):
        (out / "cycle").write_text("collected")
a, b = Cycle(), Cycle()
a.other, b.other = b, a
del a, b
"""
    plain = run(code, "")
    assert plain.returncode == 0, plain.stderr
    assert (tmp_path / "handler").read_text() == "ran"
    assert (tmp_path / "cycle").read_text() == "collected"  # Python's last collection
    for name in ("handler", "cycle"):
        (tmp_path / name).unlink()
    hooked = run(code, str(HOOK))
    assert hooked.returncode == 0, hooked.stderr
    assert (tmp_path / "handler").read_text() == "ran"
    assert not (tmp_path / "cycle").exists()  # as after os._exit


def test_a_sitecustomize_the_hook_shadows_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    done = run("import builtins; print(getattr(builtins, 'SHADOWED_RAN', False))",
               os.pathsep.join([str(HOOK), str(tmp_path)]))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
