"""A response as stored: everything its object and events are built from beside the
request's stream. It is kept as one field of the request's own hash, so it lives on the
request's slot and expires with the request (``TOKENQ_RESULT_TTL_S`` after it ends)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from producer.openai.errors import ApiError
from producer.openai.reasoning import ReasoningPlan
from producer.openai.tools import ToolPlan
from producer.responses.inputs import Item, numbered
from shared.keys import REQUEST_ID_RE

ID_PREFIX = "resp_"


class StoredResponse(BaseModel):
    """The body as it was read (echoed in the response object), the conversation before
    it (``context``, from ``previous_response_id``) and the plans its reply is read with."""

    model_config = ConfigDict(frozen=True)

    request_id: str = ""
    created_at: float = 0.0
    model: str
    instructions: str | None = None
    input: list[Item]
    context: list[Item] = []
    tools: list[dict[str, Any]] = []
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = {"format": {"type": "text"}}
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = {}
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    reasoning: dict[str, Any] | None = None
    user: str | None = None
    tool_plan: dict[str, Any]
    reasoning_plan: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return response_id(self.request_id)

    def tools_plan(self) -> ToolPlan:
        return ToolPlan.from_dict(self.tool_plan)

    def think_plan(self) -> ReasoningPlan | None:
        return None if self.reasoning_plan is None else ReasoningPlan.from_dict(self.reasoning_plan)

    def stored(self, request_id: str, created_at: float) -> StoredResponse:
        """The record of the request ``request_id``: its input items get ids."""
        items = numbered(self.input, request_id, "in")
        update = {"request_id": request_id, "created_at": round(created_at, 3), "input": items}
        return self.model_copy(update=update)

    def conversation(self, output: list[Item]) -> list[Item]:
        """The items a response continuing this one starts from (its instructions, as
        OpenAI's, are not carried over)."""
        return [*self.context, *self.input, *output]


def response_id(request_id: str) -> str:
    return ID_PREFIX + request_id


def request_id_of(value: str, param: str = "response_id") -> str:
    """The tokenq request id inside a response id; 400 naming ``param`` when it is not one."""
    request_id = value.removeprefix(ID_PREFIX)
    if not value.startswith(ID_PREFIX) or not REQUEST_ID_RE.match(request_id):
        raise ApiError(
            400,
            f"{param}: {value!r} is not a response id (resp_ and a tokenq request id)",
            param=param,
            code="invalid_value",
        )
    return request_id
