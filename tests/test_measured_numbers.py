"""No notebook's markdown types a measured number of this project (issue #42, item 6).

A measured number is stored once: in the run's artifacts, or for a recorded measurement in
``docs/measurements/*.csv`` (``storybias.evidence.recorded``), and a code cell shows it; the markdown says
what the table shows. The rule checked here: every decimal number ("0.31", "85.6%") and every count "n of m"
("103 of 108") that a notebook's markdown types, outside LaTeX (``$...$``), arXiv ids and section numbers
("Sec. 3.3.1", "§4.1"), is listed in ``ALLOWED`` for that notebook, with its source: a published number of
one of the three studies (a fact of the study, not a measurement of storybias) or a setting of the method (a
threshold, a significance level). Any other number is a measurement typed by hand, whether a CSV holds it
or not: a copy drifts from the stored number, and a number stored nowhere cannot be checked at all (notebook
03 once typed 0.31 / 0.63, stored, beside 0.32 / 0.64, stored nowhere, for the same design).

The list is per notebook, so a published number cannot excuse the same digits measured in another notebook.

A measured number can also be written in words (issue #59: "under half an hour on one and about fifty minutes
on the other", "about half its fills were right"), and a date says when something was measured. So the scan
also finds a number word after an approximation ("about half", "nearly thirty"), a fraction after a comparison
("less than half"), a number word with a unit ("fifty minutes", "half an hour", "three times") and a date
("2026-12-04", "5 December 2026"). A count that defines a rule ("at least two ratings") is not flagged; a
fraction that does ("more than half of the ratings") goes in ``ALLOWED`` with its source, as a digit would.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from storybias.core import paths
from storybias.core.artifacts import STAGES

ROOT = paths.repo_root()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
STAGE_OF = {Path(stage.notebook).stem: stage.token for stage in STAGES}  # notebook stem -> stage token

# Text that holds digits but no measurement: LaTeX, arXiv ids, section and appendix numbers.
NOT_A_NUMBER = re.compile(
    r"\$[^$\n]*\$|arXiv:\S+|(?:§|\bSecs?\.|\bSections?|\bApp\.|\bAppendix)\s*[A-Z]?\.?\d+(?:\.\d+)*"
)
# A decimal number (not part of a word such as "1.5B" or of a dotted "3.3.1"), or a count "n of m".
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?!\.?\d|\w)|\b\d[\d,]* of (?:the |its )?\d[\d,]*\b")

# A number in words: a number word after an approximation, a fraction after a comparison, or a number word
# (or a fraction) with a unit of time, size or ratio; and a date, ISO or with the month's name.
_DIGIT_WORDS = "one|two|three|four|five|six|seven|eight|nine"
_NUMBER_WORD = (
    rf"(?:half|a\s+third|a\s+quarter|two[- ]thirds|three[- ]quarters|twice|{_DIGIT_WORDS}|ten|eleven|twelve"
    rf"|(?:thir|four|fif|six|seven|eigh|nine)teen|(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)"
    rf"(?:[- ](?:{_DIGIT_WORDS}))?|(?:a\s+|one\s+)?(?:hundred|thousand|dozen))"
)
_FRACTION = r"(?:half|a\s+third|a\s+quarter|two[- ]thirds|three[- ]quarters)"
_APPROXIMATELY = r"(?:about|around|roughly|nearly|almost|close\s+to)"
_COMPARED = r"(?:under|over|(?:less|more|fewer)\s+than|at\s+(?:least|most))"
_UNIT = r"(?:seconds?|minutes?|hours?|days?|weeks?|per\s?cent|tokens?|[GMK]B|times)"
WORDED = re.compile(
    rf"\b{_APPROXIMATELY}\s+{_NUMBER_WORD}\b|\b{_COMPARED}\s+{_FRACTION}\b"
    rf"|\b{_NUMBER_WORD}\s+(?:an?\s+)?{_UNIT}\b|\btwice\s+as\b",
    re.IGNORECASE,
)
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
DATE = re.compile(
    rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,\s*\d{{4}})?\b"
    rf"|\b\d{{1,2}}\s+{_MONTH}(?:\s+\d{{4}})?\b|\b{_MONTH}\s+\d{{4}}\b"
)

# The numbers a notebook's markdown may type, each with its source, by the notebook's stage token (the
# registry's, storybias.core.artifacts.STAGES: inserting a stage renumbers notebooks, not these keys).
ALLOWED: dict[str, dict[str, str]] = {
    "filter": {
        "0.5": "BiasedTales-ML App. C: in the prompt's language when lid.176 gives p > 0.5 (filter.lid_threshold)",
    },
    "extract": {
        "85.6": "BiasedTales-ML §4.1: extraction precision against humans",
        "81.6": "Feng et al. App. D.2: automated and human protagonist labels agree for 81.6-91.3%",
        "91.3": "Feng et al. App. D.2: automated and human protagonist labels agree for 81.6-91.3%",
        "0.618": "BiasedTales-ML Sec. 3: Cohen's kappa between its two annotators",
        "85.625": "BiasedTales-ML Sec. 3: precision of the extracted items (scored 1 or 2)",
    },
    "associations": {
        "7.9": "StereoTales' human study: 247 raters x 50 associations, 7.9 ratings each",
        "0.62": "StereoTales: Spearman rho between median human and median LLM harm",
        "4 of 5": "StereoTales' harm scale: harmful when the median harm is >= 4 of 5",
        "784 of the 1,580": "StereoTales' human study: 784 of its 1,580 rated associations are global",
    },
    "metrics": {
        "9.07": "Feng et al. Table 2: F(4, 79)",
        "0.278": "Feng et al. Table 2: partial omega^2 for F(4, 79) = 9.07",
        "1.98": "Feng et al. Table 2: F(11, 79)",
        "0.106": "Feng et al. Table 2: partial omega^2 for F(11, 79) = 1.98",
        "21.63": "Feng et al. Table 2: F",
        "0.495": "Feng et al. Table 2: partial omega^2 for F = 21.63",
        "0.047": "Feng et al. Table 2: a BH-adjusted p",
        "0.0415": "Feng et al. Table 2: the raw p behind the adjusted 0.047",
    },
    "probes": {
        "more than half": "storybias' definition of a clear majority of ratings (stages/probes/judgement_agreement.py)",
        "80.0": "Feng et al. App. D.2: human endorsement of the keep decisions",
        "0.1": "Feng et al. App. D.4: UMAP min_dist (probes.umap.min_dist)",
        "3.28": "Feng et al. App. D.2.1: self-context advantage on the high-agreement markers",
        "77.8": "Feng et al. App. D.2.1: high-agreement markers whose own context scores highest",
    },
    "crosslens": {
        "0.05": "the significance level of a BH-adjusted p (crosslens agreement)",
    },
    "figures": {
        "0.5": "BiasedTales-ML App. C: in the prompt's language when lid.176 gives p > 0.5 (filter.lid_threshold)",
        "0.05": "the significance level of the studies' tests (StereoTales Sec. 3.3, crosslens, GLM shading)",
        "0.001": "Feng et al. App. C: the GLM terms they find at p < 0.001",
        "0.1": "Feng et al. App. D.4: UMAP min_dist (probes.umap.min_dist)",
        "0.62": "StereoTales: Spearman rho between median human and median LLM harm",
        "2.42": "Feng et al. Eq. 5: self-context advantage, EN Story",
        "4.26": "Feng et al. Eq. 5: self-context advantage, FR Story",
        "2.94": "Feng et al. Eq. 5: self-context advantage, ZH Story",
        "2.64": "Feng et al. Eq. 5: self-context advantage, EN News",
        "4.78": "Feng et al. Eq. 5: self-context advantage, FR News",
        "3.64": "Feng et al. Eq. 5: self-context advantage, ZH News",
        "3.28": "Feng et al. App. D.2.1: advantage on the high-agreement markers, interval 2.53 to 3.95",
        "2.53": "Feng et al. App. D.2.1: advantage on the high-agreement markers, interval 2.53 to 3.95",
        "3.95": "Feng et al. App. D.2.1: advantage on the high-agreement markers, interval 2.53 to 3.95",
        "77.8": "Feng et al. App. D.2.1: high-agreement markers whose own context scores highest",
        "4 of 5": "StereoTales' harm scale: harmful when the median harm is >= 4 of 5",
    },
}


def typed_numbers(markdown: str) -> list[str]:
    """The decimal numbers and "n of m" counts a markdown text types, then its numbers in words and its
    dates, each as written (white space made single, so a phrase broken over lines is one entry)."""
    text = NOT_A_NUMBER.sub(" ", markdown)
    found = NUMBER.findall(text) + [m.group(0) for m in WORDED.finditer(text)] + DATE.findall(text)
    return [" ".join(found_text.split()) for found_text in found]


def markdown_cells(notebook) -> list[tuple[str, str]]:
    """(cell id, text) of a notebook's markdown cells, read with json (the outputs are never printed)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [(c.get("id", "?"), "".join(c["source"])) for c in cells if c["cell_type"] == "markdown"]


def stored_in(number: str) -> list[str]:
    """The recorded tables holding a value that rounds to ``number`` at the precision it is typed with."""
    if not re.fullmatch(r"\d+\.\d+", number):  # a count, words or a date: no table holds it as written
        return []
    places = len(number.split(".")[1])
    found = []
    for table in sorted((ROOT / "docs" / "measurements").glob("*.csv")):
        for row in csv.reader(table.read_text(encoding="utf-8").splitlines()):
            for value in row:
                try:
                    if round(float(value), places) == float(number):
                        found.append(table.name)
                except ValueError:
                    continue
    return sorted(set(found))


def test_the_scan_finds_numbers_and_skips_formulas_ids_and_sections():
    text = (
        "Sec. 3.3.1 and §4.1 (arXiv:2604.17008), App. D.2.1: $p < 0.05$ with the 1.5B model;"
        " every field 0.32 / 0.64, 85.6% precision, facts for 103 of 108 stories, lift 2.0."
    )
    assert typed_numbers(text) == ["0.32", "0.64", "85.6", "103 of 108", "2.0"]


def test_the_scan_finds_numbers_in_words_and_dates():
    """Issue #59's examples, as notebooks 01 and 03 typed them, and counts that only define a rule."""
    text = (
        "`make paper` took under half an hour on one and about fifty minutes on the other; for the other\n"
        "fields about half its fills were right; started in less than half a compiled engine's time, three\n"
        "times as fast (`extraction_rules.csv`, 2026-12-04), measured on 5 December 2026."
    )
    assert typed_numbers(text) == [
        "under half",
        "about fifty",
        "about half",
        "less than half",
        "three times",
        "2026-12-04",
        "5 December 2026",
    ]
    rules = (
        "at least two ratings spanning at most one scale point; one of ten categories; under two rules;"
        " under five-fold cross-validation; the two stories; twenty years old; 1.5B; Qwen2.5 (2024)"
    )
    assert typed_numbers(rules) == []


def why(number: str) -> str:
    """What to do about a number typed by hand."""
    if DATE.fullmatch(number):
        return "is a date: when it was measured belongs with the measurement (docs/measurements/, docs/benchmarks.md)"
    if not re.search(r"\d", number):
        return "is a measured number in words: let a code cell show it, or say what the table shows"
    if where := stored_in(number):
        return f"matches a value stored in {', '.join(where)}: say what the table shows"
    return "is stored nowhere: store it under docs/measurements/ or leave it out"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_markdown_types_a_measured_number(notebook):
    allowed = ALLOWED.get(STAGE_OF.get(notebook.stem, notebook.stem), {})
    problems = [
        f"cell {cell}: {number} {why(number)}"
        for cell, text in markdown_cells(notebook)
        for number in typed_numbers(text)
        if number not in allowed
    ]
    assert not problems, (
        f"{notebook.name} types measured numbers in markdown (a published one goes in ALLOWED with its source):\n"
        + "\n".join(problems)
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_allowed_number_is_still_typed(notebook):
    typed = {n for _, text in markdown_cells(notebook) for n in typed_numbers(text)}
    stale = set(ALLOWED.get(STAGE_OF.get(notebook.stem, notebook.stem), {})) - typed
    assert not stale, f"ALLOWED lists numbers {notebook.name} no longer types: {sorted(stale)}"


def test_allowed_names_existing_notebooks():
    assert set(ALLOWED) <= {STAGE_OF.get(p.stem, p.stem) for p in NOTEBOOKS}
