"""Does torch.compile (Inductor) keep an aligned model's numbers? Eager vs compiled, bit for bit:
the aligned rotary's cos/sin tables, and the logits of a small random-init Qwen2 aligned to vllm.
    python lab/bench/compile_numerics.py --out F.json
"""

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

import rla
from rla.environment import environment


def compare(a, b):
    a, b = a.float(), b.float()
    return {"equal_fraction": (a == b).float().mean().item(), "max_abs_diff": (a - b).abs().max().item()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=4096, max_position_embeddings=32768, rope_theta=1e6)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).cuda()
    rla.align(model, "vllm")
    ids = torch.randint(0, 4096, (2, 1024), device="cuda")
    pos = torch.arange(32768, device="cuda")[None]
    x = torch.zeros(1, dtype=torch.bfloat16, device="cuda")
    rot = model.model.rotary_emb
    out = {"env": environment()}
    with torch.no_grad():
        eager_tables = rot(x, pos)
        comp_tables = torch.compile(rot, fullgraph=True)(x, pos)
        out["cos"] = compare(eager_tables[0], comp_tables[0])
        out["sin"] = compare(eager_tables[1], comp_tables[1])
        eager = model(ids).logits
        compiled = torch.compile(model, fullgraph=True)(ids).logits
        out["logits"] = compare(eager, compiled)
    print(json.dumps({k: v for k, v in out.items() if k != "env"}, indent=1))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
