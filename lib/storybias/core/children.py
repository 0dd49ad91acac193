"""Worker processes that end with their parent (issue #58 item 7): ``kill -9`` of a stage's process group 4 s
into stage 04 left two forked workers of about 250 MB each asleep under PID 1. A pool started with
``initializer=die_with_parent, initargs=(os.getpid(),)`` (:func:`pool_options`) asks Linux to SIGKILL each
worker when the process that started it dies (``prctl(PR_SET_PDEATHSIG)``), whatever killed it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """In a worker: be killed (SIGKILL) when the parent process dies; exit at once when ``parent`` (the pid of
    the process that started this worker) is already gone. Nothing on systems other than Linux."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def pool_options() -> dict[str, Any]:
    """``ProcessPoolExecutor`` keyword arguments whose workers die with this process."""
    return {"initializer": die_with_parent, "initargs": (os.getpid(),)}
