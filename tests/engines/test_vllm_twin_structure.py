"""The twin's layout, checked against vLLM 0.33.0's own model code (read from its wheel with ast).

The twin (``rla.engines.vllm_twin``) claims vLLM's structure for Qwen2, Qwen3 and Llama: each decoder
layer starts with a plain norm (first layer) or a fused add + norm of the previous layer's output
and residual, the attention's residual add is fused into the post-attention norm, the model ends
with a fused add + final norm, q/k norms run per head before the rotary embedding (Qwen3), the MLP
applies its activation to one fused gate/up projection, and logits come from ``lm_head`` outside the
decoder. The checks query the calls in vLLM's ``forward`` methods (which ``self.<module>`` is
called, with how many arguments, in which order); no vLLM code is reproduced here. A vLLM that
changes them fails, naming the file and method.

The family twins (Gemma 3, Gemma 4, GLM-4 MoE, GPT-OSS) are checked the same way against
``models/gemma3.py``, ``gemma4.py``, ``glm4_moe.py``, ``gpt_oss.py``, and the facts they take from the
layers: GemmaRMSNorm's CUDA path is its native one, the fused MoE calls the CUDA activation kernels
whatever the mode and adds the shared experts' output outside its opaque op.
"""

import ast

import pytest


def _method(package, file, cls, name="forward"):
    """``cls.name`` in ``vllm/model_executor/models/<file>`` (or in ``vllm/<file>`` for a path with a folder)."""
    tree = ast.parse(package.read_text(f"vllm/{file}" if "/" in file else f"vllm/model_executor/models/{file}"))
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


# -- the families of rla.engines.vllm_twin_gemma3 / vllm_twin_gemma4 / vllm_twin_moe ----------------


def test_gemma3_layer_is_the_sandwich_with_two_fused_adds(vllm_engine):
    calls = _self_calls(_method(vllm_engine.package, "gemma3.py", "Gemma3DecoderLayer"))
    assert ("input_layernorm", 1) in calls and ("input_layernorm", 2) in calls
    names = [c[0] for c in calls]
    order = ["self_attn", "post_attention_layernorm", "pre_feedforward_layernorm", "mlp", "post_feedforward_layernorm"]
    assert [n for n in names if n in order] == order, names
    assert ("post_attention_layernorm", 1) in calls and ("post_feedforward_layernorm", 1) in calls  # plain norms
    assert ("pre_feedforward_layernorm", 2) in calls  # the attention's add fused into it
    assert ("norm", 2) in _self_calls(_method(vllm_engine.package, "gemma3.py", "Gemma3Model"))
    embed = ast.unparse(_method(vllm_engine.package, "gemma3.py", "Gemma3Model", "embed_input_ids"))
    assert "self.embed_tokens(input_ids) * self.normalizer" in embed


def test_gemma3_norms_are_zero_centred_native_in_every_mode(vllm_engine):
    text = vllm_engine.package.read_text("vllm/model_executor/models/gemma3.py")
    assert "GemmaRMSNorm" in text and " RMSNorm(" not in text
    layernorm = vllm_engine.package.read_text("vllm/model_executor/layers/layernorm.py")
    tree = ast.parse(layernorm)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GemmaRMSNorm")
    cuda = next(m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "forward_cuda")
    assert ast.unparse(cuda.body[-1]) == "return self.forward_native(x, residual)"
    assert 'torch.tensor(normalizer)' in text  # made in the model's dtype (vLLM builds under it)


def test_gemma4_layer_has_plain_adds_and_norms_then_the_per_layer_input_and_the_scalar(vllm_engine):
    """rla.engines.vllm_twin_gemma4: no fused add + norm (every norm called with one argument, every add
    `hidden_states + residual` in the code), the per-layer-input gate as two PyTorch ops, the layer scalar
    last; the model ends with the plain final norm and scales the embedding by its `normalizer`."""
    fn = _method(vllm_engine.package, "gemma4.py", "Gemma4DecoderLayer")
    calls = _self_calls(fn)
    norms = [c for c in calls if c[0].endswith(("layernorm", "_norm"))]
    assert norms and all(n == 1 for _, n in norms), norms
    names = [c[0] for c in calls]
    order = ["input_layernorm", "self_attn", "post_attention_layernorm", "pre_feedforward_layernorm", "mlp",
             "post_feedforward_layernorm", "per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm"]
    assert [n for n in names if n in order] == order, names
    code = ast.unparse(fn)
    for line in ("hidden_states = hidden_states + residual",
                 'gate = torch.nn.functional.gelu(gate, approximate=\'tanh\')',
                 "gated_per_layer = gate * per_layer_input", "hidden_states = hidden_states + per_layer_contribution",
                 "hidden_states = hidden_states * self.layer_scalar", "return (hidden_states, None)"):
        assert line in code, line
    assert code.index("per_layer_contribution)") < code.index("* self.layer_scalar")
    model = ast.unparse(_method(vllm_engine.package, "gemma4.py", "Gemma4Model"))
    assert "hidden_states = self.norm(hidden_states)" in model


def test_gemma4_per_layer_inputs_and_scale_constants_the_twin_follows(vllm_engine):
    pkg = vllm_engine.package
    init = ast.unparse(_method(pkg, "gemma4.py", "Gemma4Model", "__init__"))
    for made in ("torch.tensor(self.hidden_size_per_layer_input ** 0.5)", "torch.rsqrt(torch.tensor(2.0))",
                 "torch.tensor(config.hidden_size ** (-0.5))", "torch.tensor(config.hidden_size ** 0.5, "
                 "dtype=vllm_config.model_config.dtype)"):
        assert made in init, made  # no dtype: the loader's bf16 default (normalizer: the model's dtype)
    project = ast.unparse(_method(pkg, "gemma4.py", "Gemma4SelfDecoderLayers", "project_per_layer_inputs"))
    for step in ("per_layer_projection * self.per_layer_projection_scale", "self.per_layer_projection_norm(",
                 "(per_layer_projection + per_layer_inputs) * self.per_layer_input_scale"):
        assert step in project, step
    looked_up = ast.unparse(_method(pkg, "gemma4.py", "Gemma4SelfDecoderLayers", "get_per_layer_inputs"))
    assert "per_layer_embeds * self.embed_scale_per_layer" in looked_up
    attn = _method(pkg, "gemma4.py", "Gemma4Attention")
    names = [c[0] for c in _self_calls(attn)]
    names = names[names.index("qkv_proj"):]  # the branch of the layers with their own K/V (not KV-shared)
    assert names.index("qkv_proj") < names.index("q_norm") < names.index("k_norm") < names.index("rotary_emb")
    assert names.index("rotary_emb") < names.index("v_norm") < names.index("attn") and names[-1] == "o_proj"
    attn_init = ast.unparse(_method(pkg, "gemma4.py", "Gemma4Attention", "__init__"))
    assert "has_weight=False" in attn_init and "self.scaling = 1.0" in attn_init
    rope = pkg.read_text("vllm/model_executor/layers/rotary_embedding/__init__.py")
    assert 'scaling_type == "proportional"' in rope and "Gemma4RotaryEmbedding(" in rope


@pytest.mark.parametrize("file,cls", [("gemma3.py", "Gemma3Attention"), ("glm4_moe.py", "Glm4MoeAttention")])
def test_family_attention_normalises_q_k_then_rotates(vllm_engine, file, cls):
    names = [c[0] for c in _self_calls(_method(vllm_engine.package, file, cls))]
    assert names.index("qkv_proj") < names.index("q_norm") < names.index("rotary_emb") < names.index("attn")
    assert names.index("k_norm") < names.index("rotary_emb") and names[-1] == "o_proj"


def test_glm4_moe_and_gpt_oss_layers_are_the_llama_layout(vllm_engine):
    for file, cls in (("glm4_moe.py", "Glm4MoeDecoderLayer"), ("gpt_oss.py", "TransformerBlock")):
        calls = _self_calls(_method(vllm_engine.package, file, cls))
        assert ("input_layernorm", 1) in calls and ("input_layernorm", 2) in calls, file
        assert ("post_attention_layernorm", 2) in calls, file
    assert ("norm", 2) in _self_calls(_method(vllm_engine.package, "glm4_moe.py", "Glm4MoeModel"))
    assert ("norm", 2) in _self_calls(_method(vllm_engine.package, "gpt_oss.py", "GptOssModel"))
    glm = vllm_engine.package.read_text("vllm/model_executor/models/glm4_moe.py")
    assert 'config.rope_parameters.setdefault("partial_rotary_factor", 0.5)' in glm


def test_gpt_oss_model_file_facts_the_twin_follows(vllm_engine):
    text = vllm_engine.package.read_text("vllm/model_executor/models/gpt_oss.py")
    assert text.count("RMSNorm(config.hidden_size, eps=1e-5)") == 2 and "RMSNorm(self.config.hidden_size, eps=1e-5)" in text
    assert "dtype=torch.float32" in ast.unparse(_method(vllm_engine.package, "gpt_oss.py", "OAIAttention", "__init__"))
    build = ast.unparse(_method(vllm_engine.package, "gpt_oss.py", "OAIAttention", "_build_attention"))
    assert "self.layer_idx % 2 == 0" in build and "sinks=self.sinks" in build
    assert 'activation="swigluoai"' in text.replace("'", '"')


def test_fused_moe_calls_the_cuda_activation_in_every_mode_and_adds_shared_outside(vllm_engine):
    act = vllm_engine.package.read_text("vllm/model_executor/layers/fused_moe/activation.py")
    fn = next(n for n in ast.parse(act).body if isinstance(n, ast.FunctionDef) and n.name == "apply_moe_activation")
    body = ast.unparse(fn)
    assert "torch.ops._C.silu_and_mul(output, input)" in body and "torch.ops._C.swigluoai_and_mul(output, input)" in body
    runner = "model_executor/layers/fused_moe/runner/moe_runner.py"
    assert "result = shared_output + fused_output" in ast.unparse(_method(vllm_engine.package, runner, "MoERunner"))
    assert "torch.ops.vllm.moe_forward_shared" in ast.unparse(
        _method(vllm_engine.package, runner, "MoERunner", "_select_forward"))
