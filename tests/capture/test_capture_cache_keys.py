"""Which compiled functions share captured entries: regression tests for wrong results found while the
backend pipeline took compile contexts."""
import torch

import kiln

SOURCE = "def f(x):\n    return x * K\n"
SOURCE_BREAK = "def f(x):\n    y = x + 1\n    print('', end='')\n    return y * K\n"


def _two_namespaces(source):
    first, second = {"K": 2}, {"K": 3}
    exec(source, first)
    exec(source, second)
    assert first["f"].__code__ == second["f"].__code__  # code objects compare by value
    return first["f"], second["f"]


def test_equal_code_in_two_namespaces_reads_its_own_globals():
    f1, f2 = _two_namespaces(SOURCE)
    x = torch.ones(3)
    torch.testing.assert_close(kiln.compile(f1, backend="eager")(x), f1(x))
    torch.testing.assert_close(kiln.compile(f2, backend="eager")(x), f2(x))


def test_equal_code_in_two_namespaces_resumes_with_its_own_globals():
    f1, f2 = _two_namespaces(SOURCE_BREAK)
    x = torch.ones(3)
    torch.testing.assert_close(kiln.compile(f1, backend="eager")(x), f1(x))
    torch.testing.assert_close(kiln.compile(f2, backend="eager")(x), f2(x))


def test_a_second_compile_with_another_backend_uses_it():
    calls = []

    def recording(graph, example_inputs):
        calls.append(graph.name)
        return kiln.backends.lookup_backend("eager")(graph, example_inputs)

    def g(x):
        return torch.relu(x) + 1
    x = torch.randn(4)
    kiln.compile(g, backend="eager")(x)
    torch.testing.assert_close(kiln.compile(g, backend=recording)(x), g(x))
    assert len(calls) == 1
