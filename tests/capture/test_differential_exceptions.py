"""Differential programs: try/except/else/finally in compiled code, raise (caught, re-raised, chained with
`from`, escaping the compiled function), exceptions raised by builtins, nested try, and with-blocks
(contextlib.contextmanager, suppress, nullcontext, ExitStack, user context managers, torch.no_grad)."""
from __future__ import annotations

import contextlib

import pytest
import torch
from diff_helpers import params, run_program

X = torch.randn(3, 4)


class AppError(Exception):
    pass


class SubError(AppError):
    def __init__(self, code):
        super().__init__(f"code {code}")
        self.code = code


class Tracker:
    def __init__(self, log, swallow=False):
        self.log = log
        self.swallow = swallow

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, typ, val, tb):
        self.log.append("exit:" + (typ.__name__ if typ else "none"))
        return self.swallow


@contextlib.contextmanager
def tagged(log, tag):
    log.append("in:" + tag)
    try:
        yield tag * 2
    finally:
        log.append("out:" + tag)


@contextlib.contextmanager
def handling(log):
    try:
        yield
    except KeyError:
        log.append("handled")


class Obj:
    present = 1


def e_try_no_error(x):
    try:
        y = x * 2
    except ValueError:
        y = x
    return y
def e_raise_caught(x):
    try:
        raise ValueError("v")
    except ValueError:
        return x + 1
def e_raise_caught_message(x):
    try:
        raise KeyError("missing")
    except KeyError as e:
        return x, e.args
def e_else_branch(x):
    log = []
    try:
        y = x + 1
    except RuntimeError:
        log.append("except")
    else:
        log.append("else")
    return y, log
def e_finally_runs(x):
    log = []
    try:
        try:
            raise ValueError
        finally:
            log.append("finally")
    except ValueError:
        log.append("caught")
    return x, log
def e_finally_return_override(x):
    try:
        return x + 1
    finally:
        x = x * 0
def e_finally_on_return(x, log):
    try:
        return x * 2
    finally:
        log.append("done")
def e_except_tuple(x):
    out = []
    for exc in (KeyError, IndexError, TypeError):
        try:
            raise exc("m")
        except (KeyError, IndexError):
            out.append("ki")
        except TypeError:
            out.append("t")
    return out, x
def e_except_base_class(x):
    try:
        raise SubError(3)
    except AppError as e:
        return x * e.code, str(e)
def e_lookup_error(x):
    try:
        [][1]
    except LookupError:
        return x - 1
def e_raise_from(x):
    try:
        try:
            {}["k"]
        except KeyError as e:
            raise AppError("wrapped") from e
    except AppError as e:
        return x, type(e.__cause__).__name__, str(e)
def e_raise_from_none(x):
    try:
        try:
            raise KeyError("a")
        except KeyError:
            raise ValueError("b") from None
    except ValueError as e:
        return x, e.__cause__ is None, e.__suppress_context__
def e_context_chained(x):
    try:
        try:
            raise KeyError("a")
        except KeyError:
            raise ValueError("b")
    except ValueError as e:
        return x, type(e.__context__).__name__
def e_reraise(x):
    log = []
    try:
        try:
            raise IndexError("i")
        except IndexError:
            log.append("inner")
            raise
    except IndexError:
        log.append("outer")
    return x, log
def e_reraise_escapes(x):
    try:
        raise AppError("x")
    except AppError:
        raise
def e_escape_value_error(x):
    if x.shape[0] == 3:
        raise ValueError("three rows")
    return x
def e_escape_custom(x): raise SubError(7)
def e_escape_after_work(x, log):
    log.append(x.sum().item() * 0)
    y = x * 2
    raise AppError(y.shape)
def e_escape_from_nested_call(x):
    def inner(t):
        return t + {}["nope"]
    return inner(x)
def e_keyerror_dict(x):
    d = {"a": 1}
    try:
        return x * d["b"]
    except KeyError:
        return x * 5
def e_indexerror_list(x):
    try:
        return x * [1, 2][5]
    except IndexError:
        return x
def e_indexerror_tensor(x):
    try:
        return x[10]
    except IndexError:
        return x * 3
def e_attributeerror_getattr(x):
    try:
        return getattr(Obj(), "absent")
    except AttributeError:
        return x + getattr(Obj(), "present")
def e_attributeerror_tensor(x):
    try:
        return x.no_such_method()
    except AttributeError:
        return x * 2
def e_stopiteration_next(x):
    it = iter([])
    try:
        next(it)
    except StopIteration:
        return x * 4
def e_typeerror_caught(x):
    try:
        return len(5)
    except TypeError:
        return x
def e_valueerror_int(x):
    try:
        return int("abc")
    except ValueError:
        return x * 7
def e_zerodivision(x):
    try:
        return 1 / 0
    except ZeroDivisionError:
        return x - 2
def e_zerodivision_escapes(x): return x * (3 // 0)
def e_unbound_local(x):
    try:
        return x * unbound  # noqa: F821
    except NameError:
        return x
def e_tensor_shape_error_caught(x):
    try:
        return x @ x
    except RuntimeError:
        return x.t() @ x
def e_tensor_shape_error_escapes(x): return x.view(7, -1)
def e_nested_try(x):
    log = []
    try:
        try:
            raise KeyError
        except ValueError:
            log.append("wrong")
        finally:
            log.append("inner finally")
    except KeyError:
        log.append("outer")
    finally:
        log.append("outer finally")
    return x, log
def e_loop_continue_on_error(x):
    total = x
    for v in [1, 0, 2, 0]:
        try:
            total = total + 1 / v
        except ZeroDivisionError:
            continue
    return total
def e_loop_break_in_finally(x):
    n = 0
    for i in range(5):
        try:
            n += i
            if i == 2:
                break
        finally:
            n += 10
    return x * n
def e_exception_as_value(x):
    err = ValueError("kept")
    return x, err
def e_exception_var_cleared(x):
    try:
        raise ValueError
    except ValueError as e:
        pass
    return x, "e" in dir()
def e_isinstance_exception(x):
    try:
        raise SubError(1)
    except Exception as e:
        return x, isinstance(e, AppError), isinstance(e, KeyError)
def e_assert_caught(x):
    try:
        assert x.shape[0] == 5, "rows"
    except AssertionError as e:
        return x, str(e)
def e_with_user_cm(x):
    log = []
    with Tracker(log) as t:
        y = x * 2
    return y, log, t is not None
def e_with_user_cm_error(x):
    log = []
    try:
        with Tracker(log):
            raise KeyError
    except KeyError:
        log.append("caught")
    return x, log
def e_with_user_cm_swallow(x):
    log = []
    with Tracker(log, swallow=True):
        raise ValueError
    return x, log
def e_with_contextmanager(x):
    log = []
    with tagged(log, "a") as v:
        y = x * len(v)
    return y, log
def e_with_contextmanager_error(x):
    log = []
    try:
        with tagged(log, "b"):
            raise IndexError
    except IndexError:
        log.append("caught")
    return x, log
def e_with_contextmanager_handles(x):
    log = []
    with handling(log):
        {}["k"]
    return x, log
def e_with_nested_cms(x):
    log = []
    with tagged(log, "o"), tagged(log, "i"):
        log.append("body")
    return x, log
def e_suppress(x):
    with contextlib.suppress(KeyError):
        x = x + 1
        {}["nope"]
        x = x + 100
    return x
def e_suppress_not_matching(x):
    with contextlib.suppress(KeyError):
        raise ValueError("through")
def e_nullcontext(x):
    with contextlib.nullcontext(5) as v:
        return x * v
def e_exitstack(x):
    log = []
    with contextlib.ExitStack() as stack:
        for tag in "ab":
            stack.enter_context(tagged(log, tag))
        stack.callback(log.append, "cb")
        log.append("body")
    return x, log
def e_exitstack_error(x):
    log = []
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(Tracker(log))
            raise AppError
    except AppError:
        log.append("caught")
    return x, log
def e_no_grad_inside(x):
    with torch.no_grad():
        y = x * 2
    return y, torch.is_grad_enabled()
def e_no_grad_exception(x):
    try:
        with torch.no_grad():
            raise KeyError
    except KeyError:
        pass
    return x * 2, torch.is_grad_enabled()
def e_no_grad_requires_grad(w):
    with torch.no_grad():
        y = w * 3
    z = w * 2
    return y.requires_grad, z.requires_grad, z
def e_enable_grad_in_no_grad(w):
    with torch.no_grad():
        a = w + 1
        with torch.enable_grad():
            b = w + 1
    return a.requires_grad, b.requires_grad
def e_set_grad_enabled(w):
    with torch.set_grad_enabled(False):
        a = w * 2
    return a.requires_grad, a
def e_inference_mode(x):
    with torch.inference_mode():
        y = x + 1
    return y.clone()


# ---- harder: raise forms, exceptions in protocols, handlers that swallow, exception groups -------------
class BadItems:
    def __getitem__(self, k):
        raise LookupError(k)

    def __getattr__(self, name):
        raise AttributeError(f"no {name}")


@contextlib.contextmanager
def no_yield():
    if False:
        yield


@contextlib.contextmanager
def converting():
    try:
        yield
    except KeyError as e:
        raise ValueError("converted") from e


class ExitRaises:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        raise IndexError("from exit")


def x_raise_class(x):
    try:
        raise KeyError
    except KeyError as e:
        return x, type(e).__name__, e.args
def x_raise_non_exception(x): raise 5
def x_raise_from_non_exception(x): raise ValueError("a") from 3
def x_bare_reraise_no_active(x): raise
def x_return_in_finally_swallows(x):
    def inner():
        try:
            raise ValueError
        finally:
            return "swallowed"  # noqa: B012
    return inner(), x
def x_break_in_finally_swallows(x):
    n = 0
    for i in range(3):
        try:
            raise KeyError
        finally:
            n += 1
            break  # noqa: B012
    return x * n
def x_exception_in_except(x):
    try:
        try:
            raise KeyError
        except KeyError:
            [][0]
    except IndexError as e:
        return x, type(e.__context__).__name__
def x_exception_in_finally_replaces(x):
    try:
        try:
            raise KeyError
        finally:
            raise ValueError
    except ValueError as e:
        return x, type(e.__context__).__name__
    except KeyError:
        return x * 0
def x_getitem_raises_lookup(x):
    try:
        return BadItems()["k"]
    except LookupError as e:
        return x, e.args
def x_getattr_default_on_raising_getattr(x): return getattr(BadItems(), "zz", 4) * x
def x_hasattr_on_raising_getattr(x): return hasattr(BadItems(), "zz"), x
def x_contextmanager_no_yield(x):
    with no_yield():
        pass
    return x
def x_contextmanager_converts(x):
    try:
        with converting():
            {}["k"]
    except ValueError as e:
        return x, str(e), type(e.__cause__).__name__
def x_exit_raises(x):
    try:
        with ExitRaises():
            raise KeyError
    except IndexError as e:
        return x, type(e.__context__).__name__
def x_exit_raises_escapes(x):
    with ExitRaises():
        return x
def x_exc_info(x):
    import sys
    try:
        raise KeyError("k")
    except KeyError:
        t, v, _ = sys.exc_info()
        return x, t.__name__, v.args
def x_exception_group(x):
    try:
        raise ExceptionGroup("many", [ValueError(1), KeyError(2)])
    except* ValueError as eg:
        got = [type(e).__name__ for e in eg.exceptions]
    except* KeyError:
        got2 = True
    return x, got, got2
def x_exception_notes(x):
    try:
        e = ValueError("v")
        e.add_note("extra")
        raise e
    except ValueError as err:
        return x, err.__notes__
def x_exception_in_listcomp(x):
    try:
        return [1 // v for v in (1, 0)]
    except ZeroDivisionError:
        return x
def x_exception_in_lambda(x):
    f = lambda d: d["nope"]  # noqa: E731
    try:
        return f({})
    except KeyError:
        return x + 1
def x_exception_attrs(x):
    try:
        raise SubError(9)
    except SubError as e:
        return x * e.code, e.args, str(e), repr(e)
def x_exception_var_deleted(x):
    try:
        raise ValueError
    except ValueError as e:
        pass
    return e  # noqa: F821 - `e` is unbound after the handler
def x_nested_function_raises_through(x, log):
    def a():
        log.append("a")
        b()

    def b():
        log.append("b")
        raise AppError("deep")
    a()
    return x
def x_stopiteration_escapes(x): raise StopIteration("plain function")
def x_assert_escapes(x):
    assert x.shape[0] == 99
    return x
def x_keyboard_like_base_exception(x):
    try:
        raise SystemExit(3)
    except SystemExit as e:
        return x, e.code
def x_try_in_loop_else_continue(x):
    out = []
    for v in ["1", "a", "3"]:
        try:
            n = int(v)
        except ValueError:
            out.append("bad")
            continue
        else:
            out.append(n)
        finally:
            out.append("|")
    return out, x
def x_tensor_error_types(x):
    out = []
    for fn in (lambda: x.view(-1, 5), lambda: x[9], lambda: x.sum(dim=5), lambda: torch.cat([])):
        try:
            fn()
        except Exception as e:
            out.append(type(e).__name__)
    return out
def x_tensor_bool_ambiguous(x):
    if x:
        return x
    return -x
def x_dtype_error_escapes(x): return torch.zeros(2, dtype=torch.long).add_(x[0, :2])
def x_with_inside_except(x):
    log = []
    try:
        raise KeyError
    except KeyError:
        with tagged(log, "h"):
            log.append("in handler")
    return x, log
def x_generator_cm_exception_swallowed(x):
    @contextlib.contextmanager
    def swallow():
        try:
            yield
        except ValueError:
            pass
    with swallow():
        raise ValueError
    return x + 1


def _w():
    return (torch.randn(3, requires_grad=True),)


TABLE = [
    (e_try_no_error, (X,)), (e_raise_caught, (X,)), (e_raise_caught_message, (X,)), (e_else_branch, (X,)),
    (e_finally_runs, (X,)), (e_finally_return_override, (X,)), (e_finally_on_return, (X, [])),
    (e_except_tuple, (X,)), (e_except_base_class, (X,)), (e_lookup_error, (X,)), (e_raise_from, (X,)),
    (e_raise_from_none, (X,)), (e_context_chained, (X,)), (e_reraise, (X,)), (e_reraise_escapes, (X,)),
    (e_escape_value_error, (X,)), (e_escape_custom, (X,)), (e_escape_after_work, (X, [])),
    (e_escape_from_nested_call, (X,)), (e_keyerror_dict, (X,)), (e_indexerror_list, (X,)),
    (e_indexerror_tensor, (X,)), (e_attributeerror_getattr, (X,)), (e_attributeerror_tensor, (X,)),
    (e_stopiteration_next, (X,)), (e_typeerror_caught, (X,)), (e_valueerror_int, (X,)),
    (e_zerodivision, (X,)), (e_zerodivision_escapes, (X,)), (e_unbound_local, (X,)),
    (e_tensor_shape_error_caught, (X,)), (e_tensor_shape_error_escapes, (X,)), (e_nested_try, (X,)),
    (e_loop_continue_on_error, (X,)), (e_loop_break_in_finally, (X,)), (e_exception_as_value, (X,)),
    (e_exception_var_cleared, (X,)), (e_isinstance_exception, (X,)), (e_assert_caught, (X,)),
    (e_with_user_cm, (X,)), (e_with_user_cm_error, (X,)), (e_with_user_cm_swallow, (X,)),
    (e_with_contextmanager, (X,)), (e_with_contextmanager_error, (X,)),
    (e_with_contextmanager_handles, (X,)), (e_with_nested_cms, (X,)), (e_suppress, (X,)),
    (e_suppress_not_matching, (X,)), (e_nullcontext, (X,)), (e_exitstack, (X,)),
    (e_exitstack_error, (X,)), (e_no_grad_inside, (X,)), (e_no_grad_exception, (X,)),
    (e_no_grad_requires_grad, _w), (e_enable_grad_in_no_grad, _w), (e_set_grad_enabled, _w),
    (e_inference_mode, (X,)),
    (x_raise_class, (X,)), (x_raise_non_exception, (X,)), (x_raise_from_non_exception, (X,)),
    (x_bare_reraise_no_active, (X,)), (x_return_in_finally_swallows, (X,)),
    (x_break_in_finally_swallows, (X,)),
    (x_exception_in_except, (X,)), (x_exception_in_finally_replaces, (X,)), (x_getitem_raises_lookup, (X,)),
    (x_getattr_default_on_raising_getattr, (X,)), (x_hasattr_on_raising_getattr, (X,)),
    (x_contextmanager_no_yield, (X,)), (x_contextmanager_converts, (X,)), (x_exit_raises, (X,)),
    (x_exit_raises_escapes, (X,)), (x_exc_info, (X,)), (x_exception_group, (X,)), (x_exception_notes, (X,)),
    (x_exception_in_listcomp, (X,)), (x_exception_in_lambda, (X,)), (x_exception_attrs, (X,)),
    (x_exception_var_deleted, (X,)), (x_nested_function_raises_through, (X, [])),
    (x_stopiteration_escapes, (X,)), (x_assert_escapes, (X,)), (x_keyboard_like_base_exception, (X,)),
    (x_try_in_loop_else_continue, (X,)), (x_tensor_error_types, (X,)), (x_tensor_bool_ambiguous, (X,)),
    (x_dtype_error_escapes, (X,)), (x_with_inside_except, (X,)), (x_generator_cm_exception_swallowed, (X,)),
]

KNOWN: dict[str, str] = {
}


@pytest.mark.parametrize("fn,args,options", params(TABLE, KNOWN))
def test_exceptions(fn, args, options):
    run_program(fn, args, **options)
