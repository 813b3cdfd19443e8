"""GRPO / REINFORCE losses, advantages, IS weights and aggregation against hand-written formulas;
the chunked training forward against a plain full-logits computation (values and gradients);
the config's validation and YAML / override handling."""

import math

import numpy as np
import pytest
import torch

from rla.rl.config import TrainConfig, apply_overrides, load_config
from rla.rl.grpo import (
    aggregation_weights,
    entropy_from_logprobs,
    group_advantages,
    importance_weights,
    per_token_loss,
)

# ------------------------------------------------------------------------------- advantages


def test_group_advantages_normalise_within_each_group():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.0])
    adv = group_advantages(r, 4)
    g0 = np.array([1, 0, 0, 1.0])
    want0 = (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-6)  # unbiased std, as torch.std / TRL
    assert np.allclose(adv[:4].numpy(), want0, atol=1e-6)
    assert torch.equal(adv[4:8], torch.zeros(4))  # no signal in a constant group
    g2 = np.array([1, 0, 0, 0.0])
    assert np.allclose(adv[8:].numpy(), (g2 - g2.mean()) / (g2.std(ddof=1) + 1e-6), atol=1e-6)
    centred = group_advantages(r, 4, scale="none")
    assert np.allclose(centred[8:].numpy(), g2 - g2.mean())
    with pytest.raises(ValueError, match="groups of 5"):
        group_advantages(r, 5)


# ------------------------------------------------------------------------------- losses


def test_dual_clip_caps_negative_advantage_tokens_as_verl_does():
    ratios = torch.tensor([0.5, 2.0, 5.0, 50.0, 5.0], dtype=torch.float64)
    adv = torch.tensor([-1.0, -1.0, -1.0, -2.0, 1.0], dtype=torch.float64)
    old = torch.zeros(5, dtype=torch.float64)
    lp = ratios.log().requires_grad_(True)
    loss, clipped, _ = per_token_loss(lp, old, adv, clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)
    # verl core_algos: where A < 0, min(-A * c, max(-A r, -A clip(r))); else max(-A r, -A clip(r))
    ppo = torch.maximum(-adv * ratios, -adv * ratios.clamp(0.8, 1.2))
    want = torch.where(adv < 0, torch.minimum(-adv * 3.0, ppo), ppo)
    assert torch.allclose(loss, want)
    assert clipped.tolist() == [True, False, True, True, True]
    loss.sum().backward()
    # no gradient from the capped tokens (r = 5, 50 with A < 0) nor the PPO-clipped ones
    assert torch.allclose(lp.grad, torch.tensor([0.0, 2.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    plain, _, _ = per_token_loss(lp.detach(), old, adv, clip_low=0.2, clip_high=0.2)
    assert float(plain[3]) == pytest.approx(100.0) and float(loss[3].detach()) == 6.0  # unbounded without the dual clip


def test_ppo_clip_loss_clip_fraction_and_gradient():
    # ratio exp(lp - old) for six tokens: inside, above and below the clip range, A > 0 and A < 0
    ratios = torch.tensor([1.05, 1.5, 0.5, 1.05, 1.5, 0.5], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    old = torch.full((6,), -1.0, dtype=torch.float64)
    lp = (old + ratios.log()).requires_grad_(True)
    loss, clipped, ratio = per_token_loss(lp, old, adv, clip_low=0.2, clip_high=0.28)
    # verl: max(-A r, -A clip(r)); clipped where the clipped branch is the larger
    want = torch.maximum(-adv * ratios, -adv * ratios.clamp(0.8, 1.28))
    assert torch.allclose(loss, want)
    assert clipped.tolist() == [False, True, False, False, False, True]
    assert torch.allclose(ratio, ratios)
    loss.sum().backward()
    # gradient d(-A r)/d lp = -A r where unclipped, 0 where the clip is active
    want_grad = torch.where(clipped, torch.zeros(6, dtype=torch.float64), -adv * ratios)
    assert torch.allclose(lp.grad, want_grad)


def test_step0_ratio_is_the_mismatch():
    """With pi_old = rollout logprobs the first update's ratio is exp(log pi - log mu): a mismatch of
    0.3 nats on a token with A > 0 is already clipped before any update."""
    mu = torch.tensor([-1.0, -2.0])
    pi = torch.tensor([-1.0, -1.7], requires_grad=True)
    _, clipped, ratio = per_token_loss(pi, mu, torch.ones(2))
    assert ratio[0] == 1.0 and clipped.tolist() == [False, True]
    assert math.isclose(float(ratio[1]), math.exp(0.3), rel_tol=1e-6)


def test_reinforce_is_minus_advantage_times_logprob_with_weights():
    lp = torch.tensor([-0.5, -2.0, -0.1], requires_grad=True)
    adv = torch.tensor([2.0, -1.0, 0.5])
    w = torch.tensor([1.0, 0.5, 2.0])
    loss, clipped, _ = per_token_loss(lp, lp.detach() + 0.3, adv, algorithm="reinforce", weights=w)
    assert torch.allclose(loss, -adv * lp.detach() * w)
    assert not clipped.any()
    loss.sum().backward()
    assert torch.allclose(lp.grad, -adv * w)


def test_aggregation_weights():
    lengths = torch.tensor([2, 3, 5])
    tm = aggregation_weights(lengths, "token-mean")
    assert torch.allclose(tm, torch.full((3,), 0.1, dtype=torch.float64))
    sm = aggregation_weights(lengths, "seq-mean-token-mean")
    assert torch.allclose(sm, 1 / (lengths.double() * 3))
    # every sequence's tokens sum to 1/3 under seq-mean: each sequence weighs the same
    assert torch.allclose(sm * lengths, torch.full((3,), 1 / 3, dtype=torch.float64))
    # a micro-batch of a larger mini-batch (or one rank's share) weighs by the global totals
    part = aggregation_weights(lengths[:2], "token-mean", n_tokens=10, n_seqs=3)
    assert torch.allclose(part, tm[:2])
    assert torch.allclose(aggregation_weights(lengths[:2], "seq-mean-token-mean", 10, 3), sm[:2])


def test_importance_weights_tis_and_mis_follow_verl_and_trl():
    # two sequences: tokens 0-2 and 3-4
    old = torch.tensor([-1.0, -2.0, -0.5, -1.0, -3.0])
    mu = torch.tensor([-1.5, -2.0, -0.1, -1.0, -1.0])
    seq = torch.tensor([0, 0, 0, 1, 1])
    tis = importance_weights(old, mu, seq, 2, "tis", cap=2.0)
    want = np.minimum(np.exp((old - mu).double().numpy()), 2.0)
    assert np.allclose(tis.numpy(), want, atol=1e-6)
    mis = importance_weights(old, mu, seq, 2, "mis", cap=2.0)
    s0, s1 = 0.5 + 0.0 - 0.4, 0.0 - 2.0
    assert np.allclose(mis.numpy(), [math.exp(s0)] * 3 + [math.exp(s1)] * 2, atol=1e-6)
    # a sequence whose ratio exceeds the cap is masked out entirely, without overflow
    big = importance_weights(torch.tensor([0.0, 0.0]), torch.tensor([-400.0, -400.0]), torch.tensor([0, 0]), 1, "mis", 2.0)
    assert big.tolist() == [0.0, 0.0]
    assert importance_weights(old, mu, seq, 2, "none", 2.0).tolist() == [1.0] * 5


def test_entropy_ignores_filtered_tokens():
    logp = torch.log_softmax(torch.tensor([[1.0, 2.0, float("-inf"), 0.5]]), -1)
    p = torch.softmax(torch.tensor([1.0, 2.0, 0.5]), -1)
    assert torch.allclose(entropy_from_logprobs(logp), -(p * p.log()).sum()[None])


# ------------------------------------------------------------------------------- chunked forward


@pytest.mark.parametrize("top_k", [-1, 5])
def test_chunked_forward_matches_full_logits_values_and_gradients(top_k):
    from rla import models
    from rla.rl.forward import PolicyForward, make_micro_batch
    from rla.rollout.sampling import process_logits

    model = models.build_model(models.tiny_config("qwen3", "micro"), dtype=torch.float64, seed=0)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 52, (n,), generator=g).tolist() for n in (3, 5)]
    responses = [torch.randint(3, 52, (n,), generator=g).tolist() for n in (7, 4)]
    mb = make_micro_batch(prompts, responses, [0, 1])
    fwd = PolicyForward(model, temperature=0.7, top_k=top_k, chunk=3)  # chunks split sequences
    lp, ent = fwd(mb)
    lp.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    want, want_ent = [], []
    for p, r in zip(prompts, responses):
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) - 1 + len(r)]
        logp = process_logits(logits, 0.7, top_k)
        want.append(logp.gather(-1, torch.tensor(r)[:, None]).squeeze(-1))
        want_ent.append(entropy_from_logprobs(logp.detach()))
    want = torch.cat(want)
    # fp64 model: the same arithmetic up to summation order in the matmuls
    assert torch.allclose(lp.double(), want.double(), atol=1e-6)
    assert torch.allclose(ent.double(), torch.cat(want_ent).double(), atol=1e-6)
    want.sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-8), n
    assert not ent.requires_grad and lp.requires_grad


# ------------------------------------------------------------------------------- config


def test_config_validation_explains_the_broken_invariant():
    with pytest.raises(ValueError, match="corrects the mismatch twice"):
        TrainConfig(is_correction="tis")
    TrainConfig(is_correction="tis", pi_old="train")  # verl's decoupled setting is fine
    with pytest.raises(ValueError, match="mini_batches=3 must divide the 128"):
        TrainConfig(mini_batches=3)
    with pytest.raises(ValueError, match="unknown region"):
        TrainConfig(train_precision="aligned", align_regions=["rope", "attention"])
    with pytest.raises(ValueError, match="at least 2 responses"):
        TrainConfig(group_size=1)
    with pytest.raises(ValueError, match="not one of"):
        TrainConfig(train_precision="int8")
    with pytest.raises(ValueError, match="not a built-in profile"):
        TrainConfig(rollout_profile="trtllm")


def test_config_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train_precision: aligned\nalign_regions: [rope]\nlr: 1e-4\nsteps: 7\n")
    cfg = load_config(path, ["seed=3", "lr=2e-5", "align_regions=[rope, swiglu]", "tensorboard=true"])
    assert (cfg.train_precision, cfg.seed, cfg.steps, cfg.tensorboard) == ("aligned", 3, 7, True)
    assert cfg.lr == 2e-5 and isinstance(cfg.lr, float)  # YAML 1.1 reads 2e-5 as a string
    assert cfg.align_regions == ["rope", "swiglu"]
    assert load_config(path).lr == 1e-4
    with pytest.raises(ValueError, match="did you mean train_precision"):
        load_config(path, ["train_precison=fp16"])
    with pytest.raises(ValueError, match="not key=value"):
        apply_overrides({}, ["fp16"])
    with pytest.raises(ValueError, match="steps='many' is not a valid int"):
        load_config(None, ["steps=many"])
    round_trip = load_config(_write(tmp_path / "r.yaml", cfg.to_yaml()))
    assert round_trip == cfg


def _write(path, text):
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------- run log and collapse


def _history(k3, reward, grad):
    return [{"step": i, "mismatch/k3": a, "reward/mean": r, "train/grad_norm": g}
            for i, (a, r, g) in enumerate(zip(k3, reward, grad))]


def test_collapse_signal_is_reported_on_the_step_it_fires():
    from rla.rl.runlog import collapse_fields

    cfg = TrainConfig()
    steady = _history([1e-4] * 8, [0.5] * 8, [1.0] * 8)
    assert collapse_fields(steady, cfg) == {"collapse/fired": False, "collapse/kinds": []}
    # k3 grows 20x while the 5-step mean reward falls from 0.8: docs/metrics.md's collapse signal
    k3 = [1e-4] * 6 + [2e-3] * 4
    reward = [0.8] * 6 + [0.5, 0.2, 0.1, 0.0]
    hist = _history(k3, reward, [1.0] * 10)
    fields = [collapse_fields(hist[: t + 1], cfg) for t in range(10)]
    fired = [t for t, f in enumerate(fields) if f["collapse/fired"]]
    assert fired and fired[0] >= 6
    assert "k3_spike" in fields[fired[0]]["collapse/kinds"] and "reward_falling" in fields[fired[0]]["collapse/kinds"]
    assert "step-0" in fields[fired[0]]["collapse/message"]
    # an fp16 step with every update skipped (grad norm NaN) is not a collapse by itself
    skipped = _history([1e-5] * 6, [0.5] * 6, [1.0, float("nan"), 1.0, 1.0, 1.0, 1.0])
    assert not any(collapse_fields(skipped[: t + 1], cfg)["collapse/fired"] for t in range(6))


def test_run_log_rewrites_steps_after_the_resume_point_and_summarises(tmp_path):
    from rla.rl.runlog import RunLog, read_log, summarize

    log = RunLog(tmp_path)
    for rec in _history([1e-3, 2e-3, 3e-3], [0.1, 0.2, 0.3], [1.0, float("nan"), 2.0]):
        log.write({**rec, "collapse/fired": rec["step"] == 2, "time/step_s": 1.0})
    log.close()
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 3, "reward/me')  # torn by a kill
    assert [r["step"] for r in read_log(tmp_path / "log.jsonl")] == [0, 1, 2]
    assert math.isnan(read_log(tmp_path / "log.jsonl")[1]["train/grad_norm"])
    log = RunLog(tmp_path, start_step=2)  # resuming from the checkpoint after step 2
    assert [r["step"] for r in read_log(tmp_path / "log.jsonl")] == [0, 1]
    log.close()
    s = summarize(read_log(tmp_path / "log.jsonl") + [{"step": 2, "reward/mean": 0.0, "mismatch/k3": 1.0,
                                                         "collapse/fired": True, "collapse/kinds": ["k3_spike"]}], window=2)
    assert s["step0"]["k3"] == 1e-3 and s["final_reward"] == 0.1 and s["best_reward"] == pytest.approx(0.15)
    assert s["collapse_events"] == [{"step": 2, "kinds": ["k3_spike"]}] and s["first_collapse_step"] == 2
    # a committed experiment keeps its logs gzipped: read_log finds log.jsonl.gz
    import gzip

    plain = read_log(tmp_path / "log.jsonl")
    (tmp_path / "log.jsonl.gz").write_bytes(gzip.compress((tmp_path / "log.jsonl").read_bytes()))
    (tmp_path / "log.jsonl").unlink()
    assert str(read_log(tmp_path / "log.jsonl")) == str(plain) and len(plain) == 2


def test_tensorboard_is_optional(tmp_path):
    from rla.rl.runlog import RunLog

    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install tensorboard"):
            RunLog(tmp_path, tensorboard=True)
    else:
        log = RunLog(tmp_path, tensorboard=True)
        log.write({"step": 0, "reward/mean": 0.5})
        log.close()
        assert any((tmp_path / "tb").iterdir())


def test_plot_draws_every_arm(tmp_path):
    from rla.rl.plots import plot_arms

    logs = {arm: [_history([s * 1e-4 * (1 + i) for i in range(6)], [0.1 * i for i in range(6)], [1.0] * 6)
                  for s in (1, 2, 3)] for arm in ("bf16", "aligned")}
    logs["aligned"][0][2]["collapse/fired"] = True
    for runs in logs["aligned"]:  # a bitwise-aligned arm: exact zeros on the log axis
        for r in runs:
            r["mismatch/k3"] = 0.0
    path = plot_arms(logs, tmp_path / "p.png", title="test")
    assert path.stat().st_size > 10_000
