"""The full symbolic interpreter: the instruction core (`frame.py`) with calls and value operations."""
from __future__ import annotations

from .blocks import BlockOps
from .calls import CallOps
from .frame import Frame
from .operators import OperatorOps
from .values import ValueOps


class Interpreter(CallOps, ValueOps, OperatorOps, BlockOps, Frame):
    """A frame of the symbolic interpreter with every instruction handler."""
