"""A batch line's tools: OpenAI's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` or
Anthropic's ``tools`` / ``tool_choice``, checked and reduced to one :class:`Tools` value, which is
part of the line's request (so of its answer's name in the result store).

A forced call (OpenAI ``tool_choice: "required"`` or a named function; Anthropic ``{"type":
"any"}`` or ``{"type": "tool", "name": ...}``) runs on any model as vLLM's own OpenAI server runs
it: the answer is JSON under the schema :meth:`Tools.schema` builds (vLLM's
``get_json_schema_from_tools``: an array of ``{name, parameters}`` for any tool, the tool's
parameters for a named one), and that JSON becomes the tool calls. ``auto`` needs the model's
tool-call parser, which is not run here: such a line is refused, naming ``tools`` and the fix
(force the call). In every case the tools are given to the
model's chat template (:meth:`Tools.template_tools`), as vLLM's server gives them. Example::

    tools = line_tools(body, "openai_batch", "body", False)   # None: the line has no tools; raises ToolError
    tools.schema()                                      # the answer's JSON schema (None: auto, none)
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import msgspec

#: OpenAI's rule for a function's name (Anthropic's is the same).
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
Choice = Literal["auto", "required", "named", "none"]


class ToolError(ValueError):
    """Why a line's tools cannot run: ``bad_request: ...`` or ``unsupported: ...``."""


class ToolDef(msgspec.Struct, frozen=True, omit_defaults=True):
    """One function the model may call: its name, description and parameters' JSON schema."""

    name: str
    parameters: dict[str, Any]
    description: str | None = None


class Tools(msgspec.Struct, frozen=True, omit_defaults=True):
    """A line's tools and how it asks for them: ``choice`` ``auto`` (the model decides: needs
    the tool-call parser), ``required`` (at least one call), ``named`` (a call of ``name``) or
    ``none`` (the tools are shown, never called); ``parallel``: False allows one call only."""

    defs: list[ToolDef]
    choice: Choice
    name: str | None = None
    parallel: bool = True

    def forced(self) -> bool:
        """Whether the answer is a tool call by construction (its JSON under :meth:`schema`)."""
        return self.choice in ("required", "named")

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema a forced answer is generated under (vLLM's, for the same request)."""
        if self.choice == "named":
            return _params(next(d for d in self.defs if d.name == self.name).parameters)
        if self.choice != "required":
            return None
        # Each tool's ``$defs`` move to the top, where its ``$ref``s ("#/$defs/...") now point.
        defs: dict[str, Any] = {}
        shapes = []
        for d in self.defs:
            params = dict(d.parameters)
            for name, sub in (params.pop("$defs", None) or {}).items():
                if defs.setdefault(name, sub) != sub:
                    raise ToolError(f"bad_request: the tools define $defs {name!r} twice, differently: give one "
                                    "definition")
            shapes.append({"properties": {"name": {"type": "string", "enum": [d.name]}, "parameters": _params(params)},
                           "required": ["name", "parameters"]})
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": shapes}}
        if not self.parallel:
            schema["maxItems"] = 1
        if defs:
            schema["$defs"] = defs
        return schema

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as a chat template takes them (``apply_chat_template(tools=...)``)."""
        out = []
        for d in self.defs:
            function: dict[str, Any] = {"name": d.name}
            if d.description is not None:
                function["description"] = d.description
            function["parameters"] = d.parameters
            out.append({"type": "function", "function": function})
        return out

    def calls(self, text: str) -> list[tuple[str, str]] | None:
        """A forced answer's calls as (name, arguments JSON); None: the text is no such call (cut)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if self.choice == "named":
            return [(str(self.name), json.dumps(data, ensure_ascii=False))] if isinstance(data, dict) else None
        if not isinstance(data, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                 for c in data):
            return None
        return [(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in data]


def _params(parameters: dict[str, Any]) -> dict[str, Any]:
    # Empty or missing parameters still make the arguments a JSON object (vLLM's rule).
    return parameters if parameters else {"type": "object", "properties": {}}


def line_tools(body: dict[str, Any], fmt: str, where: str, has_output: bool) -> Tools | None:
    """:func:`parse_tools`, and refused where they cannot run here: ``auto`` (the model decides,
    which needs its tool-call parser) and a forced call with a ``response_format`` of its own."""
    tools = parse_tools(body, fmt, where)
    if tools is not None and tools.choice == "auto":
        raise ToolError(f"unsupported: {where}.tools with tool_choice auto: it needs the model's tool-call parser; "
                        "force the call instead (OpenAI tool_choice \"required\" or a named function, Anthropic "
                        "{\"type\": \"any\"} or {\"type\": \"tool\", \"name\": ...})")
    if tools is not None and tools.forced() and has_output:
        raise ToolError(f"unsupported: {where}.response_format with a forced tool call ({where}.tool_choice): the "
                        "call's arguments follow the tool's schema; leave response_format out")
    return tools


def parse_tools(body: dict[str, Any], fmt: str, where: str) -> Tools | None:
    """The line's tools, checked; None when it has none (or an empty list and no choice)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw in (None, []):
        if choice not in (None, "none", {"type": "none"}, {"type": "auto"}, "auto"):
            raise ToolError(f"bad_request: {where}.tool_choice={json.dumps(choice)[:60]} needs {where}.tools")
        return None
    if not isinstance(raw, list):
        raise ToolError(f"bad_request: {where}.tools is not a list")
    defs = [_openai_tool(t, f"{where}.tools[{i}]") if fmt == "openai_batch" else
            _anthropic_tool(t, f"{where}.tools[{i}]") for i, t in enumerate(raw)]
    names = [d.name for d in defs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ToolError(f"bad_request: {where}.tools names {dup!r} twice: tool names are unique")
    kind, name, parallel = _openai_choice(body, where) if fmt == "openai_batch" else _anthropic_choice(choice, where)
    if name is not None and name not in names:
        raise ToolError(f"bad_request: {where}.tool_choice names {name!r}, which is not in {where}.tools "
                        f"({', '.join(names)})")
    tools = Tools(defs=defs, choice=kind, name=name, parallel=parallel)
    tools.schema()  # raises ToolError where the tools' schemas cannot make one
    return tools


def _openai_tool(tool: Any, where: str) -> ToolDef:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise ToolError(f"unsupported: {where}.type {kind!r}: only function tools run")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ToolError(f"bad_request: {where}.function is missing or not an object")
    return _tool(fn.get("name"), fn.get("description"), fn.get("parameters"), f"{where}.function", "parameters")


def _anthropic_tool(tool: Any, where: str) -> ToolDef:
    if not isinstance(tool, dict):
        raise ToolError(f"bad_request: {where} is not an object")
    if tool.get("type") not in (None, "custom"):  # server tools (web search, code execution...) run at Anthropic
        raise ToolError(f"unsupported: {where}.type {tool.get('type')!r}: only client tools (name, input_schema) run")
    if "input_schema" not in tool:
        raise ToolError(f"bad_request: {where}.input_schema is required")
    return _tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), where, "input_schema")


def _tool(name: Any, description: Any, parameters: Any, where: str, key: str) -> ToolDef:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolError(f"bad_request: {where}.name={json.dumps(name)[:60]}: a tool's name is 1-64 letters, digits, "
                        "_ or -")
    if description is not None and not isinstance(description, str):
        raise ToolError(f"bad_request: {where}.description is not a string")
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ToolError(f"bad_request: {where}.{key} must be a JSON schema of type object")
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(parameters).check_schema(parameters)
    except SchemaError as exc:
        raise ToolError(f"bad_request: {where}.{key} is not a valid JSON schema: {exc.message}") from None
    return ToolDef(name=name, parameters=parameters, description=description)


def _openai_choice(body: dict[str, Any], where: str) -> tuple[Choice, str | None, bool]:
    choice, parallel = body.get("tool_choice"), body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError(f"bad_request: {where}.parallel_tool_calls is not a boolean")
    if choice in (None, "auto", "required", "none"):
        return choice or "auto", None, parallel is not False  # type: ignore[return-value]
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        return "named", choice["function"]["name"], parallel is not False
    raise ToolError(f"bad_request: {where}.tool_choice={json.dumps(choice)[:60]}: \"none\", \"auto\", \"required\" "
                    "or {\"type\": \"function\", \"function\": {\"name\": ...}}")


def _anthropic_choice(choice: Any, where: str) -> tuple[Choice, str | None, bool]:
    if choice is None:
        return "auto", None, True
    kinds = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
    if not isinstance(choice, dict) or choice.get("type") not in kinds or set(choice) - {
            "type", "name", "disable_parallel_tool_use"}:
        raise ToolError(f"bad_request: {where}.tool_choice={json.dumps(choice)[:60]}: {{\"type\": \"auto\"}}, "
                        "{\"type\": \"any\"}, {\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}")
    name = choice.get("name")
    if choice["type"] == "tool" and not isinstance(name, str):
        raise ToolError(f"bad_request: {where}.tool_choice.name is required with type 'tool'")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolError(f"bad_request: {where}.tool_choice.disable_parallel_tool_use is not a boolean")
    return kinds[choice["type"]], name if choice["type"] == "tool" else None, parallel is not True  # type: ignore[return-value]
