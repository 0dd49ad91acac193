"""Stage 03's prompt variants on the gold set (issue #61): each variant of the ``extract`` settings
evaluated on the same gold stories by one engine of the profile's first extractor, one after another,
and a table of their accuracy measures against the first variant (the baseline, today's prompt) with
paired bootstrap intervals of the differences, and what each costs (prompt and output tokens per story,
wall seconds).

Each variant's per-story predictions and token counts are kept under ``data/gold_variants/<profile>/``
(one parquet and one JSON per variant), so a run that stops resumes at the variant it was on and the
table can be written again without the model (``--table-only``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from storybias.config.designs import extraction_defaults
from storybias.config.params import ExtractionSettings, Params
from storybias.core import paths
from storybias.engines import ChatEngine, ChatRequest, ChatResult, open_engine
from storybias.stages.extract import evaluate_gold
from storybias.stages.extract.gold import GOLD_SECTIONS, choose_gold_items, gold_truth
from storybias.stages.extract.gold_compare import cheapest_not_worse, compare_variants
from storybias.stages.extract.prompt import extraction_request

TABLE_PATH = Path("docs") / "measurements" / "extraction_prompt_variants.csv"


class CountingEngine:
    """A started engine whose ``stream`` also adds up the requests and the prompt and output tokens of
    their results (``reset`` starts a new count)."""

    def __init__(self, engine: ChatEngine) -> None:
        self.engine = engine
        self.info = engine.info
        self.reset()

    def reset(self) -> None:
        self.n_requests = 0
        self.prompt_tokens = 0
        self.output_tokens = 0

    def __enter__(self) -> CountingEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def tokenizer(self) -> Any | None:
        return self.engine.tokenizer()

    def stream(self, requests: Sequence[ChatRequest]) -> Iterator[ChatResult]:
        for result in self.engine.stream(requests):
            self.n_requests += 1
            self.prompt_tokens += result.n_prompt_tokens
            self.output_tokens += result.n_tokens
            yield result


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:key=value,key=value`` (values read as YAML) -> (name, extract overrides)."""
    name, _, rest = text.partition(":")
    if not name.strip():
        raise ValueError(f"--variant {text!r}: a variant needs a name before ':'")
    overrides: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"--variant {text!r}: {part!r} is not key=value")
        overrides[key.strip()] = yaml.safe_load(value)
    return name.strip(), overrides


def variant_settings(base: ExtractionSettings, overrides: dict[str, Any]) -> ExtractionSettings:
    """``base`` with ``overrides`` applied and validated like a profile's extract section."""
    unknown = sorted(set(overrides) - set(ExtractionSettings.model_fields))
    if unknown:
        raise ValueError(f"--variant: unknown extract setting(s) {unknown}")
    return ExtractionSettings.model_validate({**base.model_dump(exclude_unset=True), **overrides})


def results_dir(params: Params) -> Path:
    return paths.repo_root() / "data" / "gold_variants" / params.run_name


def run_variant(engine: CountingEngine, items: list[dict[str, Any]], settings: ExtractionSettings) -> dict[str, Any]:
    """One variant on ``items``: its predictions (one row per story) and what it cost."""
    engine.reset()
    started = time.time()
    gold = evaluate_gold(engine, items, settings)
    return {
        "predictions": gold["predictions"],
        "summary": {
            "n_items": len(items),
            "n_parsed": gold["n_parsed"],
            "n_requests": engine.n_requests,
            "prompt_tokens": engine.prompt_tokens,
            "output_tokens": engine.output_tokens,
            "seconds": round(time.time() - started, 1),
        },
    }


def run_variants(params: Params, variants: list[tuple[str, dict[str, Any]]]) -> None:
    """Evaluate each variant not yet kept under :func:`results_dir` (same settings) with one engine."""
    settings = {name: variant_settings(params.profile.extract, o) for name, o in variants}
    out = results_dir(params)
    out.mkdir(parents=True, exist_ok=True)
    todo = [name for name, s in settings.items() if not _kept(out, name, s)]
    if not todo:
        return
    items = choose_gold_items(None, params.profile.extract.seed)
    for name in todo:  # a setting the prompt cannot meet (more worked examples than the file) fails here
        extraction_request(name, items[0]["text"], GOLD_SECTIONS, settings[name], 0.0, 0)
    spec = params.profile.extract.models[0]
    with open_engine(spec, params.generation.engine, params.profile.extract.seed) as engine:
        counting = CountingEngine(engine)
        for name in todo:
            print(f"gold-variants: {name} ({len(items)} stories)", flush=True)
            result = run_variant(counting, items, settings[name])
            result["predictions"].to_parquet(out / f"{name}.parquet", index=False)
            summary = {**result["summary"], "settings": settings[name].model_dump(mode="json")}
            (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
            print(f"gold-variants: {name} done, {json.dumps(result['summary'])}", flush=True)


def _kept(out: Path, name: str, settings: ExtractionSettings) -> bool:
    summary = out / f"{name}.json"
    if not summary.exists() or not (out / f"{name}.parquet").exists():
        return False
    return json.loads(summary.read_text()).get("settings") == settings.model_dump(mode="json")


def variants_table(params: Params, variants: list[tuple[str, dict[str, Any]]], n_boot: int, seed: int) -> pd.DataFrame:
    """The kept results of ``variants`` (the first is the baseline) as one table (``compare_variants``),
    with each variant's settings and whether it is the one to choose (``cheapest_not_worse``)."""
    names = [name for name, _ in variants]
    out = results_dir(params)
    items = choose_gold_items(None, params.profile.extract.seed)
    predictions, costs = {}, {}
    for name in names:
        summary = json.loads((out / f"{name}.json").read_text())
        defaults = extraction_defaults() if summary["settings"]["design_rules"] else {}
        frame = pd.read_parquet(out / f"{name}.parquet").set_index("id")
        predictions[name] = (
            [gold_truth(it, defaults) for it in items],
            [_record(frame.loc[it["id"]]) for it in items],
        )
        costs[name] = summary
    table = compare_variants(predictions, costs, n_boot=n_boot, seed=seed)
    table.insert(1, "settings", ["; ".join(f"{k}={v}" for k, v in o.items()) for _, o in variants])
    return table.assign(chosen=table["variant"] == cheapest_not_worse(table))


def _record(row: pd.Series) -> dict[str, Any]:
    record = row.to_dict()
    record["adjectives_en"] = list(record.get("adjectives_en") if record.get("adjectives_en") is not None else [])
    return record


def gold_variants(params: Params, variant_args: list[str], table_only: bool, n_boot: int) -> str:
    """``make gold-variants``: run the variants not yet kept (unless ``table_only``), write the table to
    :data:`TABLE_PATH` and return it as text."""
    variants = [parse_variant(v) for v in variant_args]
    if len({name for name, _ in variants}) != len(variants):
        raise ValueError("--variant: a name is given twice")
    if not table_only:
        run_variants(params, variants)
    table = variants_table(params, variants, n_boot, params.profile.extract.seed)
    table.to_csv(paths.repo_root() / TABLE_PATH, index=False)
    return table.to_string(index=False)
