#!/usr/bin/env python
"""Prompt-reading and decoding rates of one llama-server slot on stage 03's kind of work, with and without
its JSON-schema grammar: the numbers behind docs/benchmarks.md's note on long prompts (issue #60).

    .venv/bin/python scripts/llama-server-rates.py [PARAMS] [--repack] [--tokens 64]

Starts llama-server (``make llama-server``; ``$STORYBIAS_LLAMA_SERVER`` for another build) on PARAMS' first
extractor's GGUF with one slot and 8,192 tokens, sends each request at temperature 0 for exactly
``--tokens`` answer tokens (or fewer at a grammar's end), and prints llama-server's own timings: prompt
tokens read and their rate, tokens decoded and their rate. The second request of a pair repeats the first
prompt, which the slot has cached, so its rate is decoding alone. Run it on a quiet machine: llama.cpp's
threads wait for each other when another process shares the cores.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import httpx

from storybias.config import params
from storybias.engines.llamacpp import start_llama_server
from storybias.stages.extract import facts
from storybias.stages.extract.prompt import extraction_request

STORY = "Maria, a 35-year-old nurse, lived with her two sons in a rented flat in Lyon. " * 4
FACTS = "35 years old; a nurse; rents a flat; two sons"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("params", nargs="?", default="params/smoke.yaml")
    parser.add_argument("--repack", action="store_true", help="llama_cpp.repack: true (no --no-repack)")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    p = params.load(args.params)
    spec, settings = p.extract.models[0], p.extract
    sizes = p.generation.engine.llama_cpp.model_copy(update={"parallel": 1, "ctx_size": 8192, "repack": args.repack})
    engine = p.generation.engine.model_copy(
        update={"shared_server_kind": "llama.cpp", "cpu_top_k_first": False, "llama_cpp": sizes}
    )
    step1 = extraction_request("step 1", STORY, ("demographics",), settings, 0.0, 1)
    step2 = facts.map_requests([{"request_key": "step 2", "facts": FACTS}], settings, 1)[0]
    free = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
    cases = [
        ("free text", free, None),
        ("step 1 prompt, its schema", step1.messages, step1.json_schema),
        ("step 1 prompt, no schema", step1.messages, None),
        ("step 2 prompt, its schema", step2.messages, step2.json_schema),
    ]
    with tempfile.TemporaryDirectory() as folder:
        server = start_llama_server(spec, engine, 42, "rates", log_dir=Path(folder), log=print)
        try:
            entry = server.entry()
            print(f"{'request':<36} {'prompt read':>12} {'tokens/s':>9} {'decoded':>8} {'tokens/s':>9}")
            for name, messages, schema in cases:
                for attempt in ("", " (cached)"):
                    t = ask(entry, spec.name, messages, schema, args.tokens)
                    print(
                        f"{name + attempt:<36} {t['prompt_n']:>12} {t['prompt_per_second']:>9.1f} "
                        f"{t['predicted_n']:>8} {t['predicted_per_second']:>9.1f}"
                    )
        finally:
            server.stop(grace=5)


def ask(entry: dict[str, Any], model: str, messages: list, schema: dict | None, tokens: int) -> dict[str, Any]:
    """One chat completion; llama-server's ``timings`` of it."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0.0}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    headers = {"Authorization": f"Bearer {entry['api_key']}"}
    response = httpx.post(f"{entry['base_url']}/chat/completions", json=body, headers=headers, timeout=900)
    response.raise_for_status()
    return response.json()["timings"]


if __name__ == "__main__":
    main()
