"""Two-step extraction (``extract.prompt_design: two_step``, the default): quote the facts, then map them.

Step 1 is the one-answer request opened by a ``facts`` key: the extractor copies the story's own phrases
about the protagonist ("35 years old; young father of two; lived in a rundown apartment") before
filling the fields. With the small embedded model this first step is reliable, but the fields of
the same answer often stay ``unknown`` although the quoted facts settle them (issue #15: facts were
quoted for 103 of 108 default stories, ages and incomes among them, and the fields left unknown).

Step 2 asks the same model one short question per story: the quoted facts alone (not the story), the
demographic fields with their value lists and labels (the age bands' year ranges among them; the fields
of ``extract.map_fields`` when set, and every library caller passes the settings so that prompt, schema,
parsing and merge agree on them), the
worked examples' facts and answers as earlier turns. Its prefix is the same for every story, so the
engine's prefix cache computes it once, and each request is short.

Merge: a demographic field that step 1 left ``unknown`` takes step 2's value; a field step 1
answered keeps it. Step 2 never answers the protagonist's gender or name (step 1 reads those from
the whole story), and an answer that does not parse leaves step 1's fields as they were (it is
kept in ``extraction_raw.parquet`` and counted in the manifest).

Step 2's answers go through the run's one cache like every answer (storybias.engines.cache: the request
holds the facts text, step 2's prompt and schema), so a killed run resumes both steps and an answer
is never asked twice. This is storybias' design, not a
study's: StereoTales extracts with one answer per story from much larger models.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import pandas as pd

from storybias.config.designs import allowed_values, extraction_rules, map_dimensions
from storybias.config.llamacpp import LLAMA_CPP
from storybias.config.models import load_tokenizer
from storybias.config.params import ExtractionSettings, Params
from storybias.engines import ChatRequest
from storybias.engines.context import tokenizer_counter
from storybias.evidence.stereotales_taxonomy import reference_taxonomy
from storybias.stages.extract.parse import parse_answer
from storybias.stages.extract.prompt import decoding, load_worked_examples
from storybias.stages.extract.schema import design_sections

MAP_SUFFIX = "_map"

MAP_RULES = (
    "These phrases come from a story and describe its protagonist. For each field, choose the value the "
    "phrases state or make unmistakable: a stated age picks its age band (thirty-five is adult, 30-44); a job "
    'picks its professional field; "her husband" means married; a son or daughter of theirs means '
    "with_children; rent means renter; money troubles or food assistance mean low income. Answer "
    '"unknown" when the phrases say nothing about the field; never guess from a name, a job or a '
    "stereotype. Answer with a JSON object."
)


@cache
def value_labels() -> dict[str, dict[str, str]]:
    """StereoTales' label of each canonical value (``reference.yaml``), e.g. senior -> 'senior (65+)'."""
    return {
        dim: {key: spec["value"] for key, spec in values.items()}
        for dim, values in reference_taxonomy()["dimensions"].items()
    }


def _option(dimension: str, key: str) -> str:
    """``key`` with the taxonomy's label when it says more than the key (``adult (30-44)``)."""
    label = value_labels().get(dimension, {}).get(key, "")
    return f"{key} = {label}" if label and label.replace(" ", "_") != key else key


def map_prompt(facts: str, settings: ExtractionSettings | None = None) -> str:
    """Step 2's instructions: the fields with their options, then the facts (last, so the prefix is shared)."""
    lines = [MAP_RULES, "", "Fields (one value each):"]
    for dim in map_dimensions(settings):
        lines.append(f'  "{dim}": ' + " | ".join(_option(dim, k) for k in allowed_values(dim)))
    if settings is None or settings.design_rules:
        lines += ["Rules for these fields:", *[f"  - {rule}" for rule in extraction_rules()]]
    lines += ["", "Phrases about the protagonist:", facts.strip()]
    return "\n".join(lines)


def map_schema(settings: ExtractionSettings | None = None) -> dict[str, Any]:
    props = {d: {"type": "string", "enum": allowed_values(d)} for d in map_dimensions(settings)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def map_messages(facts: str, settings: ExtractionSettings) -> list[dict[str, str]]:
    """The chat of one step-2 request: the worked examples' facts and answers as earlier turns, then
    the instructions with this story's facts."""
    messages: list[dict[str, str]] = []
    for example in load_worked_examples():
        answer = example["answer"]
        messages.append({"role": "user", "content": map_prompt(answer["facts"], settings)})
        messages.append(
            {
                "role": "assistant",
                "content": json.dumps({d: answer[d] for d in map_dimensions(settings)}, ensure_ascii=False),
            }
        )
    return [*messages, {"role": "user", "content": map_prompt(facts, settings)}]


def _json_object(raw: str | None) -> dict[str, Any] | None:
    """``raw`` parsed as a JSON object, or None (not JSON, or not an object)."""
    try:
        data = json.loads(raw) if raw is not None else None
    except (json.JSONDecodeError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def facts_of(raw: str) -> str:
    """The ``facts`` a step-1 answer quoted ('' when it quoted none or does not parse)."""
    facts = (_json_object(raw) or {}).get("facts", "")
    return facts.strip() if isinstance(facts, str) else ""


def map_jobs(
    answers: pd.DataFrame, spec, settings: ExtractionSettings, sections_of: Mapping[str, Sequence[str]]
) -> list[dict[str, Any]]:
    """Step-2 requests owed for the final step-1 ``answers`` of one extractor: each answer of a story
    asked for demographics that parsed and quoted facts. A dict per job: request_key (the map
    answer's: story|extractor|<pass>_map), answer_key (the step-1 answer's request_key), story_id,
    pass, facts."""
    jobs = []
    for a in answers.to_dict("records"):  # "pass" is a keyword: no itertuples attribute
        sections = sections_of.get(a["story_id"], ())
        if a["extractor"] != spec.name or "demographics" not in sections or a["pass"].endswith(MAP_SUFFIX):
            continue
        facts = facts_of(a["raw"])
        if not facts or not parse_answer(a["raw"], sections).ok:
            continue
        pass_name = a["pass"] + MAP_SUFFIX
        jobs.append(
            {
                "request_key": f"{a['story_id']}|{a['extractor']}|{pass_name}",
                "answer_key": a["request_key"],
                "story_id": a["story_id"],
                "pass": pass_name,
                "facts": facts,
            }
        )
    return jobs


def parse_map(raw: str, settings: ExtractionSettings | None = None) -> dict[str, str] | None:
    """A step-2 answer's fields (those of ``map_dimensions(settings)``), or None when it does not parse,
    lacks one of them or names a value outside a field's list."""
    data = _json_object(raw)
    if data is None:
        return None
    out = {}
    for dim in map_dimensions(settings):
        if data.get(dim) not in allowed_values(dim):
            return None
        out[dim] = data[dim]
    return out


def merge(step1_raw: str, step2_raw: str | None, settings: ExtractionSettings | None = None) -> str:
    """Step 1's answer with the fields it left ``unknown`` filled from step 2. The joined JSON lists the
    filled fields under ``facts_mapped``; it is step 1's text unchanged when step 1 does not parse as a
    JSON object, and step 1's fields with an empty ``facts_mapped`` when step 2 is missing or does not parse."""
    data = _json_object(step1_raw)
    if data is None:
        return step1_raw
    mapped = parse_map(step2_raw, settings) if step2_raw is not None else None
    filled = []
    for dim, value in (mapped or {}).items():
        if data.get(dim) == "unknown" and value != "unknown":
            data[dim] = value
            filled.append(dim)
    data["facts_mapped"] = filled
    return json.dumps(data, ensure_ascii=False)


def resolve(answers: pd.DataFrame, settings: ExtractionSettings | None = None) -> pd.DataFrame:
    """The final answers with each step-1 answer's raw text replaced by its merge with the step-2 answer
    made from it, and the step-2 rows dropped: what ``assemble`` and the agreement table read. Answers
    of the one-answer and per-field designs have no step-2 row and pass through unchanged."""
    if answers.empty or "pass" not in answers:
        return answers
    is_map = answers["pass"].str.endswith(MAP_SUFFIX)
    if not is_map.any():
        return answers
    by_source = {
        (r["story_id"], r["extractor"], r["pass"][: -len(MAP_SUFFIX)]): r["raw"]
        for r in answers[is_map].to_dict("records")
    }
    out = answers[~is_map].copy()
    out["raw"] = [
        merge(r["raw"], by_source[(r["story_id"], r["extractor"], r["pass"])], settings)
        if (r["story_id"], r["extractor"], r["pass"]) in by_source
        else r["raw"]
        for r in out.to_dict("records")
    ]
    return out.reset_index(drop=True)


def map_requests(jobs: Sequence[dict[str, Any]], settings: ExtractionSettings, seed: int) -> list:
    """The step-2 chat requests of ``jobs`` (``map_jobs``): temperature 0, step 2's schema."""
    return [
        ChatRequest(
            key=job["request_key"],
            messages=map_messages(job["facts"], settings),
            sampling=decoding(settings, 0.0),
            seed=seed,
            json_schema=map_schema(settings),
        )
        for job in jobs
    ]


def merge_in_memory(
    engine, texts: dict[str, str], sections: Sequence[str], settings: ExtractionSettings
) -> dict[str, str]:
    """Step 2 for answers that are not stored (the gold-set evaluation): map the facts of each step-1
    answer in ``texts`` (key -> raw) with a started engine and return the merged answers."""
    jobs = [
        {"request_key": key, "facts": facts_of(raw)}
        for key, raw in texts.items()
        if "demographics" in sections and facts_of(raw) and parse_answer(raw, sections).ok
    ]
    mapped = {r.key: r.text for r in engine.stream(map_requests(jobs, settings, settings.seed))}
    return {key: merge(raw, mapped[key], settings) if key in mapped else raw for key, raw in texts.items()}


def summary(raw: pd.DataFrame, resolved: pd.DataFrame) -> dict[str, Any]:
    """For the manifest, from the final answers ``raw`` (one per request, ``extract.final_answers``) and
    their ``resolve``d form: step-1 answers, how many quoted facts, step-2 answers and their parse
    failures, and how many fields step 2 filled (in all and per field)."""
    if raw.empty:
        return {
            "n_step1": 0,
            "n_with_facts": 0,
            "n_step2": 0,
            "n_step2_parse_failed": 0,
            "n_fields_filled": 0,
            "filled_per_field": {},
        }
    is_map = raw["pass"].str.endswith(MAP_SUFFIX)
    step1 = raw[~is_map]
    filled: Counter = Counter()
    for text in resolved["raw"]:
        filled.update((_json_object(text) or {}).get("facts_mapped", []))
    return {
        "n_step1": int(len(step1)),
        "n_with_facts": int(sum(bool(facts_of(t)) for t in step1["raw"])),
        "n_step2": int(is_map.sum()),
        "n_step2_parse_failed": int((~raw.loc[is_map, "parse_ok"].astype(bool)).sum()),
        "n_fields_filled": int(sum(filled.values())),
        "filled_per_field": dict(sorted(filled.items())),
    }


# --- step 2's context, known before step 1 answers (issue #60) ----------------------------------------


def map_context_need(settings: ExtractionSettings, count: Callable[[ChatRequest], int]) -> tuple[int, int]:
    """Step 2's largest context need before any step-1 answer exists: ``(fixed, need)``, where ``fixed`` is
    the prompt without facts (instructions, fields, worked examples; ``count`` the tokenizer's count of a
    request) and ``need`` adds the longest facts a step-1 answer can quote (the whole answer:
    ``extract.max_tokens`` tokens) and step 2's own ``max_tokens``."""
    empty = map_requests([{"request_key": "step 2 without facts", "facts": ""}], settings, settings.seed)[0]
    fixed = count(empty)
    return fixed, fixed + 2 * settings.max_tokens


def llama_cpp_map_problems(params: Params) -> list[str]:
    """What check-params and stage 03 say, before step 1, when a run served by llama.cpp (whose context per
    request the profile sets: ``llama_cpp.ctx_size / parallel``) could send a step-2 prompt that does not fit
    it: one line per extractor naming the keys. Step 2's prompts are built from step 1's answers, so the
    request check before sending sees them only after step 1's work (on the smoke profile, 3,458 prompt
    tokens + 700 refused by a 4,096-token slot). Empty for other servers and for one-answer extraction."""
    engine, settings = params.generation.engine, params.extract
    asks_facts = any("demographics" in design_sections(settings, d) for d in params.enabled_designs())
    if engine.shared_server_kind != LLAMA_CPP or settings.prompt_design != "two_step" or not asks_facts:
        return []
    slot, sizes = engine.llama_cpp.slot_context(), engine.llama_cpp
    problems = []
    for spec in settings.models:
        if spec.source != "embedded":  # llama.cpp serves the embedded GGUFs only (config.llamacpp says so)
            continue
        fixed, need = map_context_need(settings, tokenizer_counter(load_tokenizer(spec), spec.chat_template_kwargs))
        if need > slot:
            problems.append(
                f"extract.prompt_design two_step, extractor {spec.name!r}: step 2's prompts (built from step 1's "
                f"answers) can need {need} tokens ({fixed} of instructions, fields and worked examples, up to "
                f"{settings.max_tokens} of step 1's quoted facts and {settings.max_tokens} to answer: "
                f"extract.max_tokens), more than llama-server's context per request, "
                f"generation.engine.llama_cpp.ctx_size / parallel = {sizes.ctx_size} / {sizes.parallel} = {slot}; "
                f"raise ctx_size to at least {need * sizes.parallel} (or lower extract.max_tokens)"
            )
    return problems
