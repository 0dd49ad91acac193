"""StereoTales' released association files, and the one published-associations table stage 04 compares with.

The StereoTales release (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in
LLMs*, Le Jeune et al., Giskard AI, 2026, arXiv:2605.10442; Hugging Face dataset ``giskardai/StereoTales``,
configs ``associations_global`` and ``associations_by_language``) holds its association tests as JSONL
files, one per generator model and slice (``<model with / as _>__<slice>.jsonl``), one record per line
and per attribute pair::

    {"generator_model": "azure_ai/gpt-4o", "aggregation_dimension": "language", "aggregation_value": "fr",
     "base_attribute": "gender", "compared_attribute": "professional_field",
     "statistics": {"p_value": 0.003, "cramer_v": 0.31, "effect_category": "medium", ...},
     "associated_values": [{"base_value": {"name": "gender", "value": "man"},
                            "compared_value": {"name": "professional_field", "value": "trades and manual labor"},
                            "statistics": {"p_value": 0.001, "fraction": 0.42, "lift": 2.3}}, ...]}

``aggregation_value`` is ``all`` (the global pass) or a release language code (``du`` for Dutch).
Attribute pairs that were not significant are included, with an empty ``associated_values``;
``p_value`` at the attribute level is Benjamini-Hochberg-adjusted, at the value level
Benjamini-Yekutieli-adjusted. The reference keeps every significant cell whatever its lift; storybias
keeps the paper's lift >= 2, so a published cell of lower lift is a difference of rule, and the
comparison says so.

:func:`load_associations` reads a file, a folder of such files (searched recursively) or a human-study
``questions.json`` (``storybias.evidence.published.load_published``) into :data:`PUBLISHED_COLUMNS`: one row
per published association, its labels mapped onto storybias' canonical keys. A malformed file stops with
an error naming the file, the line and the field, before any test runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from storybias.evidence.published import KEY, PublishedFormatError, canonical_value, load_published

# The release's language codes that differ from storybias' ISO 639-1 codes.
RELEASE_LANGUAGE = {"du": "nl"}
GLOBAL_SCOPE = "all"
# A human-study question's scope: its list mixes associations of the global pass and of single languages'
# passes and does not say which (StereoTales' summary counts 784 global ones of 1,580).
ANY_SCOPE = "any"

# One row per published association. `source`: "questions" (the human study's list: scope `any`, the
# models that produced it) or "released" (an association file: one model, one scope). `models`: the
# published generator models. `published_p_adjusted`: BY-adjusted (released files; NaN for questions).
PUBLISHED_COLUMNS = [
    "source",
    "file",
    "models",
    "scope",
    *KEY,
    "published_fraction",
    "published_lift",
    "published_p_adjusted",
]


def _fail(path: Path, line: int, field: str, problem: str) -> PublishedFormatError:
    return PublishedFormatError(f"{path}: line {line}: field {field}: {problem}")


def _text(record: dict, field: str, path: Path, line: int) -> str:
    value = record.get(field)
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, line, field, f"missing or not a string ({value!r})")
    return value.strip()


def _attribute_name(name: str) -> str:
    return "_".join(name.strip().lower().split())


def _value(part: Any, attribute: str, path: Path, line: int, field: str) -> str:
    """The canonical key of one ``{name, value}`` of an associated value."""
    if not isinstance(part, dict) or not isinstance(part.get("value"), str):
        raise _fail(path, line, field, "missing or not an object with a string value")
    name = part.get("name")
    if isinstance(name, str) and _attribute_name(name) != attribute:
        raise _fail(path, line, f"{field}.name", f"{name!r} is not the record's attribute {attribute!r}")
    try:
        return canonical_value(attribute, part["value"])
    except KeyError as exc:
        raise _fail(path, line, f"{field}.value", str(exc).strip('"')) from None


def _number(stats: Any, field: str, path: Path, line: int, where: str) -> float:
    value = stats.get(field) if isinstance(stats, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, line, f"{where}.{field}", f"missing or not a number ({value!r})")
    return float(value)


def _cells(record: dict, base: str, compared: str, path: Path, line: int) -> list[dict[str, Any]]:
    """The record's associated values as rows of canonical keys and published statistics."""
    entries = record.get("associated_values")
    if not isinstance(entries, list):
        raise _fail(path, line, "associated_values", "missing or not a list")
    rows = []
    for i, entry in enumerate(entries):
        where = f"associated_values[{i}]"
        if not isinstance(entry, dict):
            raise _fail(path, line, where, "not an object")
        stats = entry.get("statistics")
        rows.append(
            {
                "base_attribute": base,
                "base_value": _value(entry.get("base_value"), base, path, line, f"{where}.base_value"),
                "compared_attribute": compared,
                "compared_value": _value(entry.get("compared_value"), compared, path, line, f"{where}.compared_value"),
                "published_fraction": _number(stats, "fraction", path, line, f"{where}.statistics"),
                "published_lift": _number(stats, "lift", path, line, f"{where}.statistics"),
                "published_p_adjusted": _number(stats, "p_value", path, line, f"{where}.statistics"),
            }
        )
    return rows


def _record_rows(record: Any, path: Path, line: int) -> list[dict[str, Any]]:
    """The published associations of one JSONL record (none when its pair was not significant)."""
    if not isinstance(record, dict):
        raise _fail(path, line, "(record)", "not a JSON object")
    model = _text(record, "generator_model", path, line)
    scope = _text(record, "aggregation_value", path, line).lower()
    scope = RELEASE_LANGUAGE.get(scope, scope)
    base = _attribute_name(_text(record, "base_attribute", path, line))
    compared = _attribute_name(_text(record, "compared_attribute", path, line))
    if base == compared:
        raise _fail(path, line, "compared_attribute", f"same attribute as the base ({base})")
    return [
        {"source": "released", "file": path.name, "models": [model], "scope": scope, **cell}
        for cell in _cells(record, base, compared, path, line)
    ]


def load_released(path: Path) -> pd.DataFrame:
    """The published associations of one released JSONL file (``PUBLISHED_COLUMNS``)."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for line_number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _fail(path, line_number, "(record)", f"not valid JSON ({exc.msg})") from None
            rows.extend(_record_rows(record, path, line_number))
    return pd.DataFrame(rows, columns=PUBLISHED_COLUMNS)


def _from_questions(path: Path) -> pd.DataFrame:
    """A human-study ``questions.json`` in ``PUBLISHED_COLUMNS``: scope ``any``, no adjusted p-value."""
    questions = load_published(path)
    return pd.DataFrame(
        {
            "source": "questions",
            "file": path.name,
            "models": questions["models"],
            "scope": ANY_SCOPE,
            **{k: questions[k] for k in KEY},
            "published_fraction": questions["avg_percentage"] / 100.0,
            "published_lift": questions["avg_lift"],
            "published_p_adjusted": float("nan"),
        },
        columns=PUBLISHED_COLUMNS,
    )


def association_files(path: Path) -> list[Path]:
    """The published-associations files at ``path``: itself, or the ``*.jsonl`` under a folder (sorted)."""
    if path.is_dir():
        files = sorted(path.rglob("*.jsonl"))
        if not files:
            raise PublishedFormatError(f"{path}: a folder with no *.jsonl association file")
        return files
    if not path.is_file():
        raise PublishedFormatError(f"{path}: file does not exist")
    if path.suffix.lower() not in (".jsonl", ".json"):
        raise PublishedFormatError(f"{path}: not a .jsonl association file or a .json questions file")
    return [path]


def load_associations(path: str | Path) -> pd.DataFrame:
    """Every published association at ``path`` (a JSONL file, a folder of them, or a questions.json)."""
    frames = [
        _from_questions(file) if file.suffix.lower() == ".json" else load_released(file)
        for file in association_files(Path(path))
    ]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=PUBLISHED_COLUMNS)
    return frame.reindex(columns=PUBLISHED_COLUMNS)
