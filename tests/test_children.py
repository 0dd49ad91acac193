"""Issue #58 item 7: worker processes end with their parent. A stage's process killed with SIGKILL mid-work
(``kill -9`` of the kernel 4 s into stage 04) used to leave its forked workers asleep under PID 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storybias.core import paths

ROOT = paths.repo_root()

# Stage 04's pool (fork) and the embedded models' assembly pool of stages 03-04 (spawn), each started by a
# parent that is then killed while its workers sleep.
PARENTS = {
    "stage 04 (fork)": (
        "import time\nfrom storybias.stages.associations.tables import map_tasks\n"
        "map_tasks(time.sleep, [60.0, 60.0], [1, 1], 2)\n"
    ),
    "embedded-model assembly (spawn)": (
        "import multiprocessing, time\nfrom concurrent.futures import ProcessPoolExecutor\n"
        "from storybias.core.children import pool_options\n"
        "if __name__ == '__main__':\n"
        "    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn'), **pool_options()) as pool:\n"
        "        list(pool.map(time.sleep, [60.0, 60.0]))\n"
    ),
}


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be read


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("name", list(PARENTS))
def test_workers_end_when_their_parent_is_killed_with_sigkill(tmp_path, name):
    script = tmp_path / "parent.py"
    script.write_text(PARENTS[name])
    env = dict(os.environ, PYTHONPATH=str(ROOT / "lib"))
    parent = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # the spawn pool's resource tracker is a child too: the workers are the python processes past it
            workers = [pid for pid in _children(parent.pid) if "resource_tracker" not in _cmdline(pid)]
            if len(workers) >= 2 and all(_initialized(pid) for pid in workers):
                break
            time.sleep(0.2)
        assert len(workers) >= 2, f"{name}: the pool's workers did not start"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        orphans = [pid for pid in workers if _alive(pid)]
        assert orphans == [], f"{name}: workers {orphans} outlived their parent"
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _initialized(pid: int) -> bool:
    """The worker sleeps in its task (wchan hrtimer/nanosleep), so its initializer has run."""
    try:
        return "sleep" in Path(f"/proc/{pid}/wchan").read_text() or "hrtimer" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
