"""The modified Bessel functions of the second kind (torch.special.modified_bessel_k0/k1 and their
exponentially scaled forms), decomposed as eager's kernels compute them: Chebyshev series (Cephes'
coefficients) evaluated by Clenshaw's recurrence, one series below x = 2 (with i0/i1 and a log term) and
one above, every step in the input's dtype.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import prims
from .registry import NoDecomposition
from .utils import convert, decomposition, in_dtype, is_float_dtype

# Chebyshev coefficients of K0 on (0, 2] and of exp(x) sqrt(x) K0 on (2, inf), likewise K1.
_K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
         1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
         1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
         -5.35327393233902768720e-01)
_K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
         -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
         6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
         -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
         1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
         -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
         2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
         -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
         2.44030308206595545468e+00)
_K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
         -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
         -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
         -3.53155960776544875667e-01, 1.52530022733894777053e+00)
_K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
         1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
         -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
         3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
         -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
         2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
         -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
         1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
         2.72062619048444266945e+00)


def _series(t: Any, coefficients: Sequence[float]) -> Any:
    """0.5 * (a - p) of Clenshaw's recurrence a = t * q - p + c over the coefficients (eager's loop)."""
    dtype = t.dtype
    full = lambda v: prims.full(tuple(t.shape), in_dtype(v, dtype), dtype, t.device)  # noqa: E731
    p, q, a = full(0.0), full(0.0), full(coefficients[0])
    for c in coefficients[1:]:
        p, q = q, a
        a = prims.add(prims.sub(prims.mul(t, q), p), in_dtype(c, dtype))
    return prims.mul(prims.sub(a, p), 0.5)


def _k(input: Any, order: int, scaled: bool, name: str) -> Any:
    dtype = input.dtype if is_float_dtype(input.dtype) else torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        raise NoDecomposition(f"{name} of {dtype} values")
    x = convert(input, dtype)
    small_a, large_b = (_K0_A, _K0_B) if order == 0 else (_K1_A, _K1_B)
    near = _series(prims.sub(prims.mul(x, x), 2.0), small_a)  # x <= 2
    far = _series(prims.sub(prims.div(8.0, x), 2.0), large_b)  # x > 2
    if order == 0:
        if scaled:
            log_half_x = prims.log(prims.mul(x, 0.5))
            small = prims.mul(prims.sub(near, prims.mul(log_half_x, prims.i0(x))), prims.exp(x))
        else:
            # eager: log(0.5 * x) in double (0.5 is a double literal), the difference rounded once
            wide = prims.convert_element_type(x, torch.float64)
            i0 = prims.convert_element_type(prims.i0(x), torch.float64)
            term = prims.mul(prims.log(prims.mul(wide, 0.5)), i0)
            small = prims.convert_element_type(
                prims.sub(prims.convert_element_type(near, torch.float64), term), dtype)
    else:
        small = prims.add(prims.mul(prims.log(prims.mul(x, 0.5)), prims.i1(x)), prims.div(near, x))
        if scaled:
            small = prims.mul(small, prims.exp(x))
    large = prims.div(far, prims.sqrt(x))
    if not scaled:
        large = prims.div(prims.mul(prims.exp(prims.neg(x)), far), prims.sqrt(x))
    out = prims.where(prims.le(x, 2.0), small, large)
    shape, device = tuple(x.shape), x.device
    out = prims.where(prims.lt(x, 0.0), prims.full(shape, float("nan"), dtype, device), out)
    return prims.where(prims.eq(x, 0.0), prims.full(shape, float("inf"), dtype, device), out)


@decomposition(torch.special.modified_bessel_k0)
def modified_bessel_k0(input: Any) -> Any:
    return _k(input, 0, False, "modified_bessel_k0")


@decomposition(torch.special.modified_bessel_k1)
def modified_bessel_k1(input: Any) -> Any:
    return _k(input, 1, False, "modified_bessel_k1")


@decomposition(torch.special.scaled_modified_bessel_k0)
def scaled_modified_bessel_k0(input: Any) -> Any:
    return _k(input, 0, True, "scaled_modified_bessel_k0")


@decomposition(torch.special.scaled_modified_bessel_k1)
def scaled_modified_bessel_k1(input: Any) -> Any:
    return _k(input, 1, True, "scaled_modified_bessel_k1")
