"""Grammar rules that enforce tool calls in a chat template's dialect (`tool_choice`).

- `required` (OpenAI; Anthropic `any`): the output is one or more calls, nothing else.
- a named function (OpenAI `{"type": "function", "function": {"name": …}}`, Anthropic
  `{"type": "tool", "name": …}`): one or more calls of that function only.
- `auto`: free text, optionally followed by calls. `none`: free text without calls.
- `parallel_tool_calls: false`: at most one call.

Dialects (see ninfer_nb.chat.tool_dialects): `qwen_xml` writes
`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`
with parameters in the schema's property order (required ones present); a parameter whose type
allows a string is raw text (`maxLength` and string `enum` / `const` enforced, nothing else),
any other parameter is JSON validated by its schema. `hermes_json` writes
`<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>` with the arguments validated by the
tool's schema, calls separated by one newline. `llama3_json` writes bare
`{"name": …, "parameters": {…}}` calls separated by "; ", and under `auto` either text that does
not start with `{` or calls only. This module knows nothing about matching.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_nb.structured.grammars import MarkerIds, lark_json, lark_marker, lark_string

__all__ = ["ToolSpec", "tool_call_rules", "tool_choice_mode", "tool_specs"]

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_SCHEMA_DEFS = ("$defs", "definitions")
# A raw XML string value ends at the first `</parameter>`; it may not close any other tag early.
_NO_EARLY_CLOSE = r"~/(?s:.*)<\/(parameter|function|tool_call)>(?s:.+)/"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    parameters: dict  # JSON schema of the arguments object


def tool_specs(tools: list[dict]) -> list[ToolSpec]:
    """Tools in the OpenAI (nested or flat) or Anthropic (`input_schema`) shape → specs."""
    specs = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise ValueError("each tool must be a JSON object")
        fn: dict = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        if not isinstance(name, str) or not name or any(c in name for c in "<>\n"):
            raise ValueError(f"tool name {name!r} cannot be enforced")
        params = fn.get("parameters") or fn.get("input_schema") or {"type": "object"}
        if not isinstance(params, dict):
            raise ValueError(f"tool {name!r}: parameters must be a JSON schema object")
        specs.append(ToolSpec(name, params))
    if not specs:
        raise ValueError("tool-call enforcement needs at least one tool")
    return specs


def tool_choice_mode(tool_choice: Any) -> tuple[str, str | None]:
    """(mode, forced function name): mode is "auto", "required" or "none"."""
    if tool_choice is None or tool_choice == "auto" or tool_choice == {"type": "auto"}:
        return "auto", None
    if tool_choice in ("required", "any", {"type": "any"}):
        return "required", None
    if tool_choice == "none" or tool_choice == {"type": "none"}:
        return "none", None
    if isinstance(tool_choice, dict):
        chosen: dict = tool_choice["function"] if isinstance(tool_choice.get("function"), dict) else tool_choice
        if isinstance(chosen.get("name"), str):
            return "required", chosen["name"]
    raise ValueError(f"unsupported tool_choice {tool_choice!r}")


def _schema_kinds(schema: Any) -> list[str]:
    """The JSON types a schema names (mirrors the XML parser's typing of raw values)."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [t for sub in schema[key] for t in _schema_kinds(sub)]
    return []


def _with_defs(schema: dict, root: dict) -> dict:
    """`schema` carrying the root's `$defs` / `definitions`, so `#/$defs/…` refs still resolve."""
    defs = {key: root[key] for key in _SCHEMA_DEFS if key in root and key not in schema}
    return {**schema, **defs} if defs else schema


def _xml_value_rules(rule: str, schema: Any, root: dict) -> list[str]:
    """Rules for `rule`: one parameter's value and its closing `\\n</parameter>`."""
    if not isinstance(schema, dict):
        schema = {}
    if "string" in _schema_kinds(schema):
        literals = [schema["const"]] if "const" in schema else schema.get("enum")
        if literals and all(isinstance(v, str) for v in literals):
            alternatives = " | ".join(lark_string(v + "\n</parameter>") for v in literals)
            return [f"{rule}: {alternatives}"]
        max_len = schema.get("maxLength")
        count = f"{{0,{int(max_len)}}}" if isinstance(max_len, int) and max_len >= 0 else "*"
        terminal = rule.upper()
        return [
            f"{rule}[lazy]: {terminal}",
            rf"{terminal}: /(?s:.){count}\n<\/parameter>/ & {_NO_EARLY_CLOSE}",
        ]
    return [f'{rule}: {lark_json(_with_defs(schema, root))} "\\n</parameter>"']


def _xml_call_rules(index: int, spec: ToolSpec, marker_ids: MarkerIds) -> list[str]:
    props = spec.parameters.get("properties")
    props = props if isinstance(props, dict) else {}
    required = set(spec.parameters.get("required") or ())
    params, rules = [], []
    for j, (key, sub) in enumerate(props.items()):
        if any(c in key for c in "<>\n"):
            raise ValueError(f"tool {spec.name!r}: parameter name {key!r} cannot be enforced")
        rule = f"param_{index}_{j}"
        opener = lark_string(f"<parameter={key}>\n")
        rules.append(f'{rule}: {opener} value_{index}_{j} "\\n"')
        rules += _xml_value_rules(f"value_{index}_{j}", sub, spec.parameters)
        params.append(rule if key in required else f"{rule}?")
    head = lark_string(f"\n<function={spec.name}>\n")
    open_, close = lark_marker(CALL_OPEN, marker_ids), lark_marker(CALL_CLOSE, marker_ids)
    body = " ".join([open_, head, *params, lark_string("</function>\n"), close])
    return [f"call_{index}: {body}", *rules]


def _json_call_schema(specs: list[ToolSpec], arguments_key: str) -> dict:
    """`{"name": NAME, <arguments_key>: {...}}` for any of the tools, their `$defs` at the root."""
    variants: list[dict] = []
    defs: dict = {}
    for spec in specs:
        args = {k: v for k, v in spec.parameters.items() if k not in _SCHEMA_DEFS}
        for key in _SCHEMA_DEFS:
            defs.update(spec.parameters.get(key) or {})
        variants.append({
            "type": "object",
            "properties": {"name": {"const": spec.name}, arguments_key: args},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        })
    schema: dict = {"anyOf": variants} if len(variants) > 1 else variants[0]
    return {**schema, "$defs": defs} if defs else schema


def tool_call_rules(
    tools: list[dict],
    *,
    dialect: str,
    tool_choice: Any = "required",
    parallel_tool_calls: bool = True,
    marker_ids: MarkerIds,
) -> list[str]:
    """Rules for `body`: the assistant content that `tool_choice` allows, in `dialect`."""
    mode, forced = tool_choice_mode(tool_choice)
    specs = tool_specs(tools)
    if forced is not None:
        specs = [s for s in specs if s.name == forced]
        if not specs:
            raise ValueError(f"tool_choice names {forced!r}, which is not among the tools")
    text = ["TEXT: /(?s:.+)/"]
    if mode == "none":
        return ["body: TEXT?", *text]
    if dialect == "qwen_xml":
        rules: list[str] = []
        for i, spec in enumerate(specs):
            rules += _xml_call_rules(i, spec, marker_ids)
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(specs))))
    elif dialect == "hermes_json":
        open_, close = lark_marker(CALL_OPEN, marker_ids), lark_marker(CALL_CLOSE, marker_ids)
        schema = lark_json(_json_call_schema(specs, "arguments"))
        rules = [f'call: {open_} "\\n" {schema} "\\n" {close}']
    elif dialect == "llama3_json":  # bare JSON calls; the parser reads them only at the start
        rules = [f"call: {lark_json(_json_call_schema(specs, 'parameters'))}"]
        calls = 'calls: call ("; " call)*' if parallel_tool_calls else "calls: call"
        if mode == "required":
            return ["body: calls", *rules, calls]
        return ["body: PLAIN_TEXT | calls", *rules, calls, "PLAIN_TEXT: /[^{](?s:.*)/"]
    else:
        raise ValueError(f"tool-call enforcement is not implemented for the {dialect!r} dialect")
    rules.append('calls: call ("\\n" call)*' if parallel_tool_calls else "calls: call")
    if mode == "required":
        return ["body: calls", *rules]
    return ["body: TEXT | TEXT? calls", *rules, *text]
