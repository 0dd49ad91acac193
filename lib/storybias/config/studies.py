"""Constants the studies fix, read by a stage and by the figures that show its results."""

from __future__ import annotations

# BiasedTales-ML Eq. 1: S_C is clipped to [-2, 2] (a category absent from one group)
S_C_CLIP = 2.0
# BiasedTales-ML Sec. 3.2 / 5.2, extended to storybias' 14 languages: G = languages with grammatical
# gender, N = without (the JSD comparison of the two groups)
GRAMMATICAL_GENDER = {"G": ("es", "ru", "ar", "fr", "it", "pt", "uk", "hi"), "N": ("en", "zh", "ja", "ko")}
# stage 05: a group with fewer stories than this is shown but flagged (``small_sample``)
MIN_STORIES_FLAG = 20
