"""Engines built in this process with NVIDIA's own ONNX parser and builder (TensorRT for RTX, or TensorRT),
for engines at export on any machine and for `et-trt check --build`. Nothing here needs a C++ build."""
