"""Prompt designs: the grid of conditions of each study, and its text in each language.

A design lives in ``params/designs/<design>/``: ``design.yaml`` holds the language-independent
structure (dimensions and their canonical English keys), ``<lang>.yaml`` the text of one language
(a Jinja2 template and, for every key, the words that fill it). Templates are rendered with
StrictUndefined, so a missing word is an error, never an empty slot.

Grid sizes per language (the studies' counts, asserted in tests/test_prompts.py):
stereotales 79 values x 36 scenarios = 2,844; bedtime 3 x 27 x 6 x 2 x 3 = 2,916;
occupations 18 x 3 = 54.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from storybias.core import paths
from storybias.core.io import read_yaml_strict

# ISO 639-1 codes of the union of the three studies' languages.
LANGUAGES: dict[str, str] = {
    "en": "English",
    "fr": "French",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "nl": "Dutch",
    "uk": "Ukrainian",
    "ar": "Arabic",
    "hi": "Hindi",
    "zh": "Chinese",
    "ja": "Japanese",
    "ko": "Korean",
    "ru": "Russian",
    "sw": "Swahili",
}
# The built-in designs; storybias.config.designs.names() adds any other design folder found.
BUILTIN: tuple[str, ...] = ("stereotales", "bedtime", "occupations")
DESIGNS: tuple[str, ...] = BUILTIN

# Condition columns of stories.parquet, per design (null where a design doesn't have them).
CONDITION_COLUMNS: dict[str, tuple[str, ...]] = {
    "stereotales": ("cond_attribute", "cond_value", "cond_scenario_category", "cond_scenario"),
    "bedtime": ("cond_nationality", "cond_religion", "cond_social_class", "cond_parent_role", "cond_child_gender"),
    "occupations": ("cond_occupation", "cond_task", "cond_occupation_gender"),
}
ALL_CONDITION_COLUMNS: tuple[str, ...] = tuple(c for cols in CONDITION_COLUMNS.values() for c in cols)


class DesignError(ValueError):
    """A design or localization file is missing or inconsistent."""


@dataclass(frozen=True)
class Cell:
    """One cell of a design's grid: a prompt before it is put into words."""

    design: str
    prompt_id: str
    conditions: dict[str, str] = field(hash=False)


@cache
def load_design(design: str) -> dict[str, Any]:

    if design not in names():
        raise DesignError(f"unknown design {design!r}; expected one of {', '.join(names())}")
    return read_yaml_strict(design_dir(design) / "design.yaml")


def localization_path(design: str, language: str):

    return design_dir(design) / f"{language}.yaml"


def available_languages(design: str) -> list[str]:
    return [lang for lang in LANGUAGES if localization_path(design, lang).is_file()]


@cache
def load_localization(design: str, language: str) -> dict[str, Any]:
    if language not in LANGUAGES:
        raise DesignError(f"unknown language {language!r}; expected one of {', '.join(LANGUAGES)}")
    path = localization_path(design, language)
    if not path.is_file():
        raise DesignError(f"design {design!r} has no text for language {language!r}: {path} is missing")
    return read_yaml_strict(path)


def stereotales_cells() -> list[Cell]:
    """StereoTales' grid: one cell per attribute value x scenario (designs.py's ``stereotales`` design)."""
    spec = load_design("stereotales")
    cells = []
    for attribute, values in spec["dimensions"].items():
        for value in values:
            for category, scenarios in spec["scenario_categories"].items():
                for scenario in scenarios:
                    cells.append(
                        Cell(
                            "stereotales",
                            f"stereotales/{attribute}={value}/{scenario}",
                            {
                                "cond_attribute": attribute,
                                "cond_value": value,
                                "cond_scenario_category": category,
                                "cond_scenario": scenario,
                            },
                        )
                    )
    return cells


def occupations_cells() -> list[Cell]:
    """Beyond Surface Cues' grid: one cell per occupation x task (designs.py's ``occupations`` design)."""
    spec = load_design("occupations")
    cells = []
    for occupation in spec["dimensions"]["occupation"]:
        for task in spec["dimensions"]["task"]:
            cells.append(
                Cell(
                    "occupations",
                    f"occupations/{occupation}/{task}",
                    {
                        "cond_occupation": occupation,
                        "cond_task": task,
                        "cond_occupation_gender": spec["occupation_gender"][occupation],
                    },
                )
            )
    return cells


def sample_cells(
    cells: list[Cell], n: int | None, seed: int, restrict: dict[str, list[str]] | None = None
) -> list[Cell]:
    """A seeded sample of ``n`` cells (all when ``n`` is None), after keeping only the cells whose
    conditions are in ``restrict`` (``{"attribute": ["gender"]}`` keeps cond_attribute == gender).

    The sample depends only on the design's grid, ``n``, ``seed`` and ``restrict``, not on the
    language or model, so every language gets the same cells: a parallel corpus.
    """
    if restrict:
        for key, allowed in restrict.items():
            cells = [c for c in cells if c.conditions.get(f"cond_{key}") in set(allowed)]
    if n is None or n >= len(cells):
        return list(cells)
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(len(cells)), n))
    return [cells[i] for i in chosen]


_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)


@cache
def jinja_template(source: str) -> jinja2.Template:
    """A prompt template compiled once (strict: an undefined variable is an error)."""
    return _JINJA.from_string(source)


def explicit_labels(language: str) -> dict[str, str]:
    """Canonical explicit-task label -> the word shown in ``language`` (e.g. ``woman -> femme``)."""
    return dict(load_localization("occupations", language)["labels"])


def story_id(design: str, language: str, model: str, prompt_id: str, sample: int) -> str:
    """Stable identifier of one story: a hash of what defines it, independent of run and order."""
    key = f"{design}|{language}|{model}|{prompt_id}|{sample}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def request_seed(base_seed: int, sid: str) -> int:
    """Per-request sampling seed: the run's base seed plus a stable offset derived from the story id.

    One seed for every request would make identical prompts produce identical stories; an offset
    from the story id (rather than a position in a list) keeps a story's seed when the grid or the
    sample size changes.
    """
    return (base_seed + int(sid[:8], 16)) % (2**31 - 1)


def render_stereotales(cell: Cell, language: str) -> str:
    """The StereoTales prompt of ``cell`` in ``language``: its value and scenario in the localized template."""
    loc, c = load_localization(cell.design, language), cell.conditions
    return jinja_template(loc["template"]).render(
        value=loc["values"][c["cond_attribute"]][c["cond_value"]], scenario=loc["scenarios"][c["cond_scenario"]]
    )


def render_occupations(cell: Cell, language: str) -> str:
    """The occupations prompt of ``cell`` in ``language``: its task's template, occupation and labels."""
    loc, c = load_localization(cell.design, language), cell.conditions
    return jinja_template(loc["templates"][c["cond_task"]]).render(
        occupation=loc["values"]["occupation"][c["cond_occupation"]], labels=list(loc["labels"].values())
    )


def designs_dirs() -> list[Path]:
    """Where designs are looked for: params/designs/, then each folder of $STORYBIAS_DESIGNS."""
    extra = [paths.resolve(p) for p in os.environ.get("STORYBIAS_DESIGNS", "").split(os.pathsep) if p]
    return [paths.designs_dir(), *extra]


def design_dir(name: str) -> Path:
    for folder in designs_dirs():
        if (folder / name / "design.yaml").is_file():
            return folder / name
    return paths.designs_dir() / name  # (missing: the caller reports it)


def names() -> tuple[str, ...]:
    """Every design: the built-in ones, then any other design folder found, sorted."""
    found = {
        d.name
        for folder in designs_dirs()
        if folder.is_dir()
        for d in folder.iterdir()
        if (d / "design.yaml").is_file()
    }
    return BUILTIN + tuple(sorted(found - set(BUILTIN)))
