/*
 * alltoall_check.h -- an engine's all-to-all (aj_comm_engine.alltoallv)
 * with a different byte count per (sender, receiver) pair, gaps between
 * the parts and an empty part, checked byte by byte, and the bytes it
 * counts as sent (aj_comm_bytes_sent): shared by the MPI
 * engine's test (test_ring) and the NCCL engine's (test_nccl).
 */
#ifndef AJ_TESTS_RING_ALLTOALL_CHECK_H
#define AJ_TESTS_RING_ALLTOALL_CHECK_H

#include <stdlib.h>

#include "check.h"
#include "cp/comm/comm.h"

/* Rank `from`'s part for rank `to`: (from + 2 to + 1) % 7 bytes (0 for
 * some pairs), byte i = a pattern of (from, to, i). */
static size_t alltoall_check_bytes(int from, int to)
{
    return (size_t)((from + 2 * to + 1) % 7);
}

static unsigned char alltoall_check_byte(int from, int to, size_t i)
{
    return (unsigned char)(from * 31 + to * 17 + (int)i * 3 + 1);
}

/* Runs one all-to-all on `comm` (every rank calls it) and checks what
 * arrives; returns the status the engine gave. */
static aj_status alltoall_check(aj_comm *comm)
{
    const int me = comm->rank, n = comm->size;
    size_t *c = calloc(4 * (size_t)n, sizeof *c);
    size_t send_total = 0, recv_total = 0;
    for (int peer = 0; peer < n; peer++) {
        c[n + peer] = send_total;               /* offsets with a 3-byte gap */
        c[peer] = alltoall_check_bytes(me, peer);
        send_total += c[peer] + 3;
        c[3 * n + peer] = recv_total;
        c[2 * n + peer] = alltoall_check_bytes(peer, me);
        recv_total += c[2 * n + peer] + 3;
    }
    unsigned char *send = calloc(send_total + 1, 1), *recv = calloc(recv_total + 1, 1);
    for (int peer = 0; peer < n; peer++)
        for (size_t i = 0; i < c[peer]; i++)
            send[c[n + peer] + i] = alltoall_check_byte(me, peer, i);
    const uint64_t sent_before = aj_comm_bytes_sent(comm);
    aj_status st = comm->engine->alltoallv(comm, send, c, c + n, recv, c + 2 * n, c + 3 * n);
    uint64_t want_sent = 0;   /* every part but the rank's own */
    for (int peer = 0; peer < n; peer++)
        want_sent += peer == me ? 0 : c[peer];
    CHECK_MSG(aj_comm_bytes_sent(comm) - sent_before == want_sent, "rank %d: all-to-all "
              "counted %llu bytes sent, want %llu", me,
              (unsigned long long)(aj_comm_bytes_sent(comm) - sent_before),
              (unsigned long long)want_sent);
    size_t wrong = 0;
    for (int peer = 0; peer < n && st == AJ_OK; peer++)
        for (size_t i = 0; i < c[2 * n + peer]; i++)
            wrong += recv[c[3 * n + peer] + i] != alltoall_check_byte(peer, me, i);
    CHECK_MSG(wrong == 0, "rank %d: all-to-all: %zu bytes wrong", me, wrong);
    free(send);
    free(recv);
    free(c);
    return st;
}

#endif /* AJ_TESTS_RING_ALLTOALL_CHECK_H */
