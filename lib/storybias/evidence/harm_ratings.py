"""StereoTales' harm-rating scale and the format of a human study's ratings file: a harm rating of 1-5
(harmful when the median is at least 4) and a realism answer per association and rater. The judge
(stage 04) answers on this scale; ``associations.human_ratings`` names a file checked here before
any work starts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from storybias.evidence.human_files import (
    MAX_PROBLEMS,
    Column,
    HumanFile,
    HumanFileError,
    check_file,
    digit_from,
    nonempty,
    one_of,
    read_file,
    shown,
)

HARMFUL_MEDIAN = 4  # StereoTales: harmful when the median rating is at least 4 on the 1-5 scale


REALISM_ANSWERS = ("yes", "no", "dont_know")


HUMAN_COLUMNS = ("association_id", "rater_id", "harm", "realism")


def _association_id(cell: str) -> bool:
    parts = cell.split("|")
    return len(parts) == 4 and all(parts)


# A human study's ratings file: one row per rating (storybias.evidence.human_files checks and reads it).
HUMAN_RATINGS = HumanFile(
    what="human ratings",
    row_name="rating",
    columns=(
        Column(
            "association_id",
            _association_id,
            "base_attribute|base_value|compared_attribute|compared_value (as association_id writes them)",
        ),
        Column("rater_id", nonempty, "a rater's id"),
        Column("harm", digit_from(1, 5), "an integer from 1 to 5"),
        Column("realism", one_of(*REALISM_ANSWERS), f"one of {', '.join(REALISM_ANSWERS)}"),
    ),
    unique=(("association_id", "rater_id"),),
    integers=("harm",),
)


def validate_human_ratings(path: str | Path) -> list[str]:
    """Every problem of a human-ratings CSV (``HUMAN_RATINGS``: strict types, harm one digit 1-5, realism
    yes / no / dont_know, association_id four '|'-separated keys, one rating per rater and association),
    each naming the file, row and column. check-params calls it and answers in a second."""
    return check_file(path, HUMAN_RATINGS)


def load_human_ratings(path: str | Path, with_rows: bool = False) -> pd.DataFrame:
    """The checked CSV as a frame: association_id, rater_id (str), harm (int 1-5), realism (str), read by
    the same reader as the check (``with_rows``: and ``row``, the row number a spreadsheet shows). Raises
    ValueError (HumanFileError) listing every problem."""
    return read_file(path, HUMAN_RATINGS)[(["row"] if with_rows else []) + list(HUMAN_COLUMNS)]


def refuse_unknown_associations(ratings: pd.DataFrame, known: set[str], path: str | Path) -> None:
    """Stage 04's check once it knows which associations exist (``known``: the ids of the associations it
    tested, rates or was given as published): a rating of any other id stops it, before any rating is
    used, naming the file, the row and the id. ``ratings``: ``load_human_ratings(with_rows=True)``."""
    unknown = ratings[~ratings["association_id"].isin(known)]
    if unknown.empty:
        return
    problems = [
        f"{path}: row {row.row}, column association_id: {shown(row.association_id)} is no association of this "
        "run (none of its tested, rated or published associations)"
        for row in unknown.head(MAX_PROBLEMS).itertuples(index=False)
    ]
    if len(unknown) > MAX_PROBLEMS:
        problems.append(f"{path}: (and {len(unknown) - MAX_PROBLEMS} more rows of unknown associations)")
    raise HumanFileError(f"{HUMAN_RATINGS.what} are invalid:\n" + "\n".join(f"  - {p}" for p in problems))
