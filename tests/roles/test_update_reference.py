"""The actor update against a from-scratch reference.

rlpost's own path: advantages from rewards and groups (`controller.loop.advantages`), the step's
plan (`step_plan`: token-balanced ranks, micro-batches of unequal token counts), the shards, and
`ActorWorker.update` under FSDP2 over gloo at world size 1 and 2. The gradient it hands to the
optimizer is captured and compared, parameter by parameter, with the gradient of a loss written
here in a few lines of plain torch on an unsharded copy of the model: one sequence at a time, no
padding, no rlpost code. The batch is ragged (left-padded prompts, right-padded responses of
unequal lengths), its rewards fall in groups of unequal size, and its old, reference and rollout
log-probs are perturbed so that clipping, the dual clip and the TIS cap all bite. Each term is
switched on alone (the policy-gradient term is silenced by zero rewards), so that one wrong sign
cannot hide behind another term.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch
import torch.distributed as dist

from tests.advantage_reference import grpo_advantages, k_estimate, reference_advantages
from tests.helpers import FAMILIES, FAMILY_IDS, reference_logprobs, run_ranks, save_tiny_model

TEMPERATURE = 0.7
GROUPS = [4, 2, 3, 3]  # samples per prompt: 12 rows, two mini-batches of 6 ([4, 2] and [3, 3])
MAX_RESPONSE = 6  # rollout.max_response_length: Dr.GRPO's constant, longer than any response here
BASE = [
    "+recipe=quickstart",
    "data.train_batch_size=4",
    "rollout.n=3",
    f"rollout.temperature={TEMPERATURE}",
    f"rollout.max_response_length={MAX_RESPONSE}",
    "trainer.optim.lr=0.0",
    "trainer.optim.grad_clip=0",
    "trainer.micro_batch_size=3",
    "trainer.max_tokens_per_microbatch=24",
    "algo.kl_coef=0.0",
    "algo.rollout_is=none",
]
SILENT = "silent"  # a case whose rewards are all 0: no policy-gradient term, the other term alone

CASES = {
    "pg": [],
    "pg_asymmetric_dual_clip": ["algo.clip_ratio_low=0.1", "algo.clip_ratio_high=0.3", "algo.clip_ratio_c=1.5"],
    "pg_tis_token": ["algo.rollout_is=token", "algo.rollout_is_threshold=1.5"],
    "pg_tis_sequence": ["algo.rollout_is=sequence", "algo.rollout_is_threshold=1.5"],
    "pg_mask_token": ["algo.rollout_is=token_mask", "algo.rollout_is_threshold=1.2"],
    "pg_mask_sequence": ["algo.rollout_is=sequence_mask", "algo.rollout_is_threshold=1.5"],
    "pg_seq_mean": ["algo.loss_agg_mode=seq-mean-token-mean"],
    "pg_dr_grpo": ["algo.loss_agg_mode=seq-mean-token-sum-norm", "algo.norm_adv_by_std=false"],
    "pg_two_mini_batches": ["algo.ppo_mini_batch_size=2"],
    "kl_k1": [SILENT, "algo.kl_coef=0.5", "algo.kl_estimator=k1"],
    "kl_k2": [SILENT, "algo.kl_coef=0.5", "algo.kl_estimator=k2"],
    "kl_k3": [SILENT, "algo.kl_coef=0.5", "algo.kl_estimator=k3"],
    "entropy": [SILENT, "algo.entropy_coef=0.3"],
    "entropy_seq_mean": [SILENT, "algo.entropy_coef=0.3", "algo.loss_agg_mode=seq-mean-token-mean"],
    "gspo": [
        "algo.name=gspo",
        "algo.clip_ratio_low=0.1",
        "algo.clip_ratio_high=0.15",
        "algo.loss_agg_mode=seq-mean-token-mean",
    ],
    "gspo_token_mean": ["algo.name=gspo", "algo.clip_ratio_low=0.1", "algo.clip_ratio_high=0.15"],
    "cispo": ["algo.name=cispo", "algo.clip_ratio_high=0.5"],
    "reinforce_pp_kl_in_reward": [
        "algo.name=reinforce_pp",
        "algo.kl_coef=0.5",
        "algo.kl_estimator=k2",
        "algo.gamma=0.9",
    ],
    "reinforce_pp_baseline": ["algo.name=reinforce_pp_baseline"],
}


def make_batch(model, seed: int = 0):
    """A ragged generation batch (rows of GROUPS) with log-probs around the model's own."""
    from rlpost.data.batch import Batch
    from rlpost.data.padding import left_pad, right_pad

    g = torch.Generator().manual_seed(seed)
    rows = sum(GROUPS)
    group_prompts = [
        torch.randint(3, 60, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist() for _ in GROUPS
    ]
    prompts = [prompt for prompt, n in zip(group_prompts, GROUPS) for _ in range(n)]  # a group shares its prompt
    lengths = [1, 5, 2, 4, 3, 5, 1, 2, 4, 3, 5, 2]
    responses = [torch.randint(3, 60, (n,), generator=g).tolist() for n in lengths]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad(responses, 0)
    # the tokens that get a loss: holes where a tool or an environment wrote (rows 1, 3, 5, 10),
    # and a row whose every token is an environment's (row 7)
    loss_mask = response_mask.clone()
    for row, cols in ((1, [1, 2]), (3, [0]), (5, [2]), (10, [3, 4]), (7, [0, 1])):
        loss_mask[row, cols] = False
    batch = Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "loss_mask": loss_mask,
            "weight_version": torch.zeros(rows, dtype=torch.long),
            "rollout_logprobs": torch.zeros(rows, response_ids.shape[1]),
        }
    )
    logp = reference_logprobs(model, batch, TEMPERATURE)
    mask = response_mask.float()

    def noise(scale):
        return (torch.rand(logp.shape, generator=g) * 2 - 1) * scale * mask

    batch["old_logprobs"] = logp + noise(1.1)  # ratios from ~0.33 to ~3: both clips and the dual clip
    batch["ref_logprobs"] = logp + noise(1.0)
    batch["rollout_logprobs"] = batch["old_logprobs"] + noise(0.8)  # TIS weights 0.45..2.2, cap 1.5
    batch["group_ids"] = torch.repeat_interleave(torch.arange(len(GROUPS)), torch.tensor(GROUPS))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0, 1.0])
    return batch, rewards


# ---------------------------------------------------------------------------- the reference
def reference_loss(model, batch, adv, algo: dict):
    """The loss of one mini-batch, written from the papers: PPO dual clip, GSPO, CISPO, TIS, KL,
    entropy. `adv`: each row's advantages on its own tokens."""
    per_token = {"pg": [], "kl": [], "entropy": []}
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i]]
        m = batch["response_mask"][i]
        response = batch["response_ids"][i][m]
        own = batch["loss_mask"][i][m]  # the model's own tokens: only they get a loss
        if not own.any():
            continue
        logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0, len(prompt) - 1 : -1] / TEMPERATURE
        logprobs = torch.log_softmax(logits.float(), -1)
        logp = logprobs.gather(-1, response[:, None])[:, 0][own]
        old, ref, rollout = (batch[k][i][m][own] for k in ("old_logprobs", "ref_logprobs", "rollout_logprobs"))
        a = adv[i]
        low, high = 1 - algo["clip_ratio_low"], 1 + algo["clip_ratio_high"]
        if algo["name"] == "gspo":  # one ratio per sequence: the geometric mean of its token ratios
            s = torch.exp((logp - old).mean())
            pg = torch.maximum(-a * s, -a * s.clamp(low, high)).mean().expand(len(logp))  # seq-mean
        elif algo["name"] == "cispo":  # REINFORCE with a clipped, stop-gradient IS weight
            pg = -a * torch.exp(logp - old).clamp(max=high).detach() * logp
        else:
            ratio = torch.exp(logp - old)
            pg = torch.maximum(-a * ratio, -a * ratio.clamp(low, high))
            pg = torch.where(a < 0, torch.minimum(pg, -a * algo["clip_ratio_c"]), pg)
        log_w = old - rollout  # truncated importance weights, over the model's own tokens
        if algo["rollout_is"] == "token":
            pg = pg * torch.exp(log_w).clamp(max=algo["rollout_is_threshold"])
        elif algo["rollout_is"] == "sequence":
            pg = pg * torch.exp(log_w.sum()).clamp(max=algo["rollout_is_threshold"])
        elif algo["rollout_is"] == "token_mask":  # tokens outside [1 / t, t] leave the loss
            t = algo["rollout_is_threshold"]
            pg = pg * ((torch.exp(log_w) >= 1 / t) & (torch.exp(log_w) <= t))
        elif algo["rollout_is"] == "sequence_mask":  # a sequence outside [1 / t, t] leaves the loss
            t = algo["rollout_is_threshold"]
            pg = pg * float(1 / t <= torch.exp(log_w.sum()) <= t)
        kl = k_estimate(logp - ref, algo["kl_estimator"])  # KL(policy || reference)
        entropy = -(logprobs.exp() * logprobs).sum(-1)[own]
        for key, value in (("pg", pg), ("kl", kl), ("entropy", entropy)):
            per_token[key].append(value)

    def agg(values):
        if algo["loss_agg_mode"] == "token-mean":
            return torch.cat(values).sum() / sum(len(v) for v in values)
        if algo["loss_agg_mode"] == "seq-mean-token-mean":
            return sum(v.mean() for v in values) / len(values)
        return sum(v.sum() / MAX_RESPONSE for v in values) / len(values)  # Dr.GRPO: a constant

    kl_in_loss = algo["kl_coef"] if algo["name"] != "reinforce_pp" else 0.0  # REINFORCE++: in the reward
    return agg(per_token["pg"]) + kl_in_loss * agg(per_token["kl"]) - algo["entropy_coef"] * agg(per_token["entropy"])


def reference_grads(model_dir, batch, rewards, algo: dict, mini_batches: int):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    adv = reference_advantages(batch, rewards, algo)
    size = len(batch) // mini_batches
    out = []
    for m in range(mini_batches):
        rows = list(range(m * size, (m + 1) * size))
        model.zero_grad()
        reference_loss(model, batch.select(rows), adv[m * size : (m + 1) * size], algo).backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return out


# ------------------------------------------------------------------------------- rlpost's path
def case_config(name: str, world: int):
    from rlpost.config import load_config
    from rlpost.trainer.logprobs import LAYOUTS

    overrides = [o for o in CASES[name] if o != SILENT]
    # every layout on ragged rows: world size 1 takes them in turn, world size 2 (FSDP2, where
    # shared_prompt runs the model twice before the backward) packed and shared_prompt in turn
    index = list(CASES).index(name)
    layout = ("packed", "shared_prompt")[index % 2] if world == 2 else LAYOUTS[index % 3]
    return load_config(BASE + overrides + [f"trainer.world_size={world}", f"trainer.layout={layout}"])


def case_rewards(rewards, name):
    return torch.zeros_like(rewards) if SILENT in CASES[name] else rewards


def rank_main(rank, world, port, model_dir, batch_path, out, names):
    """The cases `names` through rlpost's path on this rank; rank 0 saves the captured gradients."""
    from rlpost.controller.step import advantages, step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.actor import ActorWorker
    from rlpost.trainer.fsdp import full_tensor

    torch.set_num_threads(1)
    try:
        batch, rewards = torch.load(batch_path, weights_only=False)
        results = {}
        for name in names:
            cfg = case_config(name, world)
            case = batch.select(slice(None))
            case["rewards"] = case_rewards(rewards, name)
            case["advantages"] = advantages(case, cfg)
            _, plan = step_plan(case, cfg)
            worker = ActorWorker(cfg, model_dir, rank, world, "127.0.0.1", port)
            grads, step = [], worker.optimizer.step

            def capture(*args, worker=worker, grads=grads, step=step, **kwargs):
                grads.append({n: full_tensor(p.grad).clone() for n, p in worker.model.named_parameters()})
                return step(*args, **kwargs)

            worker.optimizer.step = capture
            metrics, _ = worker.update(shard_batch(case, plan)[rank])
            results[name] = {
                "grads": grads,
                "first_ratio_dev": metrics["actor/first_ratio_dev"],
                "tokens": [
                    [
                        sum(int(case["prompt_mask"][i].sum() + case["response_mask"][i].sum()) for i in micro)
                        for micro in mini
                    ]
                    for mini in plan[rank]
                ],
            }
        if rank == 0:
            torch.save(results, out)
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    """family -> (model folder, batch, rewards, batch file), built once per family."""
    made = {}

    def make(family: str = "qwen2-tied"):
        if family not in made:
            folder = tmp_path_factory.mktemp(family)
            name, tied = FAMILIES[FAMILY_IDS.index(family)]
            model, _ = save_tiny_model(folder, seed=3, family=name, tied=tied)
            batch, rewards = make_batch(model)
            path = folder / "batch.pt"
            torch.save((batch, rewards), path)
            made[family] = str(folder), batch, rewards, path
        return made[family]

    return make


@pytest.fixture(scope="module")
def setup(setups):
    return setups()


# The Llama family (no q/k/v biases; untied and tied heads) on a few cases at both world sizes
LLAMA_CASES = ["pg_tis_token", "kl_k3", "entropy", "gspo"]


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize(
    "world, names, family",
    # world size 1 in this process, one case per test (a broken term fails fast, by name); world
    # size 2 as two processes over gloo, every case in one spawn
    [pytest.param(1, [name], "qwen2-tied", id=f"1-{name}") for name in CASES]
    + [pytest.param(2, list(CASES), "qwen2-tied", id="2-all", marks=pytest.mark.multiprocess)]
    + [pytest.param(1, LLAMA_CASES, "llama-untied", id="1-llama-untied")]
    + [pytest.param(2, LLAMA_CASES, "llama-tied", id="2-llama-tied", marks=pytest.mark.multiprocess)],
)
def test_update_gradients_match_the_reference(setups, world, names, family, tmp_path):
    """Each case of CASES through rlpost's update against the reference, at world size 1 and 2
    (a Qwen2 model; a Llama one, untied and tied, on LLAMA_CASES)."""
    from rlpost.weightsync.transport import free_port

    model_dir, batch, rewards, batch_path = setups(family)
    out = tmp_path / "grads.pt"
    run_ranks(rank_main, world, free_port(), model_dir, str(batch_path), str(out), names)
    results = torch.load(out, weights_only=False)
    from transformers import AutoModelForCausalLM

    with torch.no_grad():  # the policy's own log-probs before any step
        current = reference_logprobs(AutoModelForCausalLM.from_pretrained(model_dir), batch, TEMPERATURE)
    wrong = []
    for name in names:
        cfg = case_config(name, world)
        ours = results[name]["grads"]
        mini = 2 if cfg.algo.ppo_mini_batch_size else 1
        ref = reference_grads(model_dir, batch, case_rewards(rewards, name), asdict(cfg.algo), mini)
        assert len(ours) == mini, name  # one optimizer step per mini-batch
        # the plan really cuts each rank's rows into micro-batches of unequal token counts
        assert any(len(set(tokens)) > 1 for tokens in results[name]["tokens"]), name
        # max |ratio - 1| of the first optimizer step (the old log-probs are perturbed: far from 0)
        first = slice(0, len(batch) // mini)
        log_ratio, own = (current - batch["old_logprobs"])[first], batch["loss_mask"][first]
        if cfg.algo.name == "gspo":  # one ratio per sequence: the mean token log-ratio
            log_ratio = ((log_ratio * own).sum(-1) / own.sum(-1).clamp(min=1))[:, None].expand_as(own)
        ratio = torch.exp(log_ratio)[own]
        expected = max(ratio.max().item() - 1, 1 - ratio.min().item())
        assert abs(results[name]["first_ratio_dev"] - expected) < 1e-4 * expected, name
        for m in range(mini):
            assert ours[m].keys() == ref[m].keys()
            scale = max(g.abs().max().item() for g in ref[m].values())
            assert scale > 1e-4, f"{name}: the reference gradient is ~0: this case would prove nothing"
            for n, r in ref[m].items():
                err = (ours[m][n] - r).abs().max().item()
                if err > 2e-5 * scale:
                    wrong.append(f"{name}, mini-batch {m}, {n}: |rlpost - reference| = {err:.3g} (scale {scale:.3g})")
    assert not wrong, "\n".join(wrong[:20])


def test_the_batch_exercises_every_branch(setup):
    """The perturbations are large enough that each clip and cap is active somewhere."""
    from transformers import AutoModelForCausalLM

    model_dir, batch, rewards, _ = setup
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    logp = reference_logprobs(model, batch, TEMPERATURE)
    mask = batch["loss_mask"]  # the tokens the loss reads (the response less the environment's holes)
    ratio = torch.exp(logp - batch["old_logprobs"])[mask]
    adv = grpo_advantages(rewards, batch["group_ids"])[:, None].expand_as(mask)[mask]
    assert ((ratio > 1.3) & (adv > 0)).any() and ((ratio < 0.9) & (adv < 0)).any()  # both clip sides
    assert ((ratio > 1.5) & (adv < 0)).any()  # the dual clip at c = 1.5
    w = torch.exp(batch["old_logprobs"] - batch["rollout_logprobs"])[mask]
    assert (w > 1.5).any() and (w < 1).any()
    # the masks (threshold 1.2 by token, 1.5 by sequence) keep some and drop some, on both sides
    assert (w > 1.2).any() and (w < 1 / 1.2).any() and ((w >= 1 / 1.2) & (w <= 1.2)).any()
    seq_w = torch.exp(((batch["old_logprobs"] - batch["rollout_logprobs"]) * batch["loss_mask"]).sum(-1))
    inside = (seq_w >= 1 / 1.5) & (seq_w <= 1.5)
    assert inside.any() and (~inside).any()
    # GSPO's sequence ratios leave its clip range (0.9, 1.15) on both sides, for either sign of A
    own = batch["loss_mask"].float()
    seq = torch.exp(((logp - batch["old_logprobs"]) * own).sum(-1) / own.sum(-1).clamp(min=1))
    seq_adv = grpo_advantages(rewards, batch["group_ids"])
    assert ((seq > 1.15) & (seq_adv > 0)).any() and ((seq < 0.9) & (seq_adv < 0)).any()
    assert ((seq > 1.15) & (seq_adv < 0)).any() and ((seq < 0.9) & (seq_adv > 0)).any()
    assert not math.isclose(
        float(grpo_advantages(rewards, batch["group_ids"], False).abs().sum()),
        float(grpo_advantages(rewards, batch["group_ids"]).abs().sum()),
    )
