"""Recorded measurements: tables under ``docs/measurements/`` that decided a design choice.

Some measurements cannot be recomputed from the repository: the extraction designs that lost were
deleted with their code (issue #27), and the gold evaluation of every design takes hours on CPU. Their
numbers are kept as small CSV files, each described in ``docs/measurements/README.md``, and the
notebooks read them through :func:`recorded` instead of typing them into markdown, so a number shown
is a number stored once (``tests/test_measured_numbers.py`` checks that no notebook's markdown types one).
"""

from __future__ import annotations

import pandas as pd

from storybias.core import paths

# Each recorded table and the columns it must have (a renamed column fails here, not in a notebook).
RECORDED_COLUMNS: dict[str, tuple[str, ...]] = {
    "extraction_designs": (
        "design", "accuracy", "answered", "unknown_kept", "gender", "adjective_f1", "relative_speed", "status", "why",
    ),
    "step2_fills": ("field", "fills", "right"),
    "step2_known_share": ("field", "stories", "known_step1", "known_after_step2"),
    "engine_settings": (
        "engine", "preload", "sampler", "compile_cache", "repeat", "startup_s", "tokens_per_s", "sitting"
    ),
    "decode_ceiling": (
        "model", "what", "numerics", "sequences", "prompt_tokens", "gflops", "seconds", "ceiling_tokens_per_s",
        "machine", "sitting",
    ),
    "extraction_rules": (
        "design_rules", "truth", "macro_accuracy_known", "answered_known", "unknown_kept", "macro_known_no_health",
        "answered_no_health", "unknown_kept_no_health", "health_accuracy", "gender", "adjective_f1",
    ),
    "backends_and_weights": (
        "backend", "weights", "sequences", "prompts", "tokens_per_request", "repeat", "startup_s", "tokens_per_s",
        "machine", "sitting",
    ),
    "extraction_prompt_variants": (
        "variant", "settings",
        *(f"{m}{part}" for m in (
            "macro_accuracy_known", "answered_known", "unknown_kept", "gender_accuracy", "adjective_f1"
        ) for part in ("", "_diff", "_low", "_high")),
        "not_worse", "n_stories", "n_parsed", "requests_per_story", "prompt_tokens_per_story",
        "output_tokens_per_story", "seconds", "chosen",
    ),
}  # fmt: skip


def recorded(name: str) -> pd.DataFrame:
    """The recorded table ``docs/measurements/<name>.csv``, its columns checked."""
    if name not in RECORDED_COLUMNS:
        raise KeyError(f"no recorded measurement {name!r}; known: {sorted(RECORDED_COLUMNS)}")
    path = paths.repo_root() / "docs" / "measurements" / f"{name}.csv"
    table = pd.read_csv(path, keep_default_na=False, na_values=[""])
    if tuple(table.columns) != RECORDED_COLUMNS[name]:
        raise ValueError(f"{path}: columns {list(table.columns)}, expected {list(RECORDED_COLUMNS[name])}")
    return table


def step2_fills() -> pd.DataFrame:
    """The recorded step-2 fills (``step2_fills``) with ``share_right``: right / fills per field, to 2 digits."""
    table = recorded("step2_fills")
    return table.assign(share_right=(table["right"] / table["fills"]).round(2))
