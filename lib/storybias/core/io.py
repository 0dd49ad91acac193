"""Crash-safe reading and writing of stage artifacts.

Every file is written to a temporary name in the same folder and renamed into place, so a kill at
any moment leaves either the old file or the new one, never half of one. Long stages write their
results as numbered shards (:class:`ShardStore`); a rerun reads the shards back, skips the keys
they hold, and the final artifact is assembled from them once everything is done.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from storybias.core import paths
from storybias.core.digests import record_written


def current_umask() -> int:
    """The process umask (read by setting and restoring it: Python has no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While a file is being written, turn SIGTERM into SystemExit so the ``except`` below can remove
    the temporary file (the default action would kill the process with the temp file left behind).

    Only in the main thread (signal handlers can only be set there) and only where SIGTERM still has
    its default action: a program that installed its own handler keeps it.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def atomic_open(path: Path, mode: str = "wb", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success fsync it and rename it into place, on any
    error, kill by SIGTERM or interrupt leave ``path`` untouched and remove the temporary file.

    The file gets the mode a plain ``open`` would give it (0666 minus the umask), not mkstemp's 0600,
    so a group or a web server can read the run's tables and explorer.html.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_as_exit():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~current_umask())
            with os.fdopen(fd, mode, **kwargs) as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            record_written(path)  # a run's artifact: its size and sha256 in the run's ledger (core.digests)
            # fsync the folder so the rename itself survives a power cut, not only a kill.
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_parquet_atomic(table: pd.DataFrame | pa.Table, path: Path, schema: pa.Schema | None = None) -> Path:
    """Write a DataFrame or Arrow table to ``path`` atomically (temp file + fsync + rename)."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, schema=schema, preserve_index=False)
    elif schema is not None:
        table = table.cast(schema)
    with atomic_open(path, "wb") as fh:
        pq.write_table(table, fh)
    return path


@contextmanager
def parquet_writer_atomic(path: Path, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
    """A parquet file written batch by batch (``writer.write_table``), renamed into place only when the
    block ends without an error: a kill mid-way leaves the old file or none, never a part of one."""
    with atomic_open(path, "wb") as fh:
        writer = pq.ParquetWriter(fh, schema)
        try:
            yield writer
        finally:
            writer.close()


def write_json_atomic(obj: Any, path: Path) -> Path:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, ensure_ascii=False, default=str)
        fh.write("\n")
    return path


class ArtifactReadError(ValueError):
    """A stage's input table that cannot be read: the message names the file and, for a missing column,
    the column."""


def parquet_file(path: Path, required: Sequence[str] = ()) -> pq.ParquetFile:
    """``path`` opened as a parquet file whose columns include ``required``; a truncated or corrupt file
    (Arrow's message names neither) or a missing column raises :class:`ArtifactReadError` naming the file,
    the column, and the stage to rerun (the one that wrote it)."""
    try:
        source = pq.ParquetFile(path)
    except FileNotFoundError:
        raise ArtifactReadError(f"{path} is missing: rerun the stage that writes it") from None
    except (pa.ArrowException, OSError) as exc:
        raise ArtifactReadError(
            f"{path}: not a readable parquet file (truncated or corrupt: {str(exc)[:200]}); "
            "rerun the stage that writes it"
        ) from None
    missing = [c for c in required if c not in source.schema_arrow.names]
    if missing:
        raise ArtifactReadError(
            f"{path}: no column {', '.join(missing)} (it has {', '.join(source.schema_arrow.names)}); "
            "rerun the stage that writes it"
        )
    return source


def read_parquet_checked(
    path: Path, columns: Sequence[str] | None = None, required: Sequence[str] = ()
) -> pd.DataFrame:
    """``pd.read_parquet(path, columns=columns)``, after :func:`parquet_file` checked the file and that it
    holds ``columns`` and ``required``; an error names the file and the column."""
    parquet_file(path, [*(columns or ()), *required])
    try:
        return pd.read_parquet(path, columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as exc:
        raise ArtifactReadError(f"{path}: cannot be read ({str(exc)[:200]}); rerun the stage that writes it") from None


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema``; a column the schema gained later (nullable) is added as nulls, so
    shards written before it existed stay readable."""
    for f in schema:
        if f.name not in table.column_names and f.nullable:
            table = table.append_column(f, pa.nulls(len(table), f.type))
    return table.select(schema.names).cast(schema)


class ShardStore:
    """Append-only results of a resumable stage: ``<folder>/part-000000.parquet``, ...

    Each shard is written atomically, so after a kill the folder holds only complete shards.
    ``done_keys`` tells a rerun what to skip; ``read_all`` de-duplicates on the key column (a row can
    only appear twice if a shard was written and the process died before it could record that,
    which the atomic rename rules out, but the guarantee is cheap to keep).
    """

    def __init__(self, folder: Path, key: str, schema: pa.Schema):
        self.folder = folder
        self.key = key
        self.schema = schema
        folder.mkdir(parents=True, exist_ok=True)

    def shard_paths(self) -> list[Path]:
        return sorted(self.folder.glob("part-*.parquet"))

    def _next_index(self) -> int:
        paths = self.shard_paths()
        return int(paths[-1].stem.split("-")[1]) + 1 if paths else 0

    def append(self, rows: Sequence[dict[str, Any]]) -> Path | None:
        if not rows:
            return None
        table = pa.Table.from_pylist(list(rows), schema=self.schema)
        return write_parquet_atomic(table, self.folder / f"part-{self._next_index():06d}.parquet")

    def done_keys(self) -> set[str]:
        keys: set[str] = set()
        for path in self.shard_paths():
            keys.update(pq.read_table(path, columns=[self.key]).column(self.key).to_pylist())
        return keys

    def read_all(self) -> pa.Table:
        paths = self.shard_paths()
        if not paths:
            return self.schema.empty_table()
        table = pa.concat_tables([_conform(pq.read_table(p), self.schema) for p in paths])
        frame = table.to_pandas()
        frame = frame.drop_duplicates(subset=[self.key], keep="first")
        return pa.Table.from_pandas(frame, schema=self.schema, preserve_index=False)

    def clear(self) -> None:
        for path in self.shard_paths():
            path.unlink()
        for leftover in self.folder.glob(".*.tmp"):
            leftover.unlink()


def values_path(run_name: str, stage: str) -> Path:

    return paths.run_dir(run_name) / "values" / f"{stage}.json"


def record_values(run_name: str, stage: str, **values: Any) -> dict[str, Any]:
    """Store named values a notebook computed (counts, statistics) in data/<run>/values/<stage>.json.

    Tests and reviewers read these instead of scraping notebook outputs; repeated calls merge.
    """
    path = values_path(run_name, stage)
    current = read_json(path) if path.is_file() else {}
    current.update(values)
    write_json_atomic(current, path)
    return current


def artifact_schema(path: Path) -> pd.DataFrame:
    """Column names and Arrow types of a parquet artifact, read from its footer (no data is loaded).

    The notebooks show it under the data contract, and nbval compares it with the committed output:
    a changed column name or type fails the test even when the values themselves vary between runs.
    """
    schema = pq.read_schema(path)
    return pd.DataFrame({"column": schema.names, "type": [str(t) for t in schema.types]})


# --- the one YAML loader ---------------------------------------------------------------------------

# Lists and mappings nested deeper than this are refused (the deepest shipped file nests 6 levels;
# PyYAML builds a nested value recursively, so a file of 10,000 `[` would end in a RecursionError).
MAX_YAML_DEPTH = 32
NO_ALIASES = (
    "YAML anchors (&name) and aliases (*name) are not accepted; write the value out in full (PyYAML's dump "
    "writes them for one object used twice: dump copies)"
)


class YamlRefusedError(ValueError):
    """A YAML file storybias will not read; the message names the file, the line and the reason."""


class DuplicateKeyError(YamlRefusedError):
    """A mapping in a YAML file repeats a key; the message names the file, the line and the key."""


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _Refused(yaml.composer.ComposerError):
    pass


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a repeated key in any mapping (PyYAML silently keeps the last
    value, so a profile with two ``seed:`` lines would run with whichever came second)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *anchor` may be overridden by the mapping's own keys, as YAML intends
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class raises its own error below
                    continue
                if first is not None:
                    raise _DuplicateKey(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r} (first at line {first.start_mark.line + 1})",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


MAX_INTEGER_DIGITS = 40  # an integer written with more digits is refused (a seed is at most 19)


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """YAML's int, refused when it has more than MAX_INTEGER_DIGITS digits (Python refuses 4,300 without
    naming the file or the line)."""
    digits = sum(c.isdigit() for c in str(node.value))
    if digits > MAX_INTEGER_DIGITS:
        raise _Refused(None, None, f"an integer of {digits:,} digits (at most {MAX_INTEGER_DIGITS})", node.start_mark)
    return int(yaml.SafeLoader.construct_yaml_int(loader, node))


StrictSafeLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


class SafeFileLoader(StrictSafeLoader):
    """What reads every YAML file of storybias (:func:`read_yaml_strict`): :class:`StrictSafeLoader`, with
    no anchor or alias (``&a`` / ``*a``) and no nesting deeper than :data:`MAX_YAML_DEPTH`.

    Aliases are refused while the file is parsed, before any value is built: a 431-byte profile of
    nested aliases stands for a billion strings, and validating it (or hashing it for a stage stamp)
    kept ``check-params`` busy for minutes at gigabytes of memory. No storybias file needs one.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            found = f"alias *{event.anchor}" if isinstance(event, yaml.AliasEvent) else f"anchor &{event.anchor}"
            raise _Refused(None, None, f"{found}: {NO_ALIASES}", event.start_mark)
        if not isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(None, None, f"lists and mappings nested deeper than {MAX_YAML_DEPTH}", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_yaml_strict(source: Path) -> Any:
    """Parse a YAML file (a profile, a design, refusal patterns, cues, the lexicon, the gold set, the
    taxonomy) with :class:`SafeFileLoader`: a repeated key (PyYAML would silently keep the last value), an
    anchor or alias, or nesting deeper than :data:`MAX_YAML_DEPTH` raises :class:`YamlRefusedError` naming
    the file and the line, before any value is built."""
    with open(source, encoding="utf-8") as fh:
        try:
            return yaml.load(fh, Loader=SafeFileLoader)  # noqa: S506 - a SafeLoader subclass
        except _DuplicateKey as exc:
            mark = exc.problem_mark
            raise DuplicateKeyError(
                f"{source}:{mark.line + 1}: {exc.problem}; each key may appear once per mapping"
            ) from None
        except _Refused as exc:
            mark = exc.problem_mark
            raise YamlRefusedError(f"{source}:{mark.line + 1}: {exc.problem}") from None
        except UnicodeDecodeError:
            line = first_undecodable_line(source)
            raise YamlRefusedError(f"{source}:{line}: not UTF-8 text (save the file as UTF-8)") from None


def first_undecodable_line(path: Path) -> int:
    """The number of the first line of ``path`` that is not UTF-8 (0 when every line is)."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0
