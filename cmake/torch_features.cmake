# Finds LibTorch (>= 1.13; Debian's CPU 1.13.1 or a CUDA 2.x) and says what it offers.
# Sets DTORCH_TORCH_DEFINITIONS (compile definitions every dtorch user needs) and
# DTORCH_TORCH_LIBDIR (for RPATH). Version differences stay in comm/ and core/torch_compat.h.
#
# Which LibTorch: the first TorchConfig.cmake found through Torch_DIR or CMAKE_PREFIX_PATH
# (for PyPI's wheel: `python -c 'import torch; print(torch.utils.cmake_prefix_path)'`), else
# the system's (Debian's libtorch-dev). TorchConfig.cmake looks for its libraries with
# find_library(... PATHS <prefix>/lib), which searches the system's library folders first: with
# Debian's libtorch-dev installed too, a wheel's 2.x headers would be linked against Debian's
# 1.13 libraries. Putting the chosen prefix first in CMAKE_PREFIX_PATH makes <prefix>/lib win.
find_path(DTORCH_TORCH_CONFIG_DIR TorchConfig.cmake
  HINTS ${Torch_DIR} ${CMAKE_PREFIX_PATH} $ENV{CMAKE_PREFIX_PATH}
  PATH_SUFFIXES Torch share/cmake/Torch NO_DEFAULT_PATH)
if(DTORCH_TORCH_CONFIG_DIR)
  get_filename_component(_dtorch_torch_prefix "${DTORCH_TORCH_CONFIG_DIR}/../../.." ABSOLUTE)
  list(PREPEND CMAKE_PREFIX_PATH "${_dtorch_torch_prefix}")
  set(Torch_DIR "${DTORCH_TORCH_CONFIG_DIR}" CACHE PATH "Folder of TorchConfig.cmake" FORCE)
endif()
find_package(Torch REQUIRED)
if(Torch_VERSION AND Torch_VERSION VERSION_LESS 1.13)
  message(FATAL_ERROR "dtorch needs LibTorch >= 1.13, found ${Torch_VERSION} (set Torch_DIR)")
endif()
# TorchConfig.cmake finds libtorch as TORCH_LIBRARY (1.13 and 2.x alike; in 2.x the `torch`
# target itself only has per-configuration locations).
set(_torch_location "${TORCH_LIBRARY}")
if(NOT _torch_location)
  get_target_property(_torch_location torch IMPORTED_LOCATION)
endif()
if(_torch_location)
  get_filename_component(DTORCH_TORCH_LIBDIR "${_torch_location}" DIRECTORY)
  get_filename_component(_torch_real "${_torch_location}" REALPATH)
  get_filename_component(_prefix_real "${TORCH_INSTALL_PREFIX}" REALPATH)
  string(FIND "${_torch_real}" "${_prefix_real}/" _inside)
  if(NOT _inside EQUAL 0)
    message(FATAL_ERROR "dtorch: the LibTorch headers come from ${TORCH_INSTALL_PREFIX} but "
      "libtorch from ${_torch_location}: two LibTorch installations are mixed. Start from an "
      "empty build folder and pass -DCMAKE_PREFIX_PATH=<the one you want>.")
  endif()
endif()
message(STATUS "dtorch: LibTorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")

# PyPI's wheel keeps its CUDA libraries (NCCL, cuDNN, cuBLAS, ...) in site-packages/nvidia/*/lib
# and finds them at run time through libtorch_cuda.so's $ORIGIN rpath. The linker does not
# expand that, and finds an older NCCL of a system CUDA toolkit instead ("undefined reference
# to ncclCommGrow"): point it at the wheel's own.
set(DTORCH_TORCH_LINK_OPTIONS "")
file(GLOB _wheel_cuda_libdirs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
foreach(_dir IN LISTS _wheel_cuda_libdirs)
  get_filename_component(_dir "${_dir}" ABSOLUTE)
  list(APPEND DTORCH_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${_dir}")
endforeach()

# ProcessGroupGloo.hpp includes Gloo's headers, which a pip wheel's LibTorch (Gloo compiled in)
# does not ship: they come from the system (Debian: libgloo-dev) or from a folder made by
# scripts/bundle-deps, named in CMAKE_PREFIX_PATH.
find_path(DTORCH_GLOO_INCLUDE_DIR gloo/config.h HINTS ${TORCH_INCLUDE_DIRS})
if(NOT DTORCH_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "dtorch: Gloo's headers (gloo/config.h) were not found: apt-get install "
    "libgloo-dev, or add a folder made by scripts/bundle-deps to CMAKE_PREFIX_PATH")
endif()
include_directories(${DTORCH_GLOO_INCLUDE_DIR})

set(DTORCH_TORCH_DEFINITIONS "")
# The 2.x headers guard the Gloo/NCCL process groups behind these macros, which only
# PyTorch's own build defines; Debian's 1.13 headers need none.
list(APPEND DTORCH_TORCH_DEFINITIONS USE_C10D_GLOO)
if(TORCH_CUDA_LIBRARIES)
  find_path(DTORCH_NCCL_INCLUDE_DIR nccl.h
    HINTS ${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include ENV NCCL_INCLUDE_DIR
    PATH_SUFFIXES include)
  if(DTORCH_NCCL_INCLUDE_DIR)
    list(APPEND DTORCH_TORCH_DEFINITIONS DTORCH_WITH_CUDA DTORCH_WITH_NCCL USE_C10D_NCCL)
    include_directories(${DTORCH_NCCL_INCLUDE_DIR})
    message(STATUS "dtorch: CUDA and NCCL found (nccl.h in ${DTORCH_NCCL_INCLUDE_DIR})")
  else()
    list(APPEND DTORCH_TORCH_DEFINITIONS DTORCH_WITH_CUDA)
    message(WARNING "dtorch: LibTorch has CUDA but nccl.h was not found: building without "
      "the NCCL backend. Set NCCL_INCLUDE_DIR to the folder holding nccl.h to enable it.")
  endif()
else()
  message(STATUS "dtorch: CPU LibTorch ${Torch_VERSION} (Gloo backend only)")
endif()
