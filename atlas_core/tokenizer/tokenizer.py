"""A model's tokenizer: a Hugging Face `tokenizers` backend plus the settings transformers keeps
beside it (special tokens, whether to add BOS, the chat template).

BOS rule, applied by `Tokenizer.encode` when ``add_special_tokens`` is true:

* ``add_bos_token`` True/False (tokenizer_config.json states it, or the caller passed it): the
  backend encodes without its post-processor and Atlas prepends ``bos_token_id`` itself when the
  flag is set and the ids do not already start with it.
* ``add_bos_token`` None (tokenizer_config.json is silent): the backend's post-processor decides
  (e.g. a ``TemplateProcessing`` that adds ``<|begin_of_text|>``); if that yields BOS twice because
  the text already began with it, one is dropped.

``add_eos_token`` is not honoured: a prompt for generation never ends with EOS.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from atlas_core.errors import InvalidRequestError, ModelLoadError
from atlas_core.tokenizer.chat_template import ChatTemplate

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class Tokenizer:
    """Encoding, decoding and chat-template rendering for one model.

    `source` is a human-readable origin (a folder path) used in error messages.
    `tool_chat_template`, when set, replaces `chat_template` for requests that carry tools
    (tokenizer_config.json may name a ``tool_use`` template besides the ``default`` one).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: list[int],
        chat_template: str | None,
        add_bos_token: bool | None = False,
        special_token_strings: dict[str, str] | None = None,
        source: str = "",
        tool_chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.chat_template = chat_template
        self.tool_chat_template = tool_chat_template
        self.add_bos_token = add_bos_token
        self.special_token_strings = dict(special_token_strings or {})
        self.source = source or "tokenizer"
        self._compiled: dict[str, ChatTemplate] = {}

    @classmethod
    def from_folder(cls, path: str | os.PathLike[str]) -> Tokenizer | None:
        """Load a Hugging Face model folder's tokenizer: tokenizer.json, or in a folder without one a
        SentencePiece tokenizer.model (`tokenizer_from_sentencepiece`: BPE models; its BOS/EOS ids and
        BOS-adding are the fallbacks of the files below), + tokenizer_config.json for
        bos/eos/add_bos_token/chat_template, chat_template.jinja or chat_template.json if present,
        generation_config.json eos_token_id (int or list) merged into eos_token_ids,
        config.json bos/eos as fallback. Returns None when the folder has neither tokenizer file.
        A corrupt tokenizer.json / tokenizer.model / tokenizer_config.json raises
        atlas_core.errors.ModelLoadError naming the file and the problem (so do corrupt JSON side
        files, and a bos/eos token string that is not in the vocabulary).

        Chat template precedence: chat_template.jinja, then chat_template.json, then
        tokenizer_config.json's ``chat_template`` (a string, or a list of named templates of
        which ``default`` is used and ``tool_use`` serves requests with tools).
        """
        folder = Path(path)
        tokenizer_file = folder / "tokenizer.json"
        sentencepiece: Tokenizer | None = None  # the tokenizer.model's own, when there is no tokenizer.json
        if tokenizer_file.is_file():
            try:
                backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
            except Exception as e:  # the Rust side raises a bare Exception for any parse problem
                raise ModelLoadError(f"{tokenizer_file}: not a valid tokenizer.json: {e}") from e
        elif (folder / "tokenizer.model").is_file():
            from atlas_core.tokenizer.sentencepiece_vocab import tokenizer_from_sentencepiece

            sentencepiece = tokenizer_from_sentencepiece(folder / "tokenizer.model")
            backend = sentencepiece.backend
        else:
            return None

        config_file = folder / "tokenizer_config.json"
        tok_config = _read_json(config_file) or {}
        gen_config = _read_json(folder / "generation_config.json") or {}
        model_config = _read_json(folder / "config.json") or {}

        special: dict[str, str] = {}
        for key in _SPECIAL_TOKEN_KEYS:
            content = _token_content(tok_config.get(key), config_file, key)
            if content is not None:
                special[key] = content

        bos_id = _token_id(backend, special.get("bos_token"), config_file, "bos_token")
        if bos_id is None:
            fallback = _ids(gen_config, "bos_token_id", folder / "generation_config.json") or _ids(
                model_config, "bos_token_id", folder / "config.json"
            )
            bos_id = fallback[0] if fallback else sentencepiece.bos_token_id if sentencepiece else None

        eos_ids: list[int] = []
        first_eos = _token_id(backend, special.get("eos_token"), config_file, "eos_token")
        for candidate in [first_eos, *_ids(gen_config, "eos_token_id", folder / "generation_config.json")]:
            if candidate is not None and candidate not in eos_ids:
                eos_ids.append(candidate)
        if not eos_ids:
            eos_ids = _ids(model_config, "eos_token_id", folder / "config.json")
        if not eos_ids and sentencepiece:
            eos_ids = list(sentencepiece.eos_token_ids)

        for key, token_id in (("bos_token", bos_id), ("eos_token", eos_ids[0] if eos_ids else None)):
            if key not in special and token_id is not None and (token := backend.id_to_token(token_id)) is not None:
                special[key] = token

        add_bos = tok_config.get("add_bos_token")
        if add_bos is not None and not isinstance(add_bos, bool):
            raise ModelLoadError(f"{config_file}: add_bos_token must be true or false, got {add_bos!r}")
        if sentencepiece:
            add_bos = sentencepiece.add_bos_token if add_bos is None else add_bos
            special = {**sentencepiece.special_token_strings, **special}

        chat_template, tool_template = _chat_templates(folder, tok_config)
        return cls(
            backend,
            bos_token_id=bos_id,
            eos_token_ids=eos_ids,
            chat_template=chat_template,
            add_bos_token=add_bos,
            special_token_strings=special,
            source=str(folder),
            tool_chat_template=tool_template,
        )

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """Characters of the longest vocabulary entry, added tokens included (byte-level entries hold one
        character a byte), at least 1: a text of ``c`` characters takes about ``c / longest_token_chars`` tokens
        or more, so a text can be refused as too long without tokenizing it (`max_text_chars`)."""
        return max((len(token) for token in self.backend.get_vocab(with_added_tokens=True)), default=1) or 1

    def max_text_chars(self, max_tokens: int) -> int:
        """Characters beyond which a text cannot fit in ``max_tokens`` tokens: `longest_token_chars` per token,
        times 4 for normalizers that merge characters (NFKC composes a letter and its combining marks)."""
        return 4 * self.longest_token_chars * max_tokens

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; BOS is handled as the module docstring describes."""
        if self.add_bos_token is None:
            ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
            bos = self.bos_token_id
            if add_special_tokens and bos is not None and ids[:2] == [bos, bos]:
                del ids[0]
            return ids
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (
            add_special_tokens
            and self.add_bos_token
            and self.bos_token_id is not None
            and ids[:1] != [self.bos_token_id]
        ):
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens (BOS, EOS, chat markers) are dropped when asked."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_str(self, token_id: int) -> str:
        """The raw vocabulary piece of `token_id` (e.g. ``Ġhello``), for logprob displays;
        "" for an id outside the vocabulary (models often pad their embedding table)."""
        return self.backend.id_to_token(token_id) or ""

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render `messages` (and `tools`) to prompt text with the model's chat template
        (`ChatTemplate.render`; ``continue_final_message`` leaves the last message open).

        Raises `InvalidRequestError` when the model has no chat template, the template is not
        valid Jinja, calls ``raise_exception`` (message forwarded), or fails to render, and for
        kwargs that name a reserved variable or both ``add_generation_prompt`` and
        ``continue_final_message``.
        """
        source = self.tool_chat_template if tools and self.tool_chat_template else self.chat_template
        if not source:
            raise InvalidRequestError(
                f"{self.source}: the model has no chat template (no chat_template in "
                "tokenizer_config.json, no chat_template.jinja); use the completions endpoint "
                "with a raw prompt, or supply a chat template"
            )
        template = self._compiled.get(source)
        if template is None:
            template = ChatTemplate(source, origin=f"{self.source}: chat template")
            self._compiled[source] = template
        return template.render(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            special_token_strings=self.special_token_strings,
            variables=chat_template_kwargs,
        )


def _read_json(file: Path) -> dict[str, Any] | None:
    """The JSON object in `file`, or None when the file does not exist."""
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelLoadError(f"{file}: cannot read JSON: {e}") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{file}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def _token_content(value: Any, file: Path, key: str) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, an AddedToken object
    (``{"content": "<s>", ...}``) or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ModelLoadError(f"{file}: {key} must be a string or an object with 'content', got {value!r}")


def _token_id(backend: tokenizers.Tokenizer, token: str | None, file: Path, key: str) -> int | None:
    if token is None:
        return None
    token_id = backend.token_to_id(token)
    if token_id is None:
        raise ModelLoadError(f"{file}: {key} {token!r} is not in the vocabulary of tokenizer.json")
    return token_id


def _ids(config: Mapping[str, Any], key: str, file: Path) -> list[int]:
    """`config[key]` as a list of token ids (configs store an int, a list of ints, or null)."""
    value = config.get(key)
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ModelLoadError(f"{file}: {key} must be a token id or a list of token ids, got {value!r}")
    return list(values)


def _chat_templates(folder: Path, tok_config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(default template, tool-use template) from the files described in `Tokenizer.from_folder`."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8"), None
        except (OSError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{jinja_file}: cannot read the chat template: {e}") from e
    json_file = folder / "chat_template.json"
    json_template = _read_json(json_file)
    if json_template is not None:
        return _named_templates(json_template.get("chat_template"), json_file)
    return _named_templates(tok_config.get("chat_template"), folder / "tokenizer_config.json")


def _named_templates(value: Any, file: Path) -> tuple[str | None, str | None]:
    if value is None or isinstance(value, str):
        return value, None
    if isinstance(value, list) and all(
        isinstance(t, Mapping) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in value
    ):
        named = {t["name"]: t["template"] for t in value}
        return named.get("default"), named.get("tool_use")
    raise ModelLoadError(f"{file}: chat_template must be a string or a list of {{'name', 'template'}} objects")


__all__ = ["Tokenizer"]
