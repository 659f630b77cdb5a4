"""Operators in the symbolic interpreter: binary, comparison, unary, `in` and truth, on symbolic values.

Builtin values and tensor proxies run the operator directly (a proxy records a graph node). Objects of
user classes dispatch to their Python dunders the way CPython does (`__add__`, then the reflected
`__radd__`, a subclass's reflected method first, `__iadd__` before either for `+=`), each inlined like any
call; objects with no Python dunder for the operator compare by identity, which is then guarded.
"""
from __future__ import annotations

import dis
import operator
import types
from typing import Any

import torch

from ..graph import DataDependentError, Proxy, tracing
from ..ops import UnsupportedError
from .errors import HINTS, GraphBreak, RaisedError
from .iterators import SymIter
from .state import MISSING

_SYMBOL_NAMES = {"+": "add", "-": "sub", "*": "mul", "@": "matmul", "/": "truediv", "//": "floordiv",
                 "%": "mod", "**": "pow", "<<": "lshift", ">>": "rshift", "&": "and", "|": "or", "^": "xor"}
_NB_SYMBOLS = [sym for _, sym in dis._nb_ops]  # type: ignore[attr-defined]
_BINARY_FNS = {"+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift,
               "@": operator.matmul, "*": operator.mul, "%": operator.mod, "|": operator.or_,
               "**": operator.pow, ">>": operator.rshift, "-": operator.sub, "/": operator.truediv,
               "^": operator.xor}
_INPLACE_FNS = {"+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv, "<<=": operator.ilshift,
                "@=": operator.imatmul, "*=": operator.imul, "%=": operator.imod, "|=": operator.ior,
                "**=": operator.ipow, ">>=": operator.irshift, "-=": operator.isub, "/=": operator.itruediv,
                "^=": operator.ixor}
_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
            ">=": operator.ge}
_COMPARE_DUNDERS = {"<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"), ">": ("__gt__", "__lt__"),
                    ">=": ("__ge__", "__le__"), "==": ("__eq__", "__eq__"), "!=": ("__ne__", "__ne__")}
_UNARY = {"UNARY_NEGATIVE": (operator.neg, "__neg__"), "UNARY_POSITIVE": (operator.pos, "__pos__"),
          "UNARY_INVERT": (operator.invert, "__invert__")}

_DUNDERS_OF = {
    operator.eq: ("__eq__",), operator.ne: ("__ne__", "__eq__"), operator.contains: ("__eq__", "__hash__"),
    operator.lt: ("__lt__", "__gt__"), operator.le: ("__le__", "__ge__"), operator.gt: ("__gt__", "__lt__"),
    operator.ge: ("__ge__", "__le__"),
}
_ANY_DUNDER = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__len__",
               "__contains__", "__iter__", "__getitem__", "__setitem__", "__delitem__", "__index__",
               "__int__", "__float__", "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__",
               "__mul__", "__rmul__", "__imul__", "__matmul__", "__rmatmul__", "__truediv__",
               "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
               "__rpow__", "__or__", "__ror__", "__ior__", "__and__", "__rand__", "__iand__", "__xor__",
               "__rxor__", "__lshift__", "__rshift__", "__neg__", "__pos__", "__invert__", "__abs__")
_BUILTIN_PROTOCOL = "builtin protocol"  # plain_type's key for the dunders builtins call
_DUNDERS_OF[_BUILTIN_PROTOCOL] = _ANY_DUNDER + ("__str__", "__repr__", "__format__", "__round__",
                                                "__trunc__", "__floor__", "__ceil__", "__complex__",
                                                "__bytes__", "__reversed__", "__length_hint__")
_PLAIN_TYPES: dict[tuple[type, Any], bool] = {}


def plain_type(cls: type, op: Any = None) -> bool:
    """No Python-level dunder that operator `op` could call, anywhere in the class's MRO (the operator
    then acts on identity, or raises TypeError exactly as eager does)."""
    key = (cls, op)
    known = _PLAIN_TYPES.get(key)
    if known is None:
        names = _DUNDERS_OF.get(op, _ANY_DUNDER)
        # nn.Module's own __repr__/__getattr__ read nothing a builtin could get wrong
        skip = (torch.nn.Module,) if op == _BUILTIN_PROTOCOL else ()
        known = not any(isinstance(klass.__dict__.get(name), types.FunctionType)
                        for klass in cls.__mro__ if klass not in skip for name in names)
        _PLAIN_TYPES[key] = known
    return known


def _python_dunder(value: Any, name: str) -> Any:
    """The Python function implementing dunder `name` for value's class; None for a C slot or none."""
    for klass in type(value).__mro__:
        if name in klass.__dict__:
            found = klass.__dict__[name]
            return found if isinstance(found, types.FunctionType) else None
    return None


def _has_slot(value: Any, name: str) -> bool:
    return any(name in klass.__dict__ for klass in type(value).__mro__)


class OperatorOps:
    """Frame mixin: operator instructions."""

    def calls_python_dunders(self, value: Any) -> bool:
        """Builtins (str, int, hash, sorted, ...) applied to this value would run its Python methods."""
        from .frame import NATIVE_OPERAND_TYPES
        return not isinstance(value, (Proxy, SymIter) + NATIVE_OPERAND_TYPES) and \
            not isinstance(value, torch.Tensor) and not plain_type(type(value), _BUILTIN_PROTOCOL)

    def is_user_object(self, value: Any) -> bool:
        """An operand whose class has Python dunders (a user class made or read in compiled code)."""
        from .frame import NATIVE_OPERAND_TYPES
        return not isinstance(value, (Proxy, SymIter) + NATIVE_OPERAND_TYPES) and \
            not isinstance(value, torch.Tensor) and not plain_type(type(value))

    def native_op(self, fn: Any, *args: Any) -> Any:
        from .frame import NATIVE_OPERAND_TYPES, has_proxy, symbolic_break
        cap = self.cap
        for a in args:
            if cap.is_local(a) and self.calls_python_dunders(a):
                raise GraphBreak(f"operator {fn.__name__} on a {type(a).__name__} would run its Python "
                                 "methods outside the trace", HINTS["call"])
            if not isinstance(a, NATIVE_OPERAND_TYPES) and not cap.is_local(a) and id(a) not in cap.mirrors:
                if isinstance(a, torch.Tensor):  # a Parameter or tensor reached from an object without source
                    raise GraphBreak(f"operator {fn.__name__} on a {type(a).__name__} kiln does not track "
                                     "(its value would be baked in unguarded)", HINTS["call"])
                if isinstance(a, SymIter) or not plain_type(type(a), fn):
                    raise GraphBreak(f"operator {fn.__name__} on a {type(a).__name__} (user-defined "
                                     "operators are not followed)", HINTS["call"])
                # no Python dunder: the operator compares it by identity, so its identity is guarded
                src = cap.source_of(a)
                if src is not None:
                    cap.guards.identity(src, a)
                elif not isinstance(a, torch.nn.Module):
                    raise GraphBreak(f"operator {fn.__name__} on a {type(a).__name__} kiln cannot guard",
                                     HINTS["call"])
        try:
            with tracing(cap.tracer):  # graph nodes it records carry the user's line
                result = fn(*args)
            if type(result) in (list, dict, set) and not any(result is a for a in args):
                cap.new_local(result)
            return result
        except (GraphBreak, DataDependentError, UnsupportedError):
            raise
        except Exception as e:
            raise symbolic_break(e, f"operator {fn.__name__}", not has_proxy(args)) from None

    def native_items(self, items: list, dict_keys: bool = False) -> list:
        """Set elements or dict keys: hashed natively, so no tensor and no Python __hash__/__eq__."""
        from .frame import NATIVE_OPERAND_TYPES
        for item in items:
            if isinstance(item, Proxy):
                raise GraphBreak("a tensor used as a set element or dict key")
            if not isinstance(item, NATIVE_OPERAND_TYPES) and not plain_type(type(item), operator.contains):
                raise GraphBreak(f"a {type(item).__name__} used as a set element or dict key (its __hash__ "
                                 "and __eq__ would run outside the trace)", HINTS["call"])
            try:
                hash(item)
            except TypeError:  # eager's own error, by the operation eager runs (3.14 words them apart)
                try:
                    if dict_keys:
                        {}[item] = None
                    else:
                        set().add(item)
                except TypeError as e:
                    raise RaisedError(e, "an unhashable set element or dict key") from None
                raise
        return items

    # ---- dunder dispatch for user objects ----
    def _try_dunder(self, obj: Any, name: str, other: Any) -> Any:
        """obj.<name>(other): inlined when it is Python, run natively for a C slot, NotImplemented if none."""
        method = _python_dunder(obj, name)
        if method is not None:
            return self.call(method, [obj, other], {})
        if _has_slot(obj, name) and not self.is_user_object(obj) and not isinstance(obj, Proxy):
            if type(obj) in (int, float, complex, bool):
                return getattr(obj, name)(other)  # a number's slot: NotImplemented for a user object
            if self.calls_python_dunders(other):
                raise GraphBreak(f"operator {name} of a {type(obj).__name__} with a {type(other).__name__} "
                                 "(it could run the latter's methods outside the trace)", HINTS["call"])
            return self.native_op(lambda a, b: getattr(a, name)(b), obj, other)
        if isinstance(obj, Proxy) and _has_slot(obj, name):
            return self.native(getattr(obj, name), [other], {}, f"Tensor.{name}")
        return NotImplemented

    def user_binary(self, sym: str, left: Any, right: Any) -> Any:
        if sym.endswith("=") and sym[:-1] in _SYMBOL_NAMES:
            base = _SYMBOL_NAMES[sym[:-1]]
            if _python_dunder(left, f"__i{base}__") is not None:
                result = self.call(_python_dunder(left, f"__i{base}__"), [left, right], {})
                if result is not NotImplemented:
                    return result
            sym = sym[:-1]
        base = _SYMBOL_NAMES[sym]
        forward, reflected = f"__{base}__", f"__r{base}__"
        right_first = type(right) is not type(left) and issubclass(type(right), type(left)) and \
            _python_dunder(right, reflected) is not None
        if right_first:
            result = self._try_dunder(right, reflected, left)
            if result is not NotImplemented:
                return result
        result = self._try_dunder(left, forward, right)
        if result is NotImplemented and not right_first and type(right) is not type(left):
            result = self._try_dunder(right, reflected, left)
        if result is NotImplemented:
            raise RaisedError(TypeError(f"unsupported operand type(s) for {sym}: '{type(left).__name__}' "
                                        f"and '{type(right).__name__}'"), f"operator {sym}")
        return result

    def user_compare(self, sym: str, left: Any, right: Any) -> Any:
        forward, reflected = _COMPARE_DUNDERS[sym]
        right_first = type(right) is not type(left) and issubclass(type(right), type(left)) and \
            _python_dunder(right, reflected) is not None
        order = [(right, reflected, left), (left, forward, right)] if right_first else \
            [(left, forward, right), (right, reflected, left)]
        for obj, name, other in order:
            if sym == "!=" and _python_dunder(obj, "__ne__") is None and \
                    _python_dunder(obj, "__eq__") is not None:
                result = self.call(_python_dunder(obj, "__eq__"), [obj, other], {})
                if result is not NotImplemented:
                    return not self.truth(result)
                continue
            result = self._try_dunder(obj, name, other)
            if result is not NotImplemented:
                return result
        if sym == "==":
            return left is right
        if sym == "!=":
            return left is not right
        raise RaisedError(TypeError(f"'{sym}' not supported between instances of '{type(left).__name__}' "
                                    f"and '{type(right).__name__}'"), f"operator {sym}")

    # ---- instructions ----
    def op_BINARY_OP(self, inst: dis.Instruction) -> None:
        right = self.pop()
        left = self.pop()
        sym = _NB_SYMBOLS[inst.arg]
        if self.is_user_object(left) or self.is_user_object(right):
            self.push(self.user_binary(sym, left, right))
            return
        fn = _INPLACE_FNS[sym] if sym.endswith("=") else _BINARY_FNS[sym]
        self.push(self.native_op(fn, left, right))

    def op_COMPARE_OP(self, inst: dis.Instruction) -> None:
        right = self.pop()
        left = self.pop()
        if self.is_user_object(left) or self.is_user_object(right):
            self.push(self.user_compare(inst.argval, left, right))
            return
        self.push(self.native_op(_COMPARE[inst.argval], left, right))

    def op_IS_OP(self, inst: dis.Instruction) -> None:
        right = self.pop()
        left = self.pop()
        self.push((left is not right) if inst.arg else (left is right))

    def op_CONTAINS_OP(self, inst: dis.Instruction) -> None:
        container = self.pop()
        item = self.pop()
        from .frame import NATIVE_OPERAND_TYPES
        if isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)):
            found = any(self.truth(m is item or self.native_op(operator.eq, m, item))
                        for m in self.iterate(container))
        elif isinstance(container, torch.nn.ModuleDict):
            found = item in {k for k in self.iterate(container)}
        elif isinstance(container, torch.nn.Module):
            raise GraphBreak("`in` on a module")
        else:
            method = None
            if not isinstance(container, NATIVE_OPERAND_TYPES):
                method = _python_dunder(container, "__contains__")
            if method is not None:
                found = self.truth(self.call(method, [container, item], {}))
            elif isinstance(container, SymIter) or (self.is_user_object(container) and
                                                    _python_dunder(container, "__iter__") is not None):
                found = any(item is v or self.truth(self.user_compare("==", v, item)
                                                    if self.is_user_object(v) or self.is_user_object(item)
                                                    else self.native_op(operator.eq, v, item))
                            for v in self.iterate(container))
            elif type(container) in (list, tuple) and (self.is_user_object(item) or
                                                       any(self.is_user_object(v) for v in container)):
                # list.__contains__: identity, then element == item, each a traced call
                found = any(v is item or self.truth(self.user_compare("==", v, item))
                            for v in container)
            elif isinstance(container, (set, frozenset, dict)) and self.is_user_object(item):
                raise GraphBreak(f"`in` on a {type(container).__name__} with a {type(item).__name__} "
                                 "(its __hash__ and __eq__ would run outside the trace)", HINTS["call"])
            else:
                found = self.native_op(operator.contains, container, item)
        self.push((not found) if inst.arg else found)

    def _unary(self, inst: dis.Instruction) -> None:
        fn, dunder = _UNARY[inst.opname]
        value = self.pop()
        method = _python_dunder(value, dunder) if self.is_user_object(value) else None
        if method is not None:
            self.push(self.call(method, [value], {}))
            return
        self.push(self.native_op(fn, value))

    op_UNARY_NEGATIVE = op_UNARY_POSITIVE = op_UNARY_INVERT = _unary

    def op_UNARY_NOT(self, inst: dis.Instruction) -> None:
        self.push(not self.truth(self.pop()))

    def truth(self, value: Any) -> bool:
        from .frame import NATIVE_OPERAND_TYPES
        from .values import class_lookup
        if isinstance(value, Proxy):
            raise GraphBreak(f"data-dependent branch on tensor {value.node.name} ({value.meta.short()})",
                             HINTS["data"])
        if isinstance(value, NATIVE_OPERAND_TYPES) or self.cap.is_local(value) and type(value) is object:
            return bool(value)
        if isinstance(value, SymIter):
            return True
        # Python's rule: the class's __bool__, else its __len__ (through len(), which also traces module
        # containers), else True; both looked up on the class, never on the instance
        cls = type(value)
        method = class_lookup(cls, "__bool__")
        if method is MISSING:
            return True if class_lookup(cls, "__len__") is MISSING else bool(self.call(len, [value], {}))
        if method is None:
            raise RaisedError(TypeError("'NoneType' object is not callable"), "bool()")
        result = self.call(method, [value], {})
        if isinstance(result, Proxy):
            return self.truth(result)
        if type(result) is not bool:
            raise RaisedError(TypeError(f"__bool__ should return bool, returned {type(result).__name__}"),
                              "bool()")
        return result

