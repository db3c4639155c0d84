# ctest's cmake_blas_configure test: how the configure finds the BLAS (CMakeLists.txt "The BLAS"), each case
# a configure of the source tree SRC in BUILD/blas_configure/<case> (configure only: seconds).
# Without any Python (find_package(Python) disabled, FT_PYTHON empty), pkg-config seeing only one
# openblas.pc, written from the scipy-openblas32 of the interpreter PYTHON (this fixture's only use of it:
# a current OpenBLAS whose .pc carries its symbol prefix, -DBLAS_SYMBOL_PREFIX=scipy_):
#   FT_BLAS=auto and FT_BLAS=system take OpenBLAS from pkg-config, with the prefix from its Cflags;
#   FT_BLAS=auto with no openblas.pc fails at configure time with a message naming both ways.
# With Python: when PYTHON lives in a virtual environment, that environment activated (VIRTUAL_ENV) and a
# `python3` without scipy-openblas32 first on the PATH (a pyenv shim's situation), FT_BLAS=auto takes
# scipy-openblas32 through the virtual environment's interpreter.
set(root "${BUILD}/blas_configure")
file(REMOVE_RECURSE "${root}")
execute_process(COMMAND "${PYTHON}" -c "import scipy_openblas32 as s; print(s.get_pkg_config(), end='')"
                OUTPUT_VARIABLE pc RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake_blas_pkgconfig: ${PYTHON} cannot write scipy-openblas32's pkg-config file")
endif()
file(WRITE "${root}/pc/openblas.pc" "${pc}")
file(MAKE_DIRECTORY "${root}/empty")

function(configure name libdir expect_ok)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env PKG_CONFIG_PATH= "PKG_CONFIG_LIBDIR=${libdir}" --unset=VIRTUAL_ENV
            ${ENV_ARGS} "${CMAKE_COMMAND}" -S "${SRC}" -B "${root}/${name}" -G Ninja ${ARGN}
            -DFT_PYTHON= -DFT_BUILD_TESTS=OFF -DFT_BUILD_PYTHON=OFF
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "cmake_blas_pkgconfig: configure '${name}' failed:\n${out}\n${err}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "cmake_blas_pkgconfig: configure '${name}' succeeded without a BLAS:\n${out}")
  endif()
  set(out "${out}${err}" PARENT_SCOPE)
endfunction()

foreach(mode auto system)
  configure(${mode} "${root}/pc" TRUE -DFT_BLAS=${mode} -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON)
  if(NOT out MATCHES "BLAS = OpenBLAS [0-9.]+ \\(pkg-config: [^\n]*\\) \\(pkg-config, symbol prefix 'scipy_'\\)")
    message(FATAL_ERROR "cmake_blas_pkgconfig: FT_BLAS=${mode} did not take OpenBLAS from pkg-config:\n${out}")
  endif()
  file(STRINGS "${root}/${mode}/CMakeCache.txt" py REGEX "^_?Python_EXECUTABLE:")
  if(py AND NOT py MATCHES "NOTFOUND$")
    message(FATAL_ERROR "cmake_blas_pkgconfig: FT_BLAS=${mode} looked for Python: ${py}")
  endif()
endforeach()

configure(none "${root}/empty" FALSE -DFT_BLAS=auto -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON)
string(REGEX REPLACE "[ \n]+" " " out "${out}")  # CMake wraps the message's lines
if(NOT out MATCHES "no BLAS: scipy-openblas32 not found \\(no Python interpreter found\\)")
  message(FATAL_ERROR "cmake_blas_pkgconfig: no BLAS, but not the expected message:\n${out}")
endif()

execute_process(COMMAND "${PYTHON}" -c "import sys; print(sys.prefix if sys.prefix != sys.base_prefix else '', end='')"
                OUTPUT_VARIABLE venv RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake_blas_configure: ${PYTHON} does not run")
endif()
if(venv)
  file(WRITE "${root}/decoy/python3" "#!/bin/sh\necho 'a python3 without scipy-openblas32' >&2\nexit 1\n")
  file(CHMOD "${root}/decoy/python3" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
  file(COPY_FILE "${root}/decoy/python3" "${root}/decoy/python")
  set(ENV_ARGS "VIRTUAL_ENV=${venv}" "PATH=${root}/decoy:$ENV{PATH}")
  configure(venv "${root}/empty" TRUE -DFT_BLAS=auto)
  set(ENV_ARGS "")
  if(NOT out MATCHES "BLAS = [^\n]*scipy_openblas32[^\n]*\\(scipy-openblas32, symbol prefix 'scipy_'\\)")
    message(FATAL_ERROR "cmake_blas_configure: FT_BLAS=auto with ${venv} active did not take its scipy-openblas32:\n${out}")
  endif()
  file(STRINGS "${root}/venv/CMakeCache.txt" py REGEX "^_?Python_EXECUTABLE:")
  string(FIND "${py}" "${venv}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "cmake_blas_configure: the interpreter found is not the virtual environment's: ${py}")
  endif()
else()
  message(STATUS "cmake_blas_configure: ${PYTHON} is not in a virtual environment: the venv case needs one")
endif()
