/*
 * test_cuda_driver.c -- loading the CUDA driver where there is no usable
 * GPU: no driver at all, a driver with no device, a driver too old, a GPU
 * too old.  ctest runs it once per scenario against tests/fake_cuda (a
 * stand-in libcuda.so.1 on LD_LIBRARY_PATH):
 *
 *   test_cuda_driver EXPECTED_STATUS "message substring"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_cuda_driver STATUS MESSAGE\n");
        return 2;
    }
    aj_ctx *ctx = NULL;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    aj_device *dev = NULL;
    aj_status st = aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev);
    CHECK_MSG(strcmp(aj_status_str(st), argv[1]) == 0, "status %s, want %s (%s)",
              aj_status_str(st), argv[1], aj_last_error(ctx));
    CHECK_ERROR(ctx, argv[2]);
    CHECK(dev == NULL);
    /* the answer is the same the second time (the driver loads once) */
    st = aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev);
    CHECK(strcmp(aj_status_str(st), argv[1]) == 0);
    CHECK_ERROR(ctx, argv[2]);
    /* and sim keeps working */
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_SIM, 0, &dev), AJ_OK);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
