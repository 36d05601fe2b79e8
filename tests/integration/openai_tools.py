"""The tools the OpenAI integration tests call, and the schemas their arguments meet."""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionToolParam
from openai.types.shared_params import FunctionDefinition

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD: dict[str, Any] = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": -999, "maximum": 999},
        "b": {"type": "integer", "minimum": -999, "maximum": 999},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
PARAMETERS = {"get_weather": WEATHER, "add": ADD}
DESCRIPTIONS = {"get_weather": "Weather now"}


def function_tool(name: str) -> ChatCompletionToolParam:
    """The OpenAI tool definition of ``name``, with its parameters from PARAMETERS."""
    function: FunctionDefinition = {"name": name, "parameters": PARAMETERS[name]}
    if name in DESCRIPTIONS:
        function["description"] = DESCRIPTIONS[name]
    return {"type": "function", "function": function}


TOOLS: list[ChatCompletionToolParam] = [function_tool(name) for name in PARAMETERS]
