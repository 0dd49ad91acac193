"""StereoTales' released association files, and the one published-associations table stage 04 compares with.

The StereoTales release (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in
LLMs*, Le Jeune et al., Giskard AI, 2026, arXiv:2605.10442; Hugging Face dataset ``giskardai/StereoTales``,
configs ``associations_global`` and ``associations_by_language``) holds its association tests as JSONL
files, one per generator model and slice (``<model with / as _>__<slice>.jsonl``), one record per line
and per attribute pair, the reference pipeline's ``Association`` model (Giskard-AI/stereotales-pipeline,
``src/stereotales_pipeline/models.py``) in its field order::

    {"base_attribute": "gender", "compared_attribute": "professional_field",
     "associated_values": [{"base_value": {"name": "gender", "value": "man"},
                            "compared_value": {"name": "professional_field", "value": "trades and manual labor"},
                            "statistics": {"p_value": 0.001, "fraction": 0.42, "lift": 2.3}}, ...],
     "statistics": {"alpha": 0.05, "alpha_corrected": 0.05, "p_value": 0.003, "cramer_v": 0.31,
                    "effect_category": "medium", "chi_square": 41.2, "degrees_of_freedom": 4,
                    "dim_table": [3, 3],
                    "contingency_table_data": {"<compared label>": {"<base label>": 12, ...}, ...}},
     "generator_model": "azure_ai/gpt-4o", "sample_ids": ["<sample_id>", ...],
     "aggregation_dimension": ["language"], "aggregation_value": "fr"}

``aggregation_dimension`` is a list: ``[]`` in the global pass, ``["language"]`` per language.
``aggregation_value`` is ``all`` (the global pass) or the stories' language code; the reference names its
Dutch folder ``du`` (its exporter maps ``nl`` to ``du``, and its seed files are ``*.du.yaml``), and this
reader takes ``du`` and ``nl`` alike. ``sample_ids`` lists the ``sample_id`` of every story of the model in
the slice, one entry per story (a prompt answered several times repeats), in every record of the file.
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
an error naming the file, the line and the field, before any test runs (``make check-params`` and stage 04
read it with this one function). Each test counts once: a record repeated (an exact copy of a line, or one
attribute pair of one model and scope in a second record or file) is refused, and so is a cell listed twice
in one record. A scope is ``all`` or a language the release knows (its ten, and those a storybias export's
``pool.json`` names); p-values and fractions are finite numbers in [0, 1], lifts finite and >= 0, Cramer's V
-1 or in [0, 1], the effect category one of the five. Values are quoted shortened in messages.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from storybias.core.inputs import missing_marker, shown, unique_keys
from storybias.core.io import first_undecodable_line
from storybias.evidence.questions import load_questions
from storybias.evidence.stereotales_taxonomy import ASSOCIATION_KEY, PublishedFormatError, canonical_value
from storybias.stats.effect_sizes import EFFECT_LABELS

# The release's language codes that differ from storybias' ISO 639-1 codes, and back.
RELEASE_LANGUAGE = {"du": "nl"}
RELEASE_CODE = {ours: theirs for theirs, ours in RELEASE_LANGUAGE.items()}
# The ten languages of StereoTales' release (storybias' codes, in the release's order): what its global
# pass pooled, and what a corpus profile reads by default.
RELEASED_LANGUAGES = tuple(
    RELEASE_LANGUAGE.get(c, c) for c in ("en", "ar", "du", "es", "fr", "hi", "it", "pt", "uk", "zh")
)
RELEASE_SCOPES = frozenset(RELEASED_LANGUAGES)  # the languages a released file's per-language scope may name
GLOBAL_SCOPE = "all"
PROBABILITY, LIFT = (0.0, 1.0), (0.0, math.inf)  # the ranges of a p-value or fraction, and of a lift
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
POOL_P_VALUES = "p_values"  # pool.json's optional key: how many of the files' p-values are estimates, and how
LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}$")  # a language of pool.json: storybias' codes (en, fr, ...)
NOT_SIGNIFICANT = "N/A"  # the effect category of a pair whose BH-adjusted p is not < 0.05
STATED_EFFECTS = ("medium", "large")  # StereoTales' stated rule keeps these pairs, and cells of lift >= 2
# A human-study question's scope: its list mixes associations of the global pass and of single languages'
# passes and does not say which (StereoTales' summary counts 784 global ones of 1,580).
ANY_SCOPE = "any"

# One row per published association. `source`: "questions" (the human study's list: scope `any`, the
# models that produced it) or "released" (an association file: one model, one scope). `models`: the
# published generator models. `published_p_adjusted`: BY-adjusted (released files; NaN for questions).
# `published_effect`: the effect category of the cell's attribute pair (released files; None for
# questions, whose list StereoTales drew with its stated rule). `question_ids`: the questions this row
# stands for (a questions file that lists one association under several ids gives one row; [] for released).
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
    "question_ids",
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
    if not isinstance(value, str) or not value.strip() or missing_marker(value):
        raise _fail(path, line, field, f"missing or not a string ({shown(value)})")
    return value.strip()


def _attribute_name(name: str) -> str:
    return "_".join(name.strip().lower().split())


def _value(part: Any, attribute: str, path: Path, line: int, field: str) -> str:
    """The canonical key of one ``{name, value}`` of an associated value."""
    if not isinstance(part, dict) or not isinstance(part.get("value"), str):
        raise _fail(path, line, field, "missing or not an object with a string value")
    name = part.get("name")
    if isinstance(name, str) and _attribute_name(name) != attribute:
        raise _fail(path, line, f"{field}.name", f"{shown(name)} is not the record's attribute {attribute!r}")
    try:
        return canonical_value(attribute, part["value"])
    except KeyError as exc:
        raise _fail(path, line, f"{field}.value", str(exc.args[0])) from None


def _number(stats: Any, field: str, path: Path, line: int, where: str, bounds: tuple[float, float]) -> float:
    """A finite number within ``bounds`` (inclusive); NaN, an infinity or a value outside is refused."""
    value = stats.get(field) if isinstance(stats, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, line, f"{where}.{field}", f"missing or not a number ({shown(value)})")
    low, high = bounds
    if isinstance(value, int) and not -(2**53) <= value <= 2**53:  # a float could not hold it (400 digits)
        raise _fail(path, line, f"{where}.{field}", f"an integer of {len(str(abs(value))):,} digits is out of range")
    if not math.isfinite(value) or not low <= value <= high:
        raise _fail(path, line, f"{where}.{field}", f"{value} is not a finite number in [{low:g}, {high:g}]")
    return float(value)


def _cells(record: dict, base: str, compared: str, path: Path, line: int) -> list[dict[str, Any]]:
    """The record's associated values as rows of canonical keys and published statistics; a value listed
    twice (in either spelling) is refused."""
    entries = record.get("associated_values")
    if not isinstance(entries, list):
        raise _fail(path, line, "associated_values", "missing or not a list")
    rows: list[dict[str, Any]] = []
    first_at: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(entries):
        where = f"associated_values[{i}]"
        if not isinstance(entry, dict):
            raise _fail(path, line, where, "not an object")
        stats = entry.get("statistics")
        base_value = _value(entry.get("base_value"), base, path, line, f"{where}.base_value")
        compared_value = _value(entry.get("compared_value"), compared, path, line, f"{where}.compared_value")
        first = first_at.setdefault((base_value, compared_value), i)
        if first != i:
            cell = f"{base_value} x {compared_value}"
            raise _fail(path, line, where, f"the cell {cell} again (first as associated_values[{first}])")
        row = {
            "base_attribute": base,
            "base_value": base_value,
            "compared_attribute": compared,
            "compared_value": compared_value,
            "published_fraction": _number(stats, "fraction", path, line, f"{where}.statistics", PROBABILITY),
            "published_lift": _number(stats, "lift", path, line, f"{where}.statistics", LIFT),
            "published_p_adjusted": _number(stats, "p_value", path, line, f"{where}.statistics", PROBABILITY),
        }
        rows.append(row)
    return rows


def _scope(record: dict, path: Path, line: int, languages: frozenset[str]) -> str:
    """The record's scope: all, or a language the release knows (``known_languages``), storybias' code."""
    raw = _text(record, "aggregation_value", path, line).lower()
    scope = RELEASE_LANGUAGE.get(raw, raw)
    if scope != GLOBAL_SCOPE and scope not in languages:
        known = ", ".join(RELEASE_CODE.get(c, c) for c in sorted(languages))
        raise _fail(
            path, line, "aggregation_value", f"{shown(raw)} is neither all nor a language of the release ({known})"
        )
    return scope


def _aggregation(record: dict, scope: str, path: Path, line: int) -> None:
    """Refuse an ``aggregation_dimension`` that is not the reference's list for the record's scope:
    ``[]`` for ``all``, ``["language"]`` for a language (the model allows scenario and attribute too,
    which no released pass uses)."""
    dimension = record.get("aggregation_dimension")
    expected = [] if scope == GLOBAL_SCOPE else ["language"]
    if dimension != expected:
        raise _fail(
            path, line, "aggregation_dimension", f"{shown(dimension)} is not {expected}, the list of scope {scope}"
        )


def _pair(record: Any, path: Path, line: int, languages: frozenset[str]) -> dict[str, Any]:
    """The tested attribute pair of one JSONL record: model, scope, attributes and its statistics."""
    if not isinstance(record, dict):
        raise _fail(path, line, "(record)", "not a JSON object")
    model = _text(record, "generator_model", path, line)
    scope = _scope(record, path, line, languages)
    _aggregation(record, scope, path, line)
    base = _attribute_name(_text(record, "base_attribute", path, line))
    compared = _attribute_name(_text(record, "compared_attribute", path, line))
    if base == compared:
        raise _fail(path, line, "compared_attribute", f"same attribute as the base ({base})")
    stats = record.get("statistics")
    effect = stats.get("effect_category") if isinstance(stats, dict) else None
    if effect not in (*EFFECT_LABELS, NOT_SIGNIFICANT):
        allowed = ", ".join((*EFFECT_LABELS, NOT_SIGNIFICANT))
        raise _fail(path, line, "statistics.effect_category", f"missing or not one of {allowed} ({shown(effect)})")
    cramer_v = _number(stats, "cramer_v", path, line, "statistics", (-1.0, 1.0))
    if -1.0 < cramer_v < 0.0:
        raise _fail(path, line, "statistics.cramer_v", f"{cramer_v} is neither -1 (not significant) nor in [0, 1]")
    return {
        "file": path.name,
        "model": model,
        "scope": scope,
        "base_attribute": base,
        "compared_attribute": compared,
        "p_adjusted": _number(stats, "p_value", path, line, "statistics", PROBABILITY),
        "cramer_v": cramer_v,
        "effect_category": effect,
    }


def _read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed record) of every non-blank line of a released JSONL file."""
    records = []
    with open(path, "rb") as fh:
        for line_number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _fail(path, line_number, "(record)", f"not UTF-8 text ({exc.reason})") from None
            if not line.strip():
                continue
            try:
                records.append((line_number, json.loads(line, object_pairs_hook=unique_keys)))
            except json.JSONDecodeError as exc:
                raise _fail(path, line_number, "(record)", f"not valid JSON ({exc.msg})") from None
            except RecursionError:
                raise _fail(path, line_number, "(record)", "a value nested too deeply to read") from None
            except ValueError as exc:  # a key repeated in one object
                raise _fail(path, line_number, "(record)", str(exc)) from None
    return records


def _repeated(pair: dict[str, Any], record: Any, path: Path, line: int, seen: dict[tuple[str, ...], Any]) -> None:
    """Refuse a second record of one attribute pair of one model and scope, in this file or another one
    (an exact copy of a line, or the same test with other figures): a repeated test would be counted
    twice. ``seen``: the pairs read so far -> (file, line, the record)."""
    key = (pair["model"], pair["scope"], pair["base_attribute"], pair["compared_attribute"])
    first = seen.setdefault(key, (path, line, record))
    if first[:2] == (path, line):
        return
    where = f"line {first[1]}" + ("" if first[0] == path else f" of {first[0]}")
    what = "repeats " + where + " exactly" if first[2] == record else f"tests the pair of {where} again"
    test = f"{pair['base_attribute']} x {pair['compared_attribute']}, model {pair['model']}, scope {pair['scope']}"
    raise _fail(path, line, "(record)", f"{what} ({test}): each pair is tested once per model and scope")


def load_released(path: Path, languages: frozenset[str] = RELEASE_SCOPES, seen: dict | None = None) -> pd.DataFrame:
    """The published associations of one released JSONL file (``PUBLISHED_COLUMNS``): every associated
    value of every record, with its pair's effect category. ``languages``: the scopes it may name besides
    ``all``; ``seen``: the pairs of the files read before (a pair repeated across files is refused too)."""
    seen = {} if seen is None else seen
    rows: list[dict[str, Any]] = []
    for line, record in _read_records(path):
        pair = _pair(record, path, line, languages)
        _repeated(pair, record, path, line, seen)
        where = {"source": "released", "file": pair["file"], "models": [pair["model"]], "scope": pair["scope"]}
        cells = _cells(record, pair["base_attribute"], pair["compared_attribute"], path, line)
        rows.extend(
            {**where, **cell, "published_effect": pair["effect_category"], "question_ids": []} for cell in cells
        )
    return pd.DataFrame(rows, columns=PUBLISHED_COLUMNS)


def load_released_pairs(path: str | Path) -> pd.DataFrame:
    """Every tested attribute pair of the released JSONL files at ``path`` (a file or a folder),
    ``PAIR_COLUMNS``: its BH-adjusted p-value, Cramer's V, effect category and number of associated values."""
    rows = []
    languages = known_languages(Path(path))
    for file in association_files(Path(path)):
        for line, record in _read_records(file):
            pair = _pair(record, file, line, languages)
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
            "question_ids": questions["question_ids"],
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


def known_languages(path: Path) -> frozenset[str]:
    """The languages a per-language scope of the files at ``path`` may name (storybias' codes): the
    release's ten, and those the files' ``pool.json`` (a storybias export) pooled."""
    return RELEASE_SCOPES | frozenset(published_pool(path)["languages"])


def load_associations(path: str | Path) -> pd.DataFrame:
    """Every published association at ``path`` (a JSONL file, a folder of them, or a questions.json),
    each once: a repeated test (a line twice, one attribute pair of one model and scope in two records or
    two files) is refused; a questions file's association under several question ids is one row."""
    path = Path(path)
    languages = known_languages(path)
    seen: dict[tuple[str, ...], tuple[Path, int, Any]] = {}
    frames = [
        _from_questions(file) if file.suffix.lower() == ".json" else load_released(file, languages, seen)
        for file in association_files(path)
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
    except UnicodeDecodeError as exc:
        line = first_undecodable_line(marker)
        raise PublishedFormatError(f"{marker}: line {line}: not UTF-8 text ({exc.reason})") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise PublishedFormatError(f"{marker}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(pool, dict) or set(pool) - {POOL_P_VALUES} != set(RELEASE_POOL):
        raise PublishedFormatError(f"{marker}: expected the keys {', '.join(RELEASE_POOL)} (and {POOL_P_VALUES})")
    if not isinstance(pool.get(POOL_P_VALUES, {}), dict):
        raise PublishedFormatError(f"{marker}: {POOL_P_VALUES} is not an object")
    problem = _pool_problem({k: v for k, v in pool.items() if k != POOL_P_VALUES})
    if problem is not None:
        raise PublishedFormatError(f"{marker}: {problem}")
    return pool


def _pool_problem(pool: dict[str, Any]) -> str | None:
    """What is wrong with the values of a pool.json (None when nothing): ``languages`` a list of language
    codes (``"en"`` would be read as the scopes e and n), ``additional_en`` a boolean, ``attributes`` null or
    a list of names, ``sample`` null or a positive integer."""
    languages, attributes, sample = pool["languages"], pool["attributes"], pool["sample"]
    if not isinstance(languages, list) or not all(isinstance(x, str) and LANGUAGE_CODE.match(x) for x in languages):
        return f"key languages: expected a list of language codes (e.g. [en, fr]), got {shown(languages)}"
    if not isinstance(pool["additional_en"], bool):
        return f"key additional_en: expected true or false, got {shown(pool['additional_en'])}"
    if attributes is not None and not (isinstance(attributes, list) and all(isinstance(x, str) for x in attributes)):
        return f"key attributes: expected null or a list of attribute names, got {shown(attributes)}"
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
        return f"key sample: expected null or a positive integer, got {shown(sample)}"
    return None


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
