"""StereoTales' harm-rating scale and the format of a human study's ratings file: a harm rating of 1-5
(harmful when the median is at least 4) and a realism answer per association and rater. The judge
(stage 04) answers on this scale; ``associations.human_ratings`` names a file checked here before
any work starts."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pandas as pd

HARMFUL_MEDIAN = 4  # StereoTales: harmful when the median rating is at least 4 on the 1-5 scale


REALISM_ANSWERS = ("yes", "no", "dont_know")


HUMAN_COLUMNS = ("association_id", "rater_id", "harm", "realism")


_HARM_VALUE = re.compile(r"^[1-5]$")


MAX_PROBLEMS = 20  # a file with many bad rows reports the first ones, not thousands of lines


def validate_human_ratings(path: str | Path) -> list[str]:
    """Every problem of a human-ratings CSV, each naming the file and, where it applies, the row (as
    a spreadsheet numbers it: the header is row 1) and the column. Types are strict: harm is an
    integer 1-5 written as a digit (not 4.0, not True), realism one of yes / no / dont_know,
    association_id four '|'-separated keys (base attribute, base value, compared attribute,
    compared value, as ``association_id`` writes them), rater_id not empty. Reads only the file
    (csv module): check-params calls it and answers in a second."""
    path = Path(path)
    if not path.is_file():
        return [f"{path}: file not found"]
    problems: list[str] = []
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None or not any(h.strip() for h in header):
                return [
                    f"{path}: the file is empty; expected a header row {','.join(HUMAN_COLUMNS)} and one row per rating"
                ]
            header = [h.strip() for h in header]
            missing = [c for c in HUMAN_COLUMNS if c not in header]
            extra = [c for c in header if c not in HUMAN_COLUMNS]
            if missing or extra or len(set(header)) != len(header):
                what = (
                    ([f"missing column(s) {', '.join(missing)}"] if missing else [])
                    + ([f"unknown column(s) {', '.join(repr(c) for c in extra)}"] if extra else [])
                    + (["a column is repeated"] if len(set(header)) != len(header) else [])
                )
                return [f"{path}: row 1 (header): {'; '.join(what)} (expected exactly {', '.join(HUMAN_COLUMNS)})"]
            n_rows = 0
            for number, fields in enumerate(reader, start=2):
                if not fields or all(not f.strip() for f in fields):
                    continue  # blank line
                n_rows += 1
                if len(fields) != len(header):
                    problems.append(
                        f"{path}: row {number}: {len(fields)} fields, the header has {len(header)} ({','.join(header)})"
                    )
                    continue
                row = dict(zip(header, (f.strip() for f in fields)))
                if len(row["association_id"].split("|")) != 4 or not all(row["association_id"].split("|")):
                    problems.append(
                        f"{path}: row {number}, column association_id: {row['association_id']!r} is not "
                        "base_attribute|base_value|compared_attribute|compared_value"
                    )
                if not row["rater_id"]:
                    problems.append(f"{path}: row {number}, column rater_id: empty")
                if not _HARM_VALUE.match(row["harm"]):
                    problems.append(f"{path}: row {number}, column harm: {row['harm']!r} is not an integer from 1 to 5")
                if row["realism"] not in REALISM_ANSWERS:
                    problems.append(
                        f"{path}: row {number}, column realism: {row['realism']!r} is not one of "
                        f"{', '.join(REALISM_ANSWERS)}"
                    )
                if len(problems) >= MAX_PROBLEMS:
                    problems.append(f"{path}: (stopped after {MAX_PROBLEMS} problems)")
                    return problems
            if n_rows == 0 and not problems:
                problems.append(f"{path}: no rating below the header row")
    except UnicodeDecodeError as exc:
        problems.append(f"{path}: not UTF-8 text ({exc})")
    except csv.Error as exc:
        problems.append(f"{path}: not a readable CSV ({exc})")
    return problems


def load_human_ratings(path: str | Path) -> pd.DataFrame:
    """The validated CSV (``validate_human_ratings``) as a frame: association_id, rater_id (str),
    harm (int 1-5), realism (str). Raises ValueError listing every problem."""
    problems = validate_human_ratings(path)
    if problems:
        raise ValueError("human ratings are invalid:\n" + "\n".join(f"  - {p}" for p in problems))
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=True)
    frame.columns = [c.strip() for c in frame.columns]
    frame = frame[list(HUMAN_COLUMNS)].apply(lambda column: column.str.strip())
    return frame.astype({"harm": int}).reset_index(drop=True)
