/*
 * target.c -- the target table (target.h).
 */
#include "codegen/target.h"


#define KIB 1024

static const aj_target_desc rows[AJ_TARGET_COUNT] = {
    [AJ_TARGET_ANY] = {.family = AJ_FAMILY_NONE, .smem_limit = 48 * KIB,
                       .cache_kind = AJ_CACHE_NONE},
    /* A100: 164 KiB less 1 KiB reserved */
    [AJ_TARGET_SM_80] = {.family = AJ_FAMILY_NVPTX, .hidden = AJ_HIDDEN_NONE, .simt = true,
                         .smem_limit = 163 * KIB, .ptx_isa = "7.0",
                         .machine = aj_nvptx_target_machine, .machine_opt_follows_op = true,
                         .cache_kind = AJ_CACHE_PTX},
    /* L4, L40S (Ada): 100 KiB a block may opt into, less 1 KiB reserved */
    [AJ_TARGET_SM_89] = {.family = AJ_FAMILY_NVPTX, .hidden = AJ_HIDDEN_NONE, .simt = true,
                         .smem_limit = 99 * KIB, .f8_mma = AJ_F8_MMA_NATIVE, .ptx_isa = "7.8",
                         .machine = aj_nvptx_target_machine, .machine_opt_follows_op = true,
                         .cache_kind = AJ_CACHE_PTX},
    /* H100 / H200 */
    [AJ_TARGET_SM_90] = {.family = AJ_FAMILY_NVPTX, .hidden = AJ_HIDDEN_NONE, .simt = true,
                         .smem_limit = 227 * KIB, .f8_mma = AJ_F8_MMA_LOWERED, .ptx_isa = "7.8",
                         .machine = aj_nvptx_target_machine, .machine_opt_follows_op = true,
                         .cache_kind = AJ_CACHE_PTX},
    [AJ_TARGET_SM_90A] = {.family = AJ_FAMILY_NVPTX, .hidden = AJ_HIDDEN_NONE, .simt = true,
                          .smem_limit = 227 * KIB, .f8_mma = AJ_F8_MMA_LOWERED,
                          .wgmma = true, .ptx_isa = "8.0",
                          .machine = aj_nvptx_target_machine, .machine_opt_follows_op = true,
                          .cache_kind = AJ_CACHE_PTX},
    /* the GPU kernels' IR on the emulator, which models the largest GPU */
    [AJ_TARGET_SIM] = {.family = AJ_FAMILY_HOST, .hidden = AJ_HIDDEN_SIM_THREAD, .simt = true,
                       .emulated = true, .smem_limit = 227 * KIB, .f8_mma = AJ_F8_MMA_NATIVE,
                       .wgmma = true,
                       .machine = aj_host_target_machine, .machine_opt_follows_op = false,
                       .block_limit = 256,
                       .cache_kind = AJ_CACHE_SIM_OBJECT, .host_symbols = aj_sim_symbols},
    [AJ_TARGET_CPU] = {.family = AJ_FAMILY_HOST, .hidden = AJ_HIDDEN_WORK_ITEM, .simt = false,
                       .smem_limit = 48 * KIB, .machine = aj_host_target_machine,
                       .machine_opt_follows_op = true, .cache_kind = AJ_CACHE_CPU_OBJECT,
                       .host_symbols = aj_cpu_symbols},
};

const aj_target_desc *aj_target_desc_of(aj_target target)
{
    return (unsigned)target < AJ_TARGET_COUNT ? &rows[target] : &rows[AJ_TARGET_ANY];
}

bool aj_target_is_nvptx(aj_target target)
{
    return aj_target_desc_of(target)->family == AJ_FAMILY_NVPTX;
}

int32_t aj_target_smem_limit(aj_target target)
{
    return aj_target_desc_of(target)->smem_limit;
}

const char *aj_ptx_version(aj_target target)
{
    return aj_target_desc_of(target)->ptx_isa;
}
