"""GPU probe of the router points against vLLM's own routing kernels (issue #32).

vLLM's ``_moe_C`` library (``vllm/_moe_C_stable_libtorch.abi3.so`` in the 0.26.0 wheel, loaded with
``torch.ops.load_library`` at run time, never copied into the repository) registers
``torch.ops._moe_C.topk_softmax`` (Qwen2/Qwen3-MoE, Mixtral), ``grouped_topk`` (DeepSeek-V3's
sigmoid router with correction bias) and ``moe_sum`` (the sum of the k weighted expert outputs,
the ``combine`` point). The routers are called on random bf16 gate logits and compared with
``rla.ops.routing`` on the same logits under each row's router values (the routing ones: softmax,
renorm, ties for the softmax routers; sigmoid, sigmoid_renorm, ties for the grouped one): the vLLM
row's, SGLang's and HF's (``torch`` for each). For ``grouped_topk`` also the vLLM row with one value
changed (``sigmoid=torch``; ``sigmoid_renorm`` ``divide`` or ``reciprocal``, the latter the row's
value before ``warp_fp64``), so the probe says what each of the kernel's two differences is worth. Per case: the fraction of tokens whose expert ids equal in slot order, whose
id sets equal, and whose fp32 weights are bit-equal (by expert id), and the largest weight
difference in fp32 ulps.

Cases: ``topk_softmax`` at 8, 64 and 128 experts (fused in the kernel) and 60 (vLLM's unfused
fallback, whose block reduction rla does not model), top-k 2, 3 and 8, with and without
renormalisation, on Gaussian logits and on coarse logits (exact ties common); ``grouped_topk`` at
8 experts in 2 groups (the tests' tiny DeepSeek-V3) and 256 in 8 (DeepSeek-V3's shape), on Gaussian
and coarse logits, both run by the kernel the vLLM row models
(``rla.ops.routing.grouped_topk_small_kernel``), and 512 in 8 (64 a group), which vLLM runs through
``grouped_topk_fused_kernel`` instead (scores in the logits' dtype: not modelled, measured);
``moe_sum`` on random bf16 terms [tokens, k, hidden] (k 2, 3, 4, 5, 8; hidden 2048 and 100, the
vector and the scalar kernels) against ``rla.ops.routing.combine``'s ``fp32_slot_order`` (the
vLLM row's) and ``lp_slot_order``: the fraction of bit-equal outputs.

Usage (CUDA, vLLM's library unpacked to ``LIB``)::

    python lab/bench/router_probe_h200.py --library $LIB --out $OUT/router_probe

Writes ``router_probe.json`` (cases, versions, the library's sha256) into ``--out`` and prints
one line per case.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from rla.ops import routing
from rla.profiles import get

#: The routing values compared (HF's are ``hf_router_points``': ``torch`` for each).
ROUTING_POINTS = ("softmax", "renorm", "sigmoid", "sigmoid_renorm", "ties")
ROWS = ("vllm-0.33", "sglang-0.5.23", "hf")
#: For grouped_topk: the vLLM row with one value changed, to attribute the kernel's differences.
GROUPED_VARIANTS = {"vllm-0.33 sigmoid=torch": {"sigmoid": "torch"},
                    "vllm-0.33 sigmoid_renorm=divide": {"sigmoid_renorm": "divide"},
                    "vllm-0.33 sigmoid_renorm=reciprocal": {"sigmoid_renorm": "reciprocal"}}


def load(library: str) -> None:
    """Register ``torch.ops._moe_C`` from vLLM's library file; a clear error when it cannot."""
    path = Path(library)
    if not path.is_file():
        raise FileNotFoundError(f"vLLM's _moe_C library {path} does not exist")
    try:
        registered = hasattr(torch.ops._moe_C, "topk_softmax")
    except (AttributeError, RuntimeError):
        registered = False
    if not registered:
        torch.ops.load_library(str(path))
    for op in ("topk_softmax", "grouped_topk", "moe_sum"):
        if not hasattr(torch.ops._moe_C, op):
            raise RuntimeError(f"{path} does not register torch.ops._moe_C.{op}")


def points_of(row: str, **changes):
    """The vLLM row's router points with ``row``'s routing values (then ``changes``)."""
    base = get("vllm-0.33").router
    values = ({p: "torch" for p in ROUTING_POINTS} if row == "hf"
              else {p: getattr(get(row).router, p) for p in ROUTING_POINTS})
    return base.replace(**{**values, **changes})


def logits_for(kind: str, tokens: int, experts: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, experts, device="cuda", generator=g)
    if kind == "coarse":  # few distinct values: exact ties between experts on most tokens
        x = torch.round(x * 2) / 2
    return x.bfloat16()


def engine_topk_softmax(logits: torch.Tensor, k: int, renormalize: bool):
    t = logits.shape[0]
    w = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, k, dtype=torch.int32, device=logits.device)
    src = torch.empty(t, k, dtype=torch.int32, device=logits.device)
    torch.ops._moe_C.topk_softmax(w, ids, src, logits, renormalize, None)
    return w, ids.long()


def engine_grouped_topk(logits, bias, k, n_group, topk_group, renormalize):
    w, ids = torch.ops._moe_C.grouped_topk(logits, n_group, topk_group, k, renormalize, 1.0, bias, 1)
    return w.float(), ids.long()


def compare(w_e, ids_e, w_r, ids_r) -> dict:
    """Agreement of two routings of the same tokens: ids in slot order, id sets, and the weights
    matched by expert id (bit-equal fraction over tokens with equal sets; largest ulp distance)."""
    same_order = (ids_e == ids_r).all(dim=1)
    se, oe = ids_e.sort(dim=1)
    sr, orr = ids_r.sort(dim=1)
    same_set = (se == sr).all(dim=1)
    we, wr = w_e.gather(1, oe), w_r.gather(1, orr)
    bits = (we.view(torch.int32) == wr.view(torch.int32)).all(dim=1) & same_set
    ulp = (we.view(torch.int32).long() - wr.view(torch.int32).long()).abs()[same_set]
    return {"tokens": int(ids_e.shape[0]), "ids_equal_in_order": float(same_order.float().mean()),
            "id_sets_equal": float(same_set.float().mean()),
            "weights_bit_equal": float(bits.float().mean()),
            "tokens_weights_differ": int((same_set & ~bits).sum()),
            "max_ulp": int(ulp.max()) if ulp.numel() else None}


def topk_softmax_case(experts, k, renormalize, kind, tokens, seed) -> dict:
    logits = logits_for(kind, tokens, experts, seed)
    w_e, ids_e = engine_topk_softmax(logits, k, renormalize)
    out = {"op": "topk_softmax", "experts": experts, "k": k, "renormalize": renormalize, "logits": kind,
           "fused": routing.topk_softmax_layout(experts, 2) is not None, "rows": {}}
    for row in ROWS:
        w_r, ids_r = routing.softmax_route(logits, k, renormalize, points_of(row), torch.bfloat16, finish=False)
        out["rows"][row] = compare(w_e, ids_e, w_r, ids_r)
    return out


def grouped_case(experts, n_group, topk_group, k, tokens, seed, kind="gaussian") -> dict:
    logits = logits_for(kind, tokens, experts, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    bias = (torch.randn(experts, device="cuda", generator=g) * 0.05).float()
    out = {"op": "grouped_topk", "experts": experts, "n_group": n_group, "topk_group": topk_group, "k": k,
           "renormalize": True, "logits": kind,
           "small_kernel": routing.grouped_topk_small_kernel(experts, n_group, topk_group, k), "rows": {}}
    try:
        w_e, ids_e = engine_grouped_topk(logits, bias, k, n_group, topk_group, True)
    except RuntimeError as e:  # the kernel's dtype rules for the bias: the fp32 bias refused
        out["fp32_bias_refused"] = str(e).splitlines()[0]
        w_e, ids_e = engine_grouped_topk(logits, bias.bfloat16(), k, n_group, topk_group, True)
        bias = bias.bfloat16().float()
    rows = {**{row: points_of(row) for row in ROWS},
            **{name: points_of("vllm-0.33", **changes) for name, changes in GROUPED_VARIANTS.items()}}
    for row, points in rows.items():
        w_r, ids_r = routing.sigmoid_grouped_route(logits, bias, k, n_group, topk_group, True, 1.0,
                                                   points, torch.bfloat16, finish=False)
        out["rows"][row] = compare(w_e, ids_e, w_r, ids_r)
    return out


def moe_sum_case(k: int, hidden: int, tokens: int, seed: int) -> dict:
    """vLLM's ``moe_sum`` of lp terms against ``combine`` (weights 1.0, so each term is the lp
    value itself) under ``fp32_slot_order`` and ``lp_slot_order``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    terms = (torch.randn(tokens, k, hidden, device="cuda", generator=g) * 4).bfloat16()
    out = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    torch.ops._moe_C.moe_sum(terms, out, None, None)
    ones = torch.ones(tokens, k, dtype=torch.float32, device="cuda")
    ids = torch.arange(k, device="cuda").expand(tokens, k)
    base = get("vllm-0.33").router
    res = {"op": "moe_sum", "k": k, "hidden": hidden, "tokens": tokens, "rows": {}}
    for combine in ("fp32_slot_order", "lp_slot_order"):
        got = routing.combine(terms, ones, ids, base.replace(combine=combine), torch.bfloat16)
        res["rows"][combine] = {"outputs_bit_equal": float((got.view(torch.int16) == out.view(torch.int16)).float().mean())}
    return res


def run(library: str, tokens: int = 4096, seed: int = 0) -> dict:
    load(library)
    cases = []
    for experts in (8, 64, 128, 60):
        for k in (2, 3, 8):
            for renormalize in (True, False):
                for kind in ("gaussian", "coarse"):
                    cases.append(topk_softmax_case(experts, k, renormalize, kind, tokens, seed))
    for shape in ((8, 2, 1, 3), (256, 8, 4, 8), (512, 8, 4, 8)):
        for kind in ("gaussian", "coarse"):
            try:
                cases.append(grouped_case(*shape, tokens, seed, kind))
            except RuntimeError as e:  # a shape the kernel refuses is a result too, said in the JSON
                cases.append({"op": "grouped_topk", "shape": shape, "logits": kind,
                              "refused": str(e).splitlines()[0], "rows": {}})
    for k in (2, 3, 4, 5, 8):
        for hidden in (2048, 100):
            cases.append(moe_sum_case(k, hidden, min(tokens, 1024), seed))
    sha = hashlib.sha256(Path(library).read_bytes()).hexdigest()
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "library": str(library),
            "library_sha256": sha, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(), "transformers": _transformers(),
            "command": " ".join(["python3", *sys.argv]), "tokens": tokens, "seed": seed, "cases": cases}


def _transformers() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "not installed"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", required=True, help="vLLM's _moe_C_stable_libtorch.abi3.so")
    ap.add_argument("--out", required=True, help="folder for router_probe.json")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("router_probe_h200.py needs CUDA")
    result = run(args.library, args.tokens, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "router_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    for c in result["cases"]:
        head = " ".join(f"{k}={c[k]}" for k in ("op", "experts", "k", "hidden", "renormalize") if k in c)
        rows = "; ".join(f"{r}: " + (f"bits {v['outputs_bit_equal']:.4f}" if "outputs_bit_equal" in v else
                                     f"ids {v['ids_equal_in_order']:.4f} w-bits {v['weights_bit_equal']:.4f} "
                                     f"max_ulp {v['max_ulp']}") for r, v in c["rows"].items())
        print(f"{head} {c.get('logits', '')} | {rows}")


if __name__ == "__main__":
    main()
