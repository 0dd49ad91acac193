"""Issue #59 item 5: the guide's walkthrough of adding a lens works, and names every file it touches.

The fast test reads the walkthrough in ``docs/extending.md``: numbered steps, each naming the one file it
touches, and the count it states. The slow one follows it in a copy of the working tree: on a finished run
of an imported table (no model; the stages before stage 07 seeded by their own ``run``), it adds a toy lens
(its package, notebook, registration, profile key and cross-lens measure) by the guide's steps, checks that
``make -n paper`` plans the lens, stage 07 and stage 08 and nothing else, runs ``make paper``, and finds the
lens in ``make help``, the cross-lens table and figure 17; the files the copy's git sees changed are exactly
those the guide names. Seeding keeps it to three notebooks: it took over five minutes with all ten.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from storybias.core import artifacts, paths
from storybias.stages.crosslens.measures import MEASURES
from working_tree import copy_working_tree

ROOT = paths.repo_root()
GUIDE = ROOT / "docs" / "extending.md"
LENS, NUMBER, MEASURE = "toylens", 9, "mean_words"
STORY = "Once upon a time a child walked to school and met a friend. They laughed all the way home. "


def guide_section(title: str, text: str | None = None) -> str:
    """The section of docs/extending.md under the level-2 heading ``title`` (up to the next one)."""
    text = GUIDE.read_text() if text is None else text
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/extending.md has no section '## {title}'"
    return match.group(1)


def step_files(section: str) -> list[str]:
    """The file each numbered step names first (``N. **`path`**``), in order."""
    return re.findall(r"^\d+\. \*\*`([^`]+)`\*\*", section, re.M)


def stated_count(section: str) -> int:
    """The number of files the section says it touches (``**N files**``)."""
    match = re.search(r"\*\*(\d+) files\*\*", section)
    assert match, "the section states no '**N files**'"
    return int(match.group(1))


def lens_files(token: str, number: int) -> list[str]:
    """The files of the lens walkthrough, its placeholders filled in for one lens."""
    named = step_files(guide_section("Adding a lens"))
    return [name.replace("<lens>", token).replace("NN", f"{number:02d}") for name in named]


@pytest.mark.parametrize("title", ["Adding a lens", "Adding a metric", "Adding a figure", "Adding an engine backend"])
def test_each_walkthrough_names_its_files_and_states_their_count(title):
    """Each walkthrough is numbered steps naming one file each (existing ones exist), and its count is theirs."""
    section = guide_section(title)
    named = step_files(section)
    assert named, f"'{title}' has no numbered step naming a file"
    assert len(set(named)) == len(named), f"'{title}' names a file twice: {named}"
    assert stated_count(section) == len(named), f"'{title}' states {stated_count(section)} files, names {named}"
    for name in named:
        if "<" not in name and "NN" not in name:
            assert (ROOT / name).is_file(), f"'{title}' names {name}, which does not exist"


def test_the_lens_walkthrough_names_its_package_notebook_registration_profile_key_and_measure():
    """The lens's files (placeholders filled in): the five the issue names are among them."""
    named = lens_files(LENS, NUMBER)
    for needed in (
        f"lib/storybias/stages/{LENS}/__init__.py",
        f"notebooks/{NUMBER:02d}_{LENS}.ipynb",
        "lib/storybias/core/artifacts.py",
        "lib/storybias/config/params.py",
        "lib/storybias/stages/crosslens/measures.py",
    ):
        assert needed in named, needed


# --- the walkthrough, followed in a copy ----------------------------------------------------------------

PACKAGE = f'''"""Stage {NUMBER:02d}: a toy lens, the mean length in words of the valid stories per model x language."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from storybias.config.params import Params
from storybias.core import artifacts
from storybias.core.io import write_json_atomic
from storybias.core.locks import holds_run_lock
from storybias.core.results import StageResult

OUTPUT_SCHEMA = pa.schema(
    [("model", pa.string()), ("language", pa.string()), ("n", pa.int64()), ("mean_words", pa.float64())]
)


@holds_run_lock("{LENS}")
def run(params: Params) -> StageResult:
    """The mean length of the valid stories per model x language; the manifest last (Make's target)."""
    filtered = pd.read_parquet(artifacts.path(params.run_name, "filtered"))
    valid = filtered[filtered["is_valid"]]
    words = valid["text"].str.split().str.len().rename("words")
    table = (
        pd.concat([valid[["model", "language"]], words], axis=1)
        .groupby(["model", "language"], as_index=False)
        .agg(n=("words", "size"), mean_words=("words", "mean"))
    )
    table = table[table["mean_words"] >= params.{LENS}.min_words]
    artifacts.write(params.run_name, "{LENS}", table)
    manifest = {{"stage": "{LENS}", "n_cells": len(table), "params": params.resolved()["{LENS}"]}}
    write_json_atomic(manifest, artifacts.manifest_path(params.run_name, "{LENS}"))
    return StageResult("{LENS}", params.run_name, tables={{"{LENS}": table}}, manifest=manifest)
'''

STAGE = f"""    Stage({NUMBER}, "{LENS}", "stages.{LENS}", ("{LENS}",), "a toy lens: story lengths", ("filtered",)),
"""
ARTIFACTS = f"""    Artifact("{LENS}", "{LENS}.parquet", "{LENS}", "mean words", "stages.{LENS}:OUTPUT_SCHEMA"),
    _manifest("{LENS}", "counts and parameters of the toy lens"),
"""
SETTINGS = """class ToyLensSettings(Strict):
    min_words: float = 0.0


"""
PART = f'''@register(
    reads=("{LENS}",),
    measures=(MeasureSpec("{MEASURE}", "toy_lengths", "no valid story", "none: a toy lens keeps no interval"),),
)
def toylens_part(run: LensInputs) -> CellMeasures:
    """The toy lens's mean story length per cell."""
    nan = float("nan")
    cell = lambda value, low, high, n: {{"value": value, "low": low, "high": high, "n": n, "reason": ""}}  # noqa: E731
    return {{
        (r.model, r.language): {{"{MEASURE}": cell(r.mean_words, nan, nan, r.n)}}
        for r in run["{LENS}"].itertuples(index=False)
    }}


'''


LENS_TEST = f'''from storybias.core import artifacts
from storybias.stages import {LENS}


def test_the_lens_table_is_registered_with_its_schema():
    assert artifacts.schema("{LENS}") == {LENS}.OUTPUT_SCHEMA
'''


def _edit(path: Path, anchor: str, insert: str, before: bool = True) -> None:
    """Insert ``insert`` before (or after) the one occurrence of ``anchor`` in ``path``."""
    text = path.read_text()
    assert text.count(anchor) == 1, f"{path}: {anchor!r} occurs {text.count(anchor)} times"
    path.write_text(text.replace(anchor, insert + anchor if before else anchor + insert))


def _notebook(path: Path) -> None:
    cells = [
        nbformat.v4.new_markdown_cell(f"# {NUMBER:02d} · A toy lens\n\nThe mean length of the valid stories."),
        nbformat.v4.new_code_cell(
            'import os\n\nparams_file = os.environ.get("STORYBIAS_PARAMS", "params/default.yaml")',
            metadata={"tags": ["parameters"]},
        ),
        nbformat.v4.new_code_cell(
            f"from storybias.config import params\nfrom storybias.stages import {LENS}\n\n"
            f'r = {LENS}.run(params.load(params_file))\ndisplay(r["{LENS}"])'
        ),
    ]
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "storybias", "display_name": "storybias", "language": "python"}
    nbformat.write(notebook, path)


def _cli(copy: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(copy / "lib"))
    done = subprocess.run([sys.executable, "-m", "storybias.cli", *args], cwd=copy, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def follow_lens_walkthrough(copy: Path) -> None:
    """The guide's steps, in its order, for the toy lens."""
    package = copy / "lib" / "storybias" / "stages" / LENS / "__init__.py"
    package.parent.mkdir()
    package.write_text(PACKAGE)
    _notebook(copy / "notebooks" / f"{NUMBER:02d}_{LENS}.ipynb")
    registry = copy / "lib" / "storybias" / "core" / "artifacts.py"
    _edit(registry, "    # reads the metrics section for the default comparison", STAGE)
    _edit(registry, '    *(\n        Artifact(name, f"{name}.parquet", "crosslens"', ARTIFACTS)
    _edit(registry, '("manifest_associations", "manifest_metrics", "manifest_probes"', ', "manifest_toylens"', False)
    profile = copy / "lib" / "storybias" / "config" / "params.py"
    _edit(profile, "class Profile(Strict):", SETTINGS)
    _edit(
        profile,
        "    crosslens: CrossLensSettings = CrossLensSettings()\n",
        "    toylens: ToyLensSettings = ToyLensSettings()\n",
        False,
    )
    _edit(copy / "lib" / "storybias" / "stages" / "crosslens" / "measures.py", "def crosslens_table(", PART)
    (copy / "make" / "stages.mk").write_text(_cli(copy, "stages-mk"))
    (copy / "docs" / "data-contract.md").write_text(_cli(copy, "data-contract"))
    code = "from pathlib import Path; from storybias.core import registry_docs as r; p = Path('docs/pipeline.md'); "
    code += "p.write_text(r.with_stage_table(p.read_text()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=copy, env=dict(os.environ, PYTHONPATH=str(copy / "lib")))
    assert done.returncode == 0
    (copy / "tests" / f"test_{LENS}.py").write_text(LENS_TEST)


def _git(copy: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=copy, capture_output=True, text=True, check=True).stdout


def _make(copy: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args], cwd=copy, env=env, capture_output=True, text=True, timeout=900
    )


def _table_profile(folder: Path, lens_key: bool) -> Path:
    """A profile importing four English bedtime stories of one model: no stage runs a model. Before the lens
    exists its key would be refused (unknown keys are), so the seed's profile has none (``lens_key``)."""
    table = folder / "stories.csv"
    pd.DataFrame(
        {
            "story": [STORY * 3, STORY * 4, STORY * 3, STORY * 5],
            "lang": ["en"] * 4,
            "llm": ["lab/model-a"] * 4,
            "uid": [f"s{i}" for i in range(4)],
            "child": ["boy", "girl", "boy", "girl"],
            "hero_gender": ["woman", "man", "woman", "man"],
        }
    ).to_csv(table, index=False)
    columns = {"text": "story", "language": "lang", "model": "llm", "id": "uid"}
    columns |= {"conditions": {"cond_child_gender": "child"}, "extracted": {"gender": "hero_gender"}}
    corpus = {"format": "table", "design": "bedtime", "path": str(table), "extractions": "published"}
    profile = {"run_name": "toy-lens", "corpus": {**corpus, "columns": columns}}
    profile |= {LENS: {"min_words": 10}} if lens_key else {}
    path = folder / "toy.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


# The seed: the stages before stage 07 run in one process by their own ``run`` (what their notebooks call),
# and the explorer page by its command, so that the copy holds a finished run's data before the lens exists.
SEED = """
import importlib, sys
from storybias import cli
from storybias.config import params
from storybias.core import artifacts
profile = params.load(sys.argv[1])
for token in sys.argv[2:]:
    importlib.import_module(f"storybias.{artifacts.STAGE_BY_TOKEN[token].module}").run(profile)
sys.exit(cli.main(["explorer", sys.argv[1]]))
"""


def seed_finished_run(copy: Path, params_file: Path, reports: Path, env: dict) -> list[str]:
    """A finished run of the stages the lens does not touch (those before stage 07, and the explorer page),
    on the copy as it was: their stamps first, then their data; returns their tokens. Their executed
    notebooks are stand-ins (``{}``): no stage reads a report, and this test checks none of theirs."""
    before = [s.token for s in artifacts.STAGES if s.number < artifacts.STAGE_BY_TOKEN["crosslens"].number]
    assert _make(copy, "stamps", f"PARAMS={params_file}", env=env).returncode == 0
    seeded = subprocess.run(
        [sys.executable, "-c", SEED, str(params_file), *before], cwd=copy, env=env, capture_output=True, text=True
    )
    assert seeded.returncode == 0, seeded.stdout[-2000:] + seeded.stderr[-3000:]
    reports.mkdir(parents=True, exist_ok=True)
    for stage in artifacts.STAGES:
        if stage.token in before:
            (reports / Path(stage.notebook).name).write_text("{}")
    return before


def planned_stages(copy: Path, params_file: Path, env: dict) -> set[str]:
    """The stages whose notebook `make paper` would run now (`make stamps`, then `make -n paper` with the stamps
    kept; a dry run also lists the report rule of a stage it reruns). The explorer page is planned by none."""
    assert _make(copy, "stamps", f"PARAMS={params_file}", env=env).returncode == 0
    dry = _make(copy, "-n", "paper", f"PARAMS={params_file}", "SERVE=0", "STAMPS_FORCE=", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "cli explorer" not in dry.stdout, dry.stdout
    return set(re.findall(r"run-stage (\w+) notebooks/", dry.stdout))


@pytest.mark.slow
def test_a_toy_lens_added_by_the_guide_runs_through_make_paper(tmp_path):
    """On a finished run, the toy lens added by the guide's steps is a stage of `make help`; `make paper` plans
    it, stage 07 and stage 08 and nothing else (the stages before it keep their results), and after it the
    lens is in the cross-lens table and figure 17; the copy's changed files are exactly the guide's list."""
    copy = copy_working_tree(tmp_path / "repo")
    checks_env = dict(os.environ, PYTHONPATH=str(copy / "lib"))
    env = checks_env | {"STORYBIAS_DATA": str(tmp_path / "data"), "STORYBIAS_FIGURES": str(tmp_path / "figures")}
    stamp = re.search(r"^VENV_STAMP :?= (\S+)$", _make(copy, "-pn", "help", env=env).stdout, re.M)
    assert stamp and (copy / stamp.group(1)).exists(), "the environment's stamp"
    run = tmp_path / "data" / "toy-lens"
    seeded = seed_finished_run(copy, _table_profile(tmp_path, lens_key=False), run / "reports", env)
    seeded_at = {p.name: p.stat().st_mtime_ns for p in run.glob("*.parquet")}
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "-m", "before the lens")

    follow_lens_walkthrough(copy)
    changed = {line[3:] for line in _git(copy, "status", "--porcelain", "--untracked-files=all").splitlines()}
    assert changed == set(lens_files(LENS, NUMBER))

    # the registry's derived copies (rules, contract list, stage table, data contract, stage 07's inputs) agree
    checks = ["tests/test_artifacts.py", "tests/test_crosslens.py", "tests/test_crosslens_registry.py"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *checks]
    checked = subprocess.run(
        [*command, f"tests/test_{LENS}.py"], cwd=copy, env=checks_env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout[-3000:]
    imports = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))], cwd=copy, env=env, capture_output=True
    )
    assert imports.returncode == 0, imports.stdout.decode()[-3000:]  # the wildcard contract covers the lens
    listed = _make(copy, "help", env=env)
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"^\s*{LENS}\b.*stage {NUMBER:02d}", listed.stdout, re.M), listed.stdout

    params_file = _table_profile(tmp_path, lens_key=True)  # the lens's profile key, now known
    assert planned_stages(copy, params_file, env) == {LENS, "crosslens", "figures"}
    done = _make(copy, "paper", f"PARAMS={params_file}", "SERVE=0", env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert planned_stages(copy, params_file, env) == set()

    assert seeded and all(run.joinpath(name).stat().st_mtime_ns == at for name, at in seeded_at.items())
    lenses = pd.read_parquet(run / "crosslens.parquet")
    assert lenses.loc[lenses["language"] == "en", MEASURE].notna().all(), lenses
    assert json.loads((run / "manifest_crosslens.json").read_text())["lenses"][MEASURE] == "toy_lengths"
    assert (run / "reports" / f"{NUMBER:02d}_{LENS}.ipynb").is_file()
    # figure 17 draws one more measure than this checkout registers, and shows the toy lens's values
    index = json.loads((tmp_path / "figures" / "toy-lens" / "figures.json").read_text())
    stats = next(f["stats"] for f in index["figures"] if f["stem"] == "17_crosslens")
    assert stats["n_measures"] == len(MEASURES) + 1, stats
    assert stats["n_cells"] * stats["n_measures"] - stats["n_missing"] >= lenses[MEASURE].notna().sum() > 0, stats
    assert LENS not in artifacts.STAGE_BY_TOKEN  # this checkout is untouched: the lens lives in the copy only
