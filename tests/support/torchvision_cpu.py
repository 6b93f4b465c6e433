"""Lets PyPI's torchvision import beside CPU torch, for every test module.

PyPI's torchvision 0.28 is built for CUDA torch: its _C.so needs libtorch_cuda.so, so under CPU torch it
does not load and torchvision goes on without its compiled ops (nms, roi_align, ...). Its import still
registers fake kernels for torchvision::nms and ::qnms, which fails ("operator torchvision::nms does not
exist") unless those operators exist. transformers imports torchvision wherever it is installed (image
processors, model modules), and LeRobot's ACT and Diffusion Policy use its pure-Python ResNet, so the
test environment (pyproject's [test] extra) has it. Declaring the two schemas (no kernel) lets it import;
calling them would fail, and no test does. Where torchvision's compiled ops load, nothing is declared.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

_SCHEMAS: list[torch.library.Library] = []  # a Library's definitions last as long as the object


def allow_import() -> None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or "torchvision" in sys.modules or _SCHEMAS:
        return
    compiled = next(Path(spec.origin).parent.glob("_C*.so"), None)
    if compiled is not None:
        try:
            torch.ops.load_library(str(compiled))
            return
        except OSError:
            pass
    library = torch.library.Library("torchvision", "FRAGMENT")
    for name in ("nms", "qnms"):
        library.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _SCHEMAS.append(library)
