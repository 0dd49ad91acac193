"""Profiles written by tests: the smoke profile as a dict to edit, and a dict written back as a profile file."""

from __future__ import annotations

from pathlib import Path

import yaml

from storybias.core import paths


def read_smoke() -> dict:
    """``params/smoke.yaml`` as a fresh dict."""
    return yaml.safe_load((paths.repo_root() / "params" / "smoke.yaml").read_text())


def write_profile(tmp_path: Path, raw: dict, name: str = "p.yaml") -> Path:
    """``raw`` written as the profile ``tmp_path/name`` (keys in their order)."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
