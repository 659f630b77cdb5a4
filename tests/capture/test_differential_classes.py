"""Differential programs: user classes (made inside the compiled code and passed in), dunder operators,
properties, classmethod / staticmethod, super(), __getattr__, inheritance, dataclasses, namedtuples and
functools (partial, reduce, wraps, lru_cache)."""
from __future__ import annotations

import collections
import dataclasses
import functools
import operator
import typing

import pytest
import torch
from diff_helpers import params, run_program

X = torch.randn(3, 4)


class Vec:
    def __init__(self, *vals):
        self.vals = list(vals)

    def __add__(self, other):
        if isinstance(other, Vec):
            return Vec(*[a + b for a, b in zip(self.vals, other.vals)])
        return Vec(*[a + other for a in self.vals])

    def __radd__(self, other):
        return self + other

    def __mul__(self, k):
        return Vec(*[a * k for a in self.vals])

    def __getitem__(self, i):
        return self.vals[i]

    def __setitem__(self, i, v):
        self.vals[i] = v

    def __len__(self):
        return len(self.vals)

    def __iter__(self):
        return iter(self.vals)

    def __contains__(self, v):
        return v in self.vals

    def __eq__(self, other):
        return isinstance(other, Vec) and self.vals == other.vals

    def __bool__(self):
        return any(v != 0 for v in self.vals)

    def __neg__(self):
        return Vec(*[-a for a in self.vals])


class Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, t):
        return t * self.k


class Temperature:
    def __init__(self, c):
        self._c = c

    @property
    def f(self):
        return self._c * 9 / 5 + 32

    @f.setter
    def f(self, value):
        self._c = (value - 32) * 5 / 9

    @classmethod
    def boiling(cls):
        return cls(100)

    @staticmethod
    def describe(v):
        return f"{v:.1f}C"


class Animal:
    sound = "..."

    def __init__(self, name):
        self.name = name

    def speak(self):
        return f"{self.name}:{self.sound}"

    def weight(self, t):
        return t * 1


class Dog(Animal):
    sound = "woof"

    def __init__(self, name, size):
        super().__init__(name)
        self.size = size

    def weight(self, t):
        return super().weight(t) * self.size


class Puppy(Dog):
    def speak(self):
        return super().speak().upper()


class Lazy:
    def __init__(self):
        self.real = 1

    def __getattr__(self, name):
        if name.startswith("x_"):
            return len(name)
        raise AttributeError(name)


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


class Registry:
    items: typing.ClassVar[list] = []

    @classmethod
    def register(cls, v):
        cls.items = cls.items + [v]
        return len(cls.items)


class Mutable:
    def __init__(self):
        self.count = 0
        self.hist = []

    def bump(self, v):
        self.count += 1
        self.hist.append(v)
        return self


@dataclasses.dataclass
class Config:
    width: int = 4
    depth: int = 2
    tags: list = dataclasses.field(default_factory=list)

    def total(self):
        return self.width * self.depth


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    b: str = "b"


@dataclasses.dataclass
class Holder:
    t: torch.Tensor
    scale: float = 1.0


Pair = collections.namedtuple("Pair", ["left", "right"])


class Span(typing.NamedTuple):
    start: int
    stop: int = 10

    def length(self):
        return self.stop - self.start


def u_vec_ops(x):
    v = Vec(1, 2) + Vec(3, 4)
    w = v * 2
    return w.vals, v[0], len(w), 3 in w, x
def u_vec_radd(x): return sum([Vec(1, 1), Vec(2, 3)], Vec(0, 0)).vals, (5 + Vec(1)).vals, x
def u_vec_eq_bool(x): return Vec(1) == Vec(1), Vec(1) == Vec(2), bool(Vec(0, 0)), bool(Vec(0, 1)), x
def u_vec_if(x):
    return x * 2 if Vec(0, 3) else x
def u_vec_iter_tensor(x): return [x * v for v in Vec(1, 2)]
def u_vec_neg_setitem(x):
    v = -Vec(1, 2)
    v[1] = x
    return v.vals
def u_vec_arg_mutate(x, v):
    v[0] = 100
    v.vals.append(x)
    return len(v)
def u_callable(x): return Scaler(3)(x)
def u_callable_arg(x, s): return s(x) + s.k
def u_callable_map(x): return list(map(Scaler(2), [x, x + 1]))
def u_property(x):
    t = Temperature(100)
    return x * t.f
def u_property_setter(x):
    t = Temperature(0)
    t.f = 212
    return x, t._c
def u_classmethod(x): return x * Temperature.boiling().f
def u_staticmethod(x): return Temperature.describe(3.14159), Temperature(1).describe(2.0), x
def u_inheritance(x):
    d = Dog("rex", 3)
    return d.speak(), d.weight(x), isinstance(d, Animal)
def u_super_chain(x):
    p = Puppy("bo", 2)
    return p.speak(), p.weight(x)
def u_class_attr(x): return Dog.sound, Animal.sound, Dog("a", 1).sound, x
def u_mro(x): return [c.__name__ for c in Puppy.__mro__], x
def u_issubclass(x): return issubclass(Puppy, Animal), issubclass(Animal, Dog), x
def u_getattr_dunder(x):
    lz = Lazy()
    return x * lz.x_abc + lz.real
def u_getattr_dunder_missing(x): return Lazy().nothing
def u_getattr_dunder_default(x): return getattr(Lazy(), "nothing", 5) * x
def u_slots(x):
    s = Slotted(x, 2)
    s.b = 3
    return s.a * s.b
def u_slots_error(x):
    s = Slotted(1, 2)
    s.c = 3
    return x
def u_class_in_function(x):
    class Local:
        def __init__(self, t):
            self.t = t

        def double(self):
            return self.t * 2
    return Local(x).double()
def u_local_class_returned(x):
    class Box:
        def __init__(self, v):
            self.v = v
    return Box(x + 1)
def u_instance_mutation_arg(x, m):
    m.bump(1).bump(x.shape[0])
    return m.count
def u_setattr_new_attr(x, m):
    m.extra = x * 2
    setattr(m, "named", "n")
    return x
def u_delattr(x, m):
    del m.hist
    return hasattr(m, "hist"), x
def u_classvar_mutation(x):
    Registry.items = []
    return Registry.register("a"), Registry.register("b"), x
def u_dunder_methods_direct(x): return Vec(1).__add__(Vec(2)).vals, Vec(1, 2).__len__(), x
def u_type_call(x): return type(Vec(1)).__name__, type(Vec(1)) is Vec, x
def u_dataclass(x):
    c = Config(width=3)
    c.tags.append("t")
    return c, c.total() * x
def u_dataclass_fields(x): return [f.name for f in dataclasses.fields(Config)], x
def u_dataclass_replace(x):
    c = Config(1, 2)
    d = dataclasses.replace(c, depth=5)
    return c, d, x
def u_dataclass_asdict(x): return dataclasses.asdict(Config(2, 3, ["a"])), x
def u_dataclass_astuple(x): return dataclasses.astuple(Config(2, 3)), x
def u_dataclass_eq(x): return Config(1) == Config(1), Config(1) == Config(2), x
def u_dataclass_frozen(x):
    f = Frozen(1)
    f.a = 2
    return x
def u_dataclass_tensor(x):
    h = Holder(x, 2.0)
    return h.t * h.scale
def u_dataclass_arg_mutate(x, c):
    c.width += 1
    c.tags.append(x.shape)
    return c.total()
def u_namedtuple(x):
    p = Pair(x, 2)
    return p.left * p.right, p[1], p
def u_namedtuple_replace(x):
    p = Pair(1, 2)._replace(right=5)
    return p, x
def u_namedtuple_asdict(x): return Pair(1, "r")._asdict(), x
def u_namedtuple_unpack(x):
    left, right = Pair(x, x * 2)
    return right - left
def u_namedtuple_fields(x): return Pair._fields, Pair._make([1, 2]), x
def u_typed_namedtuple(x):
    s = Span(2)
    return s, s.length(), s._replace(stop=4).length(), x
def u_partial(x):
    f = functools.partial(operator.mul, 3)
    return f(x), f(2)
def u_partial_kwargs(x):
    f = functools.partial(torch.clamp, min=-0.1)
    return f(x, max=0.2)
def u_partial_user_fn(x):
    def affine(t, w, b=0):
        return t * w + b
    g = functools.partial(affine, w=2, b=1)
    return g(x), g(x, b=5), g.keywords
def u_partial_nested(x):
    f = functools.partial(functools.partial(torch.add, x), alpha=2)
    return f(1)
def u_reduce(x): return functools.reduce(operator.add, [1, 2, 3]), functools.reduce(operator.mul, [], 7), x
def u_reduce_tensors(x): return functools.reduce(lambda a, b: a * b + 1, [x, x, x])
def u_reduce_empty_error(x): return functools.reduce(operator.add, [])
def u_wraps(x):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k) + 1
        return wrapper

    @deco
    def base(t):
        """doc"""
        return t * 2
    return base(x), base.__name__, base.__doc__
@functools.lru_cache(maxsize=None)
def _fib(n):
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)
def u_lru_cache(x): return x * _fib(10)
def u_cached_property(x):
    class C:
        @functools.cached_property
        def val(self):
            return 42
    c = C()
    return c.val, c.val, x
def u_total_ordering(x):
    @functools.total_ordering
    class V:
        def __init__(self, v):
            self.v = v

        def __eq__(self, o):
            return self.v == o.v

        def __lt__(self, o):
            return self.v < o.v
    return V(1) <= V(2), V(3) > V(2), sorted([V(2), V(1)])[0].v, x
def u_unsupported_operand(x): return Vec(1) - Vec(2)


# ---- harder: protocols, descriptors, metaclass hooks, attribute machinery ------------------------------
class Countdown:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n <= 0:
            raise StopIteration
        self.n -= 1
        return self.n


class Acc:
    def __init__(self):
        self.vals = []

    def __iadd__(self, v):
        self.vals.append(v)
        return self


class Frozenish:
    def __init__(self):
        object.__setattr__(self, "log", [])

    def __setattr__(self, name, value):
        self.log.append(name)
        object.__setattr__(self, name, value)


class Positive:
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, objtype=None):
        return 0 if obj is None else getattr(obj, self.name)

    def __set__(self, obj, value):
        if value < 0:
            raise ValueError("negative")
        setattr(obj, self.name, value)


class Account:
    balance = Positive()

    def __init__(self, b):
        self.balance = b


class Idx:
    def __init__(self, i):
        self.i = i

    def __index__(self):
        return self.i


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


class Plugin:
    registry: typing.ClassVar[list] = []

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        Plugin.registry.append(cls.__name__)


class Shape:
    def __new__(cls, sides):
        obj = super().__new__(cls)
        obj.kind = "tri" if sides == 3 else "poly"
        return obj

    def __init__(self, sides):
        self.sides = sides


class A:
    def who(self):
        return ["A"]


class B1(A):
    def who(self):
        return ["B1"] + super().who()


class B2(A):
    def who(self):
        return ["B2"] + super().who()


class D(B1, B2):
    def who(self):
        return ["D"] + super().who()


class PropFallback:
    @property
    def broken(self):
        raise AttributeError("inner")

    def __getattr__(self, name):
        return "fallback:" + name


class Named:
    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return f"Named({self.n})"

    def __str__(self):
        return f"<{self.n}>"

    def __hash__(self):
        return hash(self.n)

    def __eq__(self, o):
        return isinstance(o, Named) and o.n == self.n

    def __lt__(self, o):
        return self.n < o.n


@dataclasses.dataclass(order=True)
class Version:
    major: int
    minor: int = 0
    label: str = dataclasses.field(default="", compare=False)


@dataclasses.dataclass
class Derived:
    a: int
    b: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.b = self.a * 2


def v_iterator_protocol(x): return list(Countdown(3)), x
def v_iterator_partly_arg(x, c): return next(c), x
def v_iadd_returns_self(x):
    a = Acc()
    alias = a
    a += 1
    a += x
    return alias is a, len(a.vals)
def v_setattr_override(x):
    f = Frozenish()
    f.a = 1
    f.b = x
    return f.log, f.b
def v_descriptor(x):
    acc = Account(5)
    acc.balance = 7
    return acc.balance, Account.balance, x
def v_descriptor_raises(x):
    Account(-1)
    return x
def v_index_protocol(x): return [10, 20, 30][Idx(1)], list(range(Idx(3))), x[Idx(2)]
def v_len_for_bool(x): return bool(Sized(0)), bool(Sized(2)), len(Sized(3)), x
def v_len_negative(x): return len(Sized(-1))
def v_init_subclass(x):
    class Extra(Plugin):
        pass
    return Plugin.registry[-1], x
def v_dunder_new(x):
    s = Shape(3)
    return s.kind, s.sides, x
def v_diamond_super(x): return D().who(), [c.__name__ for c in D.__mro__], x
def v_property_attributeerror_fallback(x): return PropFallback().broken, x
def v_repr_str_format(x):
    n = Named(3)
    return repr(n), str(n), f"{n}|{n!r}", "%s" % n, x
def v_hash_eq_dict_key(x):
    d = {Named(1): "one"}
    return d[Named(1)], Named(2) in [Named(2)], Named(1) in {Named(1)}, x
def v_sorted_user_lt(x): return [n.n for n in sorted([Named(3), Named(1), Named(2)])], x
def v_dataclass_order(x):
    vs = sorted([Version(1, 2), Version(1, 0, "b"), Version(0, 9)])
    return vs, Version(1, 0, "x") == Version(1, 0, "y"), x
def v_dataclass_post_init(x): return Derived(3), x
def v_dataclass_instance_fields(x): return [f.name for f in dataclasses.fields(Derived(1))], x
def v_bound_method_stored(x):
    m = Mutable()
    bump = m.bump
    bump(1)
    bump(2)
    return m.count, m.hist, x
def v_method_from_class(x):
    m = Mutable()
    Mutable.bump(m, 5)
    return m.hist, x
def v_abstract_instantiation(x):
    import abc

    class Base(abc.ABC):
        @abc.abstractmethod
        def run(self):
            ...
    return Base()
def v_operator_helpers(x):
    rows = [{"k": 2, "v": "b"}, {"k": 1, "v": "a"}]
    by_k = sorted(rows, key=operator.itemgetter("k"))
    names = list(map(operator.attrgetter("n"), [Named(1), Named(2)]))
    upper = operator.methodcaller("upper")("abc")
    return by_k, names, upper, x
def v_cmp_to_key(x):
    def cmp(a, b):
        return (a % 3) - (b % 3)
    return sorted([5, 3, 4, 1], key=functools.cmp_to_key(cmp)), x
def v_singledispatch(x):
    @functools.singledispatch
    def describe(v):
        return "other"

    @describe.register
    def _(v: int):
        return "int"
    return describe(1), describe("s"), x
def v_bool_returns_non_bool(x):
    class Weird:
        def __bool__(self):
            return 1
    return bool(Weird())
def v_class_attr_shadow_instance(x):
    class C:
        v = 1
    c = C()
    c.v = 2
    return C.v, c.v, x
def v_instance_dict_mutation(x, m):
    m.__dict__["count"] = 99
    return m.count, x
def v_super_in_classmethod(x):
    class P:
        @classmethod
        def make(cls):
            return cls.__name__

    class Q(P):
        @classmethod
        def make(cls):
            return "Q+" + super().make()
    return Q.make(), x
def v_namedtuple_defaults_compare(x):
    P3 = collections.namedtuple("P3", "a b c", defaults=(0, 1))
    p = P3(5)
    return p, p < P3(5, 1), p == (5, 0, 1), x
def v_user_callable_tensor_module(x):
    class Affine:
        def __init__(self, w):
            self.w = w
            self.calls = 0

        def __call__(self, t):
            self.calls += 1
            return t * self.w
    f = Affine(2.0)
    return f(f(x)), f.calls

def v_setattr_on_class(x):
    class K:
        k = 1
    setattr(K, "k", 5)
    return K.k, x
def v_setattr_on_global_class(x):
    Temperature.unit = "C"
    got = Temperature.unit
    del Temperature.unit
    return got, x
def v_module_object_attr(x, mod):
    mod.value = 3
    return mod.value, x

def v_class_counter_classmethod(x):
    class Tally:
        n = 0

        @classmethod
        def hit(cls):
            cls.n += 1
            return cls.n
    Tally.hit()
    return Tally.hit(), Tally.n, x
def v_del_class_attr_falls_back(x):
    class Base0:
        tag = "base"

    class Kid(Base0):
        tag = "kid"
    before = Kid.tag
    del Kid.tag
    return before, Kid.tag, x
def v_dunder_class_assign(x):
    class P1:
        def who(self):
            return 1

    class P2:
        def who(self):
            return 2
    o = P1()
    a = o.who()
    o.__class__ = P2
    return a, o.who(), type(o).__name__, x
def v_vars_write(x, m):
    vars(m)["count"] = 5
    m.__dict__.update(hist=["u"])
    return m.count, m.hist, x
def v_list_subclass_super(x):
    class Stack(list):
        def push(self, v):
            self.append(v)
            return self

        def __len__(self):
            return super().__len__() * 10
    st = Stack()
    st.push(1).push(2)
    return len(st), list(st), x

class Bare:
    pass


def v_dict_write_new_attr(x):
    o = Bare()
    o.__dict__["n"] = 1
    return getattr(o, "n", None), hasattr(o, "n"), x


def _module_object():
    import types
    mod = types.ModuleType("kiln_diff_fake")
    mod.value = 1
    return (X, mod)


TABLE = [
    (u_vec_ops, (X,)), (u_vec_radd, (X,)), (u_vec_eq_bool, (X,)), (u_vec_if, (X,)), (u_vec_iter_tensor, (X,)),
    (u_vec_neg_setitem, (X,)), (u_vec_arg_mutate, (X, Vec(1, 2))), (u_callable, (X,)),
    (u_callable_arg, (X, Scaler(4))), (u_callable_map, (X,)), (u_property, (X,)),
    (u_property_setter, (X,)), (u_classmethod, (X,)), (u_staticmethod, (X,)), (u_inheritance, (X,)),
    (u_super_chain, (X,)), (u_class_attr, (X,)), (u_mro, (X,)), (u_issubclass, (X,)),
    (u_getattr_dunder, (X,)), (u_getattr_dunder_missing, (X,)), (u_getattr_dunder_default, (X,)),
    (u_slots, (X,)), (u_slots_error, (X,)), (u_class_in_function, (X,)), (u_local_class_returned, (X,)),
    (u_instance_mutation_arg, (X, Mutable())), (u_setattr_new_attr, (X, Mutable())),
    (u_delattr, (X, Mutable())), (u_classvar_mutation, (X,)), (u_dunder_methods_direct, (X,)),
    (u_type_call, (X,)), (u_dataclass, (X,)), (u_dataclass_fields, (X,)), (u_dataclass_replace, (X,)),
    (u_dataclass_asdict, (X,)), (u_dataclass_astuple, (X,)), (u_dataclass_eq, (X,)),
    (u_dataclass_frozen, (X,)), (u_dataclass_tensor, (X,)), (u_dataclass_arg_mutate, (X, Config())),
    (u_namedtuple, (X,)), (u_namedtuple_replace, (X,)), (u_namedtuple_asdict, (X,)),
    (u_namedtuple_unpack, (X,)), (u_namedtuple_fields, (X,)), (u_typed_namedtuple, (X,)),
    (u_partial, (X,)), (u_partial_kwargs, (X,)), (u_partial_user_fn, (X,)), (u_partial_nested, (X,)),
    (u_reduce, (X,)), (u_reduce_tensors, (X,)), (u_reduce_empty_error, (X,)), (u_wraps, (X,)),
    (u_lru_cache, (X,)), (u_cached_property, (X,)), (u_total_ordering, (X,)),
    (u_unsupported_operand, (X,)),
    (v_iterator_protocol, (X,)), (v_iterator_partly_arg, (X, Countdown(4))), (v_iadd_returns_self, (X,)),
    (v_setattr_override, (X,)), (v_descriptor, (X,)), (v_descriptor_raises, (X,)), (v_index_protocol, (X,)),
    (v_len_for_bool, (X,)), (v_len_negative, (X,)), (v_init_subclass, (X,)), (v_dunder_new, (X,)),
    (v_diamond_super, (X,)), (v_property_attributeerror_fallback, (X,)), (v_repr_str_format, (X,)),
    (v_hash_eq_dict_key, (X,)), (v_sorted_user_lt, (X,)), (v_dataclass_order, (X,)),
    (v_dataclass_post_init, (X,)), (v_dataclass_instance_fields, (X,)), (v_bound_method_stored, (X,)),
    (v_method_from_class, (X,)), (v_abstract_instantiation, (X,)), (v_operator_helpers, (X,)),
    (v_cmp_to_key, (X,)), (v_singledispatch, (X,)), (v_bool_returns_non_bool, (X,)),
    (v_class_attr_shadow_instance, (X,)), (v_instance_dict_mutation, (X, Mutable())),
    (v_super_in_classmethod, (X,)), (v_namedtuple_defaults_compare, (X,)),
    (v_user_callable_tensor_module, (X,)), (v_setattr_on_class, (X,)), (v_setattr_on_global_class, (X,)),
    (v_module_object_attr, _module_object), (v_class_counter_classmethod, (X,)),
    (v_del_class_attr_falls_back, (X,)), (v_dunder_class_assign, (X,)), (v_vars_write, (X, Mutable())),
    (v_list_subclass_super, (X,)), (v_dict_write_new_attr, (X,)),
]

KNOWN: dict[str, str] = {
}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_classes(fn, args, options):
    run_program(fn, args, **options)
