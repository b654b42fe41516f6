/*
 * bundle.h -- the subcommands of attnjit-gpu, the one binary of the GPU
 * bundle (scripts/gpu-bundle.sh, docs/gpu.md).  Each is a check program of
 * its own elsewhere (gpu_check, gpu_backward_check, gpu_flash_bwd_check),
 * compiled a second time here under another name for main, so the bundle
 * carries LLVM once instead of once per check.
 */
#ifndef AJ_TESTS_GPU_BUNDLE_H
#define AJ_TESTS_GPU_BUNDLE_H

int gpu_check_main(int argc, char **argv);
int gpu_backward_main(int argc, char **argv);
int gpu_flash_bwd_main(int argc, char **argv);
int gpu_ring_main(int argc, char **argv);

#endif /* AJ_TESTS_GPU_BUNDLE_H */
