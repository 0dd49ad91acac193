"""Stage 01 on a profile with ``corpus:``: import a published corpus into stories.parquet instead of generating.

The released StereoTales shards (``storybias.config.corpus``) are read twice, shard by shard with pyarrow,
so the raw corpus is never held in memory:

1. :func:`read_plan` reads every column but the stories' text, checks each row (a label outside the
   taxonomy, an unknown scenario, language or prompt template, a model or id empty or spelled as a missing
   value, an extraction with a label outside the taxonomy or nested too deeply, a column stored as anything but
   text stops the stage with the file, the row and the column), keeps the languages, models and prompt
   variants the profile asks for, and draws the sample;
2. :func:`write_import` reads the kept rows' text and published extraction and writes ``stories.parquet``
   (the same contract as a generated run's: ``design`` stereotales, ``cond_attribute`` / ``cond_value`` the
   canonical keys of ``target_attribute`` / ``attribute_value_key``, ``cond_scenario`` from
   ``scenario_key``, ``model`` the ``generator_model``) and ``corpus.parquet`` (the source ids, the prompt
   template and the published extraction, which stage 03 maps).

Every model of the release answered the same prompts, so an ``output_id`` recurs once per model: a
released story is (``generator_model``, folder, ``output_id``), the folder being the row's language
(storybias' code) or ``additional_en``. Its id is the first 16 hex characters of
sha256("import|model|folder|output_id"), stable across samples and subsets; the same triple twice stops
the import, naming both rows. The import writes both files under temporary names and renames them when
done, so a kill loses only the import's own minutes and a rerun repeats it, never duplicating a row.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from storybias.config import designs
from storybias.config.corpus import (
    ADDITIONAL_FOLDER,
    ADDITIONAL_TEMPLATES,
    RELEASE_LANGUAGE,
    SCENARIO_TEMPLATE,
    TEXT_COLUMNS,
    CorpusSettings,
    corpus_files,
)
from storybias.config.plan import stories_schema
from storybias.config.prompts import LANGUAGES
from storybias.core import artifacts
from storybias.core.inputs import missing_marker, shortened, shown, type_problem
from storybias.evidence.stereotales_taxonomy import ProfileError, canonical_value, published_profile, scenario_of

PLAN_READ = [
    "sample_id",
    "output_id",
    "generator_model",
    "language",
    "target_attribute",
    "attribute_value_key",
    "scenario_key",
    "prompt_template",
    "user_prompt",
    "extracted_attributes_json",
]
BATCH_ROWS = 50_000  # one released shard
# what identifies a released story (the plan's column -> the release's name for it)
# A name or id of an imported story (a model, an id): no control character, at most this many UTF-8 bytes
# (a file name holds 255 bytes; the stages add a prefix and a suffix to a model's name)
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME_BYTES = 200
RELEASE_KEY = {"model": "generator_model", "folder": "folder", "output_id": "output_id"}
SEP = "\x1f"  # joins a dimension and its label into one lookup key
IMPORTED = "imported"  # finish_reason of an imported story: the release records none

CORPUS_SCHEMA = pa.schema(
    [
        ("story_id", pa.string()),
        ("source_file", pa.string()),  # relative to corpus.path
        ("source_row", pa.int64()),  # the row in that file, from 0
        ("sample_id", pa.string()),  # the release's prompt id
        ("output_id", pa.string()),  # the release's story id
        ("prompt_template", pa.string()),  # scenario_based, or an additional_en variant
        ("additional_en", pa.bool_()),
        ("published_extraction", pa.string()),  # extracted_attributes_json as released
    ]
)


class CorpusError(ValueError):
    """A corpus file holds something the import cannot read; the message names the file, row and column."""


def story_id_of(*identity: str) -> str:
    """The id of an imported story from what identifies it in its source (a release's model, folder and
    output id; a table's id, or its file and row)."""
    return hashlib.sha256(("import|" + "|".join(identity)).encode()).hexdigest()[:16]


def row_location(file: Path, row: int, column: str) -> str:
    return f"{file}: row {row}, column {column}"


def map_column(values: pd.Series, column: str, mapper: Callable[[Any], Any], file: Path, offset: int) -> pd.Series:
    """``mapper`` over the distinct ``values`` (of ``column``); the first failure names its file, row and column."""
    mapped: dict[Any, Any] = {}
    for value in values.dropna().unique():
        try:
            mapped[value] = mapper(value)
        except (KeyError, TypeError, ValueError) as exc:
            row = int(values.index[values.eq(value)][0])
            raise CorpusError(f"{row_location(file, offset + row, column)}: {reason(exc)}") from None
    if values.isna().any():
        raise CorpusError(f"{row_location(file, offset + int(values.index[values.isna()][0]), column)}: empty")
    return values.map(mapped)


def reason(exc: BaseException) -> str:
    """An exception's message, short (a KeyError's without the quotes ``str`` adds)."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return shortened(text)


def release_language(code: Any) -> str:
    if not isinstance(code, str):
        raise ValueError(f"language {shown(code)} is not a string")
    language = RELEASE_LANGUAGE.get(code, code)
    if language not in LANGUAGES:
        raise ValueError(f"language {shown(code)} is not one of storybias' ({', '.join(LANGUAGES)})")
    return language


def _template(value: Any) -> str:
    if value != SCENARIO_TEMPLATE and value not in ADDITIONAL_TEMPLATES:
        allowed = ", ".join((SCENARIO_TEMPLATE, *ADDITIONAL_TEMPLATES))
        raise ValueError(f"prompt template {shown(value)} is not one of {allowed}")
    return str(value)


def _attribute(value: Any) -> str:
    if value not in designs.dimensions():
        raise ValueError(f"target attribute {shown(value)} is not one of StereoTales' 19 dimensions")
    return str(value)


def name_problems(values: pd.Series, column: str, file: Path, offset: int) -> None:
    """A column of names or ids (a model, a story id): none empty, none a spelled-out missing value
    (``NaN``, ``null``, ...), which spreadsheets write for an empty cell; the first names its row."""
    text = values.map(lambda v: v if isinstance(v, str) else "")
    bad = values.isna() | text.str.strip().eq("") | text.map(missing_marker)
    if bad.any():
        row = int(bad.to_numpy().argmax())
        value = values.iloc[row]
        what = "empty" if not text.iloc[row].strip() else f"{shown(value)} is a missing value, not a name"
        raise CorpusError(f"{row_location(file, offset + int(values.index[row]), column)}: {what}")
    # names become file names and figure labels: no control character (a NUL made a second model), and at
    # most MAX_NAME_BYTES bytes (a 100,000-character model name failed stage 04 with "File name too long")
    unusable = text.str.contains(CONTROL_CHARACTERS) | text.map(lambda v: len(v.encode("utf-8")) > MAX_NAME_BYTES)
    if unusable.any():
        row = int(unusable.to_numpy().argmax())
        value = text.iloc[row]
        what = (
            f"{shown(value)} holds a control character"
            if CONTROL_CHARACTERS.search(value)
            else f"a name of {len(value.encode('utf-8')):,} bytes (at most {MAX_NAME_BYTES})"
        )
        raise CorpusError(f"{row_location(file, offset + int(values.index[row]), column)}: {what}")


def _check_profiles(frame: pd.DataFrame, file: Path, offset: int) -> None:
    """Every published extraction's dimensions and labels are the taxonomy's (``{}``, a null and text that
    is not JSON pass: stage 03 keeps and counts them)."""
    for row, text in frame["extracted_attributes_json"].items():
        try:
            published_profile(text)
        except ProfileError as exc:
            place = row_location(file, offset + int(row), "extracted_attributes_json")
            raise CorpusError(f"{place}: {shortened(str(exc))}") from None


def _plan_batch(frame: pd.DataFrame, file: Path, offset: int, settings: CorpusSettings) -> pd.DataFrame:
    """One batch of released rows as planned stories (without text), checked row by row."""
    for column in ("output_id", "generator_model"):
        name_problems(frame[column], column, file, offset)
    language = map_column(frame["language"], "language", release_language, file, offset)
    template = map_column(frame["prompt_template"], "prompt_template", _template, file, offset)
    additional = template.ne(SCENARIO_TEMPLATE)
    keep = pd.Series(True, index=frame.index)
    if settings.languages is not None:
        keep &= language.isin(settings.languages)
    if settings.models is not None:
        keep &= frame["generator_model"].isin(settings.models)
    if not settings.additional_en:
        keep &= ~additional
    if settings.attributes is not None:
        keep &= frame["target_attribute"].isin(settings.attributes)
    rows = frame.index[keep]
    attribute = map_column(frame.loc[rows, "target_attribute"], "target_attribute", _attribute, file, offset)
    labels = frame.loc[rows, "attribute_value_key"]
    pairs = (attribute + SEP + labels).where(labels.notna())  # one lookup per distinct (dimension, label)
    value = map_column(pairs, "attribute_value_key", lambda p: canonical_value(*p.split(SEP)), file, offset)
    scenario_rows = rows[~additional[rows].to_numpy()]
    scenario = map_column(frame.loc[scenario_rows, "scenario_key"], "scenario_key", scenario_of, file, offset)
    _check_profiles(frame.loc[rows], file, offset)
    out = pd.DataFrame(
        {
            "sample_id": frame.loc[rows, "sample_id"],
            "output_id": frame.loc[rows, "output_id"],
            "model": frame.loc[rows, "generator_model"],
            "language": language[rows],
            "folder": language[rows].where(~additional[rows], ADDITIONAL_FOLDER),
            "cond_attribute": attribute,
            "cond_value": value,
            "cond_scenario": scenario.reindex(rows),
            "prompt_template": template[rows],
            "additional_en": additional[rows],
            "prompt": frame.loc[rows, "user_prompt"],
            "source_row": rows.to_numpy() + offset,
        }
    )
    out["source_file"] = str(file)
    return out


def _batches(file: Path, columns: list[str], what: str) -> Iterator[tuple[int, pd.DataFrame]]:
    """(first row, frame) per record batch of one file; a missing column names the file."""
    try:
        source = pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorpusError(f"{file}: not a parquet file ({shortened(str(exc))})") from None
    missing = [c for c in columns if c not in source.schema_arrow.names]
    if missing:
        raise CorpusError(f"{file}: missing column(s) {', '.join(missing)} ({what})")
    wrong = type_problem(file, source.schema_arrow, [c for c in columns if c in TEXT_COLUMNS])
    if wrong:
        raise CorpusError(wrong)
    offset = 0
    batches = source.iter_batches(batch_size=BATCH_ROWS, columns=columns)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:  # a damaged page: name the file and where it stopped
            raise CorpusError(f"{file}: unreadable after row {offset} ({shortened(str(exc))})") from None
        if batch is None:
            return
        frame = batch.to_pandas()
        yield offset, frame
        offset += len(frame)


def draw_sample(plan: pd.DataFrame, sample: int | None, seed: int, per: Sequence[str] = ()) -> pd.DataFrame:
    """At most ``sample`` stories per model x language (x the columns ``per``, e.g. the prompted value):
    those whose sha256(seed|output_id) is smallest, so the draw does not depend on the order of the files
    and a larger sample contains a smaller one. The rank is the output id's alone: the release's models
    share their output ids (one per requested generation), so every model keeps the stories of the same
    prompts and the models are compared on one set of prompts."""
    if sample is None:
        return plan
    rank = plan["output_id"].map(lambda oid: hashlib.sha256(f"{seed}|{oid}".encode()).hexdigest())
    order = plan.assign(_rank=rank).sort_values("_rank", kind="stable")
    kept = order.groupby(["model", "language", *per], sort=False, dropna=False).head(sample).index
    return plan.loc[plan.index.isin(kept)]


def sample_groups(settings: CorpusSettings) -> list[str]:
    """The columns besides model and language that ``corpus.sample`` counts within (``corpus.sample_per``)."""
    if settings.sample_per == "model_language":
        return []
    if settings.design == "stereotales":
        return ["cond_attribute", "cond_value"]
    return list(designs.get(settings.design).conditions)


def _finish_plan(plan: pd.DataFrame) -> pd.DataFrame:
    """The planned-story columns of stories.parquet (plan_columns) for the imported rows."""
    category_of = {
        scenario: category
        for category, scenarios in designs.load_design("stereotales")["scenario_categories"].items()
        for scenario in scenarios
    }
    plan = plan.reset_index(drop=True)
    variant = plan["cond_scenario"].where(~plan["additional_en"], "additional_en:" + plan["prompt_template"])
    plan["design"] = "stereotales"
    plan["prompt_id"] = "stereotales/" + plan["cond_attribute"] + "=" + plan["cond_value"] + "/" + variant
    # the release's additional_en prompts have several stories each: sample numbers a model's by output id
    ranks = plan.groupby(["model", "sample_id"], dropna=False)["output_id"].rank(method="first")
    plan["sample"] = ranks.astype("int64") - 1
    plan["seed"] = None
    plan["cond_scenario_category"] = plan["cond_scenario"].map(category_of)
    for column in designs.all_condition_columns():
        if column not in plan:
            plan[column] = None
    return plan


def read_plan(settings: CorpusSettings, progress: bool = True) -> pd.DataFrame:
    """Pass 1: the corpus' rows the profile keeps, checked, as planned stories (no text yet), in file order."""
    files = corpus_files(settings)
    frames, seen_models = [], set()
    for file in tqdm(files, desc="corpus: read and check", unit="file", disable=not progress):
        for offset, frame in _batches(file, PLAN_READ, f"format {settings.format}"):
            seen_models.update(frame["generator_model"].dropna().unique())
            frames.append(_plan_batch(frame, file, offset, settings))
    plan = checked_plan(frames, seen_models, settings, files, RELEASE_KEY)
    plan["story_id"] = [story_id_of(*key) for key in zip(plan["model"], plan["folder"], plan["output_id"])]
    return _finish_plan(draw_sample(plan, settings.sample, settings.seed, sample_groups(settings)))


def checked_plan(
    frames: list[pd.DataFrame],
    seen_models: set[str],
    settings: CorpusSettings,
    files: Sequence[Path],
    key: dict[str, str],
) -> pd.DataFrame:
    """The files' planned rows together, refused when a ``corpus.models`` name is not among
    ``seen_models``, when nothing is left, or when two rows share their identity: ``key`` maps the
    plan's columns that identify a story to the names the message gives them."""
    missing = sorted(set(settings.models or ()) - seen_models)
    if missing:
        raise CorpusError(
            f"corpus.models: {', '.join(missing)} not in the corpus (its models: {', '.join(sorted(seen_models))})"
        )
    plan = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if plan.empty:
        subsets = f"languages {settings.languages}, models {settings.models}"
        if settings.format == "stereotales":
            subsets += f", additional_en {settings.additional_en}, attributes {settings.attributes}"
        named = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise CorpusError(
            f"corpus.path: no story left in {named} after {subsets} (a file with a header row and no row holds none)"
        )
    repeated = plan.duplicated(list(key), keep=False)
    if repeated.any():
        first = plan.loc[repeated.idxmax(), list(key)]
        same = plan[(plan[list(key)] == first).all(axis=1)].iloc[:2]  # the rows that share the first repeated key
        places = "; ".join(f"{r.source_file}: row {r.source_row}" for r in same.itertuples())
        identity = ", ".join(f"{name} {first[column]!r}" for column, name in key.items())
        raise CorpusError(f"corpus: {identity} appears twice ({places})")
    return plan


def stories_batch(planned: pd.DataFrame, texts: pd.Series) -> pd.DataFrame:
    out = planned.copy()
    out["text"] = texts.fillna("").to_numpy()
    out["finish_reason"] = IMPORTED
    for column in ("n_tokens", "n_prompt_tokens", "gen_config", "generated_at", "error"):
        out[column] = None
    return out


def write_import(run_name: str, plan: pd.DataFrame, root: Path, progress: bool = True) -> dict[str, int]:
    """Pass 2: every planned story's text and published extraction, written as stories.parquet and
    corpus.parquet one released batch at a time. Returns counts (rows, empty stories)."""
    counts = {"rows": 0, "empty_stories": 0}
    names = stories_schema().names
    with artifacts.writer(run_name, "stories") as stories_out, artifacts.writer(run_name, "corpus") as corpus_out:
        bar = tqdm(total=len(plan), desc="corpus: import", unit="story", disable=not progress)
        for file, rows in plan.groupby("source_file", sort=False):
            rows = rows.sort_values("source_row")
            for offset, frame in _batches(Path(str(file)), ["story", "extracted_attributes_json"], "pass 2"):
                here = rows[(rows["source_row"] >= offset) & (rows["source_row"] < offset + len(frame))]
                if here.empty:
                    continue
                picked = frame.iloc[(here["source_row"] - offset).to_numpy()]
                batch = stories_batch(here, picked["story"])
                stories_out(pa.Table.from_pandas(batch[names], schema=stories_schema(), preserve_index=False))
                source = here.assign(
                    source_file=str(Path(str(file)).relative_to(root)) if root.is_dir() else Path(str(file)).name,
                    published_extraction=picked["extracted_attributes_json"].to_numpy(),
                )
                corpus_out(
                    pa.Table.from_pandas(source[CORPUS_SCHEMA.names], schema=CORPUS_SCHEMA, preserve_index=False)
                )
                counts["rows"] += len(here)
                counts["empty_stories"] += int(batch["text"].str.strip().eq("").sum())
                bar.update(len(here))
        bar.close()
    return counts


def import_manifest(settings: CorpusSettings, plan: pd.DataFrame, counts: dict[str, int], seconds: float) -> dict:
    """What stage 01 did on a corpus profile: which files, what it kept, per model x language."""
    per_cell = plan.groupby(["model", "language"]).size().rename("n").reset_index()
    return {
        "stage": "generate",
        "mode": "import",
        "corpus": settings.model_dump(mode="json"),
        "files": sorted(plan["source_file"].unique().tolist()),
        "n_stories": int(counts["rows"]),
        "n_empty_stories": int(counts["empty_stories"]),
        "n_additional_en": int(plan["additional_en"].sum()),
        "generator_models": sorted(plan["model"].unique().tolist()),
        "stories_per_cell": per_cell.to_dict("records"),
        "wall_seconds": round(seconds, 1),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": None,  # no model ran (storybias.core.machine)
    }
