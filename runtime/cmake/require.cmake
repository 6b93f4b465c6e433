# et_trt_require(FOUND WHAT PACKAGE): stop configuring, naming what is missing
# and the Debian/Ubuntu package that has it (scripts/system_packages.sh
# installs every one the build needs).
include_guard(GLOBAL)
function(et_trt_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "${what} not found: install the system package ${package} "
      "(on Debian/Ubuntu scripts/system_packages.sh installs every one the build needs)")
  endif()
endfunction()
