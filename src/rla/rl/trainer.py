"""GRPO / REINFORCE with decoupled rollout and training stacks: the loop behind ``rla train``.

One step::

    prompts (seeded by seed, step, rank) -> Sampler.generate (engine profile, bf16 engine copy)
      -> rewards -> group advantages
      -> training forward on the recorded tokens          (log pi before any update: the
                                                          step's mismatch vs. the rollout mu)
      -> ppo_epochs x mini_batches AdamW updates on the fp32 master weights
      -> Sampler.load_weights(master)                     (weight sync, every step)
      -> one log.jsonl line; a checkpoint every checkpoint_every steps

pi_old is the sampler's recorded logprob (``pi_old=rollout``, the default): the PPO ratio of a
step's first update is ``exp(log pi_train - log mu)``, the rollout/training mismatch itself.
The mismatch metrics logged each step (``rla.metrics.mismatch``) are those of the training
forward before the step's first update, against the rollout logprobs, so they are "step-0"
metrics at every step. With one update per step they come from the same forward that makes the
gradient; with more, from an extra no-grad pass.

Determinism: every random choice derives from ``(seed, step, rank)`` (prompts, sampling, the
mini-batch order), and the checkpoint holds everything else (weights, AdamW, scheduler, loss
scale, generator states), so a run stopped or killed after step k and resumed writes the same
log lines and reaches the same weights, bit for bit, as one that never stopped (on one machine
and software stack; ``time/`` and ``memory/`` fields excepted).
"""

from __future__ import annotations

import functools
import math
import random
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rla.rl import checkpoint as ckpt
from rla.rl.config import RESUME_SAFE_FIELDS, TrainConfig
from rla.rl.distributed import Dist, init_distributed
from rla.rl.forward import make_micro_batch
from rla.rl.fsdp_state import load_optimizer_state_by_name, optimizer_state_by_name
from rla.rl.grpo import aggregation_weights, group_advantages, importance_weights, per_token_loss
from rla.rl.precision import Policy
from rla.environment import environment
from rla.rl.lr_schedule import lr_factor
from rla.rl.runlock import RunLock
from rla.rl.runlog import RunLog, TrainingBar, collapse_fields, padded, summarize
from rla.rl.warm_start import build_task, initial_model

__all__ = ["Trainer", "train", "derive_seed", "resolve_device"]


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (NumPy SeedSequence: distinct tuples give independent streams)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> 1)


_PROMPTS, _SAMPLING, _ORDER, _GLOBAL = 1, 2, 3, 4


def resolve_device(name: str, dist: Dist | None = None) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name!r} but CUDA is not available; use device=cpu")
        if dist is not None and dist.fsdp:
            device = torch.device("cuda", dist.local_rank)
        elif device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


# ------------------------------------------------------------------------------------ trainer


@dataclass
class Rollouts:
    """One rank's rollouts of a step (sequence i answers problem i // group_size)."""

    prompts: list[list[int]]
    responses: list[list[int]]
    rollout_lp: list[torch.Tensor]  # fp32 (exact: the sampler computes them in fp32)
    rewards: torch.Tensor
    advantages: torch.Tensor
    truncated: list[bool]
    routes: list[dict | None]  # the engine's routes per sequence (MoE models), else None each


class Trainer:
    """Owns the policy (master + compute copy), the sampler, the optimizer and the run folder.

    ``ops``: the plug through which a study's knob enters the training forward. With
    ``train_precision=aligned`` the aligned regions call ``ops`` instead of ``rla.ops`` (``rla.align``'s
    ``ops=``; the dose-response study's ``lab.dose.knob.DoseOps``); the rollouts are never touched.
    It is not part of the config: the caller that plugs it in records it beside the run and passes
    the same one on resume.
    """

    def __init__(self, config: TrainConfig, *, resume: bool = False, log=print, ops=None,
                 take_over: bool = False):
        self.cfg = cfg = config
        self.say = log if log is not None else (lambda *a, **k: None)
        device_guess = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                                    ("cpu" if cfg.device == "auto" else cfg.device))
        self.dist = init_distributed(cfg.fsdp, device_guess)
        self.device = resolve_device(cfg.device, self.dist)
        self.out = Path(cfg.out_dir)
        self.ckpt_root = self.out / "checkpoints"
        n_local = cfg.prompts_per_step * cfg.group_size
        if cfg.prompts_per_step % self.dist.world:
            raise ValueError(f"prompts_per_step={cfg.prompts_per_step} must be a multiple of the {self.dist.world} ranks")
        n_local //= self.dist.world
        if n_local % cfg.mini_batches:
            raise ValueError(f"each rank's {n_local} responses do not split into mini_batches={cfg.mini_batches}")
        self.lock = None
        self.runlog = None
        if self.dist.main:  # one writer per run folder (rla.rl.runlock): before anything is read or written
            self.lock = RunLock(self.out, take_over=take_over, say=self.say)
        try:
            self._init(cfg, resume, ops)
        except BaseException:
            self._release()
            raise

    def _init(self, cfg: TrainConfig, resume: bool, ops) -> None:
        from rla.rl.tokenizer import build_tokenizer
        from rla.rollout.sampler import Sampler

        # a temporary checkpoint name of this process's own: a writer that got past the lock (another
        # host, --take-over) still never publishes or deletes another's half-written folder
        self._ckpt_tag = self.dist.broadcast_object(uuid.uuid4().hex[:12])
        self._check_run_folder(resume)

        self.task = build_task(cfg)
        self.tokenizer = build_tokenizer()
        self.max_new_tokens = cfg.max_new_tokens or (self.task.max_length() + 8)
        torch.manual_seed(derive_seed(cfg.seed, self.dist.rank, _GLOBAL))
        random.seed(derive_seed(cfg.seed, self.dist.rank, _GLOBAL))
        np.random.seed(derive_seed(cfg.seed, self.dist.rank, _GLOBAL) % 2**32)

        master = initial_model(cfg, self.dist, self.device, self.say).float().to(self.device)
        self.moe = _moe_layers(master) > 0
        if cfg.routing_replay != "none" and not self.moe:
            raise ValueError(f"routing_replay={cfg.routing_replay!r}: {type(master).__name__} has no MoE block")
        sampler_kw = dict(cache=cfg.rollout_cache)
        if self.moe:  # the engine's router too, and its routes recorded (rla.rl.routes)
            if cfg.rollout_cache == "static":
                raise ValueError("rollout_cache=static with an MoE model: its rollouts record routes, which needs "
                                 "the dynamic cache; use rollout_cache=auto or dynamic")
            from rla.profiles import REGIONS

            sampler_kw = dict(cache="dynamic", regions=(*REGIONS, "router"), record_routes=True)
        self.sampler = Sampler(master, profile=cfg.rollout_profile, dtype=cfg.rollout_torch_dtype(), device=self.device,
                               decode_attention=cfg.rollout_decode_attention, step=0, **sampler_kw)
        self.policy = Policy(
            master, precision=cfg.train_precision, rollout_profile=cfg.rollout_profile,
            align_regions=cfg.align_regions, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
            chunk=cfg.logprob_chunk, dist=self.dist, loss_scale_init=cfg.loss_scale_init,
            loss_scale_growth_interval=cfg.loss_scale_growth_interval, inv_freq=cfg.train_inv_freq,
            ops=ops,
        )
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            functools.partial(lr_factor, steps=cfg.steps, warmup=cfg.warmup_steps, schedule=cfg.lr_schedule),
        )
        self.step = 0
        self.elapsed = 0.0
        if resume:
            found = ckpt.latest(self.ckpt_root)
            if found is not None:
                self._restore(found)
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.yaml").write_text(cfg.to_yaml())
        self.runlog = RunLog(self.out, start_step=self.step, tensorboard=cfg.tensorboard) if self.dist.main else None
        self._stop = False

    # -------------------------------------------------------------------------------- setup
    def _check_run_folder(self, resume: bool) -> None:
        import yaml

        saved = self.out / "config.yaml"
        has_run = ckpt.latest(self.ckpt_root) is not None or (self.out / "log.jsonl").is_file()
        if not resume:
            if has_run:
                raise ValueError(
                    f"{self.out} already holds a run (checkpoints or log.jsonl); pass --resume to continue "
                    "it, or choose another out_dir"
                )
            return
        if saved.is_file():
            old = yaml.safe_load(saved.read_text()) or {}
            new = self.cfg.to_dict()
            changed = sorted(k for k in new if k not in RESUME_SAFE_FIELDS and old.get(k, new[k]) != new[k])
            if changed:
                diff = ", ".join(f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in changed)
                raise ValueError(
                    f"cannot resume {self.out} with a different config ({diff}); only "
                    f"{', '.join(sorted(RESUME_SAFE_FIELDS))} may change on resume"
                )
            if new.get("lr_schedule") == "cosine" and old.get("steps", new["steps"]) != new["steps"]:
                raise ValueError(
                    f"cannot resume {self.out} with steps {old['steps']} -> {new['steps']} under lr_schedule: cosine: "
                    "the cosine decays over `steps`, so the lr of every step after the resume would change and the "
                    "run would match neither length. `steps` may change on resume under lr_schedule: constant; for "
                    f"a longer cosine run start a new out_dir, or keep steps={old['steps']}"
                )

    # -------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path | None:
        meta, tensors = ckpt.rng_state()
        if self.dist.main:
            ckpt.tmp_dir(self.ckpt_root, self.step, self._ckpt_tag).mkdir(parents=True, exist_ok=True)
        self.dist.barrier()
        ckpt.write_rng(self.ckpt_root, self.step, self.dist.rank, meta, tensors, tag=self._ckpt_tag)
        model = self.policy.full_state_dict()
        opt_state, groups = optimizer_state_by_name(self.policy, self.optimizer, self.dist.fsdp)
        self.dist.barrier()
        path = None
        if self.dist.main:
            params = dict(self.policy.named_parameters())
            model = {k: v for k, v in model.items() if k in params}  # parameters only, tied ones once
            groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]
            state = {
                "step": self.step, "elapsed_s": self.elapsed, "optimizer_param_groups": groups,
                "scheduler": self.scheduler.state_dict(), "loss_scaler": self.policy.scaler.state_dict(),
                "world": self.dist.world, "config": self.cfg.to_dict(),
                "sampler_seed_next": derive_seed(self.cfg.seed, self.step, 0, _SAMPLING),
            }
            path = ckpt.save(self.ckpt_root, self.step, model=model, optimizer_state=opt_state, state=state,
                             keep=self.cfg.keep_checkpoints, tag=self._ckpt_tag)
        self.dist.barrier()
        return path

    def _restore(self, path: Path) -> None:
        data = ckpt.load(path, rank=self.dist.rank)
        st = data["state"]
        if st.get("world", 1) != self.dist.world:
            self.say(f"note: {path} was written by {st.get('world')} rank(s), resuming on {self.dist.world}: "
                     "prompts and sampling seeds are per rank, so the run continues differently")
        self.policy.load_full_state_dict(data["model"])
        load_optimizer_state_by_name(self.policy, self.optimizer, self.dist.fsdp, data["optimizer_state"],
                                     st["optimizer_param_groups"], self.device)
        self.scheduler.load_state_dict(st["scheduler"])
        self.policy.scaler.load_state_dict(st["loss_scaler"])
        self.step, self.elapsed = int(st["step"]), float(st["elapsed_s"])
        if data["rng"] is not None:
            ckpt.set_rng_state(*data["rng"])
        self.sampler.load_weights(self.policy.full_state_dict(), step=self.step)
        self.say(f"resumed from {path} at step {self.step}")

    # -------------------------------------------------------------------------------- one step
    def _rollout(self, k: int) -> Rollouts:
        from rla.rollout.sampler import SamplingParams

        cfg, G = self.cfg, self.cfg.group_size
        n_prompts = cfg.prompts_per_step // self.dist.world
        problems = self.task.sample(random.Random(derive_seed(cfg.seed, k, self.dist.rank, _PROMPTS)), n_prompts)
        prompt_ids = [self.tokenizer(p.prompt)["input_ids"] for p in problems]
        prompts = [ids for ids in prompt_ids for _ in range(G)]
        params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                max_new_tokens=self.max_new_tokens,
                                seed=derive_seed(cfg.seed, k, self.dist.rank, _SAMPLING))
        records = self.sampler.generate(prompts, params)
        texts = self.tokenizer.batch_decode([r.response_ids for r in records], skip_special_tokens=True)
        rewards = torch.tensor([float(self.task.reward(problems[i // G], t)) for i, t in enumerate(texts)])
        eos = set(self.sampler.eos_ids)
        return Rollouts(
            prompts=[list(r.prompt_ids) for r in records],
            responses=[list(r.response_ids) for r in records],
            rollout_lp=[torch.tensor(r.logprobs, dtype=torch.float32) for r in records],
            rewards=rewards,
            advantages=group_advantages(rewards, G, cfg.scale_rewards),
            truncated=[r.response_ids[-1] not in eos for r in records],
            routes=[r.routes for r in records],
        )

    def _micro_groups(self, idx: list[int], ro: Rollouts) -> list[list[int]]:
        """Token-budget micro-batches of ``idx``; padded with empty ones to the same count on every rank."""
        from rla.rollout.train_logprobs import micro_batches

        lengths = [len(ro.prompts[i]) + len(ro.responses[i]) for i in idx]
        groups = [[idx[j] for j in g] for g in micro_batches(lengths, self.cfg.max_tokens)]
        n = self.dist.all_reduce(torch.tensor(len(groups), device=self.device), "max").item()
        return groups + [[] for _ in range(int(n) - len(groups))]

    def _forward(self, seqs: list[int], ro: Rollouts, routes_out: list | None = None):
        """Training forward of sequences ``seqs`` -> (logprobs, entropy, seq position per token).

        An empty ``seqs`` (a rank with fewer micro-batches under FSDP) runs a one-token dummy so
        that every rank joins the same collectives; its outputs are empty. MoE models: the forward
        replays the recorded routes under ``routing_replay``, and with ``routes_out`` (a list) the
        routes it took are captured and compared with the records' (``rla.rl.routes``).
        """
        if not seqs:
            mb = make_micro_batch([[0]], [[0]], [0]).to(self.device)
            lp, ent = self.policy.forward(mb)
            return lp, ent, mb.seq, True
        mb = make_micro_batch([ro.prompts[i] for i in seqs], [ro.responses[i] for i in seqs],
                              list(range(len(seqs)))).to(self.device)
        if not self.moe:
            lp, ent = self.policy.forward(mb)
            return lp, ent, mb.seq, False
        from rla.rl.routes import micro_batch_routing

        with micro_batch_routing(self.policy.compute, self.cfg.routing_replay, [ro.routes[i] for i in seqs],
                                 [len(ro.prompts[i]) for i in seqs], [len(ro.responses[i]) for i in seqs],
                                 mb.input_ids.shape[1], capture=routes_out is not None) as stats:
            lp, ent = self.policy.forward(mb)
        if routes_out is not None:
            routes_out.extend(stats)
        return lp, ent, mb.seq, False

    def _update(self, k: int, ro: Rollouts) -> dict[str, Any]:
        cfg = self.cfg
        n = len(ro.responses)
        lengths = torch.tensor([len(r) for r in ro.responses])
        before: list[torch.Tensor | None] = [None] * n  # log pi before the step's first update
        entropy: list[torch.Tensor | None] = [None] * n
        route_stats: list = []  # the step's first forward's routes vs the records' (MoE models)
        if cfg.updates_per_step > 1:
            with torch.no_grad():
                for seqs in self._micro_groups(list(range(n)), ro):
                    lp, ent, _, dummy = self._forward(seqs, ro, route_stats)
                    if not dummy:
                        for j, piece in zip(seqs, lp.split([len(ro.responses[i]) for i in seqs])):
                            before[j] = piece.detach().cpu()
                        for j, piece in zip(seqs, ent.split([len(ro.responses[i]) for i in seqs])):
                            entropy[j] = piece.cpu()
        acc = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0, "ratio_sum": 0.0, "ratio_max": 0.0, "ratio_min": math.inf,
               "is_sum": 0.0, "nonfinite": 0.0}
        grad_norms, skipped, applied = [], 0, 0
        lr = self.optimizer.param_groups[0]["lr"]
        per_mb = n // cfg.mini_batches
        for epoch in range(cfg.ppo_epochs):
            if cfg.mini_batches > 1:
                gen = torch.Generator().manual_seed(derive_seed(cfg.seed, k, self.dist.rank, _ORDER, epoch))
                order = torch.randperm(n, generator=gen).tolist()
            else:
                order = list(range(n))
            for m in range(cfg.mini_batches):
                idx = order[m * per_mb : (m + 1) * per_mb]
                totals = torch.tensor([float(lengths[idx].sum()), float(len(idx))], dtype=torch.float64, device=self.device)
                self.dist.all_reduce(totals)
                tokens_all, seqs_all = float(totals[0]), float(totals[1])
                mb_loss = 0.0
                for seqs in self._micro_groups(idx, ro):
                    first = cfg.updates_per_step == 1
                    lp, ent, pos, dummy = self._forward(seqs, ro, route_stats if first else None)
                    if dummy:
                        loss = lp.sum() * 0.0
                    else:
                        sizes = [len(ro.responses[i]) for i in seqs]
                        mu = torch.cat([ro.rollout_lp[i] for i in seqs]).to(self.device)
                        if cfg.updates_per_step == 1:
                            old_train = lp.detach()
                            for j, a, b in zip(seqs, lp.detach().split(sizes), ent.split(sizes)):
                                before[j], entropy[j] = a.cpu(), b.cpu()
                        else:
                            old_train = torch.cat([before[i] for i in seqs]).to(self.device)
                        finite = torch.isfinite(lp.detach()) & torch.isfinite(old_train)
                        safe_old = torch.where(finite, old_train, torch.zeros_like(old_train))
                        old = mu if cfg.pi_old == "rollout" else safe_old
                        w_is = importance_weights(safe_old, mu, pos, len(seqs), cfg.is_correction, cfg.is_cap)
                        adv = ro.advantages[seqs].to(self.device)[pos]
                        lp_safe = torch.where(finite, lp, lp.detach().nan_to_num(0.0, 0.0, 0.0))
                        loss_t, clipped, ratio = per_token_loss(
                            lp_safe, old, adv, algorithm=cfg.algorithm, clip_low=cfg.clip_eps,
                            clip_high=cfg.clip_high, clip_ratio_c=cfg.clip_ratio_c, weights=w_is)
                        agg = aggregation_weights(lengths[seqs], cfg.loss_agg, tokens_all, seqs_all)
                        agg = agg.to(device=self.device, dtype=loss_t.dtype)[pos]
                        loss = (loss_t * agg * finite).sum()
                        fin = finite.float()
                        acc["clipped"] += float((clipped.float() * fin).sum())
                        acc["tokens"] += float(fin.sum())
                        acc["nonfinite"] += float((~finite).sum())
                        acc["ratio_sum"] += float((ratio * fin).sum())
                        r_fin = ratio[finite]
                        if r_fin.numel():
                            acc["ratio_max"] = max(acc["ratio_max"], float(r_fin.max()))
                            acc["ratio_min"] = min(acc["ratio_min"], float(r_fin.min()))
                        acc["is_sum"] += float((w_is * fin).sum())
                        mb_loss += float(loss.detach())
                    # FSDP averages gradients over ranks; the loss is already a global mean
                    (loss * (self.dist.world * self.policy.scaler.scale)).backward()
                    self.policy.accumulate_grads()
                acc["loss"] += float(self.dist.all_reduce(torch.tensor(mb_loss, device=self.device)))
                found_inf = self.policy.unscale_and_check()
                if found_inf:
                    skipped += 1
                else:
                    gn = torch.nn.utils.clip_grad_norm_(
                        self.policy.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
                    gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
                    grad_norms.append(float(gn))
                    self.optimizer.step()
                    applied += 1
                self.optimizer.zero_grad(set_to_none=True)
                self.policy.scaler.update(found_inf)
                self.policy.sync()
        return {"acc": acc, "grad_norms": grad_norms, "skipped": skipped, "applied": applied, "lr": lr,
                "before": before, "entropy": entropy, "routes": route_stats}

    def _record(self, k: int, ro: Rollouts, upd: dict, times: dict) -> dict[str, Any] | None:
        """Gather this step's numbers to rank 0 and build its log line (None on other ranks)."""
        from rla.metrics import mismatch

        acc = torch.tensor([upd["acc"][key] for key in ("clipped", "tokens", "ratio_sum", "is_sum", "nonfinite")],
                           dtype=torch.float64, device=self.device)
        self.dist.all_reduce(acc)
        rmax = self.dist.all_reduce(torch.tensor(upd["acc"]["ratio_max"], device=self.device), "max")
        rmin = -self.dist.all_reduce(torch.tensor(-upd["acc"]["ratio_min"], device=self.device), "max")
        payload = {
            "rewards": ro.rewards.tolist(), "lengths": [len(r) for r in ro.responses], "truncated": ro.truncated,
            "mu": [t.numpy() for t in ro.rollout_lp], "before": [t.numpy() for t in upd["before"]],
            "entropy": [t.numpy() for t in upd["entropy"]], "routes": upd["routes"],
        }
        gathered = self.dist.gather_objects(payload)
        if not self.dist.main:
            return None
        cat = lambda key: [x for p in gathered for x in p[key]]  # noqa: E731
        rewards = np.array(cat("rewards"), dtype=np.float64)
        lengths = np.array(cat("lengths"))
        before, mu, ent = cat("before"), cat("mu"), cat("entropy")
        G = self.cfg.group_size
        groups = rewards.reshape(-1, G)
        rec: dict[str, Any] = {"step": k}
        rec["reward/mean"] = float(rewards.mean())
        rec["reward/std"] = float(rewards.std())
        rec["reward/max"] = float(rewards.max())
        rec["reward/zero_std_groups"] = float((groups.std(axis=1) == 0).mean())
        rec["response/length/mean"] = float(lengths.mean())
        rec["response/length/max"] = int(lengths.max())
        rec["response/truncated_frac"] = float(np.mean(cat("truncated")))
        clipped, tokens, ratio_sum, is_sum, nonfinite = acc.tolist()
        ent_all = np.concatenate(ent)
        rec["train/entropy"] = float(ent_all.mean())
        rec["train/loss"] = upd["acc"]["loss"] / max(1, self.cfg.updates_per_step)
        rec["train/grad_norm"] = float(np.mean(upd["grad_norms"])) if upd["grad_norms"] else float("nan")
        rec["train/clip_frac"] = clipped / max(tokens, 1.0)
        rec["train/ratio/mean"] = ratio_sum / max(tokens, 1.0)
        rec["train/ratio/max"] = float(rmax)
        rec["train/ratio/min"] = float(rmin)
        rec["train/lr"] = upd["lr"]
        rec["train/updates"] = upd["applied"]
        rec["train/skipped_updates"] = upd["skipped"]
        rec["train/nonfinite_tokens"] = int(nonfinite)
        if self.cfg.train_precision == "fp16":
            rec["train/loss_scale"] = self.policy.scaler.scale
        if self.cfg.is_correction != "none":
            rec["train/is_weight/mean"] = is_sum / max(tokens, 1.0)
        # step-0 mismatch of this step: the forward before the first update vs the rollout logprobs
        keep = [i for i, b in enumerate(before) if np.isfinite(b).all()]
        if keep:
            train_lp, roll_lp, mask, lens = padded([before[i] for i in keep], [mu[i] for i in keep])
            rec.update(mismatch(train_lp, roll_lp, mask, response_lengths=lens))
        if self.moe:
            from rla.rl.routes import routing_record

            rec.update(routing_record(cat("routes")))
        rec.update(collapse_fields(self.runlog.history + [rec], self.cfg))
        rec.update(times)
        return rec

    def _peak_memory_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def run_step(self) -> dict[str, Any] | None:
        k = self.step
        t0 = time.perf_counter()
        ro = self._rollout(k)
        t1 = time.perf_counter()
        upd = self._update(k, ro)
        self.scheduler.step()
        t2 = time.perf_counter()
        self.sampler.load_weights(self.policy.full_state_dict(), step=k + 1)  # weight sync trainer -> sampler
        t3 = time.perf_counter()
        self.elapsed += t3 - t0
        times = {"time/rollout_s": t1 - t0, "time/train_s": t2 - t1, "time/sync_s": t3 - t2,
                 "time/step_s": t3 - t0, "time/elapsed_s": self.elapsed, "memory/peak_mb": self._peak_memory_mb()}
        rec = self._record(k, ro, upd, times)
        self.step = k + 1
        if rec is not None:
            self.runlog.write(rec)
        return rec

    # -------------------------------------------------------------------------------- the loop
    def train(self, until_step: int | None = None) -> dict[str, Any]:
        """Run to ``cfg.steps`` (or ``until_step``); checkpoint and return a summary.

        SIGTERM / SIGINT and ``time_limit_s`` stop the run after the current step, checkpointed,
        so that ``--resume`` continues it.
        """
        cfg = self.cfg
        end = min(cfg.steps, until_step if until_step is not None else cfg.steps)
        deadline = time.monotonic() + cfg.time_limit_s if cfg.time_limit_s else None
        previous = {}

        def request_stop(signum, frame):
            self._stop = True

        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, request_stop)
        except ValueError:  # not the main thread
            previous = {}
        progress = TrainingBar(cfg.progress and self.dist.main, self.step, end)
        try:
            while self.step < end:
                rec = self.run_step()
                if rec is not None:
                    progress.update(self.step, rec)
                stop = self._stop or (deadline is not None and time.monotonic() > deadline)
                stop = bool(self.dist.all_reduce(torch.tensor(float(stop), device=self.device), "max").item())
                if self.step % cfg.checkpoint_every == 0 or self.step == end or stop:
                    self.save_checkpoint()
                if stop:
                    break
        finally:
            progress.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        result = {"finished": self.step >= cfg.steps, "step": self.step, "out_dir": str(self.out)}
        if self.dist.main:
            summary = {**result, **summarize(self.runlog.history, cfg.collapse_window), "environment": environment()}
            (self.out / "summary.json").write_text(_json(summary))
            result["summary"] = summary
        return result

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def close(self) -> None:
        if self.runlog is not None:
            self.runlog.close()
        self._release()
        if self.dist.active:
            # leave together: a rank that tears gloo down while its peer is still in the last
            # collective can abort the peer ("terminate called without an active exception")
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()


def _moe_layers(model) -> int:
    from rla.alignment import moe_layers

    return moe_layers(model)  # a family rla.align does not know raises, as the sampler's align would


def _json(obj) -> str:
    import json

    return json.dumps(obj, indent=1, default=float, allow_nan=True)


def train(config: TrainConfig, *, resume: bool = False, until_step: int | None = None, log=print,
          ops=None, take_over: bool = False) -> dict[str, Any]:
    """Build a ``Trainer``, run it, close it; returns ``Trainer.train``'s result (``ops``: ``Trainer``'s plug)."""
    trainer = Trainer(config, resume=resume, log=log, ops=ops, take_over=take_over)
    try:
        return trainer.train(until_step=until_step)
    finally:
        trainer.close()
