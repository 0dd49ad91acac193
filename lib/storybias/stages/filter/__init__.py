"""Stage 02 ``filter``: classify every story of the run and write filtered.parquet, vsr.parquet and
manifest_filter.json.

Why two modules: the stage is named ``filter`` everywhere (Make target, notebook, params section,
manifest), and this module is its ``run()``. The checks it applies -- fastText language
identification, refusal patterns, each design's validity rule, the valid-story rate -- stay in
:mod:`storybias.stages.filter.langid`, because they are one concern that later stages call on their own
(``langid.reason_flags`` in the figures) without running stage 02; the valid stories later stages read
are ``storybias.summaries.valid_stories``. The package name shadows the builtin ``filter`` only where
imported bare; import it as ``from storybias.stages import filter as filter_stage``.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from tqdm.auto import tqdm

from storybias.config.params import Params
from storybias.config.plan import stories_schema
from storybias.core import artifacts
from storybias.core.io import parquet_file
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult
from storybias.stages.filter.langid import (
    INVALID_REASONS,
    classify,
    invalid_examples,
    refusal_rule_counts,
    summary,
    vsr_table,
)
from storybias.summaries import vsr_by_language

BATCH_ROWS = 20_000  # stories classified and written at a time
SHOWN_TEXT = 240  # characters of each text in the frame run() returns (notebook 02 shows 160)

# the columns stage 02 adds to stories.parquet, typed explicitly: on a run where no story is refused
# (say) a column of Nones keeps its type
LID_FIELDS = (
    ("lid_lang", pa.string()),
    ("lid_prob", pa.float64()),
    ("refusal_rule", pa.string()),
    ("is_refusal", pa.bool_()),
    ("invalid_reason", pa.string()),
    ("is_valid", pa.bool_()),
)
# vsr.parquet, in the column order langid.vsr_table builds; its keys large_string, the type the file
# had when written from the frame's inferred types (the registry keeps the file as it was)
VSR_SCHEMA = pa.schema(
    [
        ("design", pa.large_string()),
        ("model", pa.large_string()),
        ("language", pa.large_string()),
        ("n_stories", pa.int64()),
        ("n_valid", pa.int64()),
        *[(f"n_{r}", pa.int64()) for r in INVALID_REASONS],
        ("vsr", pa.float64()),
    ]
)

# the columns this stage cannot work without: a file without one is named with the column
STORY_KEY_COLUMNS = ("story_id", "design", "language", "model", "text")


def filtered_schema() -> pa.Schema:
    """filtered.parquet: every column of stories.parquet, then the six stage 02 adds."""

    schema = stories_schema()
    for name, kind in LID_FIELDS:
        schema = schema.append(pa.field(name, kind))
    return schema.remove_metadata()


@holds_run_lock("filter")
def run(params: Params, progress: bool = True) -> StageResult:
    """Stage 02: classify every story of the run, write filtered.parquet, vsr.parquet and its manifest.

    The stories are read and written ``BATCH_ROWS`` at a time, so an imported corpus of 650,000 stories
    is never held whole. The result's ``filtered`` is filtered.parquet without ``prompt`` and with each text
    cut to its first ``SHOWN_TEXT`` characters after leading white space (emptiness, the only check read
    back from the text, is unchanged); the file holds every text whole."""
    run_name = params.run_name
    stories_file = artifacts.path(run_name, "stories")
    if not stories_file.is_file():
        raise FileNotFoundError(f"{stories_file} is missing: run stage 01 first (make generate)")
    settings = params.filter
    exclude = settings.exclude.model_dump()
    source = parquet_file(stories_file, required=STORY_KEY_COLUMNS)  # names a bad file and column
    shown: list[pd.DataFrame] = []
    with (
        artifacts.writer(run_name, "filtered") as write_batch,
        tqdm(total=source.metadata.num_rows, desc="filter", unit="story", disable=not progress, mininterval=5) as bar,
    ):
        for batch in source.iter_batches(batch_size=BATCH_ROWS):
            classified = classify(batch.to_pandas(), settings.lid_threshold, exclude)
            write_batch(pa.Table.from_pandas(classified, preserve_index=False))
            shown.append(_shown(classified))
            bar.update(len(classified))
    filtered = pd.concat(shown, ignore_index=True) if shown else _shown(filtered_schema().empty_table().to_pandas())
    vsr = vsr_table(filtered)
    manifest = {"stage": "filter", **summary(filtered), "params": params.resolved()["filter"]}
    artifacts.write(run_name, "manifest_filter", manifest)
    artifacts.write(run_name, "vsr", vsr)
    values = {**summary(filtered), "vsr_overall": vsr_by_language(vsr, "bedtime")}
    tables = {
        "filtered": filtered,
        "vsr": vsr,
        "invalid_examples": invalid_examples(filtered),
        "refusal_rules": refusal_rule_counts(filtered),
    }
    return StageResult("filter", run_name, tables=tables, manifest=manifest, values=values)


def _shown(classified: pd.DataFrame) -> pd.DataFrame:
    """A classified batch as run() returns it: no prompt, each text cut to SHOWN_TEXT characters."""
    out = classified.drop(columns=["prompt"], errors="ignore")
    out["text"] = out["text"].fillna("").astype(str).str.lstrip().str.slice(0, SHOWN_TEXT)
    return out
