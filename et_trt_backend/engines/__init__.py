"""Engines built with NVIDIA's own ONNX parser and builder (TensorRT, or TensorRT for RTX) by et-trt's C++
engine builder (libet_trt_plugin.so), for engines at export and for `et-trt check --build`."""
