"""Which model and engine settings shape a stage's outputs, and which only how fast or how a model is
reached: one classification, read by the answer cache's key (``storybias.engines.cache``), the local
server's key (``storybias.engines.local_servers``) and the stage stamps that decide what Make reruns
(``storybias.config.params.Params.stage_digest``). Every field of ``ModelSpec`` and ``EngineSettings`` is
in exactly one class (tests/test_cache.py), so a new field has to be classified before it can be used.

The stamps leave out what the cache leaves out, with one difference: a model's ``name`` does not change
an answer (the cache reuses it) but is written in every row a model produced, so renaming a model reruns
the stages that read it (:data:`STAMP_IGNORED_MODEL_FIELDS`).
"""

from __future__ import annotations

# How every ModelSpec field bears on a model's identity: one classification, from which both the cache
# key (what shapes an answer: OUTPUT_MODEL_FIELDS) and the local server key (which weights are loaded,
# and how: SERVER_MODEL_FIELDS, storybias.engines.local_servers.serve_key) are derived. Every field is in exactly
# one class (tests/test_cache.py), so a new field has to be classified before it can be used.
#
# which weights are loaded and how they read a prompt: they shape the answers and make a server
LOADED_OUTPUT_FIELDS = frozenset(
    {
        "source",
        "embedded",  # the embedded weights (replaced by their pinned sha256)
        "weights",  # bf16 or the int8 copy (folded into ``embedded``: the sha256 of the copy loaded)
        "path",
        "hub_id",
        "device",
        "dtype",
        "tensor_parallel_size",
        "max_model_len",
        "chat_template",  # replaced by the template file's content
    }
)
# how the weights are loaded, not what they write: a server's setting, not the cache's
LOADED_ONLY_FIELDS = frozenset({"gpu_memory_utilization"})
# what each request carries: it shapes the answer, and any server of the same weights can serve it
# (an API model's base_url and model_id name a remote model no local server serves)
REQUEST_OUTPUT_FIELDS = frozenset({"chat_template_kwargs", "base_url", "model_id", "constraints"})
# how the model is reached and paced, its price, its display name: neither answers nor servers
OPERATIONAL_MODEL_FIELDS = frozenset(
    {
        "name",  # a label: renaming a model reuses its answers (its stories' ids still change)
        "api_key_env",
        "max_concurrency",
        "requests_per_minute",
        "request_timeout_s",
        "max_retries",
        "context_tokens",  # what the endpoint may hold: a request that cannot fit is refused, not answered otherwise
        "price_input_per_mtok",
        "price_output_per_mtok",
    }
)
MODEL_FIELD_CLASSES = {
    "loaded_output": LOADED_OUTPUT_FIELDS,
    "loaded_only": LOADED_ONLY_FIELDS,
    "request_output": REQUEST_OUTPUT_FIELDS,
    "operational": OPERATIONAL_MODEL_FIELDS,
}
OUTPUT_MODEL_FIELDS = LOADED_OUTPUT_FIELDS | REQUEST_OUTPUT_FIELDS  # the model part of the cache key
SERVER_MODEL_FIELDS = LOADED_OUTPUT_FIELDS | LOADED_ONLY_FIELDS  # what two specs must share to share a server
# EngineSettings fields that can change an output: ``compact_json`` switches vLLM's structured-output
# backend to whitespace-free JSON (another answer, measured on the gold set); ``enforce_eager`` skips
# torch.compile (other kernels, other float sums); ``deterministic_cpu_attention`` fixes the order of
# the CPU attention's sums; ``cpu_top_k_first`` may cut a tie at the nucleus boundary differently.
OUTPUT_ENGINE_FIELDS = frozenset({"compact_json", "enforce_eager", "deterministic_cpu_attention", "cpu_top_k_first"})
OPERATIONAL_ENGINE_FIELDS = frozenset(
    {
        "backend",
        "ray",
        "cpu_threads_bind",
        "cpu_kvcache_gb",
        "max_num_seqs",
        "shared_server",
        "shared_server_kind",  # but llama.cpp's answers are its own: engine_identity names it
        "llama_cpp",  # the server's sizes (-c, -np, -t)
        "cpu_preload",  # the allocator and the OpenMP runtime: 16 of 16 texts identical with and without
        "max_failed_share",  # when a stage stops for failed requests, not what any answer says
    }
)

# Fields added after answers were cached and stages stamped, by the settings class that holds them: at
# their default they leave the cache key and the stamps as they were, so adding the setting reruns nothing;
# any other value enters both.
ADDED_FIELDS: dict[str, dict[str, object]] = {
    "ModelSpec": {"weights": "bf16"},
    "ExtractionSettings": {"worked_examples": None, "example_instructions": "every_turn"},  # stage 03's prompt cost
}
ADDED_MODEL_FIELDS = ADDED_FIELDS["ModelSpec"]

# What a stage's params stamp leaves out: the operational settings (an output cannot change with them),
# and how the weights are loaded (a server's setting). A model's display name stays in: it is in the rows.
STAMP_IGNORED_MODEL_FIELDS = (OPERATIONAL_MODEL_FIELDS - {"name"}) | LOADED_ONLY_FIELDS
STAMP_IGNORED_ENGINE_FIELDS = OPERATIONAL_ENGINE_FIELDS
