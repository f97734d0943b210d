"""Every OpenTelemetry GenAI semantic-convention name this project uses, in one place.

The GenAI conventions are still "Development": when they change, only this module does.
Names of our own (``agentledger.*``) sit beside them.
"""

from __future__ import annotations

# Operation names (gen_ai.operation.name) and span names "{operation} {target}".
OP_CHAT = "chat"
OP_EXECUTE_TOOL = "execute_tool"
OP_INVOKE_AGENT = "invoke_agent"
OP_INVOKE_WORKFLOW = "invoke_workflow"
# Ours: a workflow's ``ctx.step`` (plain code, no GenAI operation), span "step {name}".
SPAN_STEP = "step"

# Span attributes.
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"  # a tool step's idempotency key
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # message content: only when opted in
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"

# Metric instruments (OpenTelemetry names) and their Prometheus spelling.
GEN_AI_CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
GEN_AI_CLIENT_OPERATION_DURATION = "gen_ai.client.operation.duration"
PROM_TOKEN_USAGE = "gen_ai_client_token_usage"
PROM_OPERATION_DURATION = "gen_ai_client_operation_duration_seconds"
TOKEN_TYPE_INPUT = "input"
TOKEN_TYPE_OUTPUT = "output"
# Bucket boundaries the conventions recommend.
TOKEN_USAGE_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)

# Ours.
RUN_ID = "agentledger.run.id"
RUN_VERSION = "agentledger.run.version"
RUN_TENANT = "agentledger.run.tenant"
RUN_OUTCOME = "agentledger.run.outcome"
RUN_EXECUTION = "agentledger.run.lease_epoch"
STEP_NO = "agentledger.step.no"
STEP_REPLAYED = "agentledger.step.replayed"
STEP_OUTCOME = "agentledger.step.outcome"
STEP_ATTEMPT = "agentledger.step.attempt"
STEP_KIND = "agentledger.step.kind"  # model | tool | step | compensation ...
TOOL_EFFECT = "agentledger.tool.effect"  # read | write | outbox
UNKNOWN_RESOLUTION = "agentledger.unknown_outcome.resolution"

# Environment switches.
ENV_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
