"""Issue #44 item 2: every file a profile names is an input of the stages that read it.

Make's prerequisites and the params stamps covered the profile's text, not the files it names: after an
edited story and extraction in an imported table, a line of ``associations.published`` or a rating in
``associations.human_ratings``, `make associations` ran nothing and kept the old text, extraction and
comparison. Each file now enters the stamp of exactly the stages that read it, by content (a sha256 per
file, cached by size and modification time), and a rerun reads the new content.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import yaml

from storybias.config import input_stamps, params
from storybias.core import artifacts, paths
from storybias.core.fingerprint import FileHashes
from storybias.stages import associations as A
from storybias.stages import extract, generate
from storybias.stages import filter as filter_stage
from storybias.stages.associations import judge as J
from storybias.stages.generate.corpus import story_id_of
from test_associations_stage import _run_files
from test_extract import ScriptedExtractor

ROOT = paths.repo_root()
TEXT = "Once upon a time a child walked to school and met a friend. They laughed all the way home. " * 3
EDITED = "Once upon a time a girl sailed across the sea with her grandmother and found an island. " * 3
RATINGS = "association_id,rater_id,harm,realism\nincome_level|low|education|basic,r1,{harm},yes\n"
MARKERS = "marker_id,language,rater_id,human,automated\nm1,en,r1,{human},5\nm1,en,r2,4,5\n"


def _table(path: Path, hero: str = "woman", text: str = TEXT) -> None:
    """Four English bedtime stories of one model; s0's text and s2's extracted gender can be edited."""
    rows = pd.DataFrame(
        {
            "story": [text, TEXT, TEXT, TEXT],
            "lang": ["en"] * 4,
            "llm": ["lab/model-a"] * 4,
            "uid": [f"s{i}" for i in range(4)],
            "child": ["boy", "girl", "boy", "girl"],
            "hero_gender": ["woman", "man", hero, "man"],
        }
    )
    rows.to_csv(path, index=False)


CORPUS = {
    "format": "table",
    "design": "bedtime",
    "columns": {
        "text": "story",
        "language": "lang",
        "model": "llm",
        "id": "uid",
        "conditions": {"cond_child_gender": "child"},
        "extracted": {"gender": "hero_gender"},
    },
}


def _published_line(compared: str) -> str:
    """One record of StereoTales' released association files: m1's low income -> ``compared`` education."""
    record = {
        "generator_model": "m1",
        "aggregation_dimension": [],
        "aggregation_value": "all",
        "base_attribute": "income_level",
        "compared_attribute": "education",
        "statistics": {"p_value": 0.001, "cramer_v": 0.4, "effect_category": "medium"},
        "associated_values": [
            {
                "base_value": {"name": "income_level", "value": "low income"},
                "compared_value": {"name": "education", "value": compared},
                "statistics": {"p_value": 0.001, "fraction": 0.8, "lift": 2.4},
            }
        ],
    }
    return json.dumps(record) + "\n"


# --- the hashes --------------------------------------------------------------------------------------


def test_an_unchanged_file_is_not_hashed_again_and_an_edit_of_the_same_size_is(tmp_path):
    store, data = tmp_path / "hashes.json", tmp_path / "ratings.csv"
    data.write_text(RATINGS.format(harm=4))
    old = time.time_ns() - 60 * 10**9
    os.utime(data, ns=(old, old))  # written a minute ago: the hash below is trusted next time
    first = FileHashes(store)
    digest = first.sha256(data)
    first.save()
    again = FileHashes(store)
    assert again.sha256(data) == digest and again.hashed == []  # size and time unchanged: not read again
    data.write_text(RATINGS.format(harm=2))  # the same size
    os.utime(data, ns=(old + 10**9, old + 10**9))
    edited = FileHashes(store)
    assert edited.sha256(data) != digest and edited.hashed == [data]
    edited.save()
    fresh = tmp_path / "fresh.csv"
    fresh.write_text("just written")  # modified within the clock's reach of its hash: hashed again next time
    racy = FileHashes(store)
    racy.sha256(fresh)
    racy.save()
    later = FileHashes(store)
    later.sha256(fresh)
    assert later.hashed == [fresh]
    assert set(json.loads(store.read_text())) == {str(fresh.resolve())}, "the store keeps the files asked for"


def test_every_file_setting_of_the_schema_is_read_by_some_stage():
    """A new setting typed InputFile must be given to the stages that read it (the registry's profile_files)."""
    registered = sorted(key for stage in artifacts.STAGES for key in stage.profile_files)
    assert input_stamps.file_settings(params.Profile) == registered
    assert "corpus.path" in registered and "associations.human_ratings" in registered


# --- Make: the stages an edit reruns -----------------------------------------------------------------


def _make(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


# Each stage's Make target, then its executed notebook (under STORYBIAS_DATA, in data/<run>/reports/)
STAND_INS = [
    "data/stories.parquet",
    "data/reports/01_generate.ipynb",
    "data/filtered.parquet",
    "data/reports/02_filter.ipynb",
    "data/extractions.parquet",
    "data/reports/03_extract.ipynb",
    "data/manifest_associations.json",
    "data/reports/04_associations.ipynb",
    "data/manifest_metrics.json",
    "data/reports/05_metrics.ipynb",
    "data/manifest_probes.json",
    "data/reports/06_probes.ipynb",
    "data/manifest_crosslens.json",
    "data/reports/07_crosslens.ipynb",
    "figures/figures.json",
    "data/reports/08_figures.ipynb",
    "figures/explorer.html",
]


def _finish_every_stage(tmp_path: Path, run: str) -> None:
    """Every stage's Make target and executed notebook written, in order (what a finished run leaves)."""
    for name in STAND_INS:
        root, file = name.split("/", 1)
        target = tmp_path / root / run / file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("stand-in")
        time.sleep(0.01)


def _would_run(params_file: Path, env: dict) -> set[str]:
    """The stages `make figures explorer` would run now (after `make stamps`, as every target does first)."""
    stamped = _make("stamps", f"PARAMS={params_file}", env=env)
    assert stamped.returncode == 0, stamped.stderr
    dry = _make("-n", "figures", "explorer", f"PARAMS={params_file}", "STAMPS_FORCE=", env=env)
    assert dry.returncode == 0, dry.stderr
    stages = set(re.findall(r"run-stage (\w+)", dry.stdout))
    return stages | ({"explorer"} if "storybias.cli explorer" in dry.stdout else set())


def test_editing_a_named_file_reruns_exactly_the_stages_that_read_it(tmp_path):
    run = "pytest-inputs"
    table, published = tmp_path / "stories.csv", tmp_path / "associations_global.jsonl"
    ratings, markers = tmp_path / "ratings.csv", tmp_path / "markers.csv"
    _table(table)
    published.write_text(_published_line("basic") + _published_line("graduate").replace('"m1"', '"m2"'))
    ratings.write_text(RATINGS.format(harm=4))
    markers.write_text(MARKERS.format(human=6))
    profile = {
        "run_name": run,
        "corpus": {**CORPUS, "path": str(table), "extractions": "published"},
        "associations": {"published": str(published), "human_ratings": str(ratings)},
        "probes": {"human_validation": {"markers": str(markers)}},
    }
    params_file = tmp_path / "p.yaml"
    params_file.write_text(yaml.safe_dump(profile, sort_keys=False))
    env = dict(os.environ, STORYBIAS_DATA=str(tmp_path / "data"), STORYBIAS_FIGURES=str(tmp_path / "figures"))
    assert _make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    _finish_every_stage(tmp_path, run)
    assert _would_run(params_file, env) == set(), "a finished run is up to date"

    os.utime(ratings)  # touched, not changed: the content decides
    assert _would_run(params_file, env) == set()
    after_04 = {"associations", "crosslens", "figures", "explorer"}
    ratings.write_text(RATINGS.format(harm=2))  # a rating
    assert _would_run(params_file, env) == after_04
    _finish_every_stage(tmp_path, run)
    published.write_text(_published_line("graduate") + _published_line("graduate").replace('"m1"', '"m2"'))
    assert _would_run(params_file, env) == after_04  # a line of the published associations
    _finish_every_stage(tmp_path, run)
    markers.write_text(MARKERS.format(human=2))  # a marker rating: stage 06 and what reads it
    assert _would_run(params_file, env) == {"probes", "crosslens", "figures"}
    _finish_every_stage(tmp_path, run)
    _table(table, text=EDITED)  # a story of the imported table: stage 01 and everything after it
    assert _would_run(params_file, env) == {
        "generate", "filter", "extract", "associations", "metrics", "probes", "crosslens", "figures", "explorer"
    }  # fmt: skip
    stamps = tmp_path / "data" / run / ".params"
    assert str(table) in (stamps / "generate.params").read_text()
    assert str(table) not in (stamps / "extract.params").read_text()  # stage 03 reads corpus.parquet, not the table
    assert str(ratings) in (stamps / "associations.params").read_text()


# --- the rerun reads the new content -----------------------------------------------------------------


def _stamps(p: params.Params) -> dict[str, str]:
    folder = paths.run_dir(p.run_name) / ".params"
    return {path.stem: path.read_text() for path in params.write_stage_stamps(p, folder)}


def _stages_01_to_03(p: params.Params, asked: list[str]) -> pd.DataFrame:
    class Counting(ScriptedExtractor):
        def stream(self, requests):
            asked.extend(r.key.split("|")[0] for r in requests)
            yield from super().stream(requests)

    generate.run(p, progress=False, log=lambda m: None)
    filter_stage.run(p, progress=False)
    extract.run(p, progress=False, engine_factory=Counting, log=lambda m: None)
    return pd.read_parquet(artifacts.extractions_path(p.run_name)).set_index("story_id")


def test_a_rerun_imports_the_edited_story_and_extraction_and_extracts_that_story_only(tmp_path, monkeypatch):
    """An imported table (its extracted gender mapped, storybias' narrative lists extracted with a scripted
    extractor): edit one story's text and another's extraction; only stage 01's stamp changes, and the
    rerun holds the new text and gender, asking the extractor about the edited story alone."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    monkeypatch.setattr("storybias.stages.extract.preflight", lambda spec: (Path("."), "scripted"))
    table = tmp_path / "stories.csv"
    _table(table)
    corpus = {**CORPUS, "path": str(table), "extractions": "rerun", "demographics": "published"}
    extraction = {"retries": 0, "self_consistency_sample": 0, "gold_sample": 0, "prompt_design": "one_answer"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"run_name": "reread", "corpus": corpus, "extract": extraction}))
    p = params.load(path)
    asked: list[str] = []
    before = _stages_01_to_03(p, asked)
    assert len(set(asked)) == 4 and before.loc[story_id_of("s2"), "demo_gender"] == "woman"
    stamps = _stamps(p)

    _table(table, hero="man", text=EDITED)  # s0's story and s2's extracted gender edited
    changed = _stamps(p)
    assert [s for s in stamps if stamps[s] != changed[s]] == ["generate"]
    asked.clear()
    after = _stages_01_to_03(p, asked)
    stories = pd.read_parquet(artifacts.stories_path(p.run_name)).set_index("story_id")
    assert stories.loc[story_id_of("s0"), "text"] == EDITED and stories.loc[story_id_of("s1"), "text"] == TEXT
    assert after.loc[story_id_of("s2"), "demo_gender"] == "man"
    assert set(asked) == {story_id_of("s0")}, "stage 03 extracts the edited story again, reads the rest from its cache"


def test_a_rerun_of_stage_04_reads_the_edited_published_line_and_rating(tmp_path, monkeypatch):
    _run_files(tmp_path / "data", planted=True)
    published, ratings = tmp_path / "associations_global.jsonl", tmp_path / "ratings.csv"
    published.write_text(_published_line("basic"))
    ratings.write_text(RATINGS.format(harm=4))
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["run_name"] = "t"
    raw["associations"] = {"published": str(published), "human_ratings": str(ratings)}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = params.load(path)

    def scripted_judge(items, params, progress=True):
        # Test double for the LLM: every association rated 2, realism yes.
        rows = [J.rating_row(f"{a}#m1#0", '{"harm": 2, "realism": "yes"}') for a in items["association_id"]]
        return pd.DataFrame(rows).reindex(columns=A.RATING_COLUMNS), [{"judge": "m1"}]

    monkeypatch.setattr(J, "run_judges", scripted_judge)

    def compared() -> set[str]:
        table = pd.read_parquet(artifacts.path("t", "published_comparison"))
        return set(table.loc[table["status"] != "not_published", "compared_value"])

    first = A.run(p, progress=False)
    assert compared() == {"basic"} and first["manifest"]["human_n_harmful"] == 1  # the one rating: harm 4
    stamps = _stamps(p)
    published.write_text(_published_line("graduate"))
    ratings.write_text(RATINGS.format(harm=2))
    changed = _stamps(p)
    assert [s for s in stamps if stamps[s] != changed[s]] == ["associations"]
    again = A.run(p, progress=False)
    assert compared() == {"graduate"} and again["manifest"]["human_n_harmful"] == 0
