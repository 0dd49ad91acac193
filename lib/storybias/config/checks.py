"""Checks of a validated profile that fail before any work: a list setting that names an item twice, and a
served model whose key variable is not set; and which models each stage runs (:func:`stage_models`).

``storybias.config.params.load`` runs :func:`repeated_items` on every profile (a repeated language made two
stories with one id, and stage 01 died on ``duplicate story_id in the plan``); ``make check-params`` also
runs :func:`missing_key_variables` (a judge whose key was not exported failed only at stage 04, after
stages 01-03 ran), and ``storybias.cli run-stage`` runs :func:`stage_key_problems` before each stage: the
keys of that stage and of the model stages after it, so ``make figures`` on a finished run needs no key.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from storybias.config.story_sections import ModelSpec
from storybias.core.artifacts import STAGES
from storybias.core.secrets import key_problem

# Free-form settings (what a model's chat template reads): their lists are the model's business.
FREE_FORM_KEYS = frozenset({"chat_template_kwargs"})
# Intel OpenMP for the preload: PyPI's intel-openmp, in the CPU environment's lib folder.
IOMP_LIBRARY = Path(sys.prefix) / "lib" / "libiomp5.so"
# The stages that run language models, with the profile key of each one's models.
MODEL_KEYS = {
    "generate": "generation.models",
    "extract": "extract.models",
    "associations": "associations.judge.models",
}
STAGE_NUMBERS = {stage.token: stage.number for stage in STAGES}


def _identity(item: Any) -> str:
    """An item of a list as comparable text (a section by its content)."""
    plain = item.model_dump(mode="json") if isinstance(item, BaseModel) else item
    return json.dumps(plain, sort_keys=True, default=str)


def _shown(item: Any) -> str:
    if isinstance(item, BaseModel):
        name = getattr(item, "name", None)
        return f"the entry {name!r}" if isinstance(name, str) else "an identical entry"
    text = repr(item)
    return text if len(text) <= 60 else text[:57] + "..."


def _walk(value: Any, where: str, problems: list[str]) -> None:
    if isinstance(value, BaseModel):
        for name in [*type(value).model_fields, *(value.model_extra or {})]:
            if name not in FREE_FORM_KEYS:
                _walk(getattr(value, name), f"{where}.{name}" if where else name, problems)
    elif isinstance(value, list):
        first: dict[str, int] = {}
        for i, item in enumerate(value):
            key = _identity(item)
            if key in first:
                problems.append(f"{where}: {_shown(item)} is listed twice ([{first[key]}] and [{i}]); list each once")
            else:
                first[key] = i
            _walk(item, f"{where}[{i}]", problems)
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{where}.{key}", problems)


def repeated_items(profile: BaseModel, skip: tuple[str, ...] = ()) -> list[str]:
    """Every list setting of ``profile`` (at any depth, free-form mappings aside) that holds the same item
    twice, one problem per repeat naming the key and both positions; the top-level keys in ``skip`` are
    not walked (a corpus profile's ``designs`` is derived from ``corpus.languages``, checked there)."""
    problems: list[str] = []
    for name in [*type(profile).model_fields, *(profile.model_extra or {})]:
        if name not in skip and name not in FREE_FORM_KEYS:
            _walk(getattr(profile, name), name, problems)
    return problems


def stage_models(profile: Any, stage: str) -> list[ModelSpec]:
    """The models stage ``stage`` runs: stage 01 generates with ``generation.models`` (none on a profile with
    ``corpus:``, which imports its stories), stage 03 extracts with ``extract.models`` (none with
    ``corpus.extractions: published``), stage 04's judges are ``associations.judge.models``; no other stage
    runs a language model. Either every model of the stage's key or none, in the profile's order."""
    corpus = profile.corpus
    if stage == "generate" and corpus is not None:
        return []
    if stage == "extract" and corpus is not None and corpus.extractions == "published":
        return []
    declared = {
        "generate": profile.generation.models,
        "extract": profile.extract.models,
        "associations": profile.associations.judge.models,
    }
    return list(declared.get(stage, []))


def local_models(profile: Any) -> list[ModelSpec]:
    """Every model the profile's stages run on this machine (every one not served by an endpoint), stage
    by stage (generate, extract, associations) in the profile's order: the models ``with-servers`` keeps
    up for a run and the CPU preload is for. A corpus profile's generators are not among them (stage 01
    imports its stories), nor, with ``corpus.extractions: published``, its extractors."""
    return [spec for stage in MODEL_KEYS for spec in stage_models(profile, stage) if spec.source != "openai"]


def missing_key_variables(profile: Any, stages: tuple[str, ...] = tuple(MODEL_KEYS)) -> list[str]:
    """Every served model of ``stages`` (default: every stage) whose ``api_key_env`` names a variable that is
    unset or empty here, or whose value cannot be a key (a newline in it: storybias.core.secrets), as
    '<key>[i].api_key_env: ...' naming the model and the variable, never the value."""
    problems = []
    for stage in stages:
        key = MODEL_KEYS[stage]
        for i, spec in enumerate(stage_models(profile, stage)):
            variable = spec.api_key_env
            if spec.source != "openai" or not variable:
                continue
            value = os.environ.get(variable)
            if not value:
                problems.append(
                    f"{key}[{i}].api_key_env: model {spec.name!r} reads its key from ${variable}, which is not set "
                    f"in this environment; export it (e.g. `export {variable}=...`) before the run"
                )
            elif (problem := key_problem(variable, value)) is not None:
                problems.append(f"{key}[{i}].api_key_env: model {spec.name!r}: {problem}")
    return problems


def stage_key_problems(profile: Any, stage: str) -> list[str]:
    """What ``storybias.cli run-stage`` refuses before stage ``stage`` starts: the key variables of the served
    models of this stage and of every later stage that runs a model (the judge's key is asked at stage 01,
    not after stages 01-03 ran); a stage after the last model stage (05-08) asks for none, so ``make
    figures`` on a finished run needs no key."""
    number = STAGE_NUMBERS.get(stage)
    if number is None:
        return []
    return missing_key_variables(profile, tuple(s for s in MODEL_KEYS if STAGE_NUMBERS[s] >= number))


def cpu_preload_libraries() -> str | None:
    """``LD_PRELOAD`` for tcmalloc (Debian's libtcmalloc-minimal4) and Intel OpenMP (PyPI's intel-openmp,
    ``<venv>/lib/libiomp5.so``), as vLLM's CPU guide sets it; None where either is missing."""
    tcmalloc = ctypes.util.find_library("tcmalloc_minimal")
    if tcmalloc is None or not IOMP_LIBRARY.is_file():
        return None
    return f"{tcmalloc}:{IOMP_LIBRARY}"


def preload_note(profile: Any) -> str | None:
    """A line for the log where ``generation.engine.cpu_preload`` is on for a profile that runs a local CPU
    model and a library is missing: the engines then run without the preload (a speed-up, not an input:
    the texts are the same either way, docs/measurements/engine_settings.csv)."""
    local_cpu = [spec for spec in local_models(profile) if spec.device == "cpu"]
    if not profile.generation.engine.cpu_preload or not local_cpu or cpu_preload_libraries() is not None:
        return None
    return (
        "generation.engine.cpu_preload: tcmalloc (Debian's libtcmalloc-minimal4) or Intel OpenMP "
        f"({IOMP_LIBRARY}) is not installed, so the engines run without the preload "
        "(slower); `make venv` installs tcmalloc where it may run apt-get, else `apt-get install libtcmalloc-minimal4`"
    )
