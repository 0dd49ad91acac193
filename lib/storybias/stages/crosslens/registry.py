"""The cross-lens measures, each declared once, where the function that computes it is defined (issue #59).

A *part* is a function that reads some of the run's artifacts and gives one or more measures per
model x language cell (StereoTales' two from stage 04's associations, say). It is declared with
:func:`register` next to its definition (``storybias.stages.crosslens.measures``), with the artifacts it
reads and, for each measure it gives, a :class:`MeasureSpec`: its name, its lens, why it is absent from a
cell no part gives it, and why its interval is not kept ("" when it is). Everything else derives from
those registrations, in registration order: :data:`MEASURES`, :data:`LENS_OF`, :data:`LENS_REASONS`,
:data:`INTERVALS`, the table's schema (:func:`crosslens_schema`), the parts ``run_tables`` computes
(:data:`PARTS`) and the stage's inputs (:func:`stage_inputs`). The derived names are updated in place, so
``from ... import MEASURES`` sees a registration made later (a test's toy measure).

(Modelled on lm-evaluation-harness' ``@register_metric``: a thing is declared once, where it is defined.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

import pandas as pd
import pyarrow as pa

from storybias.config.params import CrossLensSettings
from storybias.core import artifacts


class Measure(TypedDict):
    """One lens's measure for one cell: the value, its interval, its n, and why it is missing (or "");
    ``n_tables``: the association tables the cell's language pass tested (assoc_per_1000 only)."""

    value: float
    low: float
    high: float
    n: int
    reason: str
    n_tables: NotRequired[int]


CellMeasures = dict[tuple[str, str], dict[str, Measure]]  # (model, language) -> measure name -> Measure


@dataclass(frozen=True)
class MeasureSpec:
    """One cross-lens measure: ``name`` (its column), ``lens`` (two measures of one lens are two readings of
    the same stories), ``absent`` (why a cell lacks it when no part gives the cell this measure) and
    ``interval`` ("" where its per-cell interval is kept, else why not: NaN bounds and this reason)."""

    name: str
    lens: str
    absent: str
    interval: str = ""


@dataclass(frozen=True)
class LensInputs:
    """What a part reads: the run's artifacts it declared (an empty table where a stage did not write
    one), BiasedTales-ML's ``comparison`` (None: none) and the stage's settings."""

    tables: Mapping[str, pd.DataFrame]
    comparison: str | None
    settings: CrossLensSettings

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self.tables:
            raise KeyError(f"artifact {name!r} is not among the part's declared reads ({', '.join(self.tables)})")
        return self.tables[name]


PartFunction = Callable[[LensInputs], CellMeasures]


@dataclass(frozen=True)
class Part:
    """A registered part: its function's name, the artifacts it reads, the measures it gives."""

    name: str
    reads: tuple[str, ...]
    measures: tuple[MeasureSpec, ...]
    compute: PartFunction


PARTS: dict[str, Part] = {}  # function name -> Part, in registration order
MEASURES: list[str] = []  # every measure, in the table's column order
LENS_OF: dict[str, str] = {}  # measure -> lens
LENS_REASONS: dict[str, str] = {}  # measure -> why a whole lens is absent from a cell
INTERVALS: dict[str, str] = {}  # measure -> "" (interval kept) or why it is not


def _derive() -> None:
    """Rebuild the derived names from PARTS, in place."""
    specs = [spec for part in PARTS.values() for spec in part.measures]
    MEASURES[:] = [spec.name for spec in specs]
    for derived, field in ((LENS_OF, "lens"), (LENS_REASONS, "absent"), (INTERVALS, "interval")):
        derived.clear()
        derived.update({spec.name: getattr(spec, field) for spec in specs})


def register(*, reads: tuple[str, ...], measures: tuple[MeasureSpec, ...]) -> Callable[[PartFunction], PartFunction]:
    """Declare the decorated function a part: it reads ``reads`` (artifact names of
    ``storybias.core.artifacts``) and gives ``measures``. Returns the function unchanged."""

    def decorate(function: PartFunction) -> PartFunction:
        name = function.__name__
        if name in PARTS:
            raise ValueError(f"register: a part named {name!r} is already registered")
        for artifact_name in reads:
            artifacts.artifact(artifact_name)  # raises, naming the registry, for an unknown artifact
        taken = set(MEASURES) & {spec.name for spec in measures}
        if taken or not measures or len({s.name for s in measures}) < len(measures):
            raise ValueError(f"register({name}): measures must be new and distinct (taken: {sorted(taken)})")
        PARTS[name] = Part(name, tuple(reads), tuple(measures), function)
        _derive()
        return function

    return decorate


def unregister(name: str) -> None:
    """Remove the part ``name`` and its measures (a test's toy part)."""
    if PARTS.pop(name, None) is None:
        raise KeyError(f"unregister: no part named {name!r} (registered: {', '.join(PARTS)})")
    _derive()


def part_reads() -> tuple[str, ...]:
    """Every artifact a registered part reads, in registration order, once."""
    return tuple(dict.fromkeys(name for part in PARTS.values() for name in part.reads))


def crosslens_schema() -> pa.Schema:
    """crosslens.parquet's schema, from the registered measures."""
    fields = [("model", pa.string()), ("language", pa.string())]
    for measure in MEASURES:
        fields += [
            (measure, pa.float64()),
            (f"{measure}_low", pa.float64()),
            (f"{measure}_high", pa.float64()),
            (f"n_{measure}", pa.int64()),
            (f"reason_{measure}", pa.string()),
            (f"interval_{measure}", pa.string()),  # "" where the interval is kept, else why it is not
        ]
    return pa.schema([*fields, ("n_tables", pa.int64())])  # association tables tested in the language pass


def upstream(target: str) -> set[str]:
    """The Make targets that ``target`` (a stage's Make target) is built from, directly or not."""
    stage = artifacts.STAGE_BY_TOKEN[artifacts.artifact(target).stage]
    return {name for read in stage.reads for name in (read, *upstream(read))}


def stage_inputs(names: Iterable[str]) -> tuple[str, ...]:
    """The Make targets that must exist before the artifacts ``names`` can be read, one per stage that
    writes them, leaving out a target another one is built from (it exists when that one does)."""
    targets = {artifacts.MAKE_TARGETS[artifacts.artifact(name).stage][0] for name in names}
    implied = set().union(*(upstream(target) for target in targets))
    return tuple(sorted(targets - implied))
