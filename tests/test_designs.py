"""The design registry (storybias.config.designs): the built-in designs unchanged, and a new design added as
files only (docs/extending.md, "Adding a design") runs through stages 01-02 with a scripted engine."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from fake_engine import FakeEngine
from storybias import summaries
from storybias.config import designs, params, prompts
from storybias.config.plan import STORIES_SCHEMA
from storybias.core import artifacts
from storybias.stages import filter as filter_stage
from storybias.stages import generate
from storybias.stages.filter import langid

STORY = (
    "Once upon a time a small owl lived in a quiet forest near the river. Every night she flew over "
    "the trees and watched the stars with her friends, and in the morning she told them everything."
)


def test_builtin_designs_keep_their_grids_and_columns():
    assert designs.names()[:3] == prompts.DESIGNS == ("stereotales", "bedtime", "occupations")
    sizes = {d: len(designs.design_cells(d)) for d in prompts.DESIGNS}
    assert sizes["bedtime"] == 3 * 27 * 6 * 2 * 3  # BiasedTales-ML's full permutation
    bedtime = designs.design_cells("bedtime")[0]
    assert bedtime.prompt_id == "bedtime/mother/american/christian/wealthy/girl"
    assert list(bedtime.conditions) == [
        "cond_parent_role",
        "cond_nationality",
        "cond_religion",
        "cond_social_class",
        "cond_child_gender",
    ]
    assert designs.all_condition_columns() == prompts.ALL_CONDITION_COLUMNS
    assert generate.stories_schema().equals(STORIES_SCHEMA)
    assert {d: designs.get(d).lens for d in prompts.DESIGNS} == {
        "stereotales": "associations",
        "bedtime": "distributions",
        "occupations": "occupations",
    }
    assert params.default_exclude("stereotales") == ("empty",)
    assert designs.with_lens("occupations", ["bedtime", "occupations", "unknown"]) == ["occupations"]


def _toy_design(root: Path) -> Path:
    folder = root / "params" / "designs" / "toy"
    folder.mkdir(parents=True)
    (folder / "design.yaml").write_text(
        yaml.safe_dump(
            {
                "design": "toy",
                "source": "a test design",
                "dimensions": {"animal": ["cat", "owl"], "mood": ["calm", "brave"]},
                "code": {"exclude": ["empty", "refusal"], "sections": ["narrative"], "lens": "none"},
            },
            sort_keys=False,
        )
    )
    (folder / "en.yaml").write_text(
        yaml.safe_dump(
            {
                "language": "en",
                "template": "Tell a short story about a {{ mood }} {{ animal }}.",
                "values": {"animal": {"cat": "cat", "owl": "owl"}, "mood": {"calm": "calm", "brave": "brave"}},
            }
        )
    )
    return folder.parent


def test_a_new_design_is_files_only_and_runs_stages_01_02(tmp_path, monkeypatch):
    profile = {
        "run_name": "toy",
        "generation": {"models": [{"name": "m", "source": "embedded"}]},
        "designs": {"toy": {"languages": ["en"]}},
    }
    source = tmp_path / "toy.yaml"
    source.write_text(yaml.safe_dump(profile))
    with pytest.raises(params.ParamsError, match="designs.toy: no design 'toy'"):
        params.load(source)

    monkeypatch.setenv("STORYBIAS_DESIGNS", str(_toy_design(tmp_path)))
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(generate, "preflight", lambda spec: (Path("."), "scripted"))
    assert designs.names() == ("stereotales", "bedtime", "occupations", "toy")
    p = params.load(source)
    assert list(p.enabled_designs()) == ["toy"]

    # stage 01: the grid is the product of the dimensions, the prompt the template
    calm_cat = "Tell a short story about a calm cat."

    def engine(spec):
        return FakeEngine(spec, answer=lambda r: "" if r.messages[-1]["content"] == calm_cat else STORY)

    generate.run(p, progress=False, engine_factory=engine, log=lambda m: None)
    stories = pd.read_parquet(artifacts.path("toy", "stories"))
    assert sorted(stories["prompt_id"]) == ["toy/cat/brave", "toy/cat/calm", "toy/owl/brave", "toy/owl/calm"]
    assert set(stories["prompt"]) == {
        f"Tell a short story about a {m} {a}." for a in ("cat", "owl") for m in ("calm", "brave")
    }
    assert {"cond_animal", "cond_mood", *prompts.ALL_CONDITION_COLUMNS} <= set(stories.columns)
    assert stories.set_index("prompt_id").loc["toy/owl/brave", ["cond_animal", "cond_mood"]].tolist() == [
        "owl",
        "brave",
    ]
    assert artifacts.path("toy", "manifest_generate").is_file()

    # stage 02: the design's own rule from design.yaml (empty and refusal exclude; language counted only)
    out = filter_stage.run(p)
    filtered, vsr = out["filtered"], out["vsr"]
    reasons = filtered.set_index("prompt_id")["invalid_reason"]
    assert reasons["toy/cat/calm"] == "empty" and reasons.drop("toy/cat/calm").isna().all()
    assert vsr[["design", "n_stories", "n_valid"]].values.tolist() == [["toy", 4, 3]]
    assert len(summaries.valid_stories(filtered)) == 3
    assert pd.read_parquet(artifacts.filtered_path("toy"))["cond_animal"].notna().all()
    manifest = pd.read_json(artifacts.path("toy", "manifest_filter"), typ="series")
    assert manifest["n_valid"] == 3 and manifest["invalid_reasons"] == {"empty": 1}

    # what stage 03 would ask for, and a profile that names the design's rule itself
    assert designs.get("toy").sections == ("narrative",)
    from storybias.stages.extract.answers import design_sections

    assert design_sections(p.profile.extract, "toy") == ("narrative",)
    profile["filter"] = {"exclude": {"toy": []}}
    profile["extract"] = {"sections": {"toy": ["demographics"]}}
    source.write_text(yaml.safe_dump(profile))
    q = params.load(source)
    assert design_sections(q.profile.extract, "toy") == ("demographics",)
    assert langid.apply_rules(filtered, exclude=q.filter.exclude.model_dump())["is_valid"].all()
