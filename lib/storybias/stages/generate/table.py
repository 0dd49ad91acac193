"""Stage 01 on a profile with ``corpus: {format: table}``: any story table imported into stories.parquet.

A table is one or more CSV, JSONL or parquet files (``corpus.path``) whose columns ``corpus.columns`` names:
the text, the language and the model (required; a constant where the table has no such column), a story
id, the prompt, the design's condition columns (a column or a constant) and already extracted StereoTales
dimensions (optional). A condition's values must be the design's keys, directly or through
``corpus.values`` (a table's ``M`` / ``W`` / ``N`` mapped to ``man`` / ``woman`` / ``non_binary``), and
together they must be one of the design's prompts (a stereotales value of its attribute). This serves
BiasedTales-ML's released stories, Feng et al.'s outputs or a lab's own corpus. As for the released
StereoTales shards (``storybias.stages.generate.corpus``) the import runs in two passes over the files: the
first reads every mapped column but the text and checks each row (a language storybias does not know, an
empty model or id, a condition value the design does not have, an extracted label outside the taxonomy
stops it, naming the file, the row and the column); the second reads the kept rows' text. Each file is read
whole in each pass, one file at a time, by ``storybias.core.inputs`` (check-params' reader too): a parquet
column or a JSONL value that is not text is refused, never converted; a model or id spelled as a missing
value (``NaN``, ``null``) is refused; a story of any length is read.

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
from tqdm.auto import tqdm

from storybias.config import designs
from storybias.config.corpus import (
    Constant,
    CorpusSettings,
    condition_values,
    corpus_files,
    mapped_columns,
    value_problem,
)
from storybias.config.plan import stories_schema
from storybias.core import artifacts, paths
from storybias.core.inputs import TableFileError, read_text_columns
from storybias.evidence.stereotales_taxonomy import UNKNOWN, extraction_value
from storybias.stages.generate.corpus import (
    CORPUS_SCHEMA,
    CorpusError,
    checked_plan,
    draw_sample,
    map_column,
    name_problems,
    release_language,
    row_location,
    sample_groups,
    stories_batch,
    story_id_of,
)


def read_table(file: Path, columns: list[str]) -> pd.DataFrame:
    """``columns`` of one table file, every value text or None (``storybias.core.inputs``: the reader
    check-params uses too; a wrong type, a bad line or an unreadable file stops the import, named)."""
    try:
        return read_text_columns(file, columns)
    except TableFileError as exc:
        raise CorpusError(str(exc)) from None


def _text_column(frame: pd.DataFrame, column: str, file: Path) -> pd.Series:
    """A column of names or ids: stripped, none empty or a spelled-out missing value (NaN, null, ...)."""
    values = frame[column].map(lambda v: None if v is None else v.strip())
    name_problems(values, column, file, 0)
    return values


def _extracted_json(frame: pd.DataFrame, extracted: dict[str, str], file: Path) -> pd.Series:
    """The extracted columns of each row as a JSON object of canonical keys (``unknown`` where empty)."""
    mapped = {}
    for dimension, column in extracted.items():
        labels = frame[column].map(lambda v: UNKNOWN if v is None or v.strip() == "" else v)
        mapped[dimension] = map_column(labels, column, partial(extraction_value, dimension), file, 0)
    if not mapped:
        return pd.Series(None, index=frame.index, dtype=object)
    return pd.DataFrame(mapped).apply(lambda row: json.dumps(row.to_dict()), axis=1)


def _constant(source: str | Constant, frame: pd.DataFrame) -> pd.Series | None:
    """The constant of a mapping, one per row; None when it names a column."""
    if isinstance(source, Constant):
        return pd.Series(source.constant, index=frame.index, dtype=object)
    return None


def _condition(
    values: pd.Series, column: str, target: str, settings: CorpusSettings, allowed: list[str], file: Path
) -> pd.Series:
    """One condition column as the design's keys: stripped, empty as null, mapped by ``corpus.values``;
    a value neither mapped nor a key stops the import naming the file, row and column."""
    mapping = settings.values.get(target, {})
    values = values.map(lambda v: None if v is None else v.strip() or None)
    mapped = values.map(lambda v: mapping.get(v, v) if v is not None else None)
    bad = mapped.notna() & ~mapped.isin(allowed)
    if bad.any():
        row = int(bad.idxmax())
        problem = value_problem(settings.design, target, values[row], allowed)
        hint = (
            f"not in corpus.values.{target} ({', '.join(mapping)})"
            if mapping
            else f"map it with corpus.values.{target}"
        )
        raise CorpusError(f"{row_location(file, row, column)}: {problem}; {hint}")
    return mapped


def _conditions(frame: pd.DataFrame, settings: CorpusSettings, file: Path) -> pd.DataFrame:
    """The mapped condition columns, each value a key of the design, each row's values one of its prompts."""
    assert settings.columns is not None
    allowed = condition_values(settings.design)
    out = pd.DataFrame(index=frame.index)
    for target, source in settings.columns.conditions.items():
        constant = _constant(source, frame)
        out[target] = (
            constant
            if constant is not None
            else _condition(frame[str(source)], str(source), target, settings, allowed.get(target, []), file)
        )
    if len(out.columns) < 2:
        return out
    prompts = {tuple(cell.conditions[t] for t in out.columns) for cell in designs.design_cells(settings.design)}
    foreign = pd.Series([tuple(r) not in prompts for r in out.itertuples(index=False)], index=out.index, dtype=bool)
    outside = out.notna().all(axis=1) & foreign
    if outside.any():
        row = int(outside.idxmax())
        named = " + ".join(s for s in settings.columns.conditions.values() if isinstance(s, str))
        values = ", ".join(f"{t} {out.at[row, t]!r}" for t in out.columns)
        raise CorpusError(f"{row_location(file, row, named)}: {values} is no prompt of design {settings.design}")
    return out


def _plan_file(file: Path, root: Path, settings: CorpusSettings) -> tuple[pd.DataFrame, set[str]]:
    """One file's kept rows as planned stories (no text), checked row by row, and every model it names."""
    columns = settings.columns
    assert columns is not None
    wanted = sorted(set(mapped_columns(columns).values()) - {columns.text})
    frame = read_table(file, wanted)
    name = str(file.relative_to(root)) if root.is_dir() else file.name
    source_id = _text_column(frame, columns.id, file) if columns.id else pd.Series([f"{name}:{i}" for i in frame.index])
    model = _constant(columns.model, frame)
    language = _constant(columns.language, frame)
    out = pd.DataFrame(
        {
            "output_id": source_id,
            "model": model if model is not None else _text_column(frame, str(columns.model), file),
            "language": map_column(
                language if language is not None else frame[str(columns.language)],
                "corpus.columns.language (constant)" if language is not None else str(columns.language),
                release_language,
                file,
                0,
            ),
            "published_extraction": _extracted_json(frame, columns.extracted, file),
            "prompt": frame[columns.prompt] if columns.prompt else None,
            "source_row": frame.index.to_numpy(),
        }
    )
    out = out.join(_conditions(frame, settings, file))
    out["source_file"] = str(file)
    keep = pd.Series(True, index=out.index)
    if settings.languages is not None:
        keep &= out["language"].isin(settings.languages)
    if settings.models is not None:
        keep &= out["model"].isin(settings.models)
    if settings.attributes is not None and "cond_attribute" in out:
        keep &= out["cond_attribute"].isin(settings.attributes)
    return out[keep], set(out["model"])


def _finish_plan(plan: pd.DataFrame, design: str) -> pd.DataFrame:
    """The planned-story columns of stories.parquet: prompt id from the conditions, samples numbered."""
    plan = plan.reset_index(drop=True)
    plan["design"] = design
    conditions = [c for c in designs.all_condition_columns() if c in plan]
    parts = plan[conditions].fillna("-").astype(str) if conditions else pd.DataFrame(index=plan.index)
    plan["prompt_id"] = f"{design}/table" + ("/" + parts.agg("/".join, axis=1) if conditions else "")
    plan["sample"] = plan.groupby(["prompt_id", "model", "language"]).cumcount().astype("int64")
    plan["seed"] = None
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
    plan = checked_plan(frames, seen_models, settings, files, {"output_id": "corpus.columns.id"})
    plan["story_id"] = plan["output_id"].map(story_id_of)
    return _finish_plan(draw_sample(plan, settings.sample, settings.seed, sample_groups(settings)), settings.design)


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
            batch = stories_batch(rows, picked)
            stories_out(pa.Table.from_pandas(batch[names], schema=stories_schema(), preserve_index=False))
            source = rows.assign(
                source_file=str(Path(str(file)).relative_to(root)) if root.is_dir() else Path(str(file)).name
            )
            corpus_out(pa.Table.from_pandas(source[CORPUS_SCHEMA.names], schema=CORPUS_SCHEMA, preserve_index=False))
            counts["rows"] += len(rows)
            counts["empty_stories"] += int(batch["text"].str.strip().eq("").sum())
    return counts
