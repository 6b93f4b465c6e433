# ExecuTorch's data file (.ptd) schema on the C++ side, for et_trt::verify_data_file:
# flatc's flat_tensor_generated.h (and scalar_type_generated.h, which it includes),
# made at build time from the flat_tensor.fbs the executorch wheel ships
# (extension/flat_tensor/serialize/), as blob_schema.cmake makes the blob schema's.
# ExecuTorch's own reader is generated from the same file, but its header is not
# in the wheel. Defines target et_trt_flat_tensor_schema (header only). Needs
# find_package(executorch) first; -DET_TRT_FLAT_TENSOR_FBS=... names the file.
include_guard(GLOBAL)

include(${CMAKE_CURRENT_LIST_DIR}/blob_schema.cmake)  # flatc, the flatbuffers headers

set(_et_trt_executorch_root "")
if(EXECUTORCH_INCLUDE_DIRS)
  list(GET EXECUTORCH_INCLUDE_DIRS 0 _et_trt_executorch_include)
  get_filename_component(_et_trt_executorch_root "${_et_trt_executorch_include}" DIRECTORY)
endif()
find_file(ET_TRT_FLAT_TENSOR_FBS flat_tensor.fbs
  PATHS "${_et_trt_executorch_root}/extension/flat_tensor/serialize" NO_DEFAULT_PATH)
if(NOT ET_TRT_FLAT_TENSOR_FBS)
  message(FATAL_ERROR "ExecuTorch's flat_tensor.fbs was not found under ${_et_trt_executorch_root}/extension/"
    "flat_tensor/serialize (the executorch wheel ships it): pass -DET_TRT_FLAT_TENSOR_FBS=<path of flat_tensor.fbs>")
endif()
get_filename_component(_et_trt_flat_tensor_dir "${ET_TRT_FLAT_TENSOR_FBS}" DIRECTORY)

set(_et_trt_flat_tensor_headers
  "${ET_TRT_GENERATED_DIR}/flat_tensor_generated.h" "${ET_TRT_GENERATED_DIR}/scalar_type_generated.h")
add_custom_command(
  OUTPUT ${_et_trt_flat_tensor_headers}
  COMMAND "${ET_TRT_FLATC}" --cpp --scoped-enums -I "${_et_trt_flat_tensor_dir}" -o "${ET_TRT_GENERATED_DIR}"
    "${ET_TRT_FLAT_TENSOR_FBS}" "${_et_trt_flat_tensor_dir}/scalar_type.fbs"
  DEPENDS "${ET_TRT_FLAT_TENSOR_FBS}" "${_et_trt_flat_tensor_dir}/scalar_type.fbs"
  COMMENT "flatc: generating ExecuTorch's flat_tensor_generated.h (the .ptd schema)")
add_custom_target(et_trt_flat_tensor_schema_header DEPENDS ${_et_trt_flat_tensor_headers})
add_library(et_trt_flat_tensor_schema INTERFACE)
add_dependencies(et_trt_flat_tensor_schema et_trt_flat_tensor_schema_header)
target_link_libraries(et_trt_flat_tensor_schema INTERFACE et_trt_schema)  # the flatbuffers headers, the generated dir
