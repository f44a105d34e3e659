// What gpumoved sets up for its whole process before the daemon starts: the heap's
// thresholds, the open-file limit, and the CPUs an MPI launcher bound it to.
#ifndef GPUMOVE_DAEMON_APP_PROCESS_H_
#define GPUMOVE_DAEMON_APP_PROCESS_H_

namespace gpumove {

// Big requests' buffers from memory the heap keeps, not fresh pages each time.
void TuneHeap();

// The soft limit on open files raised to the hard one: Debian's soft default of 1024 is a
// few hundred clients. (At the limit new connections are closed at once; Listeners.)
void RaiseOpenFileLimit();

// Started by an MPI launcher, and unless `keep`: this process's threads may run on every
// CPU its cpuset allows, not only those the launcher bound it to. Call before any thread
// starts, so that all inherit it.
void WidenMpiCpuBinding(bool keep);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_APP_PROCESS_H_
