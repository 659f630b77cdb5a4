"""Graph breaks: where capture could not follow the program, and why."""
from __future__ import annotations

import linecache
from typing import Any


class GraphBreakError(RuntimeError):
    """Raised instead of running eagerly when the user asked for one graph (`fullgraph=True`) or for
    errors (`options={"raise_on_error": True}`). The message names the user's file and line."""


class GraphBreak(Exception):
    """Internal: the interpreter cannot continue at this instruction."""

    def __init__(self, reason: str, hint: str = "", cause: BaseException | None = None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint
        self.cause = cause
        self.where: list[tuple[str, int]] = []  # (filename, line), innermost frame first
        self.top_index: int | None = None  # instruction index in the captured (top) frame
        self.in_callee = False  # raised inside a function the top frame was inlining
        self.resumable = True  # False: running the instruction natively would not behave as eager

    @property
    def filename(self) -> str:
        return self.where[0][0] if self.where else "?"

    @property
    def lineno(self) -> int:
        return self.where[0][1] if self.where else 0

    def location(self) -> str:
        return f"{self.filename}:{self.lineno}"

    def source_line(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip() if self.where else ""

    def describe(self) -> str:
        text = f"{self.location()}: {self.reason}"
        line = self.source_line()
        if line:
            text += f"\n    {line}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


class RaisedError(GraphBreak):
    """Internal: the program raised `exc` (a real exception, the one eager raises at this point). The
    interpreter unwinds to the innermost handler of the frame's exception table, as CPython does; a raise
    no frame handles is a graph break that is not resumed (the code runs eagerly and raises there)."""

    def __init__(self, exc: BaseException, reason: str, hint: str = ""):
        super().__init__(reason, hint, exc)
        self.exc = exc
        self.resumable = False


class BreakRecord:
    """One graph break as `kiln.explain` reports it."""

    def __init__(self, brk: GraphBreak, resumed: bool):
        self.reason = brk.reason
        self.hint = brk.hint
        self.filename = brk.filename
        self.lineno = brk.lineno
        self.source_line = brk.source_line()
        self.stack = list(brk.where)
        self.resumed = resumed
        # the frame that runs natively because of this break (its callees are still captured)
        self.native_frame: str | None = None

    @property
    def location(self) -> str:
        return f"{self.filename}:{self.lineno}"

    def __repr__(self) -> str:
        return f"BreakRecord({self.location}: {self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "location": self.location, "source": self.source_line,
                "hint": self.hint}


class CaptureErrorRecord:
    """An internal error of kiln that stopped the capture of a frame, which then runs eagerly (its callees
    run natively too), as `kiln.explain` reports it: the frame, the exception, and the user's line the
    interpreter was at when it failed (where known)."""

    def __init__(self, frame: str, error: str, where: tuple[str, int] | None = None):
        self.frame = frame
        self.error = error
        self.filename, self.lineno = where or ("?", 0)
        self.source_line = linecache.getline(self.filename, self.lineno).strip() if where else ""

    @property
    def location(self) -> str:
        return f"{self.filename}:{self.lineno}"

    def __repr__(self) -> str:
        return f"CaptureErrorRecord({self.frame}: {self.error} at {self.location})"

    def as_dict(self) -> dict[str, Any]:
        return {"frame": self.frame, "error": self.error, "location": self.location,
                "source": self.source_line}


HINTS = {
    "data": "the branch needs a tensor's value; use torch.where / masking, or move the check outside "
            "the compiled function",
    "item": ".item()/.tolist() read a tensor's value; keep it a tensor, or compute it outside",
    "print": "print() is a side effect; remove it from the compiled code or log outside",
    "call": "kiln cannot see inside this function; use a torch op, or call it outside the compiled code",
    "disabled": "the function is marked to run uncompiled; remove the disable decorator to capture it",
    "raise": "the code raises an exception; it runs eagerly so the exception is the same",
}
