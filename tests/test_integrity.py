"""Issue #58 item 10: corrupt artifacts are noticed. Every artifact a stage writes is recorded with its size
and sha256 in the run's ledger (storybias.core.digests, by the one atomic writer every stage calls); the
`stamps` command run before every `make` of a stage finds a file that no longer matches, names it, and
makes the stage that wrote it rerun (a truncated extractions.parquet with its old mtime used to be "up to
date")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from storybias.core import digests, integrity, io, paths

ROOT = paths.repo_root()
RUN = "pytest-integrity"


@pytest.fixture()
def run(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("STORYBIAS_FIGURES", str(tmp_path / "figures"))
    folder = paths.run_dir(RUN)
    folder.mkdir(parents=True)
    (folder / ".params").mkdir()
    for stage in ("extract", "associations"):
        (folder / ".params" / f"{stage}.params").write_text("digest\n")
    return folder


def _write_extractions(folder: Path) -> Path:
    frame = pd.DataFrame({"story_id": [f"s{i}" for i in range(500)], "value": range(500)})
    io.write_parquet_atomic(frame, folder / "extraction_raw.parquet")
    return io.write_parquet_atomic(frame, folder / "extractions.parquet")


def _keep_times(path: Path, stat: os.stat_result) -> None:
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_the_atomic_writer_records_a_runs_artifacts_and_nothing_else(run):
    written = _write_extractions(run)
    io.write_json_atomic({"x": 1}, run / "work" / "extract" / "shard.json")  # scratch: not recorded
    ledger = digests.read_ledger(RUN)
    assert set(ledger) == {"data/extractions.parquet", "data/extraction_raw.parquet"}
    assert ledger["data/extractions.parquet"]["size"] == written.stat().st_size
    assert ledger["data/extractions.parquet"]["sha256"] == digests.sha256_of(written)
    assert integrity.stale_artifacts(RUN) == []


def test_a_truncated_target_with_its_old_mtime_is_named_and_its_stage_reruns(run):
    target = _write_extractions(run)
    before = target.stat()
    stamp = run / ".params" / "extract.params"
    os.utime(stamp, ns=(before.st_mtime_ns - 10**9, before.st_mtime_ns - 10**9))
    with open(target, "r+b") as fh:
        fh.truncate(before.st_size // 2)
    _keep_times(target, before)
    (stale,) = integrity.stale_artifacts(RUN)
    assert stale.stage == "extract" and stale.path == target and "bytes where its stage wrote" in stale.reason
    lines: list[str] = []
    integrity.invalidate_corrupt(RUN, run / ".params", log=lines.append)
    assert not target.exists(), "the stage's Make target is removed"
    assert stamp.stat().st_mtime_ns > before.st_mtime_ns, "the stamp is newer than the target was"
    assert len(lines) == 1 and str(target) in lines[0] and "stage extract reruns" in lines[0]


def test_same_size_other_content_is_found_by_its_digest(run):
    _write_extractions(run)
    raw = run / "extraction_raw.parquet"
    before = raw.stat()
    data = bytearray(raw.read_bytes())
    data[len(data) // 2] ^= 0xFF
    raw.write_bytes(bytes(data))
    _keep_times(raw, before)
    (stale,) = integrity.stale_artifacts(RUN)
    assert stale.path == raw and "sha256" in stale.reason
    integrity.invalidate_corrupt(RUN, run / ".params", log=lambda m: None)
    assert not (run / "extractions.parquet").exists(), "a non-target artifact removes its stage's target"


def test_the_stamps_command_names_the_corrupt_file_and_removes_the_target(tmp_path):
    env = dict(os.environ, STORYBIAS_DATA=str(tmp_path / "data"), STORYBIAS_FIGURES=str(tmp_path / "figures"))
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = RUN
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "storybias.cli", "stamps", str(profile)]
    first = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    writer = (
        "import pandas as pd, sys\nfrom pathlib import Path\nfrom storybias.core import io\n"
        "io.write_parquet_atomic(pd.DataFrame({'a': range(1000)}), Path(sys.argv[1]))\n"
    )
    target = tmp_path / "data" / RUN / "extractions.parquet"
    subprocess.run([sys.executable, "-c", writer, str(target)], check=True, env=env, timeout=120)
    before = target.stat()
    with open(target, "r+b") as fh:
        fh.truncate(100)
    _keep_times(target, before)
    second = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    assert f"{target} changed since stage extract wrote it" in second.stderr
    assert not target.exists()
    third = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert "changed since" not in third.stderr, "said once: the removed target is Make's to rebuild"
    assert json.loads((tmp_path / "data" / RUN / ".digests.json").read_text())  # the ledger stays
