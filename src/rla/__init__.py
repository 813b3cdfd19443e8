"""rla: rounding-location alignment for LLM reinforcement learning."""
