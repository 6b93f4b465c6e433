"""The lowering translates exactly what op_support claims (contract 1)."""

from __future__ import annotations

import pytest

from et_trt_backend import op_support
from et_trt_backend.lowering import has_translation


@pytest.mark.parametrize("target", sorted(op_support.SUPPORTED_TARGETS, key=str), ids=str)
def test_every_supported_target_has_a_translation(target):
    assert has_translation(target), f"op_support claims {target} but the lowering has no translation for it"


@pytest.mark.parametrize("target", op_support.PRESERVED_OPS, ids=str)
def test_every_preserved_op_has_a_translation(target):
    assert has_translation(target)


def test_an_op_without_translation_is_reported():
    import torch

    assert not has_translation(torch.ops.aten.mode.default)
