"""Run parameters: YAML profiles in params/, validated by one pydantic schema.

The schema is ``Profile``, one section per stage: the sections are defined in ``story_sections``
(stages 01-03) and ``analysis_sections`` (stages 04-07 and planning) and re-exported here, so every
caller imports them from this module; the cross-section checks, the loader and the stage stamps live here.

    from storybias.config import params
    p = params.load("params/default.yaml")      # raises ParamsError naming the key and the file

Every section forbids unknown keys, so a typo fails loudly instead of being ignored; a key written
twice in one mapping, a quoted number (``"3"``) or a bool where a number belongs is refused too.
Validation reads only the YAML, the design files and the file system: it never imports torch or
vLLM, so ``make check-params`` answers in about a second, before any model loads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, field_validator, model_validator

from storybias.config.analysis_sections import (
    AssociationSettings,
    Comparison,
    CrossLensSettings,
    FigureSettings,
    HumanValidationSettings,
    JudgeSettings,
    MetricsSettings,
    PlanningSettings,
    ProbeSettings,
    UmapSettings,
)
from storybias.config.bounds import plan_size_problems, token_problems
from storybias.config.checks import local_models, repeated_items
from storybias.config.corpus import CorpusSettings, check_files
from storybias.config.designs import design_cells, get
from storybias.config.designs import get as get_design
from storybias.config.input_stamps import HASH_STORE, InputFileError, note_read, stage_files, stage_stamp
from storybias.config.llamacpp import llama_cpp_problems
from storybias.config.output_fields import ADDED_FIELDS, STAMP_IGNORED_ENGINE_FIELDS, STAMP_IGNORED_MODEL_FIELDS
from storybias.config.overrides import OverrideError, apply_overrides, derived_run_name, normalize_overrides
from storybias.config.prompts import available_languages
from storybias.config.prompts import names as design_names
from storybias.config.story_sections import (
    ALL_SECTIONS,
    RAY_ADDRESS,
    SERVED_ONLY_FIELDS,
    DesignRun,
    Designs,
    EngineSettings,
    ExcludeRules,
    ExtractionSection,
    ExtractionSections,
    ExtractionSettings,
    FilterSettings,
    GenerationSettings,
    InvalidReason,
    Language,
    ModelSpec,
    RaySettings,
    Sampling,
    SamplingOverride,
    Strict,
)
from storybias.core import paths, run_folders
from storybias.core.artifacts import STAGES
from storybias.core.fingerprint import FileHashes
from storybias.core.io import YamlRefusedError, read_yaml_strict
from storybias.core.paths import RUN_NAME
from storybias.evidence.harm_ratings import HUMAN_RATINGS
from storybias.evidence.human_files import HumanFile, check_file
from storybias.evidence.judgement_ratings import LABEL_RATINGS, MARKER_RATINGS
from storybias.evidence.released_associations import RELEASED_LANGUAGES, load_associations
from storybias.evidence.stereotales_taxonomy import PublishedFormatError
from storybias.evidence.support_ratings import SUPPORT_RATINGS

__all__ = [
    # the sections (story_sections, analysis_sections) and their types
    "ALL_SECTIONS",
    "RAY_ADDRESS",
    "SERVED_ONLY_FIELDS",
    "AssociationSettings",
    "Comparison",
    "CorpusSettings",
    "DesignRun",
    "Designs",
    "EngineSettings",
    "ExcludeRules",
    "ExtractionSection",
    "ExtractionSections",
    "ExtractionSettings",
    "FigureSettings",
    "FilterSettings",
    "GenerationSettings",
    "CrossLensSettings",
    "HumanValidationSettings",
    "InvalidReason",
    "JudgeSettings",
    "Language",
    "MetricsSettings",
    "ModelSpec",
    "PlanningSettings",
    "ProbeSettings",
    "RaySettings",
    "Sampling",
    "SamplingOverride",
    "Strict",
    "UmapSettings",
    # the profile, and reading it
    "STAGE_SECTIONS",
    "Params",
    "ParamsError",
    "Profile",
    "default_exclude",
    "load",
    "load_yaml_strict",
    "write_stage_stamps",
]


class ParamsError(ValueError):
    """Invalid parameters; the message names the file and the key."""


# StereoTales' ten languages, in storybias' codes: the stereotales design a corpus profile reads
RELEASE_LANGUAGES = list(RELEASED_LANGUAGES)
# the engine a corpus profile without generation: runs stage 03's and 04's local models on (no story is generated)
# A run's name names folders (data/<run>/, figures/<run>/): at most this many characters (a file name may
# hold 255 bytes; 300 characters failed with OSError 36)
MAX_RUN_NAME = 100
CORPUS_GENERATION = {"models": [{"name": "qwen2.5-coder-1.5b", "source": "embedded"}]}


class Profile(Strict):
    run_name: str | None = None
    description: str = ""
    corpus: CorpusSettings | None = None  # import the stories instead of generating them (storybias.config.corpus)
    generation: GenerationSettings
    designs: Designs
    filter: FilterSettings = FilterSettings()
    extract: ExtractionSettings = ExtractionSettings()
    metrics: MetricsSettings = MetricsSettings()
    probes: ProbeSettings = ProbeSettings()
    associations: AssociationSettings = AssociationSettings()
    crosslens: CrossLensSettings = CrossLensSettings()
    figures: FigureSettings = FigureSettings()
    planning: PlanningSettings = PlanningSettings()

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str | None) -> str | None:
        # Runs only for a run_name written in the file (defaults are not validated): an explicit null
        # is refused, because Make's sed reads it as a run called "null" while Python would fall back
        # to the file name, and the two would work on different folders.
        if value is None:
            raise ValueError("null is not a run name; omit run_name to use the file name")
        if not RUN_NAME.match(value):
            raise ValueError("run_name may hold letters, digits, '.', '_' and '-' only")
        if len(value) > MAX_RUN_NAME:
            raise ValueError(f"run_name has {len(value):,} characters; at most {MAX_RUN_NAME} (it names folders)")
        return value

    @model_validator(mode="after")
    def _crosslens_comparison_exists(self) -> Profile:
        name = self.crosslens.comparison
        names = [c.name for c in self.metrics.comparisons if not c.log_odds_only]
        if name is not None and name not in names:
            raise ValueError(
                f"crosslens.comparison: {name!r} is not a comparison of metrics.comparisons with S_C and "
                f"JSD (those: {', '.join(names) or 'none'})"
            )
        return self

    def crosslens_comparison(self) -> str | None:
        """The BiasedTales-ML comparison the cross-lens table reads: ``crosslens.comparison``, else
        the first of ``metrics.comparisons`` that computes S_C and JSD (None when there is none)."""
        if self.crosslens.comparison is not None:
            return self.crosslens.comparison
        return next((c.name for c in self.metrics.comparisons if not c.log_odds_only), None)

    @model_validator(mode="before")
    @classmethod
    def _corpus_needs_no_generation(cls, data: Any) -> Any:
        """A corpus profile imports its stories: ``designs`` is the stereotales design in the corpus'
        languages, and ``generation`` (optional) only sets the engine of stage 03's and 04's models."""
        if not isinstance(data, dict) or not isinstance(data.get("corpus"), dict):
            return data
        if "designs" in data:
            raise ValueError(
                "designs: a profile with corpus: imports its stories and generates none; remove designs: "
                "(corpus.languages chooses the languages)"
            )
        design = data["corpus"].get("design", "stereotales")
        if data["corpus"].get("format") == "table" and design in design_names():
            languages = data["corpus"].get("languages") or available_languages(design)
        else:
            languages = data["corpus"].get("languages") or RELEASE_LANGUAGES
        generation = dict(data.get("generation") or {})
        generation.setdefault("models", CORPUS_GENERATION["models"])
        return {**data, "generation": generation, "designs": {design: {"languages": languages}}}


# Which sections each stage reads (the stage registry's, storybias.core.artifacts): the stage's params
# stamp changes only when one of them does, so Make reruns a stage only when its own parameters changed.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {stage.token: stage.sections for stage in STAGES}
# Keys of a stage's sections that its artifacts do not depend on (only its notebook reads them), left
# out of the stage's digest. The file such a key names still enters the stage's stamp by its content
# (storybias.config.input_stamps), so notebook 03 reports on the file as it is.
NOT_IN_DIGEST: dict[str, tuple[str, ...]] = {"extract": ("human_validation",)}


class Params:
    """A validated profile plus where it came from and the run it names."""

    def __init__(self, profile: Profile, source: Path, overrides: Mapping[str, Any] | None = None):
        self.profile = profile
        self.source = source
        self.overrides = dict(overrides or {})
        self.base_run = profile.run_name or source.stem  # the profile's own run; with overrides, a run of its own
        self.run_name = derived_run_name(self.base_run, self.overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.profile, name)

    def enabled_designs(self) -> dict[str, DesignRun]:
        runs = {d: getattr(self.profile.designs, d, None) for d in design_names()}
        return {d: run for d, run in runs.items() if run is not None and run.enabled}

    def sampling_for(self, design: str) -> Sampling:
        base = self.profile.generation.sampling.model_dump()
        override = getattr(self.profile.designs, design).sampling.model_dump(exclude_none=True)
        return Sampling(**{**base, **override})

    def resolved(self) -> dict[str, Any]:
        origin: dict[str, Any] = {"run_name": self.run_name, "source": str(self.source)}
        if self.overrides:
            origin |= {"base_run": self.base_run, "overrides": self.overrides}
        return {**origin, **self.profile.model_dump(mode="json")}

    def stage_digest(self, stage: str) -> str:
        """The sha256 of the parameters stage ``stage`` reads (its registry sections), without the settings
        that cannot change its outputs (storybias.config.output_fields, the answer cache's classification):
        an operational engine or model setting reruns no stage, an output-shaping one reruns each stage
        whose sections hold it."""
        dumped = _output_shaping(self.profile, self.profile.model_dump(mode="json"))
        section = {}
        for name in STAGE_SECTIONS[stage]:
            value = dumped
            for part in name.split("."):
                value = value[part]
            section[name] = value
        for key in NOT_IN_DIGEST.get(stage, ()):
            section[stage].pop(key, None)
        return hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()


def _output_shaping(value: Any, dumped: Any) -> Any:
    """``dumped`` (``value``'s JSON dump) without the operational fields of every ModelSpec and
    EngineSettings in it (STAMP_IGNORED_MODEL_FIELDS, STAMP_IGNORED_ENGINE_FIELDS), nor the fields added
    after runs existed while they hold their default (ADDED_FIELDS)."""
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        added = ADDED_FIELDS.get(type(value).__name__, {})
        skip = frozenset(k for k, default in added.items() if dumped.get(k) == default)
        if isinstance(value, ModelSpec):
            skip |= STAMP_IGNORED_MODEL_FIELDS
        elif isinstance(value, EngineSettings):
            skip |= STAMP_IGNORED_ENGINE_FIELDS
        return {k: _output_shaping(getattr(value, k, None), v) for k, v in dumped.items() if k not in skip}
    if isinstance(value, list | tuple) and isinstance(dumped, list):
        return [_output_shaping(item, d) for item, d in zip(value, dumped, strict=False)]
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {k: _output_shaping(value.get(k), v) for k, v in dumped.items()}
    return dumped


def _format_location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


# pydantic's error types for a value of the wrong type (strict mode: no coercion from strings or bools)
_STRICT_TYPE_ERRORS = {"int_type", "float_type", "bool_type", "string_type", "list_type", "dict_type"}


def _number_like(text: str) -> bool:
    """Whether ``text`` reads as a number (``1e12``, ``5_000``), which YAML may have left as text."""
    try:
        float(text.replace("_", ""))
    except ValueError:
        return False
    return True


def _format_validation_error(exc: ValidationError, source: Path, overrides: Mapping[str, Any] | None = None) -> str:
    label = f"{source} with overrides {', '.join(overrides)}" if overrides else str(source)
    lines = [f"{label}: invalid parameters ({exc.error_count()} problem{'s' if exc.error_count() > 1 else ''}):"]
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-after", "literal"))))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not in the schema; check the spelling)"
        elif err["type"] == "literal_error":
            msg = f"{msg}; got {err.get('input')!r}"
        elif err["type"] in _STRICT_TYPE_ERRORS:
            value = err.get("input")
            msg = f"{msg}; got {value!r} ({type(value).__name__})"
            if isinstance(value, str) and _number_like(value):  # YAML reads 1e12 (no dot) as text
                msg += ": YAML reads this spelling as text; write the number in digits (e.g. 1000000), without quotes"
            elif isinstance(value, str):
                msg += ": write the value without quotes"
        lines.append(f"  - {_format_location(loc)}: {msg}")
    return "\n".join(lines)


def _check_semantics(profile: Profile, source: Path) -> list[str]:
    """Checks that need the design files or the file system, and a repeated item in any list."""
    # a corpus profile's designs are made from corpus.languages: a repeat is reported there, once
    problems = repeated_items(profile, skip=("designs",) if profile.corpus is not None else ())
    problems += _check_design_runs(profile)
    problems += _check_comparisons(profile)
    if profile.corpus is not None:
        problems += check_files(profile.corpus)
    if not any(
        getattr(profile.designs, d, None) is not None and getattr(profile.designs, d).enabled for d in design_names()
    ):
        problems.append("designs: no design is enabled")
    problems += _check_evidence_files(profile)
    problems += _check_ray(profile)
    problems += llama_cpp_problems(profile.generation.engine, local_models(profile))
    problems += _check_model_files(profile)
    return problems + token_problems(profile) + plan_size_problems(profile)


def _check_design_runs(profile: Profile) -> list[str]:
    """Each enabled design's languages, restrictions, tasks and models against its design files."""
    problems: list[str] = []
    generation_models = [m.name for m in profile.generation.models]
    for design in design_names():
        run: DesignRun | None = getattr(profile.designs, design, None)
        if run is None or not run.enabled:
            continue
        have = available_languages(design)
        for i, lang in enumerate(run.languages):
            if lang not in have:
                problems.append(
                    f"designs.{design}.languages[{i}]: design {design!r} has no text for {lang!r} "
                    f"(params/designs/{design}/{lang}.yaml is missing; available: {', '.join(have)})"
                )
        conditions = _condition_values(design)
        for key, allowed in run.restrict.items():
            known = conditions.get(key)
            if known is None:
                problems.append(f"designs.{design}.restrict.{key}: {design!r} has no condition {key!r}")
                continue
            for value in allowed:
                if value not in known:
                    problems.append(f"designs.{design}.restrict.{key}: unknown value {value!r}")
        if run.tasks is not None and "cond_task" not in get_design(design).conditions:
            problems.append(f"designs.{design}.tasks: only a design with a task condition (occupations) has tasks")
        for i, name in enumerate(run.models or []):
            if name not in generation_models:
                problems.append(
                    f"designs.{design}.models[{i}]: {name!r} is not a model of generation.models "
                    f"({', '.join(generation_models)})"
                )
    return problems


def _check_comparisons(profile: Profile) -> list[str]:
    """metrics.comparisons: each names a design, and conditions and values of its grid."""
    problems: list[str] = []
    for i, comparison in enumerate(profile.metrics.comparisons):
        if comparison.design not in design_names():
            problems.append(f"metrics.comparisons[{i}].design: unknown design {comparison.design!r}")
            continue
        conditions = _condition_values(comparison.design)
        for key, values in (
            (comparison.condition, [comparison.group_m, comparison.group_f]),
            *((k, [v]) for k, v in comparison.where.items()),
        ):
            if key not in conditions:
                problems.append(
                    f"metrics.comparisons[{i}]: {comparison.design!r} has no condition {key!r} "
                    f"(one of {', '.join(conditions)})"
                )
                continue
            for value in values:
                if value not in conditions[key]:
                    problems.append(f"metrics.comparisons[{i}]: {key} has no value {value!r}")
    attribute = profile.probes.stereotales_attribute
    attributes = list(_condition_values("stereotales")["attribute"])
    if attribute is not None and attribute not in attributes:
        problems.append(
            f"probes.stereotales_attribute: {attribute!r} is not an attribute the stereotales prompts fix "
            f"(one of {', '.join(attributes)})"
        )
    return problems


def _check_csv(key: str, value: str | None, spec: HumanFile) -> list[str]:
    """The problems of the human-input CSV a key names (none when unset), each prefixed with the key."""
    if value is None:
        return []
    path = paths.resolve(value)
    if path.is_dir():
        return [f"{key}: {path} is a folder; name the CSV file in it"]
    if not path.is_file():
        return [f"{key}: {path} does not exist"]
    return [f"{key}: {p}" for p in check_file(path, spec)]


def _check_evidence_files(profile: Profile) -> list[str]:
    """Every file people fill in (stage 03's human validation, stage 04's human ratings, stage 06's marker
    and label ratings: one checker, storybias.evidence.human_files) and the published associations: the
    files exist and are well formed, before any stage runs."""
    validation = profile.probes.human_validation
    problems = _check_csv("extract.human_validation", profile.extract.human_validation, SUPPORT_RATINGS)
    problems += _check_csv("associations.human_ratings", profile.associations.human_ratings, HUMAN_RATINGS)
    problems += _check_csv("probes.human_validation.markers", validation.markers, MARKER_RATINGS)
    problems += _check_csv("probes.human_validation.labels", validation.labels, LABEL_RATINGS)
    if profile.associations.published is not None:
        try:
            load_associations(paths.resolve(profile.associations.published))
        except PublishedFormatError as exc:
            problems.append(f"associations.published: {exc}")
    return problems


def _check_ray(profile: Profile) -> list[str]:
    """backend 'ray': Ray is installed, and replicas over several GPUs only for CUDA models."""
    problems: list[str] = []
    engine = profile.generation.engine
    if engine.backend == "ray":
        if importlib.util.find_spec("ray") is None:
            problems.append(
                "generation.engine.backend: 'ray' needs Ray, which is not installed in this environment; "
                "run `make venv EXTRAS=ray` (or `.venv/bin/pip install -r requirements/extra-ray.txt`)"
            )
        local = [
            m
            for m in (*profile.generation.models, *profile.extract.models, *profile.associations.judge.models)
            if m.source != "openai"
        ]
        if (engine.ray.tensor_parallel_size or 1) > 1 and any(m.device == "cpu" for m in local):
            problems.append(
                "generation.engine.ray.tensor_parallel_size: > 1 needs CUDA models; this profile has CPU models"
            )
    return problems


def _check_model_files(profile: Profile) -> list[str]:
    """Every model's folder (``path``) and chat template exist on disk."""
    problems: list[str] = []
    for where, specs in (
        ("generation.models", profile.generation.models),
        ("extract.models", profile.extract.models),
        ("associations.judge.models", profile.associations.judge.models),
    ):
        for i, model in enumerate(specs):
            for key in ("path", "chat_template"):
                value = getattr(model, key)
                if value is not None and not paths.resolve(value).exists():
                    problems.append(f"{where}[{i}].{key}: {paths.resolve(value)} does not exist")
    return problems


def _condition_values(design: str) -> dict[str, list[str]]:
    """Condition name (cond_<name> in stories.parquet) -> its canonical values, for one design: read
    from the design's own grid (storybias.config.designs), so every design is checked the same way."""
    values: dict[str, dict[str, None]] = {}
    for cell in design_cells(design):
        for column, value in cell.conditions.items():
            values.setdefault(column.removeprefix("cond_"), {})[value] = None
    return {k: list(v) for k, v in values.items()}


def load_yaml_strict(source: Path) -> Any:
    """Parse a YAML file with storybias' one loader (storybias.core.io.read_yaml_strict: no repeated key,
    no anchor or alias, bounded nesting); a refused file is a ParamsError naming the file and the line."""

    try:
        return read_yaml_strict(source)
    except YamlRefusedError as exc:
        raise ParamsError(str(exc)) from None


def load(path: str | Path, overrides: Mapping[str, Any] | str | None = None) -> Params:
    """Read and validate a profile, with ``overrides`` (``{"associations.alpha": 0.1}`` or SET's text
    ``"associations.alpha=0.1"``, storybias.config.overrides) written over it first: the run is then
    named from them. Raises ParamsError with every problem, each naming its key."""
    source = paths.resolve(path)
    if not source.is_file():
        raise ParamsError(f"{source}: params file not found")
    try:
        raw = load_yaml_strict(source)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of parameters at the top level")
    try:
        changes = normalize_overrides(overrides)
        raw = apply_overrides(raw, changes)
    except OverrideError as exc:
        raise ParamsError(f"{source}: invalid override: {exc}") from None
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(_format_validation_error(exc, source, changes)) from None
    problems = _check_semantics(profile, source)
    run_name = profile.run_name or source.stem
    if profile.run_name is None and (not RUN_NAME.match(run_name) or len(run_name) > MAX_RUN_NAME):
        problems.append(
            f"run_name: the file name {run_name[:MAX_RUN_NAME]!r} cannot name the run's folders (letters, digits, "
            f"'.', '_' and '-', at most {MAX_RUN_NAME} characters); set run_name: in the profile"
        )
    elif RUN_NAME.match(run_name):  # the run's folders: only where runs live (storybias.core.run_folders)
        problems += run_folders.problems(run_name)
    if problems:
        raise ParamsError(f"{source}: invalid parameters:\n" + "\n".join(f"  - {p}" for p in problems))
    params = Params(profile, source, changes)
    problems = run_folders.problems(params.run_name) if changes else []  # the derived run's own folders
    if problems:
        raise ParamsError(f"{source}: invalid parameters:\n" + "\n".join(f"  - {p}" for p in problems))
    note_read(params.stage_digest)  # under run-stage: what this stage read (storybias.config.input_stamps)
    return params


def write_stage_stamps(params: Params, folder: Path) -> list[Path]:
    """Write ``<folder>/<stage>.params`` for every stage, touching a file only when its content changes.

    A stamp holds the stage's parameters digest and the sha256 of every file the profile names that the
    stage reads (storybias.config.input_stamps; cached in ``<folder>/input-hashes.json``). Make depends on
    these files, so editing one stage's parameters, or a file it reads, reruns that stage (and what reads
    its output), not the whole pipeline. A named file that vanished since the profile loaded is a
    ParamsError naming the setting.
    """
    folder.mkdir(parents=True, exist_ok=True)
    hashes = FileHashes(folder / HASH_STORE)
    written = []
    for stage in STAGE_SECTIONS:
        path = folder / f"{stage}.params"
        try:
            content = stage_stamp(params.stage_digest(stage), stage_files(params.profile, stage), hashes)
        except (InputFileError, OSError) as exc:
            raise ParamsError(f"{params.source}: {exc}") from None
        if not path.is_file() or path.read_text() != content:
            path.write_text(content)
        written.append(path)
    hashes.save()
    return written


def default_exclude(name: str) -> tuple[str, ...]:
    """Stage 02's rule for a design the profile's ``filter.exclude`` does not name."""
    entry = get(name)
    if entry.exclude is not None:
        return entry.exclude

    return tuple(getattr(ExcludeRules(), name))  # type: ignore[call-arg]  # pydantic: extra is optional
