"""Parameter validation: every kind of bad input gives one clear message naming the key and the file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from storybias.config import params
from storybias.config.params import ParamsError
from storybias.core import io, paths

PROFILES = ["smoke", "default", "paper"]


def write_profile(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load((paths.params_dir() / "smoke.yaml").read_text())
    mutate(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("name", PROFILES)
def test_shipped_profiles_are_valid(name):
    p = params.load(f"params/{name}.yaml")
    assert p.run_name == name
    assert p.enabled_designs()


def test_run_name_defaults_to_file_name_and_can_be_set(tmp_path):
    path = write_profile(tmp_path, lambda r: r.update(run_name="my-run"))
    assert params.load(path).run_name == "my-run"
    path = write_profile(tmp_path, lambda r: None)
    assert params.load(path).run_name == "bad"


def _error(tmp_path, mutate) -> str:
    path = write_profile(tmp_path, mutate)
    with pytest.raises(ParamsError) as exc:
        params.load(path)
    message = str(exc.value)
    assert str(path) in message, "the message must name the file"
    return message


def test_unknown_key_is_named(tmp_path):
    msg = _error(tmp_path, lambda r: r["generation"].update(temprature=0.3))
    assert "generation.temprature" in msg and "unknown key" in msg


def test_unknown_nested_key_is_named(tmp_path):
    msg = _error(tmp_path, lambda r: r["designs"]["bedtime"].update(n_prompt=3))
    assert "designs.bedtime.n_prompt" in msg


def test_wrong_type_is_named(tmp_path):
    msg = _error(tmp_path, lambda r: r["generation"]["sampling"].update(max_tokens="many"))
    assert "generation.sampling.max_tokens" in msg


def test_out_of_range_value_is_named(tmp_path):
    msg = _error(tmp_path, lambda r: r["generation"]["sampling"].update(top_p=1.5))
    assert "generation.sampling.top_p" in msg


def test_unknown_language_is_named(tmp_path):
    msg = _error(tmp_path, lambda r: r["designs"]["stereotales"].update(languages=["en", "xx"]))
    assert "designs.stereotales.languages[1]" in msg and "'xx'" in msg


def test_unknown_design_is_named(tmp_path):
    msg = _error(tmp_path, lambda r: r["designs"].update(fairytales={"languages": ["en"]}))
    assert "designs.fairytales" in msg


def test_missing_model_folder_is_named(tmp_path):
    def mutate(r):
        r["generation"]["models"] = [{"name": "mine", "source": "local", "path": str(tmp_path / "nowhere")}]

    msg = _error(tmp_path, mutate)
    assert "generation.models[0].path" in msg and "nowhere" in msg and "does not exist" in msg


def test_local_model_needs_a_path(tmp_path):
    msg = _error(tmp_path, lambda r: r["generation"].update(models=[{"name": "mine", "source": "local"}]))
    assert "generation.models[0]" in msg and "path" in msg


def test_unknown_restrict_value_is_named(tmp_path):
    msg = _error(tmp_path, lambda r: r["designs"]["stereotales"].update(restrict={"attribute": ["hair_colour"]}))
    assert "designs.stereotales.restrict.attribute" in msg and "hair_colour" in msg


def test_duplicate_model_names_rejected(tmp_path):
    m = {"name": "a", "source": "embedded"}
    # two copies: one object twice would be dumped as a YAML anchor and alias, which the loader refuses
    msg = _error(tmp_path, lambda r: r["generation"].update(models=[m, dict(m)]))
    assert "generation.models" in msg and "unique" in msg


def test_embedded_model_key_is_checked_and_only_for_embedded_sources(tmp_path):
    def unknown(r):
        r["generation"]["models"] = [{"name": "small", "source": "embedded", "embedded": "qwen2.5-coder-7b"}]

    msg = _error(tmp_path, unknown)
    assert "generation.models[0]" in msg and "'qwen2.5-coder-7b'" in msg
    assert "qwen2.5-coder-1.5b" in msg and "qwen2.5-coder-0.5b" in msg, "the message lists the embedded models"

    def on_local(r):
        r["generation"]["models"] = [
            {"name": "mine", "source": "local", "path": str(tmp_path), "embedded": "qwen2.5-coder-0.5b"}
        ]

    assert "`embedded`" in _error(tmp_path, on_local)


def test_design_models_must_be_generation_models(tmp_path):
    msg = _error(tmp_path, lambda r: r["designs"]["occupations"].update(models=["qwen2.5-coder-05b"]))
    assert "designs.occupations.models[0]" in msg and "'qwen2.5-coder-05b'" in msg
    assert "qwen2.5-coder-1.5b" in msg, "the message names the generation models to choose from"


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("generation: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        params.load(bad)
    with pytest.raises(ParamsError, match="not found"):
        params.load(tmp_path / "absent.yaml")


def test_every_problem_is_reported_at_once(tmp_path):
    def mutate(r):
        r["generation"]["sampling"]["top_p"] = 3
        r["designs"]["bedtime"]["samples"] = 2

    msg = _error(tmp_path, mutate)
    assert "top_p" in msg and "designs.bedtime.samples" in msg and "2 problems" in msg


def test_duplicate_yaml_key_is_refused_naming_file_line_and_key(tmp_path):
    # PyYAML's safe_load keeps the last of two `seed:` lines; the profile must be refused instead.
    text = (paths.params_dir() / "smoke.yaml").read_text()
    assert "\ngeneration:\n" in text
    bad = tmp_path / "dup.yaml"
    bad.write_text(text.replace("\ngeneration:\n", "\ngeneration:\n  seed: 7\n  seed: 8\n", 1))
    line = bad.read_text().splitlines().index("  seed: 8") + 1
    with pytest.raises(ParamsError) as exc:
        params.load(bad)
    msg = str(exc.value)
    assert f"{bad}:{line}:" in msg and "duplicate key 'seed'" in msg and f"first at line {line - 1}" in msg
    proc = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "check-params", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and f"{bad}:{line}:" in proc.stderr  # `make check-params` refuses it too
    # the same key in two different mappings is fine, and so is a key overriding a `<<` merge
    merged = yaml.load("a: &b {k: 1, j: 2}\nc:\n  <<: *b\n  k: 3\n", Loader=io.StrictSafeLoader)
    assert merged["c"] == {"k": 3, "j": 2}
    top = tmp_path / "dup-top.yaml"
    top.write_text(text + "\ndescription: again\ndescription: twice\n")
    with pytest.raises(ParamsError, match="duplicate key 'description'"):
        params.load(top)


def test_quoted_number_is_refused_not_coerced(tmp_path):
    msg = _error(tmp_path, lambda r: r["designs"]["bedtime"].update(n_prompts="3"))
    assert "designs.bedtime.n_prompts" in msg and "'3'" in msg and "without quotes" in msg
    msg = _error(tmp_path, lambda r: r["generation"]["sampling"].update(temperature="0.7"))
    assert "generation.sampling.temperature" in msg
    msg = _error(tmp_path, lambda r: r["designs"]["bedtime"].update(enabled="yes"))
    assert "designs.bedtime.enabled" in msg
    msg = _error(tmp_path, lambda r: r["generation"].update(seed=True))  # a bool is not an int
    assert "generation.seed" in msg
    msg = _error(tmp_path, lambda r: r["designs"]["bedtime"].update(samples_per_prompt=2.0))
    assert "designs.bedtime.samples_per_prompt" in msg


def test_int_is_accepted_where_a_float_is_expected(tmp_path):
    path = write_profile(tmp_path, lambda r: r["generation"]["sampling"].update(temperature=1, top_p=1))
    p = params.load(path)
    assert p.generation.sampling.temperature == 1.0 and isinstance(p.generation.sampling.temperature, float)


def test_run_name_null_is_refused(tmp_path):
    # Make's sed reads `run_name: null` as a run called "null"; Python used the file name: refuse it.
    msg = _error(tmp_path, lambda r: r.update(run_name=None))
    assert "run_name" in msg and "omit run_name to use the file name" in msg


def test_check_params_cli_exits_nonzero_fast_naming_key(tmp_path):
    path = write_profile(tmp_path, lambda r: r["designs"]["stereotales"].update(languages=["klingon"]))
    before = os.times()
    proc = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "check-params", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "designs.stereotales.languages[0]" in proc.stderr and str(path) in proc.stderr
    after = os.times()  # the child's CPU seconds: a worker at nice 19 waits for cores
    assert (after.children_user + after.children_system) - (before.children_user + before.children_system) < 10
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, storybias.config.params as p; p.load('params/smoke.yaml'); "
            "print('vllm' in sys.modules, 'torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=paths.repo_root(),
    )
    assert proc.stdout.strip() == "False False", "validation must not import the engine"


def test_stage_stamp_changes_only_with_its_section(tmp_path):
    base = params.load("params/smoke.yaml")
    changed = write_profile(tmp_path, lambda r: r["generation"]["sampling"].update(max_tokens=49))
    assert params.load(changed).stage_digest("generate") != base.stage_digest("generate")
    same = write_profile(tmp_path, lambda r: r.update(description="another description"))
    assert params.load(same).stage_digest("generate") == base.stage_digest("generate")
    filter_only = write_profile(tmp_path, lambda r: r.update(filter={"lid_threshold": 0.6}))
    assert params.load(filter_only).stage_digest("generate") == base.stage_digest("generate")
    assert params.load(filter_only).stage_digest("filter") != base.stage_digest("filter")


def test_stamp_files_are_rewritten_only_on_change(tmp_path):
    p = params.load("params/smoke.yaml")
    stamps = params.write_stage_stamps(p, tmp_path)
    assert {s.name for s in stamps} >= {"generate.params", "filter.params"}
    before = {s: s.stat().st_mtime_ns for s in stamps}
    time.sleep(0.01)
    params.write_stage_stamps(p, tmp_path)
    assert {s: s.stat().st_mtime_ns for s in stamps} == before


def test_paper_profile_follows_biasedtales_table_2():
    p = params.load("params/paper.yaml")
    s = p.generation.sampling
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.max_tokens) == (1.0, 0.95, 50, 1.1, 1024)
    assert p.generation.seed == 42
    assert p.designs.bedtime.samples_per_prompt == 5
    # each study's count per prompt: StereoTales ~650,000 / (23 x 10 x 2,844) = 0.99; Feng et al. 50 per cell
    assert p.designs.stereotales.samples_per_prompt == 1
    assert p.designs.occupations.samples_per_prompt == 50
    assert {m.hub_id for m in p.generation.models} >= {
        "Qwen/Qwen3-8B",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.2-1B-Instruct",
    }
    assert all(m.device == "cuda" for m in p.generation.models)
    # each study's own languages (issue #3)
    assert p.designs.stereotales.languages == ["en", "fr", "es", "it", "pt", "nl", "uk", "ar", "hi", "zh"]
    assert p.designs.bedtime.languages == ["en", "zh", "ja", "ko", "es", "ru", "ar", "sw"]
    assert p.designs.occupations.languages == ["en", "fr", "zh"]
    assert len(p.extract.models) == 3


def test_duplicate_key_in_a_design_file_is_refused(tmp_path, monkeypatch):
    """Issue #12.9: the strict loader guards every parameter file, not only profiles (a repeated value
    key in a localization would silently drop a translation)."""
    from storybias.config import prompts

    designs = tmp_path / "designs" / "bedtime"
    designs.mkdir(parents=True)
    source = paths.designs_dir() / "bedtime"
    (designs / "design.yaml").write_text((source / "design.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    text = (source / "en.yaml").read_text(encoding="utf-8")
    (designs / "en.yaml").write_text(text + "\nlanguage: en\n", encoding="utf-8")
    monkeypatch.setattr(paths, "designs_dir", lambda: tmp_path / "designs")
    prompts.load_localization.cache_clear()
    try:
        with pytest.raises(io.DuplicateKeyError, match=r"en\.yaml:\d+: found duplicate key 'language'"):
            prompts.load_localization("bedtime", "en")
    finally:
        prompts.load_localization.cache_clear()
