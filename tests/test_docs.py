"""Issue #42 item 9, a front door: README.md stays short and links every page of docs/, and whatever
README.md and docs/ name exists: repository paths, `storybias.*` modules, `make` targets and the targets
of their links (anchors included).

The README used to name files that had moved (``lib/storybias/artifacts.py``, ``notebooks/07_figures.ipynb``)
for weeks; these tests read the documents as a newcomer would and fail on such a name.

What counts as a named path: a word of a code span or of a fenced block that starts with one of
``PREFIXES`` or is one of ``TOP_LEVEL``, and every relative link target (resolved against the linking
file's folder, as GitHub does). A word with a placeholder (``<run>``, ``NN_name``, ``...``) is skipped; a
glob (``params/designs/*/design.yaml``) must match at least one file.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOC_FILES = [README, *sorted(DOCS.rglob("*.md"))]
MAX_README_LINES = 200
MAX_README_WORDS = 1200  # issue #59: a front door, not a measurement log (it had reached 2,426 words)
MAX_README_LINE = 120  # characters; one line of the README once held 830 of dates, hashes and timings

PREFIXES = (
    "lib/",
    "notebooks/",
    "params/",
    "tests/",
    "docs/",
    "figures/",
    "scripts/",
    "requirements/",
    "tools/",
    ".ci/",
)
TOP_LEVEL = {
    "Makefile",
    "pyproject.toml",
    "environment.yml",
    "CITATION.cff",
    "CHANGELOG.md",
    "LICENSE",
    "README.md",
    ".pre-commit-config.yaml",
    ".gitignore",
}
PLACEHOLDER = re.compile(r"<[^>]*>|NN|\.\.\.|…")

FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
# `make` followed by its words, up to a comment, a pipe, a command separator or the end of the span
MAKE = re.compile(r"(?:^|[\s(])make((?:[ \t]+[^\s`#|;&)]+)*)", re.M)
MODULE = re.compile(r"\bstorybias(?:\.[A-Za-z_]\w*)+")
WORD_SPLIT = re.compile(r"[\s=,;:()\[\]{}\"'|]+")


# --- reading a document ----------------------------------------------------------------------------


def _code(text: str) -> list[str]:
    """The code a document shows: each fenced block, then each code span outside them."""
    blocks = [m.group(1) for m in FENCE.finditer(text)]
    prose = FENCE.sub("", text)
    return blocks + [m.group(1) for m in CODE_SPAN.finditer(prose)]


def _path_words(code: list[str]) -> set[str]:
    words = set()
    for chunk in code:
        for word in WORD_SPLIT.split(chunk):
            word = word.strip(".`*,").removeprefix("./").split("::")[0]  # a test named in a file: the file
            if word.startswith(PREFIXES) or word in TOP_LEVEL:
                words.add(word)
    return words


def missing_paths(text: str) -> list[str]:
    """The repository paths a document's code names that do not exist (globs: that match nothing)."""
    missing = []
    for word in sorted(_path_words(_code(text))):
        if PLACEHOLDER.search(word):
            continue
        if "*" in word or "?" in word:
            if not any(ROOT.glob(word.rstrip("/"))):
                missing.append(word)
        elif not (ROOT / word).exists():
            missing.append(word)
    return missing


TEST_NAME = re.compile(r"(tests/test_\w+\.py)::(\w+)")


@cache
def _test_functions(path: str) -> frozenset[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))


def missing_tests(text: str) -> list[str]:
    """Every ``tests/test_x.py::test_name`` a document names whose file or function does not exist."""
    found = []
    for path, name in TEST_NAME.findall(text):
        if not (ROOT / path).is_file() or name not in _test_functions(path):
            found.append(f"{path}::{name}")
    return found


def promises_without_tests(text: str, section: str) -> list[str]:
    """The bullets of ``section`` (a ``## `` heading) that name no test (a ``Tests:`` line with a tests/ path)."""
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n(?=- \*\*)", body)[1:]
    return [b.split("**")[1] for b in bullets if not re.search(r"Tests: `tests/test_\w+\.py", b)]


def makefile_targets() -> set[str]:
    """The targets of the Makefile and of what it includes (make/stages.mk: the stages)."""
    files = [ROOT / "Makefile", *sorted((ROOT / "make").glob("*.mk"))]
    text = "\n".join(f.read_text(encoding="utf-8") for f in files).replace("\\\n", " ")
    targets = set(re.findall(r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)[ \t]*:(?!=)", text, re.M))
    for line in text.splitlines():
        if line.startswith(".PHONY:"):
            targets.update(line.split(":", 1)[1].split())
    return targets


def named_make_targets(text: str) -> set[str]:
    """Every target of every `make ...` command in a document's code (variables and flags left out)."""
    targets = set()
    for chunk in _code(text):
        for m in MAKE.finditer(chunk):
            for word in m.group(1).split():
                word = word.strip("`.,:")
                if word and "=" not in word and not word.startswith(("-", "$")):
                    targets.add(word)
    return targets


def missing_modules(text: str) -> list[str]:
    """The ``storybias.*`` names a document's code gives that are neither a module of lib/ nor a name
    defined in one (the last part may be a function, class or constant of the module before it)."""
    missing = []
    for name in sorted({m.group(0) for chunk in _code(text) for m in MODULE.finditer(chunk)}):
        parts = name.split(".")
        source = None
        for i in range(len(parts), 0, -1):
            base = ROOT / "lib" / Path(*parts[:i])
            if (base / "__init__.py").is_file():
                source = (i, base / "__init__.py")
                break
            if base.with_suffix(".py").is_file():
                source = (i, base.with_suffix(".py"))
                break
        if source is None or source[0] < len(parts) - 1:
            missing.append(name)
        elif source[0] == len(parts) - 1 and not re.search(rf"\b{parts[-1]}\b", source[1].read_text("utf-8")):
            missing.append(name)
    return missing


# A date (ISO, or with the month's name) or a commit hash (7 to 40 hex digits, letters and digits both):
# the README says what storybias is and how to run it; when something was measured goes to docs/benchmarks.md.
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
DATE = re.compile(
    rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b{_MONTH}\s+\d{{1,2}}(?:,\s*\d{{4}})?\b|\b\d{{1,2}}\s+{_MONTH}\b"
)
COMMIT_HASH = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/-])")
# An estimate with its interval as the notebooks print it: "0.393 [0.274, 0.520]"
INTERVAL = re.compile(r"-?\d+\.\d+\s+\[-?\d+\.\d+,\s+-?\d+\.\d+\]")


def front_door_problems(text: str) -> list[str]:
    """What makes a README more than a front door: too many words, long lines, dates and commit hashes."""
    problems = []
    if (words := len(text.split())) > MAX_README_WORDS:
        problems.append(f"{words} words (limit {MAX_README_WORDS})")
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_README_LINE:
            problems.append(f"line {number}: {len(line)} characters (limit {MAX_README_LINE})")
    problems += [f"a date: {m.group(0)}" for m in DATE.finditer(text)]
    problems += [f"a commit hash: {m.group(0)}" for m in COMMIT_HASH.finditer(text)]
    return problems


def notebook_outputs() -> str:
    """The text of every committed notebook's outputs (printed text, plain-text and HTML displays)."""
    chunks = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                for text in (output.get("text"), data.get("text/plain"), data.get("text/html")):
                    if text:
                        chunks.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(chunks)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, formatting and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", text))}


def broken_links(text: str, folder: Path) -> list[str]:
    """Relative link targets of a document in ``folder`` that do not exist, and #anchors (in the document
    itself or in another Markdown file) that name no heading."""
    broken = []
    for target in sorted({m.group(1) for m in LINK.finditer(FENCE.sub("", text))}):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        where, _, anchor = target.partition("#")
        path = (folder / where).resolve()
        if where and not path.exists():
            broken.append(target)
        elif anchor and not where and anchor not in anchors(text):
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text(encoding="utf-8")):
            broken.append(target)
    return broken


# --- the documents ---------------------------------------------------------------------------------


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_readme_is_a_front_door():
    """Issue #59 item 7: the README caps words and line length as well as lines, and holds no date or commit
    hash; timing histories and tuning stories live in docs/benchmarks.md and docs/models-and-servers.md."""
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < MAX_README_LINES, (
        f"README.md has {len(lines)} lines (limit {MAX_README_LINES}): move detail to a page of docs/"
    )
    assert front_door_problems(text) == [], "README.md is a front door: move detail to a page of docs/"


def test_readme_quotes_an_interval_the_default_run_computed():
    """The README's figure comes with a measured effect and its interval; each interval it quotes is one the
    committed notebooks print (so republishing the default run cannot leave the README's numbers behind)."""
    quoted = [" ".join(q.split()) for q in INTERVAL.findall(README.read_text(encoding="utf-8"))]
    assert quoted, "README.md quotes no estimate with its interval (e.g. 0.393 [0.274, 0.520])"
    printed = notebook_outputs()
    assert [q for q in quoted if q not in printed] == []


def test_readme_links_every_page_of_docs():
    text = README.read_text(encoding="utf-8")
    linked = {(ROOT / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(text)}
    unlinked = [_id(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"README.md links no page {unlinked}"


def test_readme_shows_a_committed_figure():
    text = README.read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert any(i.startswith("figures/default/") and i.endswith(".png") for i in images), images


@pytest.mark.parametrize("doc", DOC_FILES, ids=_id)
def test_named_paths_exist(doc: Path):
    assert missing_paths(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOC_FILES, ids=_id)
def test_named_make_targets_exist(doc: Path):
    unknown = named_make_targets(doc.read_text(encoding="utf-8")) - makefile_targets()
    assert unknown == set()


@pytest.mark.parametrize("doc", DOC_FILES, ids=_id)
def test_named_modules_exist(doc: Path):
    assert missing_modules(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOC_FILES, ids=_id)
def test_links_resolve(doc: Path):
    assert broken_links(doc.read_text(encoding="utf-8"), doc.parent) == []


@pytest.mark.parametrize("doc", DOC_FILES, ids=_id)
def test_named_tests_exist(doc: Path):
    assert missing_tests(doc.read_text(encoding="utf-8")) == []


def test_every_reliability_promise_names_the_tests_that_hold_it():
    """Issue #44: the reliability promises are stated once, in docs/reliability.md, and each names its tests."""
    text = (DOCS / "reliability.md").read_text(encoding="utf-8")
    assert promises_without_tests(text, "What is refused") == []
    assert len(TEST_NAME.findall(text)) >= 15


# --- the checks themselves -------------------------------------------------------------------------


def test_the_checks_catch_what_the_old_readme_named():
    """Names the README gave before issue #42, and a glob and placeholders that must not be flagged."""
    text = """
The registry `lib/storybias/artifacts.py`; stage 07 is `notebooks/07_figures.ipynb`.
Run `make notebook-outputs` then `make paper PARAMS=params/default.yaml`.
```bash
make bench-generate SERVE=1   # fine
python -m storybias.probes
```
Placeholders: `lib/storybias/stages/<stage>/`, `figures/<run>/NN_name.png`, `params/designs/*/design.yaml`,
`storybias.core.artifacts.STAGES`, `storybias.stats.concordance`, `storybias.core.artifacts.NO_SUCH_NAME`.
[docs](docs/no-such-page.md), [here](README.md#the-studies), [there](README.md#no-such-section).
## A heading, with `code`
[up](#a-heading-with-code), [down](#no-heading).
"""
    assert missing_paths(text) == ["lib/storybias/artifacts.py", "notebooks/07_figures.ipynb"]
    assert named_make_targets(text) - makefile_targets() == {"notebook-outputs"}
    assert missing_modules(text) == ["storybias.core.artifacts.NO_SUCH_NAME", "storybias.probes"]
    assert broken_links(text, ROOT) == ["#no-heading", "README.md#no-such-section", "docs/no-such-page.md"]
    assert missing_paths("`params/designs/*/no-such-file.yaml`") == ["params/designs/*/no-such-file.yaml"]
    named = "`tests/test_docs.py::test_links_resolve`, `tests/test_docs.py::test_gone`, `tests/test_gone.py::test_x`"
    assert missing_tests(named) == ["tests/test_docs.py::test_gone", "tests/test_gone.py::test_x"]
    promises = "## Refused\n\n- **A.** text\n  Tests: `tests/test_docs.py`.\n- **B.** no test\n\n## Next\n- **C.** x\n"
    assert promises_without_tests(promises, "Refused") == ["B."]


def test_the_front_door_check_catches_the_old_readme():
    """A line as the README had it before issue #59, and words that hold digits but no date or hash."""
    old = (
        "| `make paper` | 28 min 20 s on a fresh clone (2026-12-05), set-up included. 50 min 53 s on a fresh clone"
        " of `f3fa1af`, 49 min 11 s on `632400d`, measured on December 6, 2026 |"
    )
    assert front_door_problems(old) == [
        f"line 1: {len(old)} characters (limit {MAX_README_LINE})",
        "a date: 2026-12-05",
        "a date: December 6, 2026",
        "a commit hash: f3fa1af",
        "a commit hash: 632400d",
    ]
    fine = "arXiv:2605.10442, 2026; sha256; `figures/default/14_probe_auc.png`; lock-cpu.txt; 1,079 tests; bf16"
    assert front_door_problems(fine) == []
    assert front_door_problems("word\n" * (MAX_README_WORDS + 1)) == [f"{MAX_README_WORDS + 1} words (limit 1200)"]
