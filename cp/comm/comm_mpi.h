/*
 * comm_mpi.h -- what the NCCL engine (comm_nccl.c), which finds its ranks
 * over MPI, shares with the MPI engine (comm_mpi.c).
 */
#ifndef AJ_CP_COMM_COMM_MPI_H
#define AJ_CP_COMM_COMM_MPI_H

#include <mpi.h>

#include "cp/comm/comm.h"

/* *parent: the communicator the engine's ranks come from, config->mpi_comm
 * or else MPI_COMM_WORLD, once MPI is found initialised and not finalised;
 * `needs` ends the message of the engine that finds it otherwise. */
aj_status aj_comm_mpi_parent(aj_comm *comm, const aj_comm_config *config, const char *needs,
                             MPI_Comm *parent);

#endif /* AJ_CP_COMM_COMM_MPI_H */
