"""Where in the user's PyTorch code an op came from: the innermost frame of its recorded stack trace.

torch.export records a stack trace per fx node (`node.meta["stack_trace"]`) and torch.onnx's exporter
copies it into each ONNX node's metadata; errors, warnings and the export report name the user's line
through these functions, all in one form: "file:line (function): code".
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.fx import Node

# One frame of a Python traceback, and the code line under it where there is one.
_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)(?:\n[ \t]*(?P<code>(?![ \t]|File ")[^\n]*\S))?')

NO_SOURCE_LINE = "(no source line recorded)"


def innermost_frame(stack_trace: str) -> str:
    """The innermost frame of a Python stack trace (the user's line) as "file:line (function): code", or ""."""
    frames = list(_FRAME.finditer(stack_trace or ""))
    if not frames:
        return ""
    f = frames[-1]
    code = f["code"].strip() if f["code"] else ""
    return f"{f['file']}:{f['line']} ({f['func']})" + (f": {code}" if code else "")


def source_line(node: Node) -> str:
    """The user's source line that created the fx `node`, or NO_SOURCE_LINE where none was recorded."""
    return innermost_frame(node.meta.get("stack_trace") or "") or NO_SOURCE_LINE


def portable_source_line(node: Node) -> str:
    """source_line with the file's name only, for text stored in a blob: an export must not depend on where
    it ran (the same model and options give the same bytes)."""
    line = source_line(node)
    file, sep, rest = line.partition(":")
    return file.rsplit("/", 1)[-1] + sep + rest if sep else line
