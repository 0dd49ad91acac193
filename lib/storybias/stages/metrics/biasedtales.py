"""BiasedTales-ML's narrative distributions (stage 05, part A): log-probability ratios S_C, the
Jensen-Shannon divergence of adjective distributions, cross-lingual cosine similarity of S_C vectors,
Monroe et al.'s log-odds with an informative Dirichlet prior, the grammatical-gender test and the
VSR x JSD join.

Every formula is a small pure function with its source quoted in the docstring; the notebook only
calls them (through :mod:`storybias.stages.metrics`). Natural logarithms throughout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from storybias.config.params import Comparison, load_yaml_strict
from storybias.config.studies import GRAMMATICAL_GENDER, MIN_STORIES_FLAG, S_C_CLIP
from storybias.core import paths
from storybias.stats.bootstrap import bootstrap_indices, percentile_bounds, percentile_interval

SCDenominator = Literal["all_tokens", "categorized"]
LOG_ODDS_FIELDS = ("adjectives_en", "settings", "cultural_refs")  # the extracted fields the log-odds compare
JSD_EPSILON = 1e-10


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
    tokens_per_story: Sequence[Sequence[str]],
    lexicon: Mapping[str, str],
    cats: Sequence[str],
    denominator: SCDenominator = "all_tokens",
) -> tuple[np.ndarray, np.ndarray]:
    """Per story: counts of tokens in each category (n_stories x n_categories) and the denominator of
    P(C | g): every token (``all_tokens``, a token in no category included) or the tokens some category
    holds (``categorized``). Eq. 1 says only "normalized frequency": ``metrics.sc_denominator``."""
    index = {c: i for i, c in enumerate(cats)}
    counts = np.zeros((len(tokens_per_story), len(cats)))
    totals = np.zeros(len(tokens_per_story))
    for s, tokens in enumerate(tokens_per_story):
        totals[s] = len(tokens)
        for t in tokens:
            c = lexicon.get(t)
            if c is not None:
                counts[s, index[c]] += 1
    if denominator == "categorized":
        totals = counts.sum(1)
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
    return s_c_bounds(s_c_replicates(g, n_boot, seed), level)


def s_c_bounds(replicates: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Per category, the percentile interval of S_C replicates (n_boot x categories); a category's NaN
    resamples (unseen in both groups) are left out."""
    lo, hi = percentile_bounds(level)
    return np.nanpercentile(replicates, lo, axis=0), np.nanpercentile(replicates, hi, axis=0)


def s_c_replicates(g: GroupData, n_boot: int, seed: int) -> np.ndarray:
    """S_C per category on ``n_boot`` resamples of the stories within each group (n_boot x categories;
    NaN where a resample has the category in neither group)."""
    rng = np.random.default_rng(seed)
    im = bootstrap_indices(len(g.totals_m), n_boot, rng)
    jf = bootstrap_indices(len(g.totals_f), n_boot, rng)
    cm = g.counts_m[im].sum(1)  # n_boot x K
    tm = g.totals_m[im].sum(1)[:, None]
    cf = g.counts_f[jf].sum(1)
    tf = g.totals_f[jf].sum(1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return log_probability_ratio(cm / tm, cf / tf)


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


def _word_matrix(token_lists: Sequence[Sequence[str]], vocab: Sequence[str]) -> np.ndarray:
    index = {w: i for i, w in enumerate(vocab)}
    m = np.zeros((len(token_lists), len(vocab)))
    for s, tokens in enumerate(token_lists):
        for t in tokens:
            if t in index:
                m[s, index[t]] += 1
    return m


def _comparison_stories(data: pd.DataFrame, comparison: Comparison) -> pd.DataFrame:
    """The stories of the comparison's design where its ``where`` conditions hold (both groups and any
    other value of the compared condition)."""
    sub = data[data["design"] == comparison.design]
    for column, value in comparison.where.items():
        sub = sub[sub[f"cond_{column}"] == value]
    return sub


def _sc_rows(
    base: dict[str, Any],
    m: pd.DataFrame,
    f: pd.DataFrame,
    n_boot: int,
    seed: int,
    denominator: SCDenominator,
    replicates: dict[str, np.ndarray],
) -> list[dict[str, Any]]:
    """S_C rows of one model x language cell: every adjective and setting category, with its bootstrap
    interval and the lexicon's coverage; NaN with a note when a group has no tokens of that kind. Also
    fills ``replicates`` (``<kind>:<category>`` -> the bootstrap draws), which the cosine's interval reads."""
    rows = []
    for kind, field in (("adjectives", "adjectives_en"), ("settings", "settings")):
        lexicon, cats = load_lexicon(kind), categories(kind)
        cm, tm = category_counts(list(m[field]), lexicon, cats, denominator)
        cf, tf = category_counts(list(f[field]), lexicon, cats, denominator)
        g = GroupData(cm, tm, cf, tf)
        if tm.sum() == 0 or tf.sum() == 0:
            for c in cats:
                rows.append(
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
        draws = s_c_replicates(g, n_boot, seed)
        lo, hi = s_c_bounds(draws)
        replicates.update({f"{kind}:{c}": draws[:, k] for k, c in enumerate(cats)})
        for c, value, a, b in zip(cats, s, lo, hi):
            rows.append(
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
    return rows


def _jsd_row(
    base: dict[str, Any], cell: pd.DataFrame, m: pd.DataFrame, f: pd.DataFrame, n_boot: int, seed: int
) -> dict[str, Any]:
    """JSD row of one model x language cell, over the cell's adjective vocabulary, with its bootstrap
    interval; NaN with a note when a group has no adjectives."""
    vocab = sorted({w for ws in cell["adjectives_en"] for w in ws})
    wm, wf = _word_matrix(list(m["adjectives_en"]), vocab), _word_matrix(list(f["adjectives_en"]), vocab)
    if wm.sum() == 0 or wf.sum() == 0:
        return {**base, "jsd": np.nan, "ci_low": np.nan, "ci_high": np.nan, "note": "a group has no adjectives"}
    jsd_low, jsd_high = bootstrap_jsd(wm, wf, n_boot, seed)
    return {
        **base,
        "jsd": jsd_from_counts(wm.sum(0), wf.sum(0)),
        "ci_low": jsd_low,
        "ci_high": jsd_high,
        "note": "",
    }


def narrative_comparison(
    data: pd.DataFrame,
    comparison: Comparison,
    n_boot: int,
    seed: int,
    min_stories: int = MIN_STORIES_FLAG,
    sc_denominator: SCDenominator = "all_tokens",
) -> dict[str, pd.DataFrame]:
    """S_C per category (adjective and setting categories), JSD of adjective distributions, per model x
    language, for the two groups of one comparison. ``data``: extractions joined with conditions;
    ``sc_denominator``: see :func:`category_counts`."""
    column = f"cond_{comparison.condition}"
    sub = _comparison_stories(data, comparison)
    sub = sub[sub[column].isin([comparison.group_m, comparison.group_f])]
    sc_rows, jsd_rows, boot_frames = [], [], []
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
        replicates: dict[str, np.ndarray] = {}
        sc_rows += _sc_rows(base, m, f, n_boot, seed, sc_denominator, replicates)
        jsd_rows.append(_jsd_row(base, cell, m, f, n_boot, seed))
        if replicates:
            draws = pd.DataFrame(replicates).rename_axis("replicate").reset_index()
            boot_frames.append(draws.assign(comparison=comparison.name, model=model, language=language))
    boot = pd.concat(boot_frames, ignore_index=True) if boot_frames else pd.DataFrame()
    return {"sc": pd.DataFrame(sc_rows), "jsd": pd.DataFrame(jsd_rows), "sc_replicates": boot}


def cosine_matrix(sc: pd.DataFrame, replicates: pd.DataFrame | None = None) -> pd.DataFrame:
    """Language x language cosine similarity of S_C vectors, per model and comparison.

    The vector of a language holds S_C of every semantic category, adjective and setting categories
    alike, keyed ``<kind>:<category>`` (BiasedTales-ML Eq. 3: v_l aggregates S_C over all semantic
    categories; a category missing in one language, or NaN, counts as 0). With ``replicates``
    (``narrative_comparison``'s ``sc_replicates``: each cell's S_C on resamples of its stories) the
    cosine gets a percentile interval: replicate i of one language against replicate i of the other
    (independent resamples of different stories). The paper gives none: storybias' addition."""
    rows = []
    data = sc.assign(key=sc["kind"].astype(str) + ":" + sc["category"].astype(str))
    for (comparison, model), g in data.groupby(["comparison", "model"]):
        vectors = {lang: dict(zip(v["key"], v["s_c"])) for lang, v in g.groupby("language")}
        draws = _replicate_vectors(replicates, comparison, model, sorted(set(g["key"])))
        for a in vectors:
            for b in vectors:
                low, high = _cosine_interval(draws.get(a), draws.get(b))
                rows.append(
                    {
                        "comparison": comparison,
                        "model": model,
                        "language_a": a,
                        "language_b": b,
                        "cosine": cosine_similarity(vectors[a], vectors[b]),
                        "ci_low": low,
                        "ci_high": high,
                    }
                )
    return pd.DataFrame(rows)


def _replicate_vectors(
    replicates: pd.DataFrame | None, comparison: str, model: str, keys: list[str]
) -> dict[str, np.ndarray]:
    """Per language, the (n_boot x keys) S_C replicates of one comparison and model, NaN as 0 (Eq. 3)."""
    if replicates is None or replicates.empty:
        return {}
    mine = replicates[(replicates["comparison"] == comparison) & (replicates["model"] == model)]
    return {
        lang: v.reindex(columns=keys).fillna(0.0).to_numpy(float)
        for lang, v in mine.sort_values("replicate").groupby("language")
    }


def _cosine_interval(a: np.ndarray | None, b: np.ndarray | None, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the cosine between paired replicate vectors (NaN without replicates)."""
    if a is None or b is None:
        return float("nan"), float("nan")
    n = min(len(a), len(b))
    norms = np.linalg.norm(a[:n], axis=1) * np.linalg.norm(b[:n], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cosines = np.where(norms > 0, (a[:n] * b[:n]).sum(1) / norms, np.nan)
    return percentile_interval(cosines, level)


def vsr_jsd_join(jsd: pd.DataFrame, vsr: pd.DataFrame, comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """Each JSD row with the valid-story rate of the same model x language *in the comparison's design*
    (bedtime for BiasedTales-ML's comparisons: their VSR, Table 3), never a rate pooled over designs."""
    design_of = {c.name: c.design for c in comparisons}
    left = jsd.assign(design=jsd["comparison"].map(design_of))
    right = vsr[["design", "model", "language", "vsr", "n_stories"]]
    return left.merge(right, on=["design", "model", "language"], how="left").drop(columns=["design"])


def log_odds_table(data: pd.DataFrame, comparison: Comparison, prior_scale: float, top: int) -> pd.DataFrame:
    """Top words per group (adjective lemmas, setting keywords and cultural references, the three
    extracted fields of BiasedTales-ML Figs. 10-12) by Monroe et al. z, per model. Cultural references
    are compared lower-cased ("Eid" and "eid" are one word)."""
    sub = _comparison_stories(data, comparison)
    column = f"cond_{comparison.condition}"
    rows = []
    for model, cell in sub.groupby("model"):
        for field in [name for name in LOG_ODDS_FIELDS if name in cell.columns]:
            words = cell[field].map(lambda ws: [str(w).strip().lower() for w in ws])
            corpus = pd.Series([w for ws in words for w in ws]).value_counts().to_dict()
            m = pd.Series([w for ws in words[cell[column] == comparison.group_m] for w in ws]).value_counts().to_dict()
            f = pd.Series([w for ws in words[cell[column] == comparison.group_f] for w in ws]).value_counts().to_dict()
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
