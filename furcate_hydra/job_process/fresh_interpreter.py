"""A process forked from a job's process, made to run a command as ``python <command>`` would.

    run_as_interpreter(command, env, cwd), in the fork (never returns):
      what is the parent's, set aside: its database connections, its exit handlers, its
        signal handlers (as exec leaves them: ignored ones stay ignored), its sys streams
        (new ones on the same fds), Hydra's global state, the root logger's handlers, the
        context variables (the command runs in an empty context)
      what a new interpreter has: the environment, working dir, argv, sys.path[0]; torch's,
        numpy's (and, by os.fork, Python's) random streams drawn anew; Lightning's rank from
        LOCAL_RANK; the app's own modules (not the standard library's, the installed
        packages' nor furcate's) forgotten, so that the command imports them anew
      the script or module as __main__ ──► its exit status as the interpreter gives it: its
        SystemExit's code; an uncaught exception's traceback on stderr and 1; a Ctrl-C's
        KeyboardInterrupt as a death by SIGINT; exit handlers it registered run, its
        non-daemon threads waited for
      a failure before the rank's task is entered (``task_entered``: its Hydra callback) ──►
        the rank becomes a new interpreter of the same command after all (exec), said in one
        line: what a warm start could not reproduce (an app's module imported again where a
        library it registers with remembers the first import) costs its speed, never the job

Not made fresh: what the command's own imports would set up again in a new interpreter for a
module that is kept (a library's import-time state, e.g. a registry the app fills at its import:
an OmegaConf resolver of the app's is registered again over the one inherited, as it would be
registered first in a new interpreter), the warnings filters and the loggers below the root
(what is shown, not what is computed), the interpreter's flags, hash seed and gc thresholds.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import gc
import logging
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from furcate_hydra.job_process.app_modules import forget_app_modules
from furcate_hydra.job_process.lightning_private import fresh_lightning_state
from furcate_hydra.new_process import fresh_root_logger, name_process
from furcate_hydra.store import set_aside_inherited_connections

__all__ = ["Command", "run_as_interpreter", "task_entered"]

_entered = False  # the rank's task was entered (its Hydra callback ran)


def task_entered() -> None:
    """Said by the rank's Hydra callback, right before its task: a failure from now on is the
    task's, and ends the rank as it would end a new interpreter."""
    global _entered
    _entered = True


@dataclass(frozen=True)
class Command:
    """``python <script> <args>`` or ``python -m <module> <args>`` of this interpreter."""

    argv: tuple[str, ...]  # the whole command
    script: str | None
    module: str | None
    args: tuple[str, ...]

    @classmethod
    def parse(cls, command: Sequence[str]) -> Command | None:
        """The command, or None where it is not this interpreter running a script or a module
        (another interpreter, or options before the script: what a fork cannot become)."""
        argv = tuple(str(part) for part in command)
        if len(argv) < 2 or argv[0] != sys.executable:
            return None
        if argv[1] == "-m":
            return cls(argv, None, argv[2], argv[3:]) if len(argv) > 2 else None
        if argv[1].startswith("-"):
            return None
        return cls(argv, argv[1], None, argv[2:])


def run_as_interpreter(
    command: Command, env: Mapping[str, str] | None, cwd: str | None
) -> NoReturn:
    """In a fork: become ``command`` run by a new interpreter in ``env`` and ``cwd`` (None:
    this process's), run it, and exit with its status. Never returns into the caller."""
    code = 1
    try:
        _become(command, env, cwd)
        code = _run(command)
    except BaseException:  # furcate's own failure: said, and the rank fails
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        _flush()
        os._exit(code)


def _become(command: Command, env: Mapping[str, str] | None, cwd: str | None) -> None:
    # first: nothing below may reach the parent's sqlite or PostgreSQL connections
    set_aside_inherited_connections()
    _fresh_streams()
    _fresh_signals()
    atexit._clear()  # the parent's (MLflow's, the job's): this process's own run at its end
    gc.freeze()  # the parent's objects: never walked by this process's collections
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.argv = [command.script or "-m", *command.args]  # runpy sets a module's file as [0]
    sys.orig_argv = list(command.argv)
    _fresh_path(command)
    sys.excepthook = sys.__excepthook__
    threading.excepthook = threading.__excepthook__
    GlobalHydra.instance().clear()  # hydra.main refuses to start where it is set
    HydraConfig.instance().cfg = None
    _resolvers_registered_again()
    fresh_root_logger()  # the command's Hydra set-up configures it
    _fresh_random_streams()
    fresh_lightning_state()
    forget_app_modules()
    name_process(Path(sys.executable).name)  # an interpreter's, not the job's


def _run(command: Command) -> int:
    """The command as __main__, in an empty context; its exit status, after its exit
    handlers, as ``Py_RunMain`` gives it."""
    code, interrupted = 0, False
    try:
        contextvars.Context().run(_run_main, command)
    except BaseException as exc:
        if not _entered and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            _exec_cold(command, exc)
        code, interrupted = _ended_by(exc)
    _at_exit()
    if interrupted:  # as CPython ends on an uncaught KeyboardInterrupt: killed by SIGINT
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    return code


def _ended_by(exc: BaseException) -> tuple[int, bool]:
    """The exit status an interpreter gives for ``exc`` escaping its main (a traceback said
    on stderr), and whether it is a Ctrl-C's."""
    if isinstance(exc, SystemExit):
        return _system_exit_code(exc), False
    _print_uncaught(exc)
    return 1, isinstance(exc, KeyboardInterrupt)


def _exec_cold(command: Command, exc: BaseException) -> NoReturn:
    """Become a new interpreter of ``command`` after all (same pid, environment, working dir
    and output; this process's descriptors close, as Python opens them non-inheritable)."""
    print(
        "furcate: this DDP rank starts again as a new interpreter: before its task, the warm "
        f"start failed ({type(exc).__name__}: {exc})",
        file=sys.stderr,
    )
    _flush()
    os.execv(sys.executable, list(command.argv))


def _run_main(command: Command) -> None:
    if command.module is not None:
        runpy.run_module(command.module, run_name="__main__", alter_sys=True)
    elif command.script is not None:
        runpy.run_path(command.script, run_name="__main__")


def _system_exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): said, and a failure
    return 1


def _print_uncaught(exc: BaseException) -> None:
    """The traceback as the interpreter prints it, through ``sys.excepthook``: from the
    command's first frame, not this module's or runpy's (``python -m`` shows two of runpy's)."""
    skipped = {__file__, runpy.__file__, "<frozen runpy>"}
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in skipped:
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # it prints the exception's own


def _at_exit() -> None:
    """What the interpreter does at its end before the process exits: wait for the
    non-daemon threads, run the exit handlers (this process's own), flush the logs."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


# -- what is set aside ---------------------------------------------------------------------


def _fresh_streams() -> None:
    """New ``sys`` streams on fds 0-2, as an interpreter makes them: the parent's may be
    wrapped (a test runner's capture), and a lock of theirs may be held by a thread that
    does not exist here. Line-buffered, as the job's own."""
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        old = getattr(sys, name)
        try:
            stream = open(  # noqa: SIM115 - the process's own streams, never closed
                fd,
                mode,
                buffering=1 if mode == "w" else -1,
                encoding=getattr(old, "encoding", None),
                errors=getattr(old, "errors", None),
                closefd=False,
            )
        except OSError:  # a closed fd: no stream, as in an interpreter started so
            continue
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _fresh_signals() -> None:
    """Each signal as after exec and Python's start: an ignored one stays ignored, a caught
    one is reset (the job's preemption handlers are its own); SIGINT raises
    KeyboardInterrupt, SIGPIPE and SIGXFSZ are ignored."""
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    ignored_by_python = {signal.SIGPIPE, signal.SIGXFSZ}
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if handler is None:  # set outside Python: left as it is
            continue
        fresh: Callable[..., Any] | int = (
            signal.SIG_IGN if handler == signal.SIG_IGN else signal.SIG_DFL
        )
        if signum == signal.SIGINT and fresh == signal.SIG_DFL:
            fresh = signal.default_int_handler
        elif signum in ignored_by_python:
            fresh = signal.SIG_IGN
        if handler != fresh:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, fresh)


def _fresh_path(command: Command) -> None:
    """``sys.path[0]`` as the interpreter sets it: the script's dir, or the working dir for
    ``-m`` (unless it runs with safe paths)."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        return
    first = os.path.dirname(os.path.abspath(command.script)) if command.script else os.getcwd()
    if not sys.path or sys.path[0] != first:
        sys.path.insert(0, first)


def _resolvers_registered_again() -> None:
    """An app's module imported again registers its OmegaConf resolvers again: a name the
    parent had registered is replaced, as a new interpreter registers it for the first time.
    A name registered twice in this process still fails, as it would."""
    register = OmegaConf.register_new_resolver
    registered_here: set[str] = set()

    def register_new_resolver(
        name: str, resolver: Any, *, replace: bool = False, use_cache: bool = False
    ) -> None:
        if not replace and name not in registered_here and OmegaConf.has_resolver(name):
            OmegaConf.clear_resolver(name)
        registered_here.add(name)
        register(name, resolver, replace=replace, use_cache=use_cache)

    setattr(OmegaConf, "register_new_resolver", staticmethod(register_new_resolver))  # noqa: B010


def _fresh_random_streams() -> None:
    """torch's and numpy's global random streams drawn from the OS, as a new interpreter
    seeds them (Python's ``random`` reseeds itself at each fork). torch's thread count is
    left as it is: the job's process has it from the same environment, and Lightning sets it
    in every rank after the launch."""
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        torch.seed()  # the default generator anew; CUDA's is queued, CUDA not being started
        torch.set_grad_enabled(True)
    numpy_random: Any = sys.modules.get("numpy.random")  # not loaded: seeded at its import
    if numpy_random is not None:
        numpy_random.seed()
