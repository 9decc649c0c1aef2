# Checks kiln's installed headers (ctest: installed_headers).
#
#   cmake -DKILN_BUILD_DIR=<build> -DCXX=<compiler> [-DINCLUDES=<dir;...>] -P check_installed_headers.cmake
#
# Installs the build into a scratch prefix, then fails when
#   - an installed header includes a kiln header that is not installed (`#include "..."`, or
#     `#include <...>` naming kiln.h or a file under runtime/, jit/, guards/ or kernels/), or
#   - an installed header does not compile on its own (-fsyntax-only; INCLUDES: extra include
#     directories, e.g. xtensor's for runtime/tensor/xtensor_interop.h).
cmake_minimum_required(VERSION 3.22)
if(NOT KILN_BUILD_DIR OR NOT CXX)
  message(FATAL_ERROR "usage: cmake -DKILN_BUILD_DIR=<build> -DCXX=<compiler> -P ${CMAKE_CURRENT_LIST_FILE}")
endif()

string(RANDOM LENGTH 8 tag)
set(prefix "${KILN_BUILD_DIR}/installed-headers-check-${tag}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${KILN_BUILD_DIR}" --prefix "${prefix}"
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  file(REMOVE_RECURSE "${prefix}")
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
set(root "${prefix}/include/kiln")
file(GLOB_RECURSE headers RELATIVE "${root}" "${root}/*.h" "${root}/*.hpp")
list(SORT headers)
list(LENGTH headers count)

set(errors "")
foreach(h IN LISTS headers)
  get_filename_component(dir "${root}/${h}" DIRECTORY)
  file(STRINGS "${root}/${h}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      set(inc "${CMAKE_MATCH_1}")
      if(NOT EXISTS "${dir}/${inc}" AND NOT EXISTS "${root}/${inc}")
        string(APPEND errors "  ${h} includes \"${inc}\", which is not installed\n")
      endif()
    elseif(line MATCHES "#[ \t]*include[ \t]*<((kiln\\.h)|((runtime|jit|guards|kernels)/[^>]+))>")
      set(inc "${CMAKE_MATCH_1}")
      if(NOT EXISTS "${root}/${inc}")
        string(APPEND errors "  ${h} includes <${inc}>, which is not installed\n")
      endif()
    endif()
  endforeach()
endforeach()

# Each header on its own (a public header must not rely on what its includer included first).
set(flags -std=c++20 -fsyntax-only "-I${root}")
foreach(d IN LISTS INCLUDES)
  list(APPEND flags "-I${d}")
endforeach()
foreach(h IN LISTS headers)
  file(WRITE "${prefix}/tu.cpp" "#include <${h}>\n")
  execute_process(COMMAND ${CXX} ${flags} "${prefix}/tu.cpp"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(APPEND errors "  ${h} does not compile on its own:\n${out}\n")
  endif()
endforeach()

file(REMOVE_RECURSE "${prefix}")
if(errors)
  message(FATAL_ERROR "installed headers:\n${errors}")
endif()
message(STATUS "${count} installed headers: each includes only installed headers and compiles on its own")
