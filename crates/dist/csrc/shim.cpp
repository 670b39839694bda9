// flowtune-dist's C++ shim over PyTorch c10d (torch 2.11): a TCPStore rendezvous, a PrefixStore,
// and a Gloo or NCCL process group behind one opaque handle. Every entry point catches every C++
// exception and hands its message back as a malloc'd string (NULL on success), so nothing unwinds
// into Rust and nothing aborts. Tensors are tch's `at::Tensor*`.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/autograd/custom_function.h>
#ifdef USE_C10D_NCCL
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

// Tripwires for a torch upgrade: c10d's C++ API is internal, and the Gloo class is compiled against
// project-written declaration stubs. These sizes are what libtorch 2.11 itself allocates (split()).
static_assert(sizeof(c10d::ProcessGroupGloo) == 488, "ProcessGroupGloo layout changed: torch is not 2.11");
#ifdef USE_C10D_NCCL
static_assert(sizeof(c10d::ProcessGroupNCCL) == 1112, "ProcessGroupNCCL layout changed: torch is not 2.11");
#endif

namespace {

enum Backend : int32_t { kGloo = 0, kNccl = 1 };
enum Op : int32_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  Backend backend;
  int size;
  int64_t device;  // CUDA device index for NCCL, -1 for Gloo
  std::chrono::milliseconds timeout;
};

char* copy_message(const char* message) {
  size_t n = std::strlen(message);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) std::memcpy(out, message, n + 1);
  return out;
}

template <typename F>
char* guarded(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return copy_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return copy_message(e.what());
  } catch (...) {
    return copy_message("unknown C++ exception");
  }
}

c10d::ReduceOp to_c10d(Op op) {
  switch (op) {
    case kSum: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case kAvg: return c10d::ReduceOp(c10d::ReduceOp::AVG);
    case kMax: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case kMin: return c10d::ReduceOp(c10d::ReduceOp::MIN);
  }
  throw std::invalid_argument("unknown reduce op " + std::to_string(op));
}

// Gloo has no AVG: reduce with SUM and divide afterwards (see finish_avg).
c10d::ReduceOp backend_op(const Group& g, Op op) {
  return (op == kAvg && g.backend == kGloo) ? to_c10d(kSum) : to_c10d(op);
}

void finish_avg(const Group& g, Op op, at::Tensor& t) {
  if (op == kAvg && g.backend == kGloo) t.div_(g.size);
}

void wait(const Group& g, const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work->wait(g.timeout)) throw std::runtime_error("timed out waiting for the collective");
}

c10::intrusive_ptr<c10d::Backend> make_backend(Group& g, int rank) {
  if (g.backend == kGloo) {
    auto opts = c10d::ProcessGroupGloo::Options::create_default(g.timeout);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(g.store, rank, g.size, opts);
  }
#ifdef USE_C10D_NCCL
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(g.device)));
  // CleanUpOnly: on a timeout the watchdog aborts the communicators but leaves the process alive,
  // so the error reaches the caller through Work::wait instead of killing the process.
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", 1);
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = g.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(g.store, rank, g.size, opts);
#else
  throw std::runtime_error(
      "this build of flowtune-dist has no NCCL support (the CUDA/NCCL headers were missing when it "
      "was compiled; run `make setup` and rebuild)");
#endif
}

// Equal-split all-to-all on dim 0: `in` is P blocks, block p goes to rank p; `out` block r is what
// rank r sent here.
void all_to_all(Group& g, at::Tensor& out, at::Tensor& in) {
  c10d::AllToAllOptions opts;
  opts.timeout = g.timeout;
  std::vector<int64_t> splits;  // empty: equal splits
  wait(g, g.pg->alltoall_base(out, in, splits, splits, opts));
}

// `x` cut into P equal chunks along `scatter`, chunk p sent to rank p; the chunks received,
// in rank order, concatenated along `gather` (Ulysses' exchange of tokens for heads).
at::Tensor exchange(Group& g, const at::Tensor& x, int64_t scatter, int64_t gather) {
  if (g.size == 1) return x;
  if (x.size(scatter) % g.size != 0)
    throw std::invalid_argument("dim " + std::to_string(scatter) + " of size " +
                                std::to_string(x.size(scatter)) + " does not split into " +
                                std::to_string(g.size) + " equal parts");
  at::Tensor in = at::stack(x.chunk(g.size, scatter), 0).contiguous();
  at::Tensor out = at::empty_like(in);
  all_to_all(g, out, in);
  return at::cat(out.unbind(0), gather);
}

// The exchange as an autograd function: its backward is the exchange back (gather ↔ scatter).
// The group must outlive the graph.
struct Exchange : public torch::autograd::Function<Exchange> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t group, int64_t scatter, int64_t gather) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["scatter"] = scatter;
    ctx->saved_data["gather"] = gather;
    return exchange(*reinterpret_cast<Group*>(group), x, scatter, gather);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* g = reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
    int64_t scatter = ctx->saved_data["scatter"].toInt(), gather = ctx->saved_data["gather"].toInt();
    return {exchange(*g, grads[0], gather, scatter), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

void ftd_free_error(char* error) { std::free(error); }

char* ftd_group_new(const char* host, uint16_t port, bool serve_store, const char* prefix,
                    int32_t rank, int32_t size, int32_t backend, int64_t device,
                    int64_t timeout_ms, Group** out) {
  return guarded([&] {
    auto g = std::make_unique<Group>();
    g->backend = static_cast<Backend>(backend);
    g->size = size;
    g->device = device;
    g->timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = serve_store;
    // Every rank announces itself (TCPStore skips that without numWorkers); the server waits for all.
    opts.numWorkers = size;
    opts.waitWorkers = true;
    opts.timeout = g->timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    g->store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    g->pg = make_backend(*g, rank);
    *out = g.release();
  });
}

void ftd_group_free(Group* g) {
  if (g == nullptr) return;
  char* error = guarded([&] { g->pg->shutdown(); });
  std::free(error);  // shutting down is best effort; Drop cannot report it
  delete g;
}

char* ftd_all_reduce(Group* g, at::Tensor* t, int32_t op) {
  return guarded([&] {
    auto o = static_cast<Op>(op);
    c10d::AllreduceOptions opts;
    opts.reduceOp = backend_op(*g, o);
    opts.timeout = g->timeout;
    std::vector<at::Tensor> tensors{*t};
    wait(*g, g->pg->allreduce(tensors, opts));
    finish_avg(*g, o, *t);
  });
}

char* ftd_broadcast(Group* g, at::Tensor* t, int32_t root) {
  return guarded([&] {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = g->timeout;
    std::vector<at::Tensor> tensors{*t};
    wait(*g, g->pg->broadcast(tensors, opts));
  });
}

char* ftd_all_gather(Group* g, at::Tensor* out, at::Tensor* shard) {
  return guarded([&] {
    c10d::AllgatherOptions opts;
    opts.timeout = g->timeout;
    wait(*g, g->pg->_allgather_base(*out, *shard, opts));
  });
}

char* ftd_reduce_scatter(Group* g, at::Tensor* out, at::Tensor* full, int32_t op) {
  return guarded([&] {
    auto o = static_cast<Op>(op);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = backend_op(*g, o);
    opts.timeout = g->timeout;
    wait(*g, g->pg->_reduce_scatter_base(*out, *full, opts));
    finish_avg(*g, o, *out);
  });
}

char* ftd_sub_group(Group* parent, const char* prefix, int32_t rank, int32_t size, Group** out) {
  return guarded([&] {
    auto g = std::make_unique<Group>();
    g->backend = parent->backend;
    g->size = size;
    g->device = parent->device;
    g->timeout = parent->timeout;
    g->store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), parent->store);
    g->pg = make_backend(*g, rank);
    *out = g.release();
  });
}

char* ftd_all_to_all(Group* g, at::Tensor* out, at::Tensor* in) {
  return guarded([&] { all_to_all(*g, *out, *in); });
}

char* ftd_exchange(Group* g, at::Tensor* x, int64_t scatter, int64_t gather, at::Tensor** out) {
  return guarded([&] {
    at::Tensor y = Exchange::apply(*x, reinterpret_cast<int64_t>(g), scatter, gather);
    *out = new at::Tensor(std::move(y));
  });
}

char* ftd_barrier(Group* g) {
  return guarded([&] {
    c10d::BarrierOptions opts;
    opts.timeout = g->timeout;
    if (g->device >= 0) opts.device_ids = {g->device};
    wait(*g, g->pg->barrier(opts));
  });
}

}  // extern "C"
