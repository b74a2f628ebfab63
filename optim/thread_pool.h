#pragma once
// A persistent pool for data-parallel loops: run(fn) calls fn(0..size-1) once each, index 0 on the
// calling thread and the others on threads started once in the constructor, and returns when all
// calls have returned. No allocation per run(). One run() at a time (a second concurrent call throws
// CheckError).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace zero::optim {

class ThreadPool {
 public:
  // `num_threads` >= 1 counts the caller; num_threads - 1 threads are started.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Calls fn(i) for every i in [0, size()); rethrows the first exception any call threw.
  template <typename F>
  void run(F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_erased([](void* obj, int i) { (*static_cast<Fn*>(obj))(i); },
               const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Call = void (*)(void*, int);
  void run_erased(Call call, void* obj);
  void worker(int index);

  int size_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped for every run(); workers run once per generation
  int pending_ = 0;          // worker calls of the current generation not finished yet
  bool stop_ = false;
  Call call_ = nullptr;
  void* obj_ = nullptr;
  std::exception_ptr error_;
  std::atomic<bool> busy_{false};
  std::vector<std::thread> threads_;
};

}  // namespace zero::optim
