"""Import of StereoTales' published associations and the comparison with a run's associations."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from storybias.config import params, prompts
from storybias.config.params import ParamsError
from storybias.core import paths
from storybias.evidence import questions, stereotales_taxonomy
from storybias.evidence.released_associations import load_associations
from storybias.stages.associations.comparison import PooledScope, compare_published, comparison_counts
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
    every = [(a, v) for a, vs in REFERENCE_LABELS.items() for v in vs] + list(SHORT_FORMS)
    # one record per label, as base value, against a fixed compared attribute of another dimension
    records = [
        _record(
            f"q{i}",
            (a, v),
            ("urbanicity" if a != "urbanicity" else "age", "rural" if a != "urbanicity" else "adult (30-44)"),
        )
        for i, (a, v) in enumerate(every)
    ]
    frame = questions.load_questions(_write(tmp_path, records))
    # a short form names the association of its full label: one row, both question ids (issue #44)
    assert len(frame) == len(every) - len(SHORT_FORMS)
    assert sorted(len(ids) for ids in frame["question_ids"])[-len(SHORT_FORMS) :] == [2] * len(SHORT_FORMS)
    spec = prompts.load_design("stereotales")
    for attribute, vs in REFERENCE_LABELS.items():
        keys = frame.loc[frame["base_attribute"] == attribute].head(len(vs))["base_value"].tolist()
        assert len(set(keys)) == len(vs), f"{attribute}: two labels share a key: {keys}"
        expected = set(extract.allowed_values(attribute)) - {"unknown"}
        assert set(keys) == expected, f"{attribute}: {sorted(set(keys) ^ expected)}"
    for (attribute, label), key in SHORT_FORMS.items():
        assert stereotales_taxonomy.canonical_value(attribute, label) == key
    assert sum(len(v) for v in spec["dimensions"].values()) == 79


def test_a_label_outside_the_taxonomy_is_reported_with_file_record_and_field(tmp_path):
    path = _write(
        tmp_path,
        [
            _record("a", ("gender", "man"), ("age", "adult (30-44)")),
            _record("b", ("sexual_orientation", "gay"), ("age", "adult (30-44)")),
        ],
    )
    with pytest.raises(stereotales_taxonomy.PublishedFormatError) as err:
        questions.load_questions(path)
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
    with pytest.raises(
        stereotales_taxonomy.PublishedFormatError, match=rf"record 0.*field {field.replace('.', '[.]')}"
    ):
        questions.load_questions(_write(tmp_path, [record]))


def _run(rows):
    """(associations_attributes, associations_values) of a run. Each row is one cell of a tested pair:
    (model, scope, base attr, base value, compared attr, compared value, pair BH p, pair effect, cell BY p,
    lift); the pair's table holds the rows and columns its cells name."""
    cells = pd.DataFrame(
        rows,
        columns=["model", "scope", *stereotales_taxonomy.ASSOCIATION_KEY, "pair_p", "effect", "p_adjusted", "lift"],
    )
    pair = ["model", "scope", "base_attribute", "compared_attribute"]
    attributes = []
    for key, group in cells.groupby(pair, sort=False):
        attributes.append(
            {
                **dict(zip(pair, key)),
                "p_adjusted": group["pair_p"].iloc[0],
                "effect_size": group["effect"].iloc[0],
                "retained": group["effect"].iloc[0] in ("medium", "large"),
                "table": json.dumps(
                    {
                        "rows": sorted(set(group["base_value"])),
                        "cols": sorted(set(group["compared_value"])),
                        "counts": [],
                    }
                ),
            }
        )
    attributes = pd.DataFrame(attributes)
    bh = cells["pair_p"] < 0.05
    values = (
        cells[bh]
        .drop(columns=["pair_p"])
        .assign(fraction=0.5, pair_retained=lambda f: f["effect"].isin(["medium", "large"]))
    )
    values["significant"] = values["pair_retained"] & (values["p_adjusted"] < 0.05) & (values["lift"] >= 2)
    return attributes, values.drop(columns=["effect"])


COMPARABLE = PooledScope(True, "")
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
SIG, NOT = 0.01, 0.4  # a BH / BY-adjusted p that is significant, and one that is not


def _status(table, column="status"):
    listed = table[(table["status"] != "not_published") & table["counted"]]
    return dict(zip(listed["base_value"], listed[column], strict=True))


def test_questions_are_counted_in_the_pooled_scope_and_every_other_scope_is_kept(tmp_path):
    pub = load_associations(_write(tmp_path, PUBLISHED))
    attributes, values = _run(
        [
            ("m1", "all", "professional_field", "agriculture", "urbanicity", "rural", SIG, "large", SIG, 3.0),  # p1
            ("m1", "all", "age", "senior", "employment_status", "retired", SIG, "medium", NOT, 3.0),  # p2 missed
            ("m1", "all", "age", "adolescent", "marital_status", "single", SIG, "large", SIG, 3.0),  # p3
            ("m1", "all", "age", "child", "marital_status", "single", SIG, "large", SIG, 3.0),  # not published
            # found in French only: counted in the pooled scope (its table there untestable), kept for fr
            ("m1", "fr", "religion", "hindu", "geographic_origin", "south_asia", SIG, "large", SIG, 3.0),
            ("m1", "fr", "age", "young_adult", "marital_status", "single", SIG, "large", SIG, 3.0),  # not published
        ]
    )
    table = compare_published(pub, attributes, values, COMPARABLE)
    assert set(table["match"]) == {"any_model"}
    assert _status(table) == {
        "agriculture": "reproduced",
        "senior": "missed",
        "adolescent": "reproduced",
        "hindu": "untested",
    }
    hindu = table[table["base_value"] == "hindu"].set_index("run_scope")
    assert hindu.loc["all", "counted"] and hindu.loc["all", "reason"].startswith(
        "the run's table of this pair was untestable"
    )
    assert not hindu.loc["fr", "counted"] and hindu.loc["fr", "status"] == "reproduced"
    # every question was tried in both of m1's scopes: 4 questions x 2 scopes
    assert len(table[table["source"] == "questions"]) == 8
    unpublished = table[table["status"] == "not_published"]
    assert sorted(zip(unpublished["base_value"], unpublished["scope"])) == [("child", "all"), ("young_adult", "fr")]
    per = comparison_counts(table, by=("base_attribute",)).set_index("base_attribute")
    assert per.loc["age", ["reproduced", "missed", "untested", "not_published"]].tolist() == [1, 1, 0, 2]
    assert per.loc["age", "reproduced_share"] == pytest.approx(0.5)
    assert per.loc["religion", "untested"] == 1 and per.loc["religion", "reproduced"] == 0


def test_questions_are_counted_once_per_listed_model_when_names_match(tmp_path):
    pub = load_associations(_write(tmp_path, PUBLISHED))
    attributes, values = _run(
        [
            ("GPT-4o", "all", "professional_field", "agriculture", "urbanicity", "rural", SIG, "large", NOT, 3.0),
            ("other", "all", "professional_field", "agriculture", "urbanicity", "rural", SIG, "large", SIG, 3.0),
            ("GPT-4o", "all", "age", "senior", "employment_status", "retired", SIG, "large", SIG, 3.0),  # p2
            ("GPT-4o", "all", "age", "adolescent", "marital_status", "single", SIG, "large", SIG, 3.0),  # p3: gemini's
        ]
    )
    table = compare_published(pub, attributes, values, COMPARABLE)
    assert set(table["match"]) == {"same_model"}
    counted = table[table["counted"] & (table["source"] == "questions")]
    # p1 lists two models: one row each (gemini/x is not in the run)
    p1 = counted[counted["base_value"] == "agriculture"].set_index("model")
    assert p1.loc["azure_ai/gpt-4o", "status"] == "missed" and p1.loc["azure_ai/gpt-4o", "run_model"] == "GPT-4o"
    assert p1.loc["gemini/x", "status"] == "untested" and p1.loc["gemini/x", "reason"] == "the model is not in the run"
    assert counted.set_index("base_value").loc["senior", "status"] == "reproduced"
    assert table.loc[table["status"] == "not_published", "base_value"].tolist() == ["adolescent"]


def _released(tmp_path, records):
    path = tmp_path / "released" / "m__global.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return load_associations(path.parent)


def _released_record(base, compared, effect, cells, scope="all", p=0.001):
    return {
        "generator_model": "prov/m",
        "aggregation_dimension": [] if scope == "all" else ["language"],
        "aggregation_value": scope,
        "base_attribute": base,
        "compared_attribute": compared,
        "statistics": {"p_value": p, "cramer_v": 0.2 if effect != "N/A" else -1, "effect_category": effect},
        "associated_values": [
            {
                "base_value": {"name": base, "value": b},
                "compared_value": {"name": compared, "value": c},
                "statistics": {"p_value": 0.001, "fraction": 0.4, "lift": lift},
            }
            for b, c, lift in cells
        ],
        "sample_ids": [],
    }


def test_released_cells_are_compared_by_the_files_rule_with_the_stated_rule_beside_it(tmp_path):
    pub = _released(
        tmp_path,
        [
            # a small-effect pair whose cell has lift 1.5: in the files, not under the stated rule
            _released_record("gender", "urbanicity", "small", [("woman", "urban", 1.5)]),
            # a large-effect pair, lift 3, and a value the run never saw
            _released_record(
                "income_level",
                "education",
                "large",
                [
                    ("low income", "basic (e.g. less than high school, or high school)", 3.0),
                    ("low income", "graduate (e.g. master's degree, doctoral degree)", 2.5),
                ],
            ),  # noqa: E501
            _released_record("age", "marital_status", "N/A", [], p=0.3),  # tested, not significant: no cell
        ],
    )
    assert pub["published_effect"].tolist() == ["small", "large", "large"]
    attributes, values = _run(
        [
            ("m", "all", "gender", "woman", "urbanicity", "urban", SIG, "small", SIG, 1.5),
            ("m", "all", "income_level", "low", "education", "basic", SIG, "small", SIG, 3.0),
            ("m", "all", "income_level", "low", "education", "undergraduate", SIG, "small", NOT, 0.5),
        ]
    )
    table = compare_published(pub, attributes, values, COMPARABLE).set_index("compared_value")
    # the files' rule: the pair's BH decision and the cell's BY decision, whatever effect and lift
    assert table.loc["urban", "status"] == "reproduced" and table.loc["urban", "status_stated"] == "not_applicable"
    assert table.loc["basic", "status"] == "reproduced"
    assert table.loc["basic", "status_stated"] == "missed" and "effect is small" in table.loc["basic", "reason_stated"]
    # a compared value absent from the run's tested table was tested and not found
    assert table.loc["graduate", "status"] == "missed"
    assert table.loc["graduate", "reason"].startswith("never observed in the tested table")
    files = comparison_counts(table.reset_index(), by=("scope",)).iloc[0]
    stated = comparison_counts(table.reset_index(), by=("scope",), rule="stated").iloc[0]
    assert (files["reproduced"], files["missed"], files["reproduced_share"]) == (2, 1, pytest.approx(2 / 3))
    assert (stated["reproduced"], stated["missed"], stated["reproduced_share"]) == (0, 2, 0.0)


def test_scope_all_is_untested_when_the_run_pooled_something_else(tmp_path):
    pub = _released(tmp_path, [_released_record("gender", "urbanicity", "large", [("woman", "urban", 3.0)])])
    attributes, values = _run([("m", "all", "gender", "woman", "urbanicity", "urban", SIG, "large", SIG, 3.0)])
    reason = "the run's pooled pass pools en, fr, not the release's ten"
    table = compare_published(pub, attributes, values, PooledScope(False, reason))
    assert table["status"].tolist() == ["untested"] and table["reason"].tolist() == [reason]
    assert compare_published(pub, attributes, values, COMPARABLE)["status"].tolist() == ["reproduced"]


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
