"""The live engine's side of `rla verify --live` alone: run vLLM on a checkpoint and write its outputs
(engine.json, rollouts.jsonl: what `rla verify --live --engine-outputs DIR` and `rla calibrate --live
--engine-outputs DIR` score), without loading the training side.

Why: vLLM 0.26 cannot start Gemma 4 under the transformers that rla's Gemma 4 alignment reads (5.24): from
5.17 on, ``Gemma4TextConfig`` keeps ``head_dim`` per layer (``per_layer_config``) and reading it from the
whole config raises, which vLLM 0.26's ``Gemma4ModelArchConfigConvertor.get_head_size``
(``transformers_utils/model_arch_config_convertor.py``) does; transformers 5.5.3's config has
``global_head_dim`` and works. So the engine runs in one process on 5.5.3 and the training side scores
its outputs in another on 5.24 (lab/bench/vllm026_session.sh, stage ``split-<mode>``). The prompts, the
decode prompts and the settings are `rla verify --live`'s (rla.commands._live.run_engine).

  python3 lab/bench/live_engine_dump.py --model DIR --mode eager --out DIR [--prompt-tokens 512,2048,4096]
"""

from __future__ import annotations

import argparse
import sys
import time

from rla.commands._args import positive_int
from rla.commands._live import DECODE_PROMPT_TOKENS, run_engine, token_list
from rla.diagnosis.output import staged
from rla.engines.live_verify import save
from rla.engines.vllm_live import GDN_PREFILL_BACKENDS, LiveSettings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=("default", "eager"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-tokens", type=token_list, default=token_list("512,2048,4096"))
    ap.add_argument("--responses", type=positive_int, default=8)
    ap.add_argument("--max-new-tokens", type=positive_int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gdn-prefill-backend", choices=GDN_PREFILL_BACKENDS, default=None)
    args = ap.parse_args(argv)
    import json
    from pathlib import Path

    cfg = json.loads((Path(args.model) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    longest = max(max(args.prompt_tokens), DECODE_PROMPT_TOKENS + args.max_new_tokens)
    settings = LiveSettings(mode=args.mode, max_model_len=max(longest + 64, 1024), seed=args.seed,
                            gdn_prefill_backend=args.gdn_prefill_backend)
    t0 = time.monotonic()
    data = run_engine(args, settings, cfg["vocab_size"], lambda m: print(f"[{time.monotonic() - t0:6.1f}s] {m}",
                                                                         file=sys.stderr, flush=True))
    with staged(args.out, overwrite=False, inputs=[args.model]) as tmp:
        save(tmp, data)
    print(f"engine outputs: {args.out}/engine.json, rollouts.jsonl ({len(data.prompts)} prompts, "
          f"{len(data.records)} responses)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
