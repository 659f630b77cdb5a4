"""VJP rules of the elementwise prims, each the formula eager autograd uses (derivatives.yaml).

A rule is called as `rule(grads, outputs, *args, **kwargs)` with the prim's own arguments and returns one
entry per positional argument: its gradient, or None where no gradient flows (a Python number, a dtype, an
integer or bool tensor, a prim with zero or no derivative). Rules compute only with prims, so that the same
code runs on tensors (eagerly) and on proxies (recording the backward graph); they respect the prims'
strictness: operands of one shape and dtype, constants as Python numbers.

Complex tensors raise NotImplementedError: their gradients need conjugates that these rules do not build.
Where eager itself raises "not implemented" (zeta wrt its first argument, igamma and igammac wrt `a`) the
rule raises NotImplementedError when that argument is a float tensor: the graph then runs with torch,
which raises eager's own error if that gradient is wanted (and computes the others).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .creation import full
from .elementwise import (
    abs, acos, acosh, add, asin, asinh, atan, atan2, atanh, bitwise_and, bitwise_not, bitwise_or,
    bitwise_xor, ceil, convert_element_type, copysign, cos, cosh, digamma, div, eq, erf, erfc, erfcx,
    erfinv, exp, exp2, expm1, floor, fmax, fmin, fmod, ge, gt, hypot, i0, i0e, i1, i1e, igamma, igammac,
    isfinite, isinf, isnan, le, lgamma, log, log1p, log2, log10, log_ndtr, lt, maximum, minimum, mul, ndtr,
    ndtri, ne, neg, nextafter, pow, reciprocal, remainder, round, rsqrt, shift_left, shift_right, sigmoid,
    sign, signbit, sin, sinh, sqrt, sub, tan, tanh, trunc, where, zeta)
from .registry import Prim, is_tensor, meta_of, rule

_SQRT_PI = math.sqrt(math.pi)
_SQRT_2PI = math.sqrt(2 * math.pi)
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


def _differentiable(p: Prim, arg: str, x: Any) -> bool:
    """Whether a gradient flows to this argument: only real floating-point tensors take one."""
    if not is_tensor(x):
        return False
    dtype = meta_of(x).dtype
    if dtype.is_complex:
        raise NotImplementedError(f"vjp of prims.{p.name} wrt {arg}: complex tensors are not supported "
                                  f"(got {dtype})")
    return dtype.is_floating_point


def _as_tensor(x: Any, like: Any) -> Any:
    """A Python number operand as a tensor shaped like `like` (a formula needs it as a tensor)."""
    if is_tensor(x):
        return x
    m = meta_of(like)
    return full(tuple(m.shape), x, m.dtype, m.device)


def _square(x: Any) -> Any:
    return mul(x, x)


# ---- registration helpers -------------------------------------------------------------------------------

Derivative = Callable[[Any, Any, Any], Any]


def _defvjp_unary(p: Prim, grad_of: Derivative) -> None:
    """`grad_of(g, y, a)` is the gradient wrt `a` given the output's gradient g and the output y."""
    def vjp(grads: tuple, outputs: tuple, a: Any) -> tuple:
        (g,) = grads
        if g is None or not _differentiable(p, "a", a):
            return (None,)
        return (grad_of(g, outputs[0], a),)
    vjp.__name__ = f"_{p.name}_vjp"
    rule("vjp", p)(vjp)


BinaryDerivative = Callable[[Any, Any, Any, Any], Any]


def _defvjp_binary(p: Prim, grad_a: BinaryDerivative | None, grad_b: BinaryDerivative | None) -> None:
    """`grad_a(g, y, a, b)` and `grad_b(g, y, a, b)` give the gradients wrt a and b (called only for a
    floating-point tensor operand); None for an operand means eager defines no gradient for it."""
    def vjp(grads: tuple, outputs: tuple, a: Any, b: Any) -> tuple:
        (g,) = grads
        if g is None:
            return (None, None)
        y = outputs[0]
        da = grad_a(g, y, a, b) if grad_a is not None and _differentiable(p, "a", a) else None
        db = grad_b(g, y, a, b) if grad_b is not None and _differentiable(p, "b", b) else None
        return (da, db)
    vjp.__name__ = f"_{p.name}_vjp"
    rule("vjp", p)(vjp)


def _defvjp_none(p: Prim) -> None:
    """A prim whose derivative is zero where defined (sign, floor, ...) or that gives no float result
    (comparisons, bitwise ops): no gradient flows to any argument."""
    def vjp(grads: tuple, outputs: tuple, *args: Any, **kwargs: Any) -> tuple:
        return tuple(None for _ in args)
    vjp.__name__ = f"_{p.name}_vjp"
    vjp.gives_no_gradient = True  # type: ignore[attr-defined]  (by design: see kiln.autograd.joint)
    rule("vjp", p)(vjp)


# ---- unary ----------------------------------------------------------------------------------------------

_defvjp_unary(abs, lambda g, y, a: mul(g, sign(a)))
_defvjp_unary(neg, lambda g, y, a: neg(g))
_defvjp_unary(exp, lambda g, y, a: mul(g, y))
_defvjp_unary(exp2, lambda g, y, a: mul(mul(g, y), _LN2))
_defvjp_unary(expm1, lambda g, y, a: mul(g, add(y, 1.0)))
_defvjp_unary(log, lambda g, y, a: div(g, a))
_defvjp_unary(log2, lambda g, y, a: div(g, mul(a, _LN2)))
_defvjp_unary(log10, lambda g, y, a: div(g, mul(a, _LN10)))
_defvjp_unary(log1p, lambda g, y, a: div(g, add(a, 1.0)))
_defvjp_unary(sqrt, lambda g, y, a: div(g, mul(y, 2.0)))
_defvjp_unary(rsqrt, lambda g, y, a: mul(mul(g, -0.5), mul(_square(y), y)))
_defvjp_unary(reciprocal, lambda g, y, a: mul(neg(g), _square(y)))
_defvjp_unary(sin, lambda g, y, a: mul(g, cos(a)))
_defvjp_unary(cos, lambda g, y, a: mul(g, neg(sin(a))))
_defvjp_unary(tan, lambda g, y, a: mul(g, add(_square(y), 1.0)))
_defvjp_unary(asin, lambda g, y, a: mul(g, rsqrt(sub(1.0, _square(a)))))
_defvjp_unary(acos, lambda g, y, a: mul(g, neg(rsqrt(sub(1.0, _square(a))))))
_defvjp_unary(atan, lambda g, y, a: div(g, add(_square(a), 1.0)))
_defvjp_unary(sinh, lambda g, y, a: mul(g, cosh(a)))
_defvjp_unary(cosh, lambda g, y, a: mul(g, sinh(a)))
_defvjp_unary(tanh, lambda g, y, a: mul(g, sub(1.0, _square(y))))
_defvjp_unary(asinh, lambda g, y, a: mul(g, rsqrt(add(_square(a), 1.0))))
_defvjp_unary(acosh, lambda g, y, a: mul(g, rsqrt(sub(_square(a), 1.0))))
_defvjp_unary(atanh, lambda g, y, a: div(g, sub(1.0, _square(a))))
_defvjp_unary(sigmoid, lambda g, y, a: mul(mul(g, sub(1.0, y)), y))
_defvjp_unary(erf, lambda g, y, a: mul(g, mul(exp(neg(_square(a))), 2.0 / _SQRT_PI)))
_defvjp_unary(erfc, lambda g, y, a: mul(g, mul(exp(neg(_square(a))), -2.0 / _SQRT_PI)))
_defvjp_unary(erfinv, lambda g, y, a: mul(g, mul(exp(_square(y)), 0.5 * _SQRT_PI)))
_defvjp_unary(lgamma, lambda g, y, a: mul(g, digamma(a)))
_defvjp_unary(i0, lambda g, y, a: mul(g, i1(a)))
_defvjp_unary(i0e, lambda g, y, a: mul(g, sub(i1e(a), mul(sign(a), y))))
_defvjp_unary(ndtr, lambda g, y, a: mul(g, div(exp(mul(_square(a), -0.5)), _SQRT_2PI)))
_defvjp_unary(ndtri, lambda g, y, a: mul(g, mul(exp(mul(_square(y), 0.5)), _SQRT_2PI)))
_defvjp_unary(log_ndtr, lambda g, y, a: mul(div(g, _SQRT_2PI), exp(neg(add(y, mul(_square(a), 0.5))))))
_defvjp_unary(erfcx, lambda g, y, a: mul(sub(mul(mul(a, y), 2.0), 2.0 / _SQRT_PI), g))


def _trigamma(x: Any) -> Any:
    """polygamma(1, x) from prims, as eager's kernel computes it: reflection below 1/2, six steps of the
    recurrence psi1(x) = 1/x^2 + psi1(x + 1), then the asymptotic series."""
    reflect = lt(x, 0.5)
    sin_pi_x = sin(mul(x, math.pi))
    reflection = div(math.pi * math.pi, _square(sin_pi_x))
    z = where(reflect, sub(1.0, x), x)
    total = reciprocal(_square(z))
    for _ in range(5):
        z = add(z, 1.0)
        total = add(total, reciprocal(_square(z)))
    z = add(z, 1.0)
    inv_z2 = reciprocal(_square(z))
    # (1 + 1/(2z) + (1/6 - (1/30 - 1/(42 z^2)) / z^2) / z^2) / z
    inner = sub(1.0 / 30, div(inv_z2, 42.0))
    inner = mul(inv_z2, sub(1.0 / 6, mul(inv_z2, inner)))
    series = div(add(add(div(0.5, z), 1.0), inner), z)
    total = add(total, series)
    return where(reflect, sub(reflection, total), total)


_defvjp_unary(digamma, lambda g, y, a: mul(g, _trigamma(a)))


def _i1_grad(g: Any, y: Any, a: Any) -> Any:
    # i1'(x) = i0(x) - i1(x)/x; at x = 0 the quotient is 0/0 and the limit is 1/2
    eps = _eps(a)
    not_tiny = gt(abs(a), eps)
    safe = where(not_tiny, a, eps)
    return mul(g, where(not_tiny, sub(i0(safe), mul(y, reciprocal(safe))), 0.5))


def _i1e_grad(g: Any, y: Any, a: Any) -> Any:
    eps = _eps(a)
    not_tiny = gt(abs(a), eps)
    safe = where(not_tiny, a, eps)
    return mul(g, where(not_tiny, sub(i0e(safe), mul(y, add(sign(safe), reciprocal(safe)))), 0.5))


def _eps(a: Any) -> float:
    return torch.finfo(meta_of(a).dtype).eps


_defvjp_unary(i1, _i1_grad)
_defvjp_unary(i1e, _i1e_grad)

for _p in (sign, ceil, floor, round, trunc, bitwise_not, isnan, isinf, isfinite, signbit):
    _defvjp_none(_p)


# ---- binary ---------------------------------------------------------------------------------------------

def _identity(g: Any, y: Any, a: Any, b: Any) -> Any:
    return g


def _negated(g: Any, y: Any, a: Any, b: Any) -> Any:
    return neg(g)


_defvjp_binary(add, _identity, _identity)
_defvjp_binary(sub, _identity, _negated)
_defvjp_binary(mul, lambda g, y, a, b: mul(g, b), lambda g, y, a, b: mul(g, a))
_defvjp_binary(div, lambda g, y, a, b: div(g, b),
               lambda g, y, a, b: mul(neg(g), div(div(a, b), b)))


def _floor_divide(a: Any, b: Any) -> Any:
    """a // b for floats as eager computes it (div_floor_floating): from fmod, so that the quotient is
    exact where a / b would round across an integer."""
    mod = fmod(a, b)
    quotient = div(sub(a, mod), b)
    off_by_one = bitwise_and(ne(mod, 0.0), ne(lt(b, 0.0), lt(mod, 0.0)))
    quotient = where(off_by_one, sub(quotient, 1.0), quotient)
    floored = floor(quotient)
    floored = where(gt(sub(quotient, floored), 0.5), add(floored, 1.0), floored)
    return where(eq(b, 0.0), div(a, b), floored)


def _remainder_grad_b(g: Any, y: Any, a: Any, b: Any) -> Any:
    return mul(neg(g), _floor_divide(_as_tensor(a, b), b))


def _fmod_grad_b(g: Any, y: Any, a: Any, b: Any) -> Any:
    return mul(neg(g), trunc(div(a, b)))


_defvjp_binary(remainder, _identity, _remainder_grad_b)
_defvjp_binary(fmod, _identity, _fmod_grad_b)


def _pow_grad_base(g: Any, y: Any, a: Any, b: Any) -> Any:
    # b * a^(b-1), and exactly 0 where b == 0 (eager's choice: d/da a^0 = 0 even at a = 0)
    if not is_tensor(b):
        if b == 0:
            return None
        return mul(g, mul(pow(a, b - 1), b))
    return where(eq(b, 0.0), 0.0, mul(g, mul(b, pow(a, sub(b, 1.0)))))


def _log_of_number(v: Any) -> float:
    v = float(v)
    if v > 0:
        return math.log(v)
    return -math.inf if v == 0 else math.nan


def _pow_grad_exponent(g: Any, y: Any, a: Any, b: Any) -> Any:
    # a^b * log(a), and 0 where a == 0 and b >= 0 (where a^b is 0 or 1 and log(a) is -inf)
    if not is_tensor(a):
        scaled = mul(y, _log_of_number(a))
        if a == 0:
            scaled = where(ge(b, 0.0), 0.0, scaled)
        return mul(g, scaled)
    at_zero = bitwise_and(eq(a, 0.0), ge(b, 0.0))
    return mul(g, where(at_zero, 0.0, mul(y, log(a))))


_defvjp_binary(pow, _pow_grad_base, _pow_grad_exponent)


def _atan2_grad(first: bool) -> BinaryDerivative:
    def grad(g: Any, y: Any, a: Any, b: Any) -> Any:
        like = b if is_tensor(b) else a
        a, b = _as_tensor(a, like), _as_tensor(b, like)
        squares = add(_square(a), _square(b))
        zero = eq(squares, 0.0)  # (0, 0), or squares too small for the dtype: eager's gradient is 0, not NaN
        recip = reciprocal(where(zero, 1.0, squares))
        return where(zero, 0.0, mul(mul(g, b), recip) if first else mul(mul(g, neg(a)), recip))
    return grad


_defvjp_binary(atan2, _atan2_grad(True), _atan2_grad(False))
_defvjp_binary(hypot, lambda g, y, a, b: div(mul(g, a), y), lambda g, y, a, b: div(mul(g, b), y))


def _copysign_grad_a(g: Any, y: Any, a: Any, b: Any) -> Any:
    # +-1 where a != 0; eager gives 0 at a == 0 (where y / a is nan)
    return mul(g, where(eq(a, 0.0), 0.0, div(y, a)))


_defvjp_binary(copysign, _copysign_grad_a, None)  # eager: zeros wrt the sign's source
# one ulp toward b: locally the identity in a where it moves (eager: g where a != b, 0 where equal)
_defvjp_binary(nextafter, lambda g, y, a, b: where(ne(a, _as_tensor(b, a)), g, 0.0), None)


def _extremum_grad(loses_a: Callable[[Any, Any], Any], first: bool) -> BinaryDerivative:
    """maximum/minimum: the gradient goes to the operand taken; on ties (and NaNs) eager's formula is
    where(a == b, g / 2, g) masked to 0 where the operand lost."""
    def grad(g: Any, y: Any, a: Any, b: Any) -> Any:
        like = b if is_tensor(b) else a
        a, b = _as_tensor(a, like), _as_tensor(b, like)
        shared = where(eq(a, b), div(g, 2.0), g)
        lost = loses_a(a, b) if first else loses_a(b, a)
        return where(lost, 0.0, shared)
    return grad


_defvjp_binary(maximum, _extremum_grad(lt, True), _extremum_grad(lt, False))
_defvjp_binary(minimum, _extremum_grad(gt, True), _extremum_grad(gt, False))


def _nan_ignoring_grad(takes_a: Callable[[Any, Any], Any], first: bool) -> BinaryDerivative:
    """fmax/fmin: all of g to a where a wins (a >= b for fmax) or b is NaN, else all of it to b."""
    def grad(g: Any, y: Any, a: Any, b: Any) -> Any:
        like = b if is_tensor(b) else a
        a, b = _as_tensor(a, like), _as_tensor(b, like)
        a_taken = bitwise_or(takes_a(a, b), isnan(b))
        return where(a_taken, g, 0.0) if first else where(a_taken, 0.0, g)
    return grad


_defvjp_binary(fmax, _nan_ignoring_grad(ge, True), _nan_ignoring_grad(ge, False))
_defvjp_binary(fmin, _nan_ignoring_grad(le, True), _nan_ignoring_grad(le, False))


def _not_implemented(what: str) -> BinaryDerivative:
    def grad(g: Any, y: Any, a: Any, b: Any) -> Any:
        raise NotImplementedError(f"vjp of {what}: eager does not implement it")
    return grad


def _zeta_grad_q(g: Any, y: Any, x: Any, q: Any) -> Any:
    # d/dq zeta(x, q) = -x * zeta(x + 1, q)
    x = _as_tensor(x, q)
    return mul(mul(g, neg(x)), zeta(add(x, 1.0), q))


def _igamma_density(a: Any, x: Any) -> Any:
    # d/dx P(a, x) = x^(a-1) e^(-x) / Gamma(a)
    a = _as_tensor(a, x)
    return exp(sub(sub(mul(sub(a, 1.0), log(x)), x), lgamma(a)))


_defvjp_binary(zeta, _not_implemented("prims.zeta wrt x"), _zeta_grad_q)  # eager: not implemented wrt x
_defvjp_binary(igamma, _not_implemented("prims.igamma wrt a"), lambda g, y, a, x: mul(g, _igamma_density(a, x)))
_defvjp_binary(igammac, _not_implemented("prims.igammac wrt a"),
               lambda g, y, a, x: mul(neg(g), _igamma_density(a, x)))

for _p in (bitwise_and, bitwise_or, bitwise_xor, shift_left, shift_right, eq, ne, lt, le, gt, ge):
    _defvjp_none(_p)
del _p


# ---- where and type conversion --------------------------------------------------------------------------

@rule("vjp", where)
def _where_vjp(grads: tuple, outputs: tuple, pred: Any, a: Any, b: Any) -> tuple:
    (g,) = grads
    if g is None:
        return (None, None, None)
    da = where(pred, g, 0.0) if _differentiable(where, "a", a) else None
    db = where(pred, 0.0, g) if _differentiable(where, "b", b) else None
    return (None, da, db)


@rule("vjp", convert_element_type)
def _convert_element_type_vjp(grads: tuple, outputs: tuple, a: Any, *dtype: Any, **kwargs: Any) -> tuple:
    # dtype may come positionally (one None for it) or as a keyword (no entry)
    (g,) = grads
    rest = tuple(None for _ in dtype)
    if g is None or not _differentiable(convert_element_type, "a", a):
        return (None, *rest)
    if not _differentiable(convert_element_type, "the result", g):
        return (None, *rest)  # a float converted to an integer or bool: no gradient flows back
    return (convert_element_type(g, meta_of(a).dtype), *rest)
