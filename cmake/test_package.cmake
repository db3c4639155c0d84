# ctest's cmake_package test: install the core (component cpp) from the build tree BUILD into a prefix and move the prefix
# elsewhere (the package is relocatable: no installed file may name the install prefix or the build's Python
# environment), then configure, build and run tests/cmake_package against it with
# find_package(formal_transformers CONFIG); then the same for examples/cpp (the baby GPT trained and sampled
# from C++ alone), run for 3 steps on a small text.
set(staged "${BUILD}/package_test/staged")
set(prefix "${BUILD}/package_test/install")
set(consumer "${BUILD}/package_test/consumer")
set(example "${BUILD}/package_test/example")
set(text "${BUILD}/package_test/text.txt")
file(REMOVE_RECURSE "${BUILD}/package_test")
string(REPEAT "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" 12 words)
file(WRITE "${text}" "${words}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD}" --component cpp --prefix "${staged}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake_package: cmake --install failed (${rc})")
endif()
file(GLOB_RECURSE config_files "${staged}/*.cmake")
if(NOT config_files)
  message(FATAL_ERROR "cmake_package: no package config installed under ${staged}")
endif()
foreach(f IN LISTS config_files)
  file(READ "${f}" body)
  foreach(bad "${staged}" "site-packages" "${BUILD}")
    string(FIND "${body}" "${bad}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "cmake_package: ${f} names '${bad}': the installed package is not relocatable")
    endif()
  endforeach()
endforeach()
file(RENAME "${staged}" "${prefix}")
foreach(step
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
