"""Stage 03's gold set: the hand-written stories with their true labels (params/extract/gold/<lang>.yaml),
a seeded sample of them, and the field-level scores of an extractor's answers against the labels,
with the targets issue #15 sets (``GOLD_TARGETS``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from storybias.config.designs import demo_columns, dimensions
from storybias.core import paths
from storybias.core.io import read_yaml_strict
from storybias.stages.extract.parse import normalize_lemma
from storybias.stages.extract.schema import GENDER_MAP


def load_gold(languages: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The hand-written gold set (params/extract/gold/<lang>.yaml): stories with their true labels."""
    items = []
    for path in sorted((paths.repo_root() / "params" / "extract" / "gold").glob("*.yaml")):
        for item in read_yaml_strict(path):
            if languages is None or item["language"] in languages:
                items.append(item)
    return items


def gold_truth(item: dict[str, Any], defaults: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An item's true labels as extractions.parquet's columns. ``defaults`` (the design's
    ``extraction_defaults``, with ``extract.design_rules``): a field the story says nothing about is
    true at its default under StereoTales' rules (health is good unless the story says otherwise)."""
    p = item["protagonist"]
    gender, fine, _ = GENDER_MAP[
        {
            "woman": "woman",
            "man": "man",
            "non_binary": "non_binary",
            "multiple_central": "several_people",
            "no_central": "no_person",
            "unstated": "unclear",
        }[p["gender_fine"]]
    ]
    truth = {"protagonist_gender": gender, "protagonist_gender_fine": fine, "protagonist_name": p.get("name")}
    truth.update({f"demo_{d}": p[d] for d in dimensions()})
    for dimension, value in (defaults or {}).items():
        if truth[f"demo_{dimension}"] == "unknown":
            truth[f"demo_{dimension}"] = value
    truth["adjectives_en"] = [normalize_lemma(a) for a in item.get("adjectives_en", [])]
    return truth


def score_gold(truths: list[dict[str, Any]], predictions: list[dict[str, Any]]) -> pd.DataFrame:
    """Field-level accuracy of predictions against the gold labels.

    For every scalar field: accuracy over all items, and accuracy on the items whose true value is
    known (not ``unknown``) — a model that answers ``unknown`` everywhere scores well on the first and
    zero on the second. Gender also gets the majority-class baseline. Adjectives: micro precision,
    recall and F1 of the English lemma sets.
    """
    rows = []
    fields = ["protagonist_gender", "protagonist_gender_fine", *demo_columns()]
    for field in fields:
        truth = [t[field] for t in truths]
        pred = [p[field] for p in predictions]
        known = [i for i, v in enumerate(truth) if v != "unknown"]
        baseline_value = Counter(truth).most_common(1)[0][0]
        rows.append(
            {
                "field": field,
                "n": len(truth),
                "accuracy": float(np.mean([a == b for a, b in zip(truth, pred)])),
                "n_known": len(known),
                "accuracy_known": float(np.mean([truth[i] == pred[i] for i in known])) if known else float("nan"),
                "majority_baseline": float(np.mean([v == baseline_value for v in truth])),
                "majority_value": baseline_value,
            }
        )
    names = [(t.get("protagonist_name") or "", p.get("protagonist_name") or "") for t, p in zip(truths, predictions)]
    rows.append(
        {
            "field": "protagonist_name",
            "n": len(names),
            "accuracy": float(np.mean([a.strip() == b.strip() for a, b in names])),
            "n_known": sum(bool(a) for a, _ in names),
            "accuracy_known": float(np.mean([a.strip() == b.strip() for a, b in names if a]))
            if any(a for a, _ in names)
            else float("nan"),
            "majority_baseline": float("nan"),
            "majority_value": None,
        }
    )
    tp = sum(len(set(t["adjectives_en"]) & set(p["adjectives_en"])) for t, p in zip(truths, predictions))
    n_pred = sum(len(set(p["adjectives_en"])) for p in predictions)
    n_true = sum(len(set(t["adjectives_en"])) for t in truths)
    precision = tp / n_pred if n_pred else float("nan")
    recall = tp / n_true if n_true else float("nan")
    f1 = 2 * precision * recall / (precision + recall) if n_pred and n_true and (precision + recall) else float("nan")
    rows.append(
        {
            "field": "adjectives_en (precision/recall/F1)",
            "n": len(truths),
            "accuracy": f1,
            "n_known": n_true,
            "accuracy_known": recall,
            "majority_baseline": precision,
            "majority_value": None,
        }
    )
    return pd.DataFrame(rows)


GOLD_TARGETS = {
    "macro_accuracy_known": 0.75,
    "answered_known": 0.8,
    "unknown_kept": 0.8,
    "gender_accuracy": 0.95,
    "adjective_f1": 0.6,
}


def gold_targets(truths: list[dict[str, Any]], predictions: list[dict[str, Any]]) -> dict[str, float]:
    """The gold-set numbers issue #15 sets targets for (``GOLD_TARGETS``), over the demographic fields
    other than gender (gender is scored as ``protagonist_gender``):

    - ``macro_accuracy_known``: mean over fields of the accuracy on the items whose truth is known;
    - ``answered_known``: share of (item, field) pairs with a known truth answered with a value, not ``unknown``;
    - ``unknown_kept``: share of pairs whose truth is ``unknown`` answered ``unknown`` (no guessing:
      a guess from stereotypes would plant the associations stage 04 measures);
    - ``gender_accuracy``: accuracy of ``protagonist_gender`` on every item;
    - ``adjective_f1``: micro F1 of the English adjective lemmas (``score_gold``)."""
    fields = [c for c in demo_columns() if c != "demo_gender"]
    known = [(t[f], p[f]) for t, p in zip(truths, predictions) for f in fields if t[f] != "unknown"]
    unknown = [p[f] for t, p in zip(truths, predictions) for f in fields if t[f] == "unknown"]
    per_field = [
        np.mean([p[f] == t[f] for t, p in zip(truths, predictions) if t[f] != "unknown"])
        for f in fields
        if any(t[f] != "unknown" for t in truths)
    ]
    scores = score_gold(truths, predictions).set_index("field")
    nan = float("nan")
    return {
        "macro_accuracy_known": float(np.mean(per_field)) if per_field else nan,
        "answered_known": float(np.mean([p != "unknown" for _, p in known])) if known else nan,
        "unknown_kept": float(np.mean([p == "unknown" for p in unknown])) if unknown else nan,
        "gender_accuracy": float(scores.at["protagonist_gender", "accuracy"]),
        "adjective_f1": float(scores.at["adjectives_en (precision/recall/F1)", "accuracy"]),
    }


def gold_table(
    items: list[dict[str, Any]], predictions: list[dict[str, Any]], defaults: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """``gold_targets`` per language and for all items, with the targets (one row each); ``defaults``:
    as for :func:`gold_truth`."""
    rows = []
    groups = {
        lang: [i for i, it in enumerate(items) if it["language"] == lang]
        for lang in sorted({it["language"] for it in items})
    }
    for name, index in [*groups.items(), ("all", list(range(len(items))))]:
        truths = [gold_truth(items[i], defaults) for i in index]
        rows.append({"language": name, "n_items": len(index), **gold_targets(truths, [predictions[i] for i in index])})
    table = pd.DataFrame(rows)
    rows_target = {"language": "target", "n_items": None, **GOLD_TARGETS}
    return pd.concat([table, pd.DataFrame([rows_target])], ignore_index=True)


def choose_gold_items(n_items: int | None, seed: int) -> list[dict[str, Any]]:
    """A seeded sample of the gold set, round-robin over languages (all items when n_items is None)."""
    items = load_gold()
    if n_items is None or n_items >= len(items):
        return items
    by_lang: dict[str, list] = {}
    for item in items:
        by_lang.setdefault(item["language"], []).append(item)
    rng = random.Random(seed)
    for group in by_lang.values():
        rng.shuffle(group)
    chosen: list[dict[str, Any]] = []
    while len(chosen) < n_items:
        for group in by_lang.values():
            if group and len(chosen) < n_items:
                chosen.append(group.pop())
    return chosen


GOLD_SECTIONS = ("demographics", "narrative")
