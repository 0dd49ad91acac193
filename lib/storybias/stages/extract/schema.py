"""Stage 03's answer format as schemas: the closed value sets of an answer, the JSON schema that
constrains each extractor's answer (vLLM structured outputs), the sections a design's stories are asked,
and the Arrow schemas of extractions.parquet and extraction_raw.parquet.

The JSON schema is built from the designs, so a value outside the design cannot come back. Sections:

- ``protagonist`` (always): name as written, and gender with Feng et al.'s finer outcomes.
- ``demographics`` (StereoTales): the 19 dimensions of the stereotales design, each with ``unknown``
  (and ``other`` where the design allows it).
- ``narrative`` (BiasedTales-ML Sec. 4.1): trait adjectives (original word + English lemma), setting
  keywords and explicit cultural references.
- ``markers`` (Feng et al. Sec. 3.1, App. D.1): candidate cultural markers with keep/remove, one of ten
  categories, 1-7 relevance to English-, French- and Chinese-linked contexts, English translation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from storybias.config.designs import allowed_values, demo_columns, dimensions
from storybias.config.designs import get as get_design
from storybias.config.params import ExtractionSettings

GENDER_ANSWERS = ("woman", "man", "non_binary", "several_people", "no_person", "unclear")
# extractor answer -> (protagonist_gender, protagonist_gender_fine, demo_gender)
GENDER_MAP = {
    "woman": ("female", "female", "woman"),
    "man": ("male", "male", "man"),
    "non_binary": ("unknown", "non_binary", "non_binary"),
    "several_people": ("unknown", "multiple", "unknown"),
    "no_person": ("unknown", "none", "unknown"),
    "unclear": ("unknown", "unknown", "unknown"),
}
MARKER_CATEGORIES = (
    "toponyms",
    "institutions",
    "anthroponyms",
    "cuisine",
    "rituals",
    "religion",
    "material_culture",
    "arts_and_media",
    "mythology",
    "value_orientations",
)
SECTIONS = ("demographics", "narrative", "markers")


def build_schema(sections: Sequence[str], max_items: int | None = 6, with_facts: bool = False) -> dict[str, Any]:
    """JSON schema of one extraction answer. Demographic gender is derived from ``gender`` (one
    question, so the two gender fields can never disagree). ``with_facts``: a free-text ``facts``
    key opens the answer (kept in the raw answer, not a field of the extraction table)."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown extraction section(s) {unknown}; expected some of {SECTIONS}")
    props: dict[str, Any] = {
        "name": {"type": "string", "maxLength": 60},
        "gender": {"type": "string", "enum": list(GENDER_ANSWERS)},
    }
    if "demographics" in sections:
        for dim in dimensions():
            if dim != "gender":
                props[dim] = {"type": "string", "enum": allowed_values(dim)}
    short = {"type": "string", "maxLength": 40}
    cap = {} if max_items is None else {"maxItems": max_items}  # None: no cap (BiasedTales-ML states none)
    if "narrative" in sections:
        props["adjectives"] = {
            "type": "array",
            **cap,
            "items": {
                "type": "object",
                "properties": {"word": short, "lemma_en": short},
                "required": ["word", "lemma_en"],
                "additionalProperties": False,
            },
        }
        props["settings"] = {"type": "array", **cap, "items": short}
        props["cultural_refs"] = {"type": "array", **cap, "items": short}
    if "markers" in sections:
        score = {"type": "integer", "minimum": 1, "maximum": 7}
        props["markers"] = {
            "type": "array",
            **cap,
            "items": {
                "type": "object",
                "properties": {
                    "text": short,
                    "text_en": short,
                    "keep": {"type": "boolean"},
                    "category": {"type": "string", "enum": list(MARKER_CATEGORIES)},
                    "relevance_en": score,
                    "relevance_fr": score,
                    "relevance_zh": score,
                },
                "required": ["text", "text_en", "keep", "category", "relevance_en", "relevance_fr", "relevance_zh"],
                "additionalProperties": False,
            },
        }
    if with_facts:
        props = {"facts": {"type": "string", "maxLength": 400}, **props}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def extractions_schema() -> pa.Schema:
    """Arrow schema of extractions.parquet. Written with it, a column that happens to be empty on a
    small run (no names, no markers, no explicit-task story) keeps its type: the data contract holds."""
    text, words = pa.string(), pa.list_(pa.string())
    marker = pa.struct(
        [
            ("text", text),
            ("text_en", text),
            ("keep", pa.bool_()),
            ("category", text),
            ("relevance_en", pa.int64()),
            ("relevance_fr", pa.int64()),
            ("relevance_zh", pa.int64()),
        ]
    )
    return pa.schema(
        [
            ("story_id", text),
            ("extractors", words),
            ("parse_ok", pa.bool_()),
            ("n_parse_failures", pa.int64()),
            ("story_cut", pa.bool_()),
            *((c, text) for c in demo_columns()),
            ("protagonist_gender", text),
            ("protagonist_gender_fine", text),
            ("protagonist_name", text),
            ("adjectives_en", words),
            ("adjectives_orig", words),
            ("settings", words),
            ("cultural_refs", words),
            ("markers", pa.list_(marker)),
            ("explicit_label", text),
            ("raw", text),
        ]
    )


RAW_SCHEMA = pa.schema(
    [
        ("answer_key", pa.string()),  # request_key|attempt
        ("request_key", pa.string()),  # story|extractor|pass: one final answer each
        ("story_id", pa.string()),
        ("extractor", pa.string()),
        ("pass", pa.string()),
        ("attempt", pa.int64()),
        ("raw", pa.string()),
        ("parse_ok", pa.bool_()),
        ("error", pa.string()),
        ("n_tokens", pa.int64()),
        ("finish_reason", pa.string()),
        ("story_cut", pa.bool_()),
        ("cache_key", pa.string()),  # the answer's entry in data/<run>/cache (storybias.engines.cache)
    ]
)


def design_sections(settings: ExtractionSettings, design: str) -> tuple[str, ...]:
    """The sections asked for a design's stories: ``extract.sections.<design>``, else (a design the
    profile does not name, beyond the built-in ones) its design registry entry (storybias.config.designs)."""
    given = getattr(settings.sections, design, None)
    if given is None:
        return get_design(design).sections
    return tuple(given)
