"""What each of the three lenses needs from a run's stories, read from its planned stories before any work.

``make check-params`` prints, after stage 04's power table, the lenses a profile's size cannot feed:

- the association lens (stage 04) drops a prompted value with fewer than 10 known answers from a table:
  the planned stories per model x prompted value (pooled pass) and per model x language x prompted value
  (per-language pass), times ``associations.power_known_share``, say which rows will fall short;
- the narrative lens (stage 05) flags a model x language whose smaller group of a comparison has fewer
  than ``metrics.min_stories`` stories;
- the probe (stage 06) skips a cell whose female or male stories lie in fewer groups than
  ``probes.n_splits`` (a group never straddles two folds) or number fewer than ``probes.min_per_class``.

The probe's groups are formed here, for stage 06 and for this check alike (:func:`probe_groups`): model x
occupation for Feng et al.'s occupations (their grouping), model x prompt cell otherwise. A stereotales story
without a scenario (an imported table, or the release's additional_en variants) has a prompt cell no finer than
its prompted value, so every story of one value would form one group: such stories are grouped by model x
the prompt they answered, and where there is no prompt text each story is its own group (the folds are then
stratified by label only, and stories of one prompt may sit on both sides of a fold).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from storybias.config.params import Params

IMPLICIT_TASKS = ("story", "news")  # the explicit task (sentence completion) has no narrative to probe
# how stage 06 grouped a story for its folds (the manifest's notes count each)
BY_OCCUPATION = "model x occupation"
BY_PROMPT_CELL = "model x prompt cell"
BY_PROMPT_TEXT = "model x prompt text (no scenario)"
BY_STORY = "one story per group (no scenario, no prompt text)"
# a stereotales probe restricted to gender-prompted stories: the prompted value that carries each label
GENDER_LABEL_VALUES = {"female": "woman", "male": "man"}


def genre_of(design: str, task: Any) -> str | None:
    """The genre of a story: its design for stereotales and bedtime; for occupations the task (story or
    news); None for the explicit task, which has no narrative."""
    if design == "occupations":
        return task if isinstance(task, str) and task in IMPLICIT_TASKS else None
    return design


def _column(stories: pd.DataFrame, name: str) -> pd.Series:
    return stories[name] if name in stories else pd.Series(None, index=stories.index, dtype=object)


def probe_groups(stories: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(group key, grouping) of every story of ``stories`` (columns story_id, design, model, prompt_id and,
    where present, cond_occupation, cond_scenario, prompt): see the module docstring."""
    model = stories["model"].astype(str)
    prompt = _column(stories, "prompt")
    has_prompt = prompt.notna() & prompt.astype(str).str.strip().ne("")
    occupations = stories["design"].eq("occupations")
    coarse = stories["design"].eq("stereotales") & _column(stories, "cond_scenario").isna()
    occupation = _column(stories, "cond_occupation").astype(object).where(lambda s: s.notna(), "")
    conditions = [occupations, coarse & has_prompt, coarse]
    kinds = np.select(conditions, [BY_OCCUPATION, BY_PROMPT_TEXT, BY_STORY], default=BY_PROMPT_CELL)
    keys = np.select(
        conditions,
        [
            model + "|" + occupation.astype(str),
            model + "|" + prompt.astype(str),
            "story|" + stories["story_id"].astype(str),
        ],
        default=model + "|" + stories["prompt_id"].astype(str),
    )
    return keys.astype(object), kinds.astype(object)


def grouping_note(frame: pd.DataFrame) -> str:
    """One line for stage 06's notes: how many probed stories each grouping covers."""
    counts = frame["grouping"].value_counts()
    parts = ", ".join(f"{kind}: {int(n):,} stories" for kind, n in counts.items())
    return f"probe folds keep each group whole; groups: {parts}" if parts else "no story to group for the probes"


# --- check-params: which lens the planned stories cannot feed ---------------------------------------


def _short(sizes: pd.Series, least: float, what: str, key: str, unit: str = "stories") -> str | None:
    """ "<n> of <m> <what> have fewer than <least> <unit> (<key>; fewest <x>)", or None when none has."""
    short = sizes[sizes < least]
    if short.empty:
        return None
    return f"{len(short):,} of {len(sizes):,} {what} have fewer than {least:g} {unit} ({key}; fewest {short.min():g})"


def association_shortfalls(stories: pd.DataFrame, known_share: float, min_known: int) -> list[str]:
    """The association lens' rows (model x prompted value, pooled and per language) whose known answers,
    expected as planned stories x ``known_share``, fall under ``min_known``."""
    prompted = stories[stories["design"].eq("stereotales") & _column(stories, "cond_value").notna()]
    if prompted.empty:
        return []
    lines = []
    for scope, by in (("pooled pass", []), ("per-language pass", ["language"])):
        known = np.floor(prompted.groupby(["model", *by, "cond_attribute", "cond_value"]).size() * known_share)
        what = f"rows (model x {'language x ' if by else ''}prompted value)"
        line = _short(known, min_known, what, f"planned stories x known share {known_share:g}", "known answers")
        if line is not None:
            lines.append(f"association lens (stage 04), {scope}: {line}")
    return lines


def narrative_shortfalls(params: Params, stories: pd.DataFrame) -> list[str]:
    """Per comparison of ``metrics.comparisons`` whose design is planned: the model x language cells whose
    smaller group has fewer than ``metrics.min_stories`` stories."""
    lines = []
    for comparison in params.metrics.comparisons:
        sub = stories[stories["design"].eq(comparison.design)]
        if sub.empty:
            continue
        for key, value in comparison.where.items():
            sub = sub[_column(sub, f"cond_{key}").eq(value)]
        column = _column(sub, f"cond_{comparison.condition}")
        cells = sub.groupby(["model", "language"]).size().index
        counts = sub.assign(_g=column).groupby(["model", "language", "_g"]).size()
        smaller = pd.Series(
            [min(counts.get((*cell, g), 0) for g in (comparison.group_m, comparison.group_f)) for cell in cells],
            index=cells,
            dtype=float,
        )
        line = _short(smaller, params.metrics.min_stories, "model x language cells", "metrics.min_stories")
        if line is not None:
            lines.append(f"narrative lens (stage 05), {comparison.name}: the smaller group of {line}")
    return lines


def _probe_stories(params: Params, stories: pd.DataFrame) -> pd.DataFrame:
    """The planned stories stage 06 would probe, with their genre, group and expected label: a
    gender-prompted stereotales story carries its prompted gender (labels are known only after
    extraction: any other story has none yet, and its cell is counted whole)."""
    attribute = params.probes.stereotales_attribute
    frame = stories.assign(genre=[genre_of(d, t) for d, t in zip(stories["design"], _column(stories, "cond_task"))])
    frame = frame[frame["genre"].notna()]
    if attribute is not None:
        frame = frame[frame["design"].ne("stereotales") | _column(frame, "cond_attribute").eq(attribute)]
    keys, _ = probe_groups(frame)
    label = pd.Series(None, index=frame.index, dtype=object)
    if attribute == "gender":
        by_value = {value: gender for gender, value in GENDER_LABEL_VALUES.items()}
        label = label.where(frame["genre"].ne("stereotales"), _column(frame, "cond_value").map(by_value))
    return frame.assign(group=keys, label=label)


def _cell_sizes(part: pd.DataFrame, by: list[str]) -> tuple[pd.Series, pd.Series]:
    """(groups, stories) per cell ``by`` of one genre, per expected label when the genre has labels
    (a label with no story counts 0)."""
    if not part["label"].notna().any():
        return part.groupby(by)["group"].nunique(), part.groupby(by).size()
    labelled = part[part["label"].notna()]
    cells = labelled.groupby(by).size().index
    full = pd.MultiIndex.from_tuples(
        [(*(c if isinstance(c, tuple) else (c,)), lab) for c in cells for lab in GENDER_LABEL_VALUES],
        names=[*by, "label"],
    )
    groups = labelled.groupby([*by, "label"])["group"].nunique().reindex(full, fill_value=0)
    return groups, labelled.groupby([*by, "label"]).size().reindex(full, fill_value=0)


def probe_shortfalls(params: Params, stories: pd.DataFrame) -> list[str]:
    """The probe's cells (language x genre, and model x language for the cross-lens genre) whose stories of
    one label lie in fewer than ``probes.n_splits`` groups or number fewer than ``probes.min_per_class``."""
    settings = params.probes
    frame = _probe_stories(params, stories)
    lines = []
    for scope, by in (("", ["language"]), ("per-model refit (cross-lens table), ", ["model", "language"])):
        for genre, part in frame.groupby("genre", sort=True):
            if by[0] == "model" and genre != settings.per_model_genre:
                continue
            groups, sizes = _cell_sizes(part, by)
            what = f"{genre} cells ({' x '.join(groups.index.names)})"
            for line in (
                _short(groups, settings.n_splits, what, "probes.n_splits", "groups"),
                _short(sizes, settings.min_per_class, what, "probes.min_per_class"),
            ):
                if line is not None:
                    lines.append(f"probe (stage 06), {scope}{line}")
    return lines


def lens_shortfalls(params: Params, stories: pd.DataFrame, min_known: int) -> list[str]:
    """Every lens the planned ``stories`` cannot feed, one line each (see the module docstring)."""
    if stories.empty:
        return []
    share = params.associations.power_known_share
    return [
        *association_shortfalls(stories, share, min_known),
        *narrative_shortfalls(params, stories),
        *probe_shortfalls(params, stories),
    ]


def format_shortfalls(lines: list[str]) -> str:
    """The check-params paragraph: the lenses this profile's size cannot feed, or that every one is fed."""
    if not lines:
        return "lenses: the planned stories are enough for every lens's minimum sizes (expected, before extraction)"
    head = "lenses this profile's size cannot feed (expected from the planned stories, before extraction):"
    return "\n".join([head, *(f"  {line}" for line in lines)])
