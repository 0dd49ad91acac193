"""A parameter change without a new profile: ``key.path=value`` overrides on top of a profile.

A student changes one value (``associations.alpha=0.1``) in a notebook's parameters cell
(``overrides = {"associations.alpha": 0.1}``), with papermill (``-p overrides "associations.alpha=0.1"``)
or with Make (``make associations SET="associations.alpha=0.1"``, several separated by spaces). The
overrides are written into the profile's YAML mapping before the one schema validates it
(storybias.config.params.load), so a bad key or value is refused naming the key, before any work.

A run with overrides is a run of its own, named from its base run and the overrides
(:func:`derived_run_name`): the run it came from is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import yaml

__all__ = ["SET_ENV", "OverrideError", "apply_overrides", "derived_run_name", "normalize_overrides", "parse_set"]

# a key path: identifiers separated by dots (a list item by its index: ``generation.models.0.name``)
_KEY_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
# a piece of the readable run-name suffix: no '-' (the separator), nothing a run name cannot hold
_NAME_PIECE = re.compile(r"^[A-Za-z0-9_.]+$")
SET_ENV = "STORYBIAS_SET"  # Make's SET, as every storybias.cli command that takes a profile reads it
MAX_NAME = 100  # storybias.config.params.MAX_RUN_NAME: the run name names folders


class OverrideError(ValueError):
    """An override that cannot be applied; the message names the key."""


def parse_set(text: str) -> dict[str, Any]:
    """``"a.b=1 c.d=x"`` (Make's SET) as ``{"a.b": 1, "c.d": "x"}``; each value read as a YAML scalar."""
    overrides: dict[str, Any] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise OverrideError(f"override {item!r}: write it as key.path=value (e.g. associations.alpha=0.1)")
        try:
            overrides[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as exc:
            raise OverrideError(f"{key}: the value {value!r} is not a YAML scalar ({exc})") from None
    return overrides


def normalize_overrides(overrides: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Overrides as a mapping of key path to value, from a mapping or from SET's ``key=value`` text."""
    if overrides is None:
        return {}
    if isinstance(overrides, str):
        overrides = parse_set(overrides)
    if not isinstance(overrides, Mapping):
        raise OverrideError(f"overrides: expected a mapping of key.path to value, got {type(overrides).__name__}")
    for key in overrides:
        if not isinstance(key, str) or not _KEY_PATH.match(key):
            raise OverrideError(f"override {key!r}: a key path is names separated by dots (e.g. associations.alpha)")
        if key == "run_name" or key.startswith("run_name."):
            raise OverrideError("run_name: cannot be overridden; a run with overrides is named from them")
    return dict(overrides)


def _set(raw: dict[str, Any], key: str, value: Any) -> None:
    node: Any = raw
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise OverrideError(f"{key}: {where} is not an item of the list {'.'.join(parts[:depth])}")
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise OverrideError(f"{key}: {'.'.join(parts[:depth])} holds a value, not settings")
        if not isinstance(node, dict | list):
            raise OverrideError(f"{key}: {where} holds a value ({node!r}), not settings")
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise OverrideError(f"{key}: {last} is not an item of the list {'.'.join(parts[:-1])}")
        node[int(last)] = value
    else:
        node[last] = value


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the profile's mapping ``raw`` with each override written at its key path (sections the
    profile leaves out are created); the schema validates the result."""
    result: dict[str, Any] = json.loads(json.dumps(raw, default=str))  # a deep copy of plain YAML data
    for key, value in overrides.items():
        _set(result, key, value)
    return result


def _spelled(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def derived_run_name(base: str, overrides: Mapping[str, Any]) -> str:
    """The run a profile's overrides write to: ``<base>--<key>-<value>`` per override (sorted by key),
    or ``<base>--set-<digest>`` when a key or value cannot be spelled in a run name or the name would be
    too long; the base itself when there is none."""
    if not overrides:
        return base
    items = sorted((key, _spelled(value)) for key, value in overrides.items())
    readable = "--".join(f"{key}-{value}" for key, value in items)
    if all(_NAME_PIECE.match(k) and _NAME_PIECE.match(v) for k, v in items):
        name = f"{base}--{readable}"
        if len(name) <= MAX_NAME:
            return name
    digest = hashlib.sha256(json.dumps(items).encode()).hexdigest()[:12]
    suffix = f"--set-{digest}"
    return base[: MAX_NAME - len(suffix)] + suffix
