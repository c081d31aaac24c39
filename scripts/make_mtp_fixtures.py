#!/usr/bin/env python
"""Add multi-token-prediction (MTP) layers to tiny Qwen3-Next-family checkpoints, with a reference of
the MTP head's logits computed by ``transformers``' own modules.

A development-only tool (needs torch and ``transformers==5.23.*``, like ``make_tiny_checkpoints.py``;
run it after that script, which rewrites the folders)::

    .venv-oracle/bin/python scripts/make_mtp_fixtures.py

``transformers`` does not run MTP layers, but they are built from its own parts (the published
architecture, as vLLM's ``qwen3_next_mtp`` has it): for position ``p`` of a prompt,

    x = fc(cat(pre_fc_norm_embedding(embed(t[p+1])), pre_fc_norm_hidden(h_p)))
    y = norm(decoder_layer(x))            # a full-attention decoder layer of the family, causal over p
    logits = lm_head(y)

where ``h_p`` is the model's final (normed) hidden state. The layer is a fresh instance of the family's
full-attention ``DecoderLayer`` (MoE as the config has it), every parameter drawn from a fixed seed
with the fixture rules (weights ``N(0, WEIGHT_STD)``, zero-centred norms ``PERTURB * N(0, 1)``).

Writes into each fixture folder: the ``mtp.*`` tensors appended to ``model.safetensors`` (the
layer's tensors under their checkpoint names, as ``save_pretrained`` writes a decoder layer) and
``mtp_reference.npz`` with, for each prompt ``i`` of ``reference.npz``, ``mtp_logprobs_i``
``[T_i - 1, vocab]`` (row ``p`` predicts token ``p + 2``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "scripts"))
from tiny_checkpoint_specs import WEIGHT_STD  # noqa: E402

FIXTURES = REPO_ROOT / "plugins/models/qwen3-next/tests/fixtures/tiny"
NAMES = ("qwen3_next", "qwen3_5_moe")
SEED = 20261126
PERTURB = 0.1
TEMPLATE_LAYER = 1  # a full-attention layer of every fixture: its class and MLP kind make the MTP layer


def main() -> None:
    torch.set_num_threads(1)
    for name in NAMES:
        make(FIXTURES / name)


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
    weights.update(_layer_tensors(model, layer))
    weights["mtp.fc.weight"] = fc.weight.detach().numpy()
    for norm_name, norm in norms.items():
        weights[f"mtp.{norm_name}.weight"] = norm.weight.detach().numpy()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    reference = np.load(folder / "reference.npz")
    out = {}
    with torch.no_grad():
        for i in range(4):
            prompt = torch.from_numpy(reference[f"prompt_{i}"])[None, :]
            if prompt.shape[1] < 2:
                continue
            hidden = decoder(input_ids=prompt, use_cache=False).last_hidden_state[:, :-1]
            embedded = decoder.embed_tokens(prompt[:, 1:])
            x = fc(torch.cat([norms["pre_fc_norm_embedding"](embedded), norms["pre_fc_norm_hidden"](hidden)], dim=-1))
            length = x.shape[1]
            positions = torch.arange(length)[None, :]
            mask = torch.full((1, 1, length, length), torch.finfo(torch.float32).min).triu(1)
            y = layer(
                x, position_embeddings=decoder.rotary_emb(x, positions), attention_mask=mask, position_ids=positions
            )
            y = y[0] if isinstance(y, tuple) else y
            logits = model.lm_head(norms["norm"](y))[0]
            out[f"mtp_logprobs_{i}"] = torch.log_softmax(logits, dim=-1).numpy().astype(np.float32)
    np.savez_compressed(folder / "mtp_reference.npz", **out)
    print(f"{folder.name}: {sum(k.startswith('mtp.') for k in weights)} mtp tensors, {len(out)} references")


def _layer_tensors(model: torch.nn.Module, layer: torch.nn.Module) -> dict[str, np.ndarray]:
    """``layer``'s tensors under checkpoint names ``mtp.layers.0.*``: the layer put in a copy of the model
    in place of the template layer, saved by ``save_pretrained`` (which writes the checkpoint layout)."""
    template = model.model.layers[TEMPLATE_LAYER]
    model.model.layers[TEMPLATE_LAYER] = layer
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            saved = load_file(Path(tmp) / "model.safetensors")
    finally:
        model.model.layers[TEMPLATE_LAYER] = template
    prefix = f"model.layers.{TEMPLATE_LAYER}."
    return {"mtp.layers.0." + k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}


if __name__ == "__main__":
    main()
