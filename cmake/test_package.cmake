# ctest's cmake_package test: install the core from the build tree BUILD into a prefix, then configure,
# build and run tests/cmake_package against it with find_package(formal_transformers CONFIG).
set(prefix "${BUILD}/package_test/install")
set(consumer "${BUILD}/package_test/consumer")
file(REMOVE_RECURSE "${BUILD}/package_test")
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD};--prefix;${prefix}"
    "${CMAKE_COMMAND};-S;${SRC}/tests/cmake_package;-B;${consumer};-G;Ninja;-DCMAKE_PREFIX_PATH=${prefix};-DCMAKE_BUILD_TYPE=Release"
    "${CMAKE_COMMAND};--build;${consumer}"
    "${consumer}/ft_consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake_package: '${step}' failed (${rc})")
  endif()
endforeach()
