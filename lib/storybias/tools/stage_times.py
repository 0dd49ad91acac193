"""stage_times (`make stage-times`): how long each stage of a run took, and on what (issue #43).

Reads what a run already keeps, so the table can be rebuilt for any finished run:

- each executed notebook in ``reports/<run>/`` (papermill's ``metadata.papermill``: ``start_time``,
  ``end_time``, ``duration``), one row per stage, in the order the stages started;
- the stages' manifests in ``data/<run>/`` for what the time was spent on: stage 01's engine start-up,
  stories and tokens/s per model; stage 03's answers, tokens and stories/s per model; stage 04's test and
  power times; stage 06's embedding time;
- the machine stages 01 and 03 ran their models on (their manifests' ``machine``,
  storybias.core.machine), printed above the table: the same stages take very different times on two
  2-core machines of this project's kind (docs/benchmarks.md).

The README's per-stage table of `make paper` is this command's output on the default run. Set-up
(``make venv model``) happens before any notebook, so it is not in these files: time it apart.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storybias.core.artifacts import STAGE_BY_TOKEN, STAGES, Stage, artifact
from storybias.core.machine import summary as machine_summary


@dataclass(frozen=True)
class StageTime:
    """One executed notebook: its name, when papermill started and ended it, and what its manifest says
    the time went to (empty where the stage records nothing more)."""

    notebook: str
    started: datetime.datetime
    ended: datetime.datetime
    seconds: float
    detail: str


class StageTimesError(RuntimeError):
    """A run with no executed notebook, or a report papermill did not finish."""


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _count(value: Any) -> str:
    """An int with thousands separators, a float to one decimal (seconds, rates), anything else as is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def generation_detail(manifest: dict[str, Any]) -> str:
    """Per model: engine start-up, stories written in this run, generation time and tokens/s."""
    parts = []
    for m in manifest.get("models", []):
        stories = _count(m.get("n_generated_this_run"))
        text = f"{m['model']}: start {_count(m.get('startup_seconds'))} s, {stories} stories"
        if m.get("n_reused"):
            text += f" (+{_count(m['n_reused'])} reused)"
        text += f" in {_count(m.get('generation_seconds'))} s"
        if m.get("tokens_per_second") is not None:
            text += f" at {_count(m['tokens_per_second'])} tokens/s"
        if m.get("n_errors_this_run"):
            text += f", {_count(m['n_errors_this_run'])} failed requests"
        parts.append(text)
    return "; ".join(parts)


def extraction_detail(manifest: dict[str, Any]) -> str:
    """Per extractor: answers (first pass and two-step second pass), time, stories/s and tokens; then the
    answers that did not parse (kept as data, stage 03's ``parse_ok``)."""
    parts = []
    for model, t in (manifest.get("timings") or {}).items():
        text = f"{model}: {_count(t.get('n_answers'))} answers"
        if t.get("n_step2_answers"):
            text += f" + {_count(t['n_step2_answers'])} step-2"
        text += f" in {_count(t.get('extraction_seconds'))} s"
        if t.get("stories_per_second") is not None:
            text += f" ({t['stories_per_second']:.3f} stories/s)"
        if t.get("output_tokens") is not None:
            text += f", {_count(t['output_tokens'])} output / {_count(t.get('prompt_tokens'))} prompt tokens"
        if t.get("n_from_cache"):
            text += f", {_count(t['n_from_cache'])} from the cache"
        parts.append(text)
    if "n_parse_failed" in manifest:
        parts.append(f"{_count(manifest['n_parse_failed'])} answers did not parse")
    return "; ".join(parts)


def _seconds_listed(timings: dict[str, Any], keys: tuple[str, ...]) -> str:
    """'<name> <seconds> s' for each ``<name>_seconds`` key of ``keys`` that ``timings`` holds."""
    return ", ".join(f"{k.removesuffix('_seconds')} {_count(timings[k])} s" for k in keys if timings.get(k) is not None)


def associations_detail(manifest: dict[str, Any]) -> str:
    return _seconds_listed(manifest, ("test_seconds", "power_seconds"))


def probes_detail(manifest: dict[str, Any]) -> str:
    return _seconds_listed(manifest.get("timings") or {}, ("embedding_seconds", "umap_seconds", "total_seconds"))


# stage token (storybias.core.artifacts.STAGES) -> what to say of its manifest
DETAILS = {
    "generate": generation_detail,
    "extract": extraction_detail,
    "associations": associations_detail,
    "probes": probes_detail,
}

# the stages that run local models, and so record their machine (stage 04's judge may be an API)
MACHINE_STAGES = ("generate", "extract")


def _manifest_file(stage: Stage) -> str:
    return artifact(stage.manifest).pattern


def _report_name(stage: Stage) -> str:
    return Path(stage.notebook).stem


def machine_lines(data: Path) -> list[str]:
    """'<stage> ran on: <machine>' for each model-running stage whose manifest exists in ``data``; a
    manifest written before the record says so, and one where no model ran (every answer cached, or a
    corpus imported with its published extractions) says that."""
    lines = []
    for token in MACHINE_STAGES:
        stage = _report_name(STAGE_BY_TOKEN[token])
        manifest = _read_json(data / _manifest_file(STAGE_BY_TOKEN[token]))
        if not manifest:
            continue
        if "machine" not in manifest:
            lines.append(f"{stage}: its manifest does not record the machine (written before the record)")
        elif manifest["machine"] is None:
            lines.append(f"{stage}: no model ran (all came from the run's cache or a published corpus)")
        else:
            lines.append(f"{stage} ran on: {machine_summary(manifest['machine'])}")
    return lines


def _papermill_times(report: Path) -> tuple[datetime.datetime, datetime.datetime, float]:
    meta = json.loads(report.read_text(encoding="utf-8")).get("metadata", {}).get("papermill", {})
    if not meta.get("start_time") or not meta.get("end_time") or meta.get("duration") is None:
        raise StageTimesError(f"{report}: papermill did not finish this notebook (no start, end or duration)")
    started = datetime.datetime.fromisoformat(meta["start_time"])
    ended = datetime.datetime.fromisoformat(meta["end_time"])
    return started, ended, float(meta["duration"])


def collect(reports: Path, data: Path) -> list[StageTime]:
    """The executed notebook of every registry stage in ``reports`` (``NN_name.ipynb``; papermill's
    work-in-progress ``*.tmp.ipynb`` is not one) with its manifest's detail from ``data``, in the order the
    stages started."""
    rows = []
    for stage in STAGES:
        report = reports / f"{_report_name(stage)}.ipynb"
        if not report.is_file():
            continue
        started, ended, seconds = _papermill_times(report)
        describe = DETAILS.get(stage.token)
        detail = describe(_read_json(data / _manifest_file(stage))) if describe else ""
        rows.append(StageTime(report.stem, started, ended, seconds, detail))
    if not rows:
        raise StageTimesError(f"{reports}: no executed stage notebook (run `make paper` first)")
    return sorted(rows, key=lambda r: r.started)


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def format_table(rows: list[StageTime]) -> str:
    """A Markdown table, one line per stage, then the span from the first start to the last end (the
    stages' wall time, Make's gaps between them included) and the sum of the notebooks' durations."""
    lines = ["| stage | started (UTC) | time | what the time went to |", "|---|---|---|---|"]
    for r in rows:
        started = r.started.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"| {r.notebook} | {started} | {_clock(r.seconds)} | {r.detail} |")
    span = (max(r.ended for r in rows) - min(r.started for r in rows)).total_seconds()
    total = sum(r.seconds for r in rows)
    lines.append(f"| all stages | | {_clock(span)} | first start to last end; the notebooks alone {_clock(total)} |")
    return "\n".join(lines)
