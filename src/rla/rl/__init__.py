"""RL on small models: synthetic verifiable tasks, a character tokenizer, and an SFT warm start.

``rla.rl.tasks`` holds tasks with exact-match rewards and a difficulty knob that sets the response
length (tens to thousands of tokens, where RoPE drift and sequence-level mismatch grow);
``rla.rl.tokenizer`` the character-level tokenizer every task speaks (one character, one token);
``rla.rl.sft`` the supervised warm start that takes a random model to a moderate accuracy, so that
RL has something to improve and the rollout/training mismatch is measured on realistic, peaked
distributions rather than on the flat ones of random weights.
"""
