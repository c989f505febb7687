// An empty OpenMP parallel region of 2 threads, and a barrier inside one region, in us.
// g++ -O2 -fopenmp fork_join.cpp -o fork_join && ./fork_join
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <atomic>
int main() {
  std::atomic<long> sink{0};
  for (int rep = 0; rep < 3; rep++) {
    long N = 200000;
    auto t = std::chrono::steady_clock::now();
    for (long i = 0; i < N; i++) {
#pragma omp parallel num_threads(2)
      { sink.fetch_add(1, std::memory_order_relaxed); }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    t = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
    {
      for (long i = 0; i < N; i++) {
#pragma omp barrier
      }
    }
    double b = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    printf("empty parallel region: %.2f us; barrier inside one region: %.2f us\n", s / N * 1e6, b / N * 1e6);
  }
}
