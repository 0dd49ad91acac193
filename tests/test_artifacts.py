"""The stage and artifact registry (storybias.core.artifacts): one token per stage across Make, notebooks,
modules, params and manifests; paths, schemas and docs/data-contract.md from one place."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from storybias import cli
from storybias.config import params
from storybias.core import artifacts, make_rules, paths, registry_docs
from storybias.stages.associations import tables
from storybias.stages.associations.comparison import COMPARISON_SCHEMA
from storybias.stages.associations.findings import FINDINGS_SCHEMA
from storybias.stages.probes import probe

ROOT = paths.repo_root()
TOKENS = ("generate", "filter", "extract", "associations", "metrics", "probes", "crosslens", "figures")


def test_eight_stages_one_token_each():
    tokens = [s.token for s in artifacts.STAGES]
    assert len(set(tokens)) == len(tokens)
    # the paper's eight, in this order; a lens added by docs/extending.md sits among them
    assert [t for t in tokens if t in TOKENS] == list(TOKENS)
    assert sorted(p.name for p in (ROOT / "notebooks").glob("0*.ipynb")) == sorted(
        Path(s.notebook).name for s in artifacts.STAGES
    )
    fields = params.Profile.model_fields
    for stage in artifacts.STAGES:
        # notebook notebooks/NN_<token>.ipynb
        assert (ROOT / stage.notebook).is_file(), stage.notebook
        # package storybias.stages.<token> with the stage's run() (stage 08's package draws the figures
        # the notebook asks for; it has no run())
        assert stage.module == f"stages.{stage.token}", stage.token
        module = importlib.import_module(f"storybias.{stage.module}")
        assert (ROOT / "lib" / "storybias" / "stages" / stage.token / "__init__.py").is_file(), stage.token
        if stage.token != "figures":
            assert callable(module.run), stage.token
        # params: the sections the stage's stamp reads, all in the schema; the stage's own section
        # is its token, except stage 01, which reads `generation:` and `designs:`
        assert params.STAGE_SECTIONS[stage.token] == stage.sections
        assert all(s.split(".")[0] in fields for s in stage.sections)  # "generation.engine": a subsection
        assert stage.token in stage.sections or stage.token == "generate"
        # manifest: manifest_<token>.json (stage 08's is figures/<run>/figures.json, written by plots)
        manifest = artifacts.artifact(stage.manifest)
        assert manifest.stage == stage.token
        if stage.token != "figures":
            assert manifest.pattern == f"manifest_{stage.token}.json"
            assert artifacts.manifest_path("r", stage.token) == paths.run_dir("r") / f"manifest_{stage.token}.json"
    assert "extraction" not in fields and "extract" in fields


def _make_rules() -> dict[str, tuple[str, str]]:
    """stage token -> (the file its notebook rule makes, that rule's text) from the generated make/stages.mk."""
    text = (ROOT / make_rules.GENERATED_PATH).read_text().replace("\\\n", " ")
    rules = {}
    for m in re.finditer(
        r"^\$\((DATA|FIGURES)\)/(\S+):([^\n]*)\n\t\$\(call run_notebook,(\d\d)_(\w+),(\w+)\)", text, re.M
    ):
        _, target, prereqs, number, name, stage = m.groups()
        assert name == stage, f"notebook {number}_{name} run as stage {stage}"
        rules[stage] = (target, prereqs)
    return rules


def test_make_targets_are_the_registry_paths():
    rules = _make_rules()
    assert set(rules) == {s.token for s in artifacts.STAGES}
    text = (ROOT / make_rules.GENERATED_PATH).read_text()
    for stage in artifacts.STAGES:
        target, prereqs = rules[stage.token]
        first = artifacts.artifact(artifacts.MAKE_TARGETS[stage.token][0])
        assert target == first.pattern, (stage.token, target)
        assert stage.notebook in prereqs
        assert re.search(rf"^{stage.token}:.*## stage {stage.number:02d}", text, re.M), f"make {stage.token}"
    # every file in STAGE_TARGETS is a registry path of the stage that makes it
    made = {a.pattern for names in artifacts.MAKE_TARGETS.values() for a in map(artifacts.artifact, names)}
    assert set(artifacts.make_target_names(ROOT / make_rules.GENERATED_PATH)) == made


def test_make_rules_read_what_the_registry_says_each_stage_reads():
    """Each notebook rule's prerequisites are exactly the stage's registry inputs: the earlier stages'
    artifacts (``reads``) and the data files (``input_files``), besides its notebook and params stamp."""
    rules = {
        token: (target, rule.replace("$(wildcard ", "$(wildcard")) for token, (target, rule) in _make_rules().items()
    }
    by_pattern = {a.pattern: a.name for a in artifacts.ARTIFACTS}
    order = [s.token for s in artifacts.STAGES]  # the pipeline's order; numbers name notebooks only
    for stage in artifacts.STAGES:
        _, prereqs = rules[stage.token]
        words = prereqs.split("|")[0].split()
        assert stage.notebook in words and f"$(STAMPS)/{stage.token}.params" in words, stage.token
        reads = [by_pattern[w.split("/", 1)[1]] for w in words if w.startswith(("$(DATA)/", "$(FIGURES)/"))]
        files = [w[len("$(wildcard") : -1] for w in words if w.startswith("$(wildcard")]
        assert sorted(reads) == sorted(stage.reads), (stage.token, reads)
        assert sorted(files) == sorted(stage.input_files), (stage.token, files)
        assert len(words) == 2 + len(reads) + len(files), (stage.token, words)
        for name in stage.reads:  # an input is the Make target of a stage declared before it
            assert order.index(artifacts.artifact(name).stage) < order.index(stage.token), (stage.token, name)


def test_data_contract_is_generated_from_the_registry():
    committed = (ROOT / "docs" / "data-contract.md").read_text()
    assert committed == registry_docs.data_contract(), (
        "docs/data-contract.md differs from the registry: run "
        "`python -m storybias.cli data-contract > docs/data-contract.md`"
    )
    for entry in artifacts.ARTIFACTS:
        assert f"`{entry.pattern}`" in committed
        schema = entry.schema()
        if schema is not None:
            assert all(f"`{f.name}` {f.type}" in committed for f in schema), entry.name


def test_registry_lists_every_table_the_stages_define():
    from storybias.stages import metrics

    def named(stage: str) -> set[str]:
        return {a.name for a in artifacts.of_stage(stage) if a.pattern.endswith(".parquet")}

    assert named("metrics") == {f"metrics_{n}" for n in metrics.OUTPUT_SCHEMAS}
    assert named("associations") == {*tables.OUTPUT_SCHEMAS, "published_comparison", "associations_findings"}
    assert artifacts.schema("published_comparison") is COMPARISON_SCHEMA
    assert artifacts.schema("associations_findings") is FINDINGS_SCHEMA
    assert named("probes") == set(probe.OUTPUT_SCHEMAS)
    for name, schema in metrics.OUTPUT_SCHEMAS.items():
        assert artifacts.schema(f"metrics_{name}") is schema
    assert len({a.name for a in artifacts.ARTIFACTS}) == len(artifacts.ARTIFACTS)
    assert len({(a.root, a.pattern) for a in artifacts.ARTIFACTS}) == len(artifacts.ARTIFACTS)


def test_write_checks_columns_and_keeps_types(tmp_path, monkeypatch):
    monkeypatch.setenv("STORYBIAS_DATA", str(tmp_path))
    from storybias.stages.filter import VSR_SCHEMA

    row = {
        "design": "bedtime",
        "model": "m",
        "language": "en",
        "n_stories": 2,
        "n_valid": 1,
        "n_empty": 1,
        "n_truncated": 0,
        "n_refusal": 0,
        "n_wrong_language": 0,
        "n_low_confidence": 0,
        "vsr": 0.5,
    }
    # columns in another order are written in the schema's order, with its types
    frame = pd.DataFrame([row])[list(reversed(row))]
    written = artifacts.write("r", "vsr", frame)
    assert written == artifacts.vsr_path("r") == tmp_path / "r" / "vsr.parquet"
    assert pq.read_schema(written).remove_metadata().equals(VSR_SCHEMA)
    with pytest.raises(ValueError, match=r"missing \['vsr'\]"):
        artifacts.write("r", "vsr", frame.drop(columns="vsr"))
    with pytest.raises(ValueError, match=r"not in the schema \['extra'\]"):
        artifacts.write("r", "vsr", frame.assign(extra=1))
    # a table whose every value is null keeps the schema's type (pandas alone would write null)
    empty_reason = pd.DataFrame({"comparison": ["c"], "model": ["m"], "note": [None]})
    from storybias.stages.metrics import OUTPUT_SCHEMAS, to_contract

    path = artifacts.write("r", "metrics_grammatical_gender", to_contract(empty_reason, "grammatical_gender"))
    assert pq.read_schema(path).field("note").type == pa.string()
    assert OUTPUT_SCHEMAS["grammatical_gender"].names == pq.read_schema(path).names
    # JSON artifacts
    artifacts.write("r", "manifest_filter", {"stage": "filter"})
    assert (tmp_path / "r" / "manifest_filter.json").is_file()
    with pytest.raises(KeyError, match="no artifact 'nope'"):
        artifacts.write("r", "nope", {})


def test_an_unknown_section_is_refused_by_name(tmp_path):
    """The old `extraction:` section (renamed `extract:`) is an unknown key like any other."""
    raw = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    raw["extraction"] = raw.pop("extract")
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(raw))
    with pytest.raises(params.ParamsError, match="extraction"):
        params.load(old)


def test_cli_prints_stage_outputs_and_data_contract(capsys):
    assert cli.main(["outputs", "extract", str(ROOT / "params" / "smoke.yaml")]) == 0
    assert capsys.readouterr().out.split() == [str(artifacts.extractions_path("smoke"))]
    assert cli.main(["outputs", "figures", str(ROOT / "params" / "smoke.yaml")]) == 0
    assert capsys.readouterr().out.split() == [
        str(paths.figures_dir("smoke") / "figures.json"),
        str(paths.figures_dir("smoke") / "explorer.html"),
    ]
    assert cli.main(["data-contract"]) == 0
    assert capsys.readouterr().out == registry_docs.data_contract()


def test_stage_table_lists_the_stage_entries():
    table = artifacts.stage_table("filter")
    assert list(table["artifact"]) == ["filtered", "vsr", "manifest_filter"]
    assert table.loc[table.artifact == "vsr", "columns"].item().startswith("design: large_string, model: large_string")
    with pytest.raises(KeyError, match="no stage 'extraction'"):
        artifacts.stage_table("extraction")


# --- one declaration per stage (issue #59, item 1) ------------------------------------------------


def test_make_stages_mk_is_generated_from_the_registry():
    committed = (ROOT / make_rules.GENERATED_PATH).read_text()
    assert committed == make_rules.stages_mk(), (
        "make/stages.mk differs from the stage registry: run `python -m storybias.cli stages-mk > make/stages.mk`"
    )


def test_makefile_names_no_stage_outside_the_generated_part():
    """Adding a stage is a registry entry and a regenerated make/stages.mk: the Makefile itself names
    no stage token, notebook, stage target or per-stage stamp."""
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^include make/stages\.mk$", text, re.M)
    # comments and messages may name stages; `$(filter` is Make's function, `figures/` the figures root
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines() if not line.startswith("\t@echo"))
    code = code.replace("$(filter ", "$(")
    for stage in artifacts.STAGES:
        assert not re.search(rf"(?<![\w/-]){stage.token}(?![\w/-])", code.replace(",figures)/", ")/")), stage.token
        assert Path(stage.notebook).stem not in code
    for name in (n for names in artifacts.MAKE_TARGETS.values() for n in names):
        assert artifacts.artifact(name).pattern not in code, name


def test_stage_independence_contract_covers_every_stage_by_one_wildcard():
    """pyproject.toml's "no stage imports another stage" contract names ``storybias.stages.*`` (it once listed
    the stages by name and left out storybias.stages.crosslens; a new lens had to be added by hand): every
    registry stage and the explorer, which stage 08's Make target writes, is a package the wildcard covers."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    independent = next(c for c in contracts if c["type"] == "independence")
    assert independent["modules"] == ["storybias.stages.*"]
    packages = {p.parent.name for p in (ROOT / "lib" / "storybias" / "stages").glob("*/__init__.py")}
    expected = [s.module for s in artifacts.STAGES] + [f"stages.{side.command}" for side in artifacts.SIDE_TARGETS]
    assert all(module.startswith("stages.") and module.split(".", 1)[1] in packages for module in expected), expected


def test_every_make_target_of_the_registry_is_a_rule(tmp_path):
    """`make -pn` of the generated rules knows each stage's public target, Make target and report."""
    import subprocess

    done = subprocess.run(
        ["make", "-pn", "--no-print-directory", "help", "PARAMS=params/default.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rules = set(re.findall(r"^([^#\s][^:\s]*):", done.stdout, re.M))
    for stage in artifacts.STAGES:
        assert stage.token in rules
        assert f"reports/default/{Path(stage.notebook).stem}.ipynb" in rules
        for name in artifacts.MAKE_TARGETS[stage.token]:
            entry = artifacts.artifact(name)
            assert f"{'data' if entry.root == 'data' else 'figures'}/default/{entry.pattern}" in rules


def test_pipeline_stage_table_is_generated_from_the_registry():
    text = (ROOT / "docs" / "pipeline.md").read_text()
    assert text == registry_docs.with_stage_table(text), (
        "docs/pipeline.md's stage table differs from the registry: regenerate it from "
        "`python -m storybias.cli stage-table`"
    )
    assert registry_docs.stage_table() in registry_docs.data_contract()  # the data contract's index


def test_stage_times_reads_the_registry_stages():
    from storybias.tools import stage_times

    assert set(stage_times.DETAILS) <= set(artifacts.STAGE_BY_TOKEN)
    assert set(stage_times.MACHINE_STAGES) <= {s.token for s in artifacts.STAGES if s.runs_models}
