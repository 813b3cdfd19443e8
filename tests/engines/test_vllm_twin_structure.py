"""The twin's layout, checked against vLLM 0.33.0's own model code (read from its wheel with ast).

The twin (``rla.engines.vllm_twin``) claims vLLM's structure for Qwen2, Qwen3 and Llama: each decoder
layer starts with a plain norm (first layer) or a fused add + norm of the previous layer's output
and residual, the attention's residual add is fused into the post-attention norm, the model ends
with a fused add + final norm, q/k norms run per head before the rotary embedding (Qwen3), the MLP
applies its activation to one fused gate/up projection, and logits come from ``lm_head`` outside the
decoder. The checks query the calls in vLLM's ``forward`` methods (which ``self.<module>`` is
called, with how many arguments, in which order); no vLLM code is reproduced here. A vLLM that
changes them fails, naming the file and method.
"""

import ast

import pytest


def _method(package, file, cls, name="forward"):
    tree = ast.parse(package.read_text(f"vllm/model_executor/models/{file}"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and m.name == name:
                    return m
    raise AssertionError(f"vllm/model_executor/models/{file}: no {cls}.{name}")


def _self_calls(fn) -> list[tuple[str, int]]:
    """(module attribute, number of positional arguments) of every ``self.<attr>(...)`` call, in
    source order."""
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return [(n.func.attr, len(n.args)) for n in calls]


LAYERS = [("qwen2.py", "Qwen2DecoderLayer"), ("qwen3.py", "Qwen3DecoderLayer"), ("llama.py", "LlamaDecoderLayer")]


@pytest.mark.parametrize("file,cls", LAYERS)
def test_layers_start_with_a_norm_or_a_fused_add_norm_and_fuse_the_attention_add(vllm_engine, file, cls):
    calls = _self_calls(_method(vllm_engine.package, file, cls))
    assert ("input_layernorm", 1) in calls, f"{file} {cls}: no plain input norm for the first layer"
    assert ("input_layernorm", 2) in calls, f"{file} {cls}: no fused add + input norm"
    assert ("post_attention_layernorm", 2) in calls, f"{file} {cls}: the attention's add is not fused"
    names = [c[0] for c in calls]
    assert names.index("self_attn") < names.index("post_attention_layernorm") < names.index("mlp")


@pytest.mark.parametrize("file,cls", [("qwen2.py", "Qwen2Model"), ("llama.py", "LlamaModel")])
def test_models_end_with_a_fused_add_and_final_norm(vllm_engine, file, cls):
    assert ("norm", 2) in _self_calls(_method(vllm_engine.package, file, cls)), f"{file} {cls}"


def test_qwen3_model_is_qwen2s(vllm_engine):
    tree = ast.parse(vllm_engine.package.read_text("vllm/model_executor/models/qwen3.py"))
    bases = {n.name: [ast.unparse(b) for b in n.bases] for n in tree.body if isinstance(n, ast.ClassDef)}
    assert bases["Qwen3Model"] == ["Qwen2Model"]  # the same layer loop and final fused norm


@pytest.mark.parametrize("file,cls,qk_norm", [("qwen2.py", "Qwen2Attention", False),
                                              ("qwen3.py", "Qwen3Attention", True),
                                              ("llama.py", "LlamaAttention", False)])
def test_attention_projects_normalises_q_k_then_rotates(vllm_engine, file, cls, qk_norm):
    names = [c[0] for c in _self_calls(_method(vllm_engine.package, file, cls))]
    assert names.index("qkv_proj") < names.index("rotary_emb") < names.index("attn") < names.index("o_proj")
    if qk_norm:
        assert names.index("q_norm") < names.index("rotary_emb") and names.index("k_norm") < names.index("rotary_emb")


@pytest.mark.parametrize("file,cls", [("qwen2.py", "Qwen2MLP"), ("llama.py", "LlamaMLP")])
def test_mlp_is_one_gate_up_projection_then_down(vllm_engine, file, cls):
    names = [c[0] for c in _self_calls(_method(vllm_engine.package, file, cls))]
    assert names[0] == "gate_up_proj" and names[-1] == "down_proj"


@pytest.mark.parametrize("file,cls", [("qwen2.py", "Qwen2ForCausalLM"), ("llama.py", "LlamaForCausalLM")])
def test_logits_come_from_lm_head_outside_the_decoder(vllm_engine, file, cls):
    fn = _method(vllm_engine.package, file, cls, "compute_logits")
    args = [ast.unparse(a) for n in ast.walk(fn) if isinstance(n, ast.Call) for a in n.args]
    assert "self.lm_head" in args, f"{file} {cls}.compute_logits does not read lm_head"
