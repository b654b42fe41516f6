/*
 * mpi_absent.c -- the GPU bundle carries no MPI (a GPU machine need not
 * have it): these stand in for every MPI symbol libattnjit refers to, so
 * the linker (with --as-needed) leaves libmpi out of attnjit-gpu.  MPI
 * reads as never initialised; every other call fails with MPI_ERR_OTHER
 * and says why, which the MPI engine reports as a clean AJ_ERR_COMM.  The
 * NCCL ring of `attnjit-gpu ring` never calls MPI: its communicator is the
 * caller's (gpu_ring.c).  The names are Open MPI's (its predefined handles
 * are the ompi_* objects); tests/gpu/check_bundle.sh fails if the binary
 * still needs libmpi, so a drift in this list shows.
 */
#include <string.h>

#define MPI_ERR_OTHER 16   /* Open MPI's value */

int MPI_Initialized(int *flag);
int MPI_Finalized(int *flag);
int MPI_Error_string(int code, char *text, int *len);
int MPI_Allreduce(void);
int MPI_Bcast(void);
int MPI_Cancel(void);
int MPI_Comm_free(void);
int MPI_Comm_idup(void);
int MPI_Comm_rank(void);
int MPI_Comm_set_errhandler(void);
int MPI_Comm_split(void);
int MPI_Comm_size(void);
int MPI_Gather(void);
int MPI_Iallgather(void);
int MPI_Ialltoallv(void);
int MPI_Ibcast(void);
int MPI_Init(void);
int MPI_Irecv(void);
int MPI_Ireduce_scatter_block(void);
int MPI_Isend(void);
int MPI_Recv(void);
int MPI_Request_free(void);
int MPI_Send(void);
int MPI_Test(void);
int MPI_Testall(void);
int MPI_Finalize(void);
int MPI_Comm_split_type(void);
int MPI_Ibarrier(void);
int MPI_Win_allocate_shared(void);
int MPI_Win_free(void);
int MPI_Win_lock_all(void);
int MPI_Win_shared_query(void);
int MPI_Win_sync(void);
int MPI_Win_unlock_all(void);

int MPI_Initialized(int *flag)
{
    *flag = 0;
    return 0;
}

int MPI_Finalized(int *flag)
{
    *flag = 0;
    return 0;
}

int MPI_Error_string(int code, char *text, int *len)
{
    static const char why[] = "MPI is not part of the GPU bundle (attnjit-gpu)";
    memcpy(text, why, sizeof why);
    *len = (int)sizeof why - 1;
    return 0;
}

/* the rest: callers pass arguments these ignore (the System V ABI allows it) */
#define ABSENT(name) int name(void) { return MPI_ERR_OTHER; }
ABSENT(MPI_Allreduce)
ABSENT(MPI_Bcast)
ABSENT(MPI_Cancel)
ABSENT(MPI_Comm_free)
ABSENT(MPI_Comm_idup)
ABSENT(MPI_Comm_rank)
ABSENT(MPI_Comm_set_errhandler)
ABSENT(MPI_Comm_split)
ABSENT(MPI_Comm_size)
ABSENT(MPI_Gather)
ABSENT(MPI_Iallgather)
ABSENT(MPI_Ialltoallv)
ABSENT(MPI_Ibcast)
ABSENT(MPI_Init)
ABSENT(MPI_Irecv)
ABSENT(MPI_Ireduce_scatter_block)
ABSENT(MPI_Isend)
ABSENT(MPI_Recv)
ABSENT(MPI_Request_free)
ABSENT(MPI_Send)
ABSENT(MPI_Test)
ABSENT(MPI_Testall)
ABSENT(MPI_Finalize)
ABSENT(MPI_Comm_split_type)
ABSENT(MPI_Ibarrier)
ABSENT(MPI_Win_allocate_shared)
ABSENT(MPI_Win_free)
ABSENT(MPI_Win_lock_all)
ABSENT(MPI_Win_shared_query)
ABSENT(MPI_Win_sync)
ABSENT(MPI_Win_unlock_all)
#undef ABSENT

/* the predefined handles: only their addresses are used */
char ompi_mpi_byte[64];
char ompi_mpi_comm_null[64];
char ompi_mpi_comm_world[64];
char ompi_mpi_double[64];
char ompi_mpi_errors_return[64];
char ompi_mpi_float[64];
char ompi_mpi_info_null[64];
char ompi_mpi_int[64];
char ompi_mpi_int64_t[64];
char ompi_mpi_op_max[64];
char ompi_mpi_op_sum[64];
char ompi_request_null[64];
