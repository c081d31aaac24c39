"""`Settings`: each setting's value and where it came from, by precedence flag > environment >
model family default > built-in default."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from atlas_core.options.declare import Option


class Settings:
    """Resolved values of ``options``, each with its source in `sources` (``flag``, ``env``,
    ``family`` or ``default``): ``given`` (flags, by setting name) first, then the
    environment (``env``, default `os.environ`; an empty variable counts as unset), then the
    declared defaults. `apply_family_defaults` adds the family layer afterwards.

    An environment value that cannot be parsed is a `ConfigError` naming the variable and what it
    accepts.
    """

    def __init__(
        self, options: Sequence[Option], given: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> None:
        env = os.environ if env is None else env
        self.options = {opt.name: opt for opt in options}
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        for opt in options:
            if given.get(opt.name) is not None:
                self.values[opt.name], self.sources[opt.name] = given[opt.name], "flag"
            elif env.get(opt.env_name, "") != "":
                self.values[opt.name], self.sources[opt.name] = opt.parse_env(env[opt.env_name]), "env"
            else:
                self.values[opt.name], self.sources[opt.name] = opt.default, "default"

    def apply_family_defaults(self, family_defaults: Mapping[str, Any], fixed: Collection[str] = ()) -> list[str]:
        """Use the family's value for every setting still at its built-in default; returns the
        family keys that name no setting, or one in ``fixed`` (settings already used), for a warning."""
        unknown = []
        for name, value in family_defaults.items():
            if name not in self.options or name in fixed:
                unknown.append(name)
            elif self.sources[name] == "default":
                self.values[name], self.sources[name] = value, "family"
        return unknown

    def of(self, owner: type) -> dict[str, Any]:
        """The values of the settings declared on ``owner``, by field name (for ``owner(**...)``)."""
        return {name: self.values[name] for name, opt in self.options.items() if opt.owner is owner}

    def __getitem__(self, name: str) -> Any:
        return self.values[name]
