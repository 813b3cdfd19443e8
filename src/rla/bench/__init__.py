"""Benchmarks of the aligned ops and of an aligned training step (``rla bench``).

``ops``: each region side by side -- HF eager, naive fp32 upcast, torch.compile of the fp32
expression, Liger Kernel (when importable) and ``rla`` -- forward, backward, forward+backward,
peak memory and achieved bandwidth against a copy bandwidth measured in the same run.
``e2e``: a training step of randomly initialised models of real checkpoints' shapes (Qwen2.5,
Qwen3, Gemma 3) under HF bf16, ``rla`` aligned to engine profiles, naive upcasts, fp16, fp32 and
Liger Kernel. Both need CUDA; results go to
``results/benchmarks/`` as JSON plus a Markdown table, stamped with GPU, versions, date and command.
"""
