"""How a request reads in llama.cpp's server dialect (``constraints: llama.cpp``; storybias.engines.openai_endpoint).

llama-server's OpenAI-compatible ``/v1/chat/completions`` copies every body field it does not know as its
own sampling parameter (llama.cpp's ``tools/server``: ``oaicompat_chat_params_parse``, then
``params_from_json_cmpl``), so the vLLM request's meaning is kept with llama.cpp's names:

- a JSON schema: ``response_format: {type: json_schema, json_schema: {schema}}``, which llama.cpp turns into
  a grammar (its ``json-schema-to-grammar``);
- a choice list: a GBNF ``grammar`` whose root is exactly one of the strings, so the answer is the bare
  string, as vLLM's ``choice`` gives (a JSON enum would come back quoted);
- ``top_k`` (0, not vLLM's -1, switches it off), ``repeat_penalty`` over the whole context
  (``repeat_last_n``: the model's ``max_model_len``; llama.cpp's default looks back 64 tokens only),
  ``min_p: 0`` (llama.cpp's default 0.05 would cut tokens vLLM keeps), ``ignore_eos``, the request's
  ``seed`` and ``chat_template_kwargs``.

No counterpart: vLLM's structured-output backend options (``compact_json``) and storybias' CPU logits
processor (``cpu_top_k_first``); check-params refuses both (storybias.config.llamacpp).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from storybias.config.params import Sampling

# GBNF string literals: a backslash, a double quote and control characters need an escape
_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (llama.cpp's grammar format)."""
    return '"' + "".join(_GBNF_ESCAPES.get(ch, ch) for ch in text) + '"'


def choice_grammar(choice: Sequence[str]) -> str:
    """A GBNF grammar whose only sentences are the strings of ``choice``."""
    if not choice:
        raise ValueError("choice: a choice constraint needs at least one string")
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choice)


def sampling_fields(sampling: Sampling, ignore_eos: bool, context_tokens: int) -> dict[str, Any]:
    """llama.cpp's names for the sampling fields the OpenAI body has no place for. The repetition penalty
    looks back over ``context_tokens`` (the request's whole context: llama-server feeds the prompt's tokens
    to the penalty too, as vLLM does; this llama-server refuses -1, the older spelling of that)."""
    fields: dict[str, Any] = {
        "top_k": max(sampling.top_k, 0),
        "min_p": 0.0,
        "repeat_penalty": sampling.repetition_penalty,
        "repeat_last_n": context_tokens,
    }
    if ignore_eos:
        fields["ignore_eos"] = True
    return fields


def constraint_fields(choice: Sequence[str] | None, json_schema: dict[str, Any] | None) -> dict[str, Any]:
    """The answer constraint: a ``grammar`` for a choice, a ``response_format`` for a JSON schema, else none."""
    if choice is not None:
        return {"grammar": choice_grammar(choice)}
    if json_schema is not None:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": json_schema}}}
    return {}
