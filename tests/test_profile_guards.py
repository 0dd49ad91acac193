"""Issue #44 items 3 and 6: a profile that would hang, blow up or fail late is refused before any work.

- YAML anchors and aliases are refused while the file is parsed (a 431-byte alias bomb in ``description``
  kept check-params busy for minutes at 2.5 GB), naming the file; free-form mappings (``chat_template_kwargs``)
  are bounded, naming the key.
- check-params verifies every variable a served model's ``api_key_env`` names; a list that names an item
  twice is refused with its key (``designs.bedtime.languages: [en, en]`` died in the plan).
- The judge's embedded model is prepared when stage 04 runs, not by stage 01.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from profile_files import read_smoke, write_profile
from storybias.config import checks, params
from storybias.core import artifacts, io, paths
from storybias.stages import generate
from storybias.stages.associations import judge as J
from storybias.stages.generate.corpus import CorpusError
from storybias.tools.synthetic_corpus import write_synthetic_corpus

ROOT = paths.repo_root()


def _check_params(path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "storybias.cli", "check-params", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env or dict(os.environ),
        timeout=120,
    )


def _alias_bomb(levels: int = 9) -> str:
    """Nine lists of nine references to the list before: 9**9 (387 million) strings in a few hundred bytes."""
    lines = ["  - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# --- 3. the YAML loader ------------------------------------------------------------------------------


def test_an_alias_bomb_in_the_description_is_refused_at_once_naming_the_file(tmp_path):
    """It used to keep check-params busy for more than 120 s at 2.5 GB, with no message."""
    text = (ROOT / "params" / "smoke.yaml").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("description:"))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("description:\n" + _alias_bomb() + body + "\n")
    assert len(_alias_bomb()) < 500
    started = time.process_time()  # CPU seconds: a worker at nice 19 waits for cores
    with pytest.raises(params.ParamsError) as exc:
        params.load(bomb)
    assert time.process_time() - started < 2.0
    assert f"{bomb}:2: anchor &a0" in str(exc.value) and "aliases (*name) are not accepted" in str(exc.value)
    proc = _check_params(bomb)
    assert proc.returncode == 2 and f"{bomb}:2:" in proc.stderr


def test_an_alias_bomb_under_chat_template_kwargs_is_refused_before_the_stamps(tmp_path):
    """It passed check-params and exhausted 3 GB in the stamps step every `make <stage>` runs first."""
    raw = read_smoke()
    raw["generation"]["models"][0]["chat_template_kwargs"] = {"x": "PLACEHOLDER"}
    lines = yaml.safe_dump(raw, sort_keys=False).splitlines(keepends=True)
    [at] = [i for i, line in enumerate(lines) if line.strip() == "x: PLACEHOLDER"]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    bomb = [f"{indent}b{i}: {line.strip()[2:]}\n" for i, line in enumerate(_alias_bomb().splitlines())]
    path = tmp_path / "kwargs.yaml"
    path.write_text("".join(lines[:at] + bomb + lines[at + 1 :]))
    assert path.stat().st_size < 2000
    started = time.process_time()  # CPU seconds: a worker at nice 19 waits for cores
    with pytest.raises(params.ParamsError, match=r"kwargs\.yaml:\d+: anchor &a0: YAML anchors"):
        params.load(path)
    assert time.process_time() - started < 2.0


def test_every_storybias_yaml_file_goes_through_the_one_loader(tmp_path):
    """A design, refusal or cue file is read by the same loader: an alias or deep nesting names the file."""
    aliased = tmp_path / "design.yaml"
    aliased.write_text("base: &b {adj: kind}\nother: *b\n")
    with pytest.raises(io.YamlRefusedError, match=r"design\.yaml:1: anchor &b"):
        io.read_yaml_strict(aliased)
    deep = tmp_path / "deep.yaml"
    deep.write_text("x: " + "[" * 40 + "]" * 40 + "\n")
    too_deep = rf"deep\.yaml:1: lists and mappings nested deeper than {io.MAX_YAML_DEPTH}"
    with pytest.raises(io.YamlRefusedError, match=too_deep):
        io.read_yaml_strict(deep)
    # no shipped file needs an alias or deeper nesting: every one of them still loads
    for path in sorted((ROOT / "params").rglob("*.yaml")):
        io.read_yaml_strict(path)
    # the taxonomy (storybias.evidence.stereotales_taxonomy) reads reference.yaml through it too
    source = (ROOT / "lib" / "storybias" / "evidence" / "stereotales_taxonomy.py").read_text()
    assert "read_yaml_strict(" in source and "yaml.safe_load" not in source


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"a": {"b": {"c": {"d": {"e": 1}}}}}, r"a\.b\.c\.d: nested deeper than 4 levels"),
        ({"stop": list(range(80))}, r"stop: more than 64 keys and list items in all"),
        ({"system": "x" * 5000}, r"system: text longer than 1000 characters \(5000\)"),
    ],
    ids=["depth", "items", "text"],
)
def test_chat_template_kwargs_is_bounded_naming_the_key(tmp_path, kwargs, message):
    raw = read_smoke()
    raw["extract"] = {"models": [{"name": "x", "source": "embedded", "chat_template_kwargs": kwargs}]}
    with pytest.raises(params.ParamsError, match=r"extract\.models\[0\]\.chat_template_kwargs: .*" + message):
        params.load(write_profile(tmp_path, raw))
    raw["extract"]["models"][0]["chat_template_kwargs"] = {"enable_thinking": False, "a": {"b": {"c": [1, 2]}}}
    assert params.load(write_profile(tmp_path, raw)).extract.models[0].chat_template_kwargs["enable_thinking"] is False


# --- 6. fail before work: duplicates, key variables ------------------------------------------------------


def test_a_language_listed_twice_is_refused_with_its_key(tmp_path):
    """`designs.bedtime.languages: [en, en]` passed check-params and died in the plan (duplicate story_id)."""
    raw = read_smoke()
    raw["designs"]["bedtime"]["languages"] = ["en", "en"]
    path = write_profile(tmp_path, raw)
    proc = _check_params(path)
    assert proc.returncode == 2, proc.stdout
    assert "designs.bedtime.languages: 'en' is listed twice ([0] and [1]); list each once" in proc.stderr


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda r: r.setdefault("associations", {}).update(passes=["global", "global"]), "associations.passes"),
        (lambda r: r["designs"]["stereotales"].update(restrict={"attribute": ["gender", "gender"]}),
         "designs.stereotales.restrict.attribute"),
        (lambda r: r.setdefault("extract", {}).update(refusals_unknown=["bedtime", "bedtime"]),
         "extract.refusals_unknown"),
        (lambda r: r.setdefault("metrics", {}).update(comparisons=[dict(COMPARISON), dict(COMPARISON)]),
         "metrics.comparisons"),
    ],
    ids=["passes", "restrict", "refusals_unknown", "comparisons"],
)  # fmt: skip
def test_any_list_that_repeats_an_item_is_refused_with_its_key(tmp_path, edit, key):
    raw = read_smoke()
    edit(raw)
    with pytest.raises(params.ParamsError, match=rf"  - {key}: .* is listed twice \(\[0\] and \[1\]\)"):
        params.load(write_profile(tmp_path, raw))


COMPARISON = {"name": "cg", "design": "bedtime", "condition": "child_gender", "group_m": "boy", "group_f": "girl"}


def test_free_form_lists_and_lists_of_distinct_items_are_accepted():
    p = params.load(ROOT / "params" / "paper.yaml")
    assert checks.repeated_items(p.profile) == []
    spec = params.ModelSpec(name="m", source="embedded", chat_template_kwargs={"stop": ["x", "x"]})
    assert checks.repeated_items(spec) == []  # the template's own settings are not storybias' lists


def _judge_on_an_endpoint(tmp_path: Path) -> Path:
    raw = read_smoke()
    raw["associations"] = {
        "judge": {
            "models": [
                {
                    "name": "judge-api",
                    "source": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model_id": "some/model",
                    "api_key_env": "STORYBIAS_TEST_JUDGE_KEY",
                }
            ]
        }
    }
    return write_profile(tmp_path, raw)


def test_check_params_refuses_an_unset_key_variable_naming_the_key_and_the_variable(tmp_path):
    """A judge whose api_key_env was unset passed check-params and failed at stage 04, after 01-03 ran."""
    path = _judge_on_an_endpoint(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "STORYBIAS_TEST_JUDGE_KEY"}
    proc = _check_params(path, env)
    assert proc.returncode == 2, proc.stdout
    assert "associations.judge.models[0].api_key_env" in proc.stderr and "$STORYBIAS_TEST_JUDGE_KEY" in proc.stderr
    assert "'judge-api'" in proc.stderr
    assert _check_params(path, dict(env, STORYBIAS_TEST_JUDGE_KEY="")).returncode == 2  # empty is unset
    proc = _check_params(path, dict(env, STORYBIAS_TEST_JUDGE_KEY="sk-test"))
    assert proc.returncode == 0, proc.stderr
    # the profile itself is valid: a finished run's later stages load it without the key
    assert params.load(path).associations.judge.models[0].api_key_env == "STORYBIAS_TEST_JUDGE_KEY"


def test_only_the_models_a_stage_runs_need_their_key(tmp_path, monkeypatch):
    """Extractors of a corpus whose published extractions are mapped never run: their key is not asked."""
    monkeypatch.delenv("STORYBIAS_TEST_KEY", raising=False)
    table = tmp_path / "stories.csv"
    pd.DataFrame({"story": ["A story."], "lang": ["en"], "llm": ["m"], "g": ["woman"]}).to_csv(table, index=False)
    served = {"name": "x", "source": "openai", "base_url": "http://127.0.0.1:9/v1", "model_id": "m",
              "api_key_env": "STORYBIAS_TEST_KEY"}  # fmt: skip
    columns = {"text": "story", "language": "lang", "model": "llm", "extracted": {"gender": "g"}}
    corpus = {"format": "table", "path": str(table), "columns": columns}
    for extractions, unset in (("published", []), ("rerun", ["extract.models[0].api_key_env"])):
        raw = {"corpus": {**corpus, "extractions": extractions}, "extract": {"models": [served]}}
        p = params.load(write_profile(tmp_path, raw))
        assert [u.split(":")[0] for u in checks.missing_key_variables(p.profile)] == unset


def test_a_deeply_nested_published_extraction_stops_stage_01_naming_file_row_and_column(tmp_path, monkeypatch):
    """A released extraction nested past Python's stack raised RecursionError (only KeyError was caught)."""
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path / "data"))
    files = write_synthetic_corpus(tmp_path / "release", models=("m",), folders=("en",), samples_per_folder=20, seed=1)
    table = pq.read_table(files[0])
    column = table.column("extracted_attributes_json").to_pylist()
    column[7] = '{"gender": ' + "[" * 100_000 + "]" * 100_000 + "}"
    index = table.schema.get_field_index("extracted_attributes_json")
    pq.write_table(table.set_column(index, "extracted_attributes_json", pa.array(column)), files[0])
    p = params.load(
        write_profile(
            tmp_path, {"run_name": "deep", "corpus": {"format": "stereotales", "path": str(tmp_path / "release")}}
        )
    )
    with pytest.raises(CorpusError, match=f"{files[0]}: row 7, column extracted_attributes_json: .*nested too deeply"):
        generate.run(p, progress=False, log=lambda m: None)
    assert not artifacts.path(p.run_name, "stories").exists()


# --- 6. the judge's model is prepared by stage 04 ------------------------------------------------------


@pytest.fixture
def prepared(monkeypatch) -> list[str]:
    """The embedded models prepared (recorded instead of assembled)."""
    keys: list[str] = []
    monkeypatch.setattr(
        "storybias.engines.prepare.prepare_embedded_models", lambda ks, log=print, int8=(): keys.extend(ks)
    )
    return keys


def test_stage_01_of_a_published_corpus_prepares_no_model(tmp_path, prepared):
    """Stage 01 of a profile with extractions: published prepared the judge's embedded model (3.4 GB, minutes)."""
    table = tmp_path / "stories.csv"
    pd.DataFrame({"story": ["A story."], "lang": ["en"], "llm": ["m"], "g": ["woman"]}).to_csv(table, index=False)
    columns = {"text": "story", "language": "lang", "model": "llm", "extracted": {"gender": "g"}}
    p = params.load(write_profile(tmp_path, {"corpus": {"format": "table", "path": str(table), "columns": columns}}))
    assert p.associations.judge.models[0].source == "embedded"
    generate.prepare_models(p)  # what notebook 01 runs
    generate.prepare_models(p, ("extract",))  # what notebook 03 runs: published extractions, no model
    assert prepared == []
    smoke = params.load(ROOT / "params" / "smoke.yaml")
    assert generate.prepare_models(smoke) == [smoke.generation.models[0].embedded] == prepared


def test_the_judges_model_is_prepared_when_stage_04_rates(tmp_path, monkeypatch, prepared):
    p = params.load(ROOT / "params" / "smoke.yaml")

    class Built(Exception):
        pass

    def no_engine(*args, **kwargs):
        raise Built

    monkeypatch.setattr(J, "CachingEngine", no_engine)
    shared = pd.DataFrame(
        [{"scope": "all", "base_attribute": "gender", "base_value": "woman", "compared_attribute": "marital_status",
          "compared_value": "married", "models": ["m1"]}]
    )  # fmt: skip
    items = J.judge_items(shared)
    with pytest.raises(Built):
        J.run_judges(items, p, progress=False)
    assert prepared == [p.associations.judge.models[0].embedded]  # before the judge's engine is built
    prepared.clear()
    with pytest.raises(Built):
        J.run_judges(items, p, progress=False, engine_factory=lambda spec: None)
    assert prepared == [], "a given engine (the tests' scripted judges) needs no weights"


def test_the_notebooks_prepare_their_own_stages_models():
    def code(notebook: str) -> str:
        cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
        return "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")

    assert "generate.prepare_models(p)\n" in code("01_generate.ipynb")  # stage 01's generators only
    assert 'generate.prepare_models(p, ("extract",))' in code("03_extract.ipynb")
    assert "prepare_models" not in code("04_associations.ipynb")  # stage 04 prepares its judges as it runs
