#!/usr/bin/env python
"""Add multi-token-prediction (MTP) layers to tiny Qwen3-Next-family and DeepSeek-V3 checkpoints, with a
reference of the MTP head's logits computed by ``transformers``' own modules.

A development-only tool (needs torch and ``transformers==5.23.*``, like ``make_tiny_checkpoints.py``;
run it after that script, which rewrites the folders)::

    .venv-oracle/bin/python scripts/make_mtp_fixtures.py [--only NAME ...]

``transformers`` does not run MTP layers, but they are built from its own parts. For position ``p`` of a
prompt, with ``h_p`` the model's final (normed) hidden state:

* Qwen3-Next / Qwen3.5 (vLLM's ``qwen3_next_mtp``)::

      x = fc(cat(pre_fc_norm_embedding(embed(t[p+1])), pre_fc_norm_hidden(h_p)))
      logits = lm_head(norm(decoder_layer(x)))      # a full-attention layer of the family, causal over p

  The layer is a fresh instance of the family's full-attention ``DecoderLayer`` (MoE as the config has
  it); zero-centred norms are drawn ``PERTURB * N(0, 1)``. Its tensors go under ``mtp.*``.

* DeepSeek-V3 (vLLM's ``deepseek_mtp``, SGLang's ``deepseek_nextn``): checkpoint layer
  ``model.layers.{num_hidden_layers}``::

      x = eh_proj(cat(enorm(embed(t[p+1])), hnorm(h_p)))
      logits = shared_head.head(shared_head.norm(decoder_layer(x)))   # DeepseekV3DecoderLayer (MoE)

  Norms are drawn ``1 + PERTURB * N(0, 1)``, biases ``PERTURB * N(0, 1)``, the router's correction bias
  like the fixture's. ``deepseek_v3`` stores the layer's ``embed_tokens`` and ``shared_head.head`` as
  copies of the model's (as published checkpoints do); ``deepseek_v3_no_q_lora`` stores an LM head of
  its own and no embedding (the model's serves).

Every other weight is drawn ``N(0, WEIGHT_STD)`` from a fixed seed. Writes into each fixture folder: the
layer's tensors appended to ``model.safetensors`` (under their checkpoint names, as ``save_pretrained``
writes a decoder layer) and ``mtp_reference.npz`` with, for each prompt ``i`` of ``reference.npz``,
``mtp_logprobs_i`` ``[T_i - 1, vocab]`` (row ``p`` predicts token ``p + 2``); for DeepSeek-V3 also the
first chained step after each prompt (``mtp_draft_i``, ``mtp_chain_logprobs_i``: `write_reference`), whose
hidden input is the layer's output before ``shared_head.norm``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV3ForCausalLM

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "scripts"))
from tiny_checkpoint_specs import WEIGHT_STD  # noqa: E402

FIXTURES = REPO_ROOT / "plugins/models/qwen3-next/tests/fixtures/tiny"
NAMES = ("qwen3_next", "qwen3_5_moe")
DEEPSEEK_FIXTURES = REPO_ROOT / "plugins/models/deepseek/tests/fixtures/tiny"
DEEPSEEK_NAMES = {"deepseek_v3": True, "deepseek_v3_no_q_lora": False}
"""Fixture -> whether its MTP layer stores copies of the model's embedding and LM head (else an own head)."""
sys.path.insert(0, str(DEEPSEEK_FIXTURES.parent))
from tiny_specs import CORRECTION_BIAS_STD  # noqa: E402

SEED = 20261126
PERTURB = 0.1
TEMPLATE_LAYER = 1  # a full-attention layer of every Qwen fixture: its class and MLP kind make the MTP layer

Tensor = torch.Tensor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", action="append", default=[], help="fixture name (repeatable)")
    args = parser.parse_args()
    unknown = set(args.only) - {*NAMES, *DEEPSEEK_NAMES}
    if unknown:
        parser.error(f"unknown fixture(s): {sorted(unknown)}")
    torch.set_num_threads(1)
    for name in NAMES:
        if not args.only or name in args.only:
            make(FIXTURES / name)
    for name, copies in DEEPSEEK_NAMES.items():
        if not args.only or name in args.only:
            make_deepseek(DEEPSEEK_FIXTURES / name, copies)


def make(folder: Path) -> None:
    weights = {k: v for k, v in load_file(folder / "model.safetensors").items() if not k.startswith("mtp.")}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    decoder, config = model.model, model.config
    hidden_size = config.hidden_size
    layer = type(decoder.layers[TEMPLATE_LAYER])(model.config, TEMPLATE_LAYER).eval()  # eager attention
    norm_class = type(decoder.norm)
    norms = {
        n: norm_class(hidden_size, eps=config.rms_norm_eps)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
    }
    fc = torch.nn.Linear(2 * hidden_size, hidden_size, bias=False)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for module in (layer, fc, *norms.values()):
            for param_name, param in module.named_parameters():
                noise = torch.randn(param.shape, generator=generator)
                # the family's norms scale by 1 + w (zero-centred); the layer has no other 1-D parameter
                assert param.ndim > 1 or "norm" in param_name or module in norms.values(), param_name
                param.copy_(PERTURB * noise if param.ndim == 1 else WEIGHT_STD * noise)
    weights.update(saved_layer(model, TEMPLATE_LAYER, layer, "mtp.layers.0."))
    weights["mtp.fc.weight"] = fc.weight.detach().numpy()
    for norm_name, norm in norms.items():
        weights[f"mtp.{norm_name}.weight"] = norm.weight.detach().numpy()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    def fuse(next_ids: Tensor, hidden: Tensor) -> Tensor:
        embedded = norms["pre_fc_norm_embedding"](decoder.embed_tokens(next_ids))
        return fc(torch.cat([embedded, norms["pre_fc_norm_hidden"](hidden)], dim=-1))

    write_reference(folder, model, layer, fuse, lambda y: model.lm_head(norms["norm"](y)))
    print(f"{folder.name}: {sum(k.startswith('mtp.') for k in weights)} mtp tensors")


def make_deepseek(folder: Path, copies: bool) -> None:
    """DeepSeek-V3's MTP layer ``model.layers.{num_hidden_layers}`` (see the module docstring)."""
    model = DeepseekV3ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    decoder, config = model.model, model.config
    first = config.num_hidden_layers
    weights = {k: v for k, v in load_file(folder / "model.safetensors").items() if not _beyond(k, first)}
    hidden_size, norm_class = config.hidden_size, type(decoder.norm)
    layer = type(decoder.layers[-1])(config, first).eval()  # the layer rule makes it MoE; eager attention
    layer.enorm = norm_class(hidden_size, eps=config.rms_norm_eps)
    layer.hnorm = norm_class(hidden_size, eps=config.rms_norm_eps)
    layer.eh_proj = torch.nn.Linear(2 * hidden_size, hidden_size, bias=False)
    layer.shared_head = torch.nn.Module()
    layer.shared_head.norm = norm_class(hidden_size, eps=config.rms_norm_eps)
    layer.shared_head.head = torch.nn.Linear(hidden_size, config.vocab_size, bias=False)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(".bias"):
                param.copy_(PERTURB * noise)
            elif param.ndim == 1:
                assert "norm" in name, name
                param.copy_(1.0 + PERTURB * noise)
            else:
                param.copy_(WEIGHT_STD * noise)
        bias = layer.mlp.gate.e_score_correction_bias  # a buffer, not a parameter
        bias.copy_(CORRECTION_BIAS_STD * torch.randn(bias.shape, generator=generator))
        embed = decoder.embed_tokens
        if copies:
            layer.shared_head.head.weight.copy_(model.lm_head.weight)
            layer.embed_tokens = embed = torch.nn.Embedding(config.vocab_size, hidden_size)
            embed.weight.copy_(decoder.embed_tokens.weight)
    mtp = saved_layer(model, first - 1, layer, f"model.layers.{first}.")
    weights.update(mtp)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    def fuse(next_ids: Tensor, hidden: Tensor) -> Tensor:
        return layer.eh_proj(torch.cat([layer.enorm(embed(next_ids)), layer.hnorm(hidden)], dim=-1))

    # the layer's output before shared_head.norm feeds the next chained step (vLLM's deepseek_mtp)
    head = layer.shared_head
    write_reference(folder, model, layer, fuse, lambda y: head.head(head.norm(y)), chain=lambda y: y)
    print(f"{folder.name}: {len(mtp)} tensors of layer {first}")


def _beyond(name: str, first: int) -> bool:
    """Whether checkpoint tensor ``name`` belongs to a decoder layer ``first`` or later (an MTP layer)."""
    parts = name.split(".")
    return name.startswith("model.layers.") and int(parts[2]) >= first


def write_reference(
    folder: Path,
    model: torch.nn.Module,
    layer: torch.nn.Module,
    fuse: Callable[[Tensor, Tensor], Tensor],
    head: Callable[[Tensor], Tensor],
    chain: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """``mtp_reference.npz`` in ``folder``: for each prompt of ``reference.npz``, ``layer`` (causal over the
    positions ``p``) over ``fuse(t[p+1], h_p)``, then ``head`` -> log-probabilities of tokens ``p + 2``.

    With ``chain`` (a layer output -> the hidden state of the next chained step), also the chained step of
    speculative decoding after the prompt's prefill: the prompt's greedy token ``t[T]`` appended, the MTP
    row at ``T - 1`` drafts ``mtp_draft_i`` (its argmax), and the step at position ``T`` over
    ``fuse(draft, chain(y_{T-1}))``, attending to the rows before it, gives ``mtp_chain_logprobs_i`` ``[V]``."""
    decoder = model.model
    reference = np.load(folder / "reference.npz")
    out = {}

    def run(x: Tensor) -> Tensor:
        length = x.shape[1]
        positions = torch.arange(length)[None, :]
        mask = torch.full((1, 1, length, length), torch.finfo(torch.float32).min).triu(1)
        y = layer(x, position_embeddings=decoder.rotary_emb(x, positions), attention_mask=mask, position_ids=positions)
        return y[0] if isinstance(y, tuple) else y

    def logprobs(y: Tensor) -> np.ndarray:
        return torch.log_softmax(head(y), dim=-1).numpy().astype(np.float32)

    with torch.no_grad():
        for i in range(4):
            prompt = torch.from_numpy(reference[f"prompt_{i}"])[None, :]
            hidden = decoder(input_ids=prompt, use_cache=False).last_hidden_state
            if prompt.shape[1] >= 2:
                out[f"mtp_logprobs_{i}"] = logprobs(run(fuse(prompt[:, 1:], hidden[:, :-1])))[0]
            if chain is None:
                continue
            tokens = torch.cat([prompt, torch.from_numpy(reference[f"greedy_{i}"][:1])[None, :]], dim=1)
            x = fuse(tokens[:, 1:], hidden)
            y = run(x)[:, -1:]
            draft = head(y).argmax(-1)
            chained = run(torch.cat([x, fuse(draft, chain(y))], dim=1))[:, -1]
            out[f"mtp_draft_{i}"] = draft[0].numpy().astype(np.int64)
            out[f"mtp_chain_logprobs_{i}"] = logprobs(chained)[0]
    np.savez_compressed(folder / "mtp_reference.npz", **out)
    print(f"{folder.name}: {len(out)} references")


def saved_layer(model: torch.nn.Module, template: int, layer: torch.nn.Module, prefix: str) -> dict[str, np.ndarray]:
    """``layer``'s tensors under checkpoint names ``prefix*``: the layer put in a copy of the model in place
    of layer ``template``, saved by ``save_pretrained`` (which writes the checkpoint layout)."""
    original = model.model.layers[template]
    model.model.layers[template] = layer
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            saved = load_file(Path(tmp) / "model.safetensors")
    finally:
        model.model.layers[template] = original
    start = f"model.layers.{template}."
    return {prefix + k[len(start) :]: v for k, v in saved.items() if k.startswith(start)}


if __name__ == "__main__":
    main()
