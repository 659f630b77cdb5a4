"""Bessel functions of the first and second kind (torch.special.bessel_j0/j1/y0/y1), decomposed as eager's
kernels compute them: Cephes' rational approximations (polynomials by Horner's rule) below x = 5 and the
asymptotic form with its P/Q rational corrections above, every step in the input's dtype.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import prims
from .registry import NoDecomposition
from .utils import convert, decomposition, in_dtype, is_float_dtype

_J0_PP = (7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00,
          5.44725003058768775090e+00, 8.74716500199817011941e+00, 5.30324038235394892183e+00,
          9.99999999999999997821e-01)
_J0_PQ = (9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00,
          5.47097740330417105182e+00, 8.76190883237069594232e+00, 5.30605288235394617618e+00,
          1.00000000000000000218e+00)
_J0_QP = (-1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01,
          -9.32060152123768231369e+01, -1.77681167980488050595e+02, -1.47077505154951170175e+02,
          -5.14105326766599330220e+01, -6.05014350600728481186e+00)
_J0_QQ = (6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03,
          7.24046774195652478189e+03, 5.93072701187316984827e+03, 2.06209331660327847417e+03,
          2.42005740240291393179e+02)
_J0_RP = (-4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14,
          9.70862251047306323952e+15)
_J0_RQ = (4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07,
          1.11855537045356834862e+10, 2.11277520115489217587e+12, 3.10518229857422583814e+14,
          3.18121955943204943306e+16, 1.71086294081043136091e+18)
_J1_PP = (7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00,
          5.11207951146807644818e+00, 8.42404590141772420927e+00, 5.21451598682361504063e+00,
          1.00000000000000000254e+00)
_J1_PQ = (5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00,
          5.07386386128601488557e+00, 8.39985554327604159757e+00, 5.20982848682361821619e+00,
          9.99999999999999997461e-01)
_J1_QP = (5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01,
          3.66779609360150777800e+02, 7.10856304998926107277e+02, 5.97489612400613639965e+02,
          2.11688757100572135698e+02, 2.52070205858023719784e+01)
_J1_QQ = (7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03,
          9.56231892404756170795e+03, 7.99704160447350683650e+03, 2.82619278517639096600e+03,
          3.36093607810698293419e+02)
_J1_RP = (-8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13,
          3.68295732863852883286e+15)
_J1_RQ = (6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07,
          2.21511595479792499675e+10, 4.74914122079991414898e+12, 7.84369607876235854894e+14,
          8.95222336184627338078e+16, 5.32278620332680085395e+18)
_Y0_YP = (1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09,
          -9.82136065717911466409e+11, 8.75906394395366999549e+13, -3.46628303384729719441e+15,
          4.42733268572569800351e+16, -1.84950800436986690637e+16)
_Y0_YQ = (1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08,
          8.64002487103935000337e+10, 2.02979612750105546709e+13, 3.17157752842975028269e+15,
          2.50596256172653059228e+17)
_Y1_YP = (1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14,
          -8.12770255501325109621e+15, 2.02439475713594898196e+17, -7.78877196265950026825e+17)
_Y1_YQ = (5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07,
          1.87601316108706159478e+10, 3.88231277496238566008e+12, 6.20557727146953693363e+14,
          6.87141087355300489866e+16, 3.97270608116560655612e+18)

_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163
_SQRT_2_PI = 0.797884560802865355879892119868763737
_2_PI = 0.636619772367581343075535053490057448


def _horner(t: Any, coefficients: Sequence[float]) -> Any:
    """r = r * t + c from r = 0, as eager's loops (0 * t first, so t = inf gives NaN as there)."""
    dtype = t.dtype
    r = prims.full(tuple(t.shape), 0.0, dtype, t.device)
    for c in coefficients:
        r = prims.add(prims.mul(r, t), in_dtype(c, dtype))
    return r


def _asymptotic(x: Any, w: Any, order: int, second_kind: bool) -> Any:
    """(P cos(x - phase) - 5/x Q sin(x - phase)) sqrt(2/pi) / sqrt(x) above x = 5; Y swaps sin and cos
    and adds."""
    dtype = x.dtype
    pp, pq, qp, qq = (_J0_PP, _J0_PQ, _J0_QP, _J0_QQ) if order == 0 else (_J1_PP, _J1_PQ, _J1_QP, _J1_QQ)
    p = prims.div(_horner(w, pp), _horner(w, pq))
    q = prims.mul(prims.div(5.0, x), prims.div(_horner(w, qp), _horner(w, qq)))
    shifted = prims.sub(x, in_dtype(_PI_4 if order == 0 else _3PI_4, dtype))
    if second_kind:
        value = prims.add(prims.mul(p, prims.sin(shifted)), prims.mul(q, prims.cos(shifted)))
    else:
        value = prims.sub(prims.mul(p, prims.cos(shifted)), prims.mul(q, prims.sin(shifted)))
    return prims.div(prims.mul(value, in_dtype(_SQRT_2_PI, dtype)), prims.sqrt(x))


def _float_input(input: Any, name: str) -> Any:
    dtype = input.dtype if is_float_dtype(input.dtype) else torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        raise NoDecomposition(f"{name} of {dtype} values")
    return convert(input, dtype)


def _j0(x: Any) -> Any:
    x = prims.abs(x)
    dtype = x.dtype
    xx = prims.mul(x, x)
    tiny = prims.sub(1.0, prims.div(xx, 4.0))
    near = prims.div(prims.mul(prims.mul(prims.sub(xx, in_dtype(5.78318596294678452118e+00, dtype)),
                                         prims.sub(xx, in_dtype(3.04712623436620863991e+01, dtype))),
                               _horner(xx, _J0_RP)), _horner(xx, _J0_RQ))
    far = _asymptotic(x, prims.div(25.0, xx), 0, second_kind=False)
    return prims.where(prims.le(x, 5.0), prims.where(prims.lt(x, 1e-5), tiny, near), far)


def _j1(input: Any) -> Any:
    negative = prims.lt(input, 0.0)
    x = prims.where(negative, prims.neg(input), input)
    dtype = x.dtype
    xx = prims.mul(x, x)
    near = prims.mul(prims.mul(prims.mul(prims.div(_horner(xx, _J1_RP), _horner(xx, _J1_RQ)), x),
                               prims.sub(xx, in_dtype(1.46819706421238932572e+01, dtype))),
                     prims.sub(xx, in_dtype(4.92184563216946036703e+01, dtype)))
    five_over_x = prims.div(5.0, x)
    far = _asymptotic(x, prims.mul(five_over_x, five_over_x), 1, second_kind=False)
    out = prims.where(prims.le(x, 5.0), near, far)
    return prims.where(negative, prims.neg(out), out)


def _special_values(x: Any, out: Any, nan_below: Any) -> Any:
    """-inf at 0 and NaN below 0 (or at/below it), as eager's Y kernels."""
    shape, dtype, device = tuple(x.shape), x.dtype, x.device
    out = prims.where(nan_below, prims.full(shape, float("nan"), dtype, device), out)
    return prims.where(prims.eq(x, 0.0), prims.full(shape, float("-inf"), dtype, device), out)


@decomposition(torch.special.bessel_j0)
def bessel_j0(input: Any) -> Any:
    return _j0(_float_input(input, "bessel_j0"))


@decomposition(torch.special.bessel_j1)
def bessel_j1(input: Any) -> Any:
    return _j1(_float_input(input, "bessel_j1"))


@decomposition(torch.special.bessel_y0)
def bessel_y0(input: Any) -> Any:
    x = _float_input(input, "bessel_y0")
    xx = prims.mul(x, x)
    near = prims.add(prims.div(_horner(xx, _Y0_YP), _horner(xx, _Y0_YQ)),
                     prims.mul(prims.mul(prims.log(x), in_dtype(_2_PI, x.dtype)), _j0(x)))
    far = _asymptotic(x, prims.div(25.0, xx), 0, second_kind=True)
    out = prims.where(prims.le(x, 5.0), near, far)
    return _special_values(x, out, prims.lt(x, 0.0))


@decomposition(torch.special.bessel_y1)
def bessel_y1(input: Any) -> Any:
    x = _float_input(input, "bessel_y1")
    xx = prims.mul(x, x)
    log_term = prims.sub(prims.mul(_j1(x), prims.log(x)), prims.div(1.0, x))
    near = prims.add(prims.mul(x, prims.div(_horner(xx, _Y1_YP), _horner(xx, _Y1_YQ))),
                     prims.mul(log_term, in_dtype(_2_PI, x.dtype)))
    five_over_x = prims.div(5.0, x)
    far = _asymptotic(x, prims.mul(five_over_x, five_over_x), 1, second_kind=True)
    out = prims.where(prims.le(x, 5.0), near, far)
    return _special_values(x, out, prims.le(x, 0.0))
