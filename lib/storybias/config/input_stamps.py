"""Every file a profile names is an input of the stages that read it.

A setting typed :data:`~storybias.config.story_sections.InputFile` names a file or a folder of files (the
corpus, the published associations, the human ratings, the extractor validation, the marker and label
ratings, a chat template). The stage registry (``storybias.core.artifacts.STAGES``, ``profile_files``) says
which stages read each; :func:`stage_stamp` is what ``data/<run>/.params/<stage>.params`` holds: the
stage's parameters digest, then one ``<sha256>  <file>`` line per file the stage reads. ``make`` reruns a
stage whose stamp changed, so editing one story of an imported table reruns stage 01 (and what reads
its output), editing a human rating reruns stage 04 (and 07, 08), and nothing else.

A stamp is what the stage read, not what the profile said when Make looked: ``run-stage`` asks the stage's
notebook to note the digest of the parameters it loaded (:data:`READ_ENV`, :func:`note_read`, called by
``storybias.config.params.load``), and after the stage puts that digest in the stamp (:func:`settle_stamp`).
A profile edited while the stage ran, then restored, leaves a stamp that differs from the profile, so the
next ``make`` reruns the stage instead of calling its result up to date.

The hashes are cached by file size and modification time (``storybias.core.fingerprint``) in
``data/<run>/.params/input-hashes.json``: an unchanged multi-gigabyte corpus is not read again.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from storybias.config.corpus import corpus_files
from storybias.config.story_sections import INPUT_FILE
from storybias.core import paths
from storybias.core.artifacts import STAGE_BY_TOKEN
from storybias.core.fingerprint import FileHashes
from storybias.evidence.released_associations import published_files
from storybias.evidence.stereotales_taxonomy import PublishedFormatError

HASH_STORE = "input-hashes.json"  # in data/<run>/.params/, beside the stamps
# "<stage>:<file>": set by run-stage for the stage's notebook; each profile load appends its digest to <file>
READ_ENV = "STORYBIAS_STAGE_READ"
MIXED = "mixed"  # the first line of a stamp whose stage loaded two different profiles: never matches one


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


def note_read(stage_digest: Callable[[str], str]) -> None:
    """Append the digest of the parameters just loaded (``stage_digest(stage)``) to the file :data:`READ_ENV`
    names, when a stage run set it for this process (a stage's notebook under ``run-stage``)."""
    stage, _, record = os.environ.get(READ_ENV, "").partition(":")
    if stage in STAGE_BY_TOKEN and record:
        Path(record).parent.mkdir(parents=True, exist_ok=True)  # a stage run before any stamp was written
        with open(record, "a", encoding="utf-8") as out:
            out.write(stage_digest(stage) + "\n")


def settle_stamp(stamp: Path, record: Path, target: Path | None) -> str | None:
    """After a stage ran: make ``stamp`` hold the digest its notebook noted in ``record`` (:func:`note_read`),
    with ``target``'s modification time, so that ``make`` reruns the stage exactly when the profile now
    differs from what the stage read. Returns the digest written when it differed from the stamp's, else
    None (nothing noted, no stamp, or the same digest)."""
    noted = list(dict.fromkeys(record.read_text(encoding="utf-8").split())) if record.is_file() else []
    if not noted or not stamp.is_file():
        return None
    read = noted[0] if len(noted) == 1 else MIXED
    head, _, files = stamp.read_text(encoding="utf-8").partition("\n")
    if head == read:
        return None
    stamp.write_text(f"{read}\n{files}", encoding="utf-8")
    if target is not None and target.exists():  # not newer than the target: a kept edit reruns nothing
        when = target.stat().st_mtime_ns
        os.utime(stamp, ns=(when, when))
    return read
