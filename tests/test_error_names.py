"""Issue #58 item 9: every error names the file, and the row, line or key, for each case of the issue's
"Why" item 10 (each used to crash naming nothing: OverflowError, UnicodeDecodeError, TypeError, ArrowInvalid,
KeyError, OSError 36, a mathtext error); and names that could not be cleaned are refused before they name a
folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml

from storybias.config import params
from storybias.core import io, paths
from storybias.core.inputs import TableFileError, read_text_columns
from storybias.core.io import ArtifactReadError
from storybias.evidence.harm_ratings import HUMAN_RATINGS
from storybias.evidence.human_files import check_file
from storybias.evidence.released_associations import load_associations
from storybias.evidence.stereotales_taxonomy import PublishedFormatError
from storybias.stages import generate
from storybias.stages.figures.style import new_figure, save_figure
from storybias.stages.generate.corpus import CorpusError

ROOT = paths.repo_root()
SMOKE = (ROOT / "params" / "smoke.yaml").read_text()
TEXT = "Once upon a time a child walked to school and met a friend. They laughed all the way home. " * 3


def _released_record(lift: object = 3.0) -> dict:
    return {
        "generator_model": "prov/m",
        "aggregation_dimension": [],
        "aggregation_value": "all",
        "base_attribute": "gender",
        "compared_attribute": "urbanicity",
        "statistics": {"p_value": 0.001, "cramer_v": 0.2, "effect_category": "small"},
        "associated_values": [
            {
                "base_value": {"name": "gender", "value": "woman"},
                "compared_value": {"name": "urbanicity", "value": "urban"},
                "statistics": {"p_value": 0.001, "fraction": 0.4, "lift": lift},
            }
        ],
        "sample_ids": [],
    }


def _released(tmp_path: Path, lines: list[bytes], pool: bytes | None = None) -> Path:
    folder = tmp_path / "released"
    folder.mkdir()
    (folder / "m__global.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    if pool is not None:
        (folder / "pool.json").write_bytes(pool)
    return folder


def _pool(**changed: object) -> bytes:
    pool = {"languages": ["en", "fr"], "additional_en": False, "attributes": None, "sample": None, **changed}
    return json.dumps(pool).encode()


def _message(call: Callable[[], object], errors: type[BaseException] | tuple = Exception) -> str:
    with pytest.raises(errors) as exc:
        call()
    return str(exc.value)


# --- the published associations and their pool.json (check-params and stage 04) ---------------------


def test_a_400_digit_lift_names_the_file_line_and_field(tmp_path):
    record = json.dumps(_released_record()).replace('"lift": 3.0', '"lift": ' + "9" * 400).encode()
    folder = _released(tmp_path, [b"", record])
    message = _message(lambda: load_associations(folder), PublishedFormatError)
    assert f"{folder / 'm__global.jsonl'}: line 2: field associated_values[0].statistics.lift" in message


def test_a_latin1_byte_in_an_association_file_names_the_file_and_line(tmp_path):
    bad = json.dumps(_released_record()).replace("prov/m", "prov/m\u00e9").encode("latin-1")
    folder = _released(tmp_path, [json.dumps(_released_record()).encode(), bad])
    message = _message(lambda: load_associations(folder), PublishedFormatError)
    assert f"{folder / 'm__global.jsonl'}: line 2:" in message and "UTF-8" in message


@pytest.mark.parametrize(
    ("pool", "named"),
    [
        (_pool(languages=5), "key languages"),
        (_pool(languages="en"), "key languages"),
        (_pool(additional_en="no"), "key additional_en"),
        (_pool(sample=-3), "key sample"),
        (
            '{"languages": ["fr\u00e9"], "additional_en": false, "attributes": null, "sample": null}'.encode("latin-1"),
            "line 1: not UTF-8",
        ),
    ],
)
def test_a_bad_pool_json_names_the_file_and_key(tmp_path, pool, named):
    folder = _released(tmp_path, [json.dumps(_released_record()).encode()], pool=pool)
    message = _message(lambda: load_associations(folder), PublishedFormatError)
    assert f"{folder / 'pool.json'}:" in message and named in message


# --- the profile --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "named"),
    [
        (SMOKE.replace("seed: 42", "seed: " + "7" * 5000, 1), "p.yaml", "an integer of 5,000 digits"),
        (SMOKE.replace("Tiny slice", "Tiny sl\u00e9ce"), "p.yaml", "not UTF-8"),
        ("run_name: " + "r" * 300 + "\n" + SMOKE, "p.yaml", "run_name: "),
        (SMOKE, "d\u00e9faut.yaml", "run_name: the file name 'd\u00e9faut'"),
    ],
)
def test_a_bad_profile_names_the_file_and_the_line_or_key(tmp_path, text, name, named):
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1") if "sl\u00e9ce" in text else text.encode("utf-8"))
    message = _message(lambda: params.load(path), params.ParamsError)
    assert str(path) in message and named in message
    assert "seed" not in named or f"{path}:" in message  # with its line


def test_a_human_ratings_folder_is_named_as_a_folder(tmp_path):
    (tmp_path / "ratings").mkdir()
    raw = yaml.safe_load(SMOKE)
    raw["associations"] = {"human_ratings": str(tmp_path / "ratings")}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    message = _message(lambda: params.load(path), params.ParamsError)
    assert f"associations.human_ratings: {tmp_path / 'ratings'} is a folder" in message


# --- the human ratings CSV -----------------------------------------------------------------------------

HEADER = "association_id,rater_id,harm,realism\n"


def test_a_latin1_row_in_a_ratings_csv_names_its_line(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_bytes(
        (HEADER + "gender|woman|urbanicity|urban,r1,3,yes\n").encode()
        + "gender|man|urbanicity|urban,r\u00e9,3,yes\n".encode("latin-1")
    )
    (problem,) = check_file(path, HUMAN_RATINGS)
    assert f"{path}: line 3: not UTF-8" in problem


def test_a_ratings_csv_with_a_byte_order_mark_is_read_as_the_story_reader_reads_it(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "gender|woman|urbanicity|urban,r1,3,yes\n").encode())
    assert check_file(path, HUMAN_RATINGS) == []


# --- a stage's input tables ----------------------------------------------------------------------------


def test_a_truncated_stories_parquet_is_named(tmp_path):
    path = tmp_path / "stories.parquet"
    pd.DataFrame({"story_id": ["s"] * 1000, "text": ["t"] * 1000}).to_parquet(path)
    path.write_bytes(path.read_bytes()[:-200])
    message = _message(lambda: io.parquet_file(path), ArtifactReadError)
    assert str(path) in message and "truncated or corrupt" in message


def test_a_filtered_parquet_without_language_names_the_file_and_column(tmp_path):
    path = tmp_path / "filtered.parquet"
    pd.DataFrame({"story_id": ["s1"], "design": ["bedtime"]}).to_parquet(path)
    message = _message(lambda: io.read_parquet_checked(path, ["story_id", "language"]), ArtifactReadError)
    assert f"{path}: no column language" in message


# --- model names of an imported corpus ---------------------------------------------------------------


@pytest.mark.parametrize(("model", "named"), [("m" * 100_000, "100,000 bytes"), ("lab/m\x00x", "control character")])
def test_a_model_name_that_cannot_name_a_file_is_refused_with_its_row(tmp_path, monkeypatch, model, named):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    rows = pd.DataFrame({"story": [TEXT] * 4, "lang": ["en"] * 4, "llm": ["lab/a"] * 4, "uid": list("abcd")})
    rows.loc[2, "llm"] = model
    table = tmp_path / "stories.parquet"
    rows.to_parquet(table)
    columns = {"text": "story", "language": "lang", "model": "llm", "id": "uid"}
    profile = tmp_path / "p.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "run_name": "names",
                "corpus": {
                    "format": "table",
                    "design": "bedtime",
                    "path": str(table),
                    "columns": columns,
                    "extractions": "rerun",
                },
            }
        )
    )
    message = _message(lambda: generate.run(params.load(profile), progress=False, log=lambda m: None), CorpusError)
    assert f"{table}: row 2, column llm" in message and named in message


def test_a_model_name_with_mathtext_is_drawn_as_written(tmp_path):
    fig = new_figure(3, 2)
    ax = fig.add_subplot()
    ax.bar([r"$\undefinedcmd{x}$"], [1])
    ax.set_title(r"model $\undefinedcmd{x}$")
    written = save_figure(fig, tmp_path, "mathtext")
    assert all(p.stat().st_size > 0 for p in written)


def test_a_latin1_row_in_a_story_table_names_its_line(tmp_path):
    path = tmp_path / "stories.csv"
    path.write_bytes(b"story_id,text\na,hello\nb,h\xe9llo\n")
    message = _message(lambda: read_text_columns(path, ["story_id", "text"]), TableFileError)
    assert f"{path}: line 3: not UTF-8" in message


def test_a_header_only_story_table_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    table = tmp_path / "stories.csv"
    table.write_text("story,lang,llm,uid\n")
    columns = {"text": "story", "language": "lang", "model": "llm", "id": "uid"}
    corpus = {"format": "table", "design": "bedtime", "path": str(table), "columns": columns, "extractions": "rerun"}
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"run_name": "header-only", "corpus": corpus}))
    message = _message(lambda: generate.run(params.load(profile), progress=False, log=lambda m: None), CorpusError)
    assert f"corpus.path: no story left in {table}" in message
