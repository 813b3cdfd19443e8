"""The rollout side: what the inference engine produced, and the training side's view of it.

- :mod:`.sampler`: a rollout stack that rounds like a chosen engine profile (the stand-in for
  vLLM or SGLang in experiments), with a static KV cache and a CUDA-graph decode step on GPU
  (:mod:`.static_decode`);
- :mod:`.sampling`: the engines' logprob convention (fp32 logits / temperature, top-k / top-p,
  log_softmax of what is left), shared by the sampler and the training-side recomputation so the
  two read the same distribution;
- :mod:`.rollouts`: the versioned JSONL record format (``docs/rollouts.md``);
- :mod:`.train_logprobs`: training-side logprobs of recorded tokens (``rla.logprobs``).

Nothing is imported here: ``import rla.rollout.rollouts`` stays free of torch-heavy modules.
"""
