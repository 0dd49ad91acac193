"""The prompt designs: grid sizes equal to the studies', stable ids, and localization parity."""

from __future__ import annotations

import re

import pytest

from storybias.config import prompts
from storybias.config.designs import design_cells, render_prompt
from storybias.config.prompts import LANGUAGES, load_localization

LOCALIZED = {d: prompts.available_languages(d) for d in prompts.DESIGNS}
PAIRS = [(d, lang) for d in prompts.DESIGNS for lang in LOCALIZED[d]]

# Distinctive English words that should not survive in another language's template text.
ENGLISH_LEFTOVERS = {
    "the",
    "and",
    "story",
    "write",
    "words",
    "please",
    "person",
    "who",
    "with",
    "their",
    "about",
    "bedtime",
    "character",
    "only",
    "short",
    "sentence",
    "news",
    "report",
    "list",
    "answer",
}
# Words that are legitimately the same (proper nouns, acronyms) or also words of that language.
ALLOWED_LATIN = {"CEO", "HR", "MASK"}


def test_grid_sizes_equal_the_studies():
    assert len(design_cells("stereotales")) == 79 * 36 == 2844
    assert len(design_cells("bedtime")) == 3 * 27 * 6 * 2 * 3 == 2916
    assert len(design_cells("occupations")) == 18 * 3 == 54


def test_stereotales_design_counts():
    spec = prompts.load_design("stereotales")
    dims = spec["dimensions"]
    assert len(dims) == 19
    assert sum(len(v) for v in dims.values()) == 79
    assert [len(v) for v in dims.values()] == [6, 3, 2, 5, 11, 3, 6, 3, 3, 2, 2, 2, 2, 5, 2, 3, 5, 11, 3]
    cats = spec["scenario_categories"]
    assert len(cats) == 9 and all(len(s) == 4 for s in cats.values())


def test_occupation_gender_mapping_is_8_female_10_male():
    mapping = prompts.load_design("occupations")["occupation_gender"]
    assert sorted(mapping.values()).count("female") == 8
    assert sorted(mapping.values()).count("male") == 10
    assert set(mapping) == set(prompts.load_design("occupations")["dimensions"]["occupation"])


def test_prompt_ids_are_unique_and_stable():
    for design in prompts.DESIGNS:
        ids = [c.prompt_id for c in design_cells(design)]
        assert len(ids) == len(set(ids))
    assert design_cells("bedtime")[0].prompt_id == "bedtime/mother/american/christian/wealthy/girl"
    assert prompts.story_id(
        "bedtime", "en", "m", "bedtime/mother/american/christian/wealthy/girl", 0
    ) == prompts.story_id("bedtime", "en", "m", "bedtime/mother/american/christian/wealthy/girl", 0)
    # the id depends on each defining field
    base = ("stereotales", "en", "m", "p", 0)
    variants = [
        ("bedtime", "en", "m", "p", 0),
        ("stereotales", "fr", "m", "p", 0),
        ("stereotales", "en", "n", "p", 0),
        ("stereotales", "en", "m", "q", 0),
        ("stereotales", "en", "m", "p", 1),
    ]
    assert len({prompts.story_id(*v) for v in variants + [base]}) == 6


def test_story_id_is_pinned():
    # A changed hash would orphan every stored story: pin one value.
    assert (
        prompts.story_id("stereotales", "en", "qwen2.5-coder-1.5b", "stereotales/age=child/shoplifting", 0)
        == __import__("hashlib")
        .sha256(b"stereotales|en|qwen2.5-coder-1.5b|stereotales/age=child/shoplifting|0")
        .hexdigest()[:16]
    )


def test_sampling_is_seeded_and_language_independent():
    cells = design_cells("stereotales")
    a = prompts.sample_cells(cells, 20, seed=42)
    b = prompts.sample_cells(cells, 20, seed=42)
    c = prompts.sample_cells(cells, 20, seed=43)
    assert [x.prompt_id for x in a] == [x.prompt_id for x in b]
    assert [x.prompt_id for x in a] != [x.prompt_id for x in c]
    only = prompts.sample_cells(cells, None, seed=1, restrict={"attribute": ["gender"]})
    assert len(only) == 3 * 36 and {x.conditions["cond_attribute"] for x in only} == {"gender"}


def test_request_seeds_differ_between_samples_of_one_prompt():
    ids = [prompts.story_id("bedtime", "en", "m", "p", s) for s in range(5)]
    seeds = {prompts.request_seed(42, i) for i in ids}
    assert len(seeds) == 5


def test_english_prompts_render_as_expected():
    cell = next(c for c in design_cells("bedtime") if c.prompt_id == "bedtime/mother/egyptian/muslim/working_class/boy")
    text = render_prompt(cell, "en")
    assert text.startswith(
        "I am an Egyptian mother. My family is of Egyptian descent. I come from a working-class family, and we"
        " follow the Muslim tradition."
    )
    assert "6-year-old boy" in text and "{{" not in text
    explicit = next(c for c in design_cells("occupations") if c.prompt_id == "occupations/nurse/explicit")
    assert '"The nurse is [MASK]."' in render_prompt(explicit, "en")
    assert "female, woman, male, man" in render_prompt(explicit, "en")


def _keys(loc: dict, design: str) -> dict:
    if design == "stereotales":
        return {"values": {d: set(v) for d, v in loc["values"].items()}, "scenarios": set(loc["scenarios"])}
    if design == "bedtime":
        return {"values": {d: set(v) for d, v in loc["values"].items()}}
    return {
        "values": {d: set(v) for d, v in loc["values"].items()},
        "labels": set(loc["labels"]),
        "templates": set(loc["templates"]),
    }


@pytest.mark.parametrize("design,language", PAIRS)
def test_localization_has_every_key_of_the_design(design, language):
    loc = load_localization(design, language)
    assert loc["language"] == language
    assert _keys(loc, design) == _keys(load_localization(design, "en"), design)
    spec = prompts.load_design(design)
    for dim, values in spec["dimensions"].items():
        if dim == "task":
            continue
        assert set(loc["values"][dim]) == set(values), f"{design}/{language}: {dim}"


@pytest.mark.parametrize("design,language", PAIRS)
def test_values_of_a_dimension_share_their_forms(design, language):
    for dim, values in load_localization(design, language)["values"].items():
        shapes = {tuple(sorted(v)) if isinstance(v, dict) else "text" for v in values.values()}
        assert len(shapes) == 1, f"{design}/{language}/{dim}: values have different forms {shapes}"


@pytest.mark.parametrize("design,language", PAIRS)
def test_every_cell_renders(design, language):
    texts = {render_prompt(cell, language) for cell in design_cells(design)}
    assert len(texts) == len(design_cells(design)), "two cells render to the same prompt"
    for text in texts:
        assert text and "{" not in text and "}" not in text and "None" not in text


@pytest.mark.parametrize("design,language", [p for p in PAIRS if p[1] != "en"])
def test_no_english_left_in_templates(design, language):
    leftovers = set()
    for cell in design_cells(design)[:: max(1, len(design_cells(design)) // 300)]:
        words = set(re.findall(r"[A-Za-z]+", render_prompt(cell, language)))
        leftovers |= {w for w in words if w.lower() in ENGLISH_LEFTOVERS and w not in ALLOWED_LATIN}
    assert not leftovers, f"{design}/{language}: English words left: {sorted(leftovers)}"


def test_languages_are_the_14_of_the_studies():
    assert list(LANGUAGES) == ["en", "fr", "es", "it", "pt", "nl", "uk", "ar", "hi", "zh", "ja", "ko", "ru", "sw"]


# StereoTales' taxonomy as its public pipeline words it (Giskard-AI/stereotales-pipeline,
# configs/stereotales_seeds/attributes/attributes.en.yaml): the prompted values of a few dimensions
# whose storybias values used to differ, and the dimensions whose extraction allows `other`.
REFERENCE_SPOT_CHECKS = {
    "sexual_orientation": ["heterosexual", "homosexual", "bisexual", "pansexual", "asexual"],
    "health_status": ["good", "fair", "poor"],
    "employment_status": ["stable employment", "precarious employment", "unemployed", "student", "retired"],
    "political_orientation": ["conservative", "centrist", "progressive"],
    "marital_status": ["single", "married", "divorced or separated", "widowed", "domestic partnership"],
}
REFERENCE_OTHER = {
    "gender",
    "gender_alignment",
    "sexual_orientation",
    "geographic_origin",
    "religion",
    "employment_status",
    "professional_field",
    "housing_status",
}
# The 13 aspects StereoTales' story prompt asks the story to reveal.
STEREOTALES_ASPECTS = [
    "age",
    "sexual_orientation",
    "ethnicity",
    "geographic_origin",
    "education_level",
    "religious_beliefs",
    "political_orientation",
    "health_status",
    "literacy_level",
    "immigration_status",
    "marital_status",
    "employment_situation",
    "housing_conditions",
]


def _reference() -> dict:
    import yaml

    from storybias.core import paths

    with open(paths.designs_dir() / "stereotales" / "reference.yaml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_stereotales_taxonomy_is_the_references():
    spec, ref = prompts.load_design("stereotales"), _reference()
    prompted = {d: [k for k, v in vals.items() if "prompt" in v] for d, vals in ref["dimensions"].items()}
    assert spec["dimensions"] == prompted, "design.yaml must list the reference's prompted values, in its order"
    assert set(spec["extraction_other"]) == REFERENCE_OTHER
    assert {d for d, vals in ref["dimensions"].items() if "other" in vals} == REFERENCE_OTHER
    for dim, words in REFERENCE_SPOT_CHECKS.items():
        assert [ref["dimensions"][dim][k]["value"] for k in spec["dimensions"][dim]] == words, dim
    assert len(spec["dimensions"]["geographic_origin"]) == 11 and len(spec["dimensions"]["professional_field"]) == 11
    scenarios = [s for ss in spec["scenario_categories"].values() for s in ss]
    assert scenarios == list(ref["scenarios"]) and len(set(scenarios)) == 36
    assert ref["scenarios"]["dui_arrest"] == "being arrested for driving under the influence"
    assert list(spec["scenario_categories"]) == [
        "misconduct",
        "hobbies",
        "learning",
        "social_and_family",
        "financial",
        "technology_and_maintenance",
        "activism",
        "health",
        "conflict_and_crisis",
    ]


@pytest.mark.parametrize("language", LOCALIZED["stereotales"])
def test_stereotales_template_asks_for_the_13_aspects(language):
    loc = load_localization("stereotales", language)
    assert list(loc.get("aspects", {})) == STEREOTALES_ASPECTS
    text = render_prompt(design_cells("stereotales")[0], language)
    flat = " ".join(text.split())
    for key, words in loc["aspects"].items():
        assert words and words in flat, f"{language}: aspect {key} ({words!r}) is not in the prompt"
    assert "200" in flat


# --- the bedtime prompt is BiasedTales-ML's (Appendix A.1): a descent sentence, girl/boy/child ------
# The study's template has "My family is of [Ethnicity] descent." after the identity sentence and asks
# for a story "for my 6-year-old [Gender]" (Girl / Boy / Child). Its Table 1 has no ethnicity, so the
# descent sentence names the nationality (design.yaml says so): each nationality is named twice.

BEDTIME_LANGUAGES = LOCALIZED["bedtime"]


def _bedtime_cell(prompt_id: str):
    return next(c for c in design_cells("bedtime") if c.prompt_id == prompt_id)


def test_english_bedtime_prompt_has_the_studys_descent_and_gender_words():
    girl = render_prompt(_bedtime_cell("bedtime/mother/mexican/christian/wealthy/girl"), "en")
    boy = render_prompt(_bedtime_cell("bedtime/mother/mexican/christian/wealthy/boy"), "en")
    assert girl.startswith("I am a Mexican mother. My family is of Mexican descent. I come from a wealthy family")
    assert "My family is of Mexican descent." in girl and "6-year-old girl" in girl
    assert "6-year-old boy" in boy
    words = set(re.findall(r"[a-z]+", (girl + " " + boy).lower()))
    assert not words & {"daughter", "son"}


def test_bedtime_is_localized_in_the_14_languages():
    assert sorted(BEDTIME_LANGUAGES) == sorted(LANGUAGES)


@pytest.mark.parametrize("language", BEDTIME_LANGUAGES)
def test_bedtime_template_names_the_nationality_twice(language):
    """Every branch of the template (parent role and child gender select forms) fills a nationality
    slot in the identity sentence and again in the descent sentence: with every form of the
    nationality replaced by a marker, two sentences hold the marker."""
    loc, marker = load_localization("bedtime", language), "QQNATIONALITYQQ"
    values = loc["values"]
    fake = dict.fromkeys(next(iter(values["nationality"].values())), marker)
    first = {d: next(iter(values[d].values())) for d in ("religion", "social_class")}
    for parent in values["parent_role"].values():
        for child in values["child_gender"].values():
            text = prompts.jinja_template(loc["template"]).render(
                parent_role=parent, nationality=fake, child_gender=child, **first
            )
            sentences = [t for t in re.split(r"[.。।]", text) if marker in t]
            assert len(sentences) >= 2, f"{language}: one sentence names the nationality: {text}"


def _occurrences(text: str, forms: set[str]) -> int:
    pattern = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
    return len(re.findall(pattern, text))


@pytest.mark.parametrize("language", BEDTIME_LANGUAGES)
def test_bedtime_prompt_names_every_nationality_in_identity_and_descent(language):
    """The rendered prompt of each nationality holds its own words twice more than the prompt of
    another nationality does (counting only forms no other nationality shares, such as not English's
    article): once in the identity sentence, once in the descent sentence."""
    nat = load_localization("bedtime", language)["values"]["nationality"]
    for key in nat:
        own = {v for k, v in nat[key].items() if all(nat[o][k] != v for o in nat if o != key)}
        other = next(o for o in nat if o != key and not any(f in v for f in own for v in nat[o].values()))
        text = render_prompt(_bedtime_cell(f"bedtime/mother/{key}/christian/wealthy/girl"), language)
        base = render_prompt(_bedtime_cell(f"bedtime/mother/{other}/christian/wealthy/girl"), language)
        assert own, f"{language}/{key}: no form of its own"
        assert _occurrences(text, own) - _occurrences(base, own) >= 2, f"{language}/{key}: {text}"
