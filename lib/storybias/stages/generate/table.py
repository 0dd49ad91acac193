"""Stage 01 on a profile with ``corpus: {format: table}``: any story table imported into stories.parquet.

A table is one or more CSV, JSONL or parquet files (``corpus.path``) whose columns ``corpus.columns`` names:
the text, the language and the model (required), a story id, the design's condition columns and already
extracted StereoTales dimensions (optional). This serves BiasedTales-ML's released stories, Feng et al.'s
outputs or a lab's own corpus. As for the released StereoTales shards (``storybias.stages.generate.corpus``)
the import runs in two passes over the files: the first reads every mapped column but the text and checks
each row (a language storybias does not know, an empty model or id, an extracted label outside the
taxonomy stops it, naming the file, the row and the column); the second reads the kept rows' text. Each
file is read whole in each pass, one file at a time.

A story's id is sha256("import|" + its source id)[:16], the source id being ``columns.id`` or
``<file>:<row>``. ``corpus.parquet`` keeps the source file and row and, as ``published_extraction``, the
extracted columns as a JSON object, which stage 03 maps with ``corpus.extractions: published``.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from storybias.config import designs
from storybias.config.corpus import CorpusSettings, corpus_files, mapped_columns
from storybias.config.plan import stories_schema
from storybias.core import artifacts, paths
from storybias.evidence.published import UNKNOWN, extraction_value
from storybias.stages.generate.corpus import (
    CORPUS_SCHEMA,
    CorpusError,
    checked_plan,
    draw_sample,
    map_column,
    release_language,
    row_location,
    stories_batch,
    story_id_of,
)


def read_table(file: Path, columns: list[str]) -> pd.DataFrame:
    """``columns`` of one table file, every value as text (null where empty)."""
    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            table = pq.read_table(file, columns=columns)
        elif suffix == ".csv":
            table = pa_csv.read_csv(
                file,
                convert_options=pa_csv.ConvertOptions(
                    include_columns=columns, column_types={c: pa.string() for c in columns}
                ),
            )
        else:
            table = pa_json.read_json(file).select(columns)
    except (pa.ArrowInvalid, KeyError, OSError) as exc:
        wanted = ", ".join(columns)
        raise CorpusError(f"{file}: not a readable {suffix[1:]} table with columns {wanted} ({exc})") from None
    frame = table.to_pandas()
    return frame.astype(object).where(frame.notna(), None)


def _text_column(frame: pd.DataFrame, column: str, file: Path) -> pd.Series:
    values = frame[column].map(lambda v: None if v is None else str(v).strip())
    empty = values.isna() | values.eq("")
    if empty.any():
        raise CorpusError(f"{row_location(file, int(empty.idxmax()), column)}: empty")
    return values


def _extracted_json(frame: pd.DataFrame, extracted: dict[str, str], file: Path) -> pd.Series:
    """The extracted columns of each row as a JSON object of canonical keys (``unknown`` where empty)."""
    mapped = {}
    for dimension, column in extracted.items():
        labels = frame[column].map(lambda v: UNKNOWN if v is None or str(v).strip() == "" else str(v))
        mapped[dimension] = map_column(labels, column, partial(extraction_value, dimension), file, 0)
    if not mapped:
        return pd.Series(None, index=frame.index, dtype=object)
    return pd.DataFrame(mapped).apply(lambda row: json.dumps(row.to_dict()), axis=1)


def _plan_file(file: Path, root: Path, settings: CorpusSettings) -> tuple[pd.DataFrame, set[str]]:
    """One file's kept rows as planned stories (no text), checked row by row, and every model it names."""
    columns = settings.columns
    assert columns is not None
    wanted = sorted(set(mapped_columns(columns).values()) - {columns.text})
    frame = read_table(file, wanted)
    name = str(file.relative_to(root)) if root.is_dir() else file.name
    source_id = _text_column(frame, columns.id, file) if columns.id else pd.Series([f"{name}:{i}" for i in frame.index])
    out = pd.DataFrame(
        {
            "output_id": source_id,
            "model": _text_column(frame, columns.model, file),
            "language": map_column(frame[columns.language], columns.language, release_language, file, 0),
            "published_extraction": _extracted_json(frame, columns.extracted, file),
            "source_row": frame.index.to_numpy(),
        }
    )
    for target, column in columns.conditions.items():
        out[target] = frame[column].map(lambda v: None if v is None else str(v).strip() or None)
    out["source_file"] = str(file)
    keep = pd.Series(True, index=out.index)
    if settings.languages is not None:
        keep &= out["language"].isin(settings.languages)
    if settings.models is not None:
        keep &= out["model"].isin(settings.models)
    return out[keep], set(out["model"])


def _finish_plan(plan: pd.DataFrame, design: str) -> pd.DataFrame:
    """The planned-story columns of stories.parquet: prompt id from the conditions, samples numbered."""
    plan = plan.reset_index(drop=True)
    plan["story_id"] = plan["output_id"].map(story_id_of)
    plan["design"] = design
    conditions = [c for c in designs.all_condition_columns() if c in plan]
    parts = plan[conditions].fillna("-").astype(str) if conditions else pd.DataFrame(index=plan.index)
    plan["prompt_id"] = f"{design}/table" + ("/" + parts.agg("/".join, axis=1) if conditions else "")
    plan["sample"] = plan.groupby(["prompt_id", "model", "language"]).cumcount().astype("int64")
    plan["seed"] = None
    plan["prompt"] = None
    plan["sample_id"] = None
    plan["prompt_template"] = None
    plan["additional_en"] = False
    for column in designs.all_condition_columns():
        if column not in plan:
            plan[column] = None
    return plan


def read_table_plan(settings: CorpusSettings, progress: bool = True) -> pd.DataFrame:
    """Pass 1: every kept row of the table's files, checked, as planned stories (no text yet)."""
    root = paths.resolve(settings.path)
    files = corpus_files(settings)
    frames, seen_models = [], set()
    for file in tqdm(files, desc="table: read and check", unit="file", disable=not progress):
        frame, models = _plan_file(file, root, settings)
        seen_models |= models
        frames.append(frame)
    plan = checked_plan(frames, seen_models, settings, len(files), "corpus.columns.id:")
    return _finish_plan(draw_sample(plan, settings.sample, settings.seed), settings.design)


def write_table_import(
    run_name: str, plan: pd.DataFrame, settings: CorpusSettings, progress: bool = True
) -> dict[str, int]:
    """Pass 2: each planned story's text, written as stories.parquet and corpus.parquet one file at a time."""
    assert settings.columns is not None
    root = paths.resolve(settings.path)
    counts = {"rows": 0, "empty_stories": 0}
    names = stories_schema().names
    with artifacts.writer(run_name, "stories") as stories_out, artifacts.writer(run_name, "corpus") as corpus_out:
        for file, rows in tqdm(plan.groupby("source_file", sort=False), desc="table: import", disable=not progress):
            texts = read_table(Path(str(file)), [settings.columns.text])[settings.columns.text]
            picked = texts.iloc[rows["source_row"].to_numpy()]
            batch = stories_batch(rows, picked.map(lambda v: None if v is None else str(v)))
            stories_out(pa.Table.from_pandas(batch[names], schema=stories_schema(), preserve_index=False))
            source = rows.assign(
                source_file=str(Path(str(file)).relative_to(root)) if root.is_dir() else Path(str(file)).name
            )
            corpus_out(pa.Table.from_pandas(source[CORPUS_SCHEMA.names], schema=CORPUS_SCHEMA, preserve_index=False))
            counts["rows"] += len(rows)
            counts["empty_stories"] += int(batch["text"].str.strip().eq("").sum())
    return counts
