"""The trainer's own batch variance at a realistic shape: how far a bf16 forward of the same
records moves with the micro-batch size and the padding side (issue #34), HF eager vs aligned.

A user's dashboard cannot tell this from engine mismatch: it is measured here on the same
records, the same weights, only the batch changed. Random-init weights of the Qwen2.5-1.5B shape
(28 layers, hidden 1536, 12 / 2 heads, MLP 8960, vocab 151936), bf16, SDPA; ``--records`` random
token sequences of ``--min-len``..``--max-len`` tokens, the last ``--response`` of each scored.

For each model (``hf``: HF's own modules; ``aligned``: ``rla.align(model, "vllm")``) and each
layout, every record's response logprobs are compared with the same record scored alone
(micro-batch 1, no padding), token by token: k3 (docs/metrics.md), the share of tokens whose
ratio exp(delta) is outside [0.9, 1.1], max |delta|, the share bitwise equal. Layouts:
micro-batch 4 and 8, right padding and left padding (with explicit position ids, as rla and verl
pass them), and left padding *without* position ids (the plumbing bug, for scale). The bf16 vs
fp32 k3 of the same records (rounding's size) is written beside them.

The fp32 reference (:func:`fp32_reference`) is the same bf16-valued weights upcast to fp32, with
RoPE's ``inv_freq`` recomputed from the config in fp64 and rounded once to fp32: an upcast of a
model built by ``.to(torch.bfloat16)`` would carry HF's bf16-rounded ``inv_freq`` into the
"fp32" side (a phase drift growing with the position, docs/rounding.md's hazard), which the
aligned model does not have, so its "vs fp32" row would measure the reference's frequencies
rather than its own rounding. Only the ``default`` rope type is recomputed; others are refused.

``--model bundled`` scores rla's bundled tiny checkpoint (``rla.models.load_bundled_model``,
bf16, SDPA) instead of the random-init shape; a CPU run:

    PYTHONPATH=src:. python -m lab.triage.microbatch_consistency --out $OUT/microbatch.json
    PYTHONPATH=src:. python -m lab.triage.microbatch_consistency --model bundled --device cpu --out m.json

Writes one JSON file: the environment stamp (rla.environment), the command, the settings and a
row per (model, layout).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import numpy as np
import torch

import rla
from rla.atomic import write_text
from rla.environment import environment
from rla.metrics import mismatch

QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)


def build(shape: dict, device, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**shape)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()


def exact_inv_freq(config) -> torch.Tensor:
    """``1 / theta ** (2i / d)`` of the default rope type, in fp64 from the config, rounded once to fp32."""
    rope = getattr(config, "rope_parameters", None) or {}
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"fp32 reference: rope_type {kind!r} is not recomputed here (only 'default')")
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("fp32 reference: the config names no rope_theta")
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    i = torch.arange(0, d, 2, dtype=torch.float64)
    return (1.0 / float(theta) ** (i / d)).to(torch.float32)


def fp32_reference(model) -> torch.nn.Module:
    """The same (bf16-valued) weights in fp32, every rotary module's ``inv_freq`` (and
    ``original_inv_freq``) replaced by :func:`exact_inv_freq`: not an upcast of a rounded buffer."""
    ref = copy.deepcopy(model).float()
    fresh = exact_inv_freq(model.config)
    found = 0
    for mod in ref.modules():
        for name in ("inv_freq", "original_inv_freq"):
            if name in mod._buffers:
                buf = mod._buffers[name]
                if buf.shape != fresh.shape:
                    raise ValueError(f"fp32 reference: {type(mod).__name__}.{name} has shape {tuple(buf.shape)}, "
                                     f"the config gives {tuple(fresh.shape)}")
                mod._buffers[name] = fresh.to(buf.device)
                found += 1
    if not found:
        raise ValueError("fp32 reference: the model has no inv_freq buffer to recompute")
    return ref


def inv_freq_error(model) -> float:
    """Max relative error of the model's own ``inv_freq`` buffer against :func:`exact_inv_freq` (0: fp32-exact)."""
    fresh = exact_inv_freq(model.config).double()
    bufs = [b for m in model.modules() for n, b in m._buffers.items() if n == "inv_freq"]
    return max(float(((b.double().cpu() - fresh) / fresh).abs().max()) for b in bufs)


@torch.no_grad()
def score(model, seqs, response: int, batch: int, side: str, positions: bool) -> list[torch.Tensor]:
    """Per record, the fp32 log-softmax logprob of its last ``response`` tokens, micro-batches of
    ``batch`` rows padded on ``side``."""
    dev = next(model.parameters()).device
    out = []
    for s in range(0, len(seqs), batch):
        group = seqs[s:s + batch]
        L = max(len(x) for x in group)
        ids = torch.zeros(len(group), L, dtype=torch.long)
        mask = torch.zeros(len(group), L, dtype=torch.long)
        for i, x in enumerate(group):
            sl = slice(L - len(x), L) if side == "left" else slice(0, len(x))
            ids[i, sl], mask[i, sl] = torch.tensor(x), 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(1) - 1).clamp(min=0) if positions else None
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
        for i, x in enumerate(group):
            end = L if side == "left" else len(x)
            lp = logits[i, end - response - 1:end - 1].log_softmax(-1)
            out.append(lp.gather(-1, ids[i, end - response:end, None])[:, 0].double().cpu())
    return out


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    A, B = torch.stack(a).numpy(), torch.stack(b).numpy()
    m = mismatch(A, B, np.ones_like(A, dtype=bool))
    d = A - B
    return {"k3": m["mismatch/k3"], "share_outside_0.9_1.1": m["mismatch/clip_leak/0.1"],
            "max_abs_delta": float(np.abs(d).max()), "share_bitwise_equal": float(np.mean(d == 0))}


LAYOUTS = [("mb4_right", 4, "right", True), ("mb8_right", 8, "right", True), ("mb4_left", 4, "left", True),
           ("mb8_left", 8, "left", True), ("mb8_left_no_position_ids", 8, "left", False)]


def run(shape: dict | None, records: int, min_len: int, max_len: int, response: int, device: str, seed: int = 0) -> dict:
    """``shape=None``: the bundled checkpoint; otherwise a random-init Qwen2 of that shape."""
    if shape is None:
        from rla.models import load_bundled_model
        hf = load_bundled_model(dtype=torch.bfloat16, device=device)
        shape = {k: getattr(hf.config, k) for k in QWEN25_15B if hasattr(hf.config, k)}
    else:
        hf = build(shape, device, seed)
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (records,), generator=g).tolist()
    seqs = [torch.randint(3, shape["vocab_size"], (n,), generator=g).tolist() for n in lens]
    hf_inv_freq_error = inv_freq_error(hf)
    aligned = copy.deepcopy(hf)
    rla.align(aligned, "vllm")
    fp32 = fp32_reference(hf)
    ref32 = score(fp32, seqs, response, 1, "right", True)
    del fp32
    rows = []
    for name, model in (("hf", hf), ("aligned", aligned)):
        t = time.perf_counter()
        alone = score(model, seqs, response, 1, "right", True)
        rows.append({"model": name, "layout": "mb1 vs fp32 (rounding's size)", **compare(alone, ref32)})
        for layout, batch, side, positions in LAYOUTS:
            rows.append({"model": name, "layout": f"{layout} vs mb1",
                         **compare(score(model, seqs, response, batch, side, positions), alone)})
        rows[-1]["seconds_for_model"] = time.perf_counter() - t
    return {"shape": shape, "records": records, "lengths": lens, "response_tokens": response,
            "fp32_reference": "bf16 weights upcast; inv_freq from the config in fp64, rounded once to fp32",
            "hf_inv_freq_max_rel_error": hf_inv_freq_error, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--records", type=int, default=16)
    p.add_argument("--min-len", type=int, default=512)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--response", type=int, default=256)
    p.add_argument("--model", choices=("qwen2.5-1.5b-shape", "bundled"), default="qwen2.5-1.5b-shape",
                   help="random-init Qwen2.5-1.5B shape, or rla's bundled tiny checkpoint")
    p.add_argument("--layers", type=int, default=None, help="override the layer count (a smoke run)")
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    if a.response >= a.min_len:
        p.error("--response must be shorter than --min-len (each record needs a prompt)")
    if a.model == "bundled" and a.layers:
        p.error("--layers changes the random-init shape; the bundled checkpoint has its own")
    shape = None if a.model == "bundled" else dict(QWEN25_15B, **({"num_hidden_layers": a.layers} if a.layers else {}))
    result = run(shape, a.records, a.min_len, a.max_len, a.response, a.device)
    result["model"] = a.model
    result["environment"] = environment(torch.device(a.device))
    result["command"] = " ".join(["python -m lab.triage.microbatch_consistency", *(argv or sys.argv[1:])])
    write_text(a.out, json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
