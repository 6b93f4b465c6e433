# The runtime's table of build options, generated from et_trt_backend/options.py (the one declaration of each
# option: name, type, range or choices, default) by build_options_header.py into
# ${ET_TRT_GENERATED_DIR}/build_options_generated.h, which et_trt_schema's users get with the schema's header.
# Included after blob_schema.cmake.
include_guard(GLOBAL)

find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(_et_trt_options "${CMAKE_CURRENT_LIST_DIR}/../../et_trt_backend/options.py")
add_custom_command(
  OUTPUT "${ET_TRT_GENERATED_DIR}/build_options_generated.h"
  COMMAND "${Python3_EXECUTABLE}" "${CMAKE_CURRENT_LIST_DIR}/build_options_header.py" "${_et_trt_options}"
    "${ET_TRT_GENERATED_DIR}/build_options_generated.h"
  DEPENDS "${_et_trt_options}" "${CMAKE_CURRENT_LIST_DIR}/build_options_header.py"
  COMMENT "generating build_options_generated.h from et_trt_backend/options.py")
add_custom_target(et_trt_build_options_header DEPENDS "${ET_TRT_GENERATED_DIR}/build_options_generated.h")
add_dependencies(et_trt_schema et_trt_build_options_header)
