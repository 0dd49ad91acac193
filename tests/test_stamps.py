"""What a change to the profile reruns (issue #59, item 4): the params stamps classify each engine and
model setting as the answer cache does (storybias.config.output_fields), so an operational setting
(concurrency, timeouts, KV-cache size, the preload, the transport) reruns no stage, and an output-shaping
one reruns exactly the stages whose parameter sections hold it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from profile_files import write_profile
from storybias.config import params
from storybias.config.output_fields import OPERATIONAL_ENGINE_FIELDS, OUTPUT_ENGINE_FIELDS
from storybias.core import artifacts, make_rules, paths
from test_reliability import finished_reports, make

ROOT = paths.repo_root()
SMOKE = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
API = yaml.safe_load((ROOT / "params" / "api-example.yaml").read_text())  # an API model's settings


def _set(raw: dict, key: str, value: object) -> dict:
    """A copy of ``raw`` with the dotted ``key`` ("a.b", "a.0.b" for a list item) set to ``value``."""
    out = yaml.safe_load(yaml.safe_dump(raw))
    node = out
    *parents, last = key.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return out


def _digests(path: Path) -> dict[str, str]:
    p = params.load(path)
    return {stage.token: p.stage_digest(stage.token) for stage in artifacts.STAGES}


def _changed(tmp_path: Path, key: str, value: object, base: dict = SMOKE) -> set[str]:
    before = _digests(write_profile(tmp_path, base, "before.yaml"))
    after = _digests(write_profile(tmp_path, _set(base, key, value), "after.yaml"))
    return {stage for stage in before if before[stage] != after[stage]}


def _readers(section: str) -> set[str]:
    """The stages whose registry sections hold ``section`` (itself or a section above it)."""
    return {s.token for s in artifacts.STAGES if any(section == r or section.startswith(f"{r}.") for r in s.sections)}


OPERATIONAL = [
    ("generation.engine.max_num_seqs", 7, SMOKE),
    ("generation.engine.cpu_kvcache_gb", 3, SMOKE),
    ("generation.engine.cpu_preload", False, SMOKE),
    ("generation.engine.shared_server", True, SMOKE),
    ("extract.models.0.gpu_memory_utilization", 0.5, SMOKE),
    ("generation.models.0.max_concurrency", 3, API),
    ("generation.models.0.request_timeout_s", 99, API),
    ("generation.models.0.max_retries", 2, API),
    ("generation.models.0.requests_per_minute", 10, API),
    ("generation.models.0.price_output_per_mtok", 1.0, API),
    ("generation.models.0.api_key_env", "OTHER_KEY", API),
]


@pytest.mark.parametrize(("key", "value", "base"), OPERATIONAL, ids=[k for k, _, _ in OPERATIONAL])
def test_an_operational_setting_changes_no_stage_digest(tmp_path, key, value, base):
    assert _changed(tmp_path, key, value, base) == set()


@pytest.mark.parametrize("field", sorted(OUTPUT_ENGINE_FIELDS))
def test_an_output_shaping_engine_setting_changes_exactly_the_stages_that_read_the_engine(tmp_path, field):
    current = params.load(ROOT / "params" / "smoke.yaml").generation.engine.model_dump()[field]
    assert _changed(tmp_path, f"generation.engine.{field}", not current) == _readers("generation.engine")
    assert _readers("generation.engine") == {"generate", "extract", "associations"}


def test_an_output_shaping_model_setting_changes_the_stage_of_that_model_only(tmp_path):
    assert _changed(tmp_path, "extract.models.0.max_model_len", 1024) == {"extract"}
    assert _changed(tmp_path, "generation.models.0.name", "renamed") == {"generate"}  # the name is in the rows


def test_every_engine_field_is_classified_once():
    assert not OUTPUT_ENGINE_FIELDS & OPERATIONAL_ENGINE_FIELDS


def test_an_operational_setting_reruns_nothing_under_make(tmp_path):
    """A finished run; the profile's KV-cache size and a model's memory share change: `make stamps`, then
    `make -n` on the last stage plans no stage."""
    run = "pytest-operational"
    data = tmp_path / "data"
    env = dict(os.environ, STORYBIAS_DATA=str(data))
    params_file = write_profile(tmp_path, {**SMOKE, "run_name": run})
    assert make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    time.sleep(0.01)
    for token in artifacts.MAKE_TARGETS:  # every stage finished, in order
        for name in artifacts.MAKE_TARGETS[token]:
            entry = artifacts.artifact(name)
            where = data / run if entry.root == "data" else tmp_path / "figures" / run
            where.mkdir(parents=True, exist_ok=True)
            (where / entry.pattern).write_text("stand-in")
            time.sleep(0.01)
    reports = [Path(make_rules.report(s)).name.removesuffix(".ipynb") for s in artifacts.STAGES]
    finished_reports(data / run / "reports", *reports)
    env["STORYBIAS_FIGURES"] = str(tmp_path / "figures")
    goals = ["figures", "explorer", f"PARAMS={params_file}", "STAMPS_FORCE="]
    assert "run-stage" not in make("-n", *goals, env=env).stdout
    changed = _set({**SMOKE, "run_name": run}, "generation.engine.cpu_kvcache_gb", 3)
    changed = _set(changed, "generation.models.0.gpu_memory_utilization", 0.5)
    write_profile(tmp_path, changed)
    assert make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    planned = make("-n", *goals, env=env).stdout
    assert "run-stage" not in planned and "cli explorer" not in planned, planned
    write_profile(tmp_path, _set(changed, "generation.engine.enforce_eager", False))  # output-shaping: 01, 03, 04 rerun
    assert make("stamps", f"PARAMS={params_file}", env=env).returncode == 0
    planned = make("-n", *goals, env=env).stdout
    assert "notebooks/01_generate.ipynb" in planned, planned
