"""The plug points of Atlas, as pluggy hook specifications (project name ``atlas``).

A plugin is a module named by an entry point in the ``atlas`` group of its distribution::

    [project.entry-points.atlas]
    my_family = "atlas_model_foo.plugin"

The module defines functions decorated with :data:`hookimpl`. Every hook here is a
*registration* hook: it is called once per process, in the process that serves the model
(the API server / engine process), when Atlas first needs the plugin registry. It receives a
``register`` callable and calls it with a name and a ``"module:Attribute"`` string. The target
is imported only when that name is selected, so listing plugins never imports heavy libraries
(CuPy, NCCL) and never touches a GPU.

Each registration may pass keyword metadata (shown by ``atlas plugins``): the keys each hook
accepts, and their types, are declared in `HOOK_METADATA`; any other key, a value of another type
or a missing required key makes the ``register`` call raise. Hooks return nothing; exceptions
raised by one plugin's hook are reported for that plugin and do not affect the others. See
``docs/plugin-hooks.md`` for a worked example of each hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import pluggy

PROJECT_NAME = "atlas"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class Register(Protocol):
    """The callable every registration hook receives.

    ``register(name, target, **metadata)``: ``name`` is the public name users select
    (``--backend cuda``, a config's ``model_type``); ``target`` is ``"package.module:Attribute"``;
    ``metadata`` keys and types are those `HOOK_METADATA` declares for the hook's kind, else
    `atlas_core.errors.PluginError` is raised.
    """

    def __call__(self, name: str, target: str, **metadata: Any) -> None: ...


@hookspec
def register_gpu_backends(register: Register) -> None:
    """Register array backends (the GpuBackend plug point).

    Target: a subclass of :class:`atlas_core.backends.base.Backend` implementing every op of
    the reference contract (``docs/ops.md``), checked by the backend-conformance suite.

    Metadata:
      ``priority`` (int, default 0): automatic selection tries available backends from the highest
      priority down; the core ``numpy`` backend has priority 0, so a GPU backend uses e.g. 100.

    The class's ``availability()`` classmethod is called (after import) only when the backend is
    a selection candidate; it must return why it cannot run instead of raising.
    """


@hookspec
def register_model_loaders(register: Register) -> None:
    """Register model families (the ModelWeightLoader plug point).

    ``name`` is a Hugging Face ``model_type`` from ``config.json`` (``llama``, ``qwen3``...); GGUF
    files map ``general.architecture`` to the same names. Target: a subclass of
    :class:`atlas_core.model.loader.ModelWeightLoader` that maps the family's config and weight
    names onto layers and returns a :class:`atlas_core.model.transformer.TransformerModel`.

    Metadata:
      ``architectures`` (list[str]): the ``architectures`` entries handled, for error messages.
      ``defaults`` (dict): per-family serving defaults (e.g. ``tool_call_parser``).
    """


@hookspec
def register_layers(register: Register) -> None:
    """Register per-layer compute types (the TransformerLayer plug point).

    Target: a class that family loaders construct and compose. Core registers its layers under
    the names of ``atlas_core.builtin_plugin.CORE_LAYERS`` (``rms_norm``, ``attention``,
    ``swiglu_mlp``, ``moe``, ``mla``, ``mamba2``, ...; contracts in docs/plugin-hooks.md). The
    kinds of layer that families exchange have Protocols: token mixers are called as
    ``layer(x, batch, kv) -> out`` (`atlas_core.model.transformer.Mixer`), norms as
    ``layer(x, residual=None) -> (normed, stream)`` (`atlas_core.model.transformer.Norm`),
    feed-forwards as ``layer(x) -> out`` (`atlas_core.model.transformer.FeedForward`), routed
    experts as ``layer(x, weights, ids) -> out`` (`atlas_core.model.layers.moe.Experts`), decoder
    layers as ``layer(hidden, residual, batch, kv) -> (hidden, residual)``
    (`atlas_core.model.transformer.DecoderLayer`). Loaders look layer
    types up by name (`ModelWeightLoader.layer_type`), so a new attention variant or mixer ships
    as a layer plugin that any family can compose; constructor arguments are agreed between the
    layer and the loaders that use it.
    """


@hookspec
def register_comm_backends(register: Register) -> None:
    """Register collective-communication backends (the CommBackend plug point).

    Target: a subclass of :class:`atlas_core.comm.CommBackend` (built per rank with ``connect(rendezvous,
    backend)``; ``all_reduce``, ``all_gather``, ``broadcast``, ``send``/``recv`` across ranks). Core ships
    ``single`` (one rank) and ``cpu`` (NumPy arrays over TCP); atlas-comm-nccl ships ``nccl``. A split
    model uses ``--comm-backend``, else ``cpu`` on the numpy backend and ``nccl`` otherwise. Called in
    every rank's process.
    """


@hookspec
def register_storage_backends(register: Register) -> None:
    """Register KV-cache spill tiers (the StorageBackend plug point).

    Target: a subclass of :class:`atlas_core.storage.StorageBackend`, constructed as ``cls(spec)``
    from a :class:`atlas_core.storage.TierSpec`, that stores fixed-format records (KV blocks, recurrent
    states) in caller-chosen slots and reports lost ones on read. Called in the engine process. Core's
    host-memory tier is built in; the engine looks up ``nvme`` (atlas-storage-nvme) for ``kv_spill_dir``.
    """


@hookspec
def register_op_groups(register: Register) -> None:
    """Register op groups: sets of backend ops beyond the core contract (MoE routing and experts,
    latent attention, gated delta rule, Mamba-2 scan, or a plugin's own).

    Target: a subclass of :class:`atlas_core.backends.ops.OpGroup` whose ``name`` equals the
    registered name; its methods are the group's interface and their bodies the host fallback
    (NumPy references run on host copies), so every backend runs every group. Layers get a group
    with ``backend.ops(GroupClass)``. Core registers ``moe``, ``mla``, ``gated_delta``, ``mamba2``.
    """


@hookspec
def register_op_implementations(register: Register) -> None:
    """Register a backend's native implementation of an op group.

    ``name`` is the op group's name; target: a subclass of that group's class overriding the ops
    it runs natively (the others keep the host fallback). A hardware plugin registers its kernels
    for core's groups; a family plugin may register kernels for its own group.

    Metadata:
      ``backend`` (str, required): the backend name the implementation is for (``cuda``...).
    """


@hookspec
def register_tool_parsers(register: Register) -> None:
    """Register tool-call formats: how a model writes tool calls as text, read back into calls.

    ``name`` is what a family's ``defaults`` (``tool_call_parser``) and ``--tool-call-parser``
    select. Target: a subclass of :class:`atlas_core.parsing.tools.base.ToolFormat` whose ``name``
    equals the registered name, constructed with no arguments: its markers, ``parse`` (markup ->
    raw calls) and ``grammar`` (llguidance rules generating the markup for ``tool_choice``).
    Core registers the formats several families share (``hermes``, ``json``, ``mistral``,
    ``nemotron``, ``qwen3_coder``); a format only one family writes ships with that family.
    """


@hookspec
def register_reasoning_parsers(register: Register) -> None:
    """Register reasoning formats: the markers around a model's reasoning.

    ``name`` is what a family's ``defaults`` (``reasoning_parser``) and ``--reasoning-parser``
    select. Target: an instance of :class:`atlas_core.parsing.reasoning.ReasoningFormat` whose
    ``name`` equals the registered name. Core registers ``qwen3``, ``deepseek_r1`` and ``mistral``.
    """


HOOK_KINDS: dict[str, str] = {
    "register_gpu_backends": "backend",
    "register_model_loaders": "model",
    "register_layers": "layer",
    "register_comm_backends": "comm",
    "register_storage_backends": "storage",
    "register_op_groups": "op_group",
    "register_op_implementations": "op_impl",
    "register_tool_parsers": "tool_parser",
    "register_reasoning_parsers": "reasoning_parser",
}
"""Hook name -> the registry kind its registrations populate."""


@dataclass(frozen=True)
class MetadataKey:
    """One keyword a registration hook accepts: ``type`` is a type expression (``int``,
    ``list[str]``, ``dict[str, Any]``, ``str | None``) that the value must match strictly (``True``
    is not an ``int``, ``"3"`` is not a number); a ``required`` key must be given."""

    type: Any
    required: bool = False


HOOK_METADATA: dict[str, dict[str, MetadataKey]] = {
    "backend": {"priority": MetadataKey(int)},
    "model": {"architectures": MetadataKey(list[str]), "defaults": MetadataKey(dict[str, Any])},
    "layer": {},
    "comm": {},
    "storage": {},
    "op_group": {},
    "op_impl": {"backend": MetadataKey(str, required=True)},
    "tool_parser": {},
    "reasoning_parser": {},
}
"""Registry kind -> the metadata keys its hook accepts (meanings in each hook's docstring). Every
kind of `HOOK_KINDS` has an entry; a new hook declares its keys here."""
