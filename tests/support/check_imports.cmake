# Run by ctest (cmake -P): fails if any of BINARIES (a '|'-separated list) imports one of
# libstdc++'s std::filesystem directory iterators. Their state lives in a struct private to the
# libstdc++ that made it, and PyTorch's LibTorch (2.5 and later, pytorch#133437) exports a
# statically linked libstdc++ of its own, so a program may run half of an iteration in one copy
# and half in the other. ferry lists folders with ipc::list_directory (opendir/readdir) instead.
cmake_minimum_required(VERSION 3.21)
find_program(NM nm REQUIRED)
string(REPLACE "|" ";" BINARIES "${BINARIES}")
set(found)
foreach(binary IN LISTS BINARIES)
  execute_process(COMMAND ${NM} -D -C --undefined-only "${binary}" OUTPUT_VARIABLE symbols
                  RESULT_VARIABLE result ERROR_VARIABLE errors)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "nm -D ${binary} failed: ${errors}")
  endif()
  string(REGEX MATCHALL "[^\n]*directory_iterator[^\n]*" hits "${symbols}")
  foreach(hit IN LISTS hits)
    list(APPEND found "${binary}: ${hit}")
  endforeach()
endforeach()
if(found)
  string(REPLACE ";" "\n  " found "${found}")
  message(FATAL_ERROR "these import std::filesystem's directory iterators; list folders with "
                      "ipc::list_directory (src/ipc/files.h) instead:\n  ${found}")
endif()
list(LENGTH BINARIES count)
message(STATUS "${count} binaries checked: none imports a std::filesystem directory iterator")
