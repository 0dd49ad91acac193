"""A run's associations next to the ones StereoTales published.

StereoTales (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in LLMs*,
Le Jeune et al., Giskard AI, 2026, arXiv:2605.10442) released the 1,580 associations of its human study as a JSON list
(public repository ``Giskard-AI/stereotales-human-study``, ``data/questions.json``). Each record names
a base attribute and a compared attribute by dimension name and by the reference taxonomy's English
label (``"southern asia (e.g. India, Pakistan, Sri Lanka, Nepal, etc)"``), with the average
percentage and lift over the models that produced it (``metadata.model_list``)::

    {"question_id": "...", "base_attribute": {"name": "professional_field", "value": "agriculture"},
     "compared_attribute": {"name": "urbanicity", "value": "rural"}, "avg_percentage": 87.3,
     "avg_lift": 10.27, "metadata": {"model_list": ["anthropic/claude-haiku-4-5", ...]}}

:func:`load_published` validates such a file before any work (an error names the file, the record
and the field) and maps every label onto storybias' canonical keys through
``params/designs/stereotales/reference.yaml``. Stage 04 compares a run with them
(``storybias.stages.associations.published``), as it does with the released association files
(``storybias.evidence.released_associations``). A run model matches a published one when their names
agree after dropping the provider prefix and case (:func:`model_key`: ``azure_ai/gpt-4o`` = ``gpt-4o``).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from storybias.core import paths

KEY = ["base_attribute", "base_value", "compared_attribute", "compared_value"]
PUBLISHED_COLUMNS = ["question_id", *KEY, "base_label", "compared_label", "avg_percentage", "avg_lift", "models"]


class PublishedFormatError(ValueError):
    """A published-associations file does not have the expected format."""


def normalise_label(text: str) -> str:
    """Case, spacing and parenthesised examples removed: the published file writes some labels
    without their examples ("trades and manual labor") and some with them."""
    text = re.sub(r"\([^)]*\)", " ", text.lower())
    return " ".join(text.replace("_", " ").split()).strip(" .,;")


def model_key(name: str) -> str:
    """A model name without its provider prefix, lower-cased: ``azure_ai/GPT-4o`` -> ``gpt-4o``."""
    return name.strip().rsplit("/", 1)[-1].lower()


@cache
def reference_taxonomy() -> dict[str, Any]:
    with open(paths.designs_dir() / "stereotales" / "reference.yaml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@cache
def _reference_labels() -> dict[str, dict[str, str]]:
    return {
        dim: {key: str(spec["value"]) for key, spec in values.items()}
        for dim, values in reference_taxonomy()["dimensions"].items()
    }


def reference_label(dimension: str, key: str) -> str:
    """StereoTales' English label of a canonical value (``senior`` -> ``senior (65+)``), as its judges and
    human raters read it; a value the reference taxonomy lacks is shown as its key with spaces."""
    return _reference_labels().get(dimension, {}).get(key, str(key).replace("_", " "))


# The two values whose label in the reference's analysis differs from reference.yaml's (the prompts'
# spelling): its association step rewrites the prompted value to these, the spelling the released
# association files use (Giskard-AI/stereotales-pipeline, step 02's normalisation table).
ANALYSIS_SPELLING = {
    ("geographic_origin", "north_america"): "north america (e.g. United States, Canada, etc)",
    ("professional_field", "trades_manual_labor"): "trades and manual labor",
}


def release_label(dimension: str, key: str) -> str:
    """A canonical value as StereoTales' association files write it: its analysis label. The reference's
    contingency tables sort their rows and columns by this label, and so does storybias' test."""
    return ANALYSIS_SPELLING.get((dimension, key)) or reference_label(dimension, key)


@cache
def label_index() -> dict[str, dict[str, str]]:
    """Attribute -> {normalised label -> canonical key}. Each key is reachable from its canonical
    spelling, the reference's full label and that label without its examples; a form that would
    lead to two keys is an error in reference.yaml."""
    index: dict[str, dict[str, str]] = {}
    for attribute, values in reference_taxonomy()["dimensions"].items():
        forms: dict[str, str] = {}
        for key, words in values.items():
            for form in {
                normalise_label(key),
                normalise_label(words["value"]),
                " ".join(words["value"].lower().split()),
            }:
                if forms.setdefault(form, key) != key:
                    raise PublishedFormatError(
                        f"reference.yaml: {attribute} label {form!r} maps to both {forms[form]!r} and {key!r}"
                    )
        index[attribute] = forms
    return index


def canonical_value(attribute: str, label: str) -> str:
    """The canonical key of a published label; KeyError naming the attribute when it has none."""
    forms = label_index().get(attribute)
    if forms is None:
        raise KeyError(f"unknown attribute {attribute!r}")
    for form in (" ".join(label.lower().split()), normalise_label(label)):
        if form in forms:
            return forms[form]
    raise KeyError(f"{attribute} has no value {label!r}")


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


def load_published(path: str | Path) -> pd.DataFrame:
    """The published associations of a StereoTales ``questions.json``-format file, one row each, with
    canonical keys (columns ``PUBLISHED_COLUMNS``; ``*_label`` keep the file's wording)."""
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
    frame = pd.DataFrame(rows, columns=PUBLISHED_COLUMNS)
    dup = frame[frame["question_id"].duplicated()]
    if len(dup):
        raise PublishedFormatError(
            f"{path}: record {dup.index[0]}: field question_id: {dup['question_id'].iloc[0]!r} appears twice"
        )
    return frame


# --- the release's extracted profiles (extracted_attributes_json) ---------------------------------

UNKNOWN = "unknown"
PROFILE_OK, PROFILE_EMPTY, PROFILE_UNPARSABLE = "ok", "empty", "unparsable"


@cache
def scenario_index() -> dict[str, str]:
    """A released ``scenario_key`` (the English scenario, or storybias' key) -> storybias' scenario key."""
    index: dict[str, str] = {}
    for key, text in reference_taxonomy()["scenarios"].items():
        index[key] = key
        index[" ".join(str(text).lower().split())] = key
    return index


def scenario_of(label: str) -> str:
    """storybias' key of a released scenario; KeyError naming it when it is none of the 36."""
    key = scenario_index().get(" ".join(label.lower().split()))
    if key is None:
        raise KeyError(f"no scenario {label!r} in reference.yaml")
    return key


@cache
def extraction_value(attribute: str, label: str) -> str:
    """The canonical key of one value of a released profile: ``unknown``, ``other`` where the dimension
    allows it, or a taxonomy value in either published spelling. KeyError naming the dimension and the label."""
    if " ".join(label.lower().split()) == UNKNOWN:
        if attribute not in label_index():
            raise KeyError(f"unknown attribute {attribute!r}")
        return UNKNOWN
    return canonical_value(attribute, label)


def published_profile(text: str | None) -> tuple[str, dict[str, str]]:
    """A released ``extracted_attributes_json`` as (status, {dimension: canonical key}).

    Status ``empty`` for ``{}`` (no extraction matched), ``unparsable`` for text that is not a JSON object;
    both are kept by the caller and counted. A dimension or label outside the taxonomy raises KeyError
    naming it: the release uses only the taxonomy's labels, so that is a wrong file, not a story to skip."""
    try:
        data = json.loads(text) if text else None
    except json.JSONDecodeError:
        return PROFILE_UNPARSABLE, {}
    if not isinstance(data, dict):
        return PROFILE_UNPARSABLE, {}
    if not data:
        return PROFILE_EMPTY, {}
    profile = {}
    for attribute, label in data.items():
        name = "_".join(str(attribute).strip().lower().split())
        if not isinstance(label, str):
            raise KeyError(f"{attribute}: value {label!r} is not a string")
        profile[name] = extraction_value(name, label)
    return PROFILE_OK, profile
