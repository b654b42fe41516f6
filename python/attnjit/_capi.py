"""ctypes declarations of attnjit.h: the structs and functions the package
calls, and where libattnjit.so.0 is found.

The structs mirror the C ones field for field; attnjit's versioned-struct
rule (attnjit.h, "Versioned structs") lets this module keep working against
a newer library, and tests/python/test_api.py compares every layout with
the C compiler's.
"""
import ctypes
import os

c_size_t = ctypes.c_size_t
c_int = ctypes.c_int          # C enums
i32, i64, u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
c_double, c_bool, c_char_p, c_void_p = ctypes.c_double, ctypes.c_bool, ctypes.c_char_p, ctypes.c_void_p

# enums (attnjit.h)
OK = 0
STATUS_NAMES = ("AJ_OK", "AJ_ERR_INVALID_ARG", "AJ_ERR_PARSE", "AJ_ERR_VERIFY",
                "AJ_ERR_UNSUPPORTED", "AJ_ERR_CODEGEN", "AJ_ERR_NO_DEVICE", "AJ_ERR_IO",
                "AJ_ERR_OUT_OF_MEMORY", "AJ_ERR_INTERNAL", "AJ_ERR_KERNEL_FAULT", "AJ_ERR_COMM")
DTYPE_F16, DTYPE_BF16, DTYPE_F32 = 0, 1, 2
DTYPE_F8E4M3, DTYPE_F8E5M2 = 3, 4      # inputs only (q_dtype, kv_dtype)
SIDE_I32, SIDE_F32, SIDE_F16, SIDE_BF16 = 0, 1, 2, 3
CACHE_DEFAULT, CACHE_MEMORY, CACHE_OFF = 0, 1, 2
DEVICE_SIM, DEVICE_CUDA, DEVICE_CPU = 0, 1, 2
CPU_THREADS_POOL, CPU_THREADS_OPENMP = 0, 1
EMIT_NAMES = ("ptx", "llvm_ir", "bitcode", "auto")
PARAM_TYPE_NAMES = ("ptr", "i32", "i64", "f32", "byval128")
TARGET_NAMES = ("any", "sm_80", "sm_90", "sm_90a", "sim", "cpu", "sm_89")
SHARD_LAYOUTS = ("contiguous", "zigzag")
RING_ROTATES = ("p2p", "allgather")
CP_METHODS = ("ring", "ulysses", "hybrid")        # aj_cp_method
RING_BLOCK_SKIP, RING_BLOCK_FULL, RING_BLOCK_PARTIAL = 0, 1, 2


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("rank", i32),
                ("shape", i64 * 4), ("strides", i64 * 4)]


class SideTensor(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("data", c_void_p), ("dtype", c_int), ("rank", i32),
                ("shape", i64 * 4), ("strides", i64 * 4)]


class Schedule(ctypes.Structure):
    _fields_ = [("block_m", i32), ("block_n", i32), ("warps", i32), ("stages", i32)]


class CtxConfig(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("log_fn", c_void_p), ("log_user", c_void_p),
                ("log_level", c_int), ("cache_mode", c_int), ("cache_dir", c_char_p),
                ("cache_max_bytes", u64), ("cache_max_kernels", u64)]


class CompileOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("target", c_int), ("emit", c_int),
                ("opt_level", c_int), ("dump_after", c_char_p), ("bypass_cache", c_bool),
                ("device", c_void_p)]


# The runs of fields aj_fwd_args and aj_bwd_args share, in their order.
_QKVOL = [("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor), ("lse", Tensor)]
_POSITIONS = [("alibi_slopes", Tensor),
              ("q_offset", i64), ("kv_offset", i64), ("sq_total", i64), ("sk_total", i64),
              ("stream", c_void_p), ("bias", Tensor)]
_DROPOUT_VARLEN = [("seed", u64), ("offset", u64),
                   ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
                   ("batch", i32), ("max_seqlen_q", i32), ("max_seqlen_k", i32)]
_SIDE = [("side", ctypes.POINTER(SideTensor)), ("num_side", i32), ("block_mask", c_void_p)]
_HEADS = [("head_offset", i64), ("heads_q_total", i64)]


class FwdArgs(ctypes.Structure):
    _fields_ = ([("struct_size", c_size_t)] + _QKVOL + _POSITIONS + [("o_acc", Tensor)]
                + _DROPOUT_VARLEN + _SIDE
                + [("k_cache", Tensor), ("v_cache", Tensor), ("block_table", c_void_p),
                   ("max_pages", i32), ("seqlens_k", c_void_p),
                   ("k_scale", Tensor), ("v_scale", Tensor)]
                + _HEADS + [("check_side_bounds", i32), ("q_scale", Tensor)])


class BwdArgs(ctypes.Structure):
    _fields_ = ([("struct_size", c_size_t)] + _QKVOL
                + [("do_", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor)]
                + _POSITIONS + [("dbias", Tensor)] + _DROPOUT_VARLEN
                + [("workspace", c_void_p), ("workspace_bytes", c_size_t)] + _SIDE + _HEADS
                + [("dsinks", Tensor), ("check_side_bounds", i32),
                   ("dside", ctypes.POINTER(SideTensor)), ("num_dside", i32)])


class GridDim(ctypes.Structure):
    _fields_ = [("extent", c_int), ("per_block", i32)]


class ParamInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("type", c_int)]


class LaunchInfo(ctypes.Structure):
    _fields_ = [("block", i32 * 3), ("grid", GridDim * 3), ("dynamic_smem", i32),
                ("num_params", i32), ("params", ctypes.POINTER(ParamInfo)),
                ("schedule", Schedule)]


class ShardChunk(ctypes.Structure):
    # "global" is a Python keyword: read it with chunk_tuple
    _fields_ = [("global", i64), ("local", i64), ("len", i64)]


def chunk_tuple(c):
    """An aj_shard_chunk as (global, local, len)."""
    return getattr(c, "global"), c.local, c.len


class RingPair(ctypes.Structure):
    _fields_ = [("step", i32), ("src", i32), ("q", ShardChunk), ("k", ShardChunk),
                ("block", c_int), ("doc", i32)]


class RingPlanArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("layout", c_int), ("rotate", c_int),
                ("rank", i32), ("size", i32), ("batch", i64), ("heads_q", i64),
                ("seq_q", i64), ("seq_k", i64), ("alibi_slopes", Tensor),
                ("side", ctypes.POINTER(SideTensor)), ("num_side", i32),
                ("members", i32), ("head_offset", i64), ("cu_seqlens_q", c_void_p),
                ("cu_seqlens_k", c_void_p)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, i32, i32, c_char_p)


class TuneOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("batch", i32), ("heads_q", i32),
                ("heads_kv", i32), ("seq_q", i32), ("seq_k", i32), ("budget_s", c_double),
                ("warmup", i32), ("repeats", i32), ("compile_workers", i32),
                ("no_persist", c_bool), ("progress", PROGRESS_FN), ("progress_user", c_void_p),
                ("wgmma", i32)]


class TuneResult(ctypes.Structure):
    _fields_ = [("requested", Schedule), ("schedule", Schedule), ("workers", i32),
                ("status", c_int), ("timed", c_bool), ("message", ctypes.c_char * 256),
                ("median_ms", c_double), ("min_ms", c_double), ("is_default", c_bool),
                ("warpgroups", ctypes.c_int8), ("producer", ctypes.c_int8)]


STRUCTS = {"aj_tensor": Tensor, "aj_side_tensor": SideTensor, "aj_schedule": Schedule,
           "aj_ctx_config": CtxConfig, "aj_compile_options": CompileOptions,
           "aj_fwd_args": FwdArgs, "aj_bwd_args": BwdArgs, "aj_launch_info": LaunchInfo,
           "aj_tune_options": TuneOptions, "aj_tune_result": TuneResult,
           "aj_shard_chunk": ShardChunk, "aj_ring_pair": RingPair,
           "aj_ring_plan_args": RingPlanArgs}

P = c_void_p
PP = ctypes.POINTER(c_void_p)
_SIGNATURES = {
    "aj_status_str": (c_char_p, [c_int]),
    "aj_ctx_create": (c_int, [ctypes.POINTER(CtxConfig), PP]),
    "aj_ctx_destroy": (None, [P]),
    "aj_cache_set_max_kernels": (c_int, [P, u64]),
    "aj_last_error": (c_char_p, [P]),
    "aj_free": (None, [P]),
    "aj_version_string": (c_char_p, []),
    "aj_llvm_version": (c_char_p, []),
    "aj_cpu_describe": (c_size_t, [ctypes.c_char_p, c_size_t]),
    "aj_op_parse": (c_int, [P, c_char_p, c_size_t, c_char_p, PP]),
    "aj_op_destroy": (None, [P]),
    "aj_op_print": (c_int, [P, PP]),
    "aj_op_hash": (c_int, [P, ctypes.c_char * 17]),
    "aj_op_set_mask_none": (c_int, [P]),
    "aj_target_from_name": (c_int, [P, c_char_p, ctypes.POINTER(c_int)]),
    "aj_compile": (c_int, [P, P, ctypes.POINTER(CompileOptions), PP]),
    "aj_kernel_destroy": (None, [P]),
    "aj_kernel_code": (c_void_p, [P, ctypes.POINTER(c_size_t)]),
    "aj_kernel_emit": (c_int, [P]),
    "aj_kernel_target": (c_int, [P]),
    "aj_kernel_num_stages": (i32, [P]),
    "aj_kernel_stage_info": (c_int, [P, i32, ctypes.POINTER(LaunchInfo)]),
    "aj_kernel_stage_entry": (c_char_p, [P, i32]),
    "aj_kernel_stage_plan": (i32, [P, i32]),
    "aj_extent_name": (c_char_p, [c_int]),
    "aj_device_open": (c_int, [P, c_int, c_int, PP]),
    "aj_device_close": (None, [P]),
    "aj_device_set_cpu_threads": (c_int, [P, c_int]),
    "aj_device_cpu_threads": (c_int, [P]),
    "aj_device_name": (c_char_p, [P]),
    "aj_device_target": (c_int, [P]),
    "aj_forward": (c_int, [P, P, P, ctypes.POINTER(FwdArgs)]),
    "aj_backward": (c_int, [P, P, P, ctypes.POINTER(BwdArgs)]),
    "aj_backward_workspace_size": (c_int, [P, P, ctypes.POINTER(BwdArgs),
                                           ctypes.POINTER(c_size_t)]),
    "aj_tune": (c_int, [P, P, P, ctypes.POINTER(TuneOptions),
                        ctypes.POINTER(ctypes.POINTER(TuneResult)), ctypes.POINTER(i32)]),
    "aj_shard_get_chunks": (c_int, [P, c_int, c_int, c_int, i64, ctypes.POINTER(ShardChunk),
                                    ctypes.POINTER(c_int)]),
    "aj_shard_varlen_chunks": (c_int, [P, c_int, c_int, c_int, c_int, ctypes.POINTER(i32), i32,
                                       ctypes.POINTER(ShardChunk), i32, ctypes.POINTER(i32),
                                       ctypes.POINTER(i64)]),
    "aj_ring_plan": (c_int, [P, P, P, ctypes.POINTER(RingPlanArgs), ctypes.POINTER(RingPair),
                             i32, ctypes.POINTER(i32)]),
}


def _find_library():
    """$AJ_LIBRARY, else the libattnjit.so.0 installed inside the package."""
    path = os.environ.get("AJ_LIBRARY")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libattnjit.so.0", "libattnjit.so"):
        candidate = os.path.join(here, name)
        if os.path.exists(candidate):
            return candidate
    raise ImportError("attnjit: libattnjit.so.0 is not beside %s (install the package with "
                      "`pip install .`, or point AJ_LIBRARY at a built libattnjit.so)" % here)


def load():
    lib = ctypes.CDLL(_find_library())
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = load()
