"""``make bench-import``: a paper-scale published corpus on a laptop.

Builds (once, under data/bench/import-corpus/) a synthetic corpus shaped as StereoTales' release
(``storybias.tools.synthetic_corpus``: the exporter's layout, column types and ids shared by the models):
about 650,000 stories of about 2,300 characters, 23 models answering the same prompts (1% of the answers
of every model but the first missing), the release's ten language folders and additional_en (15 stories
per prompt), every base attribute and scenario. Then times what a reviewer runs
on the real release, each step in a fresh process as ``make paper`` runs each stage in its own notebook
kernel: stage 01's import, stage 02's checks, stage 03's mapping of the published extractions, and stage
04's association tests (the global and the per-language pass, with ``associations.fisher: sequential`` as
``make bench-associations`` times them; the reference method's cost per table is measured there). Reports
wall time and peak memory (maxrss of the step's process and of its largest worker); the target is <= 15
minutes and <= 4 GB on 2 cores. Written to data/bench/bench_import.json. Timings are reported, not
asserted by tests.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from storybias.config import designs, params
from storybias.config.corpus import ADDITIONAL_FOLDER
from storybias.core import paths
from storybias.core.io import write_json_atomic
from storybias.evidence.stereotales_taxonomy import reference_taxonomy
from storybias.stages import extract, generate
from storybias.stages import filter as filter_stage
from storybias.stages.associations import read_observations
from storybias.tools.bench_associations import timed_passes
from storybias.tools.synthetic_corpus import write_synthetic_corpus

FOLDERS = ("en", "ar", "du", "es", "fr", "hi", "it", "pt", "uk", "zh", ADDITIONAL_FOLDER)
TARGET_SECONDS, TARGET_GB = 15 * 60, 4.0
RUN_NAME = "bench-import"


def _peak_gb() -> dict[str, float]:
    return {
        "self_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, 2),
        "largest_child_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2, 2),
    }


ADDITIONAL_OUTPUTS = 15  # stories per additional_en prompt, as in the release
SKIPPED_SHARE = 0.01  # answers missing for every model but the first


def _corpus(root: Path, n_stories: int, n_models: int, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The synthetic corpus, built unless a previous bench left one of the same spec."""
    spec = {
        "n_stories": n_stories,
        "n_models": n_models,
        "seed": seed,
        "folders": list(FOLDERS),
        "layout": "exporter: ids shared by the models",
    }
    marker = root / "corpus.json"
    if marker.is_file() and json.loads(marker.read_text()).get("spec") == spec:
        return json.loads(marker.read_text())
    started = time.time()
    shutil.rmtree(root, ignore_errors=True)
    models = tuple(f"provider-{i}/model-{i}" for i in range(n_models))
    per_folder = -(-n_stories // (n_models * len(FOLDERS)))  # stories per model x folder
    files = [
        *write_synthetic_corpus(
            root,
            models=models,
            folders=FOLDERS[:-1],
            samples_per_folder=per_folder,
            attributes=tuple(reference_taxonomy()["dimensions"]),
            seed=seed,
            skipped_share=SKIPPED_SHARE,
            sentences=26,
        ),
        *write_synthetic_corpus(
            root,
            models=models,
            folders=(ADDITIONAL_FOLDER,),
            samples_per_folder=-(-per_folder // ADDITIONAL_OUTPUTS),
            additional_outputs=ADDITIONAL_OUTPUTS,
            attributes=tuple(reference_taxonomy()["dimensions"]),
            seed=seed + 1,
            skipped_share=SKIPPED_SHARE,
            sentences=26,
        ),
    ]
    built = {"spec": spec, "n_released": sum(pq.read_metadata(f).num_rows for f in files)}
    write_json_atomic(built, marker)  # last: a build killed midway is redone, never half reused
    log(f"bench-import: built {built['n_released']:,} synthetic stories in {time.time() - started:.0f} s")
    return built


def _step(name: str, profile: Path, seed: int) -> dict[str, Any]:
    """One step of the bench, run in its own process (``_timed``): its seconds, its peaks and its counts."""
    p = params.load(profile)
    quiet = lambda message: None  # noqa: E731
    started = time.time()
    out: dict[str, Any] = {}
    if name == STEPS[0]:
        generate.run(p, progress=False, log=quiet)
    elif name == STEPS[1]:
        filter_stage.run(p, progress=False)
    elif name == STEPS[2]:
        out["n_imported"] = int(len(extract.run(p, progress=False, log=quiet)["extractions"]))
    else:
        data, _ = read_observations(RUN_NAME, list(designs.dimensions()))
        out["passes"], _ = timed_passes(data, seed, p.associations.max_resamples, None, quiet, fisher="sequential")
    return {"seconds": round(time.time() - started, 1), **_peak_gb(), **out}


STEPS = ("01 import", "02 filter", "03 published extractions", "04 association tests (both passes, sequential)")


def _timed(name: str, profile: Path, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """``_step`` in a fresh process (spawned, so it inherits none of this one's memory)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        result = pool.submit(_step, name, profile, seed).result()
    log(f"  {name}: {result['seconds']:.1f} s; peak {max(result['self_gb'], result['largest_child_gb']):.2f} GB")
    return result


def bench_import(
    n_stories: int = 650_000, n_models: int = 23, seed: int = 42, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Import + checks + published mapping + both association passes on a synthetic release; see the module."""
    bench = paths.data_root() / "bench"
    root = bench / "import-corpus"
    built = _corpus(root, n_stories, n_models, seed, log)
    profile = bench / f"{RUN_NAME}.yaml"
    corpus = {"format": "stereotales", "path": str(root), "additional_en": True}  # every released story
    profile.write_text(yaml.safe_dump({"run_name": RUN_NAME, "corpus": corpus}))
    params.load(profile)  # a bad profile stops here, before any step
    steps = {name: _timed(name, profile, seed, log) for name in STEPS}
    total = sum(s["seconds"] for s in steps.values())
    peak = max(max(s["self_gb"], s["largest_child_gb"]) for s in steps.values())
    result = {
        **built["spec"],
        "n_released": built["n_released"],
        "n_imported": steps[STEPS[2]].pop("n_imported"),
        "steps": steps,
        "passes": steps[STEPS[3]].pop("passes"),
        "total_seconds": round(total, 1),
        "peak_gb": peak,
        "targets": {"seconds": TARGET_SECONDS, "gb": TARGET_GB},
        "meets_target": total <= TARGET_SECONDS and peak <= TARGET_GB,
    }
    log(f"bench-import: {total:.0f} s in all (target {TARGET_SECONDS} s), peak {peak:.2f} GB (target {TARGET_GB})")
    write_json_atomic(result, bench / "bench_import.json")
    return result
