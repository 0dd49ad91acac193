"""The design registry: every prompt design and what the code needs from it, in one place.

A design is a folder ``params/designs/<name>/`` (``design.yaml``: its dimensions and canonical values;
``<lang>.yaml``: the prompt template and localised values). What the code needs from each is here:

- ``cells``: its prompt builder (the grid of cells, each with its ``cond_<name>`` conditions);
- ``render``: how one cell becomes a prompt in one language;
- ``conditions``: its condition columns in stories.parquet;
- ``exclude``: stage 02's default rule (the checks that make its story unusable), when the profile's
  ``filter.exclude`` does not name it (the three built-in designs' defaults live in
  ``params.ExcludeRules``, the studies' rules);
- ``sections``: stage 03's extraction sections, when ``extract.sections`` does not name it;
- ``lens``: which analysis reads its stories (``associations``: StereoTales' stage 04;
  ``distributions``: BiasedTales-ML's metrics of stage 05; ``occupations``: Feng et al.'s M_S / M_B
  of stage 05; ``none``: stages 01-03 only).

The three built-in designs (:data:`BUILTIN`) have their own builders. Any other folder found in
``params/designs/`` or in a folder of ``$STORYBIAS_DESIGNS`` (os.pathsep-separated, searched after
``params/designs/``) is a **grid** design: its ``design.yaml`` gives ``dimensions`` (each a list of
canonical values; the grid is their full product in the order written), and a ``code:`` block with
``exclude``, ``sections`` and ``lens`` (defaults: ``[empty]``, ``[narrative]``, ``none``); each
``<lang>.yaml`` gives ``template`` (Jinja) and ``values: {dimension: {value: <label or mapping>}}``.
Its condition columns are ``cond_<dimension>`` (appended to stories.parquet after the built-in ones
when they are new). Nothing else in the code needs to know its name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2

from storybias.config import prompts
from storybias.config.prompts import (
    ALL_CONDITION_COLUMNS,
    BUILTIN,
    Cell,
    DesignError,
    design_dir,
    jinja_template,
    load_design,
    load_localization,
    localization_path,
    names,
)

if TYPE_CHECKING:
    from storybias.config.prompts import Cell

LENSES = ("associations", "distributions", "occupations", "none")


@dataclass(frozen=True)
class Design:
    name: str
    cells: Callable[[], list[Cell]]
    render: Callable[[Cell, str], str]
    conditions: tuple[str, ...]
    exclude: tuple[str, ...] | None  # None: params.ExcludeRules' default for the design
    sections: tuple[str, ...]
    lens: str
    source: str = ""  # the study it follows


# --- grid designs: every combination of the dimensions' values ---------------------------------


def _grid_cells(name: str, order: tuple[str, ...] | None = None) -> list[Cell]:

    dims = load_design(name)["dimensions"]
    order = order or tuple(dims)
    return [
        Cell(name, f"{name}/" + "/".join(combo), {f"cond_{d}": v for d, v in zip(order, combo)})
        for combo in itertools.product(*(dims[d] for d in order))
    ]


def _grid_render(cell: Cell, language: str) -> str:

    loc = load_localization(cell.design, language)
    dims = [c.removeprefix("cond_") for c in cell.conditions]
    return jinja_template(loc["template"]).render(**{d: loc["values"][d][cell.conditions[f"cond_{d}"]] for d in dims})


_BEDTIME_ORDER = ("parent_role", "nationality", "religion", "social_class", "child_gender")


def _builtin(name: str) -> Design:

    if name == "stereotales":
        return Design(
            name,
            prompts.stereotales_cells,
            prompts.render_stereotales,
            prompts.CONDITION_COLUMNS[name],
            None,
            ("demographics", "narrative", "markers"),
            "associations",
            "StereoTales (Le Jeune et al.), arXiv:2605.10442",
        )
    if name == "bedtime":
        return Design(
            name,
            lambda: _grid_cells("bedtime", _BEDTIME_ORDER),
            _grid_render,
            prompts.CONDITION_COLUMNS[name],
            None,
            ("demographics", "narrative", "markers"),
            "distributions",
            "BiasedTales-ML (Ouyang, Luo, Xiao, Zhu), arXiv:2604.17008",
        )
    return Design(
        name,
        prompts.occupations_cells,
        prompts.render_occupations,
        prompts.CONDITION_COLUMNS[name],
        None,
        ("demographics", "narrative", "markers"),
        "occupations",
        "Beyond Surface Cues (Feng et al.), arXiv:2608.23026",
    )


def get(name: str) -> Design:
    """The registry entry of design ``name`` (built-in, or a grid design found on disk)."""

    if name in BUILTIN:
        return _builtin(name)
    if name not in names():
        raise DesignError(f"unknown design {name!r}; expected one of {', '.join(names())}")
    spec = load_design(name)
    code: dict[str, Any] = spec.get("code") or {}
    lens = code.get("lens", "none")
    if lens not in LENSES:
        raise DesignError(f"{design_dir(name)}/design.yaml: code.lens {lens!r} is not one of {', '.join(LENSES)}")
    return Design(
        name,
        lambda: _grid_cells(name),
        _grid_render,
        tuple(f"cond_{d}" for d in spec["dimensions"]),
        tuple(code.get("exclude", ["empty"])),
        tuple(code.get("sections", ["narrative"])),
        lens,
        str(spec.get("source", "")),
    )


def all_condition_columns() -> tuple[str, ...]:
    """Condition columns of every design: the built-in ones in their fixed order, then new ones."""

    extra = [c for d in names()[len(BUILTIN) :] for c in get(d).conditions if c not in ALL_CONDITION_COLUMNS]
    return ALL_CONDITION_COLUMNS + tuple(dict.fromkeys(extra))


def with_lens(lens: str, enabled: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """The designs (of ``enabled``, default every one) whose stories an analysis with ``lens`` reads."""
    registered = names()
    return [d for d in (enabled if enabled is not None else registered) if d in registered and get(d).lens == lens]


def dimensions() -> dict[str, list[str]]:
    return dict(load_design("stereotales")["dimensions"])


def allowed_values(dimension: str) -> list[str]:
    spec = load_design("stereotales")
    extra = ["other"] if dimension in spec["extraction_other"] else []
    return list(spec["dimensions"][dimension]) + extra + ["unknown"]


def extraction_rules() -> list[str]:
    """StereoTales' extraction rules (the stereotales design's ``extraction_rules``), as prompt lines."""
    return [str(rule) for rule in load_design("stereotales").get("extraction_rules", [])]


def extraction_defaults() -> dict[str, str]:
    """The value each rule gives a field the story says nothing about (``extraction_defaults``)."""
    defaults = dict(load_design("stereotales").get("extraction_defaults", {}))
    for dimension, value in defaults.items():
        if value not in dimensions().get(dimension, []):
            raise DesignError(
                f"{design_dir('stereotales')}/design.yaml: extraction_defaults.{dimension}: {value!r} is not a value"
            )
    return defaults


def demo_columns() -> list[str]:
    return [f"demo_{d}" for d in dimensions()]


def map_dimensions(settings=None) -> list[str]:
    """The fields step 2 answers: ``extract.map_fields`` when set (in the taxonomy's order), else every
    demographic dimension but gender (step 1's, from the story)."""
    chosen = getattr(settings, "map_fields", None)
    return [d for d in dimensions() if d != "gender" and (chosen is None or d in chosen)]


def design_cells(design: str) -> list[Cell]:
    """Every cell of a design's grid, in a fixed order (the design's builder: storybias.config.designs)."""

    return get(design).cells()


def render_prompt(cell: Cell, language: str) -> str:
    """The user message for one cell in one language."""

    render = get(cell.design).render
    try:
        text = render(cell, language)
    except (KeyError, jinja2.UndefinedError) as exc:
        raise DesignError(
            f"{localization_path(cell.design, language)}: cannot render {cell.prompt_id}: missing {exc}"
        ) from exc
    return text.strip()
