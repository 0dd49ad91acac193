"""The Makefile's per-stage part, generated from the stage registry (``storybias.core.artifacts.STAGES``).

``make/stages.mk`` is this module's :func:`stages_mk` output, committed and ``include``d by the Makefile
(``python -m storybias.cli stages-mk > make/stages.mk`` after changing the registry; a test checks that
the committed file is the output, byte for byte). It holds, for every stage:

- the rule of its Make target (the artifact its notebook writes last): the earlier stages' targets it reads,
  its notebook, its params stamp and the data files it reads (``input_files``), run by ``run-stage``;
- the rule of its executed notebook (``--report-only``, when the target is up to date but the notebook is
  missing), and its public target ``make <token>``, which makes both under the Makefile's ``served``
  wrapper (the run's lock for the whole ``make``, a sub-make that reads the run's folders, the models kept
  up when the profile asks);
- the stage's side targets (the explorer), and the lists ``STAGE_TOKENS``, ``STAGE_STAMPS``,
  ``STAGE_TARGETS``, ``STAGE_REPORTS`` and ``LLM_TARGETS`` the Makefile's run-wide rules use.

The Makefile itself names no stage: adding one to the registry and regenerating this file is all Make needs.
"""

from __future__ import annotations

from pathlib import Path

from storybias.core.artifacts import MAKE_TARGETS, SIDE_TARGETS, STAGE_BY_TOKEN, STAGES, Stage, artifact

GENERATED_PATH = "make/stages.mk"
HEADER = (
    "# Generated from storybias.core.artifacts.STAGES by `python -m storybias.cli stages-mk > make/stages.mk`:\n"
    "# do not edit (tests/test_artifacts.py checks that this file is the command's output).\n"
)


def make_path(name: str) -> str:
    """Artifact ``name`` as the Makefile names it: under ``$(DATA)`` or ``$(FIGURES)``."""
    entry = artifact(name)
    return f"$({'DATA' if entry.root == 'data' else 'FIGURES'})/{entry.pattern}"


def stamp(stage: Stage) -> str:
    return f"$(STAMPS)/{stage.token}.params"


def report(stage: Stage) -> str:
    return f"$(REPORTS)/{Path(stage.notebook).stem}.ipynb"


def _words(prefix: str, words: list[str]) -> str:
    """``prefix`` then the words, wrapped under Make's line continuation at about 110 characters."""
    lines, line = [], prefix
    for word in words:
        if len(line) + len(word) > 110 and line.strip():
            lines.append(line + " \\")
            line = " " * 4
        line += (" " if not line.endswith(" ") else "") + word
    return "\n".join([*lines, line])


def _llm_targets(upto: int) -> list[str]:
    """The Make targets of the model-running stages numbered ``upto`` or less."""
    return [make_path(s.make_target) for s in STAGES if s.runs_models and s.number <= upto]


def _stage_rules(stage: Stage) -> list[str]:
    name = Path(stage.notebook).stem
    target = make_path(stage.make_target)
    prereqs = [*(make_path(r) for r in stage.reads), stage.notebook, stamp(stage)]
    prereqs += [f"$(wildcard {glob})" for glob in stage.input_files]
    public = f"{stage.token}:"
    describe = f"## stage {stage.number:02d}: {stage.title} ({stage.notebook})"
    public_rule = [
        f"GOALS_{stage.token} = {target} {report(stage)}",
        _words(f"LLM_{stage.token} =", _llm_targets(stage.number)),
        f"{public} | $(VENV_STAMP)  {describe}",
        f"\t@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED={stage.token}",
    ]
    return [
        _words(f"{target}:", prereqs) + " | $(VENV_STAMP)",
        f"\t$(call run_notebook,{name},{stage.token})",
        "",
        f"{report(stage)}: {target} | $(VENV_STAMP)",
        f"\t$(call report_only,{name},{stage.token})",
        "",
        *public_rule,
        "",
    ]


STAGE_NUMBER = {token: stage.number for token, stage in STAGE_BY_TOKEN.items()}


def _side_rules() -> list[str]:
    out = []
    for side in SIDE_TARGETS:
        target = make_path(side.artifact)
        prereqs = [*(make_path(r) for r in side.reads), f"$(STAMPS)/{side.stage}.params"]
        out += [
            _words(f"{target}:", prereqs) + " | $(VENV_STAMP)",
            f'\t@echo "== {side.artifact}: $@"',
            f"\t@$(PY) -m storybias.cli {side.command} $(PARAMS) > /dev/null",
            "",
            f"GOALS_{side.artifact} = {target}",
            _words(f"LLM_{side.artifact} =", _llm_targets(STAGE_NUMBER[side.stage])),
            f"{side.artifact}: | $(VENV_STAMP)  ## {side.title}",
            f"\t@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED={side.artifact}",
            "",
        ]
    return out


def stages_mk() -> str:
    """The text of ``make/stages.mk`` (see the module docstring)."""
    targets = [make_path(name) for names in MAKE_TARGETS.values() for name in names]
    lists = [
        _words("STAGE_TOKENS :=", [s.token for s in STAGES]),
        _words("STAGE_STAMPS :=", [stamp(s) for s in STAGES]),
        _words("STAGE_TARGETS :=", targets),
        _words("STAGE_REPORTS :=", [report(s) for s in STAGES]),
        _words("LLM_TARGETS :=", _llm_targets(max(s.number for s in STAGES))),
        _words(".PHONY:", [*(s.token for s in STAGES), *(side.artifact for side in SIDE_TARGETS)]),
        "",
    ]
    rules = [line for stage in STAGES for line in _stage_rules(stage)]
    return HEADER + "\n" + "\n".join([*lists, *rules, *_side_rules()]).rstrip("\n") + "\n"
