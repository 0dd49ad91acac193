"""Stage 08's figures, each declared once: its stable file stem (notebook order), what it shows, how it is
drawn from the run's artifacts and settings, and the sentence that quotes its statistics. Notebook 08 shows
them; :func:`storybias.stages.figures.run` draws them all."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from storybias.config.params import Params
from storybias.stages.figures.associations import association_counts, lift_share_plot, top_associations_table
from storybias.stages.figures.crosslens import crosslens_heatmap
from storybias.stages.figures.findings import headline_findings
from storybias.stages.figures.generation import attribute_distributions, vsr_heatmap
from storybias.stages.figures.judges import harm_agreement
from storybias.stages.figures.metrics import (
    anova_table,
    balance_stereotype,
    bias_fingerprints,
    cosine_heatmaps,
    distinctive_words,
    glm_table,
    jsd_by_grammatical_gender,
    vsr_vs_jsd,
)
from storybias.stages.figures.probes import (
    cultural_relevance,
    probe_auc,
    self_context_advantage,
    separability,
    umap_density,
)

Drawn = tuple[Figure, dict[str, Any]]


@dataclass(frozen=True)
class FigureSpec:
    """One figure: ``stem`` (file stem), ``description`` (what it shows, in figures.json and
    figures/README.md), ``reads`` (the artifacts and manifests of ``storybias.core.artifacts`` it draws:
    ``draw`` is given these alone), ``draw`` (artifacts by name, the run's settings -> figure and
    statistics) and ``quote`` (a :func:`storybias.stages.figures.gallery.quote_stats` template).
    Notebook 08 shows every figure, in this order."""

    stem: str
    description: str
    reads: tuple[str, ...]
    draw: Callable[[Any, Params], Drawn]
    quote: str = "{stats}"


FIGURE_SPECS: tuple[FigureSpec, ...] = (
    FigureSpec(
        "01_vsr_heatmap",
        "Valid-story rate (%) by prompt language x model (BiasedTales-ML Table 3 / App. C)",
        ("vsr",),
        lambda art, p: vsr_heatmap(art["vsr"]),
        (
            "Mean valid-story rate {mean_vsr:.1%} over {n_models} model(s) × {n_languages} language(s); lowest "
            "{min_vsr:.1%} ({min_vsr_cell})."
        ),
    ),
    FigureSpec(
        "02_attribute_distributions",
        "Extracted protagonist attributes per model (StereoTales) and protagonist gender per model x design",
        ("extractions", "filtered"),
        lambda art, p: attribute_distributions(art["extractions"], art["filtered"]),
        "{stats}",
    ),
    FigureSpec(
        "03_association_counts",
        "Significant value-level associations per model (all languages) and per language scope (StereoTales)",
        ("associations_values", "associations_power"),
        lambda art, p: association_counts(art["associations_values"], power=art["associations_power"]),
        (
            "{n_significant_all} significant association(s) with languages pooled, {n_significant_languages} in "
            "the per-language passes, out of {n_tested} tested cells."
        ),
    ),
    FigureSpec(
        "04_top_associations_table",
        "Top associations shared across models: mean lift, models sharing, median harm (StereoTales)",
        ("associations_shared", "associations_power"),
        lambda art, p: top_associations_table(
            art["associations_shared"], k=p.figures.top_associations, power=art["associations_power"]
        ),
        (
            "{n_associations} association(s); highest mean lift {max_mean_lift:.2f}; {n_harmful} of {n_rated} "
            "rated association(s) judged harmful."
        ),
    ),
    FigureSpec(
        "05_lift_share",
        "Mean lift vs number of models sharing each association, coloured by median harm (StereoTales)",
        ("associations_shared", "associations_power"),
        lambda art, p: lift_share_plot(art["associations_shared"], power=art["associations_power"]),
        "{n_associations} association(s); at most {max_n_models} model(s) share one.",
    ),
    FigureSpec(
        "06_bias_fingerprints",
        (
            "Bias fingerprints: S_C per adjective category, one polygon per language, one panel per model "
            "(BiasedTales-ML Fig. 2)"
        ),
        ("metrics_sc",),
        lambda art, p: bias_fingerprints(
            art["metrics_sc"], comparison=p.figures.comparison, min_stories=p.metrics.min_stories
        ),
        (
            "Largest |S_C| = {max_abs_s_c:.2f} ({comparison}); most positive category: {most_positive_category}; "
            "most negative: {most_negative_category}."
        ),
    ),
    FigureSpec(
        "07_cosine_heatmaps",
        "Cross-lingual cosine similarity of S_C vectors per model (BiasedTales-ML Fig. 3)",
        ("metrics_cosine",),
        lambda art, p: cosine_heatmaps(art["metrics_cosine"], comparison=p.figures.comparison),
        "Mean cosine {mean_cosine:.2f}; lowest {min_cosine:.2f} ({min_pair}).",
    ),
    FigureSpec(
        "08_jsd_grammatical_gender",
        "JSD by grammatical-gender group per model (BiasedTales-ML Fig. 4)",
        ("metrics_jsd",),
        lambda art, p: jsd_by_grammatical_gender(
            art["metrics_jsd"], comparison=p.figures.comparison, min_stories=p.metrics.min_stories
        ),
        "Median JSD: G {median_jsd_G:.3f} (n = {n_G}), N {median_jsd_N:.3f} (n = {n_N}).",
    ),
    FigureSpec(
        "09_distinctive_words",
        "Most distinctive words per model, field and group, log-odds z (BiasedTales-ML Fig. 5, 10-12)",
        ("metrics_log_odds",),
        lambda art, p: distinctive_words(art["metrics_log_odds"], top=p.figures.top_words),
        "Largest |z| = {max_abs_z:.2f} ({max_abs_z_word}).",
    ),
    FigureSpec(
        "10_vsr_vs_jsd",
        "Valid-story rate vs JSD per model x language (BiasedTales-ML Fig. 6)",
        ("metrics_vsr_jsd",),
        lambda art, p: vsr_vs_jsd(
            art["metrics_vsr_jsd"], comparison=p.figures.comparison, min_stories=p.metrics.min_stories
        ),
        (
            "{n_points} point(s); mean VSR {mean_vsr:.1%}, mean JSD {mean_jsd:.3f}, largest JSD {max_jsd:.3f} "
            "({max_jsd_cell})."
        ),
    ),
    FigureSpec(
        "11_balance_stereotype",
        "Balance M_b vs stereotype M_s per language, 1-sd ellipse per task (Feng et al. Fig. 2)",
        ("metrics_aggregates",),
        lambda art, p: balance_stereotype(art["metrics_aggregates"]),
        "Mean M_s {mean_m_s:.2f}, mean M_b {mean_m_b:.2f} over {n_points} point(s).",
    ),
    FigureSpec(
        "12_anova_table",
        "Type-I ANOVA of M_s and M_b (Feng et al. Sec. 3.3.1, App. C)",
        ("metrics_anova",),
        lambda art, p: anova_table(art["metrics_anova"]),
        (
            "{n_significant} of {n_rows} term(s) significant; largest partial ω² {max_partial_omega_sq:.3f} "
            "({max_partial_omega_sq_term})."
        ),
    ),
    FigureSpec(
        "13_umap_density",
        ("Shared UMAP of story embeddings with female/male density contours per language x genre (Feng et al. Fig. 3)"),
        ("umap",),
        lambda art, p: umap_density(art["umap"], percentiles=p.figures.umap_display_percentiles),
        (
            "{n_points} stories drawn ({n_female} female, {n_male} male) in {n_panels} panel(s); {n_trimmed} "
            "outside the display percentiles left out."
        ),
    ),
    FigureSpec(
        "14_probe_auc",
        "Identity-label probe AUC, full text vs cue-deleted, per language x genre (Feng et al. Table 1)",
        ("probes",),
        lambda art, p: probe_auc(art["probes"]),
        (
            "{n_ok_cells} of {n_cells} cell(s) probed; mean AUC full {mean_auc_full:.2f}, cue-deleted "
            "{mean_auc_cue_deleted:.2f}, mean ΔAUC {mean_delta:.2f}."
        ),
    ),
    FigureSpec(
        "15_cultural_relevance",
        "Cultural-marker relevance by source language x context per genre (Feng et al. Fig. 5)",
        ("cultural",),
        lambda art, p: cultural_relevance(art["cultural"]),
        "{stats}",
    ),
    FigureSpec(
        "16_separability",
        "Source-language separability: balanced accuracy per marker version (Feng et al. Sec. 4.3)",
        ("separability",),
        lambda art, p: separability(art["separability"]),
        (
            "Balanced accuracy: original {ba_original:.2f}, translated {ba_translated:.2f}, masked "
            "{ba_masked:.2f} (chance {chance:.2f})."
        ),
    ),
    FigureSpec(
        "17_crosslens",
        (
            "The three lenses per model x language, standardised per measure, and the most / least concordant "
            "pair of measures (storybias, issue #30)"
        ),
        ("crosslens", "crosslens_agreement"),
        lambda art, p: crosslens_heatmap(art["crosslens"], art["crosslens_agreement"]),
        (
            "{n_cells} cell(s) × {n_measures} measures, {n_missing} not computable; {n_pairs_assessed} pair(s) "
            "assessed; most concordant {most_concordant} (r = {r_most:.2f}, n = {n_most}), least "
            "{least_concordant} (r = {r_least:.2f}, n = {n_least})."
        ),
    ),
    FigureSpec(
        "18_harm_agreement",
        (
            "Human vs LLM-judge harm: median harm per association with Spearman rho, the harm gap per base "
            "attribute, and each judge's ratings of its own associations against the other judges' (StereoTales)"
        ),
        ("associations_shared", "manifest_associations"),
        lambda art, p: harm_agreement(art["associations_shared"], art.manifests["manifest_associations"]),
        (
            "{n_rated} association(s) rated by the judges; human–judge Spearman ρ = {rho:.2f} over {n_rho}; "
            "largest harm gap {max_gap:+.2f} ({max_gap_attribute}); {n_self_judges} model(s) judging their own "
            "associations, mean own − others {mean_self_gap:+.2f}."
        ),
    ),
    FigureSpec(
        "19_self_context_advantage",
        (
            "Self-context advantage per source language x genre with bootstrap CI, and on the high-agreement "
            "marker subset when human ratings are given (Feng et al. Eq. 5, Sec. 4.3)"
        ),
        ("cultural_advantage", "manifest_probes"),
        lambda art, p: self_context_advantage(
            art["cultural_advantage"], art.manifest_table("manifest_probes", "human_validation", "validation_markers")
        ),
        (
            "{n_positive} of {n_cells} cell(s) with a positive advantage ({n_ci_above_zero} with the interval "
            "above 0); mean {mean_advantage:.2f}, lowest {min_advantage:.2f} ({min_advantage_cell}); "
            "high-agreement subset {subset_advantage:.2f} over {n_subset_markers} marker(s)."
        ),
    ),
    FigureSpec(
        "20_glm_table",
        ("Trial-level binomial GLMs of the female and identified shares: Wald tests per term (Feng et al. App. C)"),
        ("metrics_glm",),
        lambda art, p: glm_table(art["metrics_glm"]),
        (
            "{n_significant} of {n_terms} term test(s) with p < 0.05; largest Wald χ² {max_chi2:.1f} "
            "({max_chi2_term}); {n_negative_chi2} negative χ² flagged."
        ),
    ),
    FigureSpec(
        "21_headline_findings",
        (
            "Significant and harmful associations per model (pooled) and per model x language, with the "
            "language-only harmful ones: StereoTales' findings 1 and 3 on the run"
        ),
        ("associations_findings",),
        lambda art, p: headline_findings(art["associations_findings"]),
        (
            "{n_models_harmful} of {n_models} model(s) with a harmful association in the pooled pass "
            "({n_harmful_all} harmful); {n_harmful_only_here} of {n_harmful_languages} harmful per-language "
            "association(s) in one language only; {n_unrated} significant association(s) unrated."
        ),
    ),
)

# stable file stems in notebook order, with what each figure shows
FIGURES: list[tuple[str, str]] = [(spec.stem, spec.description) for spec in FIGURE_SPECS]
# everything stage 08 reads, once, in the order the figures first read it (storybias.core.artifacts' names)
FIGURE_READS: tuple[str, ...] = tuple(dict.fromkeys(name for spec in FIGURE_SPECS for name in spec.reads))


def figure_list() -> str:
    """The table of figures in figures/README.md (stem, what it shows, what it reads), from FIGURE_SPECS;
    tests/test_plots.py keeps the README in step. Regenerate with ``PYTHONPATH=lib python -c "from
    storybias.stages.figures.registry import figure_list; print(figure_list())"``."""
    rows = ["| file stem | what it shows | reads |", "|---|---|---|"]
    rows += [
        f"| `{spec.stem}` | {spec.description} | {', '.join(f'`{name}`' for name in spec.reads)} |"
        for spec in FIGURE_SPECS
    ]
    return "\n".join(rows) + "\n"
