// main() for CUDA tests: without a usable GPU (cudaGetDeviceCount reports 0 or fails: no
// device, no driver) it prints one SKIPPED line and exits 0, so --config=cuda builds can run
// `bazel test` on machines without GPUs; otherwise it runs the gtest suite.
#ifndef TESSERA_COMMON_DEVICE_CUDA_GPU_TEST_MAIN_H_
#define TESSERA_COMMON_DEVICE_CUDA_GPU_TEST_MAIN_H_

#include <cstdio>

#include "common/device/cuda/cuda_device.h"
#include "gtest/gtest.h"

#define TESSERA_GPU_TEST_MAIN()                                                         \
  int main(int argc, char** argv) {                                                     \
    if (::tessera::CudaDeviceCount() == 0) {                                            \
      std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount reports none); %s\n",    \
                  argv[0]);                                                             \
      return 0;                                                                         \
    }                                                                                   \
    ::testing::InitGoogleTest(&argc, argv);                                             \
    return RUN_ALL_TESTS();                                                             \
  }

#endif  // TESSERA_COMMON_DEVICE_CUDA_GPU_TEST_MAIN_H_
