"""Importing StereoTales' released corpus (issue #28): stage 01 imports, stage 03 maps the published
extractions, stage 04 finds the planted association; bad input stops stage 01 naming file, row and column.

The shards are synthetic, written as the release's exporter wrote it (storybias.tools.synthetic_corpus): two
models answering the same prompts (ids shared), some answers missing, every column with the types of its
folder's first row (null-typed scenario columns in additional_en), French prompted values, both published
spellings, `{}` and unparsable extractions, additional_en prompts with several stories each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from fake_engine import FakeEngine
from storybias.config import checks, params
from storybias.core import artifacts
from storybias.evidence.released_associations import POOL_FILE, RELEASE_LANGUAGE, load_associations
from storybias.evidence.stereotales_taxonomy import PublishedFormatError, canonical_value
from storybias.stages import associations, extract, generate
from storybias.stages import filter as filter_stage
from storybias.stages.associations.comparison import comparison_counts
from storybias.stages.generate.corpus import CorpusError, story_id_of
from storybias.tools.synthetic_corpus import write_synthetic_corpus

MODELS = ("anthropic/claude-opus-4-6", "azure_ai/gpt-4o")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def _profile(tmp_path: Path, corpus: dict, **extra) -> params.Params:
    path = tmp_path / "corpus.yaml"
    path.write_text(yaml.safe_dump({"run_name": "corpus-test", "corpus": {"format": "stereotales", **corpus}, **extra}))
    return params.load(path)


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stereotales")
    write_synthetic_corpus(
        root, models=MODELS, samples_per_folder=144, additional_outputs=3, shard_rows=100, seed=3, skipped_share=0.03
    )
    return root


def _released(root: Path) -> pd.DataFrame:
    """Every released row, with its file and the story id the import gives it (model, folder, output id)."""
    frames = [pd.read_parquet(f).assign(_file=str(f), _folder=f.parts[-3]) for f in sorted(root.rglob("*.parquet"))]
    released = pd.concat(frames, ignore_index=True)
    folder = released["_folder"].map(lambda f: RELEASE_LANGUAGE.get(f, f))
    keys = zip(released["generator_model"], folder, released["output_id"])
    return released.assign(story_id=[story_id_of(*k) for k in keys])


def test_a_corpus_profile_needs_no_generation_or_designs(tmp_path, corpus_root):
    p = _profile(tmp_path, {"path": str(corpus_root), "languages": ["en", "fr"]})
    assert p.corpus.extractions == "published" and not p.corpus.additional_en
    assert list(p.enabled_designs()) == ["stereotales"] and p.designs.stereotales.languages == ["en", "fr"]
    path = tmp_path / "both.yaml"
    path.write_text(
        yaml.safe_dump({"corpus": {"format": "stereotales", "path": str(corpus_root)}, "designs": {"bedtime": {}}})
    )
    with pytest.raises(params.ParamsError, match="designs: a profile with corpus"):
        params.load(path)


def test_corpus_keys_are_checked_before_any_work(tmp_path, corpus_root):
    with pytest.raises(params.ParamsError, match=r"corpus\.attributes: hair_colour not one of StereoTales' dimensions"):
        _profile(tmp_path, {"path": str(corpus_root), "attributes": ["hair_colour"]})
    with pytest.raises(
        params.ParamsError, match=r"corpus\.columns, corpus\.design and corpus\.values are for format: table"
    ):
        _profile(tmp_path, {"path": str(corpus_root), "values": {"cond_value": {"M": "man"}}})
    with pytest.raises(params.ParamsError, match=r"corpus\.sample_per"):
        _profile(tmp_path, {"path": str(corpus_root), "sample": 5, "sample_per": "scenario"})


def test_import_is_one_story_per_row_with_canonical_keys(tmp_path, data_dir, corpus_root):
    p = _profile(tmp_path, {"path": str(corpus_root), "additional_en": True})
    result = generate.run(p, progress=False, log=lambda m: None)
    stories = pd.read_parquet(artifacts.path(p.run_name, "stories"))
    source = pd.read_parquet(artifacts.path(p.run_name, "corpus"))
    released = _released(corpus_root)
    # the models answered the same prompts: their output ids recur, and each row is still one story
    assert released.groupby("output_id")["generator_model"].nunique().max() == len(MODELS)
    assert released["generator_model"].value_counts().nunique() > 1, "some answers are missing"
    assert len(stories) == len(released) and stories["story_id"].is_unique
    assert set(stories["story_id"]) == set(released["story_id"])
    assert (stories["design"] == "stereotales").all() and set(stories["model"]) == set(MODELS)
    # French prompted values ('homme') become the canonical keys of attribute_value_key
    fr = stories[stories["language"] == "fr"]
    assert set(fr["cond_value"]) == {"man", "woman", "non_binary"} and set(fr["cond_attribute"]) == {"gender"}
    joined = stories.merge(source, on="story_id")
    extra = joined[joined["additional_en"]]
    in_extra = released[released["_folder"] == "additional_en"]
    assert len(extra) == len(in_extra) and (extra["language"] == "en").all() and extra["cond_scenario"].isna().all()
    assert extra["prompt_id"].str.contains("/additional_en:").all()
    # a model's several stories of one additional_en prompt are numbered 0, 1, 2
    assert extra.groupby(["model", "sample_id"])["sample"].apply(sorted).map(len).max() == 3
    assert set(extra["sample"]) == {0, 1, 2}
    scenario = joined[~joined["additional_en"]]
    assert scenario["cond_scenario"].notna().all() and scenario["cond_scenario_category"].notna().all()
    # the text and the published extraction are the release's, row for row
    by_story = released.set_index("story_id").loc[joined["story_id"]]
    assert (joined["text"].to_numpy() == by_story["story"].to_numpy()).all()
    assert (joined["published_extraction"].to_numpy() == by_story["extracted_attributes_json"].to_numpy()).all()
    assert (joined["model"].to_numpy() == by_story["generator_model"].to_numpy()).all()
    assert result.manifest["mode"] == "import" and result.manifest["n_additional_en"] == len(in_extra)
    assert result.manifest["machine"] is None, "no model ran, and stage-times says so"


def test_a_null_typed_column_imports(tmp_path, data_dir):
    """The exporter typed each folder after its first row: a column empty there is Arrow's null type."""
    root = tmp_path / "null"
    files = write_synthetic_corpus(root, models=MODELS, folders=("en", "additional_en"), samples_per_folder=12, seed=2)
    extra = pq.read_schema(files[-1])
    assert extra.field("scenario_key").type == pa.null() and extra.field("extraction_score").type == pa.int64()
    table = pq.read_table(files[0])
    for column in ("scenario_group", "character", "user_prompt"):  # a language folder whose first row lacks them
        table = table.set_column(table.schema.get_field_index(column), column, pa.nulls(len(table)))
    _write(files[0], table)
    assert pq.read_schema(files[0]).field("user_prompt").type == pa.null()
    p = _profile(tmp_path, {"path": str(root), "additional_en": True})
    generate.run(p, progress=False, log=lambda m: None)
    stories = pd.read_parquet(artifacts.path(p.run_name, "stories"))
    assert len(stories) == sum(pq.read_metadata(f).num_rows for f in files)
    assert stories.loc[~stories["prompt_id"].str.contains("additional_en"), "prompt"].isna().all()


def test_a_repeated_story_is_refused_naming_both_rows(tmp_path, data_dir):
    root = tmp_path / "repeated"
    files = write_synthetic_corpus(root, models=MODELS, folders=("en",), samples_per_folder=60, shard_rows=50, seed=4)
    first, second = pq.read_table(files[0]), pq.read_table(files[1])
    assert second.column("generator_model")[3].as_py() == first.column("generator_model")[7].as_py() == MODELS[0]
    repeated = first.column("output_id")[7].as_py()
    ids = second.column("output_id").to_pylist()
    ids[3] = repeated  # the same model's story twice in one folder
    _write(files[1], second.set_column(second.schema.get_field_index("output_id"), "output_id", pa.array(ids)))
    p = _profile(tmp_path, {"path": str(root)})
    expected = (
        rf"generator_model '{MODELS[0]}', folder 'en', output_id '{repeated}' appears twice "
        rf"\({files[0]}: row 7; {files[1]}: row 3\)"
    )
    with pytest.raises(CorpusError, match=expected):
        generate.run(p, progress=False, log=lambda m: None)


def test_subsets_and_a_seeded_sample(tmp_path, data_dir, corpus_root):
    p = _profile(
        tmp_path,
        {"path": str(corpus_root), "languages": ["fr"], "models": [MODELS[1]], "sample": 50, "seed": 5},
    )
    first = generate.plan(p)
    assert len(first) == 50 and set(first["language"]) == {"fr"} and set(first["model"]) == {MODELS[1]}
    assert first["story_id"].equals(generate.plan(p)["story_id"])
    bigger = _profile(tmp_path, {"path": str(corpus_root), "languages": ["fr"], "sample": 80, "seed": 5})
    both = generate.plan(bigger)
    assert set(first["story_id"]) <= set(both["story_id"])  # a larger sample holds a smaller
    # the models share their output ids: where both answered, they keep the same prompts' stories
    answered = set(
        _released(corpus_root)
        .query("_folder == 'fr'")
        .groupby("output_id")["generator_model"]
        .nunique()
        .loc[lambda n: n == 2]
        .index
    )
    kept = [set(both.loc[both["model"] == m, "output_id"]) & answered for m in MODELS]
    # one ranking for both: the complete model's kept prompts are among those of the model with gaps
    assert kept[0] <= kept[1] and len(kept[0]) > 70


def test_the_sample_per_prompted_value(tmp_path, data_dir, corpus_root):
    p = _profile(tmp_path, {"path": str(corpus_root), "sample": 20, "sample_per": "prompted_value"})
    planned = generate.plan(p)
    released = _released(corpus_root).query("_folder != 'additional_en'")
    value = released["attribute_value_key"].map(lambda label: canonical_value("gender", label))
    available = released.assign(value=value).groupby(["generator_model", "_folder", "value"]).size()
    per_value = planned.groupby(["model", "language", "cond_value"]).size()
    assert per_value.to_dict() == available.clip(upper=20).to_dict() and available.min() > 20
    per_cell = _profile(tmp_path, {"path": str(corpus_root), "sample": 20})
    assert (generate.plan(per_cell).groupby(["model", "language"]).size() == 20).all()


def test_additional_en_is_left_out_unless_asked(tmp_path, data_dir, corpus_root):
    released = _released(corpus_root)
    default = generate.plan(_profile(tmp_path, {"path": str(corpus_root)}))
    assert not default["additional_en"].any() and len(default) == (released["_folder"] != "additional_en").sum()
    pooled = generate.plan(_profile(tmp_path, {"path": str(corpus_root), "additional_en": True}))
    assert pooled["additional_en"].sum() == (released["_folder"] == "additional_en").sum()
    assert set(pooled.loc[pooled["additional_en"], "language"]) == {"en"}  # pooled with English


def test_published_extractions_keep_failures_and_the_prompted_value(tmp_path, data_dir, corpus_root):
    p = _profile(tmp_path, {"path": str(corpus_root)})
    generate.run(p, progress=False, log=lambda m: None)
    filter_stage.run(p)
    out = extract.run(p, progress=False, log=lambda m: None)
    extractions = out["extractions"]
    source = pd.read_parquet(artifacts.path(p.run_name, "corpus")).set_index("story_id")
    broken = source["published_extraction"].map(lambda t: t == "{}" or not t.endswith("}"))
    assert broken.sum() > 0 and out["published"]["n_parse_failed"] == broken.sum()
    assert set(extractions.loc[~extractions["parse_ok"], "story_id"]) == set(broken[broken].index)
    assert out["published"]["profiles"]["empty"] + out["published"]["profiles"]["unparsable"] == broken.sum()
    stories = pd.read_parquet(artifacts.path(p.run_name, "stories")).set_index("story_id")
    rows = extractions.set_index("story_id")
    assert (rows["demo_gender"] == stories.loc[rows.index, "cond_value"]).all()  # the prompted value, always
    # both published spellings map to the one key
    raw = rows.loc[rows["parse_ok"], "raw"].map(json.loads)
    spelled = raw.map(lambda d: d["geographic_origin"]).str.startswith("north america")
    assert (rows.loc[spelled[spelled].index, "demo_geographic_origin"] == "north_america").all()
    assert {"trades and manual labor", "trades and manual labor (e.g. construction, manufacturing)"} <= set(
        raw.map(lambda d: d["professional_field"])
    )
    manifest = json.loads(artifacts.path(p.run_name, "manifest_extract").read_text())
    assert manifest["mode"] == "published" and manifest["n_parse_failed"] == broken.sum()
    assert manifest["machine"] is None


def test_stage_04_recovers_the_planted_association(tmp_path, data_dir, corpus_root):
    # 20 simulations per lift in the power report (200 by default): it took 82 of this test's 84 s
    settings = {"max_resamples": 2000, "power_simulations": 20}
    p = _profile(tmp_path, {"path": str(corpus_root)}, associations=settings)
    generate.run(p, progress=False, log=lambda m: None)
    filter_stage.run(p)
    extract.run(p, progress=False, log=lambda m: None)
    associations.run(p, progress=False, engine_factory=lambda spec: FakeEngine(spec, answer=lambda r: "2"))
    simulated = pd.read_parquet(artifacts.path(p.run_name, "associations_power"))["n_simulations"]
    assert set(simulated[simulated > 0]) == {20}, "rows that simulated none say 0"
    values = pd.read_parquet(artifacts.path(p.run_name, "associations_values"))
    found = values[values["significant"] & (values["scope"] == "all")]
    pairs = set(zip(found["model"], found["base_value"], found["compared_attribute"], found["compared_value"]))
    for model in MODELS:
        assert (model, "man", "professional_field", "trades_manual_labor") in pairs
        assert (model, "woman", "professional_field", "healthcare_medicine") in pairs
    planted = {"professional_field"}
    assert set(found["compared_attribute"]) <= planted, "only the planted dimension is associated"


def _write(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("attribute_value_key", "wizard", "column attribute_value_key: gender has no value 'wizard'"),
        ("target_attribute", "hair_colour", "column target_attribute: target attribute 'hair_colour'"),
        ("scenario_key", "flying to the moon", "column scenario_key: no scenario 'flying to the moon'"),
        ("language", "xx", "column language: language 'xx'"),
        ("extracted_attributes_json", '{"gender": "wizard"}', "column extracted_attributes_json: gender has no value"),
    ],
)
def test_a_bad_row_stops_stage_01_naming_file_row_and_column(tmp_path, data_dir, column, value, message):
    root = tmp_path / "bad"
    files = write_synthetic_corpus(root, models=MODELS[:1], folders=("en",), samples_per_folder=20, seed=1)
    table = pq.read_table(files[0])
    broken = table.column(column).to_pylist()
    broken[7] = value
    _write(files[0], table.set_column(table.schema.get_field_index(column), column, pa.array(broken)))
    p = _profile(tmp_path, {"path": str(root)})
    with pytest.raises(CorpusError, match=f"{files[0]}: row 7, {message}"):
        generate.run(p, progress=False, log=lambda m: None)
    assert not artifacts.path(p.run_name, "stories").exists()


def test_bad_files_and_names_are_refused_before_any_work(tmp_path, data_dir, corpus_root):
    (tmp_path / "empty").mkdir()
    with pytest.raises(params.ParamsError, match="holds no .parquet file"):
        _profile(tmp_path, {"path": str(tmp_path / "empty")})
    fake = tmp_path / "fake" / "en" / "stories" / "eval-00000-of-00001.parquet"
    fake.parent.mkdir(parents=True)
    fake.write_text("sample_id,story\n1,hello\n")
    with pytest.raises(params.ParamsError, match=f"{fake} is not a parquet file"):
        _profile(tmp_path, {"path": str(tmp_path / "fake")})
    table = pq.read_table(next(corpus_root.rglob("*.parquet"))).drop(["story"])
    short = _write(tmp_path / "short" / "x.parquet", table)
    with pytest.raises(params.ParamsError, match=f"{short} lacks column\\(s\\) story"):
        _profile(tmp_path, {"path": str(short)})
    p = _profile(tmp_path, {"path": str(corpus_root), "models": ["openai/gpt-5"]})
    with pytest.raises(CorpusError, match="corpus.models: openai/gpt-5 not in the corpus"):
        generate.run(p, progress=False, log=lambda m: None)


def test_agreement_with_published_counts_each_side_and_leaves_out_the_prompted_field():
    from storybias.config.designs import dimensions
    from storybias.stages.extract.released_profiles import agreement_with_published

    def frame(values: dict[str, list[str]]) -> pd.DataFrame:
        rows = {"story_id": ["a", "b", "c", "d"], "parse_ok": [True, True, True, False]}
        for d in dimensions():
            rows[f"demo_{d}"] = values.get(d, ["unknown"] * 4)
        return pd.DataFrame(rows)

    ours = frame({"age": ["adult", "child", "unknown", "adult"], "gender": ["man", "man", "woman", "man"]})
    theirs = frame({"age": ["adult", "senior", "senior", "adult"], "gender": ["man", "woman", "woman", "man"]})
    stories = pd.DataFrame(
        {"story_id": list("abcd"), "language": ["en", "en", "fr", "fr"], "cond_attribute": ["gender"] * 4}
    )
    table = agreement_with_published(ours, theirs, stories).set_index(["language", "field"])
    age = table.loc[("all", "age")]
    assert age["n"] == 3 and age["n_known"] == 3  # story d did not parse on our side
    assert age["accuracy"] == pytest.approx(1 / 3) and age["ours_unknown"] == pytest.approx(1 / 3)
    assert ("all", "gender") in table.index and table.loc[("all", "gender"), "n"] == 0  # the prompted field
    assert table.loc[("en", "age"), "accuracy"] == pytest.approx(1 / 2)
    assert table.loc[("all", "income_level"), "n_known"] == 0


def test_the_shipped_profile_reads_a_downloaded_corpus(tmp_path, corpus_root):
    shipped = yaml.safe_load(Path("params/stereotales-published.yaml").read_text())
    shipped["corpus"]["path"] = str(corpus_root)
    (tmp_path / "published.yaml").write_text(yaml.safe_dump(shipped))
    p = params.load(tmp_path / "published.yaml")
    assert p.corpus.extractions == "published" and p.run_name == "published"
    shipped["corpus"]["path"] = str(tmp_path / "not-downloaded")
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(shipped))
    with pytest.raises(params.ParamsError, match="never downloads: fetch the corpus first.*huggingface-cli download"):
        params.load(tmp_path / "missing.yaml")


def test_a_corpus_run_keeps_up_only_the_models_its_stages_run(tmp_path, corpus_root):
    """The shipped corpus profile names a generator and an extractor, but stage 01 imports the stories and
    stage 03 maps the published extractions: ``with-servers`` keeps up the judge alone (it used to count
    the generator and the extractor too), and the CPU preload is checked for the judge alone."""
    shipped = yaml.safe_load(Path("params/stereotales-published.yaml").read_text())
    shipped["corpus"]["path"] = str(corpus_root)
    (tmp_path / "published.yaml").write_text(yaml.safe_dump(shipped))
    published = params.load(tmp_path / "published.yaml")
    assert published.generation.models and published.extract.models
    kept = checks.local_models(published.profile)
    assert kept == list(published.associations.judge.models) and len(kept) == 1
    shipped["corpus"]["extractions"] = "rerun"
    (tmp_path / "rerun.yaml").write_text(yaml.safe_dump(shipped))
    rerun = params.load(tmp_path / "rerun.yaml")
    assert checks.local_models(rerun.profile) == [*rerun.extract.models, *rerun.associations.judge.models]
    default = params.load(Path("params/default.yaml"))
    assert [m.name for m in checks.local_models(default.profile)] == [
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b",
    ]


def _association_record(model: str, scope: str, base: str, compared: str, cells: list[tuple[str, str]]) -> dict:
    """One line of a released association file (associations_global / associations_by_language)."""
    return {
        "generator_model": model,
        "aggregation_dimension": ["language"] if scope != "all" else [],
        "aggregation_value": scope,
        "base_attribute": base,
        "compared_attribute": compared,
        "statistics": {"p_value": 0.001 if cells else 0.6, "cramer_v": 0.4 if cells else -1, "effect_category": "N/A"},
        "associated_values": [
            {
                "base_value": {"name": base, "value": b},
                "compared_value": {"name": compared, "value": c},
                "statistics": {"p_value": 0.001, "fraction": 0.6, "lift": 2.5},
            }
            for b, c in cells
        ],
        "sample_ids": [],
    }


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _planted_published(root: Path) -> Path:
    """Released association files with known outcomes on the synthetic corpus (see the test), their global
    pass pooling what the run pools (its two languages: pool.json, as a storybias export writes it)."""
    a, b = MODELS
    root.mkdir(parents=True, exist_ok=True)
    (root / POOL_FILE).write_text(
        json.dumps({"languages": ["en", "fr"], "additional_en": False, "attributes": None, "sample": None})
    )
    trades, health = ("man", "trades and manual labor"), ("woman", "healthcare and medicine")
    _write_jsonl(
        root / "associations_global" / f"{a.replace('/', '_')}__global.jsonl",
        [
            _association_record(
                a, "all", "gender", "professional_field", [trades, health, ("man", "healthcare and medicine")]
            ),
            _association_record(a, "all", "gender", "age", [("woman", "senior (65+)")]),
            _association_record(a, "all", "gender", "political_orientation", []),  # a non-significant pair
        ],
    )
    _write_jsonl(
        root / "associations_by_language" / f"{b.replace('/', '_')}__by_language.jsonl",
        [
            _association_record(b, "fr", "gender", "professional_field", [health]),
            _association_record(b, "du", "gender", "professional_field", [trades]),  # Dutch: not in the run
        ],
    )
    _write_jsonl(
        root / "associations_global" / "openai_gpt-5__global.jsonl",
        [_association_record("openai/gpt-5", "all", "gender", "professional_field", [trades])],
    )
    return root


def test_the_published_comparison_counts_per_model_and_scope(tmp_path, data_dir, corpus_root):
    published = _planted_published(tmp_path / "published")
    p = _profile(
        tmp_path,
        {"path": str(corpus_root), "languages": ["en", "fr"]},
        # a coarse power report (20 simulations per lift): this test is about the published comparison
        associations={"max_resamples": 2000, "published": str(published), "power_simulations": 20},
    )
    generate.run(p, progress=False, log=lambda m: None)
    filter_stage.run(p)
    extract.run(p, progress=False, log=lambda m: None)
    result = associations.run(p, progress=False, engine_factory=lambda spec: FakeEngine(spec, answer=lambda r: "2"))
    a, b = MODELS
    attributes, values = result["attributes"], result["values"]
    # the preconditions of the planted outcomes, read from the run's own tests
    age = attributes[
        (attributes["model"] == a) & (attributes["scope"] == "all") & (attributes["compared_attribute"] == "age")
    ]
    assert len(age) == 1 and not age["retained"].iloc[0], "gender x age is tested and not retained"
    cell = values[
        (values["model"] == a)
        & (values["scope"] == "all")
        & (values["base_value"] == "man")
        & (values["compared_value"] == "healthcare_medicine")
    ]
    assert len(cell) == 1 and not cell["significant"].iloc[0], "man x healthcare is a tested cell, not significant"

    table = pd.read_parquet(artifacts.path(p.run_name, "published_comparison"))
    counts = comparison_counts(table[table["source"] == "released"]).set_index(["model", "scope"])
    statuses = ["reproduced", "missed", "underpowered", "untested"]
    got = {k: tuple(int(v) for v in row) for k, row in counts[statuses].iterrows()}
    assert got == {
        # the two planted cells; man x healthcare not significant, gender x age not retained: of those two
        # non-reproduced cells one was within the run's power (missed), one not (underpowered, issue #57)
        (a, "all"): (2, 1, 1, 0),
        (b, "fr"): (1, 0, 0, 0),
        (b, "nl"): (0, 0, 0, 1),  # the release's du is storybias' nl, absent from this run
        ("openai/gpt-5", "all"): (0, 0, 0, 1),  # a published model the corpus does not hold
    }
    not_seen = table[table["status"].isin(["missed", "underpowered"])]
    assert ((not_seen["run_power"] >= 0.8) == (not_seen["status"] == "missed")).all()
    reasons = table.set_index(["model", "scope", "compared_value"])["reason"]
    assert reasons[(a, "all", "senior")].startswith("attribute pair not BH-significant")
    assert reasons[("openai/gpt-5", "all", "trades_manual_labor")] == "the model is not in the run"
    # b's pooled planted cells are significant, and b published no global file: not published for b
    mine = table[(table["status"] == "not_published") & (table["model"] == b) & (table["scope"] == "all")]
    assert {("man", "trades_manual_labor"), ("woman", "healthcare_medicine")} <= set(
        zip(mine["base_value"], mine["compared_value"])
    )
    assert not len(
        table[
            (table["status"] == "not_published")
            & (table["model"] == a)
            & (table["scope"] == "all")
            & (table["compared_value"] == "trades_manual_labor")
        ]
    )
    manifest = json.loads(artifacts.path(p.run_name, "manifest_associations").read_text())
    summary = manifest["published"]
    assert summary["n_published"] == 7 and summary["status_files_rule"]["reproduced"] == 3
    assert summary["pooled_scope_compared"], "the files' pool.json pools the run's two languages"


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"line 1: field \(record\): not valid JSON"),
        (
            json.dumps(
                {
                    "generator_model": "m",
                    "aggregation_dimension": [],
                    "aggregation_value": "all",
                    "base_attribute": "g",
                    "compared_attribute": "a",
                    "statistics": {"p_value": 0.6, "cramer_v": -1, "effect_category": "N/A"},
                }
            ),
            r"line 1: field associated_values: missing or not a list",
        ),
    ],
)
def test_a_malformed_association_file_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "m__global.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(PublishedFormatError, match=rf"m__global\.jsonl: {message}"):
        load_associations(path)


def test_an_unknown_label_or_an_empty_folder_is_refused(tmp_path):
    record = _association_record("m", "all", "gender", "professional_field", [("man", "astronaut")])
    _write_jsonl(tmp_path / "a" / "m__global.jsonl", [record])
    with pytest.raises(PublishedFormatError, match=r"line 1: field associated_values\[0\]\.compared_value\.value: "):
        load_associations(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PublishedFormatError, match="no \\*.jsonl association file"):
        load_associations(tmp_path / "empty")


def test_published_demographics_beside_storybias_narrative_lists():
    """corpus.demographics: published (issue #30, the three lenses on an imported corpus): the release's
    profile, storybias' adjectives and settings, parsed only where both sides parsed."""
    from storybias.config.designs import dimensions
    from storybias.stages.extract.released_profiles import with_published_demographics

    def frame(gender: list[str], parsed: list[bool], adjectives: list[list[str]]) -> pd.DataFrame:
        rows = {"story_id": ["a", "b", "c"], "parse_ok": parsed, "extractors": [["m"]] * 3}
        rows |= {f"demo_{d}": ["unknown"] * 3 for d in dimensions()}
        rows |= {"demo_gender": gender, "protagonist_gender": gender, "protagonist_gender_fine": gender}
        return pd.DataFrame({**rows, "adjectives_en": adjectives})

    ours = frame(["man", "man", "woman"], [True, True, False], [["brave"], ["kind"], []])
    theirs = frame(["woman", "man", "woman"], [True, False, True], [[], [], []]).iloc[::-1]  # another order
    merged = with_published_demographics(ours, theirs).set_index("story_id")
    assert list(merged["demo_gender"]) == ["woman", "man", "woman"]  # the release's, matched by story
    assert list(merged["adjectives_en"]) == [["brave"], ["kind"], []]  # storybias' own
    assert list(merged["parse_ok"]) == [True, False, False]
    assert merged.loc["a", "extractors"] == ["m", "published"]


def test_published_demographics_need_an_extraction(tmp_path, corpus_root):
    with pytest.raises(params.ParamsError, match=r"corpus.demographics: published needs corpus.extractions: rerun"):
        _profile(tmp_path, {"path": str(corpus_root), "demographics": "published"})
    for extractions in ("rerun", "both"):
        p = _profile(tmp_path, {"path": str(corpus_root), "extractions": extractions, "demographics": "published"})
        assert p.corpus.demographics == "published"


def test_the_three_lens_profile_names_what_each_lens_reads(tmp_path, corpus_root):
    """params/stereotales-three-lenses.yaml: published demographics, storybias' narrative lists on a
    sample, the BiasedTales-ML comparison by prompted gender, and the gender probe on gender-prompted
    stories; it loads once the corpus is there."""
    shipped = yaml.safe_load(Path("params/stereotales-three-lenses.yaml").read_text())
    shipped["corpus"]["path"] = str(corpus_root)
    (tmp_path / "lenses.yaml").write_text(yaml.safe_dump(shipped))
    p = params.load(tmp_path / "lenses.yaml")
    assert (p.corpus.extractions, p.corpus.demographics) == ("rerun", "published") and p.corpus.sample
    # sized to its lenses: the gender-prompted stories, a sample per prompted value, no additional_en
    assert p.corpus.attributes == ["gender"] and p.corpus.sample_per == "prompted_value"
    assert not p.corpus.additional_en
    assert p.extract.sections.stereotales == ["narrative", "markers"]  # the release has the demographics
    (comparison,) = p.metrics.comparisons
    assert (comparison.design, comparison.condition) == ("stereotales", "value")
    assert comparison.where == {"attribute": "gender"}
    assert p.crosslens_comparison() == comparison.name
    assert p.probes.stereotales_attribute == "gender" and p.probes.per_model_genre == "stereotales"
