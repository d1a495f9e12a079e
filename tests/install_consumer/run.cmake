# Installs the ferry build at FERRY_BUILD_DIR into a scratch prefix, then configures, builds and
# runs examples/ as a separate project that finds ferry with find_package(ferry), as a user would.
# Run by ctest (tests/CMakeLists.txt); fails with the step that broke.
foreach(var FERRY_BUILD_DIR FERRY_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake needs -D${var}=...")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${name} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

step("install" ${CMAKE_COMMAND} --install "${FERRY_BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/include/ferry/ferry.h")
  message(FATAL_ERROR "install_consumer: ${prefix}/include/ferry/ferry.h was not installed")
endif()
file(GLOB_RECURSE private_headers "${prefix}/include/*/batch_layout.h" "${prefix}/include/*/fetch.h")
if(private_headers)
  message(FATAL_ERROR "install_consumer: private headers were installed: ${private_headers}")
endif()

# ferry's prefix first, then where the ferry build found its dependencies (CONSUMER_PREFIX_PATH,
# '|'-separated, and Torch_DIR), as a user points CMake at PyTorch's LibTorch.
set(prefix_path "${prefix}")
if(CONSUMER_PREFIX_PATH)
  string(REPLACE "|" ";" extra "${CONSUMER_PREFIX_PATH}")
  list(APPEND prefix_path ${extra})
endif()
set(torch_arg)
if(Torch_DIR)
  set(torch_arg "-DTorch_DIR=${Torch_DIR}")
endif()
step("configure examples/" ${CMAKE_COMMAND} -S "${FERRY_SOURCE_DIR}/examples" -B "${build}"
     -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix_path}"
     ${torch_arg})
string(FIND "${step_output}" "using ferry 0.1.0 from ${prefix}/" found)
if(found EQUAL -1)
  message(FATAL_ERROR "install_consumer: examples/ did not find ferry in ${prefix}:\n${step_output}")
endif()

step("build examples/" ${CMAKE_COMMAND} --build "${build}")
step("run example_train_loop" "${build}/example_train_loop" --epochs 2 --samples 512)
if(NOT step_output MATCHES "epoch 1: loss [0-9.]+  accuracy")
  message(FATAL_ERROR "install_consumer: unexpected output of example_train_loop:\n${step_output}")
endif()
# Checkpoint and resume: a run stopped at step 12 (checkpoint at 10), then resumed with other
# workers, ends with the model of an uninterrupted run, bitwise.
string(REGEX MATCH "model fingerprint [0-9a-f]+" uninterrupted "${step_output}")
file(REMOVE_RECURSE "${WORK_DIR}/checkpoint")
step("run example_train_loop to step 12" "${build}/example_train_loop" --epochs 2 --samples 512
     --checkpoint "${WORK_DIR}/checkpoint" --save-every 5 --max-steps 12)
step("resume example_train_loop" "${build}/example_train_loop" --epochs 2 --samples 512
     --checkpoint "${WORK_DIR}/checkpoint" --save-every 5 --workers 3)
if(NOT step_output MATCHES "resumed from [^\n]* at step 10 \\(epoch 1\\)")
  message(FATAL_ERROR "install_consumer: example_train_loop did not resume at step 10:\n${step_output}")
endif()
string(REGEX MATCH "model fingerprint [0-9a-f]+" resumed "${step_output}")
if(NOT uninterrupted OR NOT resumed STREQUAL uninterrupted)
  message(FATAL_ERROR "install_consumer: resumed run ended with '${resumed}', the uninterrupted "
                      "one with '${uninterrupted}':\n${step_output}")
endif()
# The installed package's spawn and forkserver: workers are fresh copies of the example.
foreach(method spawn forkserver)
  step("run example_train_loop under ${method}" "${build}/example_train_loop" --epochs 1
       --samples 256 --start-method ${method})
  if(NOT step_output MATCHES "start_method=${method}.*epoch 0: loss [0-9.]+  accuracy")
    message(FATAL_ERROR "install_consumer: example_train_loop under ${method}:\n${step_output}")
  endif()
endforeach()
message(STATUS "install_consumer: examples built and ran against ${prefix}")
