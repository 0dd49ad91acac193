"""Stage 03's answers combined: the consensus of several extractors, the extraction table assembled
from the final answers, and the agreement between extractors (or between two runs of one extractor).

StereoTales' consensus (``majority``): per field, the extractors whose answer parsed vote, and a
strict majority wins, else ``unknown``. The narrative lists come from the first (primary) extractor.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from storybias.config.designs import demo_columns, extraction_defaults
from storybias.config.params import ExtractionSettings
from storybias.stages.extract.parse import empty_record, explicit_gender, parse_answer, to_record, with_defaults
from storybias.stages.extract.schema import design_sections, extractions_schema
from storybias.stats.agreement import cohen_kappa, fleiss_kappa


def majority(values: Sequence[Any], tie: Any = "unknown") -> Any:
    """The value given by a strict majority of ``values`` (more than half of them), else ``tie``.

    StereoTales' consensus (Giskard-AI/flare, attribute-extraction scorer, ``get_consensus_value``):
    per field, the votes are the answers of the extractors that answered (an extractor whose answer
    did not parse casts no vote), and the most common value wins when it has at least
    len(votes) // 2 + 1 of them; otherwise the field is ``unknown``. So 3 answers a, a, b give a;
    a, b, c give unknown; with one extractor unparsed, two answers a, a give a and a, b unknown; and
    4 answers a, a, b, c give unknown (a plurality is not a majority)."""
    counts = Counter(values).most_common(1)
    if not counts or counts[0][1] < len(values) // 2 + 1:
        return tie
    return counts[0][0]


NARRATIVE_LISTS = ("adjectives_en", "settings", "cultural_refs")


def combine(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Final value per field over the extractors whose answer parsed (``records``): a strict majority
    of them for scalar fields (``majority``; none -> unknown). The narrative lists (adjectives,
    settings, cultural references) come from the first (primary) extractor, as BiasedTales-ML used
    one extractor (Qwen3-14B, Sec. 4.1). One record is returned as it is."""
    if len(records) == 1:
        return dict(records[0])
    out: dict[str, Any] = {}
    for key in records[0]:
        values = [r[key] for r in records]
        if key in NARRATIVE_LISTS:
            out[key] = list(values[0])
        elif key in ("adjectives_orig", "markers"):
            out[key] = values[0]  # surface forms and markers are taken from the first extractor
        elif key == "protagonist_name":
            out[key] = majority([v or "" for v in values], tie="") or None
        else:
            out[key] = majority(values)
    return out


def agreement(per_rater: dict[str, pd.DataFrame], fields: Sequence[str]) -> pd.DataFrame:
    """Per field: kappa across raters (Cohen for two, Fleiss for more), percent agreement, share of
    ``unknown`` and number of stories rated by all. ``per_rater`` maps a rater name to a frame indexed
    by story_id holding the fields."""
    names = list(per_rater)
    common = sorted(set.intersection(*(set(f.index) for f in per_rater.values())))
    rows = []
    for field in fields:
        matrix = [[per_rater[n].at[sid, field] for n in names] for sid in common]
        if len(names) == 2:
            kappa = cohen_kappa([m[0] for m in matrix], [m[1] for m in matrix])
            method = "cohen"
        else:
            kappa = fleiss_kappa(matrix) if matrix else float("nan")
            method = "fleiss"
        agree = float(np.mean([len(set(m)) == 1 for m in matrix])) if matrix else float("nan")
        unknown = float(np.mean([v == "unknown" for m in matrix for v in m])) if matrix else float("nan")
        rows.append(
            {
                "field": field,
                "kappa": kappa,
                "method": method,
                "percent_agreement": agree,
                "share_unknown": unknown,
                "n_stories": len(common),
                "raters": ", ".join(names),
            }
        )
    return pd.DataFrame(rows)


def sample_ids(ids: Sequence[str], n: int | None, seed: int) -> list[str]:
    ids = sorted(ids)
    if n is None or n >= len(ids):
        return ids
    return sorted(random.Random(seed).sample(ids, n))


def final_answers(raw: pd.DataFrame) -> pd.DataFrame:
    """One answer per request (story, extractor, pass and input fingerprint): the last attempt (a retry
    replaces a failure)."""
    if raw.empty:
        return raw
    return raw.sort_values("attempt").groupby("request_key", as_index=False).tail(1)


def _explicit_row(row: Any) -> dict[str, Any]:
    """The row of an explicit-task story: its label word mapped to a gender (no extractor)."""
    record = empty_record(())
    gender = explicit_gender(row.text, row.language)
    record.update(
        protagonist_gender="unknown" if gender == "unidentified" else gender,
        protagonist_gender_fine="unknown" if gender == "unidentified" else gender,
    )
    return {
        "story_id": row.story_id,
        "extractors": ["label-map"],
        "parse_ok": True,
        "n_parse_failures": 0,
        "story_cut": False,
        **record,
        "explicit_label": gender,
        "raw": json.dumps({"label-map": row.text}, ensure_ascii=False),
    }


REFUSAL_CHECK = "refusal-check"  # the `extractors` of a refusal's row: stage 02's check answered, no model


def refused(stories: pd.DataFrame, settings: ExtractionSettings) -> pd.Series:
    """The stories stage 02 flagged as refusals whose design takes StereoTales' rule
    (``extract.refusals_unknown``): not extracted, every field unknown."""
    if "is_refusal" not in stories.columns:
        return pd.Series(False, index=stories.index)
    return stories["is_refusal"].fillna(False).astype(bool) & stories["design"].isin(settings.refusals_unknown)


def _refusal_row(row: Any, sections: tuple[str, ...]) -> dict[str, Any]:
    """The row of a refusal under StereoTales' rule: every field unknown, the story kept and counted."""
    return {
        "story_id": row.story_id,
        "extractors": [REFUSAL_CHECK],
        "parse_ok": True,
        "n_parse_failures": 0,
        "story_cut": False,
        **empty_record(sections),
        "explicit_label": None,
        "raw": json.dumps({REFUSAL_CHECK: getattr(row, "refusal_rule", None)}, ensure_ascii=False),
    }


def _extracted_row(
    row: Any, group: pd.DataFrame | None, names: list[str], sections: tuple[str, ...], defaults: Mapping[str, str]
) -> dict[str, Any]:
    """The row of a story the extractors ``names`` answered (``group``: its final primary answers);
    ``defaults`` fill what a parsed consensus left unknown (``extract.design_rules``)."""
    answers_of = {} if group is None else {r.extractor: r for r in group.itertuples(index=False)}
    parsed = [parse_answer(answers_of[n].raw, sections) for n in names if n in answers_of]
    records = [to_record(p.data, sections) for p in parsed if p.ok]
    ok = bool(records)  # StereoTales: the extractors that answered vote (see ``majority``)
    record = with_defaults(combine(records), defaults) if records else empty_record(sections)
    return {
        "story_id": row.story_id,
        "extractors": names,
        "parse_ok": ok,
        "n_parse_failures": int(sum(not p.ok for p in parsed) + (len(names) - len(parsed))),
        "story_cut": bool(any(a.story_cut for a in answers_of.values())),
        **record,
        "explicit_label": None,
        "raw": json.dumps({n: answers_of[n].raw if n in answers_of else None for n in names}, ensure_ascii=False),
    }


def assemble(stories: pd.DataFrame, raw: pd.DataFrame, settings: ExtractionSettings) -> pd.DataFrame:
    """extractions.parquet: one row per valid story (data contract in docs/data-contract.md)."""
    answers = final_answers(raw)
    primary = answers[answers["pass"] == "primary"] if len(answers) else answers
    by_story = {sid: g for sid, g in primary.groupby("story_id")} if len(primary) else {}
    names = [m.name for m in settings.models]
    defaults = extraction_defaults() if settings.design_rules else {}
    rows = []
    refusals = set(stories.loc[refused(stories, settings), "story_id"])
    for row in stories.itertuples(index=False):
        if (row.cond_task or "") == "explicit":
            rows.append(_explicit_row(row))
        elif row.story_id in refusals:
            rows.append(_refusal_row(row, design_sections(settings, row.design)))
        else:
            sections = design_sections(settings, row.design)
            filled = defaults if "demographics" in sections else {}
            rows.append(_extracted_row(row, by_story.get(row.story_id), names, sections, filled))
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=extractions_schema().names)


def _raters(answers: pd.DataFrame, settings: ExtractionSettings) -> tuple[dict[str, pd.DataFrame], str]:
    """The final answers of each rater and how they are compared: the extractors (several), or the
    single extractor's temperature-0 and self-consistency runs (no rater when there is no check run)."""
    names = [m.name for m in settings.models]
    if len(names) > 1:
        raters = {n: answers[(answers.extractor == n) & (answers["pass"] == "primary")] for n in names}
        return raters, f"agreement across {len(names)} extractors ({', '.join(names)}), temperature 0"
    check = f"{names[0]} (check)"
    raters = {f"{names[0]} (T=0)": answers[answers["pass"] == "primary"], check: answers[answers["pass"] == "check"]}
    if raters[check].empty:
        return {}, "one extractor and no self-consistency run: agreement not available"
    n_check = raters[check].shape[0]
    how = (
        f"self-consistency of the single extractor {names[0]}: temperature 0 vs a second run at "
        f"temperature {settings.self_consistency_temperature} with another seed, on {n_check} stories"
    )
    return raters, how


def _rater_frame(answers: pd.DataFrame, design_of: dict[str, str], settings: ExtractionSettings) -> pd.DataFrame:
    """One rater's parsed answers as fields, indexed by story_id, with the sections each was asked."""
    records = {}
    for a in answers.itertuples(index=False):
        sections = design_sections(settings, design_of[a.story_id])
        parsed = parse_answer(a.raw, sections)
        if parsed.ok:
            records[a.story_id] = to_record(parsed.data, sections) | {"_sections": sections}
    return pd.DataFrame.from_dict(records, orient="index")


def agreement_table(stories: pd.DataFrame, raw: pd.DataFrame, settings: ExtractionSettings) -> tuple[pd.DataFrame, str]:
    """Agreement between extractors (several) or between two runs of one extractor (self-consistency)."""
    answers = final_answers(raw)
    design_of = stories.set_index("story_id")["design"].to_dict()
    if answers.empty:
        return pd.DataFrame(), "no extraction answers: agreement not available"
    raters, how = _raters(answers, settings)
    if not raters:
        return pd.DataFrame(), how
    frames = {name: _rater_frame(answers_of, design_of, settings) for name, answers_of in raters.items()}
    if any(f.empty for f in frames.values()):
        return pd.DataFrame(), how + ": no story parsed for every rater"
    tables = [agreement(frames, ["protagonist_gender_fine"])]
    demo_ids = [
        sid
        for sid in frames[next(iter(frames))].index
        if "demographics" in frames[next(iter(frames))].at[sid, "_sections"]
    ]
    if demo_ids:
        tables.append(agreement({n: f.loc[f.index.intersection(demo_ids)] for n, f in frames.items()}, demo_columns()))
    return pd.concat(tables, ignore_index=True), how


def parse_failure_table(stories: pd.DataFrame, extractions: pd.DataFrame) -> pd.DataFrame:
    """Parse failures per model x language (stories whose extraction is excluded from statistics)."""
    merged = extractions.merge(stories[["story_id", "model", "language", "design"]], on="story_id")
    table = (
        merged.groupby(["model", "language"])
        .agg(
            n_stories=("story_id", "size"),
            n_parse_failed=("parse_ok", lambda s: int((~s).sum())),
            n_story_cut=("story_cut", "sum"),
        )
        .reset_index()
    )
    return table
