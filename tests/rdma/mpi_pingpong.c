/* A plain MPI round trip for the MVAPICH2 verbs test (tests/rdma/mvapich2_verbs_test.sh):
 * rank 0 sends N patterned bytes to rank 1, which checks them and sends them back; rank 0
 * checks what came back. Each rank prints its host, what it found and the MPI library's
 * own name (MPI_Get_library_version). Exit status: 0 only when every byte matched.
 * Usage: mpi_pingpong [BYTES] (default 1 MiB, at most 1 GiB). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char Pattern(size_t i) { return (unsigned char)(i * 7 + (i >> 12) + 3); }

static size_t Mismatches(const unsigned char* b, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += b[i] != Pattern(i);
  return bad;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, len = 0;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  char host[MPI_MAX_PROCESSOR_NAME];
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_library_version(lib, &len);
  lib[strcspn(lib, "\n")] = '\0'; /* Its first line names it. */
  MPI_Get_processor_name(host, &len);
  char* end = NULL;
  const unsigned long long n = argc > 1 ? strtoull(argv[1], &end, 10) : (1u << 20);
  if (size != 2 || n == 0 || n > (1u << 30) || (end != NULL && *end != '\0')) {
    if (rank == 0) fprintf(stderr, "usage: two ranks, mpi_pingpong [BYTES <= 1 GiB]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  unsigned char* b = malloc(n);
  if (b == NULL) MPI_Abort(MPI_COMM_WORLD, 3);
  size_t bad = 0;
  double t = MPI_Wtime();
  if (rank == 0) {
    for (size_t i = 0; i < n; ++i) b[i] = Pattern(i);
    MPI_Send(b, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
    memset(b, 0, n);
    MPI_Recv(b, (int)n, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    bad = Mismatches(b, n);
  } else {
    MPI_Recv(b, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    bad = Mismatches(b, n);
    MPI_Send(b, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
  }
  t = MPI_Wtime() - t;
  printf("rank %d of %d on %s: %llu bytes %s, %zu differ (%.2f s); %s\n", rank, size, host, n,
         rank == 0 ? "sent and back" : "received", bad, t, lib);
  fflush(stdout);
  free(b);
  MPI_Finalize();
  return bad == 0 ? 0 : 1;
}
