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
A file holds every attribute pair the reference tested (a table of at least 2 x 2 after cleaning);
``statistics.p_value`` is the pair's Benjamini-Hochberg-adjusted p-value. A pair with adjusted p < 0.05
carries its bias-corrected Cramer's V, its ``effect_category`` (negligible, small, medium or large) and,
as ``associated_values``, every cell of its table with Benjamini-Yekutieli-adjusted p < 0.05, whatever
the lift; any other pair has ``cramer_v`` -1, ``effect_category`` "N/A" and no associated value. So the
files record two decisions, the pair's BH test and the cell's BY test; StereoTales' stated rule (a
medium or large effect and lift >= 2) is a filter on top of them, and the comparison applies both.

:func:`load_associations` reads a file, a folder of such files (searched recursively) or a human-study
``questions.json`` (``storybias.evidence.questions.load_questions``) into :data:`PUBLISHED_COLUMNS`: one row
per published association, its labels mapped onto storybias' canonical keys. A malformed file stops with
an error naming the file, the line and the field, before any test runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from storybias.evidence.labels import ASSOCIATION_KEY, PublishedFormatError, canonical_value
from storybias.evidence.questions import load_questions

# The release's language codes that differ from storybias' ISO 639-1 codes, and back.
RELEASE_LANGUAGE = {"du": "nl"}
RELEASE_CODE = {ours: theirs for theirs, ours in RELEASE_LANGUAGE.items()}
# The ten languages of StereoTales' release (storybias' codes, in the release's order): what its global
# pass pooled, and what a corpus profile reads by default.
RELEASED_LANGUAGES = tuple(
    RELEASE_LANGUAGE.get(c, c) for c in ("en", "ar", "du", "es", "fr", "hi", "it", "pt", "uk", "zh")
)
GLOBAL_SCOPE = "all"
# What a set of association files' global pass pooled: the release's (its ten languages, none of the
# additional_en prompt variants, which the archive loader behind its associations skips, every prompted
# attribute and every story), or what a storybias export records beside its files (POOL_FILE).
RELEASE_POOL: dict[str, Any] = {
    "languages": sorted(RELEASED_LANGUAGES),
    "additional_en": False,
    "attributes": None,  # every prompted attribute
    "sample": None,  # every story
}
POOL_FILE = "pool.json"
NOT_SIGNIFICANT = "N/A"  # the effect category of a pair whose BH-adjusted p is not < 0.05
STATED_EFFECTS = ("medium", "large")  # StereoTales' stated rule keeps these pairs, and cells of lift >= 2
# A human-study question's scope: its list mixes associations of the global pass and of single languages'
# passes and does not say which (StereoTales' summary counts 784 global ones of 1,580).
ANY_SCOPE = "any"

# One row per published association. `source`: "questions" (the human study's list: scope `any`, the
# models that produced it) or "released" (an association file: one model, one scope). `models`: the
# published generator models. `published_p_adjusted`: BY-adjusted (released files; NaN for questions).
# `published_effect`: the effect category of the cell's attribute pair (released files; None for
# questions, whose list StereoTales drew with its stated rule).
PUBLISHED_COLUMNS = [
    "source",
    "file",
    "models",
    "scope",
    *ASSOCIATION_KEY,
    "published_fraction",
    "published_lift",
    "published_p_adjusted",
    "published_effect",
]
# One row per tested attribute pair of a released file (``load_released_pairs``).
PAIR_COLUMNS = [
    "file",
    "model",
    "scope",
    "base_attribute",
    "compared_attribute",
    "p_adjusted",
    "cramer_v",
    "effect_category",
    "n_values",
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


def _pair(record: Any, path: Path, line: int) -> dict[str, Any]:
    """The tested attribute pair of one JSONL record: model, scope, attributes and its statistics."""
    if not isinstance(record, dict):
        raise _fail(path, line, "(record)", "not a JSON object")
    model = _text(record, "generator_model", path, line)
    scope = _text(record, "aggregation_value", path, line).lower()
    base = _attribute_name(_text(record, "base_attribute", path, line))
    compared = _attribute_name(_text(record, "compared_attribute", path, line))
    if base == compared:
        raise _fail(path, line, "compared_attribute", f"same attribute as the base ({base})")
    stats = record.get("statistics")
    effect = stats.get("effect_category") if isinstance(stats, dict) else None
    if not isinstance(effect, str):
        raise _fail(path, line, "statistics.effect_category", f"missing or not a string ({effect!r})")
    return {
        "file": path.name,
        "model": model,
        "scope": RELEASE_LANGUAGE.get(scope, scope),
        "base_attribute": base,
        "compared_attribute": compared,
        "p_adjusted": _number(stats, "p_value", path, line, "statistics"),
        "cramer_v": _number(stats, "cramer_v", path, line, "statistics"),
        "effect_category": effect,
    }


def _read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed record) of every non-blank line of a released JSONL file."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for line_number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append((line_number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise _fail(path, line_number, "(record)", f"not valid JSON ({exc.msg})") from None
    return records


def load_released(path: Path) -> pd.DataFrame:
    """The published associations of one released JSONL file (``PUBLISHED_COLUMNS``): every associated
    value of every record, with its pair's effect category."""
    rows: list[dict[str, Any]] = []
    for line, record in _read_records(path):
        pair = _pair(record, path, line)
        where = {"source": "released", "file": pair["file"], "models": [pair["model"]], "scope": pair["scope"]}
        cells = _cells(record, pair["base_attribute"], pair["compared_attribute"], path, line)
        rows.extend({**where, **cell, "published_effect": pair["effect_category"]} for cell in cells)
    return pd.DataFrame(rows, columns=PUBLISHED_COLUMNS)


def load_released_pairs(path: str | Path) -> pd.DataFrame:
    """Every tested attribute pair of the released JSONL files at ``path`` (a file or a folder),
    ``PAIR_COLUMNS``: its BH-adjusted p-value, Cramer's V, effect category and number of associated values."""
    rows = []
    for file in association_files(Path(path)):
        for line, record in _read_records(file):
            pair = _pair(record, file, line)
            values = record.get("associated_values")
            rows.append({**pair, "n_values": len(values) if isinstance(values, list) else 0})
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def _from_questions(path: Path) -> pd.DataFrame:
    """A human-study ``questions.json`` in ``PUBLISHED_COLUMNS``: scope ``any``, no adjusted p-value."""
    questions = load_questions(path)
    return pd.DataFrame(
        {
            "source": "questions",
            "file": path.name,
            "models": questions["models"],
            "scope": ANY_SCOPE,
            **{k: questions[k] for k in ASSOCIATION_KEY},
            "published_fraction": questions["avg_percentage"] / 100.0,
            "published_lift": questions["avg_lift"],
            "published_p_adjusted": float("nan"),
            "published_effect": None,
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


def published_pool(path: str | Path) -> dict[str, Any]:
    """What the global pass of the association files at ``path`` pooled: the ``pool.json`` a storybias
    export writes beside its files (at ``path``, or up to two folders above a file), else the release's
    (``RELEASE_POOL``)."""
    marker = pool_file(path)
    if marker is None:
        return dict(RELEASE_POOL)
    try:
        pool = json.loads(marker.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PublishedFormatError(f"{marker}: not valid JSON ({exc.msg})") from None
    if not isinstance(pool, dict) or set(pool) != set(RELEASE_POOL):
        raise PublishedFormatError(f"{marker}: expected the keys {', '.join(RELEASE_POOL)}")
    return pool


def pool_file(path: str | Path) -> Path | None:
    """The ``pool.json`` :func:`published_pool` reads for the association files at ``path`` (at ``path``,
    or up to two folders above a file), or None."""
    start = Path(path)
    for folder in [start, *start.parents[:2]] if start.is_dir() else list(start.parents[:3]):
        if (folder / POOL_FILE).is_file():
            return folder / POOL_FILE
    return None


def published_files(path: str | Path) -> list[Path]:
    """Every file stage 04 reads for ``associations.published``: the association files (or questions.json)
    and the ``pool.json`` beside them, if any."""
    marker = pool_file(path)
    return association_files(Path(path)) + ([marker] if marker is not None else [])
