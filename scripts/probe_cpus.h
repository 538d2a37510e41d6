// The CPUs a probe may use and its thread-count argument, shared by the probes in this
// folder (parallel_probe.cc, gemm_probe.cc).
#pragma once

#include <sched.h>

#include <cstdio>
#include <cstdlib>

namespace probe {

// The CPUs this process may use and how many threads to run (argv[1], default all of
// them); exits with a usage line on a bad argument.
struct Cpus {
  cpu_set_t allowed;
  int count = 0, threads = 0;
  Cpus(int argc, char** argv, const char* name) {
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
      std::perror("sched_getaffinity");
      std::exit(1);
    }
    count = CPU_COUNT(&allowed);
    threads = argc > 1 ? std::atoi(argv[1]) : count;
    if (threads < 1) {
      std::fprintf(stderr, "usage: %s [threads >= 1]\n", name);
      std::exit(2);
    }
  }
  // Pins the calling thread to the index-th allowed CPU; false if there is none.
  bool pin_to(int index) const {
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &allowed) || seen++ != index) continue;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      return sched_setaffinity(0, sizeof(one), &one) == 0;
    }
    return false;
  }
  // Lets the calling thread run on every allowed CPU again.
  void unpin() const { sched_setaffinity(0, sizeof(allowed), &allowed); }
};

}  // namespace probe
