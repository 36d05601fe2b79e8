"""Tools and tool_choice, for the gateway and batches: what they mean for the prompt,
for decoding, and for reading the answer.

A model whose chat template takes tools gets them through its template and calls them
in its own format (``format``: hermes, llama3_json, mistral; ``tool_formats``). Any
other model gets them as a system message (the fallback prompt below), and a reply that
calls tools is one JSON object (``format`` ``json``)::

    {"tool_calls": [{"name": "<function>", "arguments": {...}}]}

``tool_choice`` ``required`` or a named function constrains decoding to calls in that
format, with each function's ``parameters`` as the arguments' schema (strict ones as
OpenAI's strict mode reads them), so the arguments always validate; ``auto`` leaves the
model free and reads calls from its reply. In the fallback, earlier assistant
``tool_calls`` and ``role: "tool"`` results go back into the conversation as text in
the same shape, so multi-turn conversations work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from producer.openai.tool_formats import Format
from producer.openai.tool_grammar import Think, calls_grammar
from shared.guided import UnsupportedSchema, check_json_schema, closed_schema, strict_schema

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
    strict: bool = False

    def arguments_schema(self) -> dict[str, Any]:
        """The schema calls are decoded to: strict as OpenAI reads it, else closed to
        the declared properties where it is silent (as vLLM does)."""
        return (strict_schema if self.strict else closed_schema)(self.parameters)


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools and tool_choice mean for its prompt, decoding and answer."""

    mode: Mode
    functions: tuple[Function, ...]
    named: str | None = None
    parallel: bool = True
    format: Format = "json"

    @property
    def active(self) -> bool:
        return self.mode != "none" and bool(self.functions)

    @property
    def native(self) -> bool:
        """The tools go through the model's chat template (else the fallback prompt)."""
        return self.format != "json"

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named") and bool(self.functions)

    def offered(self) -> list[Function]:
        return [f for f in self.functions if self.named in (None, f.name)]

    def system_prompt(self) -> str:
        listed = [
            {"name": f.name, "description": f.description, "parameters": f.parameters}
            for f in self.offered()
        ]
        rule = RULES[self.mode].format(name=self.named)
        return TOOL_PROMPT.format(tools=orjson.dumps(listed).decode(), rule=rule)

    def guide(self, think: Think | None = None) -> dict[str, Any] | None:
        """The sampling field that forces calls for required / named choices (None for
        auto): the fallback's guided_json, or a structural tag in the model's format
        (after its reasoning, ``think``, when it has some)."""
        if not self.forced:
            return None
        single = self.mode == "named" or not self.parallel
        if self.format == "json":
            return {"guided_json": self._fallback_schema(single)}
        functions = [(f.name, f.arguments_schema()) for f in self.offered()]
        return {"guided_structural_tag": calls_grammar(self.format, functions, not single, think)}

    def _fallback_schema(self, single: bool) -> dict[str, Any]:
        calls = [_call_schema(f) for f in self.offered()]
        array: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if single:
            array["maxItems"] = 1
        return _object({"tool_calls": array})

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The functions as a chat template takes them (native tools, not ``none``)."""
        if not (self.native and self.active):
            return None
        return [
            {"name": f.name, "description": f.description, "parameters": f.parameters}
            for f in self.functions
        ]

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (a batch line keeps it until its result is rendered)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolPlan:
        functions = tuple(Function(**f) for f in data["functions"])
        parallel = bool(data.get("parallel", True))
        return cls(data["mode"], functions, data.get("named"), parallel, data.get("format", "json"))


def plan_tools(
    tools: Sequence[Mapping[str, Any]] | None,
    choice: object,
    parallel: bool | None = None,
    fmt: Format = "json",
) -> ToolPlan:
    """Validate OpenAI-shaped ``tools`` and ``tool_choice`` (for a model that writes
    calls the ``fmt`` way); raises ToolError."""
    functions = tuple(_function(t, i) for i, t in enumerate(tools or ()))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise ToolError("tools: function names must be unique", "tools")
    mode, named = _choice(choice, names)
    return ToolPlan(mode, functions, named, parallel is not False, fmt)


def with_tool_prompt(messages: list[dict[str, Any]], plan: ToolPlan) -> list[dict[str, Any]]:
    """``messages`` with the fallback prompt (appended to a leading system message), for a
    model whose template does not take tools."""
    if not plan.active or plan.native:
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
        arguments = parsed_arguments(function.get("arguments") or "{}")
        calls.append({"name": function.get("name"), "arguments": arguments})
    return orjson.dumps({"tool_calls": calls}).decode()


def parsed_arguments(arguments: str) -> dict[str, Any] | str:
    """A call's arguments as an object (chat templates write them as JSON); the text
    itself when it is not a JSON object."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


def tool_result_text(content: str, tool_call_id: str | None) -> str:
    return f"Result of tool call {tool_call_id}: {content}" if tool_call_id else content


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
    strict = function.get("strict") is True
    return Function(name, str(function.get("description") or ""), dict(parameters), strict)


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
    return _object({"name": {"const": function.name}, "arguments": function.arguments_schema()})


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
