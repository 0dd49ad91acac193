"""How Make runs a stage: papermill on the stage's notebook, under the run's lock.

``python -m storybias.cli run-stage STAGE NOTEBOOK PARAMS --target FILE`` does what the Makefile's
recipe used to do in shell, without a shell command line (a checkout or profile path with a space in
it is just an argument):

1. take the run's lock (storybias.core.locks): a second process on the same run is refused at once with
   the holder's pid and stage, and touches nothing (not the temporary notebook, not the target); a run
   folder that is not the run's own is refused (storybias.core.run_folders); the temporary files a
   killed stage left (``NN_name.tmp.ipynb``, ``.<artifact>.<random>.tmp``) are removed;
2. execute the notebook with papermill into ``<reports>/NN_name.tmp.ipynb``, its log in
   ``<reports>/NN_name.log`` (``<reports>``: :func:`storybias.core.paths.reports_dir`, reports/<run>/
   or, under STORYBIAS_DATA, the run folder's reports/);
3. on success, rename the executed notebook to ``<reports>/NN_name.ipynb`` and put in the stage's params
   stamp the digest of the parameters the notebook loaded (storybias.config.input_stamps.settle_stamp: a
   profile edited during the stage makes its result stale, never up to date); on failure, show the
   log's tail and remove the Make target *if this process wrote it*, so Make reruns the stage next
   time. (The Makefile marks the stage targets .PRECIOUS: Make itself never deletes them, because a
   refused second process must not delete the target that the first one just wrote.)

``--report-only`` is Make's answer to a stage whose target is up to date but whose executed notebook is
missing or older (a kill between the target's write and the notebook's rename, or the stage run from
JupyterLab): the notebook runs again, its model calls and embeddings answered from the run's caches,
and the target gets back its modification time afterwards, so the stages after it do not rerun.

While papermill runs, the log is followed and its latest tqdm progress line (items done of planned,
rate, ETA: the bars of generation, extraction, the judge and the embeddings) is echoed to the
terminal: one line rewritten in place when stdout is a terminal, otherwise a new line at most every
30 s and only when the bar moved, so a `make paper` piped to a file stays short.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from storybias.config.input_stamps import READ_ENV, settle_stamp
from storybias.core import paths
from storybias.core.locks import RUN_REFUSALS, refusal_status, run_lock
from storybias.core.run_folders import claim_reports


def papermill_command(
    notebook: Path, output: Path, params_file: Path, overrides: Mapping[str, Any] | None = None
) -> list[str]:
    """papermill's argument list (no shell: every path is one argument, spaces and all); ``overrides``
    (storybias.config.overrides) reach the notebook's ``overrides`` parameter as YAML (JSON)."""
    given = ["-y", json.dumps({"overrides": dict(overrides)})] if overrides else []
    return [
        sys.executable,
        "-m",
        "papermill",
        str(notebook),
        str(output),
        "-k",
        "storybias",
        "--cwd",
        str(paths.repo_root() / "notebooks"),
        "-p",
        "params_file",
        str(params_file),
        *given,
        "--log-output",
        "--no-progress-bar",
    ]


# tqdm's text bar ends in "[elapsed<remaining, rate]" ("[00:12<00:30,  1.95story/s]"), or in
# "[elapsed, rate]" when the total is unknown; a segment cut mid-write has no closing bracket yet.
_TQDM_TAIL = re.compile(r"\[\d+:\d{2}(?::\d{2})?(?:<[^,\]]*)?(?:,[^\]]*)?\]\s*$")


def latest_progress(text: str) -> str | None:
    """The last complete tqdm progress line in ``text`` (tqdm rewrites its bar after a carriage
    return, so the segments between ``\\r`` and ``\\n`` are the bar's successive states)."""
    for segment in reversed(re.split(r"[\r\n]", text)):
        segment = segment.strip()
        if segment and _TQDM_TAIL.search(segment):
            return segment
    return None


class ProgressFollower:
    """Follows a growing log file and echoes its latest tqdm line to ``stream``.

    On a terminal (``stream.isatty()``) the line is rewritten in place at most every
    ``tty_interval`` seconds; elsewhere a new line is written at most every ``interval`` seconds,
    and only when the bar moved. :meth:`close` writes the last state once more if it was not shown.
    """

    def __init__(
        self, log_file: Path, stream: TextIO, interval: float = 30.0, tty_interval: float = 0.5, prefix: str = "   "
    ) -> None:
        self.log_file, self.stream, self.prefix = log_file, stream, prefix
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self.interval = tty_interval if self.tty else interval
        self._offset = 0
        self._tail = ""
        self._latest: str | None = None
        self._shown: str | None = None
        self._shown_at = float("-inf")

    def poll(self, now: float | None = None) -> None:
        """Read what the log gained since the last call; echo the latest bar if one is due."""
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(self._offset)
                new = fh.read()
        except FileNotFoundError:
            return
        self._offset += len(new)
        self._tail += new.decode("utf-8", errors="replace")
        if len(self._tail) > 16384:  # keep the end, from a segment's start (no bar cut at its front)
            cut = self._tail[-16384:]
            self._tail = re.split(r"[\r\n]", cut, maxsplit=1)[-1]
        self._latest = latest_progress(self._tail) or self._latest
        now = time.monotonic() if now is None else now
        if self._latest is not None and self._latest != self._shown and now - self._shown_at >= self.interval:
            self._show(self._latest, now)

    def _show(self, line: str, now: float) -> None:
        text = self.prefix + line
        encoding = getattr(self.stream, "encoding", None)
        if encoding:  # tqdm's block characters on a terminal that cannot show them: '?' rather than a crash
            text = text.encode(encoding, errors="replace").decode(encoding)
        if self.tty:
            width = max(20, shutil.get_terminal_size((120, 20)).columns - 1)
            self.stream.write("\r\x1b[K" + text[:width])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown, self._shown_at = line, now

    def close(self) -> None:
        """Show the final state if it was not shown yet, and end the terminal's rewritten line."""
        self.poll(now=float("inf"))
        if self.tty and self._shown is not None:
            self.stream.write("\n")
            self.stream.flush()


def _mtime(path: Path | None) -> float | None:
    return path.stat().st_mtime_ns if path is not None and path.exists() else None


def _papermill(command: list[str], log_file: Path, follower: ProgressFollower, read_note: str) -> int:
    """Run papermill into ``output``, its log in ``log_file``, echoing its progress; returns its exit code.
    ``read_note`` (``<stage>:<file>``) asks the notebook to note the parameters it loads (READ_ENV)."""
    with open(log_file, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(
            command,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **{READ_ENV: read_note}),
        )
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    follower.poll()
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C): stop papermill too
                proc.terminate()
                proc.wait()
            follower.close()
    return proc.returncode


def run_stage(
    stage: str,
    notebook: Path,
    params_file: Path,
    run_name: str,
    target: Path | None = None,
    log: Callable[[str], None] = print,
    progress: TextIO | None = None,
    progress_interval: float = 30.0,
    report_only: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> int:
    """Execute one stage notebook for ``run_name``; returns the process exit code (0 = success).
    ``overrides``: the run's (storybias.config.overrides), given to the notebook's parameters cell.

    ``progress`` (default: stdout) receives the stage's latest tqdm line while it runs (see
    :class:`ProgressFollower`; ``progress_interval`` is the seconds between lines off a terminal).
    ``report_only``: ``target`` is up to date and only the executed notebook is wanted (see the module
    docstring): the target's modification time is restored after a successful run.
    """
    reports = paths.reports_dir(run_name)
    name = notebook.stem
    tmp_notebook, final_notebook, log_file = (
        reports / f"{name}.tmp.ipynb",
        reports / f"{name}.ipynb",
        reports / f"{name}.log",
    )
    try:
        with run_lock(run_name, stage, log=log):
            claim_reports(run_name)
            target_before = _mtime(target)
            if report_only and (target is None or target_before is None):
                print(f"stage {stage}: --report-only needs its target, and {target} does not exist", file=sys.stderr)
                return 2
            shown = notebook.relative_to(paths.repo_root()) if notebook.is_relative_to(paths.repo_root()) else notebook
            log(f"== stage {stage}: {shown} (params {params_file}, run {run_name}); log: {log_file}")
            if report_only:
                log(
                    f"   {target} is up to date but {final_notebook} is missing or older: running the notebook "
                    "again for it (model answers and embeddings come from the run's caches)"
                )
            stat_before = target.stat() if report_only and target is not None else None
            follower = ProgressFollower(
                log_file, sys.stdout if progress is None else progress, interval=progress_interval
            )
            stamps = paths.run_dir(run_name) / ".params"
            record = stamps / f"{stage}.read"
            record.unlink(missing_ok=True)
            command = papermill_command(notebook, tmp_notebook, params_file, overrides)
            if _papermill(command, log_file, follower, f"{stage}:{record}") != 0:
                tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
                print(f"stage {stage} FAILED: see {log_file} and {tmp_notebook}", file=sys.stderr)
                print("\n".join(tail), file=sys.stderr)
                if target is not None and _mtime(target) != target_before:
                    target.unlink(missing_ok=True)  # half-finished stage: Make must rerun it
                    print(f"removed {target} (written by this failed run)", file=sys.stderr)
                return 1
            os.replace(tmp_notebook, final_notebook)
            if stat_before is not None and target is not None and target.exists():
                os.utime(target, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))
            if not report_only and settle_stamp(stamps / f"{stage}.params", record, target):
                log(f"   the profile changed while stage {stage} ran: its result is stale, and the next make reruns it")
            record.unlink(missing_ok=True)
            return 0
    except RUN_REFUSALS as exc:
        return refusal_status(exc)
