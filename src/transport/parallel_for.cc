// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/parallel_for.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>
#include <system_error>
#include <vector>

namespace mooncake::sparse::internal {
namespace {

/// A call of RunWithHelpers, on its caller's stack while the call runs.
struct PoolJob {
    void (*body)(void*);
    void* ctx;
    unsigned wanted;      ///< Helpers that may still join. Guarded by the pool's mutex.
    unsigned active = 0;  ///< Helpers inside body. Guarded by the pool's mutex.
};

/// Threads that wait for jobs and join them while the jobs want helpers. Never destroyed: its
/// threads wait on it until the process ends (a pool torn down at exit could be in use by
/// another thread then).
class WorkerPool {
public:
    explicit WorkerPool(unsigned threads) {
        for (unsigned t = 0; t < threads; ++t) {
            try {
                std::thread([this] { Loop(); }).detach();
            } catch (const std::system_error&) {
                break;  // Out of threads: the ones started (or the callers alone) do the work.
            }
            ++workers_;
        }
    }

    void Run(unsigned helpers, void (*body)(void*), void* ctx) {
        const unsigned wanted = std::min(helpers, workers_);
        if (wanted == 0) {
            body(ctx);
            return;
        }
        PoolJob job{body, ctx, wanted};
        {
            std::lock_guard lock(mu_);
            open_.push_back(&job);
        }
        if (wanted == 1) {
            wake_.notify_one();
        } else {
            wake_.notify_all();
        }
        try {
            body(ctx);
        } catch (...) {
            Finish(job);  // helpers may still be in the job, which lives on this stack
            throw;
        }
        Finish(job);
    }

private:
    /// Closes `job` and waits until no helper is inside it.
    void Finish(PoolJob& job) {
        std::unique_lock lock(mu_);
        Close(&job);
        done_.wait(lock, [&] { return job.active == 0; });
    }

    /// No helper joins `job` from now on. Holds mu_.
    void Close(PoolJob* job) {
        job->wanted = 0;
        for (std::size_t i = 0; i < open_.size(); ++i) {
            if (open_[i] == job) {
                open_.erase(open_.begin() + static_cast<std::ptrdiff_t>(i));
                break;
            }
        }
    }

    void Loop() {
        std::unique_lock lock(mu_);
        for (;;) {
            wake_.wait(lock, [&] { return !open_.empty(); });
            PoolJob* job = open_.back();  // the newest: likely the one with the most left
            ++job->active;
            if (--job->wanted == 0) Close(job);
            lock.unlock();
            job->body(job->ctx);
            lock.lock();
            if (--job->active == 0 && job->wanted == 0) done_.notify_all();
        }
    }

    std::mutex mu_;
    std::condition_variable wake_;  ///< A job was opened.
    std::condition_variable done_;  ///< A closed job's last helper left.
    std::vector<PoolJob*> open_;    ///< Jobs that want helpers. Guarded by mu_.
    unsigned workers_ = 0;  ///< Threads started (detached: they wait here for good).
};

std::mutex pool_mu;                     ///< Held while the pool starts.
std::atomic<WorkerPool*> pool{nullptr};  ///< Leaked on purpose (see WorkerPool).
WorkerPool* parent_pool = nullptr;       ///< A forked child's copy of its parent's (threadless).

/// In a forked child the parent's workers do not exist (and pool_mu may have been held by one
/// of its threads): the child starts a pool of its own on its first call.
void ForgetPoolAfterFork() {
    new (&pool_mu) std::mutex();
    parent_pool = pool.exchange(nullptr);
}

WorkerPool& Pool() {
    if (WorkerPool* p = pool.load(std::memory_order_acquire)) return *p;
    static const bool registered = [] {
        pthread_atfork(nullptr, nullptr, &ForgetPoolAfterFork);
        return true;
    }();
    (void)registered;
    std::lock_guard lock(pool_mu);
    WorkerPool* p = pool.load(std::memory_order_acquire);
    if (p == nullptr) {
        p = new WorkerPool(HardwareThreads() - 1);
        pool.store(p, std::memory_order_release);
    }
    return *p;
}

}  // namespace

void RunWithHelpers(unsigned helpers, void (*body)(void*), void* ctx) {
    if (helpers == 0 || HardwareThreads() <= 1) {
        body(ctx);
        return;
    }
    Pool().Run(helpers, body, ctx);
}

}  // namespace mooncake::sparse::internal
