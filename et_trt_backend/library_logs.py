"""Other libraries' log lines and warnings while et-trt's lowering runs them: held back unless asked for.

torch.onnx's exporter and the onnxscript / onnx_ir passes it runs log INFO lines by the dozen per
partition (constant folding skipped, unused nodes removed), torch.onnx warns about torchvision ops it
cannot register, and torch raises FutureWarnings about its own internals. None of it is actionable for
someone exporting a policy, from the command line or from Python. So while `held_back()` is active these
loggers show only their errors and those warnings are ignored, unless et-trt's own logger shows DEBUG
(`et-trt -v`, or `logging.getLogger("et_trt_backend").setLevel(logging.DEBUG)`); a logger the user has
given a level keeps it. The root logger is never touched, and every level is restored on exit.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# Logger -> the level it gets while held back.
HELD_BACK = {"onnxscript": logging.WARNING, "onnx_ir": logging.WARNING, "torch.onnx": logging.ERROR}


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    if logging.getLogger("et_trt_backend").isEnabledFor(logging.DEBUG):
        yield
        return
    changed = [logging.getLogger(name) for name in HELD_BACK if logging.getLogger(name).level == logging.NOTSET]
    for log in changed:
        log.setLevel(HELD_BACK[log.name])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for log in changed:
            log.setLevel(logging.NOTSET)
