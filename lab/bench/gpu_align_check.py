"""On CUDA: an aligned model runs the fused kernels, and they agree with the PyTorch reference.

For each family's tiny config (the test suite's) and each built-in profile, the aligned model's
logits are computed twice on the GPU: with the fused Triton path (the default) and with the
reference forced (``rla.ops.fused._ENABLED = False``). It records the fraction of equal logits
and the max difference, and counts fused-kernel launches to prove the fused path ran.

    PYTHONPATH=src:tests python lab/bench/gpu_align_check.py --out DIR
"""

from __future__ import annotations

import argparse
import json
from datetime import date

import torch

import rla
import rla.ops.fused as fused
from rla import profiles


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    from align_spec import FAMILIES, tiny_model, tokens  # the test suite's tiny configs

    rows = []
    calls = {"n": 0}
    for name in ("rope", "swiglu", "rms_norm", "add_rms_norm", "qk_norm_rope"):
        f = getattr(fused, name)

        def counted(*a, _f=f, **k):
            calls["n"] += 1
            return _f(*a, **k)

        setattr(fused, name, counted)
    for family in FAMILIES:
        model = tiny_model(family).cuda()
        ids = tokens().cuda()
        for prof in profiles.names():
            rla.align(model, prof)
            with torch.no_grad():
                calls["n"] = 0
                fast = model(ids).logits.float()
                n_fused = calls["n"]
                fused._ENABLED = False
                ref = model(ids).logits.float()
                fused._ENABLED = True
            rla.unalign(model)
            rows.append({
                "family": family, "profile": prof, "fused_calls": n_fused,
                "equal_fraction": (fast == ref).float().mean().item(),
                "max_abs_diff": (fast - ref).abs().max().item(),
            })
            print(rows[-1], flush=True)
    with open(f"{args.out}/align_cuda.json", "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date.today().isoformat(),
                   "command": "PYTHONPATH=src:tests python lab/bench/gpu_align_check.py", "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
