"""Pre-flight check: does an ONNX model stay within TensorRT's ONNX-parser limits?

Runs without TensorRT, at export (preprocess calls `enforce` with the
partition's `preflight` option) and on a finished .pte (`et-trt check`).
Each violation names the ONNX node and the PyTorch source line it came from.
The facts are in tensorrt_onnx.py (and, shared with the op support rules and
the lowering, et_trt_backend/tensorrt_limits.py); the rules, one per module, in
rules/.
"""

from __future__ import annotations

import logging

import onnx

from et_trt_backend.options import PREFLIGHT_POLICIES
from et_trt_backend.preflight.io_specs import check_io
from et_trt_backend.preflight.model_view import SOURCE_KEY, TORCH_STACK_TRACE_KEY, ModelView, source_of
from et_trt_backend.preflight.rules import RULES
from et_trt_backend.preflight.violation import Violation

logger = logging.getLogger(__name__)

__all__ = [
    "PreflightError", "SOURCE_KEY", "TORCH_STACK_TRACE_KEY", "Violation", "check", "check_io", "enforce", "source_of",
]


class PreflightError(ValueError):
    """The model breaks TensorRT limits; the message lists every violation."""

    def __init__(self, violations: list[Violation], where: str = ""):
        self.violations = violations
        head = f"{where}: " if where else ""
        lines = "\n".join(f"  {v}" for v in violations)
        super().__init__(
            f"{head}{len(violations)} TensorRT pre-flight violation(s):\n{lines}\n"
            "Fix the model as suggested, or set preflight = \"warn\" in the recipe to export anyway "
            "(the engine build on the robot will then fail)."
        )


def check(model: onnx.ModelProto) -> list[Violation]:
    """Every violation of TensorRT's ONNX-parser limits in `model`, in rule order."""
    view = ModelView(model)
    return [violation for rule in RULES.values() for violation in rule(view)]


def enforce(model: onnx.ModelProto, policy: str, where: str = "") -> list[Violation]:
    """Check `model`; raise PreflightError ("error") or log warnings ("warn").

    `policy` is CompileOptions.preflight; `where` (e.g. the part name) prefixes messages.
    """
    if policy not in PREFLIGHT_POLICIES:
        raise ValueError(f"preflight policy must be one of {', '.join(PREFLIGHT_POLICIES)}, got {policy!r}")
    violations = check(model)
    if violations and policy == "error":
        raise PreflightError(violations, where)
    for violation in violations:
        logger.warning("%sTensorRT pre-flight: %s", f"{where}: " if where else "", violation)
    if not violations:
        logger.info("%sTensorRT pre-flight: no violations", f"{where}: " if where else "")
    return violations
