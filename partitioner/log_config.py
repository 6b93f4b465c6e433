"""Logging for the command line: et-trt's own lines, other libraries' only on request.

An export imports torch, ExecuTorch, torchao, onnxscript and onnx_ir, which log
INFO lines by the dozen (initializer deduplication, constant folding), warn
about optional CUDA extensions a CPU machine lacks, and raise Future- and
DeprecationWarnings about their own internals. None of that is actionable for
someone exporting a policy, so by default only their errors are shown; `-v`
shows everything.
"""

from __future__ import annotations

import logging

# The packages whose loggers are ours.
OWN_LOGGERS = ("et_trt_backend", "et_trt_partitioner")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(verbose: bool = False, quiet: bool = False) -> None:
    """Our loggers at INFO (DEBUG with `verbose`, WARNING with `quiet`); other libraries'
    records, Python warnings included, at ERROR and above unless `verbose`."""
    others = logging.DEBUG if verbose else logging.ERROR
    logging.basicConfig(level=others, format=FORMAT, force=True)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
    # Warnings become records of the "py.warnings" logger, filtered like the rest.
    logging.captureWarnings(True)


def configure_torch(verbose: bool = False) -> None:
    """torch's loggers like the other libraries' (ERROR, everything with `verbose`). They carry their own
    handlers and levels, set when torch is imported: so this imports torch, for the commands that need it."""
    import torch._logging

    torch._logging.set_logs(all=logging.DEBUG if verbose else logging.ERROR)
