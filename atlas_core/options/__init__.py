"""Settings declared once, on config dataclasses, and exposed from there.

A field declared with `option` (``atlas_core.options.declare``) is a setting: its type picks the
one parser that reads it from text, and its metadata carries the help text, the flag name
(default: the field name with ``-`` for ``_``), a metavar and how a list is given. From that one
declaration come the command-line flag and its ``--help`` line with the default
(``atlas_core.options.flags``), the ``ATLAS_*`` environment variable, and the precedence flag >
environment > model family default > built-in default (``atlas_core.options.resolve``). Fields
without `option` are internal and get neither a flag nor a variable.
"""
