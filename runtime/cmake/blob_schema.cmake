# The blob schema's C++ side: flatc's schema_generated.h (readers, verifiers and
# the object API's owning structs such as blob::KernelImageT), made from the
# same schema.fbs the Python writer's schema_generated.py is made from.
# Defines target et_trt_schema (header only: the generated header and the
# flatbuffers headers) and ET_TRT_GENERATED_DIR. Included by runtime/ and by a
# standalone build of runtime/kernels.
include_guard(GLOBAL)

include(${CMAKE_CURRENT_LIST_DIR}/require.cmake)

find_path(ET_TRT_FLATBUFFERS_INCLUDE_DIR flatbuffers/flatbuffers.h)
et_trt_require(ET_TRT_FLATBUFFERS_INCLUDE_DIR "the flatbuffers headers (flatbuffers/flatbuffers.h)"
  libflatbuffers-dev)
# flatc must be the release of the headers: generated code static_asserts the
# version. Prefer the flatc installed beside the headers (the ExecuTorch wheel
# puts a flatc of another release on PATH inside a venv).
get_filename_component(_et_trt_fb_prefix "${ET_TRT_FLATBUFFERS_INCLUDE_DIR}" DIRECTORY)
find_program(ET_TRT_FLATC flatc HINTS "${_et_trt_fb_prefix}/bin" NO_DEFAULT_PATH)
find_program(ET_TRT_FLATC flatc)
et_trt_require(ET_TRT_FLATC "flatc (the flatbuffers compiler)" flatbuffers-compiler)
file(STRINGS "${ET_TRT_FLATBUFFERS_INCLUDE_DIR}/flatbuffers/base.h" _et_trt_fb_version_lines
  REGEX "#define FLATBUFFERS_VERSION_(MAJOR|MINOR|REVISION) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*REVISION ([0-9]+).*" "\\1.\\2.\\3"
  _et_trt_fb_headers_version "${_et_trt_fb_version_lines}")
execute_process(COMMAND "${ET_TRT_FLATC}" --version OUTPUT_VARIABLE _et_trt_flatc_version
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _et_trt_flatc_version MATCHES " ${_et_trt_fb_headers_version}$")
  message(FATAL_ERROR "${ET_TRT_FLATC} is '${_et_trt_flatc_version}' but the flatbuffers headers in "
    "${ET_TRT_FLATBUFFERS_INCLUDE_DIR} are ${_et_trt_fb_headers_version}; point ET_TRT_FLATC at the "
    "flatc of the headers' release (-DET_TRT_FLATC=...)")
endif()

set(ET_TRT_SCHEMA "${CMAKE_CURRENT_LIST_DIR}/../../et_trt_backend/serialization/schema.fbs")
set(ET_TRT_GENERATED_DIR "${CMAKE_BINARY_DIR}/generated")
add_custom_command(
  OUTPUT "${ET_TRT_GENERATED_DIR}/schema_generated.h"
  COMMAND "${ET_TRT_FLATC}" --cpp --scoped-enums --gen-object-api -o "${ET_TRT_GENERATED_DIR}" "${ET_TRT_SCHEMA}"
  DEPENDS "${ET_TRT_SCHEMA}"
  COMMENT "flatc: generating the blob schema's schema_generated.h")
add_custom_target(et_trt_schema_header DEPENDS "${ET_TRT_GENERATED_DIR}/schema_generated.h")
add_library(et_trt_schema INTERFACE)
add_dependencies(et_trt_schema et_trt_schema_header)
# flatbuffers' headers are third-party: no warnings from them.
target_include_directories(et_trt_schema SYSTEM INTERFACE "${ET_TRT_FLATBUFFERS_INCLUDE_DIR}")
target_include_directories(et_trt_schema INTERFACE "${ET_TRT_GENERATED_DIR}")
