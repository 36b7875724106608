"""`model.lora.mode=merge`: the trainer's LoRA layers compute with the weight the rollout holds,
W + s B A merged and rounded as the sync sends it (`rlpost.trainer.lora.merge_weight`). Apart from
`rlpost.trainer.lora` because it subclasses peft's LoRA Linear: peft is imported only by runs with
LoRA (its import is seconds, and the controller imports the trainer's modules to start its actors)."""

from __future__ import annotations

import torch
from peft.tuners.lora import Linear as PeftLoraLinear

from rlpost.trainer.lora import merge_weight


class _MergedMatmul(torch.autograd.Function):
    """y = x @ W'^T + bias with W' = `merge_weight(W, [(A, B, s)], x.dtype)`: the weight the
    rollout holds. The gradient reaches A and B as LoRA's does, straight through the rounding of
    W' (dB = s g^T (x A^T), dA = s (g B)^T x), and x through W'; W and the bias are frozen. W' is
    computed again in the backward rather than kept: one weight's memory per layer, not per model."""

    @staticmethod
    def forward(ctx, x, a, b, weight, bias, scaling: float):
        ctx.scaling = scaling
        ctx.save_for_backward(x, a, b, weight)
        return torch.nn.functional.linear(x, merge_weight(weight, [(a, b, scaling)], x.dtype), bias)

    @staticmethod
    def backward(ctx, grad):
        x, a, b, weight = ctx.saved_tensors
        s = ctx.scaling
        g, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        grad_a = (s * ((g @ b.to(g.dtype)).T @ x2)).to(a.dtype) if ctx.needs_input_grad[1] else None
        grad_b = (s * (g.T @ (x2 @ a.to(x2.dtype).T))).to(b.dtype) if ctx.needs_input_grad[2] else None
        grad_x = grad @ merge_weight(weight, [(a, b, s)], x.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, grad_a, grad_b, None, None, None


class MergedLoraLinear(PeftLoraLinear):
    """peft's LoRA Linear whose forward computes with the merged weight (`use_merged_forward`).
    With the adapter disabled (the KL reference), merged in place, or several adapters or one per
    row, it is peft's own forward."""

    def forward(self, x, *args, **kwargs):
        adapters = [n for n in self.active_adapters if n in self.lora_A]
        if self.disable_adapters or self.merged or kwargs.get("adapter_names") or len(adapters) != 1:
            return super().forward(x, *args, **kwargs)
        base, name = self.get_base_layer(), adapters[0]
        a, b = self.lora_A[name].weight, self.lora_B[name].weight
        return _MergedMatmul.apply(x.to(base.weight.dtype), a, b, base.weight, base.bias, self.scaling[name])


def use_merged_forward(model) -> None:
    """`model.lora.mode=merge`: every plain LoRA Linear of the peft `model` computes with W + s B A
    merged and rounded as the sync sends it (`merge_weight`), not W x + s B (A x): the rollout
    holds bit for bit the weights the trainer computes with, as in full fine-tuning. (Computed
    apart, bf16(W + s B A) differs from bf16(W) x + s B A x by a rounding of every adapted weight:
    a log-prob gap the size of running the whole model in bfloat16 instead of float32.)"""
    for module in model.modules():
        if type(module) is PeftLoraLinear and not any(module.use_dora.values()) and not module.fan_in_fan_out:
            module.__class__ = MergedLoraLinear
