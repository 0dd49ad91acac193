"""Stage 03's answers read back: one raw answer parsed and checked against the schema's value sets,
then turned into the columns of extractions.parquet; the explicit task's label word mapped to a gender.

Failures are data: an answer that does not parse is kept with its raw text and ``parse_ok = False``
(``ParsedAnswer``); parsing never raises.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storybias.config.designs import demo_columns, dimensions
from storybias.config.prompts import explicit_labels, load_design
from storybias.stages.extract.schema import GENDER_MAP, build_schema


@dataclass
class ParsedAnswer:
    ok: bool
    data: dict[str, Any] | None
    error: str | None


def parse_answer(raw: str, sections: Sequence[str]) -> ParsedAnswer:
    """Parse and check one raw answer against the schema's value sets. Never raises."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, TypeError) as exc:
        return ParsedAnswer(False, None, f"not JSON: {exc}")
    if not isinstance(data, dict):
        return ParsedAnswer(False, None, "not a JSON object")
    schema = build_schema(sections)
    missing = [k for k in schema["required"] if k not in data]
    if missing:
        return ParsedAnswer(False, data, f"missing fields: {missing}")
    for key, spec in schema["properties"].items():
        if "enum" in spec and data[key] not in spec["enum"]:
            return ParsedAnswer(False, data, f"{key}: {data[key]!r} not allowed")
    return ParsedAnswer(True, data, None)


def empty_record(sections: Sequence[str]) -> dict[str, Any]:
    """Field values for a story that has no usable answer: unknown everywhere, empty lists."""
    record: dict[str, Any] = {c: "unknown" for c in demo_columns()}
    record.update(
        protagonist_gender="unknown",
        protagonist_gender_fine="unknown",
        protagonist_name=None,
        adjectives_en=[],
        adjectives_orig=[],
        settings=[],
        cultural_refs=[],
        markers=[],
    )
    return record


def with_defaults(record: dict[str, Any], defaults: Mapping[str, str]) -> dict[str, Any]:
    """``record`` with each demographic field of ``defaults`` that it left ``unknown`` set to the default
    (the design's ``extraction_defaults``: StereoTales' health is good unless the story says otherwise)."""
    out = dict(record)
    for dimension, value in defaults.items():
        if out.get(f"demo_{dimension}") == "unknown":
            out[f"demo_{dimension}"] = value
    return out


def to_record(data: dict[str, Any] | None, sections: Sequence[str]) -> dict[str, Any]:
    """A parsed answer as the columns of extractions.parquet (sections not asked stay unknown/empty)."""
    record = empty_record(sections)
    if not data:
        return record
    gender, fine, demo_gender = GENDER_MAP[data["gender"]]
    record.update(
        protagonist_gender=gender,
        protagonist_gender_fine=fine,
        protagonist_name=(data.get("name") or "").strip() or None,
    )
    if "demographics" in sections:
        for dim in dimensions():
            record[f"demo_{dim}"] = demo_gender if dim == "gender" else data[dim]
    if "narrative" in sections:
        adjectives = [a for a in data.get("adjectives", []) if a.get("lemma_en", "").strip()]
        record["adjectives_en"] = [normalize_lemma(a["lemma_en"]) for a in adjectives]
        record["adjectives_orig"] = [a["word"].strip() for a in adjectives]
        record["settings"] = [normalize_lemma(s) for s in data.get("settings", []) if s.strip()]
        record["cultural_refs"] = [s.strip() for s in data.get("cultural_refs", []) if s.strip()]
    if "markers" in sections:
        record["markers"] = [
            {
                "text": m["text"].strip(),
                "text_en": m["text_en"].strip(),
                "keep": bool(m["keep"]),
                "category": m["category"],
                "relevance_en": int(m["relevance_en"]),
                "relevance_fr": int(m["relevance_fr"]),
                "relevance_zh": int(m["relevance_zh"]),
            }
            for m in data.get("markers", [])
            if m.get("text", "").strip()
        ]
    return record


def normalize_lemma(word: str) -> str:
    return " ".join(word.strip().lower().split())


# --- the explicit task -------------------------------------------------------------------------


def explicit_gender(answer: str, language: str) -> str:
    """Map an explicit-task answer (a label word in the prompt's language) to female/male/unidentified."""
    words = {w.strip().lower(): key for key, w in explicit_labels(language).items()}
    key = words.get(str(answer).strip().strip(".").lower())
    if key is None:
        return "unidentified"
    return load_design("occupations")["explicit_labels"][key]
