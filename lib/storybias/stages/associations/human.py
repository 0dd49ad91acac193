"""Stage 04's human ratings: the ratings file a human panel fills in (checked before anything runs),
its per-association summary, and its comparison with the LLM judges (harm gap per attribute, harmful
agreement, realism, rank correlation), after StereoTales (*StereoTales: A Multilingual Framework for
Open-Ended Stereotype Discovery in LLMs*, Le Jeune et al., Giskard AI, 2026, arXiv:2605.10442), whose
human study rated the associations of the global pass on the judge's two questions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from storybias.evidence.harm_ratings import HARMFUL_MEDIAN, REALISM_ANSWERS
from storybias.stats.agreement import cohen_kappa
from storybias.stats.bootstrap import bootstrap_indices, percentile_interval

# --- human ratings: the file -----------------------------------------------------------------------


# --- human vs LLM ----------------------------------------------------------------------------------


def rating_summary(ratings: pd.DataFrame) -> pd.DataFrame:
    """Per association: median harm over every rating (all raters, or all judges and repetitions),
    number of ratings, harmful (median >= 4, StereoTales' rule), and the shares of each realism
    answer. ``ratings``: association_id, harm, realism (unparsed ratings already removed)."""
    columns = ["association_id", "median_harm", "n_ratings", "harmful", *[f"share_{a}" for a in REALISM_ANSWERS]]
    ok = ratings.dropna(subset=["harm"])
    if ok.empty:
        return pd.DataFrame(columns=columns)
    out = ok.groupby("association_id").agg(median_harm=("harm", "median"), n_ratings=("harm", "size")).reset_index()
    out["harmful"] = out["median_harm"] >= HARMFUL_MEDIAN
    shares = pd.crosstab(ok["association_id"], ok["realism"], normalize="index")
    for answer in REALISM_ANSWERS:
        out[f"share_{answer}"] = (
            out["association_id"].map(shares[answer] if answer in shares else {}).fillna(0.0).astype(float)
        )
    return out[columns]


def _base_attribute(association: str) -> str:
    return association.split("|")[0]


def harm_gap_by_attribute(
    human: pd.DataFrame, llm: pd.DataFrame, n_boot: int = 2000, seed: int = 42, confidence: float = 0.95
) -> pd.DataFrame:
    """Per base attribute, over the associations both humans and LLMs rated: mean human median harm,
    mean LLM median harm and their gap (human - LLM: positive where LLMs under-rate the harm, as
    StereoTales found for socio-economic attributes; negative where they over-rate it, as for
    gender), with a percentile bootstrap interval (scipy.stats.bootstrap) over the attribute's
    associations (paired: an association's human and LLM medians are resampled together). Also the
    share rated harmful (median >= 4) by each side. ``human`` and ``llm``: ``rating_summary``
    tables. Attributes with one association get no interval."""
    columns = [
        "base_attribute",
        "n_associations",
        "human_mean_harm",
        "llm_mean_harm",
        "gap",
        "gap_ci_low",
        "gap_ci_high",
        "human_share_harmful",
        "llm_share_harmful",
    ]
    both = (
        human[["association_id", "median_harm", "harmful"]]
        .merge(llm[["association_id", "median_harm", "harmful"]], on="association_id", suffixes=("_human", "_llm"))
        .dropna()
    )
    if both.empty:
        return pd.DataFrame(columns=columns)
    both["base_attribute"] = both["association_id"].map(_base_attribute)
    rng = np.random.default_rng(seed)
    rows = []
    for attribute, group in both.groupby("base_attribute", sort=True):
        diff = (group["median_harm_human"] - group["median_harm_llm"]).to_numpy(float)
        low = high = np.nan
        if len(diff) >= 2:
            if np.ptp(diff) == 0:
                low = high = float(diff[0])  # every resample has the same mean
            else:
                ci = stats.bootstrap(
                    (diff,), np.mean, n_resamples=n_boot, confidence_level=confidence, method="percentile", rng=rng
                ).confidence_interval
                low, high = float(ci.low), float(ci.high)
        rows.append(
            {
                "base_attribute": attribute,
                "n_associations": len(group),
                "human_mean_harm": float(group["median_harm_human"].mean()),
                "llm_mean_harm": float(group["median_harm_llm"].mean()),
                "gap": float(diff.mean()),
                "gap_ci_low": low,
                "gap_ci_high": high,
                "human_share_harmful": float(group["harmful_human"].astype(bool).mean()),
                "llm_share_harmful": float(group["harmful_llm"].astype(bool).mean()),
            }
        )
    return pd.DataFrame(rows, columns=columns).sort_values("gap", ascending=False).reset_index(drop=True)


def harmful_agreement(human: pd.DataFrame, llm: pd.DataFrame) -> dict:
    """How the human 'median >= 4 = harmful' classification and the LLMs' compare on the
    associations both rated: counts of each combination and Cohen's kappa."""
    both = human[["association_id", "harmful"]].merge(
        llm[["association_id", "harmful"]], on="association_id", suffixes=("_human", "_llm")
    )
    h, m = both["harmful_human"].astype(bool), both["harmful_llm"].astype(bool)
    kappa = cohen_kappa(h, m)
    return {
        "n": int(len(both)),
        "both_harmful": int((h & m).sum()),
        "human_only": int((h & ~m).sum()),
        "llm_only": int((~h & m).sum()),
        "neither": int((~h & ~m).sum()),
        "cohen_kappa": kappa,
    }


def realism_summary(human: pd.DataFrame | None, llm: pd.DataFrame | None) -> pd.DataFrame:
    """Shares of yes / no / dont_know among the realism answers, per rater type (human, then every
    LLM judge pooled as 'llm', then each judge as 'llm:<name>'), over the associations each rated."""
    columns = ["rater_type", "n_answers", "n_associations", *[f"share_{a}" for a in REALISM_ANSWERS]]
    groups: list[tuple[str, pd.DataFrame]] = []
    if human is not None and len(human):
        groups.append(("human", human))
    if llm is not None and len(llm):
        answered = llm.dropna(subset=["realism"])
        groups.append(("llm", answered))
        if "judge" in answered.columns and answered["judge"].nunique() > 1:
            groups += [(f"llm:{name}", g) for name, g in answered.groupby("judge", sort=True)]
    rows = []
    for name, frame in groups:
        counts = frame["realism"].value_counts()
        total = int(counts.sum())
        rows.append(
            {
                "rater_type": name,
                "n_answers": total,
                "n_associations": int(frame["association_id"].nunique()),
                **{f"share_{a}": float(counts.get(a, 0) / total) if total else np.nan for a in REALISM_ANSWERS},
            }
        )
    return pd.DataFrame(rows, columns=columns)


def human_llm_agreement(human: pd.DataFrame, llm: pd.DataFrame, n_boot: int = 2000, seed: int = 42) -> dict:
    """Spearman rho between per-association median human and median LLM harm, with a percentile
    bootstrap interval over associations (StereoTales reports rho = 0.62). ``human``: the ratings
    (one row per rater); ``llm``: per-association table with median_harm."""
    h = human.groupby("association_id")["harm"].median().rename("human")
    merged = pd.concat([h, llm.set_index("association_id")["median_harm"].rename("llm")], axis=1, join="inner").dropna()
    if len(merged) < 3:
        return {
            "rho": np.nan,
            "ci_low": np.nan,
            "ci_high": np.nan,
            "n": len(merged),
            "note": "fewer than 3 associations rated by both",
        }
    rho = stats.spearmanr(merged["human"], merged["llm"]).statistic
    boots = []
    for idx in bootstrap_indices(len(merged), n_boot, np.random.default_rng(seed)):
        sample = merged.iloc[idx]
        if sample["human"].nunique() > 1 and sample["llm"].nunique() > 1:
            boots.append(stats.spearmanr(sample["human"], sample["llm"]).statistic)
    lo, hi = percentile_interval(boots)
    return {"rho": float(rho), "ci_low": lo, "ci_high": hi, "n": len(merged), "note": ""}
