import json, time, torch
from rla.models import build_model, tiny_config
from rla.rl.sft import sft_train
from rla.rl.tasks import AdditionTask
from rla.rl.tokenizer import build_tokenizer
torch.manual_seed(0)
model = build_model(tiny_config("llama", "tiny"), dtype=torch.float32, seed=0)
n = sum(p.numel() for p in model.parameters())
t0 = time.time()
hist = sft_train(model, build_tokenizer(), AdditionTask(difficulty=4), steps=1500, batch_size=64, lr=1.5e-3,
                 eval_every=50, eval_size=128, stop_at_sampled=0.4, log_every=50, device="cpu")
print(json.dumps({"params": n, "steps_done": hist.steps_done, "wall_s": time.time() - t0,
                  "stopped_early": hist.stopped_early, "final_eval": hist.final_eval}, default=str))
