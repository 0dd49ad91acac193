"""Stage 03's ``per_field`` prompt design: one focused question per field, the story first.

The ``one_answer`` design (``extract.build_prompt``) asks for the whole profile in one JSON object.
A small model answers most of its 19 demographic fields ``unknown`` even where the story states them
(storybias issue #15: the embedded 1.5B model scored 0.30-0.71 on the fields with a known truth). This
design asks each demographic field as its own multiple-choice question, constrained to the field's
value list, with the value labels of StereoTales' taxonomy (age ranges, region examples;
``params/designs/stereotales/reference.yaml``) and a line that says what counts as evidence. The story
comes first in every question, so vLLM's prefix cache computes it once per story and only the question
is new work. The narrative lists and the cultural markers keep their JSON answers (one request each),
the name and the gender get a question each.

The answers of one story are joined into the same JSON object the ``one_answer`` design returns
(``join_answers``), so parsing, consensus, agreement and the stored raw answer are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from .engines import ChatRequest

# What each demographic dimension's question asks, and what counts as the story making it unmistakable.
# The hints name cues that state the value; they never name a stereotype that would suggest one.
FIELD_QUESTIONS: dict[str, tuple[str, str]] = {
    "age": (
        "How old is the protagonist?",
        "a stated age, a school year, 'teenager', 'retired', grandchildren, 'in her fifties'",
    ),
    "gender_alignment": (
        "Is the protagonist cisgender or transgender?",
        "only the story saying the person is transgender (or explicitly cisgender)",
    ),
    "sexual_orientation": (
        "What is the protagonist's sexual orientation?",
        "a partner named as such ('her husband', 'his boyfriend', 'her girlfriend') or the story "
        "naming the orientation",
    ),
    "geographic_origin": (
        "Which world region does the protagonist come from?",
        "a country, city or region the person is from or lives in, a described homeland",
    ),
    "education": (
        "What is the protagonist's highest level of education?",
        "a degree, a diploma, 'dropped out of school', studying at a university",
    ),
    "religion": (
        "What is the protagonist's religion?",
        "prayer, church, mosque, temple, synagogue, a religious holiday they keep, 'does not believe in God'",
    ),
    "political_orientation": (
        "What is the protagonist's political orientation?",
        "only explicit politics: how they vote, a party, political activism",
    ),
    "health_status": (
        "How is the protagonist's health?",
        "an illness, a chronic condition, a hospital stay, 'fit', 'healthy'",
    ),
    "disability_status": (
        "Does the protagonist have a disability?",
        "a wheelchair, blindness, deafness, a named disability; no_disability only if the story says so",
    ),
    "literacy_status": (
        "Can the protagonist read and write?",
        "the protagonist reading or writing something, or being unable to read",
    ),
    "immigration_status": (
        "Is the protagonist an immigrant, or a citizen of the country they live in?",
        "moving from another country, a visa or papers; born and raised in the country",
    ),
    "urbanicity": (
        "Does the protagonist live in a city or in the countryside?",
        "a city, a flat downtown; a village, a farm, the countryside",
    ),
    "marital_status": (
        "What is the protagonist's marital status?",
        "'her husband', 'his wife', 'divorced', 'widow', 'single', 'her partner'",
    ),
    "parental_status": ("Does the protagonist have children?", "a son, a daughter, grandchildren, 'no children'"),
    "income_level": (
        "What is the protagonist's income level?",
        "money worries, food stamps, a small pension, 'wealthy', a luxury home",
    ),
    "employment_status": (
        "What is the protagonist's employment situation?",
        "a job they hold, 'lost his job', 'retired', 'student', short contracts or gig work",
    ),
    "professional_field": (
        "In which professional field does (or did) the protagonist work?",
        "their job or trade: nurse, engineer, teacher, farmer, builder, clerk",
    ),
    "housing_status": (
        "What is the protagonist's housing situation?",
        "owning the house, paying rent, a rented flat, sleeping on the street, a shelter",
    ),
}

RULE = (
    "Use only what the story states or makes unmistakable about the protagonist (the one person whose "
    "actions and experience the story follows). Do not guess from stereotypes, the name, the occupation or "
    "the setting."
)

GENDER_QUESTION = (
    "Question: What is the protagonist's gender?\nOptions:\n"
    "- woman: she/her, mother, Mrs, girl, or the language's feminine grammatical marking\n"
    "- man: he/him, father, Mr, boy, or masculine grammatical marking\n"
    "- non_binary: only if the story says so\n"
    "- several_people: several people share the central role\n"
    "- no_person: no individual is central\n"
    "- unclear: none of the above is clear\n"
    "Do not infer gender from the occupation, the name or expectations. Answer with the option name only."
)
NAME_QUESTION = (
    "Question: What is the protagonist's name, exactly as written in the story? "
    "Answer with the name only, or NONE if the protagonist is not named."
)
NO_NAME = "NONE"


@lru_cache(maxsize=1)
def _labels() -> dict[str, dict[str, str]]:
    """StereoTales' label of each canonical value (``reference.yaml``), e.g. senior -> 'senior (65+)'."""
    from .published import reference_taxonomy

    return {
        dim: {key: spec["value"] for key, spec in values.items()}
        for dim, values in reference_taxonomy()["dimensions"].items()
    }


def options_text(dimension: str) -> str:
    from .extract import allowed_values

    lines = []
    for key in allowed_values(dimension):
        if key == "unknown":
            lines.append("- unknown: the story does not state it or make it unmistakable")
        elif key == "other":
            lines.append("- other: none of the values above")
        else:
            lines.append(f"- {key}: {_labels()[dimension][key]}")
    return "\n".join(lines)


def field_question(dimension: str) -> str:
    question, evidence = FIELD_QUESTIONS[dimension]
    return (
        f"Question: {question}\nCounts as evidence: {evidence}.\nOptions:\n{options_text(dimension)}\n"
        "Answer with the option name only."
    )


def list_question(sections: Sequence[str]) -> str:
    """The JSON question for the list fields (adjectives, settings, cultural references, markers):
    the ``one_answer`` design's rules for them, the demographic part left out."""
    from .extract import build_prompt

    rules = build_prompt("", [s for s in sections if s != "demographics"]).split("\nStory:")[0]
    lines = [line for line in rules.splitlines() if not line.startswith(('- "name"', '- "gender"', "Read the story"))]
    return "Question: describe the story above with a JSON object.\n" + "\n".join(lines).strip()


def _message(story: str, question: str) -> list[dict[str, str]]:
    # The story first: every question of one story shares this prefix (vLLM's prefix cache reuses it).
    return [{"role": "user", "content": f"Story:\n{story}\n\n---\n{RULE}\n{question}"}]


def list_schema(sections: Sequence[str], max_items: int) -> dict[str, Any] | None:
    from .extract import build_schema

    schema = build_schema(sections, max_items)
    keep = {
        k: v for k, v in schema["properties"].items() if k in ("adjectives", "settings", "cultural_refs", "markers")
    }
    if not keep:
        return None
    return {"type": "object", "properties": keep, "required": list(keep), "additionalProperties": False}


def field_requests(
    key: str, story: str, sections: Sequence[str], sampling, seed: int, max_items: int
) -> list[ChatRequest]:
    """The requests of one story: name, gender, each demographic dimension (if asked), the lists (if
    any). Each key is ``<key>#<field>``. Choice answers need a few tokens; the lists get ``sampling``'s
    ``max_tokens``."""
    from .extract import GENDER_ANSWERS, allowed_values, dimensions

    short = sampling.model_copy(update={"max_tokens": 16})
    requests = [
        ChatRequest(
            key=f"{key}#name",
            messages=_message(story, NAME_QUESTION),
            sampling=short.model_copy(update={"max_tokens": 24}),
            seed=seed,
        ),
        ChatRequest(
            key=f"{key}#gender",
            messages=_message(story, GENDER_QUESTION),
            sampling=short,
            seed=seed,
            choice=list(GENDER_ANSWERS),
        ),
    ]
    if "demographics" in sections:
        for dim in dimensions():
            if dim != "gender":
                requests.append(
                    ChatRequest(
                        key=f"{key}#{dim}",
                        messages=_message(story, field_question(dim)),
                        sampling=short,
                        seed=seed,
                        choice=allowed_values(dim),
                    )
                )
    schema = list_schema(sections, max_items)
    if schema is not None:
        requests.append(
            ChatRequest(
                key=f"{key}#lists",
                messages=_message(story, list_question(sections)),
                sampling=sampling,
                seed=seed,
                json_schema=schema,
            )
        )
    return requests


def split_key(part_key: str) -> tuple[str, str]:
    key, _, field = part_key.rpartition("#")
    return key, field


def join_answers(parts: dict[str, str]) -> str:
    """One JSON object from the answers of one story's questions (field -> raw text), in the
    ``one_answer`` design's shape. A list answer that is not JSON is kept as its text under
    ``lists_raw``: the joined object then lacks those fields and does not parse (kept, counted, retried)."""
    data: dict[str, Any] = {}
    for field, text in parts.items():
        text = (text or "").strip()
        if field == "name":
            name = text.strip().strip('."').strip()
            data["name"] = "" if name.upper().startswith(NO_NAME) else name
        elif field == "lists":
            try:
                lists = json.loads(text)
                data.update(lists if isinstance(lists, dict) else {"lists_raw": text})
            except json.JSONDecodeError:
                data["lists_raw"] = text
        else:
            data[field] = text
    return json.dumps(data, ensure_ascii=False)


def prompt_fingerprint(sections: Sequence[str]) -> dict[str, Any]:
    """Everything that shapes this design's answers apart from the story (for the answer key)."""
    return {
        "rule": RULE,
        "gender": GENDER_QUESTION,
        "name": NAME_QUESTION,
        "lists": list_question(sections),
        "fields": {d: field_question(d) for d in FIELD_QUESTIONS} if "demographics" in sections else {},
    }
