/*
 * runtime.h -- devices and launches (internal).
 */
#ifndef AJ_RUNTIME_RUNTIME_H
#define AJ_RUNTIME_RUNTIME_H

#include "codegen/codegen.h"
#include "runtime/cpu/cpu_device.h"
#include "runtime/cuda/cuda_device.h"

struct aj_device {
    aj_ctx *ctx;
    aj_device_kind kind;
    int index;
    int workers;                 /* sim, cpu (0: the default) */
    uint64_t last_instructions;  /* sim */
    aj_cuda_device *cuda;        /* cuda */
    aj_cpu_device *cpu;          /* cpu */
};

/* One kernel argument, addressed the way kernelParams are. */
typedef union aj_arg_value {
    void *ptr;
    int32_t i32;
    int64_t i64;
    float f32;
} aj_arg_value;

/* The sources of templates/params.def (a bit per aj_param_source) that
 * the launch entry point of `kind` fills (launch.c): every parameter of
 * the table its kernels declare reads one of them, else it is a side
 * tensor's (or alibi's slopes'), bound by name. */
uint64_t aj_launch_sources(aj_kind kind);

#endif /* AJ_RUNTIME_RUNTIME_H */
