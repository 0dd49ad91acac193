"""The two CSV files of a human validation of stage 06's automated judgements (Feng et al., *Beyond Surface
Cues*, arXiv:2608.23026, App. D.2), described for the one checker of human-input files
(``storybias.evidence.human_files``), so that ``make check-params`` checks them when the profile loads
and stage 06 reads them with the same reader; the statistics are ``storybias.stages.probes.judgement_agreement``.

**Cultural-marker ratings** (App. D.2.1), one row per rater x marker comparison: ``marker_id``;
``language`` (its source language, the rater's language-linked context); ``rater_id``; ``human`` (the
rater's relevance of the marker to their own context, one digit 1-7); ``automated`` (the automated
relevance to its source-linked context, 1-7); optional ``keep`` (the rater's inclusion decision: keep or
remove); optional, all three or none, ``automated_en``, ``automated_fr``, ``automated_zh`` (the automated
relevance to each context). One marker has one language and one automated score; one rater rates a
marker once.

**Protagonist labels** (App. D.2.2), one row per rater x narrative: ``item_id``; ``language``; ``genre``
(story or news); ``automated`` (female, male or unknown); ``rater_id``; ``human`` (female, male, unknown
or one of the finer outcomes that count as unknown: unclear, non_binary, multiple, no_individual,
unable). One item has one language, genre and automated label; one rater labels an item once.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from storybias.evidence.human_files import Column, HumanFile, digit_from, nonempty, one_of, read_file

MARKER_COLUMNS: tuple[str, ...] = ("marker_id", "language", "rater_id", "human", "automated")
CONTEXTS: tuple[str, ...] = ("en", "fr", "zh")  # the three language-linked contexts of the scores
CONTEXT_SCORES: tuple[str, ...] = tuple(f"automated_{c}" for c in CONTEXTS)  # optional marker columns
SCALE: tuple[int, ...] = tuple(range(1, 8))  # the 1-7 relevance scale
LABEL_COLUMNS: tuple[str, ...] = ("item_id", "language", "genre", "automated", "rater_id", "human")
LABELS: tuple[str, ...] = ("female", "male", "unknown")
GENRES: tuple[str, ...] = ("story", "news")
# App. D.2.2: the five finer outcomes were mapped to unknown after annotation
UNKNOWN_OUTCOMES: tuple[str, ...] = ("unclear", "non_binary", "multiple", "no_individual", "unable")

_ONE_TO_SEVEN = "an integer from 1 to 7"
MARKER_RATINGS = HumanFile(
    what="the marker ratings",
    row_name="rating",
    columns=(
        Column("marker_id", nonempty, "a marker id"),
        Column("language", nonempty, "a language"),
        Column("rater_id", nonempty, "a rater's id"),
        Column("human", digit_from(1, 7), _ONE_TO_SEVEN),
        Column("automated", digit_from(1, 7), _ONE_TO_SEVEN),
        Column("keep", one_of("keep", "remove"), "keep, remove or empty", optional=True, lower=True),
        *(Column(c, digit_from(1, 7), _ONE_TO_SEVEN, optional=True) for c in CONTEXT_SCORES),
    ),
    one_per=tuple(("marker_id", c) for c in ("language", "automated", *CONTEXT_SCORES)),
    unique=(("marker_id", "rater_id"),),
    together=(CONTEXT_SCORES,),
    integers=("human", "automated", *CONTEXT_SCORES),
)
LABEL_RATINGS = HumanFile(
    what="the protagonist-label ratings",
    row_name="rating",
    columns=(
        Column("item_id", nonempty, "an item id"),
        Column("language", nonempty, "a language"),
        Column("genre", one_of(*GENRES), "story or news", lower=True),
        Column("automated", one_of(*LABELS), "female, male or unknown", lower=True),
        Column("rater_id", nonempty, "a rater's id"),
        Column(
            "human", one_of(*LABELS, *UNKNOWN_OUTCOMES), f"one of {', '.join((*LABELS, *UNKNOWN_OUTCOMES))}", lower=True
        ),
    ),
    one_per=tuple(("item_id", c) for c in ("language", "genre", "automated")),
    unique=(("item_id", "rater_id"),),
)


def load_marker_ratings(path: str | Path) -> pd.DataFrame:
    """The marker-rating CSV, checked (``MARKER_RATINGS``): ``human``, ``automated`` and the context scores
    as integers (the context columns only when the file has them), ``keep`` NaN where empty."""
    frame = read_file(path, MARKER_RATINGS).drop(columns="row")
    if (frame[list(CONTEXT_SCORES)] == "").all(axis=None):
        frame = frame.drop(columns=list(CONTEXT_SCORES))
    frame["keep"] = frame["keep"].replace("", pd.NA).astype(object)
    return frame


def load_label_ratings(path: str | Path) -> pd.DataFrame:
    """The protagonist-label CSV, checked (``LABEL_RATINGS``): the finer human outcomes kept in ``human_raw``
    and mapped to unknown in ``human``."""
    frame = read_file(path, LABEL_RATINGS).drop(columns="row")
    frame["human_raw"] = frame["human"]
    frame["human"] = frame["human"].where(frame["human"].isin(LABELS), "unknown")
    return frame
