"""The command line's registry: every subcommand the parser knows runs a handler, and the commands Make
starts around every stage import neither the engines nor the statistics (storybias.cli.COMMANDS)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from storybias import cli

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "params" / "smoke.yaml")
# what Make runs for every stage or run: the Makefile's where, serve-mode, hold-run, stamps and run-stage
AROUND_EVERY_STAGE = ("where", "serve-mode", "hold-run", "stamps", "run-stage", "what-moved", "outputs", "run-name")
HEAVY = ("scipy", "sklearn", "statsmodels", "torch", "vllm", "openai", "papermill")


def subcommands() -> list[str]:
    (action,) = cli._build_parser()._subparsers._group_actions  # argparse keeps its subcommands there
    return sorted(action.choices)


def test_every_subcommand_has_one_handler_and_every_handler_a_subcommand():
    assert subcommands() == sorted(cli.COMMANDS)
    for name, where in cli.COMMANDS.items():
        module, function = where.split(":")
        assert callable(getattr(importlib.import_module(f"storybias.cli.{module}"), function)), name


def test_every_subcommand_is_listed_in_the_module_docstring():
    listed = {line.split()[0] for line in cli.__doc__.splitlines() if line[:1].isalpha() and line.split()}
    assert set(cli.COMMANDS) <= listed


@pytest.mark.parametrize("command", AROUND_EVERY_STAGE)
def test_the_commands_make_runs_around_every_stage_import_no_engine_or_statistics(command):
    """Measured (2-core Xeon, 2026-12-07): `import storybias.cli` took 2.2 CPU-s when it imported every
    command's module, 0.9 for these; `make` starts four of them for every stage goal."""
    probe = (
        "import importlib, json, sys\n"
        "from storybias import cli\n"
        "module, function = cli.COMMANDS[sys.argv[1]].split(':')\n"
        "importlib.import_module('storybias.cli.' + module)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_a_command_runs_through_python_dash_m(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "run-name", SMOKE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "smoke", done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "storybias.cli", "run-name", str(tmp_path / "none.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "none.yaml" in bad.stderr
