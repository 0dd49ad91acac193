# storybias: `make paper` runs the pipeline, `make test` runs the tests. Both set up .venv first.
#
#   make paper [PARAMS=params/default.yaml]   every stage, notebooks executed into reports/<run>/
#                                              (into $STORYBIAS_DATA/<run>/reports/ when STORYBIAS_DATA is set)
#   make <stage> | explorer                   one stage (and what it needs); `make help` lists the stages
#   SERVE=1|0   each model loaded once per run, kept up across the LLM stages | one in-process engine per stage
#   make check-params PARAMS=params/x.yaml     validate a profile only
#   make <stage> SET="key.path=value ..."      one parameter changed: a run of its own, then what moved
#   make where | clean-run [PARAMS=...]        print the run's folders | delete them, if they are the run's own
#   make test | test-fast                      every test | those that need no model, browser or GPU
#   make lint | format | typecheck             ruff check + format check | apply ruff | mypy on lib/
#   make help                                  every target, one line each
#   make lab                                   JupyterLab on notebooks/ with the storybias kernel
#
# DEVICE=cpu|cuda picks the vLLM build (default: cuda when nvidia-smi sees a GPU, else cpu).
# SERVE unset: the profile's generation.engine.shared_server decides.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := help

PARAMS ?= params/default.yaml
# Overrides on top of PARAMS ("associations.power_known_share=0.25", several separated by spaces; values
# read as YAML scalars): a run of its own, named from PARAMS' run and the overrides, that starts from a copy
# of that run (storybias.config.overrides, storybias.core.derived_runs). Every storybias.cli command reads
# them from STORYBIAS_SET; exported empty without SET, so a stray variable changes nothing.
SET ?=
export STORYBIAS_SET := $(SET)
# 1: `make paper` / generate / extract / associations run their LLM stages under `with-servers`: each model
# loads once and stays up across the stages (a model host, storybias.engines.host, or a vLLM server, as the
# profile's generation.engine.shared_server_kind says), stopped at the end whatever happens; 0: one
# in-process engine per stage; unset: the profile's generation.engine.shared_server.
SERVE ?=
# The stamps below are remade on every call (FORCE); the shared-server check empties this to ask
# `make -q` whether an LLM stage has work to do, without starting a server for an up-to-date run.
STAMPS_FORCE ?= FORCE
DEVICE ?= $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo cuda; else echo cpu; fi)
PYTHON ?= python3

VENV := .venv
PY := $(VENV)/bin/python
# DEVICE=cuda installs requirements/gpu.txt and lock-gpu.txt (cpu: cpu.txt and lock-cpu.txt).
PIN_SET := $(if $(filter cuda,$(DEVICE)),gpu,$(DEVICE))
PIN_FILES := requirements/base.txt requirements/$(PIN_SET).txt requirements/embedded-model.txt \
             $(wildcard requirements/lock-$(PIN_SET).txt) pyproject.toml scripts/setup-venv.sh
# EXTRAS=ray adds requirements/extra-ray.txt on top (optional extras); without EXTRAS the stamp is
# exactly what it was before extras existed, so the default environment is not rebuilt.
EXTRAS ?=
EXTRA_FILES := $(foreach e,$(EXTRAS),requirements/extra-$(e).txt)
PIN_HASH := $(shell cat $(PIN_FILES) $(EXTRA_FILES) | sha256sum | cut -c1-12)
VENV_STAMP := $(VENV)/.installed-$(DEVICE)$(if $(strip $(EXTRAS)),-$(subst $(eval) ,+,$(strip $(EXTRAS))))-$(PIN_HASH)

# Paths. Make splits words on spaces, so a data folder or profile path with a space in it would
# become two paths (`rm -rf` once deleted the wrong folders that way): such paths are refused here,
# before anything runs. A relative STORYBIAS_DATA / STORYBIAS_FIGURES is made absolute once, against
# the repository root, and exported, so the notebooks (run from notebooks/) see the same folders.
# The checkout itself may have a space in its path: Make uses relative paths, and the stages run
# papermill without a shell (storybias.cli run-stage).
refuse_spaces = $(if $(word 2,$(2)),$(error $(1)="$(2)" contains a space: Make cannot track files there; choose a path without spaces (a symlink without spaces to the folder works)))
$(call refuse_spaces,PARAMS,$(PARAMS))
$(call refuse_spaces,STORYBIAS_DATA,$(STORYBIAS_DATA))
$(call refuse_spaces,STORYBIAS_FIGURES,$(STORYBIAS_FIGURES))
ifneq ($(STORYBIAS_DATA),)
export STORYBIAS_DATA := $(abspath $(STORYBIAS_DATA))
$(call refuse_spaces,STORYBIAS_DATA (made absolute),$(STORYBIAS_DATA))
endif
ifneq ($(STORYBIAS_FIGURES),)
export STORYBIAS_FIGURES := $(abspath $(STORYBIAS_FIGURES))
$(call refuse_spaces,STORYBIAS_FIGURES (made absolute),$(STORYBIAS_FIGURES))
endif

# The run's name and folders, as the project reads them: `storybias.cli where --make` loads and validates
# the profile (storybias.config.params) and prints RUN, DATA, REPORTS, FIGURES and STAMPS
# (storybias.core.paths), so Make and the stages never disagree on a spelling of `run_name`. Asked once per
# checkout, profile path and content and data/figures roots, and kept in .make/ (a week). Before the environment
# exists (a fresh clone) or for a profile the project refuses, the folders stay unknown: every stage goal
# runs its stages in a sub-make (`served` below) after the environment is built, which asks again, or is
# refused with the project's message before anything is touched.
RUN_KEY := $(shell { printf '%s\n' "$(CURDIR)" "$(PARAMS)" "$(STORYBIAS_DATA)" "$(STORYBIAS_FIGURES)" "$(SET)"; \
                     cat "$(PARAMS)"; } 2>/dev/null | sha256sum | cut -c1-16)
RUN_VARS := .make/run-$(RUN_KEY).mk
ifeq ($(wildcard $(RUN_VARS)),)
ifneq ($(wildcard $(PY)),)
$(shell mkdir -p .make && find .make -name 'run-*.mk' -mtime +7 -delete; \
        STORYBIAS_SET="$(SET)" $(PY) -m storybias.cli where --make "$(PARAMS)" > $(RUN_VARS).tmp 2>/dev/null \
        && mv $(RUN_VARS).tmp $(RUN_VARS); rm -f $(RUN_VARS).tmp)
endif
endif
-include $(RUN_VARS)
ifeq ($(RUN),)
RUN := .unknown-run
DATA := .make/$(RUN)
REPORTS := $(DATA)/reports
FIGURES := $(DATA)/figures
STAMPS := $(DATA)/.params
endif
KERNEL := storybias

# The per-stage part: each stage's target, executed-notebook and public rules, and the lists STAGE_TOKENS,
# STAGE_STAMPS, STAGE_TARGETS, STAGE_REPORTS and LLM_TARGETS, generated from the stage registry
# (storybias.core.artifacts.STAGES; `python -m storybias.cli stages-mk > make/stages.mk` after changing it).
include make/stages.mk

# Every stage's Make target is written last by its notebook. `run-stage` runs the notebook under the
# run's lock (a second process on the same run is refused and touches nothing) and removes the target
# itself if its own run fails after writing it; Make must never delete one (.PRECIOUS), or a refused
# second `make` would delete the good file the first had just written.
.PRECIOUS: $(STAGE_TARGETS)
.PRECIOUS: $(STAGE_REPORTS)

# Execute notebook $(1) for stage $(2) (papermill into reports/<run>/, moved into place on success).
define run_notebook
	@$(PY) -m storybias.cli run-stage $(2) notebooks/$(1).ipynb $(PARAMS) --target $@
endef

# A stage's executed notebook is written by the stage's run (the rules below it), after the target. When
# it is missing or older than the target (a kill between the two, or the stage run from JupyterLab), the
# notebook runs again to write it: model answers and embeddings come from the run's caches, and the
# target keeps its modification time, so no later stage reruns (`run-stage --report-only`).
define report_only
	@$(PY) -m storybias.cli run-stage $(2) notebooks/$(1).ipynb $(PARAMS) --target $< --report-only
endef

.PHONY: help where venv model check-params stamps paper _paper _served llama-server test test-fast lint format typecheck bench-generate bench-engine decode-ceiling stage-times bench-ray plan bench-associations bench-import gold-variants publish-notebooks lab clean-run what-moved FORCE

# `$(HOLD_RUN) $(MAKE) _served SERVED=NAME`: what every stage goal and `make paper` run to make
# $(GOALS_NAME) (the $(MAKE) is written out in each recipe, so `make -n` shows the plan). Under the run's
# lock (`storybias.cli hold-run`: one lock from the first stage of this `make` to the last, which the stages
# inherit and `clean-run` respects; a kill releases it), a sub-make, which reads the run's folders now that
# the environment exists, makes GOALS_NAME, under `storybias.cli with-servers` (each model loaded once for
# the sub-make, stopped when it ends or fails) when SERVE (or the profile) asks for it and one of
# $(LLM_NAME) is out of date. A dry run (`make -n`) takes no lock.
# With SET, what moved against the base run, printed at the end of the stage goal (without SET, no line at all).
WHAT_MOVED = $(if $(strip $(SET)),@$(PY) -m storybias.cli what-moved $(PARAMS))
HOLD_RUN = $(if $(findstring n,$(firstword -$(MAKEFLAGS))),,$(PY) -m storybias.cli hold-run $(PARAMS) --)
_served: | $(VENV_STAMP)
	@if [ "$(SERVE)" = 0 ]; then serve=0; elif [ "$(SERVE)" = 1 ]; then serve=1; \
	else serve=$$($(PY) -m storybias.cli serve-mode $(PARAMS)); fi; \
	if [ "$$serve" = 1 ]; then \
	  $(MAKE) --no-print-directory stamps SERVE=0; \
	  if $(MAKE) --no-print-directory -q $(LLM_$(SERVED)) STAMPS_FORCE= SERVE=0 >/dev/null 2>&1; then serve=0; fi; \
	fi; \
	if [ "$$serve" = 1 ]; then \
	  $(PY) -m storybias.cli with-servers $(PARAMS) -- $(MAKE) --no-print-directory $(GOALS_$(SERVED)) SERVE=0; \
	else \
	  $(MAKE) --no-print-directory $(GOALS_$(SERVED)) SERVE=0; \
	fi
	$(WHAT_MOVED)

# `make help` lists every target whose rule line ends in `## description` (each public one does;
# tests/test_habits.py checks that every .PHONY target but FORCE is listed).
help:  ## this list: every target and the variables they read
	@echo "usage: make TARGET [PARAMS=params/x.yaml] [DEVICE=cpu|cuda]"
	@echo ""
	@awk 'BEGIN { FS = ":[^=]*## " } /^[a-zA-Z][a-zA-Z_-]*:[^=]*## / { printf "  %-20s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo ""
	@echo "variables:"
	@echo "  PARAMS               the profile (default params/default.yaml); its run_name names data/<run>/"
	@echo "  DEVICE               cpu or cuda: which vLLM build .venv gets (here: $(DEVICE))"
	@echo "  STORYBIAS_DATA       where data/<run>/ goes (default data/)"
	@echo "  STORYBIAS_FIGURES    where figures/<run>/ goes (default figures/)"

venv: $(VENV_STAMP)  ## set up .venv with the pinned environment for DEVICE (skipped while the pins are unchanged)
$(VENV_STAMP):
ifeq ($(strip $(EXTRAS)),)
	PYTHON=$(PYTHON) scripts/setup-venv.sh $(DEVICE) $@
else
	PYTHON=$(PYTHON) scripts/setup-venv.sh $(DEVICE) $@.base
	@echo "setup-venv: extras $(EXTRAS): $(EXTRA_FILES) (constrained by requirements/lock-$(PIN_SET).txt)"
	$(PY) -m pip install --disable-pip-version-check --progress-bar off $(foreach f,$(EXTRA_FILES),-r $(f)) \
	  -c requirements/lock-$(PIN_SET).txt >> $(VENV)/setup.log
	$(PY) -c "import ray.data.llm" && mv $@.base $@ && echo "environment ready ($(DEVICE) + $(EXTRAS)): $@"
endif

model: $(VENV_STAMP)  ## assemble, verify and convert the embedded stand-in models, 1.5B and 0.5B, bf16 and int8 (once; no download)
	@started=$$(date +%s); $(PY) -m storybias.cli prepare-model && \
	  echo "make model: embedded models ready in $$(( $$(date +%s) - started )) s (data/models/, once per checkout)"

check-params: $(VENV_STAMP)  ## validate PARAMS against the schema, run nothing
	$(PY) -m storybias.cli check-params $(PARAMS)

# One process validates the profile and refreshes every stage's params stamp; a stamp file changes
# only when its stage's parameters do, so Make reruns only the stages whose parameters changed. A refused
# profile writes no stamp, and Make must delete none (.PRECIOUS): a refused command deletes nothing.
.PRECIOUS: $(STAGE_STAMPS)
$(STAGE_STAMPS) &: $(STAMPS_FORCE) | $(VENV_STAMP)
	@$(PY) -m storybias.cli stamps $(PARAMS)
stamps: $(STAGE_STAMPS)  ## refresh every stage's parameter stamp (Make reruns stages whose stamp changed)

GOALS_paper = _paper
LLM_paper = $(LLM_TARGETS)
paper: | $(VENV_STAMP)  ## every stage for PARAMS (default params/default.yaml), notebooks executed into reports/<run>/
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=paper

_paper: $(STAGE_TARGETS) $(STAGE_REPORTS)
	@echo "run '$(RUN)' complete:"
	@echo "  figures (PNG + PDF) and explorer.html: $(FIGURES)/"
	@echo "  executed notebooks and logs:           $(REPORTS)/"
	@echo "  data artifacts:                        $(DATA)/"
	@echo "  time per stage:                        make stage-times PARAMS=$(PARAMS)$(if $(SET), SET='$(SET)',)"

# LLAMA=1: the CPU vLLM engine and llama.cpp's llama-server side by side (storybias.tools.bench_llamacpp).
bench-generate: $(VENV_STAMP) $(if $(filter 1,$(LLAMA)),$(VENV)/bin/llama-server,)  ## tokens/s of stage 01's engine path against a bare LLM.chat on PARAMS
	$(PY) -m storybias.cli bench-generate $(PARAMS) $(if $(filter 1,$(SERVE)),--served,) $(if $(filter 1,$(LLAMA)),--llama-cpp,) $(BENCH_ARGS)

# The CPU engine's settings (docs/measurements/engine_settings.csv): a process per trial, alternated.
bench-engine: $(VENV_STAMP)  ## engine start-up and tokens/s on PARAMS: compiled, eager, eager + tcmalloc/iomp preload
	$(PY) -m storybias.cli bench-engine $(PARAMS)

decode-ceiling: $(VENV_STAMP)  ## most tokens/s this CPU's matrix units allow PARAMS' first model (32-256 sequences)
	$(PY) -m storybias.cli decode-ceiling $(PARAMS)

stage-times: $(VENV_STAMP)  ## per-stage time of PARAMS' last run (papermill + manifests), as README's table
	@$(PY) -m storybias.cli stage-times $(PARAMS)

# Ray Data's vLLM processor (generation.engine.backend: ray) against the in-process engine (needs EXTRAS=ray).
bench-ray: $(VENV_STAMP)  ## smoke generation through Ray vs in process on PARAMS: tokens/s, start-up, kill-and-resume
	$(PY) -m storybias.cli bench-ray $(PARAMS)

plan: $(VENV_STAMP)  ## the work of PARAMS per design and model: requests, tokens, wall time on planning.gpus
	@$(PY) -m storybias.cli plan $(PARAMS)

# Stage 04's statistics at paper scale on a synthetic extraction table (no model needed).
bench-associations: $(VENV_STAMP)  ## stage 04's statistics at paper scale on synthetic data (no model)
	$(PY) -m storybias.cli bench-associations

bench-import: $(VENV_STAMP)  ## import a paper-scale synthetic StereoTales release, then stages 02-04 on it (no model)
	$(PY) -m storybias.cli bench-import

# Stage 03's prompt variants on the full gold set, one engine of PARAMS' first extractor (issue #61;
# docs/measurements/extraction_prompt_variants.csv): the first variant is the baseline, each NAME:key=value,...
# sets extract settings; results kept under data/gold_variants/<run>/, so a rerun asks only new variants.
GOLD_VARIANTS ?= baseline instructions_once:example_instructions=first_turn \
	one_answer:prompt_design=one_answer,map_fields=null examples_1:worked_examples=1 \
	once_one_answer:example_instructions=first_turn,prompt_design=one_answer,map_fields=null
gold-variants: $(VENV_STAMP)  ## stage 03's prompt variants on the gold set: accuracy vs the first, tokens, seconds
	LD_PRELOAD="$$($(PY) -c 'from storybias.config.checks import cpu_preload_libraries as c; print(c() or "")')" \
	$(PY) -m storybias.cli gold-variants $(PARAMS) $(foreach v,$(GOLD_VARIANTS),--variant $(v))

# llama.cpp's llama-server (generation.engine.shared_server_kind: llama.cpp; tests/test_llamacpp_slow.py), built
# once per environment from the llama.cpp tree PyPI's llama-cpp-python sdist vendors; the build is cached
# under ~/.cache/storybias/llama-server/ (keyed by the sdist's sha256 and the CPU), so a new .venv reuses it.
$(VENV)/bin/llama-server: scripts/build-llama-server.sh | $(VENV_STAMP)
	scripts/build-llama-server.sh $(VENV)
llama-server: $(VENV)/bin/llama-server  ## build llama.cpp's llama-server into .venv/bin once (minutes; cached per CPU)

# The explorer's browser test needs Debian's chromium + chromedriver: installed here when missing.
# Two workers (pytest-xdist): the model tests run in order on one of them (tests/conftest.py groups them),
# every other module is spread over both. TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
# make test builds llama.cpp's llama-server first (once per environment, cached per CPU; timed apart by the
# script), so the real-server test (tests/test_llamacpp_slow.py) runs; elsewhere it is skipped, saying why.
# It prepares the embedded models first too (`make model`, once per checkout, timed apart): on a fresh clone the
# tests assembled, converted and quantized them inside the model tests' chain (in CI's pytest of 2026-12-07 the
# sibling's set-up took 109 s and the decode ceiling's 77 s; 39 s and 0 s with data/models/ ready).
test: $(VENV_STAMP) $(VENV)/bin/llama-server model  ## every test, the slow ones (embedded model, llama-server) and the browser one included
	scripts/install-browser.sh
	$(VENV)/bin/pytest $(XDIST) --durations=15 tests

# Markers (registered in tests/conftest.py): slow = the embedded model, browser = Chromium.
test-fast: $(VENV_STAMP)  ## the tests that need no model or browser (runs anywhere, a few minutes)
	$(VENV)/bin/pytest $(XDIST) -m "not slow and not browser" tests

# Lint, format and types (configured in pyproject.toml; tests/test_habits.py runs the same checks).
lint: $(VENV_STAMP)  ## ruff check + ruff format --check on lib/ and tests/, and lint-imports (the layer contracts)
	$(VENV)/bin/ruff check lib tests
	$(VENV)/bin/ruff format --check lib tests
	$(VENV)/bin/lint-imports

format: $(VENV_STAMP)  ## apply ruff format and ruff's safe fixes to lib/ and tests/
	$(VENV)/bin/ruff format lib tests
	$(VENV)/bin/ruff check --fix lib tests

typecheck: $(VENV_STAMP)  ## mypy on lib/storybias (pyproject.toml [tool.mypy])
	$(VENV)/bin/mypy

lab: $(VENV_STAMP)  ## JupyterLab on notebooks/ with the storybias kernel
	$(VENV)/bin/jupyter lab notebooks/

# The outputs committed in notebooks/ are the default run's (what a reviewer sees on the web): after
# `make paper`, this copies each executed notebook's outputs (reports/<run>/) into notebooks/, keeping
# the committed cells and refusing if a notebook changed since the run. nbval still runs every notebook
# on the smoke profile and compares only the cells marked NBVAL_CHECK_OUTPUT (the same on every run).
publish-notebooks: $(VENV_STAMP)  ## copy the outputs of PARAMS' executed notebooks (reports/<run>/, from make paper) into notebooks/
	$(PY) -m storybias.cli publish-notebooks $(PARAMS)

# Deletes only the run's own folders (data/<run>, reports/<run>, figures/<run>), and says which; refuses,
# deleting nothing, a folder that is not the run's own (storybias.core.run_folders: no .storybias-run
# marker of the run, or a place where runs do not live: lib/, params/, the model weights, ...).
clean-run: $(VENV_STAMP)  ## delete exactly this run's folders (data/<run>, reports/<run>, figures/<run>), if they are its own
	@$(PY) -m storybias.cli clean-run $(PARAMS)

what-moved: $(VENV_STAMP)  ## with SET="key=value ...": the recorded values that moved against PARAMS' own run
	@$(PY) -m storybias.cli what-moved $(PARAMS)

# The run's name and absolute folders, as every stage will see them.
where: $(VENV_STAMP)  ## print the run's name and absolute folders
	@$(PY) -m storybias.cli where $(PARAMS)

FORCE:
