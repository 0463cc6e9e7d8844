# Target helpers in the style of abseil's absl_cc_library: every library is tessera_NAME with the
# alias tessera::NAME; only index/include is a public include directory. Sources include internal
# headers by their path from the repository root ("index/pooling/ward_linkage.h").
#
# The index's internals are reachable only from index/ (and from tests/ and bench/, which test and
# measure them), as leveldb's db/ is only from leveldb: targets defined under server/ or client/ do
# not get the repository root on their include path but a directory that holds that one component
# (build/include_roots/server/server -> server/), so "server/config.h" resolves there and
# "index/common/thread_pool.h" does not; they see the index through index/include only (Bazel's
# _virtual_includes are the same idea).

set(TESSERA_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare)

# _tessera_source_root(OUT): the include root for the internal headers of targets defined in the
# calling directory (see above).
function(_tessera_source_root out)
  cmake_path(RELATIVE_PATH CMAKE_CURRENT_SOURCE_DIR BASE_DIRECTORY ${PROJECT_SOURCE_DIR}
             OUTPUT_VARIABLE _relative)
  string(REGEX REPLACE "/.*" "" _component "${_relative}")
  if(_component STREQUAL "server" OR _component STREQUAL "client")
    set(_root ${PROJECT_BINARY_DIR}/include_roots/${_component})
    if(NOT IS_SYMLINK ${_root}/${_component})
      file(MAKE_DIRECTORY ${_root})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${_component} ${_root}/${_component} SYMBOLIC)
    endif()
    set(${out} ${_root} PARENT_SCOPE)
  else()
    set(${out} ${PROJECT_SOURCE_DIR} PARENT_SCOPE)
  endif()
endfunction()

# tessera_cc_library(NAME n SRCS ... [DEPS ...] [PRIVATE_DEPS ...] [COPTS ...])
function(tessera_cc_library)
  cmake_parse_arguments(TCL "" "NAME" "SRCS;DEPS;PRIVATE_DEPS;COPTS" ${ARGN})
  set(_target tessera_${TCL_NAME})
  add_library(${_target} STATIC ${TCL_SRCS})
  add_library(tessera::${TCL_NAME} ALIAS ${_target})
  _tessera_source_root(_root)
  target_include_directories(${_target} PUBLIC ${PROJECT_SOURCE_DIR}/index/include PRIVATE ${_root})
  target_link_libraries(${_target} PUBLIC ${TCL_DEPS} PRIVATE ${TCL_PRIVATE_DEPS})
  target_compile_options(${_target} PRIVATE ${TESSERA_WARNINGS} ${TCL_COPTS})
endfunction()

# tessera_cc_binary(NAME n SRCS ... [DEPS ...]): an executable in build/bin.
function(tessera_cc_binary)
  cmake_parse_arguments(TCB "" "NAME" "SRCS;DEPS;COPTS" ${ARGN})
  add_executable(${TCB_NAME} ${TCB_SRCS})
  _tessera_source_root(_root)
  target_include_directories(${TCB_NAME} PRIVATE ${_root})
  target_link_libraries(${TCB_NAME} PRIVATE ${TCB_DEPS})
  target_compile_options(${TCB_NAME} PRIVATE ${TESSERA_WARNINGS} ${TCB_COPTS})
endfunction()

# tessera_cc_test(NAME n SRCS ... [DEPS ...] [LABELS ...]): a gtest binary in build/tests whose
# cases are registered with ctest one by one.
function(tessera_cc_test)
  if(NOT TESSERA_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(TCT "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${TCT_NAME} ${TCT_SRCS})
  set_target_properties(${TCT_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  _tessera_source_root(_root)
  target_include_directories(${TCT_NAME} PRIVATE ${_root})
  target_link_libraries(${TCT_NAME} PRIVATE ${TCT_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${TCT_NAME} PRIVATE ${TESSERA_WARNINGS})
  gtest_discover_tests(${TCT_NAME} DISCOVERY_MODE PRE_TEST PROPERTIES LABELS unit)
  if(TCT_LABELS)
    # gtest_discover_tests flattens a list-valued property, so extra labels are set by a script
    # that runs after discovery (TEST_INCLUDE_FILES run in the order they were added).
    string(JOIN ";" _labels unit ${TCT_LABELS})
    set(_script ${CMAKE_CURRENT_BINARY_DIR}/${TCT_NAME}_labels.cmake)
    file(WRITE ${_script}
         "set_tests_properties(\${${TCT_NAME}_TESTS} PROPERTIES LABELS \"${_labels}\")\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_script})
  endif()
endfunction()

# tessera_cc_benchmark(NAME n SRCS ... [DEPS ...]): a Google Benchmark binary in build/bin.
function(tessera_cc_benchmark)
  cmake_parse_arguments(TCBM "" "NAME" "SRCS;DEPS" ${ARGN})
  tessera_cc_binary(NAME ${TCBM_NAME} SRCS ${TCBM_SRCS} DEPS ${TCBM_DEPS} benchmark::benchmark)
endfunction()
