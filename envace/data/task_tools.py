"""The tools and the environment of a task record: their schemas checked and, where not given, derived.

This module owns the ``tools`` and ``environment`` fields: each tool's JSON schema is checked (a valid Draft 2020-12
object schema whose every ``$ref`` resolves within it; cached, checking is slow), tool names are unique and, for an
environment class, its public methods; without ``tools`` they are derived from the environment class. Problems are
raised as ``_FieldError`` naming the field (``envace.data.task_schema``).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from envace.data.task_schema import ENV_KEYS, _FieldError, _require_object
from envace.envs.real import EnvironmentClassError, import_class, is_toolbox, public_methods, tool_schemas_from_class
from envace.roles.parsing import json_type_name
from envace.types import EnvSpec, canonical_json

_DATA_KEYWORDS = ("const", "default", "enum", "examples")  # schema keywords whose values are data, not schemas


def _parse_tools(value: Any, environment: EnvSpec | None) -> tuple[dict[str, Any], ...]:
    """The task's tools: given explicitly, or derived from the environment class."""
    toolbox = environment is not None and is_toolbox(import_class(environment.class_path))
    if value is None:
        if environment is None or toolbox:
            need = ("no 'environment' is given" if environment is None else
                    "the environment is a toolbox (for an MCP server, `envace record` writes them)")
            raise _FieldError("tools", f"is required when {need}")
        try:
            return tuple(tool_schemas_from_class(import_class(environment.class_path)))
        except EnvironmentClassError as exc:
            raise _FieldError("environment.class_path", str(exc)) from exc
    if not isinstance(value, list):
        raise _FieldError("tools", f"must be a list of tool schemas, got {json_type_name(value)}")
    tools = tuple(_parse_tool(spec, f"tools[{i}]") for i, spec in enumerate(value))
    seen: set[str] = set()
    for i, spec in enumerate(tools):
        name = spec["function"]["name"]
        if name in seen:
            raise _FieldError(f"tools[{i}].function.name", f"duplicate tool name '{name}'")
        seen.add(name)
    if environment is not None and not toolbox:  # a toolbox's tools are known per instance only
        _check_tools_in_environment(tools, environment)
    return tools


def _parse_tool(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(value.get("function"), dict):
        raise _FieldError(field, 'must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
    function = value["function"]
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise _FieldError(f"{field}.function.name", "must be a non-empty string")
    if not isinstance(function.get("description", ""), str):
        raise _FieldError(f"{field}.function.description", "must be a string")
    _check_parameters(function.get("parameters"), f"{field}.function.parameters")
    return value


def _check_parameters(schema: Any, field: str) -> None:
    if not isinstance(schema, dict):
        raise _FieldError(field, "must be a JSON schema object")
    problem = _schema_problem(canonical_json(schema))
    if problem is not None:
        raise _FieldError(field, f"not a valid JSON schema{problem}")
    if schema.get("type") != "object":
        got = json.dumps(schema.get("type"))
        raise _FieldError(field, f'must be an object schema ("type": "object"), got type {got}')


@functools.lru_cache(maxsize=256)
def _schema_problem(schema_json: str) -> str | None:
    """Why a schema (given as canonical JSON; cached, checking is slow) is invalid, or None.

    Every ``$ref`` must resolve within the schema itself: envace never fetches a remote schema, and an unresolvable
    reference would otherwise fail only later, when a call is validated.
    """
    schema = json.loads(schema_json)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "" if not exc.path else f" at {'/'.join(str(p) for p in exc.path)}"
        return f"{where}: {exc.message}"
    resource = DRAFT202012.create_resource(schema)
    uri = resource.id() or "urn:envace:tool"
    resolver = Registry().with_resource(uri, resource).resolver(uri)
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{where}/{i}") for i, item in enumerate(node))
        elif isinstance(node, dict) and (node is schema or "$id" not in node):  # below a nested $id: its own base
            if isinstance(node.get("$ref"), str):
                try:
                    resolver.lookup(node["$ref"])
                except Unresolvable:
                    ref = json.dumps(node["$ref"])
                    return f" at {(where + '/$ref').lstrip('/')}: {ref} does not resolve within the schema"
            stack.extend((value, f"{where}/{key}") for key, value in node.items() if key not in _DATA_KEYWORDS)
    return None


def _check_tools_in_environment(tools: tuple[dict[str, Any], ...], environment: EnvSpec) -> None:
    methods = public_methods(import_class(environment.class_path))
    for i, spec in enumerate(tools):
        name = spec["function"]["name"]
        if name not in methods:
            raise _FieldError(
                f"tools[{i}].function.name",
                f"'{name}' is not a public method of environment class '{environment.class_path}'",
            )


def _parse_environment(value: Any, field: str) -> EnvSpec:
    _require_object(value, field, ENV_KEYS, required=("class_path",))
    class_path, init_args = value["class_path"], value.get("init_args", {})
    if not isinstance(class_path, str) or not all(part.isidentifier() for part in class_path.split(".")):
        got = json.dumps(class_path)
        raise _FieldError(f"{field}.class_path", f"must be a dotted path 'package.module.ClassName', got {got}")
    if not isinstance(init_args, dict):
        raise _FieldError(f"{field}.init_args", "must be a JSON object")
    try:
        import_class(class_path)
    except EnvironmentClassError as exc:
        raise _FieldError(f"{field}.class_path", str(exc)) from exc
    return EnvSpec(class_path=class_path, init_args=init_args)
