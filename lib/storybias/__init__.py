"""storybias: a reproducible audit of social bias in open-ended, multilingual LLM stories.

One module per concern: paths (where files live), params (profiles and their schema), prompts
(designs and the prompt grid), models (weights), engines (vLLM), generate (stage 01), io (atomic
artifacts, resumable shards, recorded values).
"""

__version__ = "0.1.0"
