"""The full symbolic interpreter: the instruction core (`frame.py`) with calls and value operations."""
from __future__ import annotations

from .calls import CallOps
from .frame import Frame
from .values import ValueOps


class Interpreter(CallOps, ValueOps, Frame):
    """A frame of the symbolic interpreter with every instruction handler."""
