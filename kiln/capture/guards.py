"""Guards: the facts a captured graph relies on, checked before each reuse.

Each guard is a Python expression over sources (`x.shape == (4, 8)`, `self.fc.weight is __Parameter_3`).
A cache entry compiles all of them into one function (see `entry.py`); on a miss, `first_failure` names the
guard that failed, for the recompile log and the recompile-limit warning.
"""
from __future__ import annotations

import ast
import operator
from typing import Any

import torch

from .. import config
from ..ops.autocast import describe, saved as autocast_saved, state as autocast_state
from .sources import Namespace, Source
from ..graph import torch_internals

log = config.channel("guards")

PRIMITIVES = (type(None), bool, int, float, str, bytes, complex, type(Ellipsis), type(NotImplemented),
              torch.dtype, torch.device, torch.memory_format, torch.layout)


def is_constant(value: Any) -> bool:
    """Immutable Python values guarded by equality (and nested tuples/frozensets of them)."""
    if isinstance(value, PRIMITIVES) and type(value) in PRIMITIVES:
        return True
    if type(value) in (tuple, frozenset, torch.Size):
        return all(is_constant(v) for v in value)
    if type(value) in (slice, range):
        return is_constant(value.start) and is_constant(value.stop) and is_constant(value.step)
    return False


def storages_apart(inputs: tuple, updated: tuple) -> bool:
    """Whether each input at a position in `updated` shares its storage with no other input (what a graph
    that writes those inputs in place relies on). One guard for all of them, each storage read once: the
    pairwise checks were |updated| x |inputs| (7 training BatchNorms in a small ResNet: ~1400 a call)."""
    ptrs = [t.untyped_storage().data_ptr() for t in inputs]
    if len(set(ptrs)) == len(ptrs):
        return True
    return all(ptrs.count(ptrs[i]) == 1 for i in updated)


class Guard:
    __slots__ = ("expr", "text", "kind")

    def __init__(self, expr: str, text: str, kind: str):
        self.expr = expr
        self.text = text
        self.kind = kind

    def __repr__(self) -> str:
        return f"Guard({self.text})"


class GuardSet:
    """The guards of one capture, in the order their values were read (parents before children)."""

    def __init__(self, ns: Namespace):
        self.ns = ns
        self.guards: list[Guard] = []
        self._seen: set[str] = set()
        self._identity: dict[str, Any] = {}  # source expr -> the object an identity guard holds it to
        # the bulk guards made so far (quiet_module, _module_tensor, _module_constant), by name
        self._bulk_texts: dict[str, BulkText] = {}

    def add(self, expr: str, text: str, kind: str) -> None:
        if expr in self._seen:
            return
        self._seen.add(expr)
        self.guards.append(Guard(expr, text, kind))

    def __len__(self) -> int:
        return len(self.guards)

    # ---- by value kind ----
    def constant(self, source: Source, value: Any) -> None:
        if self._module_constant(source, value):
            return
        if value is None:
            self.add(f"{source.expr} is None", f"{source.name} is None", "constant")
            return
        if type(value) is bool:
            self.add(f"{source.expr} is {value}", f"{source.name} is {value}", "constant")
            return
        lit = self.ns.literal(value)
        typ = self.ns.hold(type(value), "type")
        self.add(f"type({source.expr}) is {typ} and {source.expr} == {lit}",
                 f"{source.name} == {value!r}", "constant")

    def identity(self, source: Source, value: Any) -> None:
        self._identity.setdefault(source.expr, value)
        self.add(f"{source.expr} is {self.ns.hold(value, type(value).__name__)}",
                 f"{source.name} is <{type(value).__name__} at {id(value):#x}>", "identity")

    def type_of(self, source: Source, value: Any) -> None:
        self.add(f"type({source.expr}) is {self.ns.hold(type(value), 'type')}",
                 f"type({source.name}) is {type(value).__qualname__}", "type")

    def length(self, source: Source, value: Any) -> None:
        self.type_of(source, value)
        self.add(f"len({source.expr}) == {len(value)}", f"len({source.name}) == {len(value)}", "length")

    def keys(self, source: Source, value: dict) -> None:
        self.type_of(source, value)
        keys = tuple(value)
        self.add(f"tuple({source.expr}) == {self.ns.literal(keys)}", f"keys of {source.name} == {keys!r}",
                 "keys")

    def tensor(self, source: Source, t: torch.Tensor) -> None:
        """Type, dtype, device, shape, strides and requires_grad of an input tensor."""
        e = source.expr
        typ = self.ns.hold(type(t), "type")
        dtype = self.ns.hold(t.dtype, "dtype")
        device = self.ns.hold(t.device, "device")
        shape = tuple(t.shape)
        strides = tuple(t.stride())
        # (the shape first after the type: a changed size is the likeliest miss, read before the rest)
        self.add(f"type({e}) is {typ} and {e}.shape == {shape!r} and {e}.dtype is {dtype} and "
                 f"{e}.stride() == {strides!r} and {e}.requires_grad is {t.requires_grad} and "
                 f"{e}.device == {device}",
                 f"{source.name}: {type(t).__name__} {str(t.dtype).removeprefix('torch.')}{list(shape)} "
                 f"strides={strides} device={t.device} requires_grad={t.requires_grad}", "tensor")

    def parameter(self, source: Source, t: torch.Tensor) -> None:
        """Parameters and buffers: the same object (its values may change), same requires_grad."""
        if self._module_tensor(source, t):
            return
        self.identity(source, t)
        self.add(f"{source.expr}.requires_grad is {t.requires_grad}",
                 f"{source.name}.requires_grad is {t.requires_grad}", "tensor")

    def grad_mode(self, enabled: bool) -> None:
        fn = self.ns.hold(torch.is_grad_enabled, "is_grad_enabled")
        self.add(f"{fn}() is {enabled}", f"torch.is_grad_enabled() is {enabled}", "grad_mode")

    def forward_ad(self, active: bool) -> None:
        fn = self.ns.hold(torch_internals.forward_ad_active, "forward_ad_active")
        self.add(f"{fn}() is {active}", f"forward-mode AD is {'on' if active else 'off'}", "forward_ad")

    def autocast(self, state: tuple) -> None:
        """torch.autocast's state (per device: on, and its dtype): it changes what ops compute."""
        if not state:
            fn = self.ns.hold(torch_internals.any_autocast_enabled, "is_any_autocast_enabled")
            self.add(f"not {fn}()", "torch.autocast is off", "autocast")
            return
        fn = self.ns.hold(autocast_state, "autocast_state")
        self.add(f"{fn}() == {self.ns.literal(state)}", f"torch.autocast state is {describe(state)}", "autocast")

    def autocast_full(self, saved: tuple) -> None:
        """All of autocast's state (kiln.ops.autocast.saved), for code that reads it."""
        fn = self.ns.hold(autocast_saved, "autocast_saved")
        self.add(f"{fn}() == {self.ns.literal(saved)}", f"torch.autocast's whole state is {saved}", "autocast")

    def default_dtype(self, dtype: torch.dtype) -> None:
        """Factories without a dtype (torch.ones(2), torch.tensor([1.5])) bake the default dtype in."""
        fn = self.ns.hold(torch.get_default_dtype, "get_default_dtype")
        self.add(f"{fn}() is {self.ns.hold(dtype, 'dtype')}", f"torch.get_default_dtype() is {dtype}",
                 "default_dtype")

    def describe(self) -> list[str]:
        self.settle()
        return [g.text for g in self.guards]

    def settle(self) -> None:
        """A bulk guard over fewer than BULK_MIN facts becomes the facts' own guards again, where it stood:
        its fixed cost (a call, the list walks) is more than a few inline checks (a 3-layer MLP's capture
        overhead went 4.2 -> 6.3 us a call with them bulk)."""
        for i in range(len(self.guards) - 1, -1, -1):
            text = self.guards[i].text
            if isinstance(text, BulkText) and len(text.lists[0]) < BULK_MIN:
                self.guards[i:i + 1] = [Guard(expr, line, self.guards[i].kind) for expr, line in text.singles]
                self._seen.update(expr for expr, _ in text.singles)

    # ---- guards of many modules, checked in bulk ----
    # A model reads the same few facts of every one of its modules: no hooks and its class's forward
    # (quiet_module), each parameter and buffer the same object with the same requires_grad (module_tensor),
    # a few plain attributes (a convolution's stride, a BatchNorm's eps and training flag: module_constant).
    # One guard per fact was 2700 guards for the zoo's DenseNet, 0.6 ms a call. For a module whose source is
    # guarded by identity (so the module held here is the one the call reads), those facts are kept in lists
    # and one guard each checks all of them with C loops (`map` over `operator` getters), the same reads and
    # comparisons as the guards they replace. On a miss, `first_failure` names the module and the fact.

    def _module_at(self, source: Source | None) -> torch.nn.Module | None:
        module = None if source is None else self._identity.get(source.expr)
        return module if isinstance(module, torch.nn.Module) else None

    def _bulk(self, name: str, check: Any, text: str, columns: int, singles: list, row: tuple) -> None:
        """Add a fact (`row`, one value per column) to bulk guard `name`, made with its guard on first use;
        `singles` are the (expr, text) guards the fact would have had on its own."""
        bulk = self._bulk_texts.get(name)
        if bulk is None:
            bulk = self._bulk_texts[name] = BulkText(text, check, [[] for _ in range(columns)])
            self.add(f"{self.ns.hold(check, check.__name__)}({self.ns.hold(bulk.lists, name)})", bulk, "bulk")
        bulk.singles.extend(singles)
        for column, value in zip(bulk.lists, row):
            column.append(value)

    def quiet_module(self, source: Source, module: torch.nn.Module) -> bool:
        """Guard in bulk that `module` (which has no hooks now and runs its class's forward) gets no hook and
        no instance `forward`: as `not m._forward_hooks and ...` and `'forward' not in m.__dict__` would.
        False where its source is not guarded by identity: the caller then guards it one by one."""
        if self._module_at(source) is not module:
            return False
        quiet = self._bulk_texts.get("quiet")
        if quiet is not None and any(m is module for m in quiet.lists[0]):
            return True
        singles = [(" and ".join(f"not {source.expr}.{name}" for name in _MODULE_HOOKS),
                    f"{source.name} has no hooks"),
                   (f"'forward' not in {source.expr}.__dict__", f"{source.name}.forward is its class's")]
        self._bulk("quiet", modules_quiet, "the modules called have no hooks and run their class's forward", 2,
                   singles, (module, source.name))
        return True

    def _module_tensor(self, source: Source, t: torch.Tensor) -> bool:
        """`m._parameters[key]` / `m._buffers[key]` of a module guarded by identity: in bulk."""
        base = source.base
        if source.kind != "item" or base is None or base.kind != "attr" or \
                not base.expr.endswith(("._parameters", "._buffers")):
            return False
        module = self._module_at(base.base)
        if module is None:
            return False
        key = source.expr[len(base.expr) + 1:-1]
        try:
            key = ast.literal_eval(key)
        except (ValueError, SyntaxError):
            return False
        container = base.expr.rsplit(".", 1)[1]
        if getattr(module, container).get(key) is not t:
            return False
        held = self.ns.hold(t, type(t).__name__)
        singles = [(f"{source.expr} is {held}", f"{source.name} is <{type(t).__name__} at {id(t):#x}>"),
                   (f"{source.expr}.requires_grad is {t.requires_grad}",
                    f"{source.name}.requires_grad is {t.requires_grad}")]
        self._bulk("tensors", module_tensors_held, "the modules' parameters and buffers are the captured ones, "
                   "with the same requires_grad", 6, singles, (module, container, key, t, t.requires_grad,
                                                                source.name))
        return True

    def _module_constant(self, source: Source, value: Any) -> bool:
        """A plain attribute (`m.stride`) of a module guarded by identity, of a primitive type: in bulk."""
        if source.kind != "attr" or not _dotted_attr(source.expr) or type(value) not in _BULK_CONSTANTS:
            return False
        module = self._module_at(source.base)
        if module is None:
            return False
        lit = self.ns.literal(value)
        singles = [(f"type({source.expr}) is {self.ns.hold(type(value), 'type')} and {source.expr} == {lit}",
                    f"{source.name} == {value!r}")]
        self._bulk("constants", module_constants_held, "the modules' attributes read are unchanged", 5, singles,
                   (module, source.expr.rsplit(".", 1)[1], type(value), value, source.name))
        return True


class BulkText(str):
    """A bulk guard's description; `failure()` names the first module and fact that no longer holds."""

    def __new__(cls, text: str, check: Any, lists: list) -> "BulkText":
        obj = super().__new__(cls, text)
        obj.check, obj.lists = check, lists
        obj.singles = []  # (expr, text) of each fact's own guard, in order (GuardSet.settle)
        return obj

    def items(self) -> list[str]:
        """One line per fact checked, as the guards it replaces read (kiln.explain lists them)."""
        return [line for _, line in self.singles]

    def failure(self) -> str:
        for i in range(len(self.lists[0])):
            row = [column[i:i + 1] for column in self.lists]
            try:
                held = self.check(row)
            except Exception as e:  # noqa: BLE001 - (a missing key: the fact does not hold)
                return f"{self.lists[-1][i]}: {type(e).__name__} {e}"
            if not held:
                return f"{self} ({self.lists[-1][i]} changed)"
        return str(self)


_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_BULK_CONSTANTS = (bool, int, float, str, tuple, type(None))
# a bulk guard over fewer facts than this is written as their own guards (GuardSet.settle)
BULK_MIN = 32


def _dotted_attr(expr: str) -> bool:
    name = expr.rsplit(".", 1)[-1]
    return "." in expr and name.isidentifier()


def module_tensors_held(lists: list) -> bool:
    """Each module's parameter or buffer at its key (`m._parameters[key]`) is the held tensor, with the held
    requires_grad."""
    modules, containers, keys, tensors, flags, _ = lists
    return all(map(operator.is_, map(operator.getitem, map(getattr, modules, containers), keys), tensors)) and \
        list(map(_REQUIRES_GRAD, tensors)) == flags


def module_constants_held(lists: list) -> bool:
    """Each module's attribute (`getattr(m, name)`) has the held type and equals the held value, as the guard
    `type(m.name) is T and m.name == c` it replaces."""
    modules, names, types, values, _ = lists
    current = list(map(getattr, modules, names))
    return list(map(type, current)) == types and current == values


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = tuple(name for name in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                        "_global_backward_hooks", "_global_backward_pre_hooks")
                      if hasattr(torch.nn.modules.module, name))


_HOOKS_OF = operator.attrgetter(*_MODULE_HOOKS)
_DICT_OF = operator.attrgetter("__dict__")
_HAS_FORWARD = operator.methodcaller("__contains__", "forward")


def modules_quiet(lists: list) -> bool:
    """No module has a hook of its own or an instance attribute `forward` (GuardSet.quiet_module)."""
    modules = lists[0]
    return not any(map(any, map(_HOOKS_OF, modules))) and not any(map(_HAS_FORWARD, map(_DICT_OF, modules)))


def hooks_present(module: torch.nn.Module, guards: GuardSet | None = None,
                  source: Source | None = None) -> bool:
    """Whether calling `module` runs hooks: its own (forward, forward pre, backward, backward pre) or the
    global ones (`torch.nn.modules.module.register_module_forward_hook` and the like). A module with hooks
    runs natively, its hooks as torch runs them; one without is traced, and with `guards` that is guarded: a
    hook registered later, globally or on the module at `source`, makes the capture miss."""
    registry = torch.nn.modules.module
    if any(getattr(module, name, None) for name in _MODULE_HOOKS) or \
            any(getattr(registry, name) for name in _GLOBAL_HOOKS):
        return True
    if guards is not None:
        held = guards.ns.hold(registry, "nn_module")
        guards.add(" and ".join(f"not {held}.{name}" for name in _GLOBAL_HOOKS), "no global module hooks",
                   "hooks")
        if source is not None:
            guards.add(" and ".join(f"not {source.expr}.{name}" for name in _MODULE_HOOKS
                                    if hasattr(module, name)), f"{source.name} has no hooks", "hooks")
    return False


def check_expr(guards: list[Guard], reserved: "set[str] | frozenset[str]" = frozenset()) -> str:
    """All guards as one expression, for the entry function's `if not (...)`.

    The same source is read by many guards (`self._modules['blocks']._modules['0']` by every guard of
    that block and its children): each attribute/item chain read by more than one guard is read once, at its
    first read, into a local (`(__kg3 := self._modules['blocks'])`), and later guards use the local. Only
    reads that run whenever their guard runs are named (not one behind an `or`, an `if`, or the second
    comparison of a chain), and a guard uses only names that earlier guards bound: the guards are one `and`
    chain, so a later guard runs only after every earlier one ran to the end and held. Each source is then
    read once per call (not once per guard that mentions it); the checks themselves are unchanged, in the
    same order. Names in `reserved` (the entry's parameters and other names) are never used for locals."""
    if not guards:
        return "True"
    return _SharedReads(reserved).expression([g.expr for g in guards])


class _SharedReads:
    """Rewrites an `and` chain of guard expressions so that each repeated source chain is read once.

    Works on the guards' text: each chain read is replaced, at its position in the text, by a local or by a
    read that binds one (the text elsewhere is kept as it is)."""

    def __init__(self, reserved: "set[str] | frozenset[str]"):
        self.reserved = reserved
        self.count = 0

    def expression(self, exprs: list[str]) -> str:
        conjuncts: list[tuple[bytes, ast.expr | None]] = []
        for expr in exprs:
            if "\n" in expr:  # (positions are per line: a guard on several lines is kept whole)
                conjuncts.append((expr.encode(), None))
                continue
            text = expr.encode()  # (ast positions count UTF-8 bytes)
            conjuncts.extend((text, c) for c in _conjuncts(ast.parse(expr, mode="eval").body))
        reads: list[list[tuple[list[ast.expr], list, bool]]] = []  # per conjunct: (nodes, keys, runs)
        first: dict[Any, int] = {}
        shared: set[Any] = set()
        for i, (_, node) in enumerate(conjuncts):
            chains: list[tuple[list[ast.expr], bool]] = []
            if node is not None:
                _reads(node, True, chains)
            reads.append([(nodes, _prefix_keys(nodes), runs) for nodes, runs in chains])
            for _, keys, _ in reads[-1]:
                for key in keys[1:]:
                    if first.setdefault(key, i) != i:
                        shared.add(key)
        names: dict[Any, str] = {}  # chain -> the local an earlier conjunct bound
        parts = []
        for (text, node), chains in zip(conjuncts, reads):
            if node is None:
                parts.append(f"({text.decode()})")
                continue
            pending: dict[Any, str] = {}
            edits = []
            for nodes, keys, runs in chains:
                edit = self._chain(text, nodes, keys, runs, shared, names, pending)
                if edit is not None:
                    edits.append(edit)
            out, pos = [], node.col_offset
            for start, end, new in sorted(edits):
                out += [text[pos:start].decode(), new]
                pos = end
            out.append(text[pos:node.end_col_offset].decode())
            parts.append(f"({''.join(out)})")
            names.update(pending)  # (usable once this conjunct has run to its end)
        return " and ".join(parts)

    def _chain(self, text: bytes, nodes: list[ast.expr], keys: list, runs: bool, shared: set,
               names: dict[Any, str], pending: dict[Any, str]) -> tuple[int, int, str] | None:
        """(start, end, new text) for one chain read (`keys`: its prefixes' keys), or None to keep it."""
        k = len(keys) - 1  # the longest prefix an earlier conjunct named (0: none, the bare name)
        while k >= 1 and keys[k] not in names:
            k -= 1
        out = names[keys[k]] if k >= 1 else text[nodes[0].col_offset:nodes[0].end_col_offset].decode()
        texts = [text[nodes[j - 1].end_col_offset:nodes[j].end_col_offset].decode()
                 for j in range(k + 1, len(keys))]
        if not all(t.lstrip().startswith((".", "[")) for t in texts):
            return None  # (a parenthesized part: kept as it is, before anything is bound)
        changed = k >= 1
        for j, step in enumerate(texts, k + 1):
            out += step
            key = keys[j]
            if runs and key in shared and key not in names and key not in pending:
                pending[key] = self._local()
                out = f"({pending[key]} := {out})"
                changed = True
        if not changed:
            return None
        return nodes[-1].col_offset, nodes[-1].end_col_offset, out

    def _local(self) -> str:
        while True:
            name = f"__kg{self.count}"
            self.count += 1
            if name not in self.reserved:
                return name


# expressions with names of their own (a comprehension's variable may shadow the entry's), or whose parts'
# positions are not their text's (f-strings): never rewritten inside
_SCOPES = (ast.Lambda, ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp, ast.JoinedStr)


def _reads(node: ast.AST, runs: bool, out: list) -> None:
    """Append (chain's nodes from its name, whether it runs whenever its conjunct does) for each chain read
    in `node`, outside nested scopes."""
    nodes = _chain_nodes(node)
    if nodes is not None:
        out.append((nodes, runs))
        return
    if isinstance(node, _SCOPES):
        return
    fields = _UNCONDITIONAL.get(type(node), _NONE) if runs else _NONE
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, ast.expr):
            _reads(value, fields.get(field) is True, out)
        elif isinstance(value, list):
            always = fields.get(field, ())
            for i, v in enumerate(value):
                if isinstance(v, (ast.expr, ast.keyword)):
                    _reads(v, always is True or i in always, out)


def _conjuncts(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [c for v in node.values for c in _conjuncts(v)]
    return [node]


def _chain_nodes(node: ast.AST) -> list[ast.expr] | None:
    """For an attribute/item read of a name (`a.b['c'].d`: no calls, items by constant or name), its nodes
    from the name outwards; None for anything else."""
    nodes = []
    while type(node) is ast.Attribute or type(node) is ast.Subscript:
        if type(node) is ast.Subscript and type(node.slice) is not ast.Constant and \
                type(node.slice) is not ast.Name:
            return None
        nodes.append(node)
        node = node.value
    if type(node) is not ast.Name or not nodes:
        return None
    nodes.append(node)
    nodes.reverse()
    return nodes


def _prefix_keys(nodes: list[ast.expr]) -> list:
    """The key of each prefix of a chain (`a`, `a.b`, `a.b['c']`), each the one before and its step: `.attr`,
    or an item (a constant by value and type: d[1] and d[True] are one key of a dict, not of every
    container; a held name by name)."""
    key: Any = nodes[0].id  # type: ignore[attr-defined]
    keys = [key]
    for node in nodes[1:]:
        if type(node) is ast.Attribute:
            key = (key, "." + node.attr)
        else:
            item = node.slice  # type: ignore[attr-defined]
            if type(item) is ast.Constant:
                key = (key, item.value, type(item.value))
            else:
                key = (key, "name", item.id)
        keys.append(key)
    return keys


# the fields of a node that Python evaluates whenever it evaluates the node (True: every element; a tuple: the
# elements at those indices); anything else (`or`, `if`, a chained comparison's later operands, call keywords,
# lambdas and comprehensions) is taken to maybe not run
_UNCONDITIONAL: dict[type, dict[str, Any]] = {
    ast.Attribute: {"value": True}, ast.Starred: {"value": True},
    ast.Subscript: {"value": True, "slice": True},
    ast.Call: {"func": True, "args": True}, ast.Compare: {"left": True, "comparators": (0,)},
    ast.UnaryOp: {"operand": True}, ast.BinOp: {"left": True, "right": True}, ast.BoolOp: {"values": (0,)},
    ast.IfExp: {"test": True}, ast.Tuple: {"elts": True}, ast.List: {"elts": True}, ast.Set: {"elts": True},
}
_NONE: dict[str, Any] = {}


def listed(texts: list[str]) -> list[str]:
    """Guard texts with each bulk guard's facts one per line (BulkText.items), for people."""
    return [line for text in texts for line in (text.items() if isinstance(text, BulkText) else [text])]
