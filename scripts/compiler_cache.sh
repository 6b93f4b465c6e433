# Sourced by setup.sh and test.sh: the CMake builds they start (runtime/, the TensorRT layer, the aarch64 cross
# build, and those the tests and pip's wheel build configure) compile through ccache where it is installed
# (system_packages.sh installs it). A clean clone on a machine that built this tree before, as CI's is, then
# recompiles in seconds instead of minutes. CMake reads these variables when it configures a new build folder.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  # Paths inside the checkout hashed relative to it: another clone of the same tree hits the same entries.
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
fi
