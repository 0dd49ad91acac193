"""Tools around the pipeline, above the stages: the notebook runner behind ``make <stage>``, cost and
wall-time planning, and the benchmarks (``make bench-*``)."""
