"""Typed run options: each model adapter declares a table, and the user's `-o KEY=VALUE` strings
are parsed against it ONCE, into the typed values the runners receive in `RunRequest.options`.

    OPTIONS = OptionTable((
        Option("kernel_quant", "bool", False, "the kernels' FP8 / FP4 activation round trips", side="both"),
        Option("attention", "list", None, "CUDA SDPA kernels to try, in order", choices=KERNELS),
    ))
    OPTIONS.parse({"kernel_quant": "false"})   # -> {"kernel_quant": False, "attention": None}

Why a table: a string handed straight to a runner is read however that runner reads it
(`bool("false")` is True; a string iterated as a list of kernel names is a list of letters), and
a key nobody reads is silently ignored. Here an unknown key or a bad value is `BadInput` (exit 2)
naming what is known, and every default lives in one place.

An option's default may come from an environment variable (`env=`): the variable only supplies
the default, the parsed value is what reaches the runner and the manifest.

`validate_request(adapter, ...)` is the one check of a run's fault and options against the
adapter's tables; `runs.make_request` calls it. No torch here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from tensordiff.errors import BadInput
from tensordiff.pipeline.faults import Fault, find, refusal

TYPES = ("bool", "switch", "choice", "list", "str", "int")
SWITCH = ("off", "on", "auto")
SIDES = ("oracle", "engine", "both")
TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


def parse_bool(text: str, what: str) -> bool:
    v = text.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise BadInput(f"{what}: {text!r} is not a boolean (true/false, 1/0, yes/no)")


@dataclass(frozen=True)
class Option:
    """One run option: its name, type, default, one-line help and (for choice/list) allowed values."""

    name: str
    # one of TYPES; "list": comma-separated values, each one of `choices`; "switch": off|on|auto,
    # where every boolean spelling also says off or on
    type: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    side: str = "engine"  # which runner reads it: "oracle", "engine" or "both"
    env: str | None = None  # an environment variable that supplies the default (parsed like the value)
    aliases: tuple[str, ...] = ()  # older spellings still accepted

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"option {self.name}: type must be one of {TYPES}")
        if self.side not in SIDES:
            raise ValueError(f"option {self.name}: side must be one of {SIDES}")
        if self.type in ("choice", "list") and not self.choices:
            raise ValueError(f"option {self.name}: a {self.type} needs its choices")

    def parse(self, value: Any, what: str | None = None) -> Any:
        """A user's string (or an already typed value, from Python callers) -> the typed value."""
        what = what or f"option {self.name}"
        if value is None:
            return None
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            return parse_bool(str(value), what)
        if self.type == "switch":
            if isinstance(value, bool):
                return "on" if value else "off"
            v = str(value).strip().lower()
            if v == "auto":
                return v
            try:
                return "on" if parse_bool(v, what) else "off"
            except BadInput:
                raise BadInput(f"{what}: {value!r} is not one of off, on, auto (or a boolean)") from None
        if self.type == "int":
            if isinstance(value, bool):
                raise BadInput(f"{what}: expected an integer, not {value!r}")
            try:
                return int(value)
            except (TypeError, ValueError):
                raise BadInput(f"{what}: expected an integer, not {value!r}") from None
        if self.type == "list":
            items = [s.strip() for s in value.split(",")] if isinstance(value, str) else list(value)
            if not items or any(not s for s in items):
                raise BadInput(f"{what}: expected comma-separated values from {', '.join(self.choices)}, "
                               f"not {value!r}")
            for s in items:
                self._allowed(s, what)
            return tuple(items)
        if not isinstance(value, str):
            raise BadInput(f"{what}: expected a string, not {value!r}")
        if self.type == "choice":
            self._allowed(value.strip(), what)
            return value.strip()
        return value

    def _allowed(self, v: str, what: str) -> None:
        if v not in self.choices:
            raise BadInput(f"{what}: {v!r} is not one of {', '.join(self.choices)}")

    def default_value(self) -> Any:
        if self.env is not None:
            raw = os.environ.get(self.env)
            if raw is not None and raw.strip():
                return self.parse(raw, f"environment variable {self.env} (default of option {self.name})")
        return self.default

    @property
    def type_text(self) -> str:
        if self.type == "choice":
            return "|".join(self.choices)
        if self.type == "list":
            return "list of " + "|".join(self.choices)
        if self.type == "switch":
            return "|".join(SWITCH)
        return self.type

    @property
    def default_text(self) -> str:
        d = self.default
        text = "none" if d is None else ("true" if d is True else "false" if d is False else
                                         ",".join(d) if isinstance(d, tuple) else str(d))
        return f"{text} (or ${self.env})" if self.env else text


@dataclass(frozen=True)
class OptionTable:
    """A model's options. `parse` is strict (unknown keys refused); `resolve` fills defaults."""

    options: tuple[Option, ...] = ()

    def __post_init__(self):
        seen: set[str] = set()
        for o in self.options:
            for n in (o.name, *o.aliases):
                if n in seen:
                    raise ValueError(f"option name {n!r} declared twice")
                seen.add(n)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def get(self, name: str) -> Option | None:
        for o in self.options:
            if name == o.name or name in o.aliases:
                return o
        return None

    def known_text(self) -> str:
        return ", ".join(self.names) if self.options else "this model takes no options"

    def lookup(self, key: str, model: str) -> Option:
        o = self.get(key)
        if o is None:
            raise BadInput(f"unknown option {key!r} for {model} (known: {self.known_text()}; "
                           f"see `tensordiff options {model}`)")
        return o

    def parse(self, raw: Mapping[str, Any], model: str) -> dict[str, Any]:
        """User values (strings from `-o`, or typed values) -> every option, typed, defaults filled."""
        given: dict[str, Any] = {}
        for key, value in raw.items():
            o = self.lookup(key, model)
            if o.name in given:
                raise BadInput(f"option {o.name!r} given twice")
            given[o.name] = o.parse(value)
        return {o.name: given[o.name] if o.name in given else o.default_value() for o in self.options}

    def resolve(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """For runners: the request's options with every declared default filled in and declared
        values typed (a hand-built RunRequest may hold strings). Undeclared keys (a test's
        `image_rows`, calibrate's `sdpa`) pass through unchanged."""
        out = dict(options or {})
        for o in self.options:
            hit = next((k for k in (o.name, *o.aliases) if k in out), None)
            out[o.name] = o.parse(out.pop(hit)) if hit is not None else o.default_value()
        return out

    def for_side(self, options: Mapping[str, Any], side: str, *, undeclared: bool = False) -> dict[str, Any]:
        """The declared options the `side` runner reads (what its manifest records); with
        `undeclared`, also the keys no table declares (what an oracle cache key must hold: an
        engine-only option never changes the oracle's dump)."""
        out = {o.name: options.get(o.name) for o in self.options if o.side in (side, "both")}
        if undeclared:
            out.update({k: v for k, v in options.items() if self.get(k) is None})
        return out

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(name, type, default, side, help) per option, for `tensordiff options` and --help."""
        return [(o.name, o.type_text, o.default_text, o.side, o.help) for o in self.options]


NO_OPTIONS = OptionTable()


def parse_assignments(items: Iterable[str], flag: str = "--option") -> dict[str, str]:
    """`KEY=VALUE` strings (repeatable `-o`) -> {key: value}; the values stay strings."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"{flag} takes KEY=VALUE, not {item!r}")
        if key in out:
            raise BadInput(f"{flag} {key} given twice")
        out[key] = value.strip()
    return out


def validate_request(adapter, *, fault: str | None = None, options: Mapping[str, Any] | None = None,
                     prompt: str | None = None, chunk: int | None = None, decode: int = 0,
                     dtype: str = "float32", images: int = 1) -> tuple[Fault | None, dict[str, Any]]:
    """The run's fault and options checked against the adapter's tables, before anything runs.

    Returns (the Fault or None, the typed options with defaults). Raises BadInput for an unknown
    fault, a fault whose route this run does not take (it would report a silent MATCH), and an
    unknown option or a bad value."""
    table = getattr(adapter, "options", None) or NO_OPTIONS
    typed = table.parse(options or {}, adapter.name)
    if fault is None:
        return None, typed
    try:
        f = find(adapter.faults, fault)
    except KeyError:
        known = ", ".join(x.name for x in adapter.faults) or "none"
        raise BadInput(f"unknown fault {fault!r} for {adapter.name} (known: {known})") from None
    why = refusal(f, _Inputs(prompt, chunk, decode, dtype, images))
    if why is not None:
        raise BadInput(why)
    return f, typed


@dataclass(frozen=True)
class _Inputs:  # what a fault's needs are checked against (RunRequest's fields of the same names)
    prompt: str | None
    chunk: int | None
    decode: int
    dtype: str
    images: int = 1  # how many images the prompt holds


def fault_refusal(adapter, fault: str, *, prompt: str | None = None, chunk: int | None = None, decode: int = 0,
                  dtype: str = "float32", images: int = 1) -> str | None:
    """Why a run of `adapter` with these inputs cannot exercise `fault` (None: it can). A gate
    plants a fault only in the cases it can reach."""
    try:
        f = find(adapter.faults, fault)
    except KeyError:
        return f"{adapter.name} has no fault {fault!r}"
    return refusal(f, _Inputs(prompt, chunk, decode, dtype, images))


def oracle_option(adapter, key: str, value: Any, what: str) -> tuple[str, Any]:
    """One option an oracle-only run (calibrate's `--variant KEY=VALUE`) changes: (name, typed value).
    Refused: a key the table does not know, and an engine-only option (it would change nothing)."""
    table = getattr(adapter, "options", None) or NO_OPTIONS
    o = table.get(key)
    if o is None:
        raise BadInput(f"{what}: {key!r} is not dtype, sdpa or an option of {adapter.name} "
                       f"(options: {table.known_text()})")
    if o.side == "engine":
        raise BadInput(f"{what}: option {o.name} is read by the engine only; the oracle would not change")
    return o.name, o.parse(value, what)


def render(adapter) -> str:
    """The option table as text (`tensordiff options MODEL`, `check --help`)."""
    table = getattr(adapter, "options", None) or NO_OPTIONS
    if not table.options:
        return f"{adapter.name}: no options"
    lines = [f"{adapter.name} options (-o NAME=VALUE; booleans: true/false, 1/0, yes/no):"]
    for name, typ, default, side, help_ in table.rows():
        reader = "oracle and engine" if side == "both" else side
        lines.append(f"  {name} = {typ}   default {default}; read by the {reader}")
        lines.append(f"      {help_}")
    return "\n".join(lines)
