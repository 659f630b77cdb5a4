"""Differential programs: getattr with a default, hasattr, isinstance / type checks, os.environ.get and
Mapping.get, string formatting and methods, global reads and writes, module-level constants."""
from __future__ import annotations

import enum
import math
import os
import sys
from collections.abc import Mapping, Sequence

import pytest
import torch
import kiln
from diff_helpers import params, run_program

X = torch.randn(3, 4)
SCALE = 1.5
NAMES = ("alpha", "beta")
LIMITS = {"low": -1.0, "high": 1.0}
FLAGS = {"fast": True}
COUNT = 0
HISTORY: list = []
CONFIG: dict = {"mode": "a"}
MAYBE = None


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Cfg:
    hidden = 8
    act = "relu"

    def __init__(self):
        self.dropout = 0.1


class ReadOnly(Mapping):
    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, k):
        return self._data[k]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class Seq(Sequence):
    def __getitem__(self, i):
        if i >= 3:
            raise IndexError(i)
        return i * 10

    def __len__(self):
        return 3


def s_getattr_default(x, c): return x * getattr(c, "hidden") + getattr(c, "missing", 2)
def s_getattr_default_none(x, c): return x if getattr(c, "nothing", None) is None else x * 0
def s_getattr_instance_attr(x, c): return x * getattr(c, "dropout", 0.0)
def s_getattr_dynamic_name(x, c):
    name = "hid" + "den"
    return x * getattr(c, name)
def s_getattr_missing_raises(x, c): return getattr(c, "missing")
def s_getattr_tensor_attr(x): return getattr(x, "shape"), getattr(x, "nope", "dflt")
def s_getattr_module_default(x): return getattr(math, "tau", 6.0) * x, getattr(math, "nope", 1)
def s_hasattr(x, c): return hasattr(c, "hidden"), hasattr(c, "dropout"), hasattr(c, "zzz"), x
def s_hasattr_tensor(x): return x * hasattr(x, "grad") + hasattr(x, "not_a_thing")
def s_setattr_getattr(x, c):
    setattr(c, "hidden", 16)
    return x * getattr(c, "hidden")
def s_isinstance(x): return isinstance(x, torch.Tensor), isinstance(3, (int, float)), isinstance("s", int)
def s_isinstance_bool_int(x): return isinstance(True, int), type(True) is int, x
def s_isinstance_abc(x, m, s):
    return (isinstance(m, Mapping), isinstance({}, Mapping), isinstance(s, Sequence),
            isinstance([], Sequence), x)
def s_isinstance_param(x): return isinstance(torch.nn.Parameter(x), torch.Tensor), x
def s_isinstance_dispatch(x, items):
    out = []
    for v in items:
        if isinstance(v, torch.Tensor):
            out.append(v * 2)
        elif isinstance(v, (list, tuple)):
            out.append(len(v))
        elif isinstance(v, str):
            out.append(v.upper())
        else:
            out.append(v)
    return out
def s_type_checks(x): return type(1) is int, type(1.0) == float, type(x).__name__, type([]) is list
def s_type_of_class(x, c): return type(c) is Cfg, type(c).__name__, type(c).hidden, x
def s_callable(x, c): return callable(c), callable(len), callable(Cfg), x
def s_environ_get(x): return x * (2 if os.environ.get("KILN_DIFF_SURELY_UNSET_VAR", "0") == "0" else 3)
def s_environ_get_none(x): return os.environ.get("KILN_DIFF_SURELY_UNSET_VAR") is None, x
def s_environ_in(x): return "KILN_DIFF_SURELY_UNSET_VAR" in os.environ, x
def s_environ_getenv(x): return os.getenv("KILN_DIFF_SURELY_UNSET_VAR", "d"), x
def s_mapping_get(x, m): return x * m.get("a", 1) + m.get("zz", 5), m.get("zz")
def s_mapping_in_len(x, m): return "a" in m, "q" in m, len(m), sorted(m), x
def s_mapping_items(x, m): return sorted(m.items()), list(m.keys()), x
def s_mapping_missing_key(x, m): return m["nope"]
def s_mapping_eq(x, m): return m == {"a": 2, "b": 3}, x
def s_sequence_iter(x, s): return list(s), 10 in s, s.index(20), x
def s_fstring(x, n): return f"{n}-{n:03d}-{n * 1.5:.2f}-{'s'!r}", x
def s_fstring_shape(x): return f"shape={tuple(x.shape)} dtype={x.dtype}", x
def s_format_method(x): return "{}+{b}={c:>4}".format(1, b=2, c=3), x
def s_percent_format(x): return "%d-%s-%.1f" % (3, "a", 2.25), x
def s_string_methods(x):
    s = "  Hello, World  "
    return s.strip().lower(), s.split(","), "-".join(["a", "b"]), s.replace("l", "L").count("L"), x
def s_string_checks(x):
    return "abc".startswith("a"), "abc".endswith(("x", "c")), "a1".isalnum(), "12".isdigit(), x
def s_string_slicing(x): return "abcdef"[1:4], "abcdef"[::-2], "abc" * 2, "ab" + "cd", x
def s_string_partition(x): return "key=value=x".partition("="), "a.b.c".rsplit(".", 1), x
def s_string_in_branch(x, mode):
    if mode.startswith("lin"):
        return x * 2
    return x
def s_string_compare(x): return "a" < "b", "abc" == "ab" + "c", max("ab", "b"), x
def s_str_conversions(x): return str(3), repr("q"), int("12") + float("1.5"), str(True), x
def s_format_error(x): return "{} {}".format(1)
def s_global_read(x): return x * SCALE, NAMES[1], LIMITS["high"]
def s_global_constant_branch(x): return x.clamp(LIMITS["low"], LIMITS["high"]) if FLAGS["fast"] else x
def s_global_write(x):
    global COUNT
    COUNT += 1
    return x * COUNT
def s_global_list_append(x):
    HISTORY.append(x.shape[0])
    return len(HISTORY)
def s_global_dict_write(x):
    CONFIG["mode"] = "b"
    CONFIG["new"] = 1
    return x
def s_global_rebind_none(x):
    global MAYBE
    if MAYBE is None:
        MAYBE = x.shape[0]
    return x * MAYBE
def s_global_missing(x): return x * NOT_DEFINED_ANYWHERE  # noqa: F821
def s_module_constants(x): return x * math.pi + math.e, math.inf > 1e308, sys.maxsize > 2 ** 31
def s_math_functions(x): return math.floor(2.7), math.ceil(2.1), math.gcd(12, 18), math.isclose(1.0, 1.0), x
def s_enum(x): return Color.RED.value, Color(2).name, Color.GREEN in Color, x * Color.GREEN.value
def s_enum_compare(x, c): return x * 2 if c is Color.RED else x
def s_builtin_misc(x): return abs(-2), divmod(7, 3), pow(2, 5), round(2.675, 2), bool([]), x
def s_id_is(x, c): return c is c, x is x, x is not None
def s_dir_vars(x, c): return "hidden" in dir(c), vars(c), x
def s_len_str_dict(x): return len("hello") + len({"a": 1}) + len([1, 2]) + len((1,)), x
def s_ord_chr(x): return ord("a"), chr(98), hex(255), bin(3), x
def s_hash_eq(x): return hash("a") == hash("a"), hash(1) == hash(1.0), x
def s_tensor_dtype_checks(x):
    return x.dtype == torch.float32, x.is_floating_point(), x.dtype.is_floating_point, torch.is_tensor(x)
def s_torch_module_attrs(x): return torch.float32.itemsize, str(torch.device("cpu")), x


# ---- harder: globals changed by callees, environment, formatting corners, typing ----------------------
GT = torch.zeros(4)
LEVEL = 1


def set_level(v):
    global LEVEL
    LEVEL = v


def bump_gt():
    GT.add_(1)


class Pretty:
    def __format__(self, spec):
        return f"P[{spec}]"

    def __str__(self):
        return "pretty"


def r_global_set_by_callee(x):
    before = LEVEL
    set_level(5)
    return before, LEVEL, x * LEVEL
def r_global_tensor_inplace(x):
    GT.add_(x[0])
    return GT * 2
def r_global_tensor_by_callee(x):
    bump_gt()
    bump_gt()
    return GT + x[0]
def r_global_rebind_then_read_in_callee(x):
    global LEVEL
    LEVEL = 7

    def read():
        return LEVEL
    return read(), x
def r_global_del(x):
    global LEVEL
    del LEVEL
    return x
def r_environ_set_and_read(x):
    os.environ["KILN_DIFF_TEMP_VAR"] = "v"
    got = os.environ.get("KILN_DIFF_TEMP_VAR")
    del os.environ["KILN_DIFF_TEMP_VAR"]
    return got, os.environ.get("KILN_DIFF_TEMP_VAR", "gone"), x
def r_environ_missing_keyerror(x): return os.environ["KILN_DIFF_SURELY_UNSET_VAR"]
def r_fstring_debug(x):
    n = 3
    return f"{n=}", f"{n + 1 = }", x
def r_fstring_nested_spec(x):
    width, prec = 8, 3
    return f"{3.14159:{width}.{prec}f}|", f"{'ab':>{width}}|", x
def r_format_user_spec(x): return f"{Pretty():abc}", format(Pretty(), "q"), str(Pretty()), x
def r_format_builtin(x): return format(3.14159, ".2f"), format(255, "x"), format(1234567, ","), x
def r_format_map(x): return "{a}-{b}".format_map({"a": 1, "b": 2}), x
def r_fstring_tensor_item(x): return f"{x.sum().item():.3f}"
def r_str_of_tensor_shape(x): return str(x.shape), repr(x.dtype), str(x.device), x
def r_bytes_ops(x): return b"ab" + b"c", b"abc".decode(), "é".encode("utf-8"), bytes([65, 66]), x
def r_int_float_methods(x):
    return ((10).bit_length(), (2.0).is_integer(), (7).to_bytes(2, "big"),
            int.from_bytes(b"\x01\x00", "big"), x)
def r_numeric_corners(x):
    return -7 // 2, -7 % 2, divmod(-7, 2), round(0.5), round(1.5), round(-2.5), 2 ** -1, x
def r_complex(x):
    c = complex(1, 2) * (3 - 1j)
    return c, c.real, abs(3 + 4j), x
def r_math_extras(x):
    import math
    return math.prod([1, 2, 3, 4]), math.comb(5, 2), math.isqrt(17), math.copysign(1, -0.0), x
def r_float_inf_nan(x):
    n = float("nan")
    return n == n, float("inf") > 1e308, math.isnan(n), math.isinf(-float("inf")), x
def r_isinstance_union_type(x): return isinstance(1, int | str), isinstance(None, int | None), x
def r_isinstance_typing(x):
    import typing
    return isinstance([], typing.Sequence), isinstance({}, typing.Mapping), x
def r_type_constructor(x):
    vals = [1, "a", 2.5, (1,)]
    return [type(v)() for v in vals], x
def r_dynamic_type_creation(x):
    T = type("T", (), {"k": 3, "get": lambda self: self.k * 2})
    return T().get(), T.__name__, x
def r_sys_attrs(x): return sys.version_info >= (3, 8), sys.version_info[0], isinstance(sys.maxsize, int), x
def r_torch_version_compare(x):
    major = int(torch.__version__.split(".")[0])
    return major >= 2, x
def r_warnings_warn(x):
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("careful", UserWarning)
    return len(caught), str(caught[0].message), x
def r_print_to_buffer(x):
    import io
    buf = io.StringIO()
    print("a", 1, x.shape, sep="|", file=buf)
    print("b", end="", file=buf)
    return buf.getvalue()
def r_logging_disabled(x):
    import logging
    log = logging.getLogger("kiln.diff.test")
    log.debug("quiet %s", 1)
    return log.isEnabledFor(logging.CRITICAL), x
def r_id_and_is_of_constants(x):
    a = (1, 2)
    return a is a, None is None, x
def _kernel_a(t): return t + 1
KERNELS = (_kernel_a,)
def r_id_keyed_registry(x):
    # transformers' hub-kernel layers (kernels >= 0.19) key a per-call dict by id() of global functions
    table = {}
    for fn in KERNELS:
        table[id(fn)] = fn
    return table[id(_kernel_a)](x) * 2
def r_id_of_new_object(x):
    a = [1]
    return id(a) == id(a), id(a) == id([1]), x + 1  # an object made in the call: a break, eager's values
def r_id_of_argument(x, c): return id(c) == id(c), x * 3
def r_outside_tuple_identity(x):
    a, b = KERNELS, KERNELS  # a global tuple of non-constants is traced as one copy: `is` holds, as in eager
    return a is b, KERNELS is KERNELS, x + 2
CONFIG_ID = id(CONFIG)
def r_id_of_a_global_dict(x):
    # kiln holds a mirror of a global dict while tracing: the id must still be the user's dict's
    return id(CONFIG) == CONFIG_ID, id(KERNELS) == id(KERNELS), x - 1
def r_str_translate_and_case(x):
    return "abc".translate(str.maketrans("ab", "xy")), "Hello World".swapcase(), "a-b_c".title(), x
def r_str_errors(x): return "abc".index("z")
def r_str_int_concat_error(x): return "a" + 1
def r_getattr_on_class_and_module(x):
    return getattr(torch, "float32"), getattr(torch.nn, "Linear").__name__, getattr(Cfg, "act"), x
def r_hasattr_property_raises(x):
    class P:
        @property
        def p(self):
            raise KeyError("not AttributeError")
    return hasattr(P(), "p")
def r_mapping_get_user_class_default(x, m): return m.get("zz", x), m.get("a")
def r_vars_module_like(x, c): return sorted(vars(c)), x
def r_global_constant_folding_guard(x): return x * LIMITS["high"] + len(NAMES)


TABLE = [
    (s_getattr_default, (X, Cfg())), (s_getattr_default_none, (X, Cfg())),
    (s_getattr_instance_attr, (X, Cfg())), (s_getattr_dynamic_name, (X, Cfg())),
    (s_getattr_missing_raises, (X, Cfg())), (s_getattr_tensor_attr, (X,)), (s_getattr_module_default, (X,)),
    (s_hasattr, (X, Cfg())), (s_hasattr_tensor, (X,)), (s_setattr_getattr, (X, Cfg())), (s_isinstance, (X,)),
    (s_isinstance_bool_int, (X,)), (s_isinstance_abc, (X, ReadOnly({"a": 1}), Seq())),
    (s_isinstance_param, (X,)), (s_isinstance_dispatch, (X, [X, [1, 2], "ab", 3, None])),
    (s_type_checks, (X,)), (s_type_of_class, (X, Cfg())), (s_callable, (X, Cfg())), (s_environ_get, (X,)),
    (s_environ_get_none, (X,)), (s_environ_in, (X,)), (s_environ_getenv, (X,)),
    (s_mapping_get, (X, ReadOnly({"a": 2}))), (s_mapping_in_len, (X, ReadOnly({"a": 2, "b": 3}))),
    (s_mapping_items, (X, ReadOnly({"a": 2, "b": 3}))), (s_mapping_missing_key, (X, ReadOnly({}))),
    (s_mapping_eq, (X, ReadOnly({"a": 2, "b": 3}))), (s_sequence_iter, (X, Seq())), (s_fstring, (X, 7)),
    (s_fstring_shape, (X,)), (s_format_method, (X,)), (s_percent_format, (X,)), (s_string_methods, (X,)),
    (s_string_checks, (X,)), (s_string_slicing, (X,)), (s_string_partition, (X,)),
    (s_string_in_branch, (X, "linear")), (s_string_compare, (X,)), (s_str_conversions, (X,)),
    (s_format_error, (X,)), (s_global_read, (X,)), (s_global_constant_branch, (X,)),
    (s_global_write, (X,), {"globals_": ("COUNT",)}),
    (s_global_list_append, (X,), {"globals_": ("HISTORY",)}),
    (s_global_dict_write, (X,), {"globals_": ("CONFIG",)}),
    (s_global_rebind_none, (X,), {"globals_": ("MAYBE",)}),
    (s_global_missing, (X,)), (s_module_constants, (X,)), (s_math_functions, (X,)), (s_enum, (X,)),
    (s_enum_compare, (X, Color.RED)), (s_builtin_misc, (X,)), (s_id_is, (X, Cfg())),
    (s_dir_vars, (X, Cfg())), (s_len_str_dict, (X,)), (s_ord_chr, (X,)), (s_hash_eq, (X,)),
    (s_tensor_dtype_checks, (X,)), (s_torch_module_attrs, (X,)),
    (r_global_set_by_callee, (X,), {"globals_": ("LEVEL",)}),
    (r_global_tensor_inplace, (X,), {"globals_": ("GT",)}),
    (r_global_tensor_by_callee, (X,), {"globals_": ("GT",)}),
    (r_global_rebind_then_read_in_callee, (X,), {"globals_": ("LEVEL",)}),
    (r_global_del, (X,), {"globals_": ("LEVEL",)}), (r_environ_set_and_read, (X,)),
    (r_environ_missing_keyerror, (X,)), (r_fstring_debug, (X,)), (r_fstring_nested_spec, (X,)),
    (r_format_user_spec, (X,)), (r_format_builtin, (X,)), (r_format_map, (X,)), (r_fstring_tensor_item, (X,)),
    (r_str_of_tensor_shape, (X,)), (r_bytes_ops, (X,)), (r_int_float_methods, (X,)),
    (r_numeric_corners, (X,)),
    (r_complex, (X,)), (r_math_extras, (X,)), (r_float_inf_nan, (X,)), (r_isinstance_union_type, (X,)),
    (r_isinstance_typing, (X,)), (r_type_constructor, (X,)), (r_dynamic_type_creation, (X,)),
    (r_sys_attrs, (X,)), (r_torch_version_compare, (X,)), (r_warnings_warn, (X,)), (r_print_to_buffer, (X,)),
    (r_logging_disabled, (X,)), (r_id_and_is_of_constants, (X,)), (r_str_translate_and_case, (X,)),
    (r_str_errors, (X,)), (r_str_int_concat_error, (X,)), (r_getattr_on_class_and_module, (X,)),
    (r_hasattr_property_raises, (X,)), (r_mapping_get_user_class_default, (X, ReadOnly({"a": 1}))),
    (r_vars_module_like, (X, Cfg())), (r_global_constant_folding_guard, (X,)),
    (r_id_keyed_registry, (X,), {"graphs": 1}), (r_id_of_new_object, (X,)), (r_id_of_argument, (X, Cfg())),
    (r_id_of_a_global_dict, (X,)), (r_outside_tuple_identity, (X,)),
]

KNOWN: dict[str, str] = {}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_misc(fn, args, options):
    run_program(fn, args, **options)


def test_id_of_an_outside_object_is_not_a_break():
    # the hub-kernel pattern made hf_llama run entirely natively (transformers 5.25 with kernels 0.19)
    report = kiln.explain(r_id_keyed_registry, X)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report
    report = kiln.explain(r_id_of_new_object, X)
    assert report.graph_break_count >= 1 and "made in the compiled call" in str(report), report
