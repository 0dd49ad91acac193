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

from storybias.config.plan import stories_schema
from storybias.core import artifacts
from storybias.core.locks import holds_run_lock
from storybias.stages.filter.langid import INVALID_REASONS, classify, summary, vsr_table

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


def filtered_schema() -> pa.Schema:
    """filtered.parquet: every column of stories.parquet, then the six stage 02 adds."""

    schema = stories_schema()
    for name, kind in LID_FIELDS:
        schema = schema.append(pa.field(name, kind))
    return schema.remove_metadata()


@holds_run_lock("filter")
def run(params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage 02: classify every story of the run, write filtered.parquet, vsr.parquet and its manifest."""
    run_name = params.run_name
    stories_file = artifacts.path(run_name, "stories")
    if not stories_file.is_file():
        raise FileNotFoundError(f"{stories_file} is missing: run stage 01 first (make generate)")
    stories = pd.read_parquet(stories_file)
    settings = params.filter
    filtered = classify(stories, settings.lid_threshold, settings.exclude.model_dump())
    vsr = vsr_table(filtered)
    artifacts.write(
        run_name, "manifest_filter", {"stage": "filter", **summary(filtered), "params": params.resolved()["filter"]}
    )
    artifacts.write(run_name, "filtered", filtered)
    artifacts.write(run_name, "vsr", vsr)
    return filtered, vsr
