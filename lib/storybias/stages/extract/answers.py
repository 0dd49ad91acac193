"""Stage 03's answer format: what each valid story says about its protagonist, extracted by LLM(s) with
structured outputs.

One JSON answer per story and extractor, constrained by a JSON schema with closed value sets (vLLM
structured outputs), temperature 0. The schema, the prompt, the answer parsing, the consensus of
several extractors and the gold-set scoring share this one answer format; each part is a sibling
module, and this module gathers their names (callers import them from here):

- ``storybias.stages.extract.schema``: the value sets, the JSON schema of an answer (sections
  ``protagonist``, ``demographics``, ``narrative``, ``markers``), the sections a design's stories are
  asked, and the Arrow schemas of extractions.parquet and extraction_raw.parquet;
- ``storybias.stages.extract.prompt``: the instructions, the worked examples
  (``params/extract/worked_examples.yaml``, shared by the engine's prefix cache), the chat request of
  one answer, and the story cut to the context budget (cut stories are flagged);
- ``storybias.stages.extract.parse``: a raw answer parsed and checked, as the columns of the table;
- ``storybias.stages.extract.consensus``: the extractors' majority, the extraction table and the
  agreement between extractors or runs;
- ``storybias.stages.extract.gold``: the hand-written gold set and its scores.

The stage's run is ``storybias.stages.extract``; the second step of the two-step design, quoted facts
mapped to the fields, is ``storybias.stages.extract.facts``.

Failures are data: an answer that does not parse is kept with its raw text and ``parse_ok = False``
after bounded retries; a story longer than the context budget is cut and flagged.
"""

from __future__ import annotations

from storybias.config.designs import allowed_values, demo_columns, dimensions
from storybias.stages.extract.consensus import (
    NARRATIVE_LISTS,
    agreement,
    agreement_table,
    assemble,
    combine,
    final_answers,
    majority,
    parse_failure_table,
    refused,
    sample_ids,
)
from storybias.stages.extract.gold import (
    GOLD_SECTIONS,
    GOLD_TARGETS,
    choose_gold_items,
    gold_table,
    gold_targets,
    gold_truth,
    load_gold,
    score_gold,
)
from storybias.stages.extract.parse import (
    ParsedAnswer,
    empty_record,
    explicit_gender,
    normalize_lemma,
    parse_answer,
    to_record,
)
from storybias.stages.extract.prompt import (
    CHARS_PER_TOKEN,
    FACTS_RULE,
    ExtractionJob,
    asks_facts,
    build_prompt,
    decoding,
    example_answer,
    extraction_messages,
    extraction_request,
    fit_story,
    load_worked_examples,
)
from storybias.stages.extract.schema import (
    GENDER_ANSWERS,
    GENDER_MAP,
    MARKER_CATEGORIES,
    RAW_SCHEMA,
    SECTIONS,
    build_schema,
    design_sections,
    extractions_schema,
)

__all__ = [
    # storybias.config.designs (read through this module by tests, tools and notebooks)
    "allowed_values",
    "demo_columns",
    "dimensions",
    # schema
    "GENDER_ANSWERS",
    "GENDER_MAP",
    "MARKER_CATEGORIES",
    "RAW_SCHEMA",
    "SECTIONS",
    "build_schema",
    "design_sections",
    "extractions_schema",
    # prompt
    "CHARS_PER_TOKEN",
    "FACTS_RULE",
    "ExtractionJob",
    "asks_facts",
    "build_prompt",
    "decoding",
    "example_answer",
    "extraction_messages",
    "extraction_request",
    "fit_story",
    "load_worked_examples",
    # parse
    "ParsedAnswer",
    "empty_record",
    "explicit_gender",
    "normalize_lemma",
    "parse_answer",
    "to_record",
    # consensus
    "NARRATIVE_LISTS",
    "agreement",
    "agreement_table",
    "assemble",
    "combine",
    "final_answers",
    "majority",
    "parse_failure_table",
    "refused",
    "sample_ids",
    # gold
    "GOLD_SECTIONS",
    "GOLD_TARGETS",
    "choose_gold_items",
    "gold_table",
    "gold_targets",
    "gold_truth",
    "load_gold",
    "score_gold",
]
