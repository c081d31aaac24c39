"""`option`: declare a config dataclass field as a setting; `options_of`: the settings of classes.

    @dataclass
    class EngineConfig:
        max_num_seqs: int = option(64, help="most sequences in one batch")

declares ``--max-num-seqs`` / ``ATLAS_MAX_NUM_SEQS``, parsed as an int, shown in ``--help`` as
``most sequences in one batch (default: 64)``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any, get_type_hints

from atlas_core.errors import ConfigError
from atlas_core.options.parsers import Parser, parser_for

ENV_PREFIX = "ATLAS_"
METADATA_KEY = "atlas_option"


@dataclass(frozen=True)
class OptionInfo:
    """What `option` records in a field's metadata.

    ``help``: one phrase, without the default. ``default_help``: how ``--help`` states the default
    when the value alone says too little (None: the value, formatted). ``flag``: the flag name
    without dashes (None: the field name with ``-`` for ``_``); the environment variable follows
    it. ``repeat``: a list given by repeating the flag (``--api-key A --api-key B``) rather than
    as several values after one flag. ``positional``: an optional positional argument.
    ``aliases``: other flag names (without dashes) accepted for the same setting, such as the names
    other servers use for it (``max-model-len`` for ``max-seq-len``); they get no environment variable.
    """

    help: str
    default_help: str | None = None
    flag: str | None = None
    metavar: str | None = None
    repeat: bool = False
    positional: bool = False
    aliases: tuple[str, ...] = ()


def option(
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    help: str,
    default_help: str | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    repeat: bool = False,
    positional: bool = False,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A `dataclasses.field` (``default``, or ``default_factory`` for lists and dicts) that is also
    a setting (see `OptionInfo` for the other arguments)."""
    metadata = {METADATA_KEY: OptionInfo(help, default_help, flag, metavar, repeat, positional, aliases)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Option:
    """One setting: the field ``name`` of ``owner``, its parsed type and its declaration."""

    name: str
    owner: type
    info: OptionInfo
    kind: type
    choices: tuple[str, ...] | None
    parse: Parser
    default: Any

    @property
    def flag_name(self) -> str:
        """``max-num-seqs`` (no dashes in front)."""
        return self.info.flag or self.name.replace("_", "-")

    @property
    def env_name(self) -> str:
        """``ATLAS_MAX_NUM_SEQS``."""
        return ENV_PREFIX + self.flag_name.replace("-", "_").upper()

    @property
    def help_text(self) -> str:
        """The help phrase with the default: ``most sequences in one batch (default: 64)``."""
        return f"{self.info.help} (default: {self.info.default_help or describe_value(self.default)})"

    def parse_env(self, text: str) -> Any:
        """The value of the environment variable's ``text``; `ConfigError` naming the variable and
        what it accepts when it cannot be parsed."""
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ConfigError(f"environment variable {self.env_name}: {exc}") from None


def describe_value(value: Any) -> str:
    """How ``--help`` shows a default: ``on``/``off``, ``none``, ``0.9``, ``{}``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == []:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def options_of(*classes: type) -> list[Option]:
    """The settings declared on the dataclasses ``classes``, in declaration order; `TypeError` for
    a setting whose type has no parser, `ValueError` for a name declared twice."""
    options: list[Option] = []
    for cls in classes:
        hints = get_type_hints(cls)
        for field in dataclasses.fields(cls):
            info = field.metadata.get(METADATA_KEY)
            if info is None:
                continue
            kind, choices, parse = parser_for(hints[field.name])
            default = field.default_factory() if field.default_factory is not MISSING else field.default
            options.append(Option(field.name, cls, info, kind, choices, parse, default))
    names = [o.name for o in options]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"settings declared more than once: {', '.join(repeated)}")
    return options


def check_choices(instance: Any) -> None:
    """`ConfigError` if a setting of the dataclass ``instance`` with choices holds another value."""
    for opt in options_of(type(instance)):
        value = getattr(instance, opt.name)
        if opt.choices is not None and value is not None and value not in opt.choices:
            raise ConfigError(f"{opt.name} must be one of {', '.join(opt.choices)}, got {value!r}")
