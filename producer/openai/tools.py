"""Tool calling through a prompt every chat model can follow, for the gateway and batches.

Tools reach the model as a system message (the fallback prompt below), whatever its
chat template does with tools; a reply that calls tools is one JSON object::

    {"tool_calls": [{"name": "<function>", "arguments": {...}}]}

``tool_choice`` ``required`` or a named function constrains decoding to that shape,
with each function's ``parameters`` as the arguments' schema, so the arguments always
validate; ``auto`` leaves the model free and reads a reply of that shape as tool calls.
Earlier assistant ``tool_calls`` and ``role: "tool"`` results go back into the
conversation as text in the same shape, so multi-turn conversations work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from shared.guided import UnsupportedSchema, check_json_schema

Mode = Literal["none", "auto", "required", "named"]
ANY_OBJECT: dict[str, Any] = {"type": "object"}
TOOL_PROMPT = """You can call these tools. Each one's arguments follow its JSON Schema:
{tools}
To call tools, reply with only one JSON object, exactly of this form:
{{"tool_calls": [{{"name": "<tool name>", "arguments": {{<the arguments>}}}}]}}
{rule}"""
RULES = {
    "auto": "If no tool is needed, reply to the user normally instead.",
    "required": "You must call at least one tool now.",
    "named": "You must call the tool {name} now.",
}


class ToolError(ValueError):
    """Tools or tool_choice that cannot be served; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools and tool_choice mean for its prompt, decoding and answer."""

    mode: Mode
    functions: tuple[Function, ...]
    named: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        return self.mode != "none" and bool(self.functions)

    def system_prompt(self) -> str:
        listed = [
            {"name": f.name, "description": f.description, "parameters": f.parameters}
            for f in self.functions
            if self.named in (None, f.name)
        ]
        rule = RULES[self.mode].format(name=self.named)
        return TOOL_PROMPT.format(tools=orjson.dumps(listed).decode(), rule=rule)

    def schema(self) -> dict[str, Any] | None:
        """The guided_json schema for required / named choices; None for auto."""
        if self.mode not in ("required", "named"):
            return None
        calls = [_call_schema(f) for f in self.functions if self.named in (None, f.name)]
        array: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if self.mode == "named" or not self.parallel:
            array["maxItems"] = 1
        return _object({"tool_calls": array})

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (a batch line keeps it until its result is rendered)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolPlan:
        functions = tuple(Function(**f) for f in data["functions"])
        return cls(data["mode"], functions, data.get("named"), bool(data.get("parallel", True)))


def plan_tools(
    tools: Sequence[Mapping[str, Any]] | None, choice: object, parallel: bool | None = None
) -> ToolPlan:
    """Validate OpenAI-shaped ``tools`` and ``tool_choice``; raises ToolError."""
    functions = tuple(_function(t, i) for i, t in enumerate(tools or ()))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise ToolError("tools: function names must be unique", "tools")
    mode, named = _choice(choice, names)
    return ToolPlan(mode, functions, named, parallel is not False)


def with_tool_prompt(messages: list[dict[str, str]], plan: ToolPlan) -> list[dict[str, str]]:
    """``messages`` with the tools' system prompt (appended to a leading system message)."""
    if not plan.active:
        return messages
    prompt = plan.system_prompt()
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{prompt}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def calls_as_text(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant turn's OpenAI ``tool_calls`` in the prompt's shape."""
    calls = []
    for call in tool_calls:
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = function.get("arguments")
        calls.append({"name": function.get("name"), "arguments": arguments})
    return orjson.dumps({"tool_calls": calls}).decode()


def tool_result_text(content: str, tool_call_id: str | None) -> str:
    return f"Result of tool call {tool_call_id}: {content}" if tool_call_id else content


def parse_tool_calls(text: str, plan: ToolPlan, call_id_prefix: str) -> list[dict[str, Any]] | None:
    """OpenAI ``tool_calls`` from a reply, or None when it is not a call of known tools."""
    stripped = text.strip()
    if not plan.active or not stripped.startswith("{"):
        return None
    try:
        data = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None
    calls = data.get("tool_calls") if isinstance(data, dict) else None
    known = {f.name for f in plan.functions}
    if not isinstance(calls, list) or not calls or not all(_is_call(c, known) for c in calls):
        return None
    return [
        {
            "id": f"call_{call_id_prefix}_{i}",
            "type": "function",
            "function": {"name": c["name"], "arguments": orjson.dumps(c["arguments"]).decode()},
        }
        for i, c in enumerate(calls)
    ]


def _is_call(call: object, known: set[str]) -> bool:
    return (
        isinstance(call, dict)
        and call.get("name") in known
        and isinstance(call.get("arguments"), dict)
    )


def _function(tool: Mapping[str, Any], index: int) -> Function:
    where = f"tools.{index}"
    if tool.get("type") != "function" or not isinstance(tool.get("function"), Mapping):
        raise ToolError(f"{where}: only type 'function' tools are supported", f"{where}.type")
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError(
            f"{where}.function.name: give the function's name", f"{where}.function.name"
        )
    parameters = function.get("parameters") or ANY_OBJECT
    try:
        check_json_schema(parameters)
    except UnsupportedSchema as e:
        param = f"{where}.function.parameters"
        raise ToolError(f"{param}: {e}", param) from e
    return Function(name, str(function.get("description") or ""), dict(parameters))


def _choice(choice: object, names: list[str]) -> tuple[Mode, str | None]:
    if choice is None:
        return ("auto" if names else "none"), None
    modes: dict[object, Mode] = {"none": "none", "auto": "auto", "required": "required"}
    if isinstance(choice, str) and choice in modes:
        if choice == "required" and not names:
            raise ToolError("tool_choice: 'required' needs tools", "tool_choice")
        return modes[choice], None
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") == "function" and name in names:
            return "named", str(name)
        raise ToolError(f"tool_choice: no tool named {name!r} in tools", "tool_choice")
    raise ToolError("tool_choice: use none, auto, required or a named function", "tool_choice")


def _call_schema(function: Function) -> dict[str, Any]:
    return _object({"name": {"const": function.name}, "arguments": function.parameters})


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
