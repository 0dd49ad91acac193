"""StereoTales' taxonomy and its labels: the canonical keys storybias uses, the English labels the
reference's files and judges use, model names, scenarios and the release's extracted profiles.

StereoTales (*StereoTales: A Multilingual Framework for Open-Ended Stereotype Discovery in LLMs*,
Le Jeune et al., Giskard AI, 2026, arXiv:2605.10442) labels every value in English
(``"southern asia (e.g. India, Pakistan, Sri Lanka, Nepal, etc)"``), in its association files, its human
study's list and its released profiles; storybias keys them (``south_asia``). :func:`canonical_value`
maps a label onto its key through ``params/designs/stereotales/reference.yaml`` (either published
spelling, with or without its examples); :func:`reference_label` and :func:`release_label` go back.
A run model matches a published one when their names agree after dropping the provider prefix and case
(:func:`model_key`: ``azure_ai/gpt-4o`` = ``gpt-4o``). The human study's list is read by
``storybias.evidence.questions``, the association files by ``storybias.evidence.released_associations``.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from storybias.core import paths
from storybias.core.inputs import shown
from storybias.core.io import read_yaml_strict

# An association's identity: its base attribute and value, its compared attribute and value (canonical keys)
ASSOCIATION_KEY = ["base_attribute", "base_value", "compared_attribute", "compared_value"]


class PublishedFormatError(ValueError):
    """A published file (association files, the human study's list, reference.yaml) does not have the
    expected format; the message names the file, the record or line and the field."""


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
    return read_yaml_strict(paths.designs_dir() / "stereotales" / "reference.yaml")


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
        raise KeyError(f"unknown attribute {shown(attribute)}")
    for form in (" ".join(label.lower().split()), normalise_label(label)):
        if form in forms:
            return forms[form]
    raise KeyError(f"{attribute} has no value {shown(label)}")


# --- the release's extracted profiles (extracted_attributes_json) ---------------------------------

UNKNOWN = "unknown"
PROFILE_OK, PROFILE_EMPTY, PROFILE_UNPARSABLE, PROFILE_MISSING = "ok", "empty", "unparsable", "missing"


class ProfileError(ValueError):
    """A released profile that no taxonomy label explains (a wrong file, not a story to skip)."""


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
        raise KeyError(f"no scenario {shown(label)} in reference.yaml")
    return key


@cache
def extraction_value(attribute: str, label: str) -> str:
    """The canonical key of one value of a released profile: ``unknown``, ``other`` where the dimension
    allows it, or a taxonomy value in either published spelling. KeyError naming the dimension and the label."""
    if " ".join(label.lower().split()) == UNKNOWN:
        if attribute not in label_index():
            raise KeyError(f"unknown attribute {shown(attribute)}")
        return UNKNOWN
    return canonical_value(attribute, label)


def published_profile(text: Any) -> tuple[str, dict[str, str]]:
    """A released ``extracted_attributes_json`` as (status, {dimension: canonical key}).

    Status ``missing`` for a null (no extraction recorded), ``empty`` for ``{}`` (no extraction matched),
    ``unparsable`` for text that is not a JSON object; all three are kept by the caller and counted. A
    dimension or label outside the taxonomy, a label that is not a string, a value that is not text or
    JSON nested too deeply to read raises :class:`ProfileError` naming it: the release uses only the
    taxonomy's labels, so that is a wrong file, not a story to skip."""
    if text is None or (isinstance(text, float) and text != text):  # Arrow's null, as pandas gives it
        return PROFILE_MISSING, {}
    if not isinstance(text, str):
        raise ProfileError(f"{shown(text)} is not text (a JSON object written as a string)")
    try:
        data = json.loads(text) if text else None
    except json.JSONDecodeError:
        return PROFILE_UNPARSABLE, {}
    except RecursionError:
        raise ProfileError("a JSON value nested too deeply to read") from None
    if not isinstance(data, dict):
        return PROFILE_UNPARSABLE, {}
    if not data:
        return PROFILE_EMPTY, {}
    profile = {}
    for attribute, label in data.items():
        name = "_".join(str(attribute).strip().lower().split())
        if not isinstance(label, str):
            raise ProfileError(f"{shown(attribute)}: value {shown(label)} is not a string")
        try:
            profile[name] = extraction_value(name, label)
        except KeyError as exc:
            raise ProfileError(str(exc.args[0]) if exc.args else str(exc)) from None
    return PROFILE_OK, profile
