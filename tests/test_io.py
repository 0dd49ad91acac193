"""Atomic artifacts, shard stores, and the embedded model's chunk assembly (on small fake chunks)."""

from __future__ import annotations

import hashlib

import pandas as pd
import pyarrow as pa
import pytest

from storybias.config import models
from storybias.core import io


def test_atomic_write_leaves_old_file_on_error(tmp_path):
    target = tmp_path / "a.json"
    io.write_json_atomic({"v": 1}, target)
    with pytest.raises(RuntimeError):
        with io.atomic_open(target, "w", encoding="utf-8") as fh:
            fh.write("{partial")
            raise RuntimeError("killed mid-write")
    assert io.read_json(target) == {"v": 1}
    assert not list(tmp_path.glob(".*.tmp")), "the temporary file is removed"


def test_shard_store_resume_and_dedupe(tmp_path):
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    store = io.ShardStore(tmp_path / "shards", key="k", schema=schema)
    store.append([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    store.append([{"k": "b", "v": 3}, {"k": "c", "v": 4}])
    assert store.done_keys() == {"a", "b", "c"}
    table = store.read_all().to_pandas()
    assert list(table["k"]) == ["a", "b", "c"] and list(table["v"]) == [1, 2, 4]  # first write wins
    store.clear()
    assert store.done_keys() == set()


def _parts(tmp_path, n=12):
    parts = []
    for i in range(1, n + 1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(bytes([i]) * 1000)
        parts.append(p)
    return parts


def test_join_parts_checks_sha256_and_order(tmp_path):
    parts = _parts(tmp_path)
    expected = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    target = tmp_path / "model.gguf"
    assert models.join_parts(parts, target, expected) == expected
    assert target.stat().st_size == 12_000
    # text order (1, 10, 11, 12, 2, ...) gives another file: refused, nothing left behind
    target.unlink()
    text_order = sorted(parts, key=lambda p: str(int(p.stem[4:])))
    with pytest.raises(models.ModelError, match="sha256"):
        models.join_parts(text_order, target, expected)
    assert not target.exists() and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("key", sorted(models.EMBEDDED))
def test_embedded_parts_are_found_in_numeric_order(key):
    weights = models.embedded_weights(key)
    parts = models.embedded_part_paths(key)
    assert len(parts) == weights.parts
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, weights.parts + 1)]
    assert sum(p.stat().st_size for p in parts) == weights.size


def test_unknown_embedded_model_is_named():
    with pytest.raises(models.ModelError, match="no embedded model 'tiny'.*qwen2.5-coder-1.5b"):
        models.embedded_weights("tiny")


def test_artifact_schema_reads_names_and_types_from_the_footer(tmp_path):
    from storybias.core.io import artifact_schema, write_parquet_atomic

    path = write_parquet_atomic(
        pd.DataFrame({"story_id": ["a"], "n": [1], "ok": [True], "words": [["x"]]}), tmp_path / "t.parquet"
    )
    schema = artifact_schema(path)
    assert list(schema["column"]) == ["story_id", "n", "ok", "words"]
    assert list(schema["type"])[1:3] == ["int64", "bool"] and schema["type"].iloc[3].startswith("list<")


def test_embedded_models_built_side_by_side_report_a_workers_error(tmp_path, monkeypatch):
    """Two missing models are built in two processes at once (storybias.config.models.prepare_embedded_models);
    a worker's failure reaches the caller as its own exception, naming the path, and is not swallowed."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the models folder should be")
    monkeypatch.setenv("STORYBIAS_MODELS", str(blocked / "models"))  # the spawned workers inherit it
    monkeypatch.setattr(models.os, "cpu_count", lambda: 2)  # one process per model even on a 1-core machine
    said: list[str] = []
    with pytest.raises(OSError, match="not-a-folder"):
        models.prepare_embedded_models(sorted(models.EMBEDDED), log=said.append)
    keys = ", ".join(sorted(models.EMBEDDED))
    assert said == [f"assembling embedded models {keys} at the same time, one process each ..."]
