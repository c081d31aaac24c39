"""Gemma 4's reasoning format (``gemma4``): the model thinks in a channel named ``thought``::

    <|channel>thought
    The user wants the weather.<channel|>It is sunny.

``<|channel>`` followed by another channel name is content.
"""

from __future__ import annotations

from atlas_core.parsing.reasoning import ReasoningFormat

GEMMA4 = ReasoningFormat("gemma4", "<|channel>", "<channel|>", label="thought")
