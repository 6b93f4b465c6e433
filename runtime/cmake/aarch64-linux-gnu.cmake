# CMake toolchain file: cross-compiles runtime/ for 64-bit ARM Linux (Jetson Orin
# and Thor) on an x86-64 Debian/Ubuntu machine, with Debian's cross compiler
# (g++-aarch64-linux-gnu) and the arm64 libraries installed through multiarch
# into /usr/lib/aarch64-linux-gnu (scripts/system_packages.sh installs both).
# scripts/build_runtime.sh --target aarch64 passes it, with ExecuTorch's aarch64 wheel.
#
# The cross compiler searches the multiarch folders itself, and CMake's find_*
# commands look in them through CMAKE_LIBRARY_ARCHITECTURE. What runs during the
# build (flatc, Python) is this machine's; the headers that are the same for
# every architecture (flatbuffers, header-only; cuda.h, the driver API the
# launcher opens with dlopen) come from this machine too.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# FindOpenSSL asks pkg-config first: give it the arm64 .pc files, as Debian's
# cross pkg-config does, or it hands back this machine's x86-64 libcrypto.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
# ctest runs the test programs, and gtest's test discovery, through it.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
