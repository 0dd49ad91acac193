"""The one result every stage's ``run()`` returns (:class:`StageResult`), as lm-eval's harness returns one
results object whatever the task: the tables the stage wrote (and a few it shows), its manifest, the named
values its notebook records, its notes, and the files it wrote.

A notebook runs its stage and records its values with one call each::

    result = associations.run(p)
    result.record()      # data/<run>/values/associations.json

and shows ``result["associations_values"]`` and the like (``result[name]`` is a table, or one of the
``details`` a stage adds for its notebook: a dict of settings, a list of per-model records).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from storybias.core import artifacts
from storybias.core.io import record_values


@dataclass
class StageResult:
    """What a stage did: ``tables`` (artifact name, or the name its notebook shows it under -> table),
    ``manifest`` (manifest_<stage>.json as written), ``values`` (the named values its notebook records:
    counts and headline statistics, JSON-ready), ``notes`` (what it left out and why), ``details``
    (anything else its notebook shows) and ``artifacts`` (every registry file of the stage that exists)."""

    stage: str  # the registry token (storybias.core.artifacts.STAGES)
    run_name: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.artifacts:
            self.artifacts = {
                a.name: artifacts.path(self.run_name, a.name)
                for a in artifacts.of_stage(self.stage)
                if artifacts.path(self.run_name, a.name).exists()
            }

    def __getitem__(self, name: str) -> Any:
        """A table, a detail, or one of ``manifest``, ``notes`` and ``values`` by name."""
        if name in self.tables:
            return self.tables[name]
        if name in self.details:
            return self.details[name]
        if name in ("manifest", "notes", "values"):
            return getattr(self, name)
        raise KeyError(f"stage {self.stage} has no table or detail {name!r} (tables: {', '.join(self.tables)})")

    def get(self, name: str, default: Any = None) -> Any:
        """``result[name]``, or ``default`` when the stage has no such table or detail."""
        return self[name] if name in self or name in ("manifest", "notes", "values") else default

    def __contains__(self, name: object) -> bool:
        return name in self.tables or name in self.details

    def __iter__(self) -> Iterator[str]:
        return iter([*self.tables, *self.details])

    def keys(self) -> list[str]:
        """The names ``result[name]`` answers: the tables, then the details."""
        return [*self.tables, *self.details]

    @property
    def notebook(self) -> str:
        """The stem of the stage's notebook (``04_associations``), under which its values are recorded."""
        return Path(artifacts.STAGE_BY_TOKEN[self.stage].notebook).stem

    def record(self) -> dict[str, Any]:
        """Store ``values`` in data/<run>/values/<stage token>.json (merged with what is there): keyed by the
        stage's token, not its notebook's number, so inserting a stage renames no file."""
        return record_values(self.run_name, self.stage, **self.values)
