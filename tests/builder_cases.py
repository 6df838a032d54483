"""The rich conversation the three builders' golden tests render: every item kind, images,
two tool calls with their results, a hosted tool call and reasoning in its backend's form."""

from __future__ import annotations

from trio_sampler.types._conversation import (
    ApiBackend,
    Assistant,
    BackendToolCall,
    ConversationRequest,
    ImagePart,
    Reasoning,
    ReasoningEffort,
    ResponseSchema,
    System,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolSpec,
    User,
    WebSearch,
)

__all__ = ["rich"]


def rich(origin: ApiBackend) -> ConversationRequest:
    """The conversation, with reasoning and hosted-tool items as ``origin`` produces them."""
    if origin is ApiBackend.MESSAGES:
        r1 = Reasoning(text="Check the image first.", signature="sig-1", origin=origin)
        r2 = Reasoning(redacted_data="redacted-blob", origin=origin)
        hosted = BackendToolCall(
            id="srvtoolu_1",
            name="web_search",
            arguments='{"query":"cats"}',
            origin=origin,
            raw=(
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_1",
                    "name": "web_search",
                    "input": {"query": "cats"},
                },
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            ),
        )
    elif origin is ApiBackend.RESPONSES:
        r1 = Reasoning(
            summary=("Check the image first.",),
            id="rs_1",
            encrypted_content="gAAAA-1",
            origin=origin,
        )
        r2 = Reasoning(id="rs_2", encrypted_content="gAAAA-2", origin=origin)
        hosted = BackendToolCall(
            id="ws_1",
            name="web_search",
            arguments='{"query":"cats"}',
            status="completed",
            origin=origin,
            raw=(
                {
                    "type": "web_search_call",
                    "id": "ws_1",
                    "status": "completed",
                    "action": {"type": "search", "query": "cats"},
                },
            ),
        )
    else:
        r1 = Reasoning(text="Check the image first.", origin=origin)
        r2 = Reasoning(text="Now answer.", origin=origin)
        hosted = BackendToolCall(id="ws_1", name="web_search", arguments='{"query":"cats"}')
    return ConversationRequest(
        items=[
            System("You are terse."),
            User(
                [
                    TextPart("What is this?"),
                    ImagePart("https://example.com/cat.png"),
                    ImagePart("data:image/png;base64,iVBOR"),
                ]
            ),
            r1,
            Assistant(
                tool_calls=[
                    ToolCall("call_1", "lookup", '{"q":"cat"}'),
                    ToolCall("call_2", "weather", '{"city":"Paris"}'),
                ]
            ),
            ToolResult("call_1", "a cat", images=[ImagePart("data:image/png;base64,iVBOR")]),
            ToolResult("call_2", "sunny"),
            hosted,
            r2,
            Assistant("It is a cat."),
            User("Thanks"),
        ],
        tools=[
            ToolSpec(
                "lookup",
                "Look things up.",
                {"type": "object", "properties": {"q": {"type": "string"}}},
                strict=True,
            ),
            ToolSpec(
                "weather", None, {"type": "object", "properties": {"city": {"type": "string"}}}
            ),
        ],
        hosted_tools=[WebSearch(allowed_domains=["example.com"])],
        tool_choice=ToolChoice.AUTO,
        parallel_tool_calls=False,
        model="test-model",
        max_output_tokens=2048,
        reasoning_effort=ReasoningEffort.LOW,
        response_schema=ResponseSchema(
            "answer", {"type": "object", "properties": {"a": {"type": "string"}}}
        ),
    )
