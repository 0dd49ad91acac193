"""Every input file refused with its file and row (issue #44, items 4, 5 and 8): one reader per input file,
shared by check-params and the stage; a wrong type is an error, never text; long values shortened in
messages; published files' repeats, unknown scopes and out-of-range statistics refused; large stories read.

Each test first reproduces a failure a hostile user found on a clean clone, then checks the fix."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from storybias.config import params
from storybias.core import artifacts, paths
from storybias.core.inputs import MAX_MESSAGE, MAX_SHOWN, TableFileError, read_text_columns, shown, table_header
from storybias.evidence import questions
from storybias.evidence.harm_ratings import load_human_ratings, validate_human_ratings
from storybias.evidence.released_associations import POOL_FILE, load_associations
from storybias.evidence.stereotales_taxonomy import PublishedFormatError
from storybias.stages import extract, generate
from storybias.stages import filter as filter_stage
from storybias.stages.generate.corpus import CorpusError
from storybias.tools.synthetic_corpus import write_synthetic_corpus

MODEL = "anthropic/claude-opus-4-6"
TEXT = "Once upon a time a child walked to school and met a friend. They laughed all the way home. " * 3


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def _load(tmp_path: Path, corpus: dict, name: str = "p.yaml") -> params.Params:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"run_name": "inputs", "corpus": corpus}))
    return params.load(path)


# --- the released StereoTales shards --------------------------------------------------------------


def _shard(root: Path, column: str | None = None, value=None, folder: str = "en") -> Path:
    """One shard of 20 stories as the exporter writes it (10 prompts answered by two models: each
    ``output_id`` twice); row 7's ``column`` set to ``value``."""
    (file,) = write_synthetic_corpus(root, folders=(folder,), samples_per_folder=10, seed=1)
    if column is not None:
        table = pq.read_table(file)
        values = table.column(column).to_pylist()
        values[7] = value
        kind = table.schema.field(column).type
        table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, type=kind))
        pq.write_table(table, file)
    return file


def test_a_null_extraction_is_kept_and_counted_not_a_type_error(tmp_path, data_dir):
    """Was: TypeError (the JSON object must be str, not float) in stage 01's check of the profiles."""
    _shard(tmp_path / "null", "extracted_attributes_json", None)
    p = _load(tmp_path, {"format": "stereotales", "path": str(tmp_path / "null")})
    generate.run(p, progress=False, log=lambda m: None)
    filter_stage.run(p)
    out = extract.run(p, progress=False, log=lambda m: None)
    assert out["published"]["profiles"]["missing"] == 1  # a null: no extraction recorded, kept and counted
    extractions = out["extractions"]
    assert (~extractions["parse_ok"]).sum() == out["published"]["n_parse_failed"] >= 1


def test_deep_json_and_a_non_string_label_name_the_row(tmp_path, data_dir):
    """Was: RecursionError (the check caught only KeyError)."""
    deep = '{"gender": ' + "[" * 100_000 + "]" * 100_000 + "}"
    file = _shard(tmp_path / "deep", "extracted_attributes_json", deep)
    p = _load(tmp_path, {"format": "stereotales", "path": str(tmp_path / "deep")})
    with pytest.raises(CorpusError, match=rf"{file}: row 7, column extracted_attributes_json: .*nested too deeply"):
        generate.plan(p)


@pytest.mark.parametrize("name", ["NaN", "null", " None "])
def test_a_missing_value_is_no_model_name(tmp_path, data_dir, name):
    """Was: accepted, a run with a model called 'NaN' or 'null'."""
    file = _shard(tmp_path / "named", "generator_model", name)
    p = _load(tmp_path, {"format": "stereotales", "path": str(tmp_path / "named")})
    with pytest.raises(CorpusError, match=rf"{file}: row 7, column generator_model: '{name}' is a missing value"):
        generate.plan(p)


def test_a_folder_is_skipped_only_when_its_footer_shows_other_languages(tmp_path, data_dir):
    """Was: a folder named `xx` holding English rows skipped, then 'no file left after corpus.languages'."""
    root = tmp_path / "renamed"
    _shard(root)
    (root / "en").rename(root / "xx")
    _shard(root / "fr-part", folder="fr")  # a French folder: its footer proves it, skipped for [en]
    p = _load(tmp_path, {"format": "stereotales", "path": str(root), "languages": ["en"]})
    plan = generate.plan(p)
    assert len(plan) == 20 and set(plan["language"]) == {"en"}
    assert {Path(f).parts[-3] for f in plan["source_file"]} == {"xx"}
    with pytest.raises(params.ParamsError, match=r"no shard holds a language of corpus\.languages \['en'\]"):
        _load(tmp_path, {"format": "stereotales", "path": str(root / "fr-part"), "languages": ["en"]}, "fr.yaml")


def test_a_released_column_of_another_type_is_refused_before_any_work(tmp_path, data_dir):
    file = _shard(tmp_path / "typed")
    table = pq.read_table(file)
    table = table.set_column(table.schema.get_field_index("output_id"), "output_id", pa.array(range(len(table))))
    pq.write_table(table, file)
    with pytest.raises(params.ParamsError, match=rf"{file}: column output_id: stored as int64, not text"):
        _load(tmp_path, {"format": "stereotales", "path": str(tmp_path / "typed")})


def test_a_long_value_is_shortened_in_the_message(tmp_path, data_dir):
    """Was: an error line of 1 MB (the whole value quoted)."""
    file = _shard(tmp_path / "long", "language", "x" * 1_000_000)
    p = _load(tmp_path, {"format": "stereotales", "path": str(tmp_path / "long")})
    with pytest.raises(CorpusError) as err:
        generate.plan(p)
    message = str(err.value)
    assert message.startswith(f"{file}: row 7, column language: language 'xxx") and "(1,000,000 characters)" in message
    assert len(message) < len(str(file)) + 50 + MAX_MESSAGE
    assert len(shown("y" * 10_000)) <= MAX_SHOWN + 30 and shown(3) == "3"


# --- story tables: one reader, no silent conversion, any story length ---------------------------

COLUMNS = {
    "text": "story",
    "language": "lang",
    "model": "llm",
    "id": "uid",
    "conditions": {"cond_child_gender": "child"},
}


def _rows(n: int = 8) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "story": [TEXT] * n,
            "lang": ["en"] * n,
            "llm": ["lab/model-a"] * n,
            "uid": [f"s{i}" for i in range(n)],
            "child": ["boy", "girl"] * (n // 2),
        }
    )


def _table(tmp_path: Path, path: Path, name: str = "t.yaml", **corpus) -> params.Params:
    settings = {"format": "table", "design": "bedtime", "path": str(path), "columns": COLUMNS, "extractions": "rerun"}
    return _load(tmp_path, {**settings, **corpus}, name)


def _write(rows: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".csv":
        rows.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        rows.to_json(path, orient="records", lines=True)
    else:
        rows.to_parquet(path)
    return path


@pytest.mark.parametrize(
    ("values", "stored"),
    [(list(range(8)), "int64"), ([["a"]] * 8, "list<element: string>"), ([True] * 8, "bool")],
)
def test_a_parquet_column_of_another_type_is_an_error_not_text(tmp_path, data_dir, values, stored):
    """Was: stringified silently (a model called "True", "['a']", an id "3")."""
    path = _write(_rows().assign(llm=values), tmp_path / "typed.parquet")
    message = rf"typed\.parquet: column llm: stored as {stored}, not text \(row 0: "
    with pytest.raises(params.ParamsError, match=message):  # check-params: the footer
        _table(tmp_path, path)
    with pytest.raises(TableFileError, match=message):  # the stage's reader: the same refusal
        read_text_columns(path, ["llm"])


@pytest.mark.parametrize(("value", "kind"), [(3, "number"), (True, "boolean"), (["a"], "list"), ({"a": 1}, "object")])
def test_a_jsonl_value_of_another_type_names_the_line_and_key(tmp_path, data_dir, value, kind):
    rows = _rows().to_dict("records")
    rows[4]["llm"] = value
    path = tmp_path / "typed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = _table(tmp_path, path)
    with pytest.raises(CorpusError, match=rf"typed\.jsonl: line 5, key llm: .* is a {kind}, not text"):
        generate.plan(p)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "not a JSON object"),
        ('{"llm": "a", "llm": "b"}', "key 'llm' appears twice"),
        ('{"llm": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ],
)
def test_a_bad_jsonl_line_is_named(tmp_path, line, problem):
    rows = "".join(json.dumps(r) + "\n" for r in _rows(4).to_dict("records"))
    path = tmp_path / "bad.jsonl"
    path.write_text(rows + "\n" + line + "\n")  # a blank line, then the bad one: line 6
    with pytest.raises(TableFileError, match=rf"bad\.jsonl: line 6: .*{problem}"):
        read_text_columns(path, ["llm"])


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
@pytest.mark.parametrize("name", ["NaN", "null"])
def test_a_spelled_out_missing_value_is_no_model_or_id(tmp_path, data_dir, suffix, name):
    for column in ("llm", "uid"):
        rows = _rows()
        rows.loc[3, column] = name
        path = _write(rows, tmp_path / f"{column}{suffix}")
        p = _table(tmp_path, path, f"{column}.yaml")
        with pytest.raises(
            CorpusError, match=rf"{column}{suffix}: row 3, column {column}: '{name}' is a missing value"
        ):
            generate.plan(p)


def test_a_jsonl_line_that_is_not_utf8_is_named_exactly(tmp_path):
    rows = "".join(json.dumps(r) + "\n" for r in _rows(4).to_dict("records"))
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(rows.encode() + '{"llm": "Müller"}\n'.encode("latin-1"))
    with pytest.raises(TableFileError, match=r"latin1\.jsonl: line 5: not UTF-8 text"):
        read_text_columns(path, ["llm"])


def test_a_repeated_column_is_refused_not_read_first(tmp_path):
    path = tmp_path / "twice.csv"
    path.write_text("story,llm,llm\nhello,a,b\n")
    with pytest.raises(TableFileError, match=r"twice\.csv: header: column 'llm' appears twice"):
        table_header(path)
    with pytest.raises(TableFileError, match="appears twice"):
        read_text_columns(path, ["story", "llm"])


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_6_mb_story_is_read_from_csv_and_jsonl(tmp_path, data_dir, suffix):
    """Was: Arrow's 'straddling object straddles two block boundaries' for any story over about 1 MB. The
    stories have paragraphs (newlines in a quoted CSV value), in a file of several MB."""
    big = ('A paragraph of the long story, with a comma and a "quote".\n\n' * 100_000)[:6_000_000]
    rows = _rows(200).assign(story=TEXT + "\n\nThe end.")
    rows.loc[117, "story"] = big
    path = _write(rows, tmp_path / f"big{suffix}")
    assert path.stat().st_size > 6_000_000
    p = _table(tmp_path, path, languages=["en"])  # check-params reads the header
    generate.run(p, progress=False, log=lambda m: None)
    stories = pd.read_parquet(artifacts.stories_path(p.run_name))
    assert len(stories) == 200 and stories["text"].str.len().max() == len(big)
    assert stories["text"].tolist() == rows["story"].tolist()


# --- table conditions: refused by row, stored as the design's keys --------------------------------

STEREOTALES_TABLE = {
    "format": "table",
    "design": "stereotales",
    "columns": {
        "text": "text",
        "language": {"constant": "en"},
        "model": {"constant": MODEL},
        "conditions": {"cond_attribute": {"constant": "gender"}, "cond_value": "gender", "cond_scenario": "scenario"},
    },
    "values": {"cond_scenario": {"going to jail": "going_to_jail"}},
    "extractions": "rerun",
}


def _conditions(tmp_path: Path, gender: list[str], scenario: list[str]) -> params.Params:
    path = tmp_path / "conditions.csv"
    pd.DataFrame({"text": [TEXT] * len(gender), "gender": gender, "scenario": scenario}).to_csv(path, index=False)
    return _load(tmp_path, {**STEREOTALES_TABLE, "path": str(path)}, "conditions.yaml")


@pytest.mark.parametrize(
    ("gender", "scenario", "message"),
    [
        ("Man", "going_to_jail", r"row 2, column gender: 'Man' is not a value of cond_value"),
        ("wizard", "going_to_jail", r"row 2, column gender: 'wizard' is not a value of cond_value"),
        ("man", "flying to the moon", r"row 2, column scenario: 'flying to the moon' is not a value of cond_scenario"),
    ],
)
def test_a_condition_value_the_table_cannot_map_is_refused_by_row(tmp_path, data_dir, gender, scenario, message):
    """`Man` beside `man`, an unknown value or an unknown scenario: refused naming the row, never a fourth
    gender the judge would rate beside the other three."""
    p = _conditions(tmp_path, ["man", "woman", gender], ["going_to_jail", "going to jail", scenario])
    with pytest.raises(CorpusError, match=rf"conditions\.csv: {message}"):
        generate.plan(p)


def test_cond_scenario_stores_the_scenario_key_not_its_text(tmp_path, data_dir):
    plan = generate.plan(_conditions(tmp_path, ["man", "woman"], ["going_to_jail", "going to jail"]))
    assert plan["cond_scenario"].tolist() == ["going_to_jail", "going_to_jail"]
    assert plan["cond_value"].tolist() == ["man", "woman"]


# --- published associations: each test once, in a scope the release knows, statistics in range ------


def _association(scope: str = "all", model: str = "prov/m", compared=("urbanicity", "urban"), **stats) -> dict:
    """One line of a released association file, as the exporter writes it (``released_format``)."""
    cell = {"p_value": 0.001, "fraction": 0.4, "lift": 3.0, **stats}
    return {
        "generator_model": model,
        "aggregation_dimension": [] if scope == "all" else ["language"],
        "aggregation_value": scope,
        "base_attribute": "gender",
        "compared_attribute": compared[0],
        "statistics": {"p_value": 0.001, "cramer_v": 0.4, "effect_category": "large"},
        "associated_values": [
            {
                "base_value": {"name": "gender", "value": "woman"},
                "compared_value": {"name": compared[0], "value": compared[1]},
                "statistics": cell,
            }
        ],
        "sample_ids": [],
    }


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_record_repeated_three_times_is_refused_not_counted_three_times(tmp_path):
    """Was: a line repeated three times gave three published associations (reproduced 3, missed 3)."""
    record = _association()
    path = _jsonl(
        tmp_path / "prov_m__all.jsonl", [record, _association(compared=("age", "adult (30-44)"))] + [record] * 2
    )
    with pytest.raises(
        PublishedFormatError, match=r"prov_m__all\.jsonl: line 3: field \(record\): repeats line 1 exactly"
    ):
        load_associations(path)
    # the same pair of one model and scope with other figures, in a second copy of the file in the folder
    _jsonl(tmp_path / "folder" / "associations_global" / "prov_m__all.jsonl", [_association()])
    _jsonl(tmp_path / "folder" / "old" / "prov_m__all.jsonl", [_association(lift=5.0)])
    with pytest.raises(
        PublishedFormatError, match=r"old/prov_m__all\.jsonl: line 1: .*tests the pair of line 1 of .*global/prov_m"
    ):
        load_associations(tmp_path / "folder")
    # one model's pair in two scopes, or two models' pair in one scope: different tests, all kept
    release = tmp_path / "release"
    _jsonl(release / "associations_global" / "prov_m__all.jsonl", [_association()])
    _jsonl(release / "associations_global" / "prov_n__all.jsonl", [_association(model="prov/n")])
    _jsonl(release / "associations_by_language" / "prov_m__fr.jsonl", [_association("fr")])
    assert len(load_associations(release)) == 3


def test_a_cell_listed_twice_in_one_record_is_refused(tmp_path):
    record = _association()
    twin = json.loads(json.dumps(record["associated_values"][0]))
    twin["compared_value"]["value"] = "URBAN"  # another spelling of the same cell
    record["associated_values"].append(twin)
    path = _jsonl(tmp_path / "prov_m__all.jsonl", [record])
    with pytest.raises(PublishedFormatError, match=r"associated_values\[1\]: the cell woman x urban again"):
        load_associations(path)


def test_an_unknown_scope_is_refused_naming_file_and_line(tmp_path):
    """Was: scope `xx` accepted, every association of it 'untested' without a word."""
    by_language = tmp_path / "associations_by_language"
    _jsonl(by_language / "prov_m__fr.jsonl", [_association("fr")])
    _jsonl(by_language / "prov_m__xx.jsonl", [_association("xx")])
    with pytest.raises(
        PublishedFormatError,
        match=r"prov_m__xx\.jsonl: line 1: field aggregation_value: 'xx' is neither all nor a language",
    ):
        load_associations(by_language)
    dutch = _jsonl(tmp_path / "release" / "prov_m__du.jsonl", [_association("du")])
    assert set(load_associations(dutch)["scope"]) == {"nl"}
    # a storybias export names its languages in pool.json: a language outside the release's ten is known there
    _jsonl(tmp_path / "export" / "associations_by_language" / "prov_m__de.jsonl", [_association("de")])
    pool = {"languages": ["de"], "additional_en": False, "attributes": None, "sample": None}
    (tmp_path / "export" / POOL_FILE).write_text(json.dumps(pool))
    assert set(load_associations(tmp_path / "export")["scope"]) == {"de"}


@pytest.mark.parametrize(
    ("stats", "field"),
    [
        ({"lift": float("nan")}, "lift"),
        ({"lift": -1.0}, "lift"),
        ({"lift": float("inf")}, "lift"),
        ({"p_value": 1.5}, "p_value"),
        ({"p_value": -0.1}, "p_value"),
        ({"fraction": 7.5}, "fraction"),
    ],
)
def test_statistics_out_of_range_are_refused_naming_file_line_and_key(tmp_path, stats, field):
    path = _jsonl(tmp_path / "prov_m__all.jsonl", [_association(**stats)])
    with pytest.raises(PublishedFormatError, match=rf"line 1: field associated_values\[0\]\.statistics\.{field}: "):
        load_associations(path)


def test_a_pair_statistic_out_of_range_is_refused(tmp_path):
    for change, field in (({"p_value": 2.0}, "p_value"), ({"cramer_v": -0.5}, "cramer_v"),
                          ({"effect_category": "huge"}, "effect_category")):  # fmt: skip
        record = _association()
        record["statistics"].update(change)
        path = _jsonl(tmp_path / field / "prov_m__all.jsonl", [record])
        with pytest.raises(PublishedFormatError, match=rf"line 1: field statistics\.{field}: "):
            load_associations(path)


def _question(qid: str, lift: float = 3.0, pct: float = 40.0, models=("prov/m",)) -> dict:
    return {
        "question_id": qid,
        "base_attribute": {"name": "gender", "value": "woman"},
        "compared_attribute": {"name": "urbanicity", "value": "urban"},
        "avg_percentage": pct,
        "avg_lift": lift,
        "metadata": {"model_list": list(models)},
    }


def test_one_association_under_three_question_ids_is_counted_once(tmp_path):
    """Was: three rows, three outcomes counted. Now one row naming the three ids; its figures are the
    records' averages weighted by their models, its models every listed one."""
    path = tmp_path / "questions.json"
    records = [_question("q1"), _question("q2"), _question("q3", lift=6.0, pct=70.0, models=("prov/n", "prov/o"))]
    path.write_text(json.dumps(records))
    published = load_associations(path)
    assert len(published) == 1
    row = published.iloc[0]
    assert row["question_ids"] == ["q1", "q2", "q3"] and row["models"] == ["prov/m", "prov/n", "prov/o"]
    assert row["published_lift"] == pytest.approx((3 + 3 + 2 * 6) / 4)
    assert row["published_fraction"] == pytest.approx((40 + 40 + 2 * 70) / 400)
    for bad, field in ((_question("q4", lift=math.nan), "avg_lift"), (_question("q5", lift=math.inf), "avg_lift")):
        path.write_text(json.dumps([bad]))
        with pytest.raises(PublishedFormatError, match=rf"record 0 \(question_id q\d\): field {field}: "):
            questions.load_questions(path)
    path.write_text(json.dumps([_question("q6", models=("prov/m", "null"))]))
    with pytest.raises(PublishedFormatError, match=r"metadata\.model_list: 'null' is a missing value"):
        questions.load_questions(path)


def test_check_params_reads_the_published_files_with_the_stages_reader(tmp_path, monkeypatch):
    """What check-params accepts stage 04 reads: the repeated record is refused by both."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    path = _jsonl(tmp_path / "prov_m__all.jsonl", [_association(), _association()])
    raw = yaml.safe_load((paths.repo_root() / "params" / "smoke.yaml").read_text())
    raw["associations"] = {"published": str(path)}
    profile = tmp_path / "published.yaml"
    profile.write_text(yaml.safe_dump(raw))
    with pytest.raises(params.ParamsError, match=r"associations\.published: .*line 2: .*repeats line 1 exactly"):
        params.load(profile)


# --- a human study's ratings: what the check accepts, stage 04's loader reads; a rating counted once ------

RATINGS_HEADER = "association_id,rater_id,harm,realism\n"
RATED = "gender|woman|urbanicity|urban"


def test_a_ratings_csv_with_a_line_of_empty_cells_loads_as_the_check_accepted_it(tmp_path):
    """Was: a `,,,` line passed the validator, then stage 04 stopped on `invalid literal for int() ...
    column 'harm'` (the check and the loader read the file differently). One reader: the line is blank."""
    path = tmp_path / "ratings.csv"
    path.write_text(RATINGS_HEADER + f"{RATED},r1,4,yes\n,,,\n{RATED},r2,5,no\n")
    assert validate_human_ratings(path) == []
    ratings = load_human_ratings(path, with_rows=True)
    assert ratings["harm"].tolist() == [4, 5] and ratings["row"].tolist() == [2, 4]


def test_one_raters_repeated_row_is_refused_by_the_check_and_the_loader(tmp_path):
    """Was: a rater's second row of one association counted as a second rating."""
    path = tmp_path / "ratings.csv"
    path.write_text(RATINGS_HEADER + f"{RATED},r1,4,yes\n{RATED},r2,5,no\n{RATED},r1,4,yes\n")
    rated = re.escape(repr(RATED))
    message = rf"ratings\.csv: row 4, column rater_id: a second rating of association_id {rated}, rater_id 'r1'"
    assert any(re.search(message, p) for p in validate_human_ratings(path))
    with pytest.raises(ValueError, match=message):
        load_human_ratings(path)
