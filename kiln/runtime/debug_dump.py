"""KILN_DEBUG_DIR: every compiled graph's artifacts (the IR after each pass as runnable Python, the generated
kernels and wrapper) in a directory of their own, `<graph>_<digest>/`, and an `index.txt` beside them naming
each directory's frame and source location, in compile order.

`KILN_DEBUG_DIR=1` (or true/yes/on) means the default directory, `./kiln_debug`. The first dump of a process
says where the dumps go, once, on stderr."""
from __future__ import annotations

import hashlib
import os

from .. import config

DEFAULT_DIRECTORY = "kiln_debug"
INDEX = "index.txt"
_log = config.channel("kernels")
_announced: set[str] = set()  # directories this process has said it dumps into


def dump_directory(value: str) -> str:
    """The directory a KILN_DEBUG_DIR value names: 1/true/yes/on are the default, ./kiln_debug."""
    if str(value).strip().lower() in ("1", "true", "yes", "on"):
        return os.path.abspath(DEFAULT_DIRECTORY)
    return os.path.abspath(value)


def dump_graph(value: str, graph_name: str, origin: str, files: dict[str, str]) -> str:
    """Write `files` into `<graph_name>_<digest>/` under the debug directory and list it in the index with
    `origin` (the frame's readable name and file:line); returns the graph's dump directory."""
    directory = dump_directory(value)
    digest = hashlib.sha256("".join(files.values()).encode()).hexdigest()[:10]
    path = os.path.join(directory, f"{graph_name}_{digest}")
    os.makedirs(path, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    index = os.path.join(directory, INDEX)
    line = f"{os.path.basename(path)}  {origin or graph_name}\n"
    listed = open(index).read() if os.path.exists(index) else ""
    if line not in listed:
        with open(index, "a") as f:
            if not listed:
                f.write("# each compiled graph's dump directory, then the frame it was captured from "
                        "(compile order)\n")
            f.write(line)
    if directory not in _announced:
        _announced.add(directory)
        default = " (KILN_DEBUG_DIR=1: the default directory)" if directory == os.path.abspath(
            DEFAULT_DIRECTORY) and str(value).strip().lower() != DEFAULT_DIRECTORY else ""
        _log.warning("KILN_DEBUG_DIR: dumping each compiled graph's passes and code into %s%s; %s lists them",
                     directory, default, index)
    return path
