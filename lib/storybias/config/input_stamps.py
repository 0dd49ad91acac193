"""Every file a profile names is an input of the stages that read it.

A setting typed :data:`~storybias.config.story_sections.InputFile` names a file or a folder of files (the
corpus, the published associations, the human ratings, the extractor validation, the marker and label
ratings, a chat template). The stage registry (``storybias.core.artifacts.STAGES``, ``profile_files``) says
which stages read each; :func:`stage_stamp` is what ``data/<run>/.params/<stage>.params`` holds: the
stage's parameters digest, then one ``<sha256>  <file>`` line per file the stage reads. ``make`` reruns a
stage whose stamp changed, so editing one story of an imported table reruns stage 01 (and what reads
its output), editing a human rating reruns stage 04 (and 07, 08), and nothing else.

The hashes are cached by file size and modification time (``storybias.core.fingerprint``) in
``data/<run>/.params/input-hashes.json``: an unchanged multi-gigabyte corpus is not read again.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from storybias.config.corpus import corpus_files
from storybias.config.story_sections import INPUT_FILE
from storybias.core import paths
from storybias.core.artifacts import STAGE_BY_TOKEN
from storybias.core.fingerprint import FileHashes
from storybias.evidence.labels import PublishedFormatError
from storybias.evidence.released_associations import published_files

HASH_STORE = "input-hashes.json"  # in data/<run>/.params/, beside the stamps


class InputFileError(ValueError):
    """A file a profile names is missing or unreadable; the message names the setting and the file."""


def _values(node: Any, parts: list[str]) -> list[Any]:
    """The values at the dotted path ``parts`` under ``node`` (a list maps over its items; None is left out)."""
    if node is None:
        return []
    if isinstance(node, list):
        return [v for item in node for v in _values(item, parts)]
    if not parts:
        return [node]
    return _values(getattr(node, parts[0], None), parts[1:])


def _files_under(key: str, path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    raise InputFileError(f"{key}: {path} does not exist")


def files_of(profile: Any, key: str) -> list[Path]:
    """The files the setting ``key`` ("a.b", through lists of models too) of ``profile`` names, sorted:
    the corpus files stage 01 reads (``corpus_files``), the published-association files and their
    ``pool.json``, else the file itself or every file under the folder."""
    if key == "corpus.path":
        if profile.corpus is None:
            return []
        try:
            return corpus_files(profile.corpus)
        except ValueError as exc:
            raise InputFileError(str(exc)) from None
    files: list[Path] = []
    for value in _values(profile, key.split(".")):
        path = paths.resolve(value)
        if key == "associations.published":
            try:
                files += published_files(path)
            except PublishedFormatError as exc:
                raise InputFileError(f"{key}: {exc}") from None
        else:
            files += _files_under(key, path)
    return sorted(set(files))


def stage_files(profile: Any, stage: str) -> list[Path]:
    """Every file the profile names that stage ``stage`` reads (the registry's ``profile_files``)."""
    return sorted({f for key in STAGE_BY_TOKEN[stage].profile_files for f in files_of(profile, key)})


def _shown(path: Path) -> str:
    """A file as a stamp names it: relative to the repository when inside it."""
    root = paths.repo_root()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def stage_stamp(digest: str, files: list[Path], hashes: FileHashes) -> str:
    """A stage's stamp: its parameters' ``digest``, then ``<sha256>  <file>`` per file it reads."""
    return "".join([f"{digest}\n", *(f"{hashes.sha256(f)}  {_shown(f)}\n" for f in files)])


def _annotated_input(annotation: Any) -> bool:
    return any(INPUT_FILE in getattr(arg, "__metadata__", ()) for arg in (annotation, *typing.get_args(annotation)))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The sections an annotation holds (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def file_settings(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every setting of the schema ``model`` typed InputFile, as the registry names it ("a.b.c")."""
    keys = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        if INPUT_FILE in info.metadata or _annotated_input(info.annotation):
            keys.append(key)
        for inner in _models_in(info.annotation):
            keys += file_settings(inner, f"{key}.")
    return sorted(set(keys))
