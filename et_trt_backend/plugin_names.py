"""The names through which TensorRT finds our GroupedMM plugin (contract 4): the one definition.

TensorRT's ONNX parser turns a node of op type GROUPED_MM_OP into the plugin
registered under that name, the node's plugin_version and its
plugin_namespace (PLUGIN_ATTRIBUTES). The lowering writes such nodes in
domain GROUPED_MM_DOMAIN, the Python build phase registers its creator under
these names, and the pre-flight check verifies both. The C++ plugin declares
the same names (kGroupedMMName, kGroupedMMVersion, kGroupedMMNamespace in
runtime/src/tensorrt/grouped_mm_plugin.h).
"""

GROUPED_MM_DOMAIN = "et_trt"
GROUPED_MM_OP = "GroupedMM"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "et_trt"

# The node attributes that name the plugin, with the values they must have.
PLUGIN_ATTRIBUTES = {"plugin_version": PLUGIN_VERSION, "plugin_namespace": PLUGIN_NAMESPACE}
