"""Steps that cannot learn, said on the console as soon as they happen: every response cut off at
the length cap; every group of a group-baseline algorithm (GRPO, RLOO, REINFORCE++ with a
baseline) scored alike, so that every advantage is 0 and the update leaves the model as it was; a
collapsed policy (entropy and gradient 0: after too large a learning rate); optimizer steps
skipped on a gradient norm that was not finite; multi-turn episodes that
mostly ran out of time or failed. Settings that train, but not as their values say
(a warm-up as long as the run, a micro-batch budget below one sequence), are said before the first step.
The run goes on (a later batch may differ); each kind is said when it starts and again only after
a step without it, not every step."""

from __future__ import annotations

from rlpost.algos.algorithms import ALGORITHMS
from rlpost.config import TrainConfig
from rlpost.config.rules import GROUP_ADVANTAGES


def greedy(r) -> str:
    """The sampling setting that makes a prompt's samples alike, if one does ("": none)."""
    if r.temperature < 0.1:
        return f"rollout.temperature={r.temperature:g} makes a prompt's samples alike (0.7-1.0 is usual)"
    if r.top_k == 1 or r.top_p < 0.01:  # (the nineteenth catalogue's t22, t134: the reward was blamed)
        key = "rollout.top_k=1" if r.top_k == 1 else f"rollout.top_p={r.top_p:g}"
        return f"{key} keeps only the likeliest token, so a prompt's samples are alike (leave it out: off by default)"
    return ""


def uniform_cause(cfg: TrainConfig, mean: float) -> str:
    """Why every group scored alike: the sampling, else the answers or the reward function."""
    return greedy(cfg.rollout) or (  # (the fifteenth catalogue's t25: reward.fn=gsm8k, which reads '#### N')
        f"every answer is right or every one wrong (reward/mean {mean:.3f}), or reward.fn={cfg.reward.fn} "
        "gives these answers one score (does it read the task's answer format?)"
    )


def no_signal(cfg: TrainConfig, step: int, metrics: dict[str, float]) -> dict[str, str]:
    """What in step `step`'s metrics says it could not learn, by kind: `truncated`, `uniform`, `no_tokens`,
    `collapsed`."""
    out, r = {}, cfg.rollout
    if metrics.get("response_length/truncated_frac", 0.0) >= 1.0:
        out["truncated"] = (
            f"warning: every response of step {step} reached rollout.max_response_length={r.max_response_length} "
            "tokens without ending (response_length/truncated_frac 1.0): the answers are cut off; raise it"
        )
    advantage = ALGORITHMS.get(cfg.algo.name).advantage
    if advantage in GROUP_ADVANTAGES and metrics.get("reward/uniform_groups", 0.0) >= 1.0:
        out["uniform"] = (
            f"warning: in step {step} every prompt's {r.n} samples scored the same reward (reward/uniform_groups "
            f"1.0), so algo.name={cfg.algo.name}'s advantages are all 0 and the step did not change the model: "
            + uniform_cause(cfg, metrics.get("reward/mean", float("nan")))
        )
    collapsed = metrics.get("actor/entropy", 1.0) < 1e-6 and metrics.get("actor/grad_norm", 1.0) == 0.0
    if collapsed and metrics.get("actor/ppo_ratio_max", 0.0) == float("-inf"):  # no token in any micro-batch's loss
        filtered = cfg.algo.overlong_filter and metrics.get("response_length/truncated_frac", 0.0) >= 1.0
        out["no_tokens"] = (  # (the nineteenth catalogue's t115: told it had collapsed, to lower the lr)
            f"warning: no token of step {step} was in the loss (actor/ppo_ratio_max -inf), so nothing trained: "
            + (
                "algo.overlong_filter=true leaves truncated responses out, and every one was: raise "
                f"rollout.max_response_length={r.max_response_length}"
                if filtered
                else "every response's loss mask was empty"
            )
        )
    elif collapsed and not greedy(r):  # (sampling that makes samples alike: `uniform` names the cause)
        out["collapsed"] = (
            f"warning: in step {step} the policy's entropy and gradient are 0 (actor/entropy, actor/grad_norm): it "
            "writes one answer with certainty and no update can move it; too large a step does this (now "
            f"trainer.optim.lr={cfg.trainer.optim.lr:g}): lower it and start again"
        )
    gap = metrics.get("rollout/logprob_diff_mean", 0.0)
    for role in ("actor", "critic"):
        skipped = metrics.get(f"{role}/skipped_steps", 0.0)
        if skipped > 0:
            why = (
                f"the rollout's log-probs are {gap:.2f} nats a token from the trainer's (rollout/logprob_diff_mean): "
                "the two do not hold the same model or sample the same distribution"
                if role == "actor" and gap > 0.5
                else "rewards or values too large for float32 (above about 1e19) overflow its loss: scale the reward "
                "down"
            )
            out[f"skipped_{role}"] = (
                f"warning: in step {step} {skipped:g} optimizer steps of the {role} were skipped "
                f"({role}/skipped_steps): its gradient norm was not finite, so it did not train; {why}"
            )
    return out


def episodes_cut(cfg: TrainConfig, step: int, metrics: dict[str, float]) -> dict[str, str]:
    """Multi-turn episodes that half or more of a step's ended early, by kind: `env_timeouts` (past
    `env.timeout_s`: counted, never said: the eleventh catalogue's t36), `env_errors` (the
    environment failed: its first error is said once, the count was not: t32)."""
    out, episodes, e = {}, cfg.data.train_batch_size * cfg.rollout.n, cfg.env
    timeouts, errors = metrics.get("env/timeouts", 0.0), metrics.get("env/errors", 0.0)
    if e.name and timeouts >= episodes / 2:
        out["env_timeouts"] = (
            f"warning: in step {step} {timeouts:g} of {episodes} episodes ran past env.timeout_s={e.timeout_s:g} "
            "(env/timeouts) and ended there: raise env.timeout_s, or make env.name's steps faster"
        )
    if e.name and errors >= episodes / 2:
        out["env_errors"] = (
            f"warning: in step {step} {errors:g} of {episodes} episodes of env.name={e.name} ended on an error of "
            "the environment (env/errors; its first is said above): fix the environment"
        )
    return out


def spread(cfg: TrainConfig, step: int, first: dict[str, float], now: dict[str, float]) -> dict[str, str]:
    """`spread`: since the first step the policy's entropy rose by half or more and its reward fell by
    half or more; updates too large push a policy toward random tokens (the eleventh catalogue's
    t56: lr=1000 did, and the warnings blamed the data)."""
    e0, e1, r0, r1 = (m.get(k) for k in ("actor/entropy", "reward/mean") for m in (first, now))
    if None in (e0, e1, r0, r1) or not (e1 >= 1.5 * e0 and e1 > 0.5 and 0 < r0 and r1 <= r0 / 2):
        return {}
    return {
        "spread": f"warning: in step {step} the policy's entropy is {e1:.2f} nats a token (the first step's "
        f"{e0:.2f}) and its reward {r1:.3f} (the first step's {r0:.3f}) (actor/entropy, reward/mean): the updates "
        "pushed it toward random tokens; too large a step does this (now "
        f"trainer.optim.lr={cfg.trainer.optim.lr:g}): lower it and start again"
    }


def off_scale(metrics: dict[str, float]) -> dict[str, str]:
    """`off_scale`: validation scores above 1, where `val/accuracy` counts a sample right when its
    score is at least 1 (the fourteenth catalogue's t01: a reward of 10 for a right answer and 3 for a
    wrong one read as accuracy 1.0 for a model right 58% of the time); `under_scale`: none reached 1
    though some scored (a right answer worth 0.9 read as accuracy 0 all run)."""
    high = metrics.get("val/score_max", 1.0)
    if 0.0 < high < 1.0 and metrics.get("val/accuracy") == 0.0:  # (the fifteenth catalogue's t18: right = 0.9)
        return {
            "under_scale": f"warning: no validation score reached 1 (the highest: {high:g}, val/score_max): "
            "val/accuracy counts a sample right when its score is at least 1, so it reads 0; if reward.fn scores "
            "a right answer below 1, read val/reward_mean, or make it score a right answer 1"
        }
    if high <= 1.0:
        return {}
    return {
        "off_scale": f"warning: validation scores reach {high:g} (val/score_max), above 1: val/accuracy counts a "
        "sample right when its score is at least 1, so here it is not the share answered right; read "
        "val/reward_mean, or make reward.fn score a right answer 1 and a wrong one less"
    }


def setting_warnings(cfg: TrainConfig) -> list[str]:
    """Settings that train, but not as their values say: said once before the first step."""
    from rlpost.trainer.engine import total_optimizer_steps

    out, steps = [], total_optimizer_steps(cfg)
    sections = ["trainer"] + (["critic"] if "critic" in ALGORITHMS.get(cfg.algo.name).roles else [])
    for name in sections:
        o = getattr(cfg, name).optim
        if o.warmup_steps >= steps:
            decay = " and the cosine decay never starts" if o.lr_schedule == "cosine" else ""
            out.append(
                f"warning: {name}.optim.warmup_steps={o.warmup_steps} is not below the run's {steps} optimizer steps "
                f"(trainer.total_steps x algo.ppo_epochs x mini-batches a batch): the learning rate never reaches "
                f"{name}.optim.lr={o.lr:g}{decay}"
            )
    if "critic" in ALGORITHMS.get(cfg.algo.name).roles and cfg.critic.warmup_steps >= cfg.trainer.total_steps:
        out.append(
            f"warning: critic.warmup_steps={cfg.critic.warmup_steps} is not below trainer.total_steps="
            f"{cfg.trainer.total_steps}: only the critic trains in this run, the policy never does"
        )
    if cfg.trainer.optim.lr == 0:
        out.append("warning: trainer.optim.lr=0: the policy's weights never change (it measures; it does not train)")
    longest, budget = (
        cfg.data.max_prompt_length + cfg.rollout.max_response_length,
        cfg.trainer.max_tokens_per_microbatch,
    )
    out += reward_warnings(cfg, longest)
    if 0 < budget < longest:
        out.append(
            f"warning: trainer.max_tokens_per_microbatch={budget} is below one sequence's {longest} tokens "
            "(data.max_prompt_length + rollout.max_response_length): a longer sequence goes alone in its micro-batch "
            "(slow where the budget is far below it)"
        )
    return out


def reward_warnings(cfg: TrainConfig, longest: int) -> list[str]:
    """The reward's settings that train, but not as their values say (`setting_warnings`'; `longest`: a
    sample's tokens)."""
    out, r, rm = [], cfg.reward, cfg.reward.model
    if rm.path and rm.kind == "classifier" and rm.max_length < longest:  # (cat10's t56: its first token scored)
        out.append(
            f"warning: reward.model.max_length={rm.max_length} is below a sample's {longest} tokens "
            "(data.max_prompt_length + rollout.max_response_length, the policy's): the reward model reads each "
            f"sample cut to its first {rm.max_length} tokens of its own, the end of the response dropped"
        )
    if r.error_score >= 1.0:  # (the nineteenth catalogue's t126: failures scored as right answers)
        out.append(
            f"warning: reward.error_score={r.error_score:g} scores a sample whose reward failed at least as a right "
            "answer (1): the run is rewarded for failing; 0 (the default) scores it as wrong (validation counts a "
            "failed sample wrong whatever it scores)"
        )
    return out


class Alerts:
    """`no_signal` of each step, logged when a kind starts (not again while it lasts)."""

    def __init__(self, cfg: TrainConfig, log=print):
        self.cfg, self.log, self.active, self.first, self.said = cfg, log, set(), None, set()

    def check(self, step: int, metrics: dict[str, float]) -> None:
        self.first = self.first or metrics  # (a resumed run's first step here is its own first)
        found = {**spread(self.cfg, step, self.first, metrics), **no_signal(self.cfg, step, metrics)}
        found.update(episodes_cut(self.cfg, step, metrics))
        for kind, message in found.items():
            if kind not in self.active:
                self.log(message)
        self.active = set(found)
        self.check_once(metrics)

    def check_once(self, metrics: dict[str, float]) -> None:
        """What holds for the whole run (the reward's scale): said the first time only, also of the
        metrics before the first step (the start's validation)."""
        for kind, message in off_scale(metrics).items():
            if kind not in self.said:
                self.said.add(kind)
                self.log(message)


def tiny_keys_warning(cfg: TrainConfig) -> str | None:
    """`model.tiny.*` build the tiny model only (the seventeenth catalogue's t05: taken and ignored
    beside a model folder). Said, not refused: a recipe (gpu_quickstart) sets them for its own tiny
    model, and a user may give that recipe another model."""
    from rlpost.config.rules_mode import changed

    if "tiny" in (cfg.model.path, cfg.reward.model.path) or not (keys := changed(cfg.model.tiny)):
        return None
    return (
        f"warning: {', '.join('model.tiny.' + k for k in keys)}: read only when model.path=tiny builds the tiny "
        f"model, and model.path={cfg.model.path}: they are not used"
    )


def tiny_chat_warning(cfg: TrainConfig, chat_rows: int) -> str | None:
    """Chat-message prompts given to the tiny model (the seventeenth catalogue's t144): it was warmed
    up on plain prompts (`13+21=`) and reads chat through a stand-in template it never saw, so its
    rewards stay near 0 with only the generic warning about uniform groups to say why."""
    if cfg.model.path != "tiny" or not chat_rows:
        return None
    return (
        f"warning: {chat_rows} prompts are chat messages, and model.path=tiny was warmed up on plain prompts "
        "(13+21=) only: it reads them through a chat template it never saw, so expect rewards near 0; give "
        "string prompts, or a chat model (model.path=smollm2-135m-instruct)"
    )


def worker_count_warning(cfg: TrainConfig, cores: int | None = None) -> str | None:
    """More reward processes than this machine has cores (the seventeenth catalogue's t157: 64 on 2 cores,
    each importing torch at once, made step 1 take 93 s with only "still running" lines to say so)."""
    import os

    cores = cores or os.cpu_count() or 1
    n = cfg.reward.num_workers
    if ".py:" not in cfg.reward.fn or n <= cores:
        return None
    return (
        f"warning: reward.num_workers={n} on a machine of {cores} CPU cores: {n} processes each run {cfg.reward.fn}'s "
        f"file and share the cores; reward.num_workers={cores} or fewer is faster"
    )
