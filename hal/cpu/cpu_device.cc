#include "hal/cpu/cpu_device.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace raccel::hal {
namespace {

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(uint64_t size, std::unique_ptr<std::byte[]> bytes) : Buffer(size), bytes_(std::move(bytes)) {}
  std::byte* bytes() { return bytes_.get(); }
  const std::byte* bytes() const { return bytes_.get(); }
  float* floats() { return reinterpret_cast<float*>(bytes_.get()); }
  const float* floats() const { return reinterpret_cast<const float*>(bytes_.get()); }

 private:
  std::unique_ptr<std::byte[]> bytes_;
};

HostBuffer& host(Buffer& b) { return static_cast<HostBuffer&>(b); }
const HostBuffer& host(const Buffer& b) { return static_cast<const HostBuffer&>(b); }

// A fixed pool that runs parallelFor bodies; the calling thread takes a share too.
class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads) {
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { run(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over [0, n) in contiguous pieces, in parallel; returns when done.
  void parallelFor(uint64_t n, uint64_t minPiece, const std::function<void(uint64_t, uint64_t)>& fn) {
    uint64_t pieces = std::min<uint64_t>(size(), std::max<uint64_t>(1, n / std::max<uint64_t>(minPiece, 1)));
    if (pieces <= 1) {
      if (n) fn(0, n);
      return;
    }
    uint64_t step = (n + pieces - 1) / pieces;
    {
      std::lock_guard lock(mu_);
      job_ = &fn;
      jobN_ = n;
      step_ = step;
      next_ = 1;  // piece 0 is ours
      pieces_ = pieces;
      pending_ = pieces - 1;
      ++generation_;
    }
    cv_.notify_all();
    fn(0, std::min(step, n));
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void run() {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ && next_ < pieces_); });
      if (stop_) return;
      while (job_ && next_ < pieces_) {
        uint64_t piece = next_++;
        auto* fn = job_;
        uint64_t begin = piece * step_, end = std::min(jobN_, begin + step_);
        lock.unlock();
        if (begin < end) (*fn)(begin, end);
        lock.lock();
        if (--pending_ == 0) done_.notify_all();
      }
      seen = generation_;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(uint64_t, uint64_t)>* job_ = nullptr;
  uint64_t jobN_ = 0, step_ = 0, next_ = 0, pieces_ = 0, pending_ = 0, generation_ = 0;
  bool stop_ = false;
};

// The asynchronous card's queue: ops run in order on a thread of their own.
class OpQueue {
 public:
  OpQueue() : thread_([this] { run(); }) {}
  ~OpQueue() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(uint64_t tag, std::function<void()> op) {
    {
      std::lock_guard lock(mu_);
      ops_.push_back({tag, std::move(op)});
      ++inFlight_;
    }
    cv_.notify_all();
  }
  void finish() {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return inFlight_ == 0; });
  }
  size_t takeCompleted(std::vector<KernelTime>& out) {
    std::lock_guard lock(mu_);
    out.insert(out.end(), completed_.begin(), completed_.end());
    completed_.clear();
    return inFlight_;
  }
  void waitCompleted(unsigned timeoutMs) {
    std::unique_lock lock(mu_);
    done_.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return !completed_.empty() || inFlight_ == 0; });
  }

 private:
  struct Op {
    uint64_t tag;
    std::function<void()> run;
  };
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !ops_.empty(); });
      if (stop_ && ops_.empty()) return;
      Op op = std::move(ops_.front());
      ops_.erase(ops_.begin());
      lock.unlock();
      auto start = std::chrono::steady_clock::now();
      op.run();
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      lock.lock();
      completed_.push_back({op.tag, static_cast<uint64_t>(ns)});
      --inFlight_;
      done_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::vector<Op> ops_;
  std::vector<KernelTime> completed_;
  size_t inFlight_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the rest is built
};

class CpuDevice final : public Device {
 public:
  CpuDevice(Capabilities caps, unsigned threads, bool paced, bool async)
      : Device(std::move(caps)), pool_(threads), paced_(paced || async) {
    if (async) queue_ = std::make_unique<OpQueue>();
  }

  Status finish() override {  // synchronous: every call has completed before it returned
    if (queue_) queue_->finish();
    return {};
  }
  bool timesKernels() const override { return queue_ != nullptr; }
  size_t takeCompleted(std::vector<KernelTime>& out) override { return queue_ ? queue_->takeCompleted(out) : 0; }
  void waitCompleted(unsigned timeoutMs) override {
    if (queue_) queue_->waitCompleted(timeoutMs);
  }

 protected:
  void doRelease(Buffer&) override { finish(); }  // a queued op may still use it
  Result<std::unique_ptr<Buffer>> doAllocate(uint64_t bytes) override {
    finish();  // the thread pool is the queue's while it runs
    std::unique_ptr<std::byte[]> mem(new (std::nothrow) std::byte[bytes]);
    if (!mem) return fail(Code::resourceExhausted, "host memory exhausted allocating " + std::to_string(bytes) + " bytes");
    // A new buffer never shows what an earlier tenant left in that memory. Zeroing in
    // parallel here also takes the first-touch page faults out of the first write.
    std::byte* p = mem.get();
    pool_.parallelFor(bytes, 1 << 20, [p](uint64_t b, uint64_t e) { std::memset(p + b, 0, e - b); });
    return std::unique_ptr<Buffer>(new HostBuffer(bytes, std::move(mem)));
  }
  Status doWrite(Buffer& b, uint64_t offset, std::span<const std::byte> data) override {
    finish();  // in order with the queued ops, like a stream
    if (!data.empty()) std::memcpy(host(b).bytes() + offset, data.data(), data.size());  // empty: data() may be null
    return {};
  }
  Status doRead(const Buffer& b, uint64_t offset, std::span<std::byte> out) override {
    finish();
    if (!out.empty()) std::memcpy(out.data(), host(b).bytes() + offset, out.size());
    return {};
  }
  Status doCopy(Buffer& dst, uint64_t dstOffset, const Buffer& src, uint64_t srcOffset, uint64_t length) override {
    finish();
    std::memmove(host(dst).bytes() + dstOffset, host(src).bytes() + srcOffset, length);
    return {};
  }
  Status doFill(Buffer& b, uint64_t offset, uint64_t length, uint8_t value) override {
    finish();
    std::memset(host(b).bytes() + offset, value, length);
    return {};
  }

  // The arguments are captured by value: an asynchronous op runs after the call returns
  // (its buffers stay alive: release() waits for the queue).
  Status doGemm(const GemmArgs& g) override {
    return pace(2.0 * g.m * g.n * g.k, [this, g] { gemm(g); });
  }
  Status doAxpy(uint64_t n, float alpha, const Buffer& xb, Buffer& yb) override {
    return pace(2.0 * n, [this, n, alpha, x = &xb, y = &yb] { axpy(n, alpha, *x, *y); });
  }
  Status doVadd(uint64_t n, const Buffer& ab, const Buffer& bb, Buffer& outb) override {
    return pace(double(n), [this, n, a = &ab, b = &bb, out = &outb] { vadd(n, *a, *b, *out); });
  }
  Status doReduceSum(uint64_t n, const Buffer& inb, Buffer& outb) override {
    return pace(double(n), [this, n, in = &inb, out = &outb] { reduceSum(n, *in, *out); });
  }
  Status doTensor(const LoweredTensorOp& op) override {
    return pace(op.flops, [this, op] { tensor(op); });
  }

 private:
  // A paced (simulated) card takes at least flops / its declared TFLOPS per op; an
  // asynchronous one queues the op and returns.
  template <class F>
  Status pace(double flops, F work) {
    auto paced = [this, flops, work = std::move(work)] {
      auto start = std::chrono::steady_clock::now();
      work();
      if (paced_)
        std::this_thread::sleep_until(start + std::chrono::duration<double>(flops / (capabilities().tflops * 1e12)));
    };
    if (queue_) queue_->push(kernelTag(), std::move(paced));
    else paced();
    return {};
  }

  void gemm(const GemmArgs& g) {
    gemmRows(host(*g.a).floats(), g.k, host(*g.b).floats(), g.n, host(*g.c).floats(), g.n, g.m, g.n, g.k, g.alpha, g.beta);
  }

  // c[m x n] = alpha a[m x k] b[k x n] + beta c, rows `lda`, `ldb`, `ldc` floats apart
  // (c does not alias a or b). Rows of c in parallel; within a row, i-k-j order streams b
  // and c contiguously.
  void gemmRows(const float* a, uint64_t lda, const float* b, uint64_t ldb, float* c, uint64_t ldc, uint64_t m,
                uint64_t n, uint64_t k, float alpha, float beta) {
    uint64_t flopsPerRow = 2 * n * k;
    pool_.parallelFor(m, std::max<uint64_t>(1, (1 << 16) / std::max<uint64_t>(flopsPerRow, 1)),
                      [&](uint64_t r0, uint64_t r1) {
                        constexpr uint64_t kBlockK = 256;
                        for (uint64_t i = r0; i < r1; ++i) {
                          float* crow = c + i * ldc;
                          if (beta == 0) std::fill(crow, crow + n, 0.0f);
                          else if (beta != 1)
                            for (uint64_t j = 0; j < n; ++j) crow[j] *= beta;
                        }
                        for (uint64_t p0 = 0; p0 < k; p0 += kBlockK) {
                          uint64_t p1 = std::min(k, p0 + kBlockK);
                          for (uint64_t i = r0; i < r1; ++i) {
                            float* __restrict crow = c + i * ldc;
                            const float* arow = a + i * lda;
                            for (uint64_t p = p0; p < p1; ++p) {
                              const float s = alpha * arow[p];
                              const float* __restrict brow = b + p * ldb;
                              for (uint64_t j = 0; j < n; ++j) crow[j] += s * brow[j];
                            }
                          }
                        }
                      });
  }

  // A matmul over row-major views (a's k, b's n and out's n contiguous), as a built-in
  // gemm or a slice of one: the blocked gemm above, not a work-item per output.
  bool matmulAsGemm(const kernels::RcGeom& g, float* const* p) {
    if (g.stride[1][2] != 1 || g.stride[2][1] != 1 || g.stride[0][1] != 1) return false;
    gemmRows(p[1] + g.offset[1], uint64_t(g.stride[1][0]), p[2] + g.offset[2], uint64_t(g.stride[2][2]), p[0] + g.offset[0],
             uint64_t(g.stride[0][0]), uint64_t(g.shape[0]), uint64_t(g.shape[1]), uint64_t(g.shape[2]), g.alpha, g.beta);
    return true;
  }

  void axpy(uint64_t n, float alpha, const Buffer& xb, Buffer& yb) {
    const float* x = host(xb).floats();
    float* y = host(yb).floats();
    pool_.parallelFor(n, 1 << 16, [&](uint64_t i0, uint64_t i1) {
      for (uint64_t i = i0; i < i1; ++i) y[i] += alpha * x[i];
    });
  }

  void vadd(uint64_t n, const Buffer& ab, const Buffer& bb, Buffer& outb) {
    const float* a = host(ab).floats();
    const float* b = host(bb).floats();
    float* out = host(outb).floats();
    pool_.parallelFor(n, 1 << 16, [&](uint64_t i0, uint64_t i1) {
      for (uint64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
    });
  }

  void reduceSum(uint64_t n, const Buffer& inb, Buffer& outb) {
    const float* in = host(inb).floats();
    std::vector<double> partial(pool_.size(), 0.0);
    uint64_t step = (n + pool_.size() - 1) / std::max<uint64_t>(pool_.size(), 1);
    // Pieces are fixed by index so the sum is the same whatever the timing.
    pool_.parallelFor(pool_.size(), 1, [&](uint64_t t0, uint64_t t1) {
      for (uint64_t t = t0; t < t1; ++t) {
        double sum = 0;
        for (uint64_t i = t * step; i < std::min(n, (t + 1) * step); ++i) sum += in[i];
        partial[t] = sum;
      }
    });
    double total = 0;
    for (double p : partial) total += p;
    host(outb).floats()[0] = static_cast<float>(total);
  }

  // The tensor kernels compiled as C++ (hal/tensor.h), each work-item a call.
  void tensor(const LoweredTensorOp& op) {
    using namespace kernels;
    const RcGeom& g = op.geom;
    float* p[kMaxTensorOperands];
    for (unsigned i = 0; i < kMaxTensorOperands; ++i) p[i] = const_cast<float*>(host(*op.buffers[i]).floats());
    auto* target = reinterpret_cast<const int64_t*>(p[2]);
    auto each = [&](auto item) {
      uint64_t grain = std::max<uint64_t>(1, (1 << 14) / static_cast<uint64_t>(std::max<int64_t>(g.inner, 1)));
      pool_.parallelFor(static_cast<uint64_t>(g.n), grain, [&](uint64_t b, uint64_t e) {
        for (uint64_t i = b; i < e; ++i) item(static_cast<int64_t>(i));
      });
    };
    switch (TensorFn(g.fn)) {
      case TensorFn::sum:
      case TensorFn::amax:
      case TensorFn::amin:
      case TensorFn::argmax:
      case TensorFn::argmin: return each([&](int64_t i) { rc_reduce(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::matmul:
        if (g.dims == 4) {  // batched: each entry as a gemm where its strides allow (all alike)
          if (matmulAsGemm(matmulEntry(g, 0), p)) {
            for (int64_t b = 1; b < g.shape[0]; ++b) matmulAsGemm(matmulEntry(g, b), p);
            return;
          }
        } else if (matmulAsGemm(g, p)) {
          return;
        }
        return each([&](int64_t i) { rc_matmul(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::logSoftmax: return each([&](int64_t i) { rc_log_softmax(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::logSoftmaxBackward:
        return each([&](int64_t i) { rc_log_softmax_backward(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::softmax: return each([&](int64_t i) { rc_softmax(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::softmaxBackward: return each([&](int64_t i) { rc_softmax_backward(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::layerNorm: return each([&](int64_t i) { rc_layer_norm(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::layerNormBackward:
        return each([&](int64_t i) { rc_layer_norm_backward(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::indexSelect: return each([&](int64_t i) { rc_index_select(i, g, p[0], p[1], target, p[3]); });
      case TensorFn::indexAdd:
        return each([&](int64_t i) { rc_index_add(i, g, p[0], p[1], target, p[3]); });
      case TensorFn::indexReduce:
        return each([&](int64_t i) { rc_index_reduce(i, g, p[0], p[1], target, p[3]); });
      case TensorFn::gatherSum:
        return each([&](int64_t i) { rc_gather_sum(i, g, p[0], p[1], target, p[3]); });
      case TensorFn::maxPool2d:
        return each([&](int64_t i) { rc_max_pool(i, g, p[0], p[1], reinterpret_cast<int64_t*>(p[2]), p[3]); });
      case TensorFn::maxPool2dBackward:
        return each([&](int64_t i) { rc_max_pool_backward(i, g, p[0], p[1], target, p[3]); });
      case TensorFn::sort:
        return each([&](int64_t i) {
          rc_sort(i, g, p[0], p[1], reinterpret_cast<int64_t*>(p[2]), reinterpret_cast<int64_t*>(p[3]));
        });
      case TensorFn::cholesky:
        return each([&](int64_t i) { rc_cholesky(i, g, p[0], p[1], reinterpret_cast<int64_t*>(p[2]), p[3]); });
      case TensorFn::triangularSolve: return each([&](int64_t i) { rc_triangular_solve(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::luFactor:
        return each([&](int64_t i) {
          rc_lu_factor(i, g, p[0], p[1], reinterpret_cast<int64_t*>(p[2]), reinterpret_cast<int64_t*>(p[3]));
        });
      case TensorFn::luSolve: return each([&](int64_t i) { rc_lu_solve(i, g, p[0], p[1], target, p[3]); });
      case TensorFn::qrFactor: return each([&](int64_t i) { rc_qr_factor(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::householderProduct:
        return each([&](int64_t i) { rc_householder_product(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::symmetricEigen: return each([&](int64_t i) { rc_symmetric_eigen(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::singularValues: return each([&](int64_t i) { rc_singular_values(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::ctcLattice:
        return each([&](int64_t i) {
          rc_ctc_lattice(i, g, p[0], p[1], target, reinterpret_cast<const int64_t*>(p[3]));
        });
      case TensorFn::uniform:
      case TensorFn::bernoulli:
      case TensorFn::normal: return each([&](int64_t i) { rc_random(i, g, p[0], p[1], p[2], p[3]); });
      case TensorFn::nllLoss: return rc_nll_loss(0, g, p[0], p[1], target, p[3]);
      case TensorFn::nllLossBackward:
        return each([&](int64_t i) { rc_nll_loss_backward(i, g, p[0], p[1], target, p[3]); });
      default: return each([&](int64_t i) { rc_map(i, g, p[0], p[1], p[2], p[3]); });
    }
  }

  ThreadPool pool_;
  bool paced_;
  std::unique_ptr<OpQueue> queue_;  // asynchronous cards only; destroyed first
};

}  // namespace

std::unique_ptr<Device> makeCpuDevice(const CpuDeviceOptions& options) {
  Capabilities caps;
  caps.kind = options.kind;
  caps.model = options.model;
  caps.backend = "cpu";
  caps.tflops = options.tflops;
  caps.memoryBytes = options.memoryBytes;
  caps.programKinds = {ProgramKind::builtin};
  unsigned threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  return std::make_unique<CpuDevice>(std::move(caps), threads, options.paced, options.async);
}

}  // namespace raccel::hal
