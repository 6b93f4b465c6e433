"""The README's op coverage table against Torch-TensorRT is what scripts/op_coverage.py computes from the
current op support rules and the committed list of Torch-TensorRT's converters, so neither side can rot."""

from __future__ import annotations

import importlib.util
import pathlib
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_current():
    coverage = _script("op_coverage")
    current = coverage.readme_table((ROOT / "README.md").read_text())
    assert current is not None, "README.md lost its op coverage section"
    assert current == coverage.table(), "stale: run .venv/bin/python scripts/op_coverage.py --write"


def test_converter_list_names_its_commit_and_holds_aten_overloads():
    lines = (ROOT / "scripts" / "torch_tensorrt_converters.txt").read_text().splitlines()
    header, targets = lines[0], lines[1:]
    assert header.startswith("# pytorch/TensorRT ") and len(header.split()[2]) == 40
    assert header.endswith(f": {len(targets)} registrations")
    assert targets == sorted(set(targets)) and all(t.startswith("aten.") for t in targets)


def test_converter_registrations_are_read_from_the_decorators():
    source = textwrap.dedent('''
        @dynamo_tensorrt_converter(torch.ops.aten.convolution.default, supports_dynamic_shapes=True)
        @dynamo_tensorrt_converter(torch.ops.aten.batch_norm)
        @enforce_tensor_types({0: (TRTTensor,)})
        def conv(ctx, target, args, kwargs, name): ...

        @dynamo_tensorrt_converter(operator.mod)
        @dynamo_tensorrt_converter(torch.ops.prims.div.default)
        def other(ctx, target, args, kwargs, name): ...
    ''')
    targets = _script("torch_tensorrt_converters").converter_targets(source)
    assert targets == ["aten.batch_norm", "aten.convolution.default"]
