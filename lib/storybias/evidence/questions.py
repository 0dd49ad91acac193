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
field) and maps every label onto storybias' canonical keys (``storybias.evidence.labels``). Stage 04 compares
a run with them (``storybias.stages.associations.comparison``), as it does with the released association
files (``storybias.evidence.released_associations``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from storybias.evidence.labels import ASSOCIATION_KEY, PublishedFormatError, canonical_value

QUESTION_COLUMNS = [
    "question_id",
    *ASSOCIATION_KEY,
    "base_label",
    "compared_label",
    "avg_percentage",
    "avg_lift",
    "models",
]


def _fail(path: Path, i: int, record: Any, field: str, problem: str) -> PublishedFormatError:
    qid = record.get("question_id") if isinstance(record, dict) else None
    where = f"record {i}" + (f" (question_id {qid})" if qid else "")
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
        raise _fail(path, i, record, field, str(exc).strip('"')) from None


def _number(path: Path, i: int, record: dict, field: str, low: float, high: float | None) -> float:
    value = record.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, i, record, field, f"missing or not a number ({value!r})")
    if value < low or (high is not None and value > high):
        raise _fail(path, i, record, field, f"{value} is outside [{low}, {high if high is not None else 'inf'}]")
    return float(value)


def load_questions(path: str | Path) -> pd.DataFrame:
    """The published associations of a StereoTales ``questions.json``-format file, one row each, with
    canonical keys (columns ``QUESTION_COLUMNS``; ``*_label`` keep the file's wording)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PublishedFormatError(f"{path}: file does not exist") from None
    except json.JSONDecodeError as exc:
        raise PublishedFormatError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise PublishedFormatError(f"{path}: expected a JSON list of associations, got {type(data).__name__}")
    rows = []
    for i, record in enumerate(data):
        if not isinstance(record, dict):
            raise PublishedFormatError(f"{path}: record {i}: not an object")
        qid = record.get("question_id")
        if not isinstance(qid, str) or not qid:
            raise _fail(path, i, record, "question_id", "missing or not a string")
        base_attr, base_value, base_label = _attribute(path, i, record, "base_attribute")
        comp_attr, comp_value, comp_label = _attribute(path, i, record, "compared_attribute")
        if base_attr == comp_attr:
            raise _fail(path, i, record, "compared_attribute.name", f"same attribute as the base ({base_attr})")
        models = (record.get("metadata") or {}).get("model_list") if isinstance(record.get("metadata"), dict) else None
        if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
            raise _fail(path, i, record, "metadata.model_list", "missing, empty or not a list of model names")
        rows.append(
            {
                "question_id": qid,
                "base_attribute": base_attr,
                "base_value": base_value,
                "compared_attribute": comp_attr,
                "compared_value": comp_value,
                "base_label": base_label,
                "compared_label": comp_label,
                "avg_percentage": _number(path, i, record, "avg_percentage", 0.0, 100.0),
                "avg_lift": _number(path, i, record, "avg_lift", 0.0, None),
                "models": sorted(set(models)),
            }
        )
    frame = pd.DataFrame(rows, columns=QUESTION_COLUMNS)
    dup = frame[frame["question_id"].duplicated()]
    if len(dup):
        raise PublishedFormatError(
            f"{path}: record {dup.index[0]}: field question_id: {dup['question_id'].iloc[0]!r} appears twice"
        )
    return frame
