"""Test support for Atlas and its plugins: what a plugin's tests import instead of core's test suite.

Modules (each imports pytest, so this package needs ``pip install "atlas-core[testing]"``):

* `atlas_core.testing.conformance`: the ``backend`` and ``case`` fixtures that run op checks on
  every installed backend, `Case` with its checking helpers, per-dtype `Tolerance`s and replayable
  seeds (``ATLAS_CONFORMANCE_SEED``).
* `atlas_core.testing.oracles`: float64 oracles and input builders shared by conformance tests.
* `atlas_core.testing.checkpoints`: `TinyCheckpoints`, a package's tiny reference checkpoints
  (``tests/fixtures/tiny/<name>``) with their configs, references and shared models.
* `atlas_core.testing.parity`: logit parity with a checkpoint's reference, and `ReferenceParity`,
  the base of a test class that checks every checkpoint of a family.
* `atlas_core.testing.family`: engine invariants every family keeps (batch invariance, chunked
  prefill, prefix caching, nothing leaked).
* `atlas_core.testing.cli`: ``atlas plugins`` in-process, to check how a plugin is listed.
* `atlas_core.testing.storage`: random records for KV storage tiers' round trips.
* `atlas_core.testing.parsers` and `atlas_core.testing.grammars`: checks for tool-call and
  reasoning formats and their constrained-decoding grammars.

Nothing here is imported by the engine or the server.
"""
