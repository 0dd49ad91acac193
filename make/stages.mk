# Generated from storybias.core.artifacts.STAGES by `python -m storybias.cli stages-mk > make/stages.mk`:
# do not edit (tests/test_artifacts.py checks that this file is the command's output).

STAGE_TOKENS := generate filter extract associations metrics probes crosslens figures
STAGE_STAMPS := $(STAMPS)/generate.params $(STAMPS)/filter.params $(STAMPS)/extract.params \
    $(STAMPS)/associations.params $(STAMPS)/metrics.params $(STAMPS)/probes.params $(STAMPS)/crosslens.params \
    $(STAMPS)/figures.params
STAGE_TARGETS := $(DATA)/stories.parquet $(DATA)/filtered.parquet $(DATA)/extractions.parquet \
    $(DATA)/manifest_associations.json $(DATA)/manifest_metrics.json $(DATA)/manifest_probes.json \
    $(DATA)/manifest_crosslens.json $(FIGURES)/figures.json $(FIGURES)/explorer.html
STAGE_REPORTS := $(REPORTS)/01_generate.ipynb $(REPORTS)/02_filter.ipynb $(REPORTS)/03_extract.ipynb \
    $(REPORTS)/04_associations.ipynb $(REPORTS)/05_metrics.ipynb $(REPORTS)/06_probes.ipynb \
    $(REPORTS)/07_crosslens.ipynb $(REPORTS)/08_figures.ipynb
LLM_TARGETS := $(DATA)/stories.parquet $(DATA)/extractions.parquet $(DATA)/manifest_associations.json
.PHONY: generate filter extract associations metrics probes crosslens figures explorer

$(DATA)/stories.parquet: notebooks/01_generate.ipynb $(STAMPS)/generate.params \
    $(wildcard params/designs/*/*.yaml) | $(VENV_STAMP)
	$(call run_notebook,01_generate,generate)

$(REPORTS)/01_generate.ipynb: $(DATA)/stories.parquet | $(VENV_STAMP)
	$(call report_only,01_generate,generate)

GOALS_generate = $(DATA)/stories.parquet $(REPORTS)/01_generate.ipynb
LLM_generate = $(DATA)/stories.parquet
generate: | $(VENV_STAMP)  ## stage 01: stories (notebooks/01_generate.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=generate

$(DATA)/filtered.parquet: $(DATA)/stories.parquet notebooks/02_filter.ipynb $(STAMPS)/filter.params \
    $(wildcard params/refusals/*.yaml) | $(VENV_STAMP)
	$(call run_notebook,02_filter,filter)

$(REPORTS)/02_filter.ipynb: $(DATA)/filtered.parquet | $(VENV_STAMP)
	$(call report_only,02_filter,filter)

GOALS_filter = $(DATA)/filtered.parquet $(REPORTS)/02_filter.ipynb
LLM_filter = $(DATA)/stories.parquet
filter: | $(VENV_STAMP)  ## stage 02: language identification, refusals, valid-story rate (notebooks/02_filter.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=filter

$(DATA)/extractions.parquet: $(DATA)/filtered.parquet notebooks/03_extract.ipynb $(STAMPS)/extract.params \
    $(wildcard params/designs/*/design.yaml) $(wildcard params/extract/gold/*.yaml) \
    $(wildcard params/extract/*.yaml) | $(VENV_STAMP)
	$(call run_notebook,03_extract,extract)

$(REPORTS)/03_extract.ipynb: $(DATA)/extractions.parquet | $(VENV_STAMP)
	$(call report_only,03_extract,extract)

GOALS_extract = $(DATA)/extractions.parquet $(REPORTS)/03_extract.ipynb
LLM_extract = $(DATA)/stories.parquet $(DATA)/extractions.parquet
extract: | $(VENV_STAMP)  ## stage 03: attributes of every valid story (notebooks/03_extract.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=extract

$(DATA)/manifest_associations.json: $(DATA)/extractions.parquet notebooks/04_associations.ipynb \
    $(STAMPS)/associations.params $(wildcard params/designs/*/*.yaml) | $(VENV_STAMP)
	$(call run_notebook,04_associations,associations)

$(REPORTS)/04_associations.ipynb: $(DATA)/manifest_associations.json | $(VENV_STAMP)
	$(call report_only,04_associations,associations)

GOALS_associations = $(DATA)/manifest_associations.json $(REPORTS)/04_associations.ipynb
LLM_associations = $(DATA)/stories.parquet $(DATA)/extractions.parquet $(DATA)/manifest_associations.json
associations: | $(VENV_STAMP)  ## stage 04: StereoTales associations and harm (notebooks/04_associations.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=associations

$(DATA)/manifest_metrics.json: $(DATA)/extractions.parquet notebooks/05_metrics.ipynb $(STAMPS)/metrics.params \
    $(wildcard params/lexicon/*.yaml) $(wildcard params/designs/*/design.yaml) | $(VENV_STAMP)
	$(call run_notebook,05_metrics,metrics)

$(REPORTS)/05_metrics.ipynb: $(DATA)/manifest_metrics.json | $(VENV_STAMP)
	$(call report_only,05_metrics,metrics)

GOALS_metrics = $(DATA)/manifest_metrics.json $(REPORTS)/05_metrics.ipynb
LLM_metrics = $(DATA)/stories.parquet $(DATA)/extractions.parquet $(DATA)/manifest_associations.json
metrics: | $(VENV_STAMP)  ## stage 05: BiasedTales-ML and Feng et al. metrics (notebooks/05_metrics.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=metrics

$(DATA)/manifest_probes.json: $(DATA)/extractions.parquet notebooks/06_probes.ipynb $(STAMPS)/probes.params \
    $(wildcard params/cues/*.yaml) | $(VENV_STAMP)
	$(call run_notebook,06_probes,probes)

$(REPORTS)/06_probes.ipynb: $(DATA)/manifest_probes.json | $(VENV_STAMP)
	$(call report_only,06_probes,probes)

GOALS_probes = $(DATA)/manifest_probes.json $(REPORTS)/06_probes.ipynb
LLM_probes = $(DATA)/stories.parquet $(DATA)/extractions.parquet $(DATA)/manifest_associations.json
probes: | $(VENV_STAMP)  ## stage 06: Feng et al. probes and cultural markers (notebooks/06_probes.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=probes

$(DATA)/manifest_crosslens.json: $(DATA)/manifest_associations.json $(DATA)/manifest_metrics.json \
    $(DATA)/manifest_probes.json notebooks/07_crosslens.ipynb $(STAMPS)/crosslens.params | $(VENV_STAMP)
	$(call run_notebook,07_crosslens,crosslens)

$(REPORTS)/07_crosslens.ipynb: $(DATA)/manifest_crosslens.json | $(VENV_STAMP)
	$(call report_only,07_crosslens,crosslens)

GOALS_crosslens = $(DATA)/manifest_crosslens.json $(REPORTS)/07_crosslens.ipynb
LLM_crosslens = $(DATA)/stories.parquet $(DATA)/extractions.parquet $(DATA)/manifest_associations.json
crosslens: | $(VENV_STAMP)  ## stage 07: the three lenses side by side (notebooks/07_crosslens.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=crosslens

$(FIGURES)/figures.json: $(DATA)/filtered.parquet $(DATA)/manifest_associations.json \
    $(DATA)/manifest_metrics.json $(DATA)/manifest_probes.json $(DATA)/manifest_crosslens.json \
    notebooks/08_figures.ipynb $(STAMPS)/figures.params | $(VENV_STAMP)
	$(call run_notebook,08_figures,figures)

$(REPORTS)/08_figures.ipynb: $(FIGURES)/figures.json | $(VENV_STAMP)
	$(call report_only,08_figures,figures)

GOALS_figures = $(FIGURES)/figures.json $(REPORTS)/08_figures.ipynb
LLM_figures = $(DATA)/stories.parquet $(DATA)/extractions.parquet $(DATA)/manifest_associations.json
figures: | $(VENV_STAMP)  ## stage 08: every figure, and the stories explorer (notebooks/08_figures.ipynb)
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=figures

$(FIGURES)/explorer.html: $(DATA)/filtered.parquet $(DATA)/extractions.parquet \
    $(DATA)/manifest_associations.json $(STAMPS)/figures.params | $(VENV_STAMP)
	@echo "== explorer: $@"
	@$(PY) -m storybias.cli explorer $(PARAMS) > /dev/null

GOALS_explorer = $(FIGURES)/explorer.html
LLM_explorer = $(DATA)/stories.parquet $(DATA)/extractions.parquet $(DATA)/manifest_associations.json
explorer: | $(VENV_STAMP)  ## the stories explorer, one HTML page in figures/<run>/
	@$(HOLD_RUN) $(MAKE) --no-print-directory _served SERVED=explorer
