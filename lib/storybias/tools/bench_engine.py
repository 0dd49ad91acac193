"""bench_engine (`make bench-engine`): which vLLM CPU settings the default runs with (issue #43).

Each trial is a fresh process that starts the profile's first model once and times one batch: the
same prompts, seeds and sampling (the profile's, every request generating exactly ``max_tokens``
tokens) under one of four settings, alternated in every repeat so that drift favours none:

- ``compiled``: vLLM's ``enforce_eager`` off (torch.compile); the first compiled trial starts from an
  empty compile cache (a fresh ``VLLM_CACHE_ROOT`` for the sitting), the later ones from a warm one;
- ``eager``: ``enforce_eager`` on;
- ``eager`` with ``tcmalloc+iomp`` preloaded, as vLLM's CPU guide asks: tcmalloc from Debian's
  ``libtcmalloc-minimal4`` and Intel OpenMP from PyPI's ``intel-openmp`` (``.venv/lib/libiomp5.so``).
  A library that is not installed drops this setting with a message (`make venv` installs tcmalloc
  where it may run apt-get: the default profile runs this way, ``generation.engine.cpu_preload``);
- the same with top-k and top-p applied to the k largest logits instead of vLLM's sort of the whole
  vocabulary (``generation.engine.cpu_top_k_first``, storybias.engines.cpu_sampling); column ``sampler``.

The rows have the columns of ``docs/measurements/engine_settings.csv`` and go to
``reports/<run>/bench_engine.csv``; the recorded file is the measurements kept, copied from there.
A process per trial is deliberate: start-up is part of what is measured, and ``LD_PRELOAD`` only acts
on a process that starts with it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storybias.config.checks import cpu_preload_libraries
from storybias.config.params import Params, load
from storybias.core import machine, run_folders
from storybias.core.io import atomic_open
from storybias.engines import Engine, entered_info
from storybias.evidence.recorded import RECORDED_COLUMNS
from storybias.stages.generate import prepare_models
from storybias.tools.bench import bare_chat, bench_rows, fixed_length

COLUMNS = RECORDED_COLUMNS["engine_settings"]  # the rows are copied into the recorded file as they are
SORT, TOP_K_FIRST = "sort", "top-k first"
SETTINGS = (
    ("eager", "none", SORT),
    ("compiled", "none", SORT),
    ("eager", "tcmalloc+iomp", SORT),
    ("eager", "tcmalloc+iomp", TOP_K_FIRST),
)
TRIAL_MARK = "BENCH-ENGINE-TRIAL "


def trial_order(settings: Sequence[tuple[str, str, str]], repeats: int) -> list[tuple[int, str, str, str]]:
    """(repeat, engine, preload, sampler) of every trial: each setting once per repeat, in reverse order in
    every other repeat, so that drift over the sitting favours none."""
    order = []
    for repeat in range(1, repeats + 1):
        order += [(repeat, *s) for s in (settings if repeat % 2 else list(settings)[::-1])]
    return order


def compile_cache_state(engine_kind: str, earlier: Sequence[dict[str, Any]]) -> str:
    """The compile cache a trial starts from: none for eager, empty for the sitting's first compiled
    start (a fresh VLLM_CACHE_ROOT), warm after it."""
    if engine_kind == "eager":
        return "-"
    return "warm" if any(r["engine"] == "compiled" for r in earlier) else "empty"


def trial(params: Params, engine_kind: str, sampler: str, n_prompts: int, max_tokens: int) -> dict[str, float]:
    """One engine start and one timed batch in this process: start-up seconds and output tokens/s."""
    settings = params.generation.engine.model_copy(
        update={"enforce_eager": engine_kind == "eager", "cpu_top_k_first": sampler == TOP_K_FIRST}
    )
    rows = fixed_length(bench_rows(params, n_prompts), max_tokens)
    with Engine(params.generation.models[0], settings, params.generation.seed) as engine:
        startup = entered_info(engine).startup_seconds
        bare_chat(engine, rows[:4])  # warm-up, as bench-generate: first requests pay one-off costs
        seconds, tokens = bare_chat(engine, rows)
    return {"startup_s": round(startup, 1), "tokens_per_s": round(tokens / seconds, 1), "tokens": tokens}


def _run_trial(
    path: str, engine_kind: str, sampler: str, preload: str | None, n_prompts: int, max_tokens: int, cache: str
) -> dict:
    env = dict(os.environ, VLLM_CACHE_ROOT=cache)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    command = [sys.executable, "-m", "storybias.tools.bench_engine", path, "--trial", engine_kind, "--sampler", sampler]
    command += ["--n-prompts", str(n_prompts), "--max-tokens", str(max_tokens)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(TRIAL_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"bench-engine: the {engine_kind} trial failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len(TRIAL_MARK) :])


def bench_engine(path: str, n_prompts: int = 64, max_tokens: int = 128, repeats: int = 2, log=print) -> list[dict]:
    """Every setting once per repeat, alternated; returns the rows and writes reports/<run>/bench_engine.csv."""
    params = load(path)
    prepare_models(params, log=log)
    preload = cpu_preload_libraries()
    settings = [s for s in SETTINGS if s[1] == "none" or preload]
    if preload is None:
        log("bench-engine: tcmalloc (Debian: libtcmalloc-minimal4) or libiomp5 not found: no preload trials")
    seqs = params.generation.engine.max_num_seqs
    ran_on = machine.describe().summary()  # the same settings ran half as fast or less on another CPU
    log(f"bench-engine: on {ran_on}")
    sitting = (
        f"{datetime.date.today()} bench-engine {n_prompts} prompts x {max_tokens} tokens, {seqs} at a time "
        f"({params.run_name}; {ran_on})"
    )
    rows: list[dict[str, Any]] = []
    out = run_folders.claim_reports(params.run_name) / "bench_engine.csv"
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache:
        for repeat, engine_kind, preloaded, sampler in trial_order(settings, repeats):
            state = compile_cache_state(engine_kind, rows)
            library = preload if preloaded != "none" else None
            result = _run_trial(path, engine_kind, sampler, library, n_prompts, max_tokens, cache)
            rows.append(
                {"engine": engine_kind, "preload": preloaded, "sampler": sampler, "compile_cache": state}
                | {"repeat": repeat}
                | {"startup_s": result["startup_s"], "tokens_per_s": result["tokens_per_s"], "sitting": sitting}
            )
            log(
                f"  {engine_kind} ({preloaded}, {sampler}, repeat {repeat}): start-up {result['startup_s']:.1f} s, "
                f"{result['tokens_per_s']:.1f} tokens/s"
            )
            _write(rows, out)  # after every trial: an interrupted sitting keeps what it measured
    log(f"bench-engine: {len(rows)} trials written to {out}")
    return rows


def _write(rows: list[dict[str, Any]], out: Path) -> None:
    """Every row so far, replacing ``out`` whole: a kill mid-write leaves the previous trials' file."""
    with atomic_open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    """The child process of one trial (``--trial``)."""
    parser = argparse.ArgumentParser(prog="python -m storybias.tools.bench_engine")
    parser.add_argument("params")
    parser.add_argument("--trial", choices=("compiled", "eager"), required=True)
    parser.add_argument("--sampler", choices=(SORT, TOP_K_FIRST), default=SORT)
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    result = trial(load(args.params), args.trial, args.sampler, args.n_prompts, args.max_tokens)
    print(TRIAL_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
