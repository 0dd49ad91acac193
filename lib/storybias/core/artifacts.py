"""The registry of stages and artifacts: one name per stage, one entry per file a stage writes.

Each stage has one token (``generate``, ``filter``, ``extract``, ``associations``, ``metrics``,
``probes``, ``crosslens``, ``figures``) used as its Make target, notebook name
(``notebooks/NN_<token>.ipynb``), ``lib`` module (``storybias.stages.<token>``), params section, manifest
(``manifest_<token>.json``) and recorded values (``values/<token>.json``). :data:`STAGES` is the one
declaration of the stages: the Makefile's per-stage rules (``make/stages.mk``, written by
``python -m storybias.cli stages-mk``, :mod:`storybias.core.make_rules`), the import-linter contract that
stages never import each other, ``stage-times``, the data contract's index and the stage table of
``docs/pipeline.md`` are derived from it, and tests check that each derived copy equals it.

Each artifact has a name, a path pattern under ``data/<run>/`` (or ``figures/<run>/``), its Arrow
schema, the stage that writes it and a one-line meaning (:data:`ARTIFACTS`). ``storybias.core.paths``
resolves artifact paths from here; stages write through :func:`write`, which checks the frame
against the schema; ``docs/data-contract.md`` is generated from here (:func:`data_contract`, command
``python -m storybias.cli data-contract``), with the longer prose of each stage kept beside this
module in ``data_contract/<stage>.md``.

Schemas are referenced, not copied: an entry names the module constant that holds it (e.g.
``storybias.stages.metrics:OUTPUT_SCHEMAS[sc]``), loaded only when asked for, so importing this module
stays cheap. Files written without a fixed schema (their columns follow the run, e.g. the
agreement table's raters) have ``schema=None`` and say so.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from storybias.core import paths
from storybias.core.io import parquet_writer_atomic, write_json_atomic, write_parquet_atomic


@dataclass(frozen=True)
class Stage:
    """One pipeline stage under its one token."""

    number: int
    token: str
    module: str  # storybias.<module> holds the stage's run()
    sections: tuple[str, ...]  # the params sections the stage reads; "a.b" is subsection b of a
    title: str
    reads: tuple[str, ...] = ()  # the registry artifacts (earlier stages' Make targets) it reads
    input_files: tuple[str, ...] = ()  # globs under the repository of the data files it reads
    # the profile's settings that name files it reads ("a.b.c"; a list of models: "generation.models.chat_template"):
    # each file's sha256 enters the stage's params stamp (storybias.config.input_stamps)
    profile_files: tuple[str, ...] = ()
    # its notebook runs models (stages 01, 03, 04): under SERVE=1 Make keeps them up across these stages
    runs_models: bool = False
    target: str | None = None  # the artifact Make tracks for the stage, written last (default: its manifest)

    @property
    def make_target(self) -> str:
        """The registry name of the artifact Make tracks for the stage (its notebook writes it last)."""
        return self.target or self.manifest

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.number:02d}_{self.token}.ipynb"

    @property
    def manifest(self) -> str:
        """The registry name of the stage's manifest artifact."""
        return f"manifest_{self.token}"


# The files each stage reads besides its parameters, as globs under the repository: editing one reruns
# the stage (the Makefile's rule lists them; tests/test_artifacts.py checks it against this registry).
DESIGN_FILES = "params/designs/*/*.yaml"
DESIGN_SPECS = "params/designs/*/design.yaml"

STAGES: tuple[Stage, ...] = (
    Stage(
        1,
        "generate",
        "stages.generate",
        ("generation", "designs", "corpus"),
        "stories",
        (),
        (DESIGN_FILES,),
        ("corpus.path", "generation.models.chat_template"),
        runs_models=True,
        target="stories",
    ),
    Stage(
        2,
        "filter",
        "stages.filter",
        ("filter",),
        "language identification, refusals, valid-story rate",
        ("stories",),
        ("params/refusals/*.yaml",),
        target="filtered",
    ),
    # stages 03 and 04 run their models on generation.engine: a setting there that shapes outputs reruns them
    Stage(
        3,
        "extract",
        "stages.extract",
        ("filter", "extract", "generation.engine", "corpus"),
        "attributes of every valid story",
        ("filtered",),
        (DESIGN_SPECS, "params/extract/gold/*.yaml", "params/extract/*.yaml"),
        ("extract.models.chat_template", "extract.human_validation"),  # the validation: notebook 03's report
        runs_models=True,
        target="extractions",
    ),
    Stage(
        4,
        "associations",
        "stages.associations",
        ("associations", "generation.engine"),
        "StereoTales associations and harm",
        ("extractions",),
        (DESIGN_FILES,),
        ("associations.judge.models.chat_template", "associations.human_ratings", "associations.published"),
        runs_models=True,
    ),
    Stage(
        5,
        "metrics",
        "stages.metrics",
        ("metrics",),
        "BiasedTales-ML and Feng et al. metrics",
        ("extractions",),
        ("params/lexicon/*.yaml", DESIGN_SPECS),
    ),
    Stage(
        6,
        "probes",
        "stages.probes",
        ("probes",),
        "Feng et al. probes and cultural markers",
        ("extractions",),
        ("params/cues/*.yaml",),
        ("probes.human_validation.markers", "probes.human_validation.labels"),
    ),
    # reads the metrics section for the default comparison (the first of metrics.comparisons)
    Stage(
        7,
        "crosslens",
        "stages.crosslens",
        ("crosslens", "metrics.comparisons"),
        "the three lenses side by side",
        ("manifest_associations", "manifest_metrics", "manifest_probes"),
    ),
    Stage(
        8,
        "figures",
        "stages.figures",
        ("figures",),
        "every figure, and the stories explorer",
        ("filtered", "manifest_associations", "manifest_metrics", "manifest_probes", "manifest_crosslens"),
    ),
)
STAGE_BY_TOKEN: dict[str, Stage] = {s.token: s for s in STAGES}


@dataclass(frozen=True)
class Artifact:
    """One file a stage writes. ``pattern`` is relative to the run's folder under ``root``."""

    name: str
    pattern: str
    stage: str
    meaning: str
    schema_ref: str | None = None  # "module:ATTRIBUTE" or "module:MAPPING[key]" or "module:function()"
    root: str = "data"  # "data": data/<run>/; "figures": figures/<run>/

    def path(self, run_name: str) -> Path:

        base = paths.run_dir(run_name) if self.root == "data" else paths.figures_dir(run_name)
        return base / self.pattern

    def schema(self) -> pa.Schema | None:
        return None if self.schema_ref is None else _load_schema(self.schema_ref)


def _load_schema(ref: str) -> pa.Schema:
    module_name, attr = ref.split(":")
    module = importlib.import_module(f"storybias.{module_name}")
    if attr.endswith("()"):
        return getattr(module, attr[:-2])()
    if "[" in attr:
        mapping, key = attr[:-1].split("[")
        return getattr(module, mapping)[key]
    return getattr(module, attr)


def _manifest(stage: str, meaning: str) -> Artifact:
    return Artifact(f"manifest_{stage}", f"manifest_{stage}.json", stage, meaning)


# stage 05's tables, by the name in metrics_<name>.parquet (schemas: metrics.OUTPUT_SCHEMAS)
_METRICS = {
    "sc": "S_C per comparison x model x language x kind x category (BiasedTales-ML Eq. 1)",
    "jsd": "Jensen-Shannon divergence of the two groups' narrative distributions per model x language",
    "cosine": "cosine similarity of the S_C vectors between two languages (BiasedTales-ML Eq. 3)",
    "log_odds": "top words by weighted log-odds z per comparison x model x field x group",
    "grammatical_gender": "Mann-Whitney test of grammatical- vs natural-gender languages per model",
    "vsr_jsd": "the JSD table with the design's valid-story rate beside it (BiasedTales-ML Table 3)",
    "occupations": "Feng et al.'s M_S and M_B per model x language x task x occupation x denominator",
    "aggregates": "M_S and M_B averaged over occupations per model x language x task",
    "anova": "ANOVA of M_S and M_B with partial omega squared and BH-adjusted p per term",
    "glm": "binomial GLM Wald tests of the female and identified shares per term",
}
_ASSOCIATIONS = {
    "associations_attributes": "one Fisher r x c test per model x scope x attribute pair (Cramer's V, retained)",
    "associations_values": "every cell of a BH-significant pair: lift, one-sided Fisher p, significant",
    "associations_shared": "significant associations pooled over models, with the judges' harm",
    "associations_power": "stories per value, testability and minimum detectable lift (associations.power)",
    "harm_ratings": "every judge answer: harm 1-5 and realism per association x judge x repetition",
}
_PROBES = {
    "probes": "out-of-fold ROC AUC of the female-vs-male probe, full text and cues deleted",
    "umap": "2-D projection of the sampled stories' embeddings (display only)",
    "cultural": "narrative-weighted cultural-marker relevance per source language x genre x context",
    "cultural_advantage": "self-context advantage per source language x genre, with bootstrap CI",
    "separability": "balanced accuracy of the marker source-language probe per marker version",
    "probes_per_model": "the gender probe refitted per model x language (AUC, Delta AUC) for the cross-lens stage",
}
_CROSSLENS = {
    "crosslens": "each lens's headline measure per model x language, with interval, n and why it is missing",
    "crosslens_agreement": "every pair of cross-lens measures: within-language rank r, whole-model permutation p, BH",
}

ARTIFACTS: tuple[Artifact, ...] = (
    Artifact(
        "stories",
        "stories.parquet",
        "generate",
        "one row per planned story: conditions, prompt, text, finish reason",
        "config.plan:stories_schema()",
    ),
    _manifest("generate", "resolved parameters, seeds, counts, versions and timings of stage 01"),
    Artifact(
        "corpus",
        "corpus.parquet",
        "generate",
        "an imported corpus only: each story's source file, row and ids, prompt variant, published extraction",
        "stages.generate.corpus:CORPUS_SCHEMA",
    ),
    Artifact(
        "filtered",
        "filtered.parquet",
        "filter",
        "every story with its language, refusal and validity checks",
        "stages.filter:filtered_schema()",
    ),
    Artifact(
        "vsr",
        "vsr.parquet",
        "filter",
        "valid-story rate and exclusion counts per design x model x language",
        "stages.filter:VSR_SCHEMA",
    ),
    _manifest("filter", "the stage's counts (valid stories, reasons, refusal rules) and its parameters"),
    Artifact(
        "extractions",
        "extractions.parquet",
        "extract",
        "one row per valid story: the extracted protagonist, demographics and lists",
        "stages.extract.answers:extractions_schema()",
    ),
    Artifact(
        "extraction_raw",
        "extraction_raw.parquet",
        "extract",
        "every attempt of every extraction answer, raw text, parse status and cache key",
        "stages.extract.answers:RAW_SCHEMA",
    ),
    Artifact(
        "extraction_agreement",
        "extraction_agreement.parquet",
        "extract",
        "per field: agreement between extractors or runs (columns follow the raters)",
    ),
    Artifact("gold_scores", "gold_scores.parquet", "extract", "gold-set scores of the primary extractor per field"),
    Artifact("gold_predictions", "gold_predictions.parquet", "extract", "the primary extractor's gold-set answers"),
    Artifact(
        "gold_targets",
        "gold_targets.parquet",
        "extract",
        "issue #15's gold-set target numbers per language (extract.gold_targets)",
    ),
    Artifact("gold_summary", "gold_summary.json", "extract", "gold-set evaluation summary"),
    Artifact(
        "published_agreement",
        "published_agreement.parquet",
        "extract",
        "corpus.extractions both: storybias' extraction against the published consensus per field x language",
        "stages.extract.released_profiles:AGREEMENT_SCHEMA",
    ),
    _manifest("extract", "extractor timings, tokens, reuse reasons and parse failures"),
    *(
        Artifact(name, f"{name}.parquet", "associations", meaning, f"stages.associations.tables:OUTPUT_SCHEMAS[{name}]")
        for name, meaning in _ASSOCIATIONS.items()
    ),
    Artifact(
        "published_comparison",
        "published_comparison.parquet",
        "associations",
        "associations.published set: each published association reproduced, missed, underpowered or untested per "
        "model x scope",
        "stages.associations.comparison:COMPARISON_SCHEMA",
    ),
    Artifact(
        "associations_findings",
        "associations_findings.parquet",
        "associations",
        "StereoTales' headline counts per model x scope: tables, significant and harmful associations, n",
        "stages.associations.findings:FINDINGS_SCHEMA",
    ),
    Artifact(
        "stereotales_associations",
        "stereotales_associations",
        "associations",
        "a folder: the run's tests as StereoTales' released association JSONL, one file per model x scope",
    ),
    _manifest("associations", "counts, judges, human agreement and parameters of stage 04"),
    *(
        Artifact(
            f"metrics_{name}", f"metrics_{name}.parquet", "metrics", meaning, f"stages.metrics:OUTPUT_SCHEMAS[{name}]"
        )
        for name, meaning in _METRICS.items()
    ),
    _manifest("metrics", "notes, stories excluded for parse failures, and the metrics parameters"),
    *(
        Artifact(name, f"{name}.parquet", "probes", meaning, f"stages.probes.probe:OUTPUT_SCHEMAS[{name}]")
        for name, meaning in _PROBES.items()
    ),
    _manifest("probes", "embedding backend, timings, counts, notes and parameters of stage 06"),
    *(
        Artifact(name, f"{name}.parquet", "crosslens", meaning, f"stages.crosslens.measures:{name.upper()}_SCHEMA")
        for name, meaning in _CROSSLENS.items()
    ),
    _manifest("crosslens", "the comparison read, the lenses, counts, missing measures and parameters of stage 07"),
    Artifact(
        "manifest_figures",
        "figures.json",
        "figures",
        "index of the figures drawn: stable file name, caption, statistic quoted",
        root="figures",
    ),
    Artifact(
        "explorer", "explorer.html", "figures", "the stories explorer, one self-contained HTML page", root="figures"
    ),
)
ARTIFACT_BY_NAME: dict[str, Artifact] = {a.name: a for a in ARTIFACTS}


@dataclass(frozen=True)
class SideTarget:
    """A file of a stage that a command writes, not the stage's notebook, under its own Make target
    (named after the artifact): stage 08's stories explorer."""

    artifact: str
    stage: str
    reads: tuple[str, ...]  # the registry artifacts it reads (besides its stage's params stamp)
    command: str  # the storybias.cli command that writes it from the profile
    title: str


SIDE_TARGETS: tuple[SideTarget, ...] = (
    SideTarget(
        "explorer",
        "figures",
        ("filtered", "extractions", "manifest_associations"),
        "explorer",
        "the stories explorer, one HTML page in figures/<run>/",
    ),
)

# The files Make tracks for each stage (each written last by what writes it): `make <stage>` is up to
# date when they are. Stage 08 has two (the figures and the explorer, separate Make targets).
MAKE_TARGETS: dict[str, tuple[str, ...]] = {
    stage.token: (stage.make_target, *(side.artifact for side in SIDE_TARGETS if side.stage == stage.token))
    for stage in STAGES
}


def artifact(name: str) -> Artifact:
    try:
        return ARTIFACT_BY_NAME[name]
    except KeyError:
        raise KeyError(f"no artifact {name!r} in the registry (storybias.core.artifacts.ARTIFACTS)") from None


def path(run_name: str, name: str) -> Path:
    """Where artifact ``name`` of run ``run_name`` lives."""
    return artifact(name).path(run_name)


def schema(name: str) -> pa.Schema | None:
    return artifact(name).schema()


def of_stage(stage: str) -> list[Artifact]:
    if stage not in STAGE_BY_TOKEN:
        raise KeyError(f"no stage {stage!r}; stages: {', '.join(STAGE_BY_TOKEN)}")
    return [a for a in ARTIFACTS if a.stage == stage]


def write(run_name: str, name: str, frame: Any) -> Path:
    """Write artifact ``name`` of the run atomically: a table with its registry schema (a column
    missing from or extra to the schema is an error naming both), anything else as JSON."""

    entry = artifact(name)
    target = entry.path(run_name)
    if entry.pattern.endswith(".json"):
        return write_json_atomic(frame, target)
    if not entry.pattern.endswith(".parquet"):
        raise ValueError(f"artifact {name!r} ({entry.pattern}) is not a table or JSON: write it yourself")
    expected = entry.schema()
    if expected is not None:
        columns = list(frame.column_names if isinstance(frame, pa.Table) else frame.columns)
        missing = [c for c in expected.names if c not in columns]
        extra = [c for c in columns if c not in expected.names]
        if missing or extra:
            raise ValueError(
                f"{entry.pattern}: columns differ from the registry schema "
                f"(missing {missing}, not in the schema {extra}); see docs/data-contract.md"
            )
        if not isinstance(frame, pa.Table):
            frame = frame[expected.names]
    return write_parquet_atomic(frame, target, schema=expected)


@contextmanager
def writer(run_name: str, name: str) -> Iterator[Callable[[pa.Table], None]]:
    """Write table artifact ``name`` batch by batch (a corpus too large to hold twice): each batch is
    cast to the registry schema; the file appears only when the block ends without an error."""
    entry = artifact(name)
    expected = entry.schema()
    if expected is None or not entry.pattern.endswith(".parquet"):
        raise ValueError(f"artifact {name!r} has no fixed table schema: write it with write()")

    with parquet_writer_atomic(entry.path(run_name), expected) as out:

        def write_batch(batch: pa.Table) -> None:
            out.write_table(batch.select(expected.names).cast(expected))

        yield write_batch


def outputs(stage: str, run_name: str) -> list[Path]:
    """The files Make tracks for ``stage`` (see MAKE_TARGETS)."""
    return [path(run_name, name) for name in MAKE_TARGETS[stage]]


def stage_table(stage: str) -> pd.DataFrame:
    """The registry's entries of one stage as a table (the notebooks' data-contract cells show it)."""

    rows = []
    for entry in of_stage(stage):
        kind = entry.schema()
        prefix = "data/<run>/" if entry.root == "data" else "figures/<run>/"
        rows.append(
            {
                "artifact": entry.name,
                "path": prefix + entry.pattern,
                "meaning": entry.meaning,
                "columns": "" if kind is None else ", ".join(f"{f.name}: {f.type}" for f in kind),
            }
        )
    return pd.DataFrame(rows)


def make_target_names(makefile: str | os.PathLike[str]) -> list[str]:
    """The file names in a makefile's STAGE_TARGETS (for the test that checks them against the registry)."""
    text = Path(makefile).read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("STAGE_TARGETS :="))
    return [word.split("/")[-1] for word in line.split(":=", 1)[1].split()]


# Stage artifacts: their names and patterns live in the registry (storybias.core.artifacts, the data
# contract in docs/data-contract.md); these helpers resolve the most read ones through it.
def artifact_path(run_name: str, name: str) -> Path:
    """Where artifact ``name`` (a storybias.core.artifacts.ARTIFACTS entry) of the run lives."""

    return path(run_name, name)


def stories_path(run_name: str) -> Path:
    return artifact_path(run_name, "stories")


def filtered_path(run_name: str) -> Path:
    return artifact_path(run_name, "filtered")


def vsr_path(run_name: str) -> Path:
    return artifact_path(run_name, "vsr")


def extractions_path(run_name: str) -> Path:
    return artifact_path(run_name, "extractions")


def manifest_path(run_name: str, stage: str) -> Path:
    """manifest_<stage>.json (stage 08's is figures/<run>/figures.json)."""

    return path(run_name, STAGE_BY_TOKEN[stage].manifest)
