"""Stage 03 on an imported StereoTales corpus: the release's own extractions, and storybias' agreement with them.

``corpus.extractions: published`` maps each story's ``extracted_attributes_json`` (StereoTales' consensus of
three extractor models; the per-extractor answers are not released) into extractions.parquet through
``params/designs/stereotales/reference.yaml`` (:func:`storybias.evidence.stereotales_taxonomy.published_profile`: both
published spellings, ``unknown``, ``other``). As StereoTales' reference pipeline does, the prompted
dimension's value is the prompted value, whatever the extractors said (``demo_<cond_attribute>`` =
``cond_value``). An empty object (``{}``: no extraction matched), a null (none recorded) or text that is not
a JSON object is kept with ``parse_ok`` false and counted (the reference drops such rows; stage 04 leaves
them out and counts them too). A dimension the object does not name is ``unknown``.

``extractions: both`` also extracts with ``extract.models`` and :func:`agreement_with_published` compares,
per field and language, storybias' answer with the published consensus.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd
import pyarrow as pa

from storybias.config.designs import dimensions
from storybias.evidence.stereotales_taxonomy import PROFILE_OK, UNKNOWN, published_profile
from storybias.stages.extract.schema import extractions_schema
from storybias.stats.agreement import cohen_kappa

PUBLISHED = "published"  # the extractor name of the release's consensus
# StereoTales' gender value -> (protagonist_gender, protagonist_gender_fine), Feng et al.'s labels
AGREEMENT_SCHEMA = pa.schema(
    [
        ("language", pa.string()),  # a language, or "all"
        ("field", pa.string()),  # a demographic dimension
        ("n", pa.int64()),  # stories both sides parsed, the field not prompted
        ("n_known", pa.int64()),  # of those, where the published consensus is not unknown
        ("accuracy", pa.float64()),  # storybias = published, on n_known
        ("kappa", pa.float64()),  # Cohen's kappa on n, unknown a category
        ("ours_unknown", pa.float64()),  # share of n: published knows, storybias says unknown
        ("published_unknown", pa.float64()),  # share of n: storybias knows, published says unknown
    ]
)
GENDER_LABELS = {"woman": ("female", "female"), "man": ("male", "male"), "non_binary": ("unknown", "non_binary")}


CHUNK_ROWS = 50_000  # stories mapped at a time


def _row(story: Any, text: str | None) -> tuple[dict[str, Any], str, bool]:
    """One story's extraction row, its profile status, and whether the prompted value replaced another."""
    status, profile = published_profile(text)
    demo = {d: profile.get(d, UNKNOWN) for d in dimensions()}
    replaced = status == PROFILE_OK and demo.get(story.cond_attribute) not in (story.cond_value, UNKNOWN)
    if story.cond_attribute in demo and story.cond_value is not None:
        demo[story.cond_attribute] = story.cond_value
    ok = status == PROFILE_OK
    gender, gender_fine = GENDER_LABELS.get(demo["gender"], ("unknown", "unknown")) if ok else ("unknown", "unknown")
    row = {
        "story_id": story.story_id,
        "extractors": [PUBLISHED],
        "parse_ok": ok,
        "n_parse_failures": int(not ok),
        "story_cut": False,
        **{f"demo_{d}": v for d, v in demo.items()},
        "protagonist_gender": gender,
        "protagonist_gender_fine": gender_fine,
        "protagonist_name": None,
        "adjectives_en": [],
        "adjectives_orig": [],
        "settings": [],
        "cultural_refs": [],
        "markers": [],
        "explicit_label": None,
        "raw": text,
    }
    return row, status, replaced


def published_extractions(stories: pd.DataFrame, corpus: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """extractions.parquet from the release's extractions: one row per story of ``stories`` (the valid
    ones), and counts (profiles per status, prompted values that replaced an extracted one)."""
    text_of = corpus.set_index("story_id")["published_extraction"]
    missing = stories.loc[~stories["story_id"].isin(text_of.index), "story_id"]
    if len(missing):
        raise KeyError(
            f"corpus.parquet has no published extraction for {len(missing)} stories (e.g. {missing.iloc[0]})"
        )
    replaced, statuses, chunks = 0, Counter[str](), []
    columns = extractions_schema().names
    # built CHUNK_ROWS stories at a time: 650,000 row dicts at once would take ~1.5 GB; the frames share
    # the taxonomy's label strings, so the concatenated table is small
    for start in range(0, len(stories), CHUNK_ROWS):
        rows = []
        for story in stories.iloc[start : start + CHUNK_ROWS].itertuples(index=False):
            row, status, changed = _row(story, text_of[story.story_id])
            rows.append(row)
            statuses[status] += 1
            replaced += changed
        chunks.append(pd.DataFrame(rows, columns=columns))
    frame = pd.concat(chunks, ignore_index=True) if chunks else pd.DataFrame(columns=columns)
    counts = {
        "n_stories": len(frame),
        "profiles": dict(statuses),
        "n_parse_failed": int((~frame["parse_ok"]).sum()),
        "n_prompted_value_replaced": int(replaced),
    }
    return frame, counts


# what corpus.demographics: published takes from the release; every other column stays storybias'
DEMOGRAPHIC_COLUMNS = (*(f"demo_{d}" for d in dimensions()), "protagonist_gender", "protagonist_gender_fine")


def with_published_demographics(ours: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """``corpus.demographics: published``: storybias' extractions with the protagonist's demographic
    profile replaced by the release's. A story counts as parsed only when both sides parsed it (the
    lenses read one ``parse_ok``); its ``extractors`` name both."""
    theirs = published.set_index("story_id").reindex(ours["story_id"])
    out = ours.copy()
    for column in DEMOGRAPHIC_COLUMNS:
        out[column] = theirs[column].to_numpy()
    published_ok = theirs["parse_ok"].fillna(False).astype(bool).to_numpy()
    out["parse_ok"] = out["parse_ok"].astype(bool).to_numpy() & published_ok
    out["extractors"] = [[*e, PUBLISHED] for e in out["extractors"]]
    return out


def agreement_with_published(ours: pd.DataFrame, published: pd.DataFrame, stories: pd.DataFrame) -> pd.DataFrame:
    """Per demographic field and language: storybias' extraction (``ours``) against the published consensus.

    Read on the stories both parsed, leaving out each story's prompted field (both sides hold the prompted
    value there). ``n_known``: stories where the consensus knows the field; ``accuracy``: the share of those
    where storybias says the same; ``kappa``: Cohen's kappa over every story, ``unknown`` a category;
    ``ours_unknown`` / ``published_unknown``: the share where only that side says unknown."""
    keep = ["story_id", "parse_ok", *(f"demo_{d}" for d in dimensions())]
    both = ours[keep].merge(published[keep], on="story_id", suffixes=("_ours", "_pub"))
    both = both[both["parse_ok_ours"] & both["parse_ok_pub"]]
    both = both.merge(stories[["story_id", "language", "cond_attribute"]], on="story_id")
    rows = []
    for language, group in [("all", both), *both.groupby("language")]:
        for field in dimensions():
            cell = group[group["cond_attribute"] != field]
            a, b = cell[f"demo_{field}_ours"], cell[f"demo_{field}_pub"]
            known = b != UNKNOWN
            rows.append(
                {
                    "language": language,
                    "field": field,
                    "n": int(len(cell)),
                    "n_known": int(known.sum()),
                    "accuracy": float((a[known] == b[known]).mean()) if known.any() else float("nan"),
                    "kappa": cohen_kappa(a.tolist(), b.tolist()) if len(cell) > 1 else float("nan"),
                    "ours_unknown": float(((a == UNKNOWN) & known).mean()) if len(cell) else float("nan"),
                    "published_unknown": float(((a != UNKNOWN) & ~known).mean()) if len(cell) else float("nan"),
                }
            )
    return pd.DataFrame(rows)
