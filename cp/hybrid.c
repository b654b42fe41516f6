/*
 * hybrid.c -- method = hybrid's sub-communicators: P = U x R ranks as R
 * Ulysses groups of U consecutive ranks, and U rings across them.
 *
 *   ranks      0  1 | 2  3 | 4  5        P = 6, U = 2, R = 3
 *   group      0  0 | 1  1 | 2  2        all-to-all inside (color r / U)
 *   across     a  b | a  b | a  b        ring over a's, over b's (color r % U)
 *
 * Rank r is member r % U of group r / U and rank r / U of its ring.  The
 * all-to-all (ulysses.c) runs over `group`, the ring (ring.c) over
 * `across`.  Both come from the caller's comm by the engine's split
 * (MPI_Comm_split, ncclCommSplit), once per comm and U: they are kept on
 * the comm and freed by aj_comm_destroy.
 */
#include "ir/diag.h"
#include "cp/comm/comm.h"
#include "cp/cp.h"

aj_status aj_cp_split(aj_ctx *ctx, const char *fn, aj_comm *comm, int U, aj_comm **group,
                      aj_comm **across)
{
    if (comm->split_u != U) {
        /* aj_comm_bytes_sent keeps counting what the old ones sent */
        comm->bytes_sent += aj_comm_bytes_sent(comm->group) + aj_comm_bytes_sent(comm->across);
        aj_comm_destroy(comm->group);
        aj_comm_destroy(comm->across);
        comm->group = comm->across = NULL;
        comm->split_u = 0;
        aj_status st = aj_comm_split(comm, comm->rank / U, comm->rank % U, &comm->group);
        if (st == AJ_OK)
            st = aj_comm_split(comm, comm->rank % U, comm->rank / U, &comm->across);
        if (st != AJ_OK)
            return aj_cp_collective_status(ctx, fn, st);
        comm->split_u = U;
    }
    *group = comm->group;
    *across = comm->across;
    return AJ_OK;
}
