"""Compiled optimizer steps: `kiln.compile(opt.step)` for torch.optim.SGD, Adam and AdamW.

Eager's step runs a handful of small ops per parameter (for Adam: an increment, a lerp, a mul and an addcmul,
a sqrt, a div, an add and an addcdiv), each a pass over memory. The compiled step runs the same update, in
the same order of operations as eager's single-tensor implementation, as one kiln graph over every
parameter of a group: each parameter's update fuses into one kernel that reads the parameter, its gradient
and its state once and writes them back in place.

The optimizer's state stays torch's: `opt.state[p]` holds the same tensors, created as eager creates them
(SGD's momentum buffer is the first step's gradient; Adam's `step` a float32 0-d tensor, its moments
zeros like the parameter), so `state_dict()`, checkpoints and a later eager step see no difference.
Values that change from step to step — the learning rate, Adam's bias corrections — enter the graph as 0-d
tensors (never as constants a guard would pin), in the parameter's dtype, as eager converts its scalars.

What the compiled step does not cover runs torch's own step, counted in `kiln.counters["optimizer_native"]`
with the reason: a closure, step hooks, sparse or complex gradients, `foreach`/`fused`/`capturable`/
`differentiable` set, or parameters whose Adam step counts differ.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from .counters import counters

SUPPORTED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def is_optimizer_step(fn: Any) -> bool:
    """`opt.step` of an optimizer kiln compiles (bound to an SGD, Adam or AdamW instance)."""
    owner = getattr(fn, "__self__", None)
    return type(owner) in SUPPORTED and getattr(fn, "__func__", None) is type(owner).step


# ---- the updates, as plain torch code kiln captures ------------------------------------------------------

def sgd_update(params: list, grads: list, bufs: list, neg_lr: list, momentum: float, dampening: float,
               weight_decay: float, nesterov: bool, maximize: bool) -> list:
    """torch.optim.SGD's single-tensor step; returns the momentum buffers (new ones on the first step)."""
    out = []
    for i, param in enumerate(params):
        grad = -grads[i] if maximize else grads[i]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buf = bufs[i]
            if buf is None:
                buf = grad.clone()  # (eager's detach() is a no-op here: the step runs under no_grad)
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            out.append(buf)
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        param.add_(grad * neg_lr[i])
    return out


def adam_update(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, max_sqs: list, scalars: list,
                beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool, amsgrad: bool,
                maximize: bool) -> None:
    """torch.optim.Adam's (and AdamW's, decoupled) single-tensor step, its steps already counted.
    `scalars[i]` = (1 - lr * weight_decay, bias_correction2 ** 0.5, -lr / bias_correction1) as 0-d tensors."""
    for i, param in enumerate(params):
        grad = -grads[i] if maximize else grads[i]
        decay, bc2_sqrt, neg_step_size = scalars[i]
        if weight_decay != 0:
            if decoupled:
                param.mul_(decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if amsgrad:
            torch.maximum(max_sqs[i], exp_avg_sq, out=max_sqs[i])
            denom = (max_sqs[i].sqrt() / bc2_sqrt).add_(eps)
        else:
            denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
        param.add_(exp_avg / denom * neg_step_size)  # addcdiv's order: value * (exp_avg / denom), + param


# ---- the compiled step -----------------------------------------------------------------------------------

class CompiledOptimizerStep:
    """Called like `opt.step(closure=None)`; see the module docstring."""

    def __init__(self, step: Any, compile_fn: Callable[[Callable], Callable]):
        self.opt = step.__self__
        self.native = step
        self.sgd = compile_fn(sgd_update)
        self.adam = compile_fn(adam_update)
        self.__wrapped__ = step
        self.__name__ = getattr(step, "__name__", "step")
        self.__qualname__ = getattr(step, "__qualname__", "step")

    def __call__(self, closure: Callable[[], Any] | None = None) -> Any:
        reason = self._unsupported(closure)
        if reason:
            counters["optimizer_native"][f"{type(self.opt).__name__}.step: {reason}"] += 1
            return self.native(closure) if closure is not None else self.native()
        opt = self.opt
        opt._opt_called = True  # (what torch's step wrapper records for LR schedulers)
        with torch.no_grad():
            for group in opt.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if not params:
                    continue
                if isinstance(opt, torch.optim.SGD):
                    self._sgd_group(group, params)
                elif not self._adam_group(group, params):
                    counters["optimizer_native"][f"{type(opt).__name__}.step: parameters' step counts "
                                                 "differ"] += 1
                    return self.native()
        counters["optimizer_compiled"][type(opt).__name__] += 1
        return None

    def _unsupported(self, closure: Any) -> str:
        opt = self.opt
        if closure is not None:
            return "a closure"
        hooks = sys.modules["torch.optim.optimizer"]
        if opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks or \
                hooks._global_optimizer_pre_hooks or hooks._global_optimizer_post_hooks:
            return "step hooks"
        for group in opt.param_groups:
            for flag in ("foreach", "fused", "capturable", "differentiable"):
                if group.get(flag):
                    return f"{flag}=True"
            for p in group["params"]:
                if p.grad is not None and (p.grad.is_sparse or p.is_complex() or
                                           p.grad.layout != torch.strided):
                    return "a sparse or complex gradient"
        return ""

    def _sgd_group(self, group: dict, params: list) -> None:
        opt, momentum = self.opt, group["momentum"]
        lr = group["lr"]
        neg_lr = _shared(params, lambda p: _scalar(-lr, p))
        bufs = [opt.state[p].get("momentum_buffer") if momentum != 0 else None for p in params]
        new = self.sgd(params, [p.grad for p in params], bufs, neg_lr, momentum, group["dampening"],
                       group["weight_decay"], group["nesterov"], group["maximize"])
        if momentum != 0:
            for p, buf in zip(params, new):
                opt.state[p]["momentum_buffer"] = buf

    def _adam_group(self, group: dict, params: list) -> bool:
        opt = self.opt
        for p in params:
            state = opt.state[p]
            if len(state) == 0:  # as eager's _init_group
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        steps = [opt.state[p]["step"] for p in params]
        counts = {float(s) for s in steps}
        if len(counts) != 1:
            return False
        torch._foreach_add_(steps, 1)
        step = counts.pop() + 1
        lr, (beta1, beta2) = _number(group["lr"]), (_number(b) for b in group["betas"])
        wd = group["weight_decay"]
        bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
        decoupled = isinstance(opt, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay", False))
        scalars = _shared(params, lambda p: (_scalar(1 - lr * wd, p), _scalar(bc2 ** 0.5, p),
                                             _scalar(-(lr / bc1), p)))
        self.adam(params, [p.grad for p in params], [opt.state[p]["exp_avg"] for p in params],
                  [opt.state[p]["exp_avg_sq"] for p in params],
                  [opt.state[p]["max_exp_avg_sq"] for p in params] if group["amsgrad"] else [], scalars,
                  beta1, beta2, group["eps"], wd, decoupled, group["amsgrad"], group["maximize"])
        return True


def _shared(params: list, make: Callable[[torch.Tensor], Any]) -> list:
    """make(p) per parameter, made once per (dtype, device): parameters alike share the same 0-d tensors,
    so the graph has a few scalar inputs, not a few per parameter."""
    made: dict[tuple, Any] = {}
    for p in params:
        if (p.dtype, p.device) not in made:
            made[(p.dtype, p.device)] = make(p)
    return [made[(p.dtype, p.device)] for p in params]


def _number(v: Any) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor in the parameter's dtype: what eager's Python scalar becomes in the op."""
    return torch.tensor(_number(value), dtype=like.dtype, device=like.device)
