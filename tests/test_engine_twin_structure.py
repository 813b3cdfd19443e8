"""The twin's layout, checked against vLLM 0.33.0's own model code (read from its wheel with ast).

The twin (``rla.engines.twin``) claims vLLM's structure for Qwen2, Qwen3 and Llama: each decoder
layer starts with a plain norm (first layer) or a fused add + norm of the previous layer's output
and residual, the attention's residual add is fused into the post-attention norm, the model ends
with a fused add + final norm, q/k norms run per head before the rotary embedding (Qwen3), the MLP
applies SiluAndMul to one fused gate/up projection, and logits come from ``lm_head`` outside the
decoder. These are the calls in vLLM's ``forward`` methods that make those claims true; a vLLM that
changes them fails here, naming the file and method.
"""

import ast

import pytest

EXPECTED = {
    ("qwen2.py", "Qwen2DecoderLayer"): [
        "if residual is None:\n        residual = hidden_states\n        hidden_states = self.input_layernorm(hidden_states)",
        "hidden_states, residual = self.input_layernorm(hidden_states, residual)",
        "hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)",
    ],
    ("qwen2.py", "Qwen2Model"): ["hidden_states, _ = self.norm(hidden_states, residual)"],
    ("qwen2.py", "Qwen2Attention"): ["q, k = self.rotary_emb(positions, q, k)"],
    ("qwen2.py", "Qwen2MLP"): ["gate_up, _ = self.gate_up_proj(x)", "self.act_fn(gate_up)"],
    ("qwen3.py", "Qwen3DecoderLayer"): [
        "hidden_states, residual = self.input_layernorm(hidden_states, residual)",
        "hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)",
    ],
    ("qwen3.py", "Qwen3Attention"): [
        "q_by_head = q.view(*q.shape[:-1], q.shape[-1] // self.head_dim, self.head_dim)\n    q_by_head = self.q_norm(q_by_head)",
        "k_by_head = self.k_norm(k_by_head)\n    k = k_by_head.view(k.shape)\n    q, k = self.rotary_emb(positions, q, k)",
    ],
    ("llama.py", "LlamaDecoderLayer"): [
        "hidden_states, residual = self.input_layernorm(hidden_states, residual)",
        "hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)",
    ],
    ("llama.py", "LlamaModel"): ["hidden_states, _ = self.norm(hidden_states, residual)"],
    ("llama.py", "LlamaAttention"): ["q, k = self.rotary_emb(positions, q, k)"],
    ("llama.py", "LlamaMLP"): ["x, _ = self.gate_up_proj(x)", "x = maybe_fused_act_quant(self.act_fn, x, self.down_proj)"],
}


def _forward_source(package, file, cls):
    tree = ast.parse(package.read_text(f"vllm/model_executor/models/{file}"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and m.name == "forward":
                    return ast.unparse(m)
    raise AssertionError(f"vllm/model_executor/models/{file}: no {cls}.forward")


@pytest.mark.parametrize("where", list(EXPECTED), ids=lambda w: f"{w[0]}:{w[1]}")
def test_vllm_model_code_has_the_twins_structure(vllm_engine, where):
    source = _forward_source(vllm_engine.package, *where)
    for call in EXPECTED[where]:
        assert call in source, f"{where[0]} {where[1]}.forward no longer has:\n{call}\n---\n{source}"


def test_qwen3_model_is_qwen2s_and_logits_come_from_lm_head(vllm_engine):
    tree = ast.parse(vllm_engine.package.read_text("vllm/model_executor/models/qwen3.py"))
    bases = {n.name: [ast.unparse(b) for b in n.bases] for n in tree.body if isinstance(n, ast.ClassDef)}
    assert bases["Qwen3Model"] == ["Qwen2Model"]  # the same layer loop and final fused norm
    for file, cls in (("qwen2.py", "Qwen2ForCausalLM"), ("llama.py", "LlamaForCausalLM")):
        tree = ast.parse(vllm_engine.package.read_text(f"vllm/model_executor/models/{file}"))
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        compute = next(ast.unparse(m) for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "compute_logits")
        assert "self.logits_processor(self.lm_head, hidden_states)" in compute
