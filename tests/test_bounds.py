"""Issue #58 item 8: bounds before work. check-params counts the plan without making it and refuses one
beyond what the machine can hold; a count above its schema's range, a non-finite number, and an answer
budget beyond its model's context are refused naming the key; every stage asks for the keys of the model
stages ahead of it before it starts (the judge's key at stage 01, not after 138 s at stage 04)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profile_files import read_smoke, write_profile
from storybias.config import bounds, checks, params
from storybias.config.plan import plan
from storybias.core import paths

ROOT = paths.repo_root()


def _set(raw: dict, dotted: str, value: object) -> dict:
    *parents, last = dotted.split(".")
    node = raw
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return raw


def test_a_trillion_samples_per_prompt_is_refused_at_once_naming_the_key_and_the_size(tmp_path):
    """It used to pass check-params (OK) and then plan until a MemoryError."""
    raw = _set(read_smoke(), "designs.bedtime.samples_per_prompt", 10**12)
    path = write_profile(tmp_path, raw)
    started = time.process_time()
    with pytest.raises(params.ParamsError) as exc:
        params.load(path)
    assert time.process_time() - started < 5.0
    message = str(exc.value)
    assert str(path) in message and "designs.bedtime.samples_per_prompt" in message
    assert "2,000,000,000,006 stories" in message and f"limit of {bounds.story_limit():,}" in message


def test_the_plan_is_counted_as_it_would_be_made():
    """The count is the plan's length for the shipped profiles that generate (small enough to make here)."""
    for name in ("smoke", "default", "api-example"):
        p = params.load(ROOT / "params" / f"{name}.yaml")
        assert sum(bounds.planned_counts(p.profile).values()) == len(plan(p)), name


def test_the_paper_profile_fits_and_the_memory_limit_names_its_reason():
    paper = params.load(ROOT / "params" / "paper.yaml").profile
    assert sum(bounds.planned_counts(paper).values()) == 459_540
    assert bounds.plan_size_problems(paper, memory=8 * 2**30) == []  # 8 GiB holds the paper plan
    (problem,) = bounds.plan_size_problems(paper, memory=2**30)  # 1 GiB does not
    assert "459,540 stories" in problem and "this machine's memory" in problem


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("generation.models.0.max_model_len", 10**12, "generation.models[0].max_model_len"),
        ("associations.max_resamples", 10**15, "associations.max_resamples"),
        ("metrics.bootstrap", 10**12, "metrics.bootstrap"),
        ("associations.bootstrap", 10**12, "associations.bootstrap"),
        ("probes.n_bootstrap", 10**12, "probes.n_bootstrap"),
        ("crosslens.n_permutations", 10**12, "crosslens.n_permutations"),
        ("associations.power_simulations", 10**9, "associations.power_simulations"),
        ("generation.sampling.temperature", float("inf"), "generation.sampling.temperature"),
        ("generation.sampling.repetition_penalty", float("nan"), "generation.sampling.repetition_penalty"),
        ("associations.judge.temperature", float("inf"), "associations.judge.temperature"),
        ("generation.seed", -1, "generation.seed"),
        ("generation.seed", 2**64, "generation.seed"),
    ],
)
def test_values_beyond_the_schema_range_are_refused_naming_the_key(tmp_path, key, value, named):
    path = write_profile(tmp_path, _set(read_smoke(), key, value))
    with pytest.raises(params.ParamsError) as exc:
        params.load(path)
    assert str(path) in str(exc.value) and named in str(exc.value)


def test_temperature_dot_inf_written_in_yaml_is_refused(tmp_path):
    text = (ROOT / "params" / "smoke.yaml").read_text().replace("temperature: 1.0", "temperature: .inf", 1)
    assert "temperature: .inf" in text
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(params.ParamsError, match=r"generation\.sampling\.temperature: .*finite"):
        params.load(path)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("generation.sampling.max_tokens", 5000, "generation.sampling.max_tokens: 5,000 tokens"),
        ("designs.bedtime.sampling.max_tokens", 4096, "designs.bedtime.sampling.max_tokens: 4,096 tokens"),
        ("extract.max_tokens", 4096, "extract.max_tokens"),
        ("associations.judge.max_tokens", 9000, "associations.judge.max_tokens"),
    ],
)
def test_an_answer_budget_beyond_the_models_context_is_refused(tmp_path, key, value, named):
    path = write_profile(tmp_path, _set(read_smoke(), key, value))
    with pytest.raises(params.ParamsError) as exc:
        params.load(path)
    assert named in str(exc.value) and "max_model_len (4,096" in str(exc.value)


def _served_judge(tmp_path: Path) -> Path:
    raw = read_smoke()
    raw["associations"] = {
        "judge": {
            "models": [
                {
                    "name": "api-judge",
                    "source": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model_id": "m-1",
                    "api_key_env": "STORYBIAS_TEST_JUDGE_KEY",
                }
            ]
        }
    }
    return write_profile(tmp_path, raw)


def test_the_judges_key_is_asked_before_stage_01_and_not_after_stage_04(tmp_path):
    profile = params.load(_served_judge(tmp_path)).profile
    for stage in ("generate", "filter", "extract", "associations"):
        (problem,) = checks.stage_key_problems(profile, stage)
        assert "associations.judge.models[0].api_key_env" in problem and "$STORYBIAS_TEST_JUDGE_KEY" in problem
    for stage in ("metrics", "probes", "crosslens", "figures", "explorer"):
        assert checks.stage_key_problems(profile, stage) == []  # `make figures` on a finished run needs no key


def test_run_stage_refuses_stage_01_when_the_judges_key_is_unset(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "STORYBIAS_TEST_JUDGE_KEY"}
    env["STORYBIAS_DATA"] = str(tmp_path / "data")
    profile = _served_judge(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "run-stage", "generate", str(tmp_path / "absent.ipynb"), str(profile)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "associations.judge.models[0].api_key_env" in result.stderr and str(profile) in result.stderr
    assert not (tmp_path / "data" / "p" / "reports").exists(), "refused before the stage wrote anything"


def test_max_model_len_1e12_is_refused_as_a_number_written_as_text(tmp_path):
    """YAML 1.1 reads 1e12 (no dot) as text: the message says so instead of asking to remove quotes that
    are not there."""
    text = (
        (ROOT / "params" / "smoke.yaml")
        .read_text()
        .replace("source: embedded", "source: embedded\n      max_model_len: 1e12", 1)
    )
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(params.ParamsError) as exc:
        params.load(path)
    message = str(exc.value)
    assert "max_model_len" in message and "'1e12'" in message and "write the number in digits" in message
