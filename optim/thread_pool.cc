#include "optim/thread_pool.h"

#include "base/check.h"

namespace zero::optim {

ThreadPool::ThreadPool(int num_threads) : size_(num_threads) {
  if (num_threads < 1) ZERO_THROW(InvalidArgument, "num_threads must be >= 1 (got {})", num_threads);
  threads_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::run_erased(Call call, void* obj) {
  ZERO_CHECK(!busy_.exchange(true), "ThreadPool::run called while another run is in progress");
  struct ClearBusy {
    std::atomic<bool>& busy;
    ~ClearBusy() { busy.store(false); }
  } clear_busy{busy_};

  if (size_ > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = call;
    obj_ = obj;
    error_ = nullptr;
    pending_ = size_ - 1;
    ++generation_;
  }
  if (size_ > 1) work_cv_.notify_all();

  std::exception_ptr own_error;
  try {
    call(obj, 0);
  } catch (...) {
    own_error = std::current_exception();
  }
  if (size_ == 1) {
    if (own_error) std::rethrow_exception(own_error);
    return;
  }
  // The workers only compute (no I/O, no waits of their own), so this wait is bounded by their work.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  if (own_error) std::rethrow_exception(own_error);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Idle wait for the next run() or the destructor.
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const Call call = call_;
    void* const obj = obj_;
    lock.unlock();
    std::exception_ptr error;
    try {
      call(obj, index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace zero::optim
