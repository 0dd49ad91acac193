"""Import of StereoTales' published associations and the comparison with a run's associations."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from storybias.config import params, prompts
from storybias.config.params import ParamsError
from storybias.core import paths
from storybias.evidence import published
from storybias.evidence.released_associations import load_associations
from storybias.stages.associations.published import compare_published, comparison_counts
from storybias.stages.extract import answers as extract

# Every value label of StereoTales' taxonomy as its published associations word them
# (Giskard-AI/stereotales-pipeline, attributes.en.yaml, `values`), `other` included; the published
# file also writes some labels without their examples or with other examples (SHORT_FORMS).
REFERENCE_LABELS = {
    "age": [
        "child (0-12)",
        "adolescent (13-17)",
        "young adult (18-29)",
        "adult (30-44)",
        "middle-aged (45-64)",
        "senior (65+)",
    ],
    "gender": ["man", "woman", "non-binary", "other"],
    "gender_alignment": ["cisgender", "transgender", "other"],
    "sexual_orientation": ["heterosexual", "homosexual", "bisexual", "pansexual", "asexual", "other"],
    "geographic_origin": [
        "north america (e.g. United States, Canada)",
        "south or central america (e.g. Mexico, Brazil, Argentina, Cuba, etc)",
        "europe (e.g. United Kingdom, Spain, Russia, Greece, etc)",
        "south eastern asia (e.g. Thailand, Vietnam, Philippines, Malaysia, Indonesia, etc)",
        "eastern asia (e.g. Japan, Korea, China, etc)",
        "central asia (e.g. Kazakhstan, Kyrgyzstan, Tajikistan, Turkmenistan, Uzbekistan, etc)",
        "southern asia (e.g. India, Pakistan, Sri Lanka, Nepal, etc)",
        "northern africa (e.g. Egypt, Sudan, Algeria, Morocco, Tunisia, etc)",
        "sub-saharan africa (e.g. Nigeria, Ethiopia, Kenya, Tanzania, Uganda, etc)",
        "middle east (e.g. Saudi Arabia, Iran, Afghanistan, etc)",
        "oceania (e.g. Australia, New Zealand, Fiji, etc)",
        "other",
    ],
    "education": [
        "basic (e.g. less than high school, or high school)",
        "undergraduate (e.g. bachelor's degree, some college)",
        "graduate (e.g. master's degree, doctoral degree)",
    ],
    "religion": ["Christian", "Jewish", "Muslim", "Hindu", "Buddhist", "Atheist/Agnostic", "other"],
    "political_orientation": ["conservative", "centrist", "progressive"],
    "health_status": ["good", "fair", "poor"],
    "disability_status": ["no disability", "some disability"],
    "literacy_status": ["literate", "illiterate"],
    "immigration_status": ["citizen (native-born or naturalized)", "immigrant"],
    "urbanicity": ["urban", "rural"],
    "marital_status": ["single", "married", "divorced or separated", "widowed", "domestic partnership"],
    "parental_status": ["childless", "with children"],
    "income_level": ["low income", "middle income", "high income"],
    "employment_status": ["stable employment", "precarious employment", "unemployed", "student", "retired", "other"],
    "professional_field": [
        "science, technology, engineering, and math (STEM)",
        "healthcare and medicine",
        "education and training",
        "media and communication",
        "arts and creative industries",
        "business, finance, legal",
        "administrative assistance and support services",
        "social services",
        "public administration",
        "trades and manual labor (e.g. construction, manufacturing)",
        "agriculture",
        "other",
    ],
    "housing_status": ["homeowner", "renter", "homeless", "other"],
}
SHORT_FORMS = {
    ("professional_field", "trades and manual labor"): "trades_manual_labor",
    ("geographic_origin", "north america (e.g. United States, Canada, etc)"): "north_america",
    ("geographic_origin", "southern asia"): "south_asia",
    ("immigration_status", "citizen"): "citizen",
    ("age", "senior"): "senior",
}


def _record(qid, base, compared, pct=50.0, lift=3.0, models=("azure_ai/gpt-4o",)):
    return {
        "question_id": qid,
        "base_attribute": {"name": base[0], "value": base[1]},
        "compared_attribute": {"name": compared[0], "value": compared[1]},
        "avg_percentage": pct,
        "avg_lift": lift,
        "metadata": {"model_list": list(models)},
    }


def _write(tmp_path, records, name="questions.json"):
    path = tmp_path / name
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def test_every_reference_label_maps_onto_exactly_one_canonical_key(tmp_path):
    labels = [(a, v) for a, vs in REFERENCE_LABELS.items() for v in vs] + list(SHORT_FORMS)
    # one record per label, as base value, against a fixed compared attribute of another dimension
    records = [
        _record(
            f"q{i}",
            (a, v),
            ("urbanicity" if a != "urbanicity" else "age", "rural" if a != "urbanicity" else "adult (30-44)"),
        )
        for i, (a, v) in enumerate(labels)
    ]
    frame = published.load_published(_write(tmp_path, records))
    assert len(frame) == len(labels)
    spec = prompts.load_design("stereotales")
    for attribute, vs in REFERENCE_LABELS.items():
        keys = frame.loc[frame["base_attribute"] == attribute].head(len(vs))["base_value"].tolist()
        assert len(set(keys)) == len(vs), f"{attribute}: two labels share a key: {keys}"
        expected = set(extract.allowed_values(attribute)) - {"unknown"}
        assert set(keys) == expected, f"{attribute}: {sorted(set(keys) ^ expected)}"
    for (attribute, label), key in SHORT_FORMS.items():
        assert published.canonical_value(attribute, label) == key
    assert sum(len(v) for v in spec["dimensions"].values()) == 79


def test_a_label_outside_the_taxonomy_is_reported_with_file_record_and_field(tmp_path):
    path = _write(
        tmp_path,
        [
            _record("a", ("gender", "man"), ("age", "adult (30-44)")),
            _record("b", ("sexual_orientation", "gay"), ("age", "adult (30-44)")),
        ],
    )
    with pytest.raises(published.PublishedFormatError) as err:
        published.load_published(path)
    message = str(err.value)
    assert str(path) in message and "record 1 (question_id b)" in message and "field base_attribute" in message
    assert "'gay'" in message


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda r: r.pop("avg_lift"), "avg_lift"),
        (lambda r: r.update(avg_percentage=140), "avg_percentage"),
        (lambda r: r["metadata"].update(model_list=[]), "metadata.model_list"),
        (lambda r: r["compared_attribute"].pop("value"), "compared_attribute.value"),
        (lambda r: r.update(question_id=3), "question_id"),
    ],
)
def test_malformed_records_are_rejected(tmp_path, mutate, field):
    record = _record("x", ("gender", "woman"), ("age", "adult (30-44)"))
    mutate(record)
    with pytest.raises(published.PublishedFormatError, match=rf"record 0.*field {field.replace('.', '[.]')}"):
        published.load_published(_write(tmp_path, [record]))


def _run(rows):
    """(associations_attributes, associations_values) of a run: each row is one cell of a tested pair,
    (model, scope, base attr, base value, compared attr, compared value, retained, significant)."""
    cells = pd.DataFrame(
        rows,
        columns=["model", "scope", *published.KEY, "retained", "significant"],
    )
    attributes = cells.drop_duplicates(["model", "scope", "base_attribute", "compared_attribute"])[
        ["model", "scope", "base_attribute", "compared_attribute", "retained"]
    ]
    values = cells[cells["retained"]].drop(columns="retained").assign(lift=3.0, p_adjusted=0.01)
    values.loc[~values["significant"], "p_adjusted"] = 0.4
    return attributes, values


PUBLISHED = [
    _record(
        "p1", ("professional_field", "agriculture"), ("urbanicity", "rural"), models=("azure_ai/gpt-4o", "gemini/x")
    ),
    _record("p2", ("age", "senior (65+)"), ("employment_status", "retired"), models=("azure_ai/gpt-4o",)),
    _record("p3", ("age", "adolescent (13-17)"), ("marital_status", "single"), models=("gemini/x",)),
    _record(
        "p4",
        ("religion", "Hindu"),
        ("geographic_origin", "southern asia (e.g. India, Pakistan, Sri Lanka, Nepal, etc)"),
        models=("azure_ai/gpt-4o",),
    ),
]


def _status(table):
    listed = table[table["status"] != "not_published"]
    return dict(zip(listed["base_value"], listed["status"], strict=True))


def test_comparison_counts_reproduced_new_and_overlap_any_model(tmp_path):
    pub = load_associations(_write(tmp_path, PUBLISHED))
    attributes, values = _run(
        [
            ("m1", "all", "professional_field", "agriculture", "urbanicity", "rural", True, True),  # reproduces p1
            ("m2", "all", "age", "senior", "employment_status", "retired", True, False),  # p2 tested, missed
            ("m2", "all", "age", "adolescent", "marital_status", "single", True, True),  # reproduces p3
            ("m1", "all", "age", "child", "marital_status", "single", True, True),  # not published
            ("m1", "all", "professional_field", "stem", "urbanicity", "urban", True, True),  # not published
            # found in French only: a question names no scope (the list mixes global and per-language
            # associations), so it is compared with every scope the run tested
            ("m1", "fr", "religion", "hindu", "geographic_origin", "south_asia", True, True),
            ("m1", "fr", "age", "young_adult", "marital_status", "single", True, True),  # not published
        ]
    )
    table = compare_published(pub, attributes, values)
    assert set(table["match"]) == {"any_model"}
    assert _status(table) == {
        "agriculture": "reproduced",
        "senior": "missed",
        "adolescent": "reproduced",
        "hindu": "reproduced",
    }
    listed = table[table["status"] != "not_published"].set_index("base_value")
    assert listed["scope"].unique().tolist() == ["any"]
    assert listed.loc["hindu", "run_scope"] == "fr" and listed.loc["agriculture", "run_scope"] == "all"
    unpublished = table[table["status"] == "not_published"]
    assert sorted(zip(unpublished["base_value"], unpublished["scope"])) == [
        ("child", "all"),
        ("stem", "all"),
        ("young_adult", "fr"),
    ]
    per = comparison_counts(table, by=("base_attribute",)).set_index("base_attribute")
    assert per.loc["age", ["reproduced", "missed", "untested", "not_published"]].tolist() == [1, 1, 0, 2]
    assert per.loc["age", "reproduced_share"] == pytest.approx(0.5)
    assert per.loc["professional_field", "reproduced_share"] == pytest.approx(1.0)
    assert per.loc["religion", "reproduced"] == 1


def test_comparison_uses_the_same_model_when_names_match(tmp_path):
    pub = load_associations(_write(tmp_path, PUBLISHED))
    attributes, values = _run(
        [
            ("GPT-4o", "all", "professional_field", "agriculture", "urbanicity", "rural", True, False),  # misses p1
            ("other", "all", "professional_field", "agriculture", "urbanicity", "rural", True, True),  # not the model
            ("GPT-4o", "all", "age", "senior", "employment_status", "retired", True, True),  # p2 reproduced
            ("GPT-4o", "all", "age", "adolescent", "marital_status", "single", True, True),  # p3 is gemini/x's
        ]
    )
    table = compare_published(pub, attributes, values)
    assert set(table["match"]) == {"same_model"}
    assert _status(table) == {
        "agriculture": "missed",
        "senior": "reproduced",
        "adolescent": "untested",
        "hindu": "untested",
    }
    listed = table[table["status"] != "not_published"].set_index("base_value")
    assert list(listed.loc["senior", "reproduced_by"]) == ["GPT-4o"]
    assert listed.loc["adolescent", "reason"] == "the model is not in the run"
    # GPT-4o's p3-like cell was published by another model only: not published for GPT-4o
    assert table.loc[table["status"] == "not_published", "base_value"].tolist() == ["adolescent"]


def test_check_params_validates_the_published_file(tmp_path):
    good = _write(tmp_path, PUBLISHED, "good.json")
    bad = _write(tmp_path, [_record("z", ("health_status", "excellent"), ("age", "adult (30-44)"))], "bad.json")
    with open(paths.repo_root() / "params" / "smoke.yaml", encoding="utf-8") as fh:
        base = yaml.safe_load(fh)
    assert params.load(paths.repo_root() / "params" / "smoke.yaml").profile.associations.published is None
    for path, ok in ((good, True), (bad, False)):
        data = dict(base, associations={**(base.get("associations") or {}), "published": str(path)})
        profile = tmp_path / f"profile-{path.stem}.yaml"
        profile.write_text(yaml.safe_dump(data), encoding="utf-8")
        if ok:
            assert params.load(profile).profile.associations.published == str(path)
        else:
            with pytest.raises(ParamsError, match=r"associations\.published: .*bad\.json: record 0"):
                params.load(profile)
