"""Lowering models through TensorRTPartitioner and checking a partition's ONNX against the partition's
edge program, both run in float32."""

from __future__ import annotations

import numpy as np
import onnx
import sympy
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner

from et_trt_backend.backend import EtTrtBackend  # noqa: F401  (registers the backend by name)
from et_trt_backend.options import CompileOptions
from et_trt_backend.serialization import blob, external_data
from et_trt_partitioner import TensorRTPartitioner
from support import onnx_reference


def lower(model, tokens: int, dynamic: bool, options: CompileOptions):
    """(edge program, blob contents) of every partition of `model` lowered through preprocess."""
    x = torch.randn(tokens, 32, dtype=torch.bfloat16)
    shapes = ({0: torch.export.Dim("tokens", min=1, max=4096)},) if dynamic else None
    recipe = {"default": {k: v for k, v in options.to_json().items() if k != "shape_ranges"}}
    return lower_program(torch.export.export(model, (x,), dynamic_shapes=shapes), TensorRTPartitioner(recipe))


def lower_program(ep: torch.export.ExportedProgram, partitioner: Partitioner):
    """(edge program, blob contents) of every partition of `ep` lowered through preprocess."""
    return delegated_parts(to_edge_transform_and_lower(ep, partitioner=[partitioner]))


def delegated_parts(edge):
    """(edge program, blob contents) of every delegate in a lowered edge manager, its named data attached
    from what preprocess handed ExecuTorch."""
    gm = edge.exported_program().graph_module
    parts = []
    for name, module in gm.named_children():
        if name.startswith("lowered_module"):
            contents = blob.deserialize(module.processed_bytes)
            external_data.attach(contents, external_data.store_lookup(module.named_data_store_output),
                                 "the lowered module's named data")
            parts.append((module.original_module, contents))
    return parts


class Float32Twin(torch.fx.Interpreter):
    """Runs a graph in float32: bf16/fp16 tensors entering an op are upcast, casts to them become
    float32. Ops on constants only (weights, lifted constants) run as written, the way the ONNX
    exporter folds them into initializers before the ONNX twin is upcast."""

    LOW = (torch.bfloat16, torch.float16)

    def __init__(self, gm, constant_nodes):
        super().__init__(gm)
        self.constant_nodes = constant_nodes

    def run_node(self, node):
        if node.op != "call_function" or node in self.constant_nodes:
            return super().run_node(node)
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        upcast = lambda v: torch.float32 if v in self.LOW else (  # noqa: E731
            v.float() if isinstance(v, torch.Tensor) and v.dtype in self.LOW else v)
        args, kwargs = torch.utils._pytree.tree_map(upcast, (args, kwargs))
        return node.target(*args, **kwargs)


def tensor_user_inputs(program: torch.export.ExportedProgram) -> list[str]:
    """The partition's tensor arguments, in order: what the blob's inputs list."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [name for name in program.graph_signature.user_inputs
            if isinstance(placeholders[name].meta["val"], torch.Tensor)]


def run_partition_float32(program: torch.export.ExportedProgram, inputs: list[torch.Tensor],
                          twin=Float32Twin) -> list[torch.Tensor]:
    """The partition's edge program, run as a float32 twin (`twin`, see Float32Twin), on its tensor arguments."""
    sig = program.graph_signature
    named = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    constants = {**program.state_dict, **program.constants}
    constant_nodes = set()
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in named:
            constant_nodes.add(node)
        elif node.op == "call_function" and node.all_input_nodes and set(node.all_input_nodes) <= constant_nodes:
            constant_nodes.add(node)
    user = dict(zip(tensor_user_inputs(program), inputs))
    args = [constants[named[spec.arg.name]] if spec.arg.name in named else user.get(spec.arg.name)
            for spec in sig.input_specs]
    # Integer inputs (sizes ExecuTorch passes to several delegates): the size of a tensor input.
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for i, spec in enumerate(sig.input_specs):
        size = placeholders[spec.arg.name].meta["val"]
        if isinstance(size, torch.SymInt):
            args[i] = next(user[name].shape[axis] for name in user
                           for axis, dim in enumerate(placeholders[name].meta["val"].shape)
                           if isinstance(dim, torch.SymInt) and dim.node.expr == size.node.expr)
    with torch.no_grad():
        outputs = twin(program.graph_module, constant_nodes).run(*args)
    return [out.float() for out in outputs]


def concrete_shape(spec: blob.TensorSpec, tokens: int | dict[str, int]) -> list[int]:
    """The input's shape at `tokens` (the token count, or dynamic dimension name -> size)."""
    sizes = tokens if isinstance(tokens, dict) else {"tokens": tokens}
    return [d.size if d.size is not None else int(sympy.sympify(d.name).subs(sizes)) for d in spec.dims]


def run_reference_evaluator(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnx's reference evaluator, GroupedMM included (onnx_reference.py)."""
    return onnx_reference.evaluator(model).run(None, feeds)


def random_float_input(spec: blob.TensorSpec, shape: list[int]) -> torch.Tensor:
    return torch.randn(shape)


def assert_onnx_matches_partition(program, contents: blob.BlobContents, tokens: int | dict[str, int],
                                  run_onnx=run_reference_evaluator, random_input=random_float_input,
                                  rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """The float32 twin of the partition's ONNX, run by `run_onnx` on fresh `random_input`s, matches
    the partition's edge program run in float32."""
    assert [spec.name for spec in contents.inputs] == tensor_user_inputs(program)
    model = onnx_reference.to_float32(external_data.onnx_with_weights(contents.onnx, contents.weights))
    inputs = [random_input(spec, concrete_shape(spec, tokens)) for spec in contents.inputs]
    expected = run_partition_float32(program, inputs)
    got = run_onnx(model, {s.name: t.numpy() for s, t in zip(contents.inputs, inputs)})
    assert len(got) == len(expected)
    for out, ref in zip(got, expected):
        assert out.shape == tuple(ref.shape)
        np.testing.assert_allclose(out, ref.numpy(), rtol=rtol, atol=atol)
