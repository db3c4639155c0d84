# ctest's cmake_package test: install the core from the build tree BUILD into a prefix, then configure,
# build and run tests/cmake_package against it with find_package(formal_transformers CONFIG); then the same
# for examples/cpp (the baby GPT trained and sampled from C++ alone), run for 3 steps on a small text.
set(prefix "${BUILD}/package_test/install")
set(consumer "${BUILD}/package_test/consumer")
set(example "${BUILD}/package_test/example")
set(text "${BUILD}/package_test/text.txt")
file(REMOVE_RECURSE "${BUILD}/package_test")
string(REPEAT "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" 12 words)
file(WRITE "${text}" "${words}")
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD};--prefix;${prefix}"
    "${CMAKE_COMMAND};-S;${SRC}/tests/cmake_package;-B;${consumer};-G;Ninja;-DCMAKE_PREFIX_PATH=${prefix};-DCMAKE_BUILD_TYPE=Release"
    "${CMAKE_COMMAND};--build;${consumer}"
    "${consumer}/ft_consumer"
    "${consumer}/ft_snippet"
    "${CMAKE_COMMAND};-S;${SRC}/examples/cpp;-B;${example};-G;Ninja;-DCMAKE_PREFIX_PATH=${prefix};-DCMAKE_BUILD_TYPE=Release"
    "${CMAKE_COMMAND};--build;${example}"
    "${example}/train_baby_gpt;${text};3;20")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake_package: '${step}' failed (${rc})")
  endif()
endforeach()
