"""Shared statistics, each computed once; the bottom layer: nothing here imports the rest of storybias.

- ``agreement``: Cohen's kappa (unweighted, weighted, quadratic over resample weights) and Fleiss' kappa.
- ``multiple_testing``: Benjamini-Hochberg / Benjamini-Yekutieli adjusted p-values and BH's step-up
  thresholds and decisions.
- ``bootstrap``: resampling of items (indices) and of groups (multinomial counts), the percentile
  interval, and the bootstrap interval of a mean.

Import the submodule you need (``from storybias.stats.agreement import cohen_kappa``): this package
imports none of them, so that reaching one does not load the libraries of the others.
"""
