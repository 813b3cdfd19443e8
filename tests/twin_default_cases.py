"""The vLLM twin's default-mode output on the tiny Qwen2, Qwen3 and Llama 3 cases at positions 40..63, built once
per test session (an Inductor compile each) for the two files that compare against it:
tests/engines/test_vllm_twin.py (the aligned model) and tests/engines/test_vllm_forward.py (the engine-backed
forward). A helper module, not a test file."""

from __future__ import annotations

import torch

from align_spec import tiny_config, tiny_model, tokens

LLAMA3 = dict(
    max_position_embeddings=256,
    rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=64),
)
CASES = {"qwen2": {}, "qwen3": {}, "llama3": LLAMA3}
IDS = tokens(2, 24)
POSITIONS = torch.arange(40, 64)[None].expand(2, 24)  # not starting at 0: the cache is indexed

_OUTPUTS: dict = {}


def case_model(case: str, seed: int = 0):
    family = "llama" if case == "llama3" else case
    return tiny_model(family, seed=seed, config=tiny_config(family, **CASES[case]))


def default_twin(case: str, engine):
    """``VllmTwin(case_model(case), engine, "default")(IDS, POSITIONS)``, once per case and engine."""
    from rla.engines.vllm_twin import VllmTwin

    key = (case, id(engine))
    if key not in _OUTPUTS:
        _OUTPUTS[key] = (engine, VllmTwin(case_model(case), engine, "default")(IDS, POSITIONS))
    return _OUTPUTS[key][1]
