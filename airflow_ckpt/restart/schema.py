"""JSON Schema (draft 2020-12) of the restart-strategy params, for Airflow's ``Param``.

Use it as ``Param({...}, description=..., schema=restart_params_json_schema())`` so
the trigger form rejects bad
params before a run starts. It checks key names (both spellings), value shapes,
numeric ranges and that only the chosen type's options appear.
:func:`~airflow_ckpt.restart.params.parse_restart_params` stays authoritative:
ranges of duration *strings* and ``initial-backoff <= max-backoff`` (JSON Schema cannot
compare two values) are checked there only.

The parser at trigger time. Airflow validates every Param with
``jsonschema.validate(value, schema, format_checker=FormatChecker())``: when a run is
triggered (the api-server's ``create_dagrun``, for the UI's form and the REST API; the
same in ``dag.test()`` / ``airflow dags test``) and again when each task starts
(``process_params``). ``FormatChecker()`` asks every checker registered in the process.
So the schema's top level carries ``"format": "airflow-ckpt-restart-strategy"``, and
:func:`register_format_checker` registers a checker for it that runs the parser on the
whole object; a parser error becomes a ``jsonschema.ValidationError`` whose message is the
parser's own (``invalid restart strategy:`` and every bad key, the cross-field rules
included): the run is refused before any task starts, with the text the operator would
give at run time. A Param subclass cannot do this: Airflow serialises a DAG's params as
plain ``Param`` (a subclass fails to serialise) and validates them server-side with the
schema alone. Who registers: :func:`restart_params_json_schema` (every process that
parses a DAG using the schema) and the ``airflow_ckpt`` plugin module (the api-server,
which loads plugins at start and never parses DAG files). A process without the checker
ignores the unknown format and validates with the schema's own rules, as before.

Messages. Airflow validates params with plain ``jsonschema`` and shows the best error's
message, which for ``anyOf``/``type`` rules reads ``'fixd-delay' is not valid under any of
the given schemas`` or ``'1 s' is not of type 'null'``. So every rule here that can fail
is written as ``{"if": <accepted>, "else": {"not": {"$comment": <explanation>}}}``: the
failing ``not`` prints its schema, i.e. the explanation, which is the parser's own text
(:func:`~airflow_ckpt.restart.params.type_problem`, ``value_problem``,
``foreign_option_problem``), from the same :data:`OPTION_SPECS`. The form then says e.g.
``'1 s' should not be valid under {'$comment': "fixed-delay.delay: is an option of the
fixed-delay strategy, but type is exponential-delay; remove it or set type:
fixed-delay"}``. Unknown keys keep ``additionalProperties: false``, whose message names
the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_ckpt.errors import ConfigError
from airflow_ckpt.options import DURATION_UNITS, FLOAT_PATTERN, INT_PATTERN
from airflow_ckpt.restart._java import INT_MAX
from airflow_ckpt.restart.options import EXPONENTIAL_DELAY, STRATEGY_TYPES
from airflow_ckpt.restart.params import (
    DEFAULT_TYPE,
    OPTION_SPECS,
    PREFIX,
    TYPE_ALIASES,
    TYPE_KEYS,
    OptionSpec,
    foreign_option_problem,
    options_of,
    parse_restart_params,
    type_problem,
    value_problem,
)

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: The ``format`` of the whole object: the parser, when the checker is registered.
RESTART_STRATEGY_FORMAT = "airflow-ckpt-restart-strategy"


def check_restart_params(instance: object) -> bool:
    """The format checker: True, or ``jsonschema.ValidationError`` carrying the message of
    the parser's :class:`~airflow_ckpt.errors.ConfigError` (a non-object is left to the
    schema's ``"type": "object"``).

    It raises instead of returning False because jsonschema words a failed format as
    ``<value> is not a '<format>'``; a ``ValidationError`` raised by the checker leaves
    ``validate`` as it is, and Airflow shows its message (the SDK's ``Param.resolve``
    and the api-server's ``SerializedParamsDict.validate`` both catch it).
    """
    if not isinstance(instance, Mapping):
        return True
    try:
        parse_restart_params(instance)
    except ConfigError as exc:
        from jsonschema import ValidationError

        raise ValidationError(str(exc)) from None
    return True


def register_format_checker() -> None:
    """Make ``FormatChecker()`` (as Airflow builds it) run :func:`check_restart_params`
    for :data:`RESTART_STRATEGY_FORMAT` in this process. Idempotent; imports jsonschema
    here, so the restart package stays importable without it (in the Spark driver)."""
    from jsonschema import FormatChecker

    # the class-level registry FormatChecker() copies (FormatChecker.cls_checks, which
    # writes the same entry, is deprecated)
    FormatChecker.checkers[RESTART_STRATEGY_FORMAT] = (check_restart_params, ())


def _case_insensitive(text: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isascii() and c.isalpha() else c for c in text)


def _duration_pattern() -> str:
    units = sorted(DURATION_UNITS, key=len, reverse=True)
    alternatives = "|".join(_case_insensitive(unit) for unit in units)
    return rf"^\s*\d+(\.\d+)?\s*({alternatives})?\s*$"


def explained(accepted: dict[str, Any], key: str, problem: str) -> dict[str, Any]:
    """``accepted``, failing with ``problem`` as the message (see the module docstring)."""
    return {"if": accepted, "else": {"not": {"$comment": f"{key}: {problem}"}}}


def _value_schema(spec: OptionSpec) -> dict[str, Any]:
    number: dict[str, Any]
    if spec.kind == "duration":
        number = {"type": "number", "minimum": spec.minimum / 1000}
        string: dict[str, Any] = {"type": "string", "pattern": _duration_pattern()}
    elif spec.kind == "int":
        number = {"type": "integer", "minimum": int(spec.minimum), "maximum": INT_MAX}
        string = {"type": "string", "pattern": INT_PATTERN}
    else:
        number = {"type": "number"}
        number["exclusiveMinimum" if spec.exclusive_minimum else "minimum"] = spec.minimum
        if spec.maximum is not None:
            number["maximum"] = spec.maximum
        string = {"type": "string", "pattern": FLOAT_PATTERN}
    alternatives: list[dict[str, Any]] = [number, string, {"type": "null"}]
    if spec.infinite:
        alternatives.insert(0, {"const": "infinite"})
    return {
        "title": PREFIX + spec.key,
        "description": f"{spec.description} Only with type {spec.strategy}. "
        f"Allowed: {spec.allowed()}.",
        "default": spec.default,
        **explained({"anyOf": alternatives}, spec.key, value_problem(spec)),
    }


def _type_is(names: list[str]) -> dict[str, Any]:
    """Schema: some type key is present and its value is one of ``names`` (any case)."""
    pattern = "^(" + "|".join(_case_insensitive(n) for n in names) + ")$"
    return {
        "anyOf": [
            {"required": [key], "properties": {key: {"type": "string", "pattern": pattern}}}
            for key in TYPE_KEYS
        ]
    }


def _foreign(name: str, strategy: str, type_given: bool) -> dict[str, Any]:
    """Schema of option ``name`` (any spelling) when the type is ``strategy``: null only."""
    spec = OPTION_SPECS[name.removeprefix(PREFIX)]
    return explained({"type": "null"}, spec.key,
                     foreign_option_problem(spec, strategy, type_given))


def _all_names(keys: list[str]) -> list[str]:
    names: list[str] = []
    for key in keys:
        names.extend(TYPE_KEYS if key == "type" else (key, PREFIX + key))
    return names


def restart_params_json_schema() -> dict[str, Any]:
    """The JSON Schema of the params accepted by ``restart_strategy_from_params``; also
    registers the format checker that runs the parser (see the module docstring)."""
    register_format_checker()
    type_schema = {
        "title": "restart-strategy.type",
        "description": "Restart strategy. Default: exponential-delay (Flink 2.x's default "
        "with checkpointing).",
        "default": DEFAULT_TYPE,
        **explained({"anyOf": [
            {"type": "string",
             "pattern": "^(" + "|".join(_case_insensitive(t) for t in TYPE_ALIASES) + ")$"},
            {"type": "null"},
        ]}, "type", type_problem()),
    }
    properties: dict[str, Any] = {key: type_schema for key in TYPE_KEYS}
    for spec in OPTION_SPECS.values():
        sub = _value_schema(spec)
        properties[spec.key] = sub
        properties[PREFIX + spec.key] = sub

    rules: list[dict[str, Any]] = []
    for strategy in STRATEGY_TYPES:
        allowed_names = _all_names(options_of(strategy))
        # Options of other strategies may appear only with a null value.
        others = [name for name in properties
                  if name not in allowed_names and name not in TYPE_KEYS]
        forbid_others = {
            "properties": {name: _foreign(name, strategy, True) for name in others},
        }
        aliases = [alias for alias, canonical in TYPE_ALIASES.items() if canonical == strategy]
        rules.append({"if": _type_is(aliases), "then": forbid_others})
    # No (non-null) type: exponential-delay's options only.
    no_type = {
        "not": {
            "anyOf": [
                {"required": [key], "properties": {key: {"type": "string"}}} for key in TYPE_KEYS
            ]
        }
    }
    exp_names = _all_names(options_of(EXPONENTIAL_DELAY))
    rules.append(
        {
            "if": no_type,
            "then": {
                "properties": {
                    name: _foreign(name, EXPONENTIAL_DELAY, False)
                    for name in properties if name not in exp_names and name not in TYPE_KEYS
                }
            },
        }
    )
    return {
        "$schema": SCHEMA_DIALECT,
        # No top-level "description" / "default": Airflow serialises a Param as
        # default + description + schema and rebuilds it with the schema's keys spread
        # as keyword arguments, so repeating either breaks the DAG's deserialisation.
        "title": "Restart strategy (Flink options, 'restart-strategy.' prefix optional)",
        "type": "object",
        "format": RESTART_STRATEGY_FORMAT,
        "properties": properties,
        "additionalProperties": False,
        "allOf": rules,
        "examples": [
            {"type": "fixed-delay", "fixed-delay.attempts": 3, "fixed-delay.delay": "10 s"},
            {
                "type": "failure-rate",
                "failure-rate.max-failures-per-interval": 3,
                "failure-rate.failure-rate-interval": "5 min",
                "failure-rate.delay": "10 s",
            },
            {"type": "exponential-delay"},
        ],
    }
