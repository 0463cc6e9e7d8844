# The required stack, all from Debian bookworm packages (see scripts/setup).
#
# Version facts (DESIGN §10):
# - FAISS 1.7.3 is a static library that needs OpenMP found first.
# - gRPC 1.51's grpc_cpp_plugin comes from protobuf-compiler-grpc.
# - Protobuf 3.21 is found through CMake's FindProtobuf.
# - Abseil 20220623 has no absl/log and no status macros (see tessera/status_macros.h).
# - OpenBLAS and cpp-httplib 0.11 are found through pkg-config.
# - libzip 1.7.3 (the .npz container, index/npy) is found through pkg-config.
# - nlohmann-json 3.11.2 (header-only; the command line's JSON, client/cli) by its CMake config.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(ZLIB REQUIRED)

find_package(absl REQUIRED CONFIG)

pkg_check_modules(OpenBLAS REQUIRED IMPORTED_TARGET openblas)
add_library(tessera_openblas INTERFACE)
target_link_libraries(tessera_openblas INTERFACE PkgConfig::OpenBLAS)
add_library(tessera::openblas ALIAS tessera_openblas)

pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET libzip>=1.7)
add_library(tessera_libzip INTERFACE)
target_link_libraries(tessera_libzip INTERFACE PkgConfig::LIBZIP)
add_library(tessera::libzip ALIAS tessera_libzip)

find_package(nlohmann_json 3.11 REQUIRED CONFIG)

find_package(OpenMP REQUIRED)
find_package(faiss REQUIRED CONFIG)

find_package(RocksDB REQUIRED CONFIG)

find_package(Protobuf REQUIRED)
find_package(gRPC REQUIRED CONFIG)
find_package(OpenSSL REQUIRED)  # SHA-256 of API keys (libssl-dev, which libgrpc-dev requires)
find_program(TESSERA_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(yaml-cpp REQUIRED CONFIG)
# The HTTP listeners (server/http): Debian builds cpp-httplib 0.11 as a shared library with
# OpenSSL, zlib and brotli; its pkg-config flags define the matching CPPHTTPLIB_*_SUPPORT macros.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

message(STATUS "Tessera dependencies: absl ${absl_VERSION}, OpenBLAS ${OpenBLAS_VERSION}, "
               "libzip ${LIBZIP_VERSION}, nlohmann_json ${nlohmann_json_VERSION}, "
               "faiss ${faiss_VERSION}, RocksDB ${RocksDB_VERSION}, "
               "Protobuf ${Protobuf_VERSION}, gRPC ${gRPC_VERSION}")

if(TESSERA_BUILD_TESTS)
  find_package(GTest REQUIRED)
  # Tests that compare with SciPy/NumPy use Debian's interpreter and its python3-scipy.
  find_program(TESSERA_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT TESSERA_PYTHON)
    find_program(TESSERA_PYTHON python3 REQUIRED)
  endif()
endif()
if(TESSERA_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
