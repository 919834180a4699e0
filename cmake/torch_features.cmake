# Finds LibTorch (>= 1.13; Debian's CPU 1.13.1 or a CUDA 2.x) and says what it offers.
# Sets DTORCH_TORCH_DEFINITIONS (compile definitions every dtorch user needs) and
# DTORCH_TORCH_LIBDIR (for RPATH). Version differences stay in comm/ and core/torch_compat.h.
find_package(Torch REQUIRED)
if(Torch_VERSION AND Torch_VERSION VERSION_LESS 1.13)
  message(FATAL_ERROR "dtorch needs LibTorch >= 1.13, found ${Torch_VERSION} (set Torch_DIR)")
endif()
get_target_property(_torch_location torch IMPORTED_LOCATION)
if(_torch_location)
  get_filename_component(DTORCH_TORCH_LIBDIR "${_torch_location}" DIRECTORY)
endif()

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
