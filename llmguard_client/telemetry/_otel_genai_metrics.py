"""The GenAI client metrics of one logical call, under the default or the latest set of names.

`OperationMetrics` emits the v1.41.0 names (``gen_ai.client.operation.*``, ``gen_ai.client.token.usage``),
the default. `InferenceMetrics` emits the names of the GenAI conventions' own repository
(``gen_ai.client.inference.*``, ``gen_ai.client.embeddings.*``), chosen with
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``. An instrumentation emits one set, never both.
"""

from __future__ import annotations

from typing import Protocol

from opentelemetry.metrics import Histogram, Meter

from llmguard_client.telemetry import semconv as sc
from llmguard_client.telemetry._otel_attributes import Attrs, time_per_output_chunk
from llmguard_client.telemetry.record import PhaseRecord

__all__ = ["GenAiMetrics", "InferenceMetrics", "OperationMetrics", "gen_ai_metrics"]

_TTFC = (
    "Time to receive the first chunk, measured from when the client issues the generation request to when "
    "the first chunk is received in the response stream."
)
_TPOC = "Time per output chunk after the first one (the mean over a streamed call)."


def _seconds(meter: Meter, name: str, description: str) -> Histogram:
    """A histogram of seconds with the conventions' duration buckets."""
    return meter.create_histogram(
        name,
        unit=sc.UNIT_SECONDS,
        description=description,
        explicit_bucket_boundaries_advisory=sc.GEN_AI_DURATION_BUCKETS,
    )


def _tokens(meter: Meter, name: str, description: str) -> Histogram:
    """A histogram of tokens with the conventions' token buckets."""
    return meter.create_histogram(
        name,
        unit=sc.UNIT_TOKEN,
        description=description,
        explicit_bucket_boundaries_advisory=sc.GEN_AI_TOKEN_BUCKETS,
    )


class GenAiMetrics(Protocol):
    """Records the GenAI client metrics of a finished call."""

    def record(self, record: PhaseRecord, op: str, attrs: Attrs, err: str | None) -> None:
        """``attrs``: the call's GenAI attributes (no ``error.type``); ``err``: its error type, if it failed."""


def gen_ai_metrics(meter: Meter, latest: bool) -> GenAiMetrics:
    """The latest set if ``latest`` (the user opted in), else the default set."""
    return InferenceMetrics(meter) if latest else OperationMetrics(meter)


def _streamed(record: PhaseRecord) -> tuple[float, float | None] | None:
    """(time to first chunk, mean time per output chunk) of a streamed call that got a first chunk."""
    if not record.stream or record.first_token is None:
        return None
    return record.first_token - record.start, time_per_output_chunk(record)


class OperationMetrics:
    """Semantic conventions v1.41.0: four histograms, tokens by ``gen_ai.token.type``."""

    __slots__ = ("duration", "tokens", "tpoc", "ttfc")

    def __init__(self, meter: Meter) -> None:
        self.duration = _seconds(meter, sc.GEN_AI_CLIENT_OPERATION_DURATION, "GenAI operation duration.")
        self.ttfc = _seconds(meter, sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK, _TTFC)
        self.tpoc = _seconds(meter, sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK, _TPOC)
        self.tokens = _tokens(meter, sc.GEN_AI_CLIENT_TOKEN_USAGE, "Number of input and output tokens used.")

    def record(self, record: PhaseRecord, op: str, attrs: Attrs, err: str | None) -> None:
        duration = record.duration
        if duration is not None:
            self.duration.record(duration, attrs if err is None else {**attrs, sc.ERROR_TYPE: err})
        streamed = _streamed(record)
        if streamed is not None:
            ttfc, tpoc = streamed
            self.ttfc.record(ttfc, attrs)
            if tpoc is not None:
                self.tpoc.record(tpoc, attrs)
        if record.prompt_tokens is not None:
            self.tokens.record(record.prompt_tokens, {**attrs, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_INPUT})
        if record.completion_tokens is not None:
            self.tokens.record(record.completion_tokens, {**attrs, sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_TYPE_OUTPUT})


class InferenceMetrics:
    """semantic-conventions-genai v0.1.0: inference and embeddings metrics, token usage as counters.

    Per the conventions, an inference call counts its usage even when it failed or reported none
    (``0``, with ``gen_ai.token.modality`` = ``unknown``: OpenAI-compatible usage is not split by modality);
    an embeddings call records its duration and, when reported, its input tokens.
    """

    __slots__ = (
        "duration",
        "emb_duration",
        "emb_input",
        "op_input",
        "op_output",
        "tpoc",
        "ttfc",
        "use_input",
        "use_output",
    )

    def __init__(self, meter: Meter) -> None:
        token = sc.UNIT_TOKEN
        self.duration = _seconds(
            meter, sc.GEN_AI_CLIENT_INFERENCE_DURATION, "GenAI client inference operation duration."
        )
        self.ttfc = _seconds(meter, sc.GEN_AI_CLIENT_INFERENCE_TIME_TO_FIRST_CHUNK, _TTFC)
        self.tpoc = _seconds(meter, sc.GEN_AI_CLIENT_INFERENCE_TIME_PER_OUTPUT_CHUNK, _TPOC)
        self.use_input = meter.create_counter(
            sc.GEN_AI_CLIENT_INFERENCE_USAGE_INPUT_TOKENS,
            unit=token,
            description="The number of input (prompt) tokens used, including cached tokens.",
        )
        self.use_output = meter.create_counter(
            sc.GEN_AI_CLIENT_INFERENCE_USAGE_OUTPUT_TOKENS,
            unit=token,
            description="The number of output (completion) tokens used, including reasoning tokens.",
        )
        self.op_input = _tokens(
            meter,
            sc.GEN_AI_CLIENT_INFERENCE_OPERATION_INPUT_TOKENS,
            "The number of input (prompt) tokens used per inference operation.",
        )
        self.op_output = _tokens(
            meter,
            sc.GEN_AI_CLIENT_INFERENCE_OPERATION_OUTPUT_TOKENS,
            "The number of output (completion) tokens used per inference operation.",
        )
        self.emb_duration = _seconds(
            meter, sc.GEN_AI_CLIENT_EMBEDDINGS_DURATION, "GenAI client embeddings operation duration."
        )
        self.emb_input = _tokens(
            meter,
            sc.GEN_AI_CLIENT_EMBEDDINGS_OPERATION_INPUT_TOKENS,
            "The number of input tokens used per embeddings operation.",
        )

    def record(self, record: PhaseRecord, op: str, attrs: Attrs, err: str | None) -> None:
        failed = attrs if err is None else {**attrs, sc.ERROR_TYPE: err}
        duration = record.duration
        if op == sc.OPERATION_EMBEDDINGS:
            if duration is not None:
                self.emb_duration.record(duration, failed)
            if record.prompt_tokens is not None:
                self.emb_input.record(record.prompt_tokens, attrs)
            return
        if duration is not None:
            self.duration.record(duration, failed)
        streamed = _streamed(record)
        if streamed is not None:
            ttfc, tpoc = streamed
            self.ttfc.record(ttfc, attrs)
            if tpoc is not None:
                self.tpoc.record(tpoc, attrs)
        prompt, completion = record.prompt_tokens or 0, record.completion_tokens or 0
        usage = {**attrs, sc.GEN_AI_TOKEN_MODALITY: sc.TOKEN_MODALITY_UNKNOWN}
        self.use_input.add(prompt, usage)
        self.use_output.add(completion, usage)
        self.op_input.record(prompt, failed)
        self.op_output.record(completion, failed)
