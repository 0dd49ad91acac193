"""Stage 08's plumbing: the run's artifacts read in one call, statistics quoted into text, and the ``Gallery``
that saves, shows and indexes the figures (``figures.json``). The figures themselves are declared in
``storybias.stages.figures.registry`` (:data:`FIGURES`: stable file stems in notebook order)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from storybias.core import artifacts
from storybias.core.io import write_json_atomic
from storybias.stages.figures.registry import FIGURE_READS, FIGURES
from storybias.stages.figures.style import DPI, is_missing, save_figure

# --- notebook 08: artifacts in, figures + index out -----------------------------------------------

# What notebook 08 reads, from what each figure declares (registry.FigureSpec.reads): the tables, and the
# manifests whose values it draws (stage 04's human agreement, stage 06's human validation).
MANIFEST_NAMES: tuple[str, ...] = tuple(n for n in FIGURE_READS if artifacts.artifact(n).pattern.endswith(".json"))
ARTIFACT_NAMES: tuple[str, ...] = tuple(n for n in FIGURE_READS if n not in MANIFEST_NAMES)


class Artifacts(dict):
    """The run's tables by name, and its manifests (:data:`MANIFEST_NAMES`) in ``manifests``; a missing
    file is an empty table (an empty dict) plus a note saying which stage writes it (the figure then
    says "no data")."""

    def __init__(
        self, tables: dict[str, pd.DataFrame], notes: list[str], manifests: dict[str, dict[str, Any]] | None = None
    ):
        super().__init__(tables)
        self.notes = notes
        self.manifests: dict[str, dict[str, Any]] = dict(manifests or {})

    def __missing__(self, name: str) -> pd.DataFrame:
        raise KeyError(f"artifact {name!r} was not read: add it to the figure's reads (registry.FigureSpec)")

    def only(self, names: Iterable[str]) -> Artifacts:
        """The tables and manifests ``names`` alone (a figure's declared reads), with every note: a figure
        that reads anything else raises ``KeyError`` naming it."""
        wanted = list(names)
        tables = {name: self[name] for name in wanted if name in self}
        return Artifacts(tables, self.notes, {name: self.manifests[name] for name in wanted if name in self.manifests})

    def manifest_table(self, manifest: str, *keys: str) -> pd.DataFrame:
        """A table a manifest holds as a list of rows, under ``keys`` (e.g. ``manifest_probes``,
        ``human_validation``, ``validation_markers``); empty where a key is missing or None (a manifest
        that was not read raises ``KeyError``)."""
        if manifest not in self.manifests:
            raise KeyError(f"manifest {manifest!r} was not read: add it to the figure's reads (registry.FigureSpec)")
        value: Any = self.manifests[manifest]
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        return pd.DataFrame(value) if isinstance(value, list) and value else pd.DataFrame()


def _missing(path: Path, name: str) -> str:
    stage = artifacts.artifact(name).stage
    return f"{path} is missing: its figures will say 'no data' (stage '{stage}' writes it)"


def load_artifacts(run_name: str) -> Artifacts:

    tables, notes, manifests = {}, [], {}
    for name in ARTIFACT_NAMES:
        path = artifacts.path(run_name, name)
        if path.is_file():
            tables[name] = pd.read_parquet(path)
        else:
            tables[name] = pd.DataFrame()
            notes.append(_missing(path, name))
    for name in MANIFEST_NAMES:
        path = artifacts.path(run_name, name)
        if path.is_file():
            manifests[name] = json.loads(path.read_text(encoding="utf-8"))
        else:
            manifests[name] = {}
            notes.append(_missing(path, name))
    return Artifacts(tables, notes, manifests)


def quote_stats(template: str, stats: Mapping[str, Any]) -> str:
    """Fill ``template`` ("{mean_vsr:.1%}") with ``stats``; a missing or NaN value prints as "n/a"
    (an empty figure's statistics) instead of raising. ``{stats}`` prints every statistic."""

    class _Value:
        def __init__(self, value: Any):
            self.value = value

        def __format__(self, spec: str) -> str:
            if is_missing(self.value):
                return "n/a"
            try:
                return format(self.value, spec)
            except (TypeError, ValueError):
                return str(self.value)

    class _Stats(dict):
        def __missing__(self, key: str) -> _Value:
            return _Value(None)

    values = _Stats({k: _Value(v) for k, v in stats.items()})
    values["stats"] = _Value(
        ", ".join(
            f"{k} = {'n/a' if is_missing(v) else (round(v, 3) if isinstance(v, float) else v)}"
            for k, v in stats.items()
        )
    )
    return template.format_map(values)


def _plain(value: Any) -> Any:
    """JSON-safe statistic: numpy scalars to Python, NaN to None."""
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


class Gallery:
    """Stage 08's figures: ``save`` writes one (PNG + PDF) with its quoted statistic, ``display`` shows a
    saved one in the notebook (the PNG, then the quote), ``show`` does both; ``write_index`` writes
    ``figures.json`` (files, statistics, parameters) last, atomically: the Make target of the stage."""

    def __init__(self, out_dir: Path, dpi: int = DPI):
        self.out_dir = Path(out_dir)
        self.dpi = dpi
        self.records: list[dict[str, Any]] = []

    def save(self, stem: str, fig: Figure, stats: Mapping[str, Any], *, quote: str = "{stats}") -> dict[str, Any]:
        """Save ``fig`` as ``stem`` (PNG + PDF) and keep its record: files, quoted text, statistics and
        whether it says "no data"."""
        files = save_figure(fig, self.out_dir, stem, dpi=self.dpi)
        no_data = bool(stats.get("no_data")) or not stats  # the reason, set by no_data_figure
        record = {
            "stem": stem,
            "files": [p.name for p in files],
            "quote": quote_stats(quote, stats),
            "no_data": bool(no_data),
            "stats": {k: _plain(v) for k, v in stats.items()},
        }
        self.records = [r for r in self.records if r["stem"] != stem] + [record]
        return record

    def display(self, stem: str, display_width: int = 720) -> dict[str, Any]:
        """Show the saved figure ``stem`` (its PNG) and print its quote; returns its record."""
        # only inside a notebook, where IPython runs
        from IPython.display import Image, display

        by_stem = {r["stem"]: r for r in self.records}
        if stem not in by_stem:
            raise KeyError(f"figure {stem!r} was not drawn; drawn: {', '.join(by_stem) or 'none'}")
        record = by_stem[stem]
        display(Image(filename=str(self.out_dir / record["files"][0]), width=display_width))
        print(record["quote"])
        return record

    def show(
        self, stem: str, fig: Figure, stats: Mapping[str, Any], *, quote: str = "{stats}", display_width: int = 720
    ) -> dict[str, Any]:
        """``save`` then ``display``."""
        self.save(stem, fig, stats, quote=quote)
        return self.display(stem, display_width)

    def index(self, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """figures.json's content: each figure's record with its description, and the parameters."""
        described = dict(FIGURES)
        return {
            "figures": [{**r, "description": described.get(r["stem"], "")} for r in self.records],
            "params": dict(params or {}),
        }

    def write_index(self, params: Mapping[str, Any] | None = None) -> Path:
        return write_json_atomic(self.index(params), self.out_dir / "figures.json")

    def values(self) -> dict[str, Any]:
        """The values notebook 08 records: how many figures, how many say "no data", their stems."""
        return {
            "n_figures": len(self.records),
            "n_no_data": sum(r["no_data"] for r in self.records),
            "stems": [r["stem"] for r in self.records],
        }

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            [{"figure": r["stem"], "files": ", ".join(r["files"]), "shows": r["quote"]} for r in self.records]
        )
