"""Stage 05 statistics: distributional bias (BiasedTales-ML) and stereotype/balance scores (Feng et al.).

It stays above 600 lines on purpose: it is one stage's formulas, each a short pure function, plus the
stage's run; splitting them by study would separate the shared group/term tables they are computed on.

Every formula is a small pure function with its source quoted in the docstring; the notebook only
calls them. Natural logarithms throughout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from storybias.config.designs import with_lens
from storybias.config.params import load_yaml_strict
from storybias.config.studies import GRAMMATICAL_GENDER, MIN_STORIES_FLAG, S_C_CLIP
from storybias.core import artifacts, paths
from storybias.core.locks import holds_run_lock
from storybias.stats.bootstrap import bootstrap_indices, percentile_bounds, percentile_interval
from storybias.stats.multiple_testing import adjust

JSD_EPSILON = 1e-10


# --- A. narrative distributions ----------------------------------------------------------------


@cache
def load_lexicon(kind: str = "adjectives") -> dict[str, str]:
    """word -> category, from params/lexicon/categories.yaml (``adjectives`` or ``settings``). Read
    strictly: a category written twice is an error naming the line (PyYAML would keep the second
    list only and silently drop the first one's words)."""

    spec = load_yaml_strict(paths.params_dir() / "lexicon" / "categories.yaml")
    mapping: dict[str, str] = {}
    for category, words in spec[kind].items():
        for word in words:
            if word in mapping:
                raise ValueError(f"lexicon: {word!r} is in both {mapping[word]!r} and {category!r}")
            mapping[word] = category
    return mapping


def categories(kind: str = "adjectives") -> list[str]:
    return list(dict.fromkeys(load_lexicon(kind).values()))


def category_counts(
    tokens_per_story: Sequence[Sequence[str]], lexicon: Mapping[str, str], cats: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Per story: counts of tokens in each category (n_stories x n_categories) and all tokens."""
    index = {c: i for i, c in enumerate(cats)}
    counts = np.zeros((len(tokens_per_story), len(cats)))
    totals = np.zeros(len(tokens_per_story))
    for s, tokens in enumerate(tokens_per_story):
        totals[s] = len(tokens)
        for t in tokens:
            c = lexicon.get(t)
            if c is not None:
                counts[s, index[c]] += 1
    return counts, totals


def coverage(tokens_per_story: Sequence[Sequence[str]], lexicon: Mapping[str, str]) -> float:
    """Share of adjective tokens that fall in some category."""
    tokens = [t for ts in tokens_per_story for t in ts]
    return float(np.mean([t in lexicon for t in tokens])) if tokens else float("nan")


def log_probability_ratio(p_m: np.ndarray, p_f: np.ndarray, clip: float = S_C_CLIP) -> np.ndarray:
    """S_C = ln( P(C | g_m) / P(C | g_f) ), clipped to [-clip, clip] (BiasedTales-ML Eq. 1).

    P(C | g) is the normalised frequency of category C among group g's adjective tokens. A category
    seen in one group only gives +/-inf before clipping, i.e. +/-clip; unseen in both gives NaN.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.log(np.asarray(p_m, float) / np.asarray(p_f, float))
    both_zero = (np.asarray(p_m) == 0) & (np.asarray(p_f) == 0)
    s = np.clip(s, -clip, clip)
    return np.where(both_zero, np.nan, s)


def jensen_shannon(p: np.ndarray, q: np.ndarray, epsilon: float = JSD_EPSILON) -> float:
    """S_bias = 1/2 KL(P_m || M) + 1/2 KL(P_f || M), M = (P_m + P_f)/2, natural log (nats), after adding
    epsilon = 1e-10 to every cell and renormalising (BiasedTales-ML Eq. 2). Equals
    scipy.spatial.distance.jensenshannon(p, q) ** 2 with base e on the smoothed distributions."""
    p = np.asarray(p, float) + epsilon
    q = np.asarray(q, float) + epsilon
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2
    return float(0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m)))


def cosine_similarity(u: Mapping[str, float], v: Mapping[str, float]) -> float:
    """Sim = u.v / (|u| |v|) over the union of categories, missing (or NaN) entries imputed as 0
    (BiasedTales-ML Eq. 3). NaN when a vector is all zero."""
    keys = sorted(set(u) | set(v))
    a = np.array([0.0 if pd.isna(u.get(k, 0.0)) else u.get(k, 0.0) for k in keys])
    b = np.array([0.0 if pd.isna(v.get(k, 0.0)) else v.get(k, 0.0) for k in keys])
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norm) if norm else float("nan")


def log_odds_dirichlet(
    counts_i: Mapping[str, int], counts_j: Mapping[str, int], prior: Mapping[str, float], prior_scale: float
) -> pd.DataFrame:
    """Monroe, Colaresi & Quinn (2008) log-odds with an informative Dirichlet prior.

    alpha_w = prior_scale * pi_w with pi_w the word's share of the whole corpus (``prior`` counts);
    delta_w = ln((y_wi + a_w) / (n_i + a_0 - y_wi - a_w)) - ln((y_wj + a_w) / (n_j + a_0 - y_wj - a_w));
    var(delta_w) ~= 1/(y_wi + a_w) + 1/(y_wj + a_w);  z_w = delta_w / sqrt(var)  (BiasedTales-ML Eq. 4).
    Positive z: more typical of group i.
    """
    vocab = sorted(set(counts_i) | set(counts_j) | set(prior))
    total_prior = float(sum(prior.values()))
    alpha = (
        np.array([prior_scale * prior.get(w, 0.0) / total_prior for w in vocab])
        if total_prior
        else np.zeros(len(vocab))
    )
    a0 = alpha.sum()
    yi = np.array([counts_i.get(w, 0) for w in vocab], float)
    yj = np.array([counts_j.get(w, 0) for w in vocab], float)
    ni, nj = yi.sum(), yj.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        delta = np.log((yi + alpha) / (ni + a0 - yi - alpha)) - np.log((yj + alpha) / (nj + a0 - yj - alpha))
        var = 1 / (yi + alpha) + 1 / (yj + alpha)
        z = delta / np.sqrt(var)
    return pd.DataFrame(
        {"word": vocab, "count_i": yi.astype(int), "count_j": yj.astype(int), "delta": delta, "variance": var, "z": z}
    )


@dataclass
class GroupData:
    """Per-story category counts of the two groups compared (m: the 'male'/first group, f: the other)."""

    counts_m: np.ndarray
    totals_m: np.ndarray
    counts_f: np.ndarray
    totals_f: np.ndarray


def s_c_from_counts(g: GroupData) -> np.ndarray:
    p_m = g.counts_m.sum(0) / g.totals_m.sum() if g.totals_m.sum() else np.full(g.counts_m.shape[1], np.nan)
    p_f = g.counts_f.sum(0) / g.totals_f.sum() if g.totals_f.sum() else np.full(g.counts_f.shape[1], np.nan)
    return log_probability_ratio(p_m, p_f)


def jsd_from_counts(word_counts_m: np.ndarray, word_counts_f: np.ndarray) -> float:
    if word_counts_m.sum() == 0 or word_counts_f.sum() == 0:
        return float("nan")
    return jensen_shannon(word_counts_m / word_counts_m.sum(), word_counts_f / word_counts_f.sum())


def bootstrap_s_c(g: GroupData, n_boot: int, seed: int, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of S_C per category, resampling stories within each group."""
    rng = np.random.default_rng(seed)
    im = bootstrap_indices(len(g.totals_m), n_boot, rng)
    jf = bootstrap_indices(len(g.totals_f), n_boot, rng)
    cm = g.counts_m[im].sum(1)  # n_boot x K
    tm = g.totals_m[im].sum(1)[:, None]
    cf = g.counts_f[jf].sum(1)
    tf = g.totals_f[jf].sum(1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        s = log_probability_ratio(cm / tm, cf / tf)
    lo, hi = percentile_bounds(level)  # per category; a category's NaN resamples (unseen in both) are left out
    return np.nanpercentile(s, lo, axis=0), np.nanpercentile(s, hi, axis=0)


def bootstrap_jsd(
    words_m: np.ndarray, words_f: np.ndarray, n_boot: int, seed: int, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of the JSD, resampling stories (rows: per-story word-count vectors)."""
    rng = np.random.default_rng(seed)
    im = bootstrap_indices(len(words_m), n_boot, rng)
    jf = bootstrap_indices(len(words_f), n_boot, rng)
    values = [jsd_from_counts(words_m[a].sum(0), words_f[b].sum(0)) for a, b in zip(im, jf)]
    return percentile_interval(values, level)


def grammatical_gender_test(jsd_by_language: pd.DataFrame) -> dict[str, Any]:
    """Mann-Whitney U of JSD between grammatical-gender (G) and non-gendered (N) languages."""
    from scipy.stats import mannwhitneyu

    g = jsd_by_language.loc[jsd_by_language["language"].isin(GRAMMATICAL_GENDER["G"]), "jsd"].dropna()
    n = jsd_by_language.loc[jsd_by_language["language"].isin(GRAMMATICAL_GENDER["N"]), "jsd"].dropna()
    if len(g) == 0 or len(n) == 0:
        return {
            "U": float("nan"),
            "p_value": float("nan"),
            "n_G": len(g),
            "n_N": len(n),
            "note": "needs at least one language in each group (G: "
            + ", ".join(GRAMMATICAL_GENDER["G"])
            + "; N: "
            + ", ".join(GRAMMATICAL_GENDER["N"])
            + ")",
        }
    res = mannwhitneyu(g, n, alternative="two-sided")
    return {"U": float(res.statistic), "p_value": float(res.pvalue), "n_G": len(g), "n_N": len(n), "note": ""}


# --- B. stereotype and balance (Feng et al.) ----------------------------------------------------


def occupation_scores(trials: pd.DataFrame, identified_only: bool = False) -> pd.DataFrame:
    """Per model x language x task x occupation: P_f, P_m, M_s and M_b (Feng et al. Eqs. 1-2).

    ``trials`` has one row per output with ``label`` in female / male / unknown and the occupation's
    association ``occupation_gender``. Unidentified labels stay in the denominator (contributing to
    neither numerator) unless ``identified_only`` (Appendix C robustness). M_s = P(stereotypical) -
    P(anti-stereotypical); M_b = P_f - P_m. D.3: 40 female + 10 male for a female-associated occupation
    gives M_s = 0.8 - 0.2 = 0.6.
    """
    keys = ["model", "language", "task", "occupation", "occupation_gender"]
    g = trials.groupby(keys, observed=True)
    table = g.agg(
        n=("label", "size"),
        n_female=("label", lambda s: int((s == "female").sum())),
        n_male=("label", lambda s: int((s == "male").sum())),
    ).reset_index()
    table["n_unidentified"] = table["n"] - table["n_female"] - table["n_male"]
    denominator = (table["n_female"] + table["n_male"]) if identified_only else table["n"]
    with np.errstate(divide="ignore", invalid="ignore"):
        table["p_female"] = table["n_female"] / denominator.replace(0, np.nan)
        table["p_male"] = table["n_male"] / denominator.replace(0, np.nan)
    stereo_female = table["occupation_gender"].eq("female")
    table["m_s"] = np.where(stereo_female, table["p_female"] - table["p_male"], table["p_male"] - table["p_female"])
    table["m_b"] = table["p_female"] - table["p_male"]
    return table


def aggregate_scores(occupation_table: pd.DataFrame) -> pd.DataFrame:
    """M_q = mean over the occupations with outputs of M_{q,o}, per model x language x task (Eq. 3)."""
    valid = occupation_table.dropna(subset=["m_s", "m_b"])
    return (
        valid.groupby(["model", "language", "task"], observed=True)
        .agg(
            m_s=("m_s", "mean"),
            m_b=("m_b", "mean"),
            n_occupations=("occupation", "nunique"),
            n_outputs=("n", "sum"),
        )
        .reset_index()
    )


def partial_omega_squared(f_value: float, df_effect: float, df_error: float) -> float:
    """Partial omega^2 from an F test: df * (F - 1) / (df * F + df_error + 1).

    This is the form that reproduces the values Feng et al. (*Beyond Surface Cues*, arXiv:2608.23026)
    report: F(4, 79) = 9.07 -> 0.278 and F(11, 79) = 1.98 -> 0.106; F(4, 79) = 21.63 -> 0.4956, and
    their 0.495 follows from the unrounded F (about 21.625). It equals
    (SS_effect - df * MS_error) / (SS_effect + (df_error + 1) * MS_error); an earlier version used N - df
    in place of df_error + 1, which gives smaller values (0.455, 0.246, 0.098 for those three tests)."""
    return float(df_effect * (f_value - 1.0) / (df_effect * f_value + df_error + 1.0))


def type1_anova(aggregates: pd.DataFrame, outcome: str) -> tuple[pd.DataFrame, str]:
    """Type-I (sequential) ANOVA with sum-to-zero contrasts (Feng et al. Sec. 3.3.1): one observation
    per model x language x task aggregate; terms entered as language, task, language x task, model.
    Returns F, df, p and partial omega^2 per term, or an empty table and the reason. The BH adjustment
    is over a whole specification (both metrics): see :func:`bh_adjust`; ``p_adjusted`` here is the
    adjustment over this table alone, which :func:`run` replaces."""
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    data = aggregates.dropna(subset=[outcome])
    terms, names = [], []
    for column, label in (("language", "language"), ("task", "task")):
        if data[column].nunique() > 1:
            terms.append(f"C({column}, Sum)")
            names.append(label)
    if len(terms) == 2:
        terms.append("C(language, Sum):C(task, Sum)")
        names.append("language:task")
    if data["model"].nunique() > 1:
        terms.append("C(model, Sum)")
        names.append("model")
    if not terms:
        return pd.DataFrame(), "only one language, one task and one model: nothing to test"
    note = ""
    fit = smf.ols(f"{outcome} ~ " + " + ".join(terms), data=data).fit()
    if fit.df_resid <= 0 and "language:task" in names:
        # Saturated (e.g. one model: language x task leaves no residual): report the main effects only.
        i = names.index("language:task")
        terms, names = terms[:i] + terms[i + 1 :], names[:i] + names[i + 1 :]
        note = f"language x task dropped: saturated with {len(data)} observations; main effects only"
        fit = smf.ols(f"{outcome} ~ " + " + ".join(terms), data=data).fit()
    if fit.df_resid <= 0:
        return (
            pd.DataFrame(),
            f"no residual degrees of freedom ({len(data)} observations for {int(fit.df_model) + 1} parameters)",
        )
    table = anova_lm(fit, typ=1)
    resid = table.loc["Residual"]
    rows = []
    for term, name in zip(terms, names):
        r = table.loc[term]
        rows.append(
            {
                "term": name,
                "df": int(r["df"]),
                "df_resid": int(resid["df"]),
                "sum_sq": r["sum_sq"],
                "F": r["F"],
                "p_value": r["PR(>F)"],
                "partial_omega_sq": partial_omega_squared(r["F"], r["df"], resid["df"]),
            }
        )
    out = pd.DataFrame(rows)
    out["p_adjusted"] = adjust(out["p_value"].fillna(1.0), "fdr_bh")
    out.insert(0, "outcome", outcome)
    return out, note


ANOVA_SPEC_KEYS: tuple[str, ...] = ("subset", "denominator")  # one specification = one BH family


def bh_adjust(anova: pd.DataFrame, family: str = "specification") -> pd.DataFrame:
    """Benjamini-Hochberg adjusted p-values of the ANOVA rows, in ``p_adjusted``.

    ``family="specification"`` (Feng et al., Table 2): one family per specification (subset x
    denominator) over the terms of *both* metrics -- 8 tests with two metrics of 4 terms; their adjusted
    model-term p = 0.047 for Balance is the raw 0.0415 ranked 7th of 8 (0.0415 x 8 / 7).
    ``family="metric"``: one family per specification and metric (4 tests), storybias' earlier choice.
    A missing p-value counts as 1."""
    if anova.empty:
        return anova
    keys = [k for k in ANOVA_SPEC_KEYS if k in anova.columns]
    if family == "metric":
        keys.append("outcome")
    elif family != "specification":
        raise ValueError(f"metrics.anova_bh_family must be 'specification' or 'metric', not {family!r}")
    out = anova.copy()
    groups = out.groupby(keys, sort=False).groups.values() if keys else [out.index]
    for index in groups:
        out.loc[index, "p_adjusted"] = adjust(out.loc[index, "p_value"].fillna(1.0), "fdr_bh")
    return out


def common_models(aggregates: pd.DataFrame) -> list[str]:
    """Models observed in every language (the 'common-model subset' of Appendix C)."""
    per_model = aggregates.groupby("model")["language"].nunique()
    return sorted(per_model[per_model == aggregates["language"].nunique()].index)


GLM_GENRES: tuple[str, ...] = ("story", "news")  # the implicit task's genres; the explicit task has no narrative


def trial_glm(trials: pd.DataFrame, outcome: str) -> tuple[pd.DataFrame, str]:
    """Trial-level binomial GLM (Feng et al. Appendix C): ``female`` (female vs male, identified trials
    only) or ``identified`` (identified vs not), on the implicit genres only (story and news: the
    explicit sentence-completion task does not enter), with language, genre, language x genre, model and
    occupation terms and cluster-robust covariance by model x occupation. Returns Wald tests per term
    (``task`` is the genre) with the number of trials used."""
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    data = trials[trials["task"].isin(GLM_GENRES)].copy()
    if data.empty:
        return pd.DataFrame(), "no story or news trials (the GLMs use the implicit genres only)"
    if outcome == "female":
        data = data[data["label"].isin(["female", "male"])]
        data["y"] = (data["label"] == "female").astype(float)
    else:
        data["y"] = data["label"].isin(["female", "male"]).astype(float)
    terms = [
        t
        for t, col in (
            ("C(language, Sum)", "language"),
            ("C(task, Sum)", "task"),
            ("C(model, Sum)", "model"),
            ("C(occupation, Sum)", "occupation"),
        )
        if data[col].nunique() > 1
    ]
    if data["language"].nunique() > 1 and data["task"].nunique() > 1:
        terms.insert(2, "C(language, Sum):C(task, Sum)")
    if not terms or data["y"].nunique() < 2:
        return pd.DataFrame(), "no variation to model"
    groups = pd.factorize(data["model"].astype(str) + "|" + data["occupation"].astype(str))[0]
    try:
        fit = smf.glm("y ~ " + " + ".join(terms), data=data, family=sm.families.Binomial()).fit(
            cov_type="cluster", cov_kwds={"groups": groups}
        )
        wald = fit.wald_test_terms(skip_single=False, scalar=True).table
    except Exception as exc:  # separation or singular designs on tiny data: report, don't crash
        return (
            pd.DataFrame(),
            f"GLM not estimable on these data ({len(data)} trials, {groups.max() + 1} clusters): {exc}",
        )
    wald = wald.reset_index().rename(
        columns={"index": "term", "statistic": "chi2", "pvalue": "p_value", "df_constraint": "df"}
    )
    wald.insert(0, "outcome", outcome)
    wald["n_trials"] = len(data)
    return wald, ""


# --- the stage ---------------------------------------------------------------------------------


def _word_matrix(token_lists: Sequence[Sequence[str]], vocab: Sequence[str]) -> np.ndarray:
    index = {w: i for i, w in enumerate(vocab)}
    m = np.zeros((len(token_lists), len(vocab)))
    for s, tokens in enumerate(token_lists):
        for t in tokens:
            if t in index:
                m[s, index[t]] += 1
    return m


def narrative_comparison(
    data: pd.DataFrame, comparison, n_boot: int, seed: int, min_stories: int = MIN_STORIES_FLAG
) -> dict[str, pd.DataFrame]:
    """S_C per category (adjective and setting categories), JSD of adjective distributions, per model x
    language, for the two groups of one comparison. ``data``: extractions joined with conditions."""
    sub = data[data["design"] == comparison.design]
    for column, value in comparison.where.items():
        sub = sub[sub[f"cond_{column}"] == value]
    column = f"cond_{comparison.condition}"
    sub = sub[sub[column].isin([comparison.group_m, comparison.group_f])]
    sc_rows, jsd_rows = [], []
    for (model, language), cell in sub.groupby(["model", "language"], sort=True):
        m = cell[cell[column] == comparison.group_m]
        f = cell[cell[column] == comparison.group_f]
        small = min(len(m), len(f)) < min_stories
        base = {
            "comparison": comparison.name,
            "model": model,
            "language": language,
            "n_m": len(m),
            "n_f": len(f),
            "small_sample": small,
        }
        for kind, field in (("adjectives", "adjectives_en"), ("settings", "settings")):
            lexicon, cats = load_lexicon(kind), categories(kind)
            cm, tm = category_counts(list(m[field]), lexicon, cats)
            cf, tf = category_counts(list(f[field]), lexicon, cats)
            g = GroupData(cm, tm, cf, tf)
            if tm.sum() == 0 or tf.sum() == 0:
                for c in cats:
                    sc_rows.append(
                        {
                            **base,
                            "kind": kind,
                            "category": c,
                            "s_c": np.nan,
                            "ci_low": np.nan,
                            "ci_high": np.nan,
                            "note": "a group has no " + kind,
                        }
                    )
                continue
            s = s_c_from_counts(g)
            lo, hi = bootstrap_s_c(g, n_boot, seed)
            for c, value, a, b in zip(cats, s, lo, hi):
                sc_rows.append(
                    {
                        **base,
                        "kind": kind,
                        "category": c,
                        "s_c": value,
                        "ci_low": a,
                        "ci_high": b,
                        "coverage": coverage(list(m[field]) + list(f[field]), lexicon),
                        "note": "",
                    }
                )
        vocab = sorted({w for ws in cell["adjectives_en"] for w in ws})
        wm, wf = _word_matrix(list(m["adjectives_en"]), vocab), _word_matrix(list(f["adjectives_en"]), vocab)
        if wm.sum() == 0 or wf.sum() == 0:
            jsd_rows.append(
                {**base, "jsd": np.nan, "ci_low": np.nan, "ci_high": np.nan, "note": "a group has no adjectives"}
            )
        else:
            jsd_low, jsd_high = bootstrap_jsd(wm, wf, n_boot, seed)
            jsd_rows.append(
                {
                    **base,
                    "jsd": jsd_from_counts(wm.sum(0), wf.sum(0)),
                    "ci_low": jsd_low,
                    "ci_high": jsd_high,
                    "note": "",
                }
            )
    return {"sc": pd.DataFrame(sc_rows), "jsd": pd.DataFrame(jsd_rows)}


def cosine_matrix(sc: pd.DataFrame) -> pd.DataFrame:
    """Language x language cosine similarity of S_C vectors, per model and comparison.

    The vector of a language holds S_C of every semantic category, adjective and setting categories
    alike, keyed ``<kind>:<category>`` (BiasedTales-ML Eq. 3: v_l aggregates S_C over all semantic
    categories; a category missing in one language, or NaN, counts as 0)."""
    rows = []
    data = sc.assign(key=sc["kind"].astype(str) + ":" + sc["category"].astype(str))
    for (comparison, model), g in data.groupby(["comparison", "model"]):
        vectors = {lang: dict(zip(v["key"], v["s_c"])) for lang, v in g.groupby("language")}
        for a in vectors:
            for b in vectors:
                rows.append(
                    {
                        "comparison": comparison,
                        "model": model,
                        "language_a": a,
                        "language_b": b,
                        "cosine": cosine_similarity(vectors[a], vectors[b]),
                    }
                )
    return pd.DataFrame(rows)


def vsr_jsd_join(jsd: pd.DataFrame, vsr: pd.DataFrame, comparisons: Sequence[Any]) -> pd.DataFrame:
    """Each JSD row with the valid-story rate of the same model x language *in the comparison's design*
    (bedtime for BiasedTales-ML's comparisons: their VSR, Table 3), never a rate pooled over designs."""
    design_of = {c.name: c.design for c in comparisons}
    left = jsd.assign(design=jsd["comparison"].map(design_of))
    right = vsr[["design", "model", "language", "vsr", "n_stories"]]
    return left.merge(right, on=["design", "model", "language"], how="left").drop(columns=["design"])


def log_odds_table(data: pd.DataFrame, comparison, prior_scale: float, top: int) -> pd.DataFrame:
    """Top words per group (adjective lemmas and setting keywords) by Monroe et al. z, per model."""
    sub = data[data["design"] == comparison.design]
    for column, value in comparison.where.items():
        sub = sub[sub[f"cond_{column}"] == value]
    column = f"cond_{comparison.condition}"
    rows = []
    for model, cell in sub.groupby("model"):
        for field in ("adjectives_en", "settings"):
            corpus = pd.Series([w for ws in cell[field] for w in ws]).value_counts().to_dict()
            m = (
                pd.Series([w for ws in cell.loc[cell[column] == comparison.group_m, field] for w in ws])
                .value_counts()
                .to_dict()
            )
            f = (
                pd.Series([w for ws in cell.loc[cell[column] == comparison.group_f, field] for w in ws])
                .value_counts()
                .to_dict()
            )
            if not m or not f:
                continue
            table = log_odds_dirichlet(m, f, corpus, prior_scale)
            for group, part in (
                (comparison.group_m, table.nlargest(top, "z")),
                (comparison.group_f, table.nsmallest(top, "z")),
            ):
                for r in part.itertuples(index=False):
                    rows.append(
                        {
                            "comparison": comparison.name,
                            "model": model,
                            "field": field,
                            "group": group,
                            "word": r.word,
                            "z": r.z,
                            "count_m": r.count_i,
                            "count_f": r.count_j,
                        }
                    )
    return pd.DataFrame(rows)


def occupation_trials(data: pd.DataFrame) -> pd.DataFrame:
    """One row per parsed occupations output: its protagonist label and the cell it belongs to."""

    # the designs read through Feng et al.'s occupational lens (storybias.config.designs)
    occ = data[
        data["design"].isin(with_lens("occupations", sorted(data["design"].dropna().unique()))) & data["parse_ok"]
    ]
    return pd.DataFrame(
        {
            "model": occ["model"],
            "language": occ["language"],
            "task": occ["cond_task"],
            "occupation": occ["cond_occupation"],
            "occupation_gender": occ["cond_occupation_gender"],
            "label": occ["protagonist_gender"].fillna("unknown"),
        }
    ).reset_index(drop=True)


# Arrow schemas of the stage's tables (docs/data-contract.md), by the name in metrics_<name>.parquet.
# Every table is written with its schema, so an input with nothing to compare (no stories, no
# occupations outputs) gives the same columns and types as a full run, with zero rows.
_TEXT, _REAL, _COUNT, _FLAG = pa.string(), pa.float64(), pa.int64(), pa.bool_()
_CELL_FIELDS = [
    ("comparison", _TEXT),
    ("model", _TEXT),
    ("language", _TEXT),
    ("n_m", _COUNT),
    ("n_f", _COUNT),
    ("small_sample", _FLAG),
]
_JSD_FIELDS = [*_CELL_FIELDS, ("jsd", _REAL), ("ci_low", _REAL), ("ci_high", _REAL), ("note", _TEXT)]
_SCORE_KEYS = [("model", _TEXT), ("language", _TEXT), ("task", _TEXT)]
OUTPUT_SCHEMAS: dict[str, pa.Schema] = {
    "sc": pa.schema(
        [
            *_CELL_FIELDS,
            ("kind", _TEXT),
            ("category", _TEXT),
            ("s_c", _REAL),
            ("ci_low", _REAL),
            ("ci_high", _REAL),
            ("coverage", _REAL),
            ("note", _TEXT),
        ]
    ),
    "jsd": pa.schema(_JSD_FIELDS),
    "cosine": pa.schema(
        [("comparison", _TEXT), ("model", _TEXT), ("language_a", _TEXT), ("language_b", _TEXT), ("cosine", _REAL)]
    ),
    "log_odds": pa.schema(
        [
            ("comparison", _TEXT),
            ("model", _TEXT),
            ("field", _TEXT),
            ("group", _TEXT),
            ("word", _TEXT),
            ("z", _REAL),
            ("count_m", _COUNT),
            ("count_f", _COUNT),
        ]
    ),
    "grammatical_gender": pa.schema(
        [
            ("comparison", _TEXT),
            ("model", _TEXT),
            ("U", _REAL),
            ("p_value", _REAL),
            ("n_G", _COUNT),
            ("n_N", _COUNT),
            ("note", _TEXT),
        ]
    ),
    "vsr_jsd": pa.schema([*_JSD_FIELDS, ("vsr", _REAL), ("n_stories", _COUNT)]),
    "occupations": pa.schema(
        [
            *_SCORE_KEYS,
            ("occupation", _TEXT),
            ("occupation_gender", _TEXT),
            ("n", _COUNT),
            ("n_female", _COUNT),
            ("n_male", _COUNT),
            ("n_unidentified", _COUNT),
            ("p_female", _REAL),
            ("p_male", _REAL),
            ("m_s", _REAL),
            ("m_b", _REAL),
            ("denominator", _TEXT),
        ]
    ),
    "aggregates": pa.schema(
        [
            *_SCORE_KEYS,
            ("m_s", _REAL),
            ("m_b", _REAL),
            ("n_occupations", _COUNT),
            ("n_outputs", _COUNT),
            ("denominator", _TEXT),
        ]
    ),
    "anova": pa.schema(
        [
            ("outcome", _TEXT),
            ("term", _TEXT),
            ("df", _COUNT),
            ("df_resid", _COUNT),
            ("sum_sq", _REAL),
            ("F", _REAL),
            ("p_value", _REAL),
            ("partial_omega_sq", _REAL),
            ("p_adjusted", _REAL),
            ("subset", _TEXT),
            ("denominator", _TEXT),
            ("note", _TEXT),
        ]
    ),
    "glm": pa.schema(
        [("outcome", _TEXT), ("term", _TEXT), ("chi2", _REAL), ("p_value", _REAL), ("df", _COUNT), ("n_trials", _COUNT)]
    ),
}

# Columns stage 05 reads from each input (docs/data-contract.md); the comparisons' cond_<condition>
# columns are added per profile (required_input_columns).
EXTRACTION_COLUMNS = ("story_id", "parse_ok", "adjectives_en", "settings", "protagonist_gender")
FILTERED_COLUMNS = ("story_id", "design", "model", "language", "cond_task", "cond_occupation", "cond_occupation_gender")
VSR_COLUMNS = ("design", "model", "language", "vsr", "n_stories")


class InputContractError(ValueError):
    """An input table of stage 05 lacks a column it reads (or has it with the wrong type); the message
    names the file and the columns."""


def required_input_columns(comparisons: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """Columns read from extractions / filtered / vsr, including each comparison's condition columns."""
    conds = [f"cond_{c}" for comparison in comparisons for c in (comparison.condition, *comparison.where)]
    return {
        "extractions": EXTRACTION_COLUMNS,
        "filtered": tuple(dict.fromkeys([*FILTERED_COLUMNS, *conds])),
        "vsr": VSR_COLUMNS,
    }


def check_input_columns(frame: pd.DataFrame, path: Any, required: Sequence[str], remedy: str) -> None:
    """Raise InputContractError naming ``path`` and every missing column (and a non-boolean parse_ok)."""
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputContractError(
            f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(stage 05 reads {', '.join(required)}; see docs/data-contract.md): {remedy}"
        )
    if "parse_ok" in required and len(frame) and not pd.api.types.is_bool_dtype(frame["parse_ok"]):
        raise InputContractError(
            f"{path}: column parse_ok must be boolean, found {frame['parse_ok'].dtype} "
            f"(see docs/data-contract.md): {remedy}"
        )


def to_contract(frame: pd.DataFrame, name: str) -> pa.Table:
    """The Arrow table of ``metrics_<name>.parquet``: columns in schema order with schema types; a
    column the frame lacks (an empty frame lacks them all) is null. A column outside the schema is a
    bug (the contract and the code disagree) and raises."""
    schema = OUTPUT_SCHEMAS[name]
    extra = [c for c in frame.columns if c not in schema.names]
    if extra:
        raise ValueError(f"metrics_{name}: columns {extra} are not in OUTPUT_SCHEMAS[{name!r}] (docs/data-contract.md)")
    frame = frame.reset_index(drop=True)
    arrays = [
        pa.array(frame[f.name], from_pandas=True).cast(f.type)
        if f.name in frame.columns
        else pa.nulls(len(frame), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


@holds_run_lock("metrics")
def run(params) -> dict[str, Any]:
    """Stage 05: read extractions + conditions, compute every table, write data/<run>/metrics_*.parquet."""

    run_name, settings = params.run_name, params.metrics
    inputs = {
        "extractions": (artifacts.extractions_path(run_name), "rerun stage 03 (make extract)"),
        "filtered": (artifacts.filtered_path(run_name), "rerun stage 02 (make filter)"),
        "vsr": (artifacts.vsr_path(run_name), "rerun stage 02 (make filter)"),
    }
    for path, _ in inputs.values():
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the earlier stages first (make extract)")
    required = required_input_columns(settings.comparisons)
    frames = {}
    for key, (path, remedy) in inputs.items():
        frames[key] = pd.read_parquet(path)
        check_input_columns(frames[key], path, required[key], remedy)
    extractions, filtered, vsr = frames["extractions"], frames["filtered"], frames["vsr"]
    data = extractions.merge(filtered.drop(columns=["raw"], errors="ignore"), on="story_id", how="left")
    n_excluded = int((~data["parse_ok"]).sum())
    parsed = data[data["parse_ok"]]
    notes: list[str] = []
    sc_frames, jsd_frames, lo_frames = [], [], []
    for comparison in settings.comparisons:
        lo_frames.append(log_odds_table(parsed, comparison, settings.log_odds_prior_scale, settings.log_odds_top))
        if comparison.log_odds_only:  # an Appendix F contrast: distinctive words only
            continue
        out = narrative_comparison(parsed, comparison, settings.bootstrap, settings.seed, settings.min_stories)
        if out["sc"].empty:
            notes.append(
                f"{comparison.name}: no {comparison.design} stories with {comparison.condition} in "
                f"({comparison.group_m}, {comparison.group_f}): nothing to compare"
            )
        sc_frames.append(out["sc"])
        jsd_frames.append(out["jsd"])
    sc = pd.concat(sc_frames, ignore_index=True) if sc_frames else pd.DataFrame()
    jsd = pd.concat(jsd_frames, ignore_index=True) if jsd_frames else pd.DataFrame()
    log_odds = pd.concat(lo_frames, ignore_index=True) if lo_frames else pd.DataFrame()
    cosine = cosine_matrix(sc) if not sc.empty else pd.DataFrame()
    gg_rows = []
    if not jsd.empty:
        for (comparison, model), g in jsd.groupby(["comparison", "model"]):
            gg_rows.append({"comparison": comparison, "model": model, **grammatical_gender_test(g)})
    grammatical = pd.DataFrame(gg_rows)
    vsr_jsd = pd.DataFrame()
    if not jsd.empty:
        vsr_jsd = vsr_jsd_join(jsd, vsr, settings.comparisons)

    trials = occupation_trials(data)
    occupations = aggregates = anova = glm = pd.DataFrame()
    if trials.empty:
        notes.append("no parsed occupations outputs: stereotype and balance scores not computed")
    else:
        specs = []
        occ_all = occupation_scores(trials)
        occ_ident = occupation_scores(trials, identified_only=True)
        occupations = pd.concat(
            [occ_all.assign(denominator="all outputs"), occ_ident.assign(denominator="identified only")]
        )
        aggregates = pd.concat(
            [
                aggregate_scores(occ_all).assign(denominator="all outputs"),
                aggregate_scores(occ_ident).assign(denominator="identified only"),
            ]
        )
        common = common_models(aggregate_scores(occ_all))
        for denominator, table in aggregates.groupby("denominator"):
            for subset, part in (("all available", table), ("common models", table[table["model"].isin(common)])):
                for outcome in ("m_s", "m_b"):
                    result, why = type1_anova(part, outcome)
                    if why:
                        notes.append(f"ANOVA {outcome} ({subset}; {denominator}): {why}")
                    if not result.empty:
                        specs.append(result.assign(subset=subset, denominator=denominator, note=why))
        anova = bh_adjust(pd.concat(specs, ignore_index=True), settings.anova_bh_family) if specs else pd.DataFrame()
        glm_parts = []
        common_trials = trials[trials["model"].isin(common)]
        for outcome in ("female", "identified"):
            result, why = trial_glm(common_trials, outcome)
            if why:
                notes.append(f"trial-level GLM ({outcome}): {why}")
            else:
                glm_parts.append(result)
        glm = pd.concat(glm_parts, ignore_index=True) if glm_parts else pd.DataFrame()

    tables = {
        "sc": sc,
        "jsd": jsd,
        "cosine": cosine,
        "log_odds": log_odds,
        "grammatical_gender": grammatical,
        "vsr_jsd": vsr_jsd,
        "occupations": occupations,
        "aggregates": aggregates,
        "anova": anova,
        "glm": glm,
    }
    for name, table in tables.items():
        artifacts.write(run_name, f"metrics_{name}", to_contract(table, name))
        tables[name] = table.reset_index(drop=True).reindex(columns=OUTPUT_SCHEMAS[name].names)
    artifacts.write(
        run_name,
        "manifest_metrics",
        {
            "stage": "metrics",
            "notes": notes,
            "n_parse_failed_excluded": n_excluded,
            "params": params.resolved()["metrics"],
        },
    )
    return {**tables, "notes": notes, "n_excluded": n_excluded}
