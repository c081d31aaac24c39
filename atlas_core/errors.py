"""Exceptions that reach users. Every message says what is wrong and what to change."""

from __future__ import annotations


class AtlasError(Exception):
    """Base class of every error Atlas raises on purpose (bad input, bad setup)."""


class ModelLoadError(AtlasError):
    """A model folder, file or repo id cannot be used; the message names the file and problem."""


class UnsupportedArchitectureError(ModelLoadError):
    """No installed family plugin handles the checkpoint's architecture."""


class PluginError(AtlasError):
    """A plugin could not be loaded, or a name is ambiguous between plugins."""


class BackendUnavailableError(AtlasError):
    """The requested backend cannot run here (missing library, no device)."""


class InvalidRequestError(AtlasError):
    """A request's parameters are out of range or inconsistent (maps to HTTP 400)."""


class ConfigError(AtlasError):
    """A setting (flag, ``ATLAS_*`` environment variable, model family default or config field)
    has a value that cannot be used; the message names the setting and what it accepts."""
