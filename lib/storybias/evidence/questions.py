"""StereoTales' human-study list of associations (``questions.json``).

StereoTales (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in LLMs*,
Le Jeune et al., Giskard AI, 2026, arXiv:2605.10442) released the 1,580 associations of its human study as a
JSON list (public repository ``Giskard-AI/stereotales-human-study``, ``data/questions.json``). Each record
names a base attribute and a compared attribute by dimension name and by the reference taxonomy's English
label, with the average percentage and lift over the models that produced it (``metadata.model_list``)::

    {"question_id": "...", "base_attribute": {"name": "professional_field", "value": "agriculture"},
     "compared_attribute": {"name": "urbanicity", "value": "rural"}, "avg_percentage": 87.3,
     "avg_lift": 10.27, "metadata": {"model_list": ["anthropic/claude-haiku-4-5", ...]}}

:func:`load_questions` validates such a file before any work (an error names the file, the record and the
field; NaN, infinite or out-of-range figures and spelled-out missing model names are refused) and maps every
label onto storybias' canonical keys (``storybias.evidence.stereotales_taxonomy``). One association listed under several
question ids (e.g. found by other models) becomes one row, counted once, naming every id (``question_ids``):
its models together, its figures the records' averages weighted by their number of models. Stage 04 compares
a run with them (``storybias.stages.associations.comparison``), as it does with the released association
files (``storybias.evidence.released_associations``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from storybias.core.inputs import missing_marker, shortened, shown, unique_keys
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY, PublishedFormatError, canonical_value

QUESTION_COLUMNS = [
    "question_id",
    *ASSOCIATION_KEY,
    "base_label",
    "compared_label",
    "avg_percentage",
    "avg_lift",
    "models",
    "question_ids",  # every question id of the association (the file may list one association under several)
]


def _fail(path: Path, i: int, record: Any, field: str, problem: str) -> PublishedFormatError:
    qid = record.get("question_id") if isinstance(record, dict) else None
    where = f"record {i}" + (f" (question_id {shortened(qid, 80)})" if isinstance(qid, str) and qid else "")
    return PublishedFormatError(f"{path}: {where}: field {field}: {problem}")


def _attribute(path: Path, i: int, record: dict, field: str) -> tuple[str, str, str]:
    part = record.get(field)
    if not isinstance(part, dict):
        raise _fail(path, i, record, field, "missing or not an object with name and value")
    name, label = part.get("name"), part.get("value")
    if not isinstance(name, str) or not name:
        raise _fail(path, i, record, f"{field}.name", "missing or not a string")
    if not isinstance(label, str) or not label:
        raise _fail(path, i, record, f"{field}.value", "missing or not a string")
    attribute = "_".join(name.strip().lower().split())
    try:
        return attribute, canonical_value(attribute, label), label
    except KeyError as exc:
        raise _fail(path, i, record, field, str(exc.args[0])) from None


def _number(path: Path, i: int, record: dict, field: str, low: float, high: float) -> float:
    """A finite number in [low, high]; NaN, an infinity or a value outside is refused."""
    value = record.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, i, record, field, f"missing or not a number ({shown(value)})")
    if not math.isfinite(value) or not low <= value <= high:
        raise _fail(path, i, record, field, f"{value} is outside [{low:g}, {high:g}] (a finite number)")
    return float(value)


def _models(path: Path, i: int, record: dict) -> list[str]:
    metadata = record.get("metadata")
    models = metadata.get("model_list") if isinstance(metadata, dict) else None
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m.strip() for m in models):
        raise _fail(path, i, record, "metadata.model_list", "missing, empty or not a list of model names")
    missing = [m for m in models if missing_marker(m)]
    if missing:
        raise _fail(path, i, record, "metadata.model_list", f"{shown(missing[0])} is a missing value, not a name")
    return sorted(set(models))


def _row(path: Path, i: int, record: Any) -> dict[str, Any]:
    """One record as a row of canonical keys, checked field by field."""
    if not isinstance(record, dict):
        raise PublishedFormatError(f"{path}: record {i}: not an object")
    qid = record.get("question_id")
    if not isinstance(qid, str) or not qid:
        raise _fail(path, i, record, "question_id", f"missing or not a string ({shown(qid)})")
    base_attr, base_value, base_label = _attribute(path, i, record, "base_attribute")
    comp_attr, comp_value, comp_label = _attribute(path, i, record, "compared_attribute")
    if base_attr == comp_attr:
        raise _fail(path, i, record, "compared_attribute.name", f"same attribute as the base ({base_attr})")
    return {
        "question_id": qid,
        "base_attribute": base_attr,
        "base_value": base_value,
        "compared_attribute": comp_attr,
        "compared_value": comp_value,
        "base_label": base_label,
        "compared_label": comp_label,
        "avg_percentage": _number(path, i, record, "avg_percentage", 0.0, 100.0),
        "avg_lift": _number(path, i, record, "avg_lift", 0.0, math.inf),
        "models": _models(path, i, record),
        "question_ids": [qid],
    }


def _merged(path: Path, rows: list[dict[str, Any]], records: list[Any]) -> list[dict[str, Any]]:
    """One row per association, counted once: the records of one association (listed under several question
    ids, e.g. found by other models) are merged into the first one's row: their question ids and models
    together, ``avg_percentage`` and ``avg_lift`` the records' averages weighted by their number of models
    (the average over every listed model when no model is listed twice). A question id given twice is
    refused."""
    first_of: dict[str, int] = {}
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        first = first_of.setdefault(row["question_id"], i)
        if first != i:
            problem = f"{shown(row['question_id'])} appears twice (record {first})"
            raise _fail(path, i, records[i], "question_id", problem)
        groups.setdefault(tuple(row[k] for k in ASSOCIATION_KEY), []).append(row)
    out = []
    for group in groups.values():
        row = dict(group[0])
        if len(group) > 1:
            weights = [len(r["models"]) for r in group]
            for figure in ("avg_percentage", "avg_lift"):
                row[figure] = sum(w * r[figure] for w, r in zip(weights, group)) / sum(weights)
            row["models"] = sorted({m for r in group for m in r["models"]})
            row["question_ids"] = [r["question_id"] for r in group]
        out.append(row)
    return out


def load_questions(path: str | Path) -> pd.DataFrame:
    """The published associations of a StereoTales ``questions.json``-format file, one row per association
    with canonical keys (columns ``QUESTION_COLUMNS``; ``*_label`` keep the file's wording). Records of one
    association under several question ids become one row (``question_ids`` lists them), counted once."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
    except FileNotFoundError:
        raise PublishedFormatError(f"{path}: file does not exist") from None
    except json.JSONDecodeError as exc:
        raise PublishedFormatError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise PublishedFormatError(f"{path}: a value nested too deeply to read") from None
    except ValueError as exc:  # a key repeated in one object
        raise PublishedFormatError(f"{path}: {exc}") from None
    if not isinstance(data, list):
        raise PublishedFormatError(f"{path}: expected a JSON list of associations, got {type(data).__name__}")
    rows = [_row(path, i, record) for i, record in enumerate(data)]
    return pd.DataFrame(_merged(path, rows, data), columns=QUESTION_COLUMNS)
