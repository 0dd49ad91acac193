"""Feng et al.'s stereotype and balance scores (stage 05, part B): per-occupation and aggregate
M_s / M_b, the Type-I ANOVA with partial omega squared and its Benjamini-Hochberg families, and the
trial-level binomial GLMs of Appendix C.

Every formula is a small pure function with its source quoted in the docstring; the notebook only
calls them (through :mod:`storybias.stages.metrics`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import statsmodels.api as sm
import statsmodels.formula.api as smf
from statsmodels.stats.anova import anova_lm

from storybias.config.designs import with_lens
from storybias.stats.bootstrap import percentile_interval
from storybias.stats.multiple_testing import adjust


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


def _occupation_draws(group: pd.DataFrame, n_boot: int, rng: np.random.Generator, identified_only: bool) -> np.ndarray:
    """Bootstrap replicates (n_boot x 2: M_s, M_b) of one model x language x task: each occupation's
    outputs redrawn (multinomially over female / male / unidentified, or female / male among the
    identified with ``identified_only``), scored as ``occupation_scores`` scores them and averaged over the
    occupations as ``aggregate_scores`` does."""
    totals = np.zeros((n_boot, 2))
    for r in group.itertuples(index=False):
        n = int(r.n_female + r.n_male) if identified_only else int(r.n)
        counts = [r.n_female, r.n_male] if identified_only else [r.n_female, r.n_male, r.n - r.n_female - r.n_male]
        draws = rng.multinomial(n, np.asarray(counts, float) / n, size=n_boot) / n
        p_female, p_male = draws[:, 0], draws[:, 1]
        stereo, anti = (p_female, p_male) if r.occupation_gender == "female" else (p_male, p_female)
        totals[:, 0] += stereo - anti
        totals[:, 1] += p_female - p_male
    return totals / len(group)


def aggregate_intervals(
    occupation_table: pd.DataFrame, n_boot: int, seed: int, identified_only: bool = False
) -> pd.DataFrame:
    """Per model x language x task (the rows of ``aggregate_scores``): 95% percentile intervals of M_s and
    M_b (``m_s_low``, ``m_s_high``, ``m_b_low``, ``m_b_high``) over ``n_boot`` resamples of each
    occupation's outputs (``_occupation_draws``), the occupations fixed; the cross-lens table reads them."""
    valid = occupation_table.dropna(subset=["m_s", "m_b"])
    valid = valid[(valid["n_female"] + valid["n_male"] > 0) if identified_only else (valid["n"] > 0)]
    rng = np.random.default_rng(seed)
    rows = []
    for (model, language, task), group in valid.groupby(["model", "language", "task"], observed=True, sort=True):
        draws = _occupation_draws(group, n_boot, rng, identified_only)
        (s_low, s_high), (b_low, b_high) = percentile_interval(draws[:, 0]), percentile_interval(draws[:, 1])
        rows.append({"model": model, "language": language, "task": task,
                     "m_s_low": s_low, "m_s_high": s_high, "m_b_low": b_low, "m_b_high": b_high})  # fmt: skip
    return pd.DataFrame(rows, columns=["model", "language", "task", "m_s_low", "m_s_high", "m_b_low", "m_b_high"])


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
    adjustment over this table alone, which :func:`storybias.stages.metrics.run` replaces."""
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
    wald, unusable = drop_unusable_wald(wald)
    if unusable:
        return wald, (
            f"Wald chi2 < 0 for {', '.join(unusable)} ({groups.max() + 1} clusters, {len(fit.params)} parameters: "
            "the cluster-robust covariance is not positive definite); their chi2 and p are left empty"
        )
    return wald, ""


def drop_unusable_wald(wald: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """A Wald chi2 below zero (a cluster-robust covariance that is not positive definite, with few
    clusters or a separated outcome) is no test: its chi2 and p become NaN; the terms are returned."""
    bad = wald["chi2"].astype(float) < 0
    out = wald.copy()
    out.loc[bad, ["chi2", "p_value"]] = np.nan
    return out, [str(t) for t in wald.loc[bad, "term"]]


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
