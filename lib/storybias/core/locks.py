"""One writer per run: an advisory lock on ``data/<run>/.lock`` taken by every stage.

Two processes writing one run would collide (two generators pick the same shard index and one
overwrites the other; two ``make metrics`` share one temporary notebook). Every stage therefore
holds ``fcntl.flock`` on the run's lock file while it works; a second process is refused at once
with the holder's pid and stage, before it touches anything.

The kernel releases a flock when its process dies, so a lock left by a killed process is never
"stuck": the next stage takes it over and says whose it was. The lock file's content (pid, stage,
start time) is only for those messages.

Taking the lock first checks that the run's folders are the run's to write
(:func:`storybias.core.run_folders.claim`: a run folder in ``lib/`` or the model weights is refused before
anything is created) and marks a new data folder as the run's; once the lock is held, the temporary files
a killed stage left are removed (:func:`storybias.core.run_folders.remove_stale_temporaries`).

The Make wrapper (``storybias.cli run-stage``) takes the lock and then runs the notebook in a child
kernel; it passes ``STORYBIAS_RUN_LOCK=<lock file>:<pid>`` down so the stage code inside that kernel
knows its parent holds the lock for it and does not wait on itself. Every ``make`` of a stage or of the
paper holds the lock for all its stages (:func:`hold_run`, ``storybias.cli hold-run``), so no other process
(a second ``make``, ``make clean-run``) gets the run between two of them; the stages inherit it.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from storybias.core import paths, run_folders
from storybias.core.derived_runs import seed
from storybias.core.io import current_umask

LOCK_ENV = "STORYBIAS_RUN_LOCK"
T = TypeVar("T")


class RunBusy(RuntimeError):
    """Another live process holds the run's lock."""


# What a command refuses a run for, as a message and an exit status instead of a traceback.
RUN_REFUSALS = (RunBusy, run_folders.RunFolderError)


def refusal_status(exc: Exception) -> int:
    """Print ``storybias: <exc>`` on stderr and return the exit status of the refusal: 3 for a busy run
    (another live process holds its lock), 2 for a run folder that is not the run's (clean-run: or a bad run name)."""
    print(f"storybias: {exc}", file=sys.stderr)
    return 3 if isinstance(exc, RunBusy) else 2


def lock_path(run_name: str) -> Path:
    return paths.run_dir(run_name) / ".lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096).decode("utf-8", "replace").strip()
    try:
        holder = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        holder = {}
    return holder if isinstance(holder, dict) else {}


def _inherited(path: Path) -> bool:
    """True when an ancestor process (still alive) holds this lock for us (see the module docstring)."""
    value = os.environ.get(LOCK_ENV, "")
    held_path, _, pid = value.rpartition(":")
    return held_path == str(path) and pid.isdigit() and _pid_alive(int(pid))


@contextmanager
def run_lock(run_name: str, stage: str, log: Callable[[str], None] = print) -> Iterator[Path]:
    """Hold the run's lock for the duration of the block. Raises RunBusy when another live process
    holds it; re-entrant within one process and for children started inside the block. Raises
    RunFolderError, creating nothing, when the run's folders are not the run's to write."""
    path = lock_path(run_name)
    if _inherited(path):
        yield path
        return
    run_folders.claim(run_name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~current_umask())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            raise RunBusy(
                f"run {run_name!r} is busy (pid {holder.get('pid', '?')}, stage {holder.get('stage', '?')}, "
                f"since {holder.get('since', '?')}): one process at a time may write {paths.run_dir(run_name)}. "
                "Wait for it to finish, or stop it, then rerun."
            ) from None
        previous = _read_holder(fd)
        if previous.get("pid") and previous.get("pid") != os.getpid():
            log(
                f"run {run_name!r}: taking over the lock left by pid {previous['pid']} "
                f"(stage {previous.get('stage', '?')}), which is no longer running"
            )
        leftovers = run_folders.remove_stale_temporaries(run_name)
        if leftovers:
            log(
                f"run {run_name!r}: removed {len(leftovers)} temporary file(s) an interrupted stage left: "
                + ", ".join(str(p) for p in leftovers[:5])
                + (" ..." if len(leftovers) > 5 else "")
            )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(
            fd,
            json.dumps(
                {"pid": os.getpid(), "stage": stage, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            ).encode(),
        )
        previous_env = os.environ.get(LOCK_ENV)
        os.environ[LOCK_ENV] = f"{path}:{os.getpid()}"
        try:
            yield path
        finally:
            if previous_env is None:
                os.environ.pop(LOCK_ENV, None)
            else:
                os.environ[LOCK_ENV] = previous_env
            os.ftruncate(fd, 0)  # a clean release leaves no holder behind
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def hold_run(run_name: str, command: list[str], log: Callable[[str], None] = print, base_run: str = "") -> int:
    """Run ``command`` (a ``make``) holding the run's lock from its start to its end; returns its exit code.
    A run with overrides is seeded from ``base_run`` first (storybias.core.derived_runs.seed), before the
    ``make`` looks at any file.
    The command's processes inherit the lock (``STORYBIAS_RUN_LOCK``); SIGINT and SIGTERM sent to this
    process are passed on to the command, and the lock is released when it ends (or this process dies).
    Raises RunBusy, starting nothing, when another live process holds the run."""
    with run_lock(run_name, "make", log=log):
        seed(base_run or run_name, run_name)
        child = subprocess.Popen(command)

        def forward(signum: int, frame: Any) -> None:
            child.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def holds_run_lock(stage: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a stage's entry point ``run(params, ...)`` so it runs under its run's lock; a run with
    overrides (``params.base_run`` differs from ``params.run_name``) starts from a copy of its base run's
    files the first time (storybias.core.derived_runs.seed), from JupyterLab as from Make."""

    def decorate(func: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(func)
        def locked(params: Any, *args: Any, **kwargs: Any) -> T:
            with run_lock(params.run_name, stage):
                seed(getattr(params, "base_run", params.run_name), params.run_name)
                return func(params, *args, **kwargs)

        return locked

    return decorate


def tracked_files(folder: Path) -> set[Path]:
    """The files under ``folder`` that git tracks, when the folder is inside a git work tree (empty otherwise,
    or without git)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(folder), "ls-files", "-z"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    if listed.returncode != 0:
        return set()
    return {folder / name for name in listed.stdout.split("\0") if name}


def _remove_untracked(folder: Path, tracked: set[Path]) -> None:
    """Delete ``folder`` but the ``tracked`` files in it (and the folders that hold them)."""
    if not tracked:
        shutil.rmtree(folder)
        return
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):  # deepest first
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path not in tracked:
            path.unlink()


def clean_run(run_name: str) -> tuple[list[Path], list[Path]]:
    """Delete the run's own folders (data, reports, figures); returns what was deleted and the files kept.

    Refuses, deleting nothing, unless every folder is the run's own (:func:`storybias.core.run_folders.
    deletable`: where runs live, marked with the run's name, or made by an earlier version and holding
    only what a run writes) and exactly ``<root>/<run_name>`` after resolving links; takes the run's lock
    first, so a run that a ``make`` holds (from its first stage to its last) is never pulled out from
    under it (RunBusy). A file git tracks (the default run's committed figures, in a checkout) is kept,
    with the folders that hold it: only what the run wrote is deleted.
    """

    if not paths.RUN_NAME.match(run_name) or run_name in (".", ".."):
        raise ValueError(f"refusing to clean run {run_name!r}: not a valid run name")
    present = run_folders.deletable(run_name)
    removed: list[Path] = []
    kept: list[Path] = []
    if not present:
        return removed, kept
    with run_lock(run_name, "clean-run"):
        for folder in present:
            tracked = tracked_files(folder)
            _remove_untracked(folder, tracked)
            removed.append(folder)
            kept += sorted(tracked)
    data = paths.run_dir(run_name)
    if data.is_dir() and data not in present and {p.name for p in data.iterdir()} <= {".lock", run_folders.MARKER}:
        shutil.rmtree(data)  # made only to hold the lock
    return removed, kept
